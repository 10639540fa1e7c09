"""The progress line within long epochs and the metrics history's rows, on a small Keras model
(the callbacks are what is tested)."""

import re

import numpy as np
import pytest
import tensorflow as tf

from qml_ray.callbacks import EpochClock, MetricsHistory, ProgressLine

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
