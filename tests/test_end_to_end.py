"""The whole mission on one machine: 2-worker Ray Train training and Ray Data inference, each from a
clean process with a local Ray of its own."""

import json
import re

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from qml_ray import config as config_lib, storage
from qml_ray.infer import load_trained_model

from conftest import TUTORIAL, TUTORIAL_EPOCHS as EPOCHS, run_command


def epoch_lines(output: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in re.findall(r"\bepoch (\d+)/(\d+)\s+loss", output)]


@pytest.mark.core
def test_training_learns_and_fills_the_run_folder(trained_run):
    run = trained_run.path
    history = pd.read_csv(run / "metrics.csv")
    assert history["epoch"].tolist() == list(range(1, EPOCHS + 1))
    assert history["val_accuracy"].iloc[-1] >= 0.9  # chance is 0.5
    assert history["loss"].iloc[-1] < history["loss"].iloc[0]
    assert (history["circuits_per_second"] > 0).all() and (history["epoch_seconds"] > 0).all()

    assert config_lib.of_run(str(run)) == config_lib.load(TUTORIAL).replace(storage=str(run.parent), epochs=EPOCHS)
    assert {p.name for p in (run / "data").iterdir()} == {"train.parquet", "test.parquet"}
    assert (run / "weights" / "model.index").is_file()
    every = config_lib.load(TUTORIAL).checkpoint_every
    assert sorted(p.name for p in (run / "checkpoints").glob("epoch-*")) == [
        f"epoch-{epoch:05d}" for epoch in range(every, EPOCHS + 1, every)
    ]
    assert (run / "weights" / "_COMPLETE").is_file() and not list(run.rglob(".tmp-*"))
    record = json.loads((run / storage.GRADIENTS).read_text())
    assert record["differentiator"] == "auto" and [(g["layer"], g["gradient"]) for g in record["layers"]] == [
        ("qcnn", "BlockAdjoint")
    ]


@pytest.mark.core
def test_console_shows_one_line_per_epoch_and_nothing_of_ray_or_tensorflow(trained_run):
    assert epoch_lines(trained_run.output) == [(e, EPOCHS) for e in range(1, EPOCHS + 1)]
    lines = trained_run.output.splitlines()  # stdout and stderr
    assert len(lines) <= EPOCHS + 10, lines
    assert "quantum gradient of layer qcnn (PQC): BlockAdjoint (differentiator auto, for Adjoint)" in lines[:3]
    assert not [line for line in lines if re.search(r"pid=|E0000|WARNING|INFO|Reporting training result", line)]


@pytest.mark.core
def test_tensorboard_has_per_epoch_scalars_and_readout_histogram(trained_run):
    events = EventAccumulator(str(trained_run.path / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    tags = events.Tags()["tensors"]
    assert {"loss", "accuracy", "val_loss", "val_accuracy", "qcnn_readout"} <= set(tags)
    assert [event.step for event in events.Tensors("val_accuracy")] == list(range(1, EPOCHS + 1))


@pytest.mark.core
def test_inference_equals_in_process_prediction(trained_run):
    run = trained_run.path
    done = run_command("infer", "--run", run, "--actors", 2, "--batch-size", 5)  # an actor per CPU
    assert done.returncode == 0, done.stderr[-3000:]
    out = re.search(r"predictions in (\S+)", done.stdout).group(1)
    predicted = pq.read_table(out).to_pandas().sort_values("id")

    test = pq.read_table(storage.split_path(str(run), "validation"))
    model = load_trained_model(str(run))
    expected = model(tf.constant(test.column("circuit").to_pylist()), training=False).numpy()[:, 0]
    assert predicted["id"].tolist() == test.column("id").to_pylist()
    np.testing.assert_allclose(predicted["prediction"].to_numpy(), expected, atol=1e-5)

    mse = float(np.mean((expected - test.column("label").to_numpy()) ** 2))  # the QCNN's loss
    assert f"loss {mse:.4f}  accuracy " in done.stdout and "with 2 actor(s)" in done.stdout
    lines = (done.stdout + done.stderr).splitlines()  # its two lines, nothing of Ray's or TensorFlow's
    assert [line.split()[0] for line in lines] == ["predicted", "loss"], lines


def test_resume_of_a_finished_run_says_so_and_changes_nothing(trained_run):
    files = {path: path.stat().st_mtime_ns for path in trained_run.path.rglob("*")}
    done = run_command("train", "--storage", trained_run.path.parent, "--name", "tutorial", "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"has already trained {EPOCHS} epochs" in done.stdout
    assert {path: path.stat().st_mtime_ns for path in trained_run.path.rglob("*")} == files
