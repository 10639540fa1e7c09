"""Storage's failures named in one line: a full, read-only or refused local folder, and Cloud Storage's
refusals, limits, missing credentials or absence, each an `EnvironmentProblem` (exit status 1)."""

import contextlib
import errno
import os
import re

from qml_ray.errors import EnvironmentProblem, UsageError

NO_CREDENTIALS = (
    "no Google Cloud credentials: run `gcloud auth application-default login`, "
    "or on GKE give the pods a Workload Identity service account"
)
# Cloud Storage's refusals, by their status (google-cloud-cpp's, under pyarrow's GcsFileSystem).
_GCS_PROBLEMS = {
    "PERMISSION_DENIED": "permission denied on {where}",
    "UNAUTHENTICATED": "Cloud Storage refused the credentials for {where}",
    "RESOURCE_EXHAUSTED": "Cloud Storage rate limit or quota exceeded on {where}",
    "UNAVAILABLE": "cannot reach Cloud Storage at {endpoint} for {where}",
    "DEADLINE_EXCEEDED": "cannot reach Cloud Storage at {endpoint} for {where}",
}
_GCS_STATUS = re.compile(r"google::cloud::Status\((\w+):")
_NO_TOKEN = "Could not create a OAuth2 access token"  # google-cloud-cpp, finding no credentials


def environment_problem(err: BaseException, where: str) -> EnvironmentProblem | None:
    """`err`, met reading or writing at `where`, named as the environment's problem (storage full,
    read-only or refused; Cloud Storage's refusals, limits, credentials or absence), or None when it
    is none of those."""
    if isinstance(err, EnvironmentProblem):
        return err
    text, number = str(err), getattr(err, "errno", None)
    where = getattr(err, "filename", None) or where
    if number in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in text or "Disk quota exceeded" in text:
        return EnvironmentProblem(f"storage full: {where}")
    if number == errno.EROFS or "Read-only file system" in text:
        return EnvironmentProblem(f"storage is read-only: {where}")
    if number in (errno.EACCES, errno.EPERM) or "Permission denied" in text:
        return EnvironmentProblem(f"permission denied on {where}")
    if _NO_TOKEN in text:
        return EnvironmentProblem(NO_CREDENTIALS)
    status = _GCS_STATUS.search(text)
    return gcs_problem(status.group(1), where) if status and status.group(1) in _GCS_PROBLEMS else None


def gcs_problem(status: str, where: str) -> EnvironmentProblem:
    """Cloud Storage's refusal `status` (PERMISSION_DENIED, UNAVAILABLE, ...) at `where`, named."""
    endpoint = os.environ.get("STORAGE_EMULATOR_HOST", "storage.googleapis.com")
    return EnvironmentProblem(_GCS_PROBLEMS[status].format(where=where, endpoint=endpoint))


def missing_bucket(bucket: str) -> UsageError:
    return UsageError(f"Cloud Storage bucket {bucket!r} does not exist")


def named(path: str, call):
    """`call()`, an OSError it meets at `path` raised as the EnvironmentProblem it is, if it is one."""
    with named_problems(path):
        return call()


@contextlib.contextmanager
def named_problems(path: str):
    """An OSError the block meets at `path` raised as the EnvironmentProblem it is, if it is one."""
    try:
        yield
    except OSError as err:
        problem = environment_problem(err, path)
        if problem is None:
            raise
        raise problem from None
