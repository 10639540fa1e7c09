"""The block kernel's planner: each field measured and the fastest kept, the cache file read back and refused when
damaged or foreign, the fields a user fixes; every choice's numbers are checked in test_gradients (`check`)."""

import json

import cirq
import numpy as np
import pytest
import tensorflow_quantum as tfq

from qml_ray import choices, kernel
from qml_ray.config import Config
from qml_ray.errors import UsageError
from qml_ray.gradients import BlockAdjoint, planner
from qml_ray.gradients.plan import canonical
from qml_ray.model import cluster_state_circuit, qcnn_circuit, qubits_for

QUBITS = 20  # several tiles of every size the planner tries


@pytest.fixture(scope="module")
def qcnn():
    """A 20-qubit QCNN circuit (1 layer) serialized, its symbols' names, values and readouts (serialized)."""
    register = qubits_for(QUBITS)
    model, readout_qubits = qcnn_circuit(register, 1)
    symbols = sorted(cirq.parameter_symbols(model), key=str)
    circuit = cluster_state_circuit(register) + cirq.X(register[3]) + model
    program = tfq.convert_to_tensor([circuit]).numpy()[0]
    sums = tfq.convert_to_tensor([[cirq.Z(q) for q in readout_qubits]]).numpy()[0]
    values = np.random.default_rng(7).uniform(-1, 1, len(symbols))
    return canonical(program), tuple(str(s) for s in symbols), values, sums


def test_each_field_is_measured_and_the_fastest_kept(qcnn, tmp_path):
    """With room in its budget the planner measures every field at 20 qubits; the choice it keeps is within 3% of
    the fastest it measured (a field's value replaces the best only when 3% faster), it is said in one line,
    written to the cache file, and a second planner reads it from there without measuring."""
    program, names, _, sums = qcnn
    cache, shape = tmp_path / "plans.json", planner.Shape(*planner.size(program, names), 1)
    first = planner.Planner({}, 60, cache)
    chosen = first.choice(program, names, sums, 1)
    record = json.loads(cache.read_text())["shapes"][str(shape)]
    assert set(record["tried"]) == {"form", "path", "parked", "tile_bits", "prefetch", "huge_pages"}
    assert record["best"] == str(chosen) and record["seconds"][str(chosen)] <= min(record["seconds"].values()) / 0.97
    assert len(record["seconds"]) >= 1 + 1 + (len(kernel.supported_paths()) - 1) + 3 + 1 + 1
    [line] = first.said()
    assert line.startswith(f"kernel plan for {QUBITS} qubits") and str(chosen) in line and "measured in" in line
    again = planner.Planner({}, 60, cache)
    assert again.choice(program, names, sums, 1) == chosen
    assert again.said() == [f"kernel plan for {shape}: {chosen} (from the cache)"]


def test_a_budget_of_none_measures_nothing_and_fixes_are_kept(qcnn, tmp_path):
    """Budget 0: the default choice, with the fields the user fixed; those fields are never measured."""
    program, names, _, sums = qcnn
    fixes = choices.fixed("form=3 tiles=17 prefetch=on", "kernel_plan")
    found = planner.Planner(fixes, 0, tmp_path / "plans.json").choice(program, names, sums, 2)
    assert (found.form, found.tile_bits, found.prefetch, found.path) == (3, 17, True, kernel.PATH)
    fields = [field for field, _ in planner.field_trials(planner.Shape(QUBITS, 30, 1), fixes)]
    assert fields == ["path", "parked", "huge_pages"][len(kernel.supported_paths()) == 1 :]
    assert not (tmp_path / "plans.json").exists()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{", "damaged"),
        (
            '{"cpu": "x", "kernel": "y", "shapes": {"a": {"best": "avx9 form=4", "seconds": {}, "tried": []}}}',
            "damaged",
        ),
        ("FOREIGN", "written for another CPU or kernel build"),
    ],
)
def test_a_damaged_or_foreign_cache_is_ignored_with_one_warning(qcnn, tmp_path, text, why):
    """A cache file that is not JSON, holds a choice no kernel reads, or was written on another CPU: one warning
    line, its plans ignored (measured anew), and the file then written whole for this machine."""
    program, names, _, sums = qcnn
    cache = tmp_path / "plans.json"
    if text == "FOREIGN":
        shape = str(planner.Shape(*planner.size(program, names), 1))
        record = {"best": str(choices.default()._replace(form=3)), "seconds": {}, "tried": ["form"]}
        text = json.dumps({"cpu": "another CPU", "kernel": planner.machine()["kernel"], "shapes": {shape: record}})
    cache.write_text(text)
    found = planner.Planner({}, 0.001, cache)
    warning, *rest = found.said()
    assert warning.startswith(f"warning: ignoring {cache}") and why in warning and not rest
    found.choice(program, names, sums, 1)
    assert planner.CacheFile.model_validate_json(cache.read_text()).cpu == planner.machine()["cpu"]


