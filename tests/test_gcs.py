"""Runs on Cloud Storage, proven against a real GCS API server (fake-gcs-server) on loopback. (Its
mistakes and outages, found before Ray starts: test_gcs_errors.)"""

import io
import re

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
from google.cloud import storage as gcs

from qml_ray import claims, config as config_lib, replica, storage
from qml_ray.infer import load_trained_model

from conftest import BUCKET, SMOKE, run_command
from test_end_to_end import epoch_lines
from test_faults import two_at_once

EPOCHS = config_lib.load(SMOKE).epochs  # the run these tests train on gs://


def blob_names(prefix: str) -> list[str]:
    return sorted(blob.name[len(prefix) :] for blob in gcs.Client().list_blobs(BUCKET, prefix=prefix))


@pytest.fixture(scope="session")
def gcs_run(gcs_server, shared_cluster) -> str:
    options = ("--workers", 1, "--storage", f"gs://{BUCKET}/runs", "--name", "smoke")
    options += ("--address", shared_cluster.address)
    done = run_command("train", "--config", SMOKE, *options)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert epoch_lines(done.stdout + done.stderr) == [(e, EPOCHS) for e in range(1, EPOCHS + 1)]
    assert "Unable to register" not in done.stderr  # TensorFlow's native start-up lines stay off the console
    return f"gs://{BUCKET}/runs/smoke"


def test_every_artifact_of_a_run_is_in_the_bucket(gcs_run, shared_ray):
    names = blob_names("runs/smoke/")
    for expected in [
        "config.yaml",
        "data/train.parquet",
        "data/test.parquet",
        "metrics.csv",
        "weights/model.index",
        "weights/model.data-00000-of-00001",
        "weights/state.json",
        "weights/_COMPLETE",
        "checkpoints/epoch-00002/model.index",
        "checkpoints/epoch-00006/state.json",
    ]:
        assert expected in names, names
    assert any(re.fullmatch(r"tensorboard/events\.out\.tfevents\..+", n) for n in names), names
    history = pd.read_csv(io.StringIO(storage.read_text(f"{gcs_run}/metrics.csv")))
    assert history["epoch"].tolist() == list(range(1, EPOCHS + 1))
    assert history["val_accuracy"].iloc[-1] >= 0.75


def test_inference_reads_the_stored_weights_and_writes_to_the_bucket(gcs_run, shared_ray):
    done = run_command("infer", "--run", gcs_run, "--address", shared_ray)
    assert done.returncode == 0, done.stderr[-3000:]
    out = re.search(r"predictions in (\S+)", done.stdout).group(1)
    assert out.startswith(f"{gcs_run}/predictions/")
    parts = [n for n in blob_names(out[len(f"gs://{BUCKET}/") :] + "/") if n.endswith(".parquet")]
    assert parts and "_COMPLETE" in blob_names(out[len(f"gs://{BUCKET}/") :] + "/")
    predicted = pd.concat(storage.read_parquet(f"{out}/{p}").to_pandas() for p in parts).sort_values("id")

    test = storage.read_parquet(storage.split_path(gcs_run, "validation"))
    trained = load_trained_model(gcs_run)  # downloads the stored weights
    circuits = tf.constant(test.column("circuit").to_pylist())
    expected = trained(circuits).numpy()[:, 0]
    np.testing.assert_allclose(predicted["prediction"].to_numpy(), expected, atol=1e-5)
    untrained = replica.build(config_lib.of_run(gcs_run))  # the same seeded start, before training
    assert not np.allclose(untrained(circuits).numpy()[:, 0], expected, atol=1e-3)


def test_two_commands_resume_a_run_in_the_bucket_one_is_refused_the_other_continues(gcs_run, shared_ray):
    """Two `train --resume` of one run in the bucket at the same moment: one is refused (Cloud Storage
    holds the claim), the other continues from the run's checkpoint there."""
    runs = f"gs://{BUCKET}/resumed"
    for name in [n for n in blob_names("runs/smoke/") if n and not n.endswith("/")]:  # no folder markers
        storage.write_bytes(f"{runs}/r/{name}", storage.read_bytes(f"{gcs_run}/{name}"))
    winner, refused = two_at_once(runs, "--resume", "--epochs", EPOCHS + 2, "--address", shared_ray)
    done = winner.end()
    assert done.status == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert epoch_lines(done.stdout + done.stderr) == [(EPOCHS + 1, EPOCHS + 2), (EPOCHS + 2, EPOCHS + 2)]
    history = pd.read_csv(io.StringIO(storage.read_text(f"{runs}/r/metrics.csv")))
    assert history["epoch"].tolist() == list(range(1, EPOCHS + 3))
    assert "checkpoints/epoch-00008/model.index" in blob_names("resumed/r/")
    assert not storage.exists(f"{runs}/r/{claims.CLAIM}")
    print(f"\nsecond writer on Cloud Storage refused after {refused.seconds:.1f} s")
