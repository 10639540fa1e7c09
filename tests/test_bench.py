"""The kernel benchmark (`bench circuits`) end to end, in this process: every figure is there, the peers
agree; and both benchmarks' bad input. (`bench runtimes`, which starts Ray: test_bench_runtimes.)"""

import json
import subprocess
import sys

import pytest

from qml_ray import kernel
from qml_ray.bench import peers

from conftest import ROOT, SMOKE, command_env, require, run_command

QUICK = ("--min-seconds", 0.2)  # each figure timed over 0.2 s of calls: every figure there, none precise


def test_circuits_times_forward_and_gradient(tmp_path, in_process):
    done = in_process("bench", "circuits", "--qubits", "4,6", "--circuits", 2, *QUICK, "--out", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads((tmp_path / "circuits.json").read_text())
    assert doc["kernel_path"] == kernel.PATH and f"block kernel: the {kernel.PATH} path" in done.stdout
    assert doc["min_seconds"] == 0.2
    assert [p["qubits"] for p in doc["probes"]] == [4, 6]
    for probe in doc["probes"]:
        for name in ("tfq", "block"):
            assert probe[f"{name}_forward_gradient_seconds"] > 0 and probe[f"{name}_forward_seconds"] > 0
        assert probe["speedup"] == pytest.approx(
            probe["tfq_forward_gradient_seconds"] / probe["block_forward_gradient_seconds"]
        )
        assert probe["pass_bandwidth"] > 0
        # the forward keeps every circuit's final state (at 4 and 6 qubits all fit), so none is simulated again
        assert probe["block_forward_gradient_bytes"] == pytest.approx(3 * probe["block_forward_bytes"])
        assert probe["block_forward_bytes"] > 0
        assert "peers" not in probe
    assert doc["projection"] is None  # 23 qubits not probed
    table = (tmp_path / "circuits.md").read_text()
    assert "| 6 | 2 |" in table and "state-sized pass" in table and "Lightning" not in table


def test_circuits_times_the_controlled_family(tmp_path, in_process):
    """Multi-controlled gates through a TFQ expectation layer: every figure, the family named, no projection."""
    done = in_process(
        "bench", "circuits", "--family", "controlled", "--qubits", "5", "--circuits", 2, *QUICK, "--out", tmp_path
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads((tmp_path / "circuits.json").read_text())
    assert doc["family"] == "controlled" and doc["projection"] is None
    (probe,) = doc["probes"]
    for name in ("tfq", "block"):
        assert probe[f"{name}_forward_gradient_seconds"] > 0 and probe[f"{name}_forward_seconds"] > 0
    assert "controlled by the next 3" in (tmp_path / "circuits.md").read_text()


def test_circuits_with_peers_agree_with_the_block_values(tmp_path, in_process):
    require(not peers.missing(), f"the peers extra is not installed ({peers.INSTALL})")
    done = in_process("bench", "circuits", "--qubits", "5", "--circuits", 2, "--peers", *QUICK, "--out", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = json.loads((tmp_path / "circuits.json").read_text())["probes"][0]["peers"]
    assert set(found) == {"block", "qsim", "lightning_complex64", "lightning_complex128"}
    assert found["block"]["gradient_seconds"] > 0 and found["block"]["forward_seconds"] > 0
    assert found["qsim"]["fused_gate_size"] in peers.QSIM_FUSED_SIZES
    for name in ("qsim", "lightning_complex64", "lightning_complex128"):
        assert found[name]["seconds"] > 0 and found[name]["difference"] < peers.TOLERANCE, name
    assert "| 5 | " in (tmp_path / "circuits.md").read_text().split("Lightning")[-1]


def test_peers_missing_is_one_line_saying_how_to_install():
    """Run as if the peers were not installed (None in sys.modules: neither importable nor found), whether
    they are or not."""
    hidden = (
        f"import runpy, sys; sys.modules.update(dict.fromkeys({peers.PACKAGES!r})); "
        "runpy.run_module('qml_ray.bench', run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", hidden, "circuits", "--peers", "--qubits", "4"],
        cwd=ROOT,
        env=command_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "error: --peers needs qsimcirq, pennylane, pennylane_lightning, not installed: pip install -e '.[peers]'"
    )


def test_disagreement_beyond_the_tolerance_is_named():
    assert peers.difference([0.5, 3.0], [0.5, 2.0]) == pytest.approx(1 / 2)  # a share of the largest, 2
    assert peers.difference([0.25], [0.5]) == pytest.approx(0.25)  # the largest counts as at least 1
    probes = [
        {"qubits": 16, "peers": {"block": {}, "qsim": {"difference": peers.TOLERANCE}}},
        {"qubits": 20, "peers": {"block": {}, "qsim": {"difference": 2 * peers.TOLERANCE}}},
        {"qubits": 23},
    ]
    assert peers.disagreements(probes) == [f"qsim at 20 qubits ({2 * peers.TOLERANCE:.1e})"]


def test_projection_spreads_the_headline_over_the_cluster():
    from qml_ray.bench.projection import project

    projection = project(
        {
            "tfq_forward_seconds": 1.0,
            "block_forward_seconds": 0.5,
            "tfq_forward_gradient_seconds": 10.0,
            "block_forward_gradient_seconds": 2.0,
        },
        0.5,
        "given",
    )
    for name, forward, gradient in (("tfq", 1.0, 10.0), ("block", 0.5, 2.0)):
        cpu_seconds = 700 * gradient + 300 * forward
        assert projection[name]["one_vcpu_epoch_hours"] == pytest.approx(cpu_seconds / 3600)
        assert projection[name]["cluster_epoch_minutes"] == pytest.approx(cpu_seconds / (512 * 0.5) / 60)
        assert projection[name]["node_epoch_hours"] == pytest.approx(cpu_seconds / 16 / 3600)


@pytest.mark.parametrize(
    "args, message",
    [
        (["runtimes", "--config", SMOKE, "--epochs", 1], "error: the benchmark needs at least 2 epochs"),
        (["runtimes", "--workers", "0"], "argument --workers: expected comma-separated numbers"),
        (["runtimes", "--runtimes", "ray"], "argument --runtimes: expected some of qml_ray,baseline,single"),
        (["circuits", "--efficiency-from", "/nonexistent.json"], "error: cannot read a runtimes.json"),
        (["circuits", "--min-seconds", "0"], "argument --min-seconds: expected a positive number, got '0'"),
        (["elastic", "--epochs", "10", "--lose-after", "10"], "error: --lose-after must be fewer than --epochs"),
        (["elastic", "--config", "/nonexistent.yaml"], "error: config file not found"),
    ],
)
def test_bad_input_is_one_line_and_status_2(args, message):
    done = run_command("bench", *args)
    assert done.returncode == 2 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_roofline_of_the_kernels_passes(tmp_path):
    """Each pass kind of the kernel (small states, short timings): its operations and bytes per amplitude, its
    rates against this machine's peaks in each place, as a table and a plot."""
    from qml_ray.bench import figures, roofline

    found = roofline.roofline(1, (("in cache", 10), ("from memory", 13)), 0.01)
    assert found["peak_flops"] > 0 and found["pass_bandwidth from memory"] > 0
    assert set(found["kinds"]) == set(roofline.PASS_KINDS)
    for measured in found["kinds"].values():
        assert measured["in cache"]["bytes"] > 0 and measured["from memory"]["ns_per_amplitude"] > 0
    doc = {"threads": 1, "kernel_path": kernel.PATH, "probes": [{"qubits": 4}, {"qubits": 20, "roofline": found}]}
    table = "\n".join(roofline.roofline_lines(doc["probes"]))
    assert "| relabelling | 0, 16 | " in table and "a state of 10 qubits in a core's cache" in table
    figures.plot_roofline(doc, tmp_path / "roofline.png")
    assert (tmp_path / "roofline.png").stat().st_size > 0


def test_an_elastic_runs_timeline_from_its_console_lines():
    from qml_ray.bench.elastic import timeline

    lines = [
        (5.0, "epoch 1/3  loss 0.5"),
        (6.0, "epoch 2/3  loss 0.4"),
        (17.0, "continuing on 1 of 2 workers (a node was lost)"),
    ]
    lines += [
        (18.5, "continuing from the checkpoint of epoch 1"),
        (19.0, "epoch 2/3  loss 0.4"),
        (40.0, "back to 2 workers"),
    ]
    lines += [(48.0, "continuing from the checkpoint of epoch 2"), (49.0, "epoch 3/3  loss 0.3")]
    record = {"lost_at": 6.5, "replaced_at": 30.0, "lines": lines}
    assert timeline(record, epochs=3) == {
        "epochs_trained_twice": 1,
        "training_again_after_loss": 12.0,
        "training_again_after_replacement": 18.0,
    }


def test_side_by_side_in_rounds():
    """Every contender timed once a round, in a new order each round, after one untimed call; medians per
    circuit; the block against qsim (values agreeing) and one circuit on 1 thread against 2, the ratios from
    those medians."""
    from qml_ray.bench import side_by_side

    calls = []
    found = side_by_side.in_rounds({name: lambda name=name: calls.append(name) for name in "abc"}, 4, 2)
    assert calls[:3] == ["a", "b", "c"] and set(found) == set("abc") and all(seconds > 0 for seconds in found.values())
    rounds = [calls[start : start + 3] for start in range(3, 15, 3)]
    assert all(sorted(one) == ["a", "b", "c"] for one in rounds) and len({tuple(one) for one in rounds}) > 1
    require(not peers.missing(), f"the peers extra is not installed ({peers.INSTALL})")
    qsim = side_by_side.against_qsim(6, 2, 2)
    size = qsim["qsim_fused_gate_size"]
    assert set(qsim["seconds"]) == {"forward", "forward_gradient"} | {f"qsim_{s}" for s in peers.QSIM_FUSED_SIZES}
    assert qsim["seconds"][f"qsim_{size}"] == min(qsim["seconds"][f"qsim_{s}"] for s in peers.QSIM_FUSED_SIZES)
    assert qsim["forward_to_qsim"] == pytest.approx(qsim["seconds"]["forward"] / qsim["seconds"][f"qsim_{size}"])
    threads = side_by_side.on_two_threads(16, 1)  # 16 qubits: a circuit's passes shared between its threads
    assert threads["forward_gradient_speedup"] == pytest.approx(
        threads["seconds"]["forward_gradient_1"] / threads["seconds"]["forward_gradient_2"]
    )


@pytest.mark.parametrize("args", [["3"], ["20", "--rounds", "0"], ["20", "--circuits", "0"]])
def test_side_by_side_bad_input(args):
    from qml_ray.bench import side_by_side
    from qml_ray.errors import UsageError

    with pytest.raises(UsageError, match="qubits must be 4 to 30"):
        side_by_side.main(args)


def test_plan_says_what_it_chose_and_why(tmp_path, capsys):
    """bench.plan at 16 qubits on 1 and 2 threads: the machine's line, each thread count's triad bandwidth and FMA
    peak, each size's choice with every measured choice's seconds (fastest first), the forward and each pass
    kind against the roofline; the same as JSON."""
    from qml_ray.bench import plan, roofline
    from qml_ray.gradients.planner import machine

    plan.main(["16", "--threads", "1,2", "--seconds", "1", "--out", str(tmp_path / "plan.json")])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(machine()["cpu"]) and "triad" in out[1] and "FMA peak" in out[2]
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert [(size["qubits"], size["threads"]) for size in doc["sizes"]] == [(16, 1), (16, 2)]
    for size in doc["sizes"]:
        seconds = list(size["seconds"].values())
        assert seconds == sorted(seconds) and size["choice"] in size["seconds"] and size["of_the_bound"] > 0
        assert set(size["pass_seconds"]) == set(roofline.PASS_KINDS)
    assert sum(line.startswith("16 qubits") for line in out) == 2 and sum("pass block:" in line for line in out) == 2


@pytest.mark.parametrize("args", [["40"], ["20", "--threads", "0"], ["20", "--seconds", "0"]])
def test_plan_bad_input(args):
    from qml_ray.bench import plan
    from qml_ray.errors import UsageError

    with pytest.raises(UsageError, match="qubits must be 16 to 30"):
        plan.main(args)


def test_serving_fails_on_qml_rays_losses_only():
    """The baseline's unanswered requests are its figure; qml_ray's are the run's failure (`bench serving`)."""
    from qml_ray.bench import serving

    def record(server, sent, answered):
        return {"server": server, "clients": 64, "sent": sent, "answered": answered}

    assert serving.unanswered([record("qml_ray", 150, 150), record("keras", 150, 108)]) == {"keras": 42}
    assert serving.unanswered([record("qml_ray", 150, 149), record("keras", 150, 150)]) == {"qml_ray": 1}
