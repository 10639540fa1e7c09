"""The benchmark end to end: every runtime really trains, and every figure is there."""

import json

import pytest

from qml_ray.bench.report import RESULT_FIELDS

from conftest import SMOKE, run_command


def test_runtimes_measures_every_runtime_at_1_and_2_workers(tmp_path):
    done = run_command(
        "bench", "runtimes", "--config", SMOKE, "--workers", "1,2", "--epochs", 3, "--out", tmp_path, timeout=1200
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads((tmp_path / "runtimes.json").read_text())

    cases = {(r["runtime"], r["workers"]) for r in doc["results"]}
    assert cases == {("qml_ray", 1), ("qml_ray", 2), ("baseline", 1), ("baseline", 2), ("single", 1)}
    for result in doc["results"]:
        for field in RESULT_FIELDS:
            assert result[field] > 0, (result["runtime"], result["workers"], field)
    assert [r["workers"] for r in doc["ratios"]] == [1, 2]
    assert all(r["epoch_seconds"] > 0 and r["startup_seconds"] > 0 for r in doc["ratios"])
    assert all(len(r["epoch_seconds"]) == 3 for r in doc["records"])
    assert (doc["train_examples"], doc["test_examples"]) == (48, 16)

    table = (tmp_path / "runtimes.md").read_text()
    assert table in done.stdout and table.count("| qml_ray |") == 2
    assert (tmp_path / "runtimes.png").read_bytes().startswith(b"\x89PNG")


def test_circuits_times_forward_and_gradient(tmp_path):
    done = run_command("bench", "circuits", "--qubits", "4,6", "--circuits", 2, "--out", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads((tmp_path / "circuits.json").read_text())
    assert [p["qubits"] for p in doc["probes"]] == [4, 6]
    for probe in doc["probes"]:
        for name in ("tfq", "block"):
            assert probe[f"{name}_forward_gradient_seconds"] > probe[f"{name}_forward_seconds"] > 0
        assert probe["speedup"] == pytest.approx(
            probe["tfq_forward_gradient_seconds"] / probe["block_forward_gradient_seconds"]
        )
    assert doc["projection"] is None  # 23 qubits not probed
    assert "| 6 | 2 |" in (tmp_path / "circuits.md").read_text()


def test_projection_spreads_the_headline_over_the_cluster():
    from qml_ray.bench.circuits import project

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
    ],
)
def test_bad_input_is_one_line_and_status_2(args, message):
    done = run_command("bench", *args)
    assert done.returncode == 2 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