def test_fixes_are_read_or_refused_in_one_line():
    """The words of kernel_plan in any order; a word it cannot read is one UsageError line saying what it takes,
    from the config as from the environment."""
    fixes = choices.fixed("tiles=18, avx2 huge_pages=off parked=5", "kernel_plan")
    assert choices.with_fixes(choices.default(), fixes)[1:] == (4, 18, 5, False, False) and fixes["path"] == "avx2"
    with pytest.raises(UsageError, match=r"^kernel_plan: cannot read tiles=19 \(it takes path=avx512\|avx2\|portable;"):
        Config(kernel_plan="tiles=19")
    with pytest.raises(UsageError, match="cannot read fast=\\?"):
        choices.fixed("fast", choices.PLAN_VARIABLE)


def test_block_adjoint_runs_the_planners_choice(qcnn, tmp_path, monkeypatch):
    """BlockAdjoint without a choice asks this process's planner, per circuit shape and threads; its values
    equal those of a fixed default choice."""
    program, names, values, sums = qcnn
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(choices.PLAN_VARIABLE, "form=3")
    planner.planner.cache_clear()
    try:
        inputs = (np.array([program]), np.array([n.encode() for n in names]), values[None].astype(np.float32))
        planned = BlockAdjoint(threads=1).expectations(*inputs, sums[None], keep_states=False)
        fixed = BlockAdjoint(threads=1, choice=choices.default()).expectations(*inputs, sums[None], keep_states=False)
        np.testing.assert_allclose(planned, fixed, atol=1e-5)
        [line] = planner.planner().said()
        assert "form=3" in line and "not measured" in line  # the tests' budget is 0 (conftest)
    finally:
        planner.planner.cache_clear()


def test_a_batch_spreads_as_measured_or_fixed(qcnn, tmp_path, monkeypatch):
    """On 2 threads, 2 circuits side by side against one at a time on both threads: the faster kept (within 3%),
    with its seconds, in the shape's record; a fixed spread is kept unmeasured; BlockAdjoint's batch spread
    either way gives the same values."""
    program, names, values, sums = qcnn
    cache = tmp_path / "plans.json"
    spread = planner.Planner({}, 60, cache).spread(program, names, sums, 2)
    record = json.loads(cache.read_text())["shapes"][str(planner.Shape(*planner.size(program, names), 2))]
    seconds = record["spread_seconds"]
    assert record["spread"] == spread and set(seconds) == set(choices.SPREADS)
    assert seconds[spread] <= min(seconds.values()) / 0.97
    fixed = planner.Planner({"spread": "shared"}, 60, tmp_path / "other.json")
    assert fixed.spread(program, names, sums, 2) == "shared" and not (tmp_path / "other.json").exists()
    batch = (np.array([program] * 2), np.array([n.encode() for n in names]), np.stack([values, -values]))
    found = []
    for way in choices.SPREADS:
        monkeypatch.setenv(choices.PLAN_VARIABLE, f"spread={way}")
        planner.planner.cache_clear()
        found.append(BlockAdjoint(threads=2).expectations(*batch, np.stack([sums] * 2), keep_states=False))
    planner.planner.cache_clear()
    np.testing.assert_allclose(found[0], found[1], atol=1e-6)
