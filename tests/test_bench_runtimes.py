"""The runtimes benchmark end to end: every runtime really trains (qml_ray with a local Ray of its
own), and every figure is there."""

import json

import pytest

from qml_ray.bench.report import RESULT_FIELDS

from conftest import SMOKE, run_command

pytestmark = pytest.mark.slow  # three trainings


def test_runtimes_measures_every_runtime_side_by_side(tmp_path):
    """Two workers, so the single process runs too (one worker is its only case)."""
    done = run_command(
        "bench", "runtimes", "--config", SMOKE, "--workers", "2", "--epochs", 2, "--out", tmp_path, timeout=1200
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads((tmp_path / "runtimes.json").read_text())

    cases = {(r["runtime"], r["workers"]) for r in doc["results"]}
    assert cases == {("qml_ray", 2), ("baseline", 2), ("single", 1)}
    for result in doc["results"]:
        for field in RESULT_FIELDS:
            assert result[field] > 0, (result["runtime"], result["workers"], field)
    assert [r["workers"] for r in doc["ratios"]] == [2]
    assert all(r["epoch_seconds"] > 0 and r["startup_seconds"] > 0 for r in doc["ratios"])
    assert all(len(r["epoch_seconds"]) == 2 for r in doc["records"])
    assert (doc["train_examples"], doc["test_examples"]) == (48, 16)

    table = (tmp_path / "runtimes.md").read_text()
    assert table in done.stdout and table.count("| qml_ray |") == 1
    assert (tmp_path / "runtimes.png").read_bytes().startswith(b"\x89PNG")
