"""The file-system layer under storage: which file system a path is on, and Cloud Storage's own client.

Every ordinary read and write goes through pyarrow's file systems, LocalFileSystem and GcsFileSystem (the
layer Ray Train and Ray Data use too). Cloud Storage's own client (google-cloud-storage) serves what
GcsFileSystem cannot do: finding missing credentials at once, and the claims' conditional writes
(`atomic_files`). Cloud Storage uses Application Default Credentials (Workload Identity on GKE) and honours
STORAGE_EMULATOR_HOST; calls give up after a few seconds rather than retry for minutes.
"""

import functools
import os
from datetime import timedelta

import pyarrow.fs as pafs

from qml_ray.errors import EnvironmentProblem
from qml_ray.storage_errors import NO_CREDENTIALS, gcs_problem, missing_bucket

GCS_PREFIX = "gs://"
GCS_SECONDS = 15.0  # how long one Cloud Storage client call may retry before giving up
# pyarrow's retry limit for one call: its last back-off may overshoot it, so a call to an endpoint
# that does not answer gives up after about 11 s (18 s with a limit of 10, 27 s with 15).
FILESYSTEM_RETRY_SECONDS = 7.0


def is_gcs(path: str) -> bool:
    return path.startswith(GCS_PREFIX)


def of(path: str) -> tuple[pafs.FileSystem, str]:
    """The file system of `path` and the path within it."""
    if is_gcs(path):
        return _gcs_filesystem(os.environ.get("STORAGE_EMULATOR_HOST")), path[len(GCS_PREFIX) :].rstrip("/")
    return pafs.LocalFileSystem(), os.path.abspath(path)


@functools.cache
def _gcs_filesystem(emulator: str | None) -> pafs.GcsFileSystem:
    """Cloud Storage, or the GCS API server at `emulator`, retrying a call for FILESYSTEM_RETRY_SECONDS."""
    limit = timedelta(seconds=FILESYSTEM_RETRY_SECONDS)
    if emulator:
        scheme, _, host = emulator.rpartition("://")
        return pafs.GcsFileSystem(
            anonymous=True, scheme=scheme or "http", endpoint_override=host, retry_time_limit=limit
        )
    return pafs.GcsFileSystem(retry_time_limit=limit)


# Cloud Storage's own client, for what GcsFileSystem cannot do.


@functools.cache
def client():
    """The Cloud Storage client; an EnvironmentProblem at once when there are no credentials."""
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import storage as gcs

    try:
        return gcs.Client()
    except DefaultCredentialsError:
        raise EnvironmentProblem(NO_CREDENTIALS) from None


@functools.cache
def limits() -> dict:
    """The retry deadline and (connect, read) timeouts of every Cloud Storage client call."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    return {"retry": DEFAULT_RETRY.with_timeout(GCS_SECONDS), "timeout": (5, 60)}


def split(path: str) -> tuple[str, str]:
    """A gs:// path's bucket and object name."""
    bucket, _, name = path[len(GCS_PREFIX) :].partition("/")
    return bucket, name.rstrip("/")


def blob(path: str):
    bucket, name = split(path)
    return client().bucket(bucket).blob(name)


def call(run, path: str):
    """`run()`, a Cloud Storage client call, its failures named as the file-system layer's are
    (`storage_errors.named`)."""
    from google.api_core import exceptions as api
    from google.auth.exceptions import TransportError
    from requests.exceptions import ConnectionError as RequestsConnectionError

    try:
        return run()
    except api.NotFound as err:
        if "bucket" in str(err).lower():
            raise missing_bucket(split(path)[0]) from None
        raise FileNotFoundError(path) from None
    except api.Forbidden:
        raise gcs_problem("PERMISSION_DENIED", path) from None
    except api.Unauthorized:
        raise gcs_problem("UNAUTHENTICATED", path) from None
    except api.TooManyRequests:
        raise gcs_problem("RESOURCE_EXHAUSTED", path) from None
    except (api.RetryError, api.ServiceUnavailable, RequestsConnectionError, TransportError):
        raise gcs_problem("UNAVAILABLE", path) from None
