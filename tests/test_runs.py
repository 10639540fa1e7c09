"""What a run folder holds across versions and interruptions, in this process: weights written under
the old `qcnn` prefix still load (infer, --resume), --resume can set a key back to its default, and an
interrupted write of predictions leaves no folder behind; how long lost workers are waited for."""

import json
import signal
from pathlib import Path

import numpy as np
import pytest
import ray.train

from qml_ray import checkpoints, cli, config as config_lib, infer, interrupts, replica, storage, train
from qml_ray.worker import restore

SMALL = config_lib.Config(qubits=4)  # the QCNN at its smallest


def saved_under_the_old_prefix(folder, model) -> list[np.ndarray]:
    """`model`'s weights, moved off their initial values, saved in `folder` as runs before 'model' did."""
    model.set_weights([weight + 0.5 for weight in model.get_weights()])
    folder.mkdir(parents=True)
    model.save_weights(str(folder / storage.OLD_WEIGHTS_PREFIX))
    return model.get_weights()


def assert_same_weights(found: list, expected: list) -> None:
    for one, other in zip(found, expected, strict=True):
        np.testing.assert_array_equal(one, other)


def test_an_old_runs_weights_still_load_for_infer(tmp_path):
    weights = tmp_path / storage.WEIGHTS
    expected = saved_under_the_old_prefix(weights, replica.build(SMALL))
    storage.mark_complete(str(weights))
    (tmp_path / storage.CONFIG).write_text(SMALL.to_yaml())
    assert_same_weights(infer.load_trained_model(str(tmp_path)).get_weights(), expected)


def test_an_old_runs_checkpoint_still_resumes(tmp_path):
    folder = tmp_path / storage.CHECKPOINTS / storage.checkpoint_name(3)
    expected = saved_under_the_old_prefix(folder, replica.build(SMALL))
    (folder / storage.STATE_FILE).write_text(json.dumps({"epoch": 3, "history": []}))
    checkpoints.write_manifest(str(folder))
    model = replica.build(SMALL)
    assert restore(model, ray.train.Checkpoint(str(folder)), None) == (3, 0, [])
    assert_same_weights(model.get_weights(), expected)


def resumed(run, *flags) -> config_lib.Config:
    requested = cli.config_from_args(train.parse_args([*map(str, flags), "--storage", str(run.parent)]))
    config, resuming = train.resolve_run(requested, str(run), resume=True, found=True)
    assert resuming
    return config


def test_resume_sets_a_key_back_to_its_default(tmp_path):
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    stored = config_lib.Config(epochs=60, learning_rate=0.05, storage=str(run.parent))
    (run / storage.CONFIG).write_text(stored.to_yaml())
    default = config_lib.Config().epochs
    assert resumed(run, "--epochs", default).epochs == default
    assert resumed(run).epochs == 60  # a key not given keeps the run's value
    assert resumed(run, "--epochs", default).learning_rate == 0.05


class InterruptedWrite:
    """Predictions whose write is interrupted (Ctrl-C) after one file."""

    def write_parquet(self, path, filesystem):
        Path(path).mkdir(parents=True)
        (Path(path) / "part-0.parquet").write_bytes(b"half")
        raise interrupts.Interrupted(signal.SIGINT)


def test_an_interrupted_write_of_predictions_leaves_no_folder(tmp_path):
    with pytest.raises(interrupts.Interrupted):
        infer.write_predictions(InterruptedWrite(), str(tmp_path))
    assert list((tmp_path / storage.PREDICTIONS).iterdir()) == []


def test_lost_workers_are_waited_for_as_long_as_capacity_timeout_says_or_60_s():
    assert train.replacement_wait(SMALL.replace(capacity_timeout=10)) == 10
    assert train.replacement_wait(SMALL) == config_lib.REPLACEMENT_WAIT_SECONDS == 60  # 0: fail at once at the start
