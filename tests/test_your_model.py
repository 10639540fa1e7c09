"""A model and a data set of the user's own, outside the package: trained with the command and with
qml_ray.fit, streamed to the workers by Ray Data in shards, then inferred; and a sweep of the regression
example (the classifier example trains through lost nodes in test_preemption)."""

import hashlib
import json
import re
from pathlib import Path

import cirq
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import tensorflow_quantum as tfq

from qml_ray import config as config_lib, datasets, storage

from conftest import FILES, ROWS_PER_FILE, run_command

SEED = 5  # the run's seed: which rows are held out for validation
TEST_FRACTION = 0.25


def circuit_hash(circuit: bytes) -> str:
    return hashlib.sha1(circuit).hexdigest()


def gradients_of(run: Path) -> list[tuple[str, str]]:
    """(layer, gradient) of each TFQ layer, as the run recorded them."""
    return [
        (layer["layer"], layer["gradient"]) for layer in json.loads((run / storage.GRADIENTS).read_text())["layers"]
    ]


def all_rows(project: Path) -> pd.DataFrame:
    return pq.read_table(project / "data").to_pandas()


def test_a_users_model_trains_on_shards_of_its_data_and_infers(user_project, tmp_path, shared_ray):
    project = user_project
    notes = tmp_path / "notes"
    notes.mkdir()
    options = ("--data", "data", "--workers", 2, "--batch-size", 8, "--epochs", 1, "--seed", SEED)
    options += ("--address", shared_ray)
    done = run_command(
        "train",
        "--model",
        "mymodel:build",
        *options,
        "--data-in-memory-mb",
        0,  # streamed from the files, as a data set too large to keep would be
        "--test-fraction",
        TEST_FRACTION,
        "--param",
        f"notes={notes}",
        "--storage",
        tmp_path / "runs",
        "--name",
        "mine",
        cwd=project,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = tmp_path / "runs" / "mine"

    # Each worker trained on its own shard: disjoint, the same size, together every training row
    # (but the last rows % 2), and never the whole data set.
    rows = all_rows(project)
    held_out = datasets.held_out(rows["circuit"], SEED, TEST_FRACTION)
    training = {circuit_hash(c) for c in rows["circuit"][~held_out]}
    shards = [(notes / f"rank-{rank}.txt").read_text().split() for rank in (0, 1)]
    assert len(shards[0]) == len(shards[1]) == len(training) // 2
    assert not set(shards[0]) & set(shards[1])
    assert set(shards[0]) | set(shards[1]) <= training
    assert all(len(shard) < len(rows) / 2 for shard in shards)

    recorded = datasets.read_manifest(str(run))
    assert len(recorded["train"]) == FILES and recorded["rows"]["train"] == len(training)
    assert recorded["held_out"] == {"seed": SEED, "test_fraction": TEST_FRACTION}

    # Resumed for two more epochs, kept in memory (as a small data set is by default): each worker
    # reads its shard once and trains on it again in another order; then inferred over the held-out
    # rows (the default) and a file.
    resume = ("--resume", "--epochs", 3, "--data-in-memory-mb", 1, "--address", shared_ray)
    done = run_command("train", "--storage", tmp_path / "runs", "--name", "mine", *resume, cwd=project)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    history = pd.read_csv(run / storage.HISTORY)
    assert list(history["epoch"]) == [1, 2, 3] and history["loss"].iloc[-1] < history["loss"].iloc[0]
    rows_per_worker = len(training) // 2
    kept = [(notes / f"rank-{rank}.txt").read_text().split()[rows_per_worker:] for rank in (0, 1)]
    epochs = [(shard[:rows_per_worker], shard[rows_per_worker:]) for shard in kept]
    for second, third in epochs:
        assert len(third) == rows_per_worker and set(second) == set(third) and second != third
    assert not set(epochs[0][0]) & set(epochs[1][0]) and set(epochs[0][0]) | set(epochs[1][0]) <= training
    done = run_command("infer", "--run", run, "--address", shared_ray, cwd=project)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [out] = (run / storage.PREDICTIONS).iterdir()
    predicted = pq.read_table(out).to_pandas()
    assert sorted(predicted["id"]) == sorted(rows["id"][held_out])
    assert predicted["prediction"].dtype == np.float32 and predicted["prediction"].notna().all()
    assert done.stdout.splitlines()[-1].startswith("loss ")


def test_fit_takes_a_function_defined_by_the_caller(user_project, tmp_path, shared_ray):
    project = user_project
    import qml_ray

    def tiny(learning_rate=0.1):
        import sympy
        import tensorflow as tf

        qubit = cirq.GridQubit(0, 0)
        circuits = tf.keras.Input(shape=(), dtype=tf.string)
        readout = tfq.layers.PQC(cirq.Circuit(cirq.ry(sympy.Symbol("v"))(qubit)), cirq.Z(qubit))(circuits)
        model = tf.keras.Model(circuits, tf.keras.layers.Dense(1)(readout))
        model.compile(tf.keras.optimizers.Adam(learning_rate), loss="mse", metrics=["mae"])
        return model

    import ray

    try:
        trained = qml_ray.fit(
            model=tiny,
            data=str(project / "data"),
            workers=2,
            epochs=2,
            storage=str(tmp_path),
            name="fitted",
            address=shared_ray,
        )
        assert trained.run == str(tmp_path / "fitted")
        assert {"loss", "mae", "val_loss", "val_mae"} <= set(trained.metrics)
        out = qml_ray.predict(trained.run, str(project / "data" / "part-000.parquet"))
    finally:
        ray.shutdown()
    predicted = pq.read_table(out).to_pandas()
    assert list(predicted["id"]) == list(range(ROWS_PER_FILE))
    assert storage.is_complete(out)


def test_a_sweep_over_the_regression_examples_parameters_then_infer_with_the_best(tmp_path, shared_ray):
    """Ray Tune trials of a user's model, side by side on a worker each: one per value of one of its own
    parameters."""
    from examples import regression

    regression.make_data(str(tmp_path / "data"))
    options = ("--data", tmp_path / "data", "--grid", "param.readout_layers=1,2", "--workers", 1, "--epochs", 4)
    options += ("--batch-size", 16, "--address", shared_ray)
    done = run_command(
        "sweep", "--model", "examples.regression:regressor", *options, "--storage", tmp_path, "--name", "layers"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = pd.read_csv(tmp_path / "layers" / "results.csv")
    assert len(table) == 2 and set(table["state"]) == {"finished"} and (table["epochs"] == 4).all()
    trials = [config_lib.of_run(run) for run in table["run"]]
    assert {trial.model for trial in trials} == {"examples.regression:regressor"}
    assert sorted(trial.params["readout_layers"] for trial in trials) == [1, 2]
    for run in table["run"]:
        history = pd.read_csv(Path(run) / storage.HISTORY)
        assert "val_mae" in history and history["loss"].iloc[-1] < history["loss"].iloc[0]
        assert gradients_of(Path(run)) == [("pqc", "BlockAdjoint")]
    done = run_command("infer", "--run", table["run"].iloc[0], "--data", tmp_path / "data", "--address", shared_ray)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.fullmatch(r"loss \d\.\d+  mae \d\.\d+", done.stdout.splitlines()[-1])
