"""The progress line within long epochs and the metrics history's rows, on a small Keras model
(the callbacks are what is tested)."""

import re

import numpy as np
import pytest
import tensorflow as tf

from qml_ray.callbacks import EpochClock, MetricsHistory, ProgressLine, configured, history_csv
from qml_ray.config import Config
from qml_ray.console import Workers, resize_line
from qml_ray.errors import ModelError

LINE = re.compile(r"^epoch (\d+)/2  step (\d+)/5  [0-9.e+]+ circuits/s  \d+s of training left in the epoch$")


def fit(callbacks: list, steps: int) -> None:
    model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])
    model.compile(loss="mse", metrics=["accuracy"])
    examples = np.ones((8, 1), np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((examples, examples)).batch(4).repeat()
    model.fit(
        dataset,
        steps_per_epoch=steps,
        epochs=2,
        validation_data=dataset,
        validation_steps=1,
        callbacks=callbacks,
        verbose=0,
    )


def test_a_line_per_interval_with_the_epoch_and_its_steps(capsys):
    fit([ProgressLine(epochs=2, steps=5, train_examples=20, interval=0)], steps=5)
    lines = capsys.readouterr().out.splitlines()
    assert [LINE.match(line).groups() for line in lines] == [(str(e), str(s)) for e in (1, 2) for s in range(1, 6)]
    assert lines[-1].endswith("  0s of training left in the epoch")


def test_an_epoch_resumed_mid_way_counts_the_steps_done_before(capsys):
    fit([ProgressLine(epochs=2, steps=5, train_examples=20, interval=0)], steps=3)  # 2 steps were done before
    assert [LINE.match(line).group(2) for line in capsys.readouterr().out.splitlines()][:3] == ["3", "4", "5"]


def test_no_line_within_the_interval(capsys):
    fit([ProgressLine(epochs=2, steps=5, train_examples=20)], steps=5)  # 30 s: far longer than these epochs
    assert capsys.readouterr().out == ""


def test_an_epoch_resumed_mid_way_counts_only_its_remaining_circuits():
    clock = EpochClock()
    history = MetricsHistory([], clock, train_examples=20, steps=5)
    fit([clock, history], steps=3)  # 2 of the 5 steps were done before: 12 of the 20 circuits are left
    assert [row["epoch"] for row in history.rows] == [1, 2]
    for row in history.rows:
        assert row["circuits_per_second"] * row["epoch_seconds"] == pytest.approx(12)


def test_metrics_csv_takes_rows_of_an_older_run_without_the_workers_column():
    rows = [{"epoch": 1, "loss": 0.5}, {"epoch": 2, "loss": 0.4, "workers": 2}]
    assert history_csv(rows).splitlines() == ["epoch,loss,workers", "1,0.5,", "2,0.4,2"]


def test_the_console_says_when_an_elastic_run_shrank_or_grew():
    said = [
        resize_line(before, Workers(count, 3))
        for before, count in [(None, 3), (None, 2), (3, 3), (3, 2), (2, 1), (1, 2), (2, 3)]
    ]
    assert said == [
        None,
        "training on 2 of 3 workers",
        None,
        "continuing on 2 of 3 workers (a node was lost)",
        "continuing on 1 of 3 workers (a node was lost)",
        "growing to 2 of 3 workers",
        "back to 3 workers",
    ]


def test_a_callbacks_function_must_return_a_list_of_keras_callbacks(tmp_path, monkeypatch):
    """What a worker does with --callbacks' function (its raising: test_bad_input, through the command)."""
    functions = {"named": "'progress'", "none": "[]"}
    module = "".join(f"def {name}(rank, run):\n    return {value}\n\n\n" for name, value in functions.items())
    (tmp_path / "users_callbacks.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModelError, match="users_callbacks:named must return a list of Keras callbacks"):
        configured(Config(callbacks="users_callbacks:named"), rank=0, run=str(tmp_path))
    assert configured(Config(callbacks="users_callbacks:none"), rank=1, run=str(tmp_path)) == []
