"""Cloud Storage's mistakes and outages, each found before Ray starts: locations that are not a
bucket's, a server that does not answer, no credentials, a run that is not there, and the refusals
Cloud Storage can answer with (fake-gcs-server on loopback serves the bucket)."""

import time

import pytest

from qml_ray import storage_errors

from conftest import BUCKET, SMOKE, command_env, run_command


@pytest.mark.parametrize(
    "location, message",
    [
        ("gs:/x", "unsupported storage 'gs:/x'"),
        ("gs://", "malformed Cloud Storage location 'gs://'"),
        ("s3://bucket/runs", "unsupported storage 's3://bucket/runs'"),
        (f"gs://no-such-bucket-{BUCKET}/runs", "bucket 'no-such-bucket-qml-ray-test' does not exist"),
    ],
)
def test_bad_storage_locations(gcs_server, location, message):
    done = run_command("train", "--config", SMOKE, "--storage", location, timeout=60)
    assert done.returncode == 2 and message in done.stderr.strip().splitlines()[-1], done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_unreachable_endpoint_fails_within_seconds(gcs_server):
    started = time.monotonic()
    env = command_env(STORAGE_EMULATOR_HOST="http://127.0.0.1:9")  # nothing listens on the discard port
    done = run_command("train", "--config", SMOKE, "--storage", f"gs://{BUCKET}/runs", timeout=120, env=env)
    assert done.returncode == 1, done.stderr[-2000:]  # the environment's problem, not the user's
    assert "cannot reach Cloud Storage at http://127.0.0.1:9" in done.stderr.strip().splitlines()[-1]
    assert time.monotonic() - started < 60


def test_no_credentials(tmp_path):
    env = command_env(
        STORAGE_EMULATOR_HOST=None,
        GOOGLE_APPLICATION_CREDENTIALS=None,
        HOME=str(tmp_path),
        CLOUDSDK_CONFIG=str(tmp_path),
        NO_GCE_CHECK="True",
        GCE_METADATA_HOST="127.0.0.1:9",
        GCE_METADATA_IP="127.0.0.1:9",
    )
    done = run_command("train", "--config", SMOKE, "--storage", f"gs://{BUCKET}/runs", timeout=120, env=env)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "no Google Cloud credentials" in done.stderr.strip().splitlines()[-1]


def test_infer_on_a_missing_gcs_run(gcs_server):
    done = run_command("infer", "--run", f"gs://{BUCKET}/runs/never-trained")
    assert done.returncode == 2 and "error: no run at" in done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "status, named",
    [
        ("PERMISSION_DENIED", "permission denied on gs://b/r/x"),
        ("UNAUTHENTICATED", "Cloud Storage refused the credentials for gs://b/r/x"),
        ("RESOURCE_EXHAUSTED", "Cloud Storage rate limit or quota exceeded on gs://b/r/x"),
    ],
)
def test_cloud_storage_refusals_are_named(status, named):
    """As pyarrow's GcsFileSystem raises them (google-cloud-cpp's status in the text): fake-gcs-server
    refuses nothing, so the server's part is not exercised here."""
    error = OSError(f"google::cloud::Status({status}: Permanent error, with a last message of Refused)")
    assert str(storage_errors.environment_problem(error, "gs://b/r/x")) == named
