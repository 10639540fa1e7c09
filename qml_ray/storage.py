"""Where runs live: a local folder, or Cloud Storage (gs://bucket/prefix).

Every artifact of a run is read and written through these functions, so the code above
them takes the same path for both, and they go through one file-system layer: pyarrow's
LocalFileSystem and GcsFileSystem (the layer Ray Train and Ray Data use). What that layer
cannot do is kept in one section, "Beyond the file-system layer", which says why. Nothing is
ever seen half-written: a single file is replaced whole (a rename locally, a single upload on
Cloud Storage), and a folder (weights, predictions) counts as complete only once its
_COMPLETE marker exists, which is written last and, when the folder is replaced, removed first.

Cloud Storage uses Application Default Credentials (Workload Identity on GKE) and honours
STORAGE_EMULATOR_HOST; calls give up after a few seconds rather than retry for minutes.
"""

import contextlib
import errno
import functools
import io
import os
import posixpath
import re
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from qml_ray.errors import EnvironmentProblem, UsageError

# The run folder, <storage>/<name>/, holds these (docs/storage.md, The run folder):
CONFIG = "config.yaml"  # the resolved config
DATA = "data"  # train.parquet and test.parquet
CHECKPOINTS = "checkpoints"  # Ray Train checkpoints, one folder per checkpointed epoch
WEIGHTS = "weights"  # the final weights, published when training ends
HISTORY = "metrics.csv"  # one row per epoch
# metrics.csv's columns besides the epoch and the model's metrics (finished_at: Unix time, restarts show as gaps)
TIMING_FIELDS = ("epoch_seconds", "circuits_per_second", "finished_at")


def metric_names(columns) -> list[str]:
    """The model's own metrics among metrics.csv's columns (or a history row's keys)."""
    return [column for column in columns if column not in ("epoch", *TIMING_FIELDS)]


TENSORBOARD = "tensorboard"  # per-epoch scalars and the readout histogram
PREDICTIONS = "predictions"  # one folder of Parquet per inference run
GRADIENTS = "gradients.json"  # the quantum gradient each TFQ layer of the model trained with
COMPLETE = "_COMPLETE"  # marks a published folder as whole
CHECKPOINT_LIST = "checkpoint_manager_snapshot.json"  # Ray Train's list of the checkpoints, in the run folder
# A checkpoint (checkpoints/epoch-NNNNN/) and the weights folder hold:
WEIGHTS_PREFIX = "model"  # the TensorFlow checkpoint of weights and optimizer state: model.index, model.data-*
OLD_WEIGHTS_PREFIX = "qcnn"  # the prefix runs written before it was "model" have: they still load
STATE_FILE = "state.json"  # epochs done and the metrics history
# and a checkpoint holds rank 0's TensorBoard logs up to its epoch as one file: Ray Train's download of a
# checkpoint from Cloud Storage does not recreate subfolders.
SUMMARIES = "tensorboard.zip"

NAME_BYTES = 255  # the longest folder name of Linux file systems
GCS_PREFIX = "gs://"
GCS_SECONDS = 15.0  # how long one Cloud Storage client call may retry before giving up
# pyarrow's retry limit for one call: its last back-off may overshoot it, so a call to an endpoint
# that does not answer gives up after about 11 s (18 s with a limit of 10, 27 s with 15).
FILESYSTEM_RETRY_SECONDS = 7.0
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")


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
    return _gcs_problem(status.group(1), where) if status and status.group(1) in _GCS_PROBLEMS else None


def _gcs_problem(status: str, where: str) -> EnvironmentProblem:
    endpoint = os.environ.get("STORAGE_EMULATOR_HOST", "storage.googleapis.com")
    return EnvironmentProblem(_GCS_PROBLEMS[status].format(where=where, endpoint=endpoint))


def _named(path: str, call):
    """`call()`, an OSError it meets at `path` raised as the EnvironmentProblem it is, if it is one."""
    with _named_problems(path):
        return call()


@contextlib.contextmanager
def _named_problems(path: str):
    """An OSError the block meets at `path` raised as the EnvironmentProblem it is, if it is one."""
    try:
        yield
    except OSError as err:
        problem = environment_problem(err, path)
        if problem is None:
            raise
        raise problem from None


def is_gcs(path: str) -> bool:
    return path.startswith(GCS_PREFIX)


def check_location(location: str) -> None:
    """Raise UsageError unless `location` is a local path or gs://BUCKET[/PREFIX]."""
    if is_gcs(location):
        bucket = location[len(GCS_PREFIX) :].split("/", 1)[0]
        if not _BUCKET_NAME.match(bucket):
            raise UsageError(f"malformed Cloud Storage location {location!r}: expected gs://BUCKET[/PREFIX]")
    elif "://" in location or location.startswith("gs:"):
        raise UsageError(f"unsupported storage {location!r}: use a local folder or gs://BUCKET[/PREFIX]")


def run_dir(storage: str, name: str) -> str:
    """The location of run `name` under `storage` (local paths made absolute); a UsageError
    unless `name` is one folder name that file systems hold (any script, at most NAME_BYTES)."""
    if name in ("", ".", "..") or any(char in name for char in "/\\\0"):
        raise UsageError(f"a run's --name must be one folder name (no '/', not empty, '.' or '..'): {name!r}")
    if len(name.encode()) > NAME_BYTES:
        raise UsageError(f"a run's --name must be at most {NAME_BYTES} bytes (UTF-8), not {len(name.encode())}")
    return absolute(join(storage, name))


def absolute(path: str) -> str:
    return path if is_gcs(path) else os.path.abspath(path)


def join(base: str, *parts: str) -> str:
    return posixpath.join(base, *parts)


def checkpoint_name(epoch: int, step: int = 0) -> str:
    """The folder, relative to the run folder (Ray Train's), of the checkpoint taken after `epoch`
    epochs (and `step` steps of the next, for one taken on a node's drain notice):
    checkpoints/epoch-NNNNN[-step-NNNNN]."""
    return f"{CHECKPOINTS}/epoch-{epoch:05d}" + (f"-step-{step:05d}" if step else "")


def split_path(run: str, split: str) -> str:
    """The Parquet file of a data split ("train" or "test") of a run."""
    return join(run, DATA, f"{split}.parquet")


def check_reachable(location: str) -> None:
    """Fail within seconds, in one line, when `location` cannot be used (bucket, network, rights)."""
    if not is_gcs(location):
        check_local_folder(location)
        return
    _client()  # no credentials: said at once, where the file-system layer would retry for long
    bucket, _ = _split(location)
    filesystem, _ = _filesystem(location)
    if _named(location, lambda: filesystem.get_file_info(bucket).type) == pafs.FileType.NotFound:
        raise _missing_bucket(bucket)


def check_local_folder(folder: str) -> None:
    """Raise UsageError unless `folder` is a local folder this process may write to, or can become one."""
    path = Path(os.path.abspath(folder))
    existing = next(found for found in (path, *path.parents) if found.exists())
    if not existing.is_dir():
        raise UsageError(f"{folder} cannot be a folder: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK) or os.statvfs(existing).f_flag & os.ST_RDONLY:
        raise UsageError(f"cannot write to {folder}: {existing} is not writable")


# Ordinary file operations, the same for a local folder and Cloud Storage: pyarrow's file systems
# (the layer Ray Train and Ray Data use too).


def exists(path: str) -> bool:
    """Whether a file, or a folder with anything in it, is at `path`."""
    filesystem, inner = _filesystem(path)
    return _named(path, lambda: filesystem.get_file_info(inner).type) != pafs.FileType.NotFound


def read_bytes(path: str) -> bytes:
    filesystem, inner = _filesystem(path)

    def read():
        with filesystem.open_input_stream(inner) as stream:
            return stream.read()

    return _named(path, read)


def list_files(folder: str) -> list[str]:
    """The paths of the files below `folder`, relative to it (none if it does not exist)."""
    filesystem, inner = _filesystem(folder)
    below = pafs.FileSelector(inner, allow_not_found=True, recursive=True)
    found = _named(folder, lambda: filesystem.get_file_info(below))
    return sorted(posixpath.relpath(info.path, inner) for info in found if info.type == pafs.FileType.File)


def remove(path: str) -> None:
    """Delete the file at `path` if there is one."""
    filesystem, inner = _filesystem(path)
    with contextlib.suppress(FileNotFoundError):
        _named(path, lambda: filesystem.delete_file(inner))


def remove_folder(folder: str) -> None:
    """Delete `folder` and everything below it, as far as it can be (a failed command's leftovers)."""
    filesystem, inner = _filesystem(folder)
    with contextlib.suppress(OSError):
        filesystem.delete_dir(inner)


@contextlib.contextmanager
def local_copy(folder: str):
    """A local folder holding the files below `folder` (downloaded into a temporary one)."""
    with tempfile.TemporaryDirectory() as local:
        for name in list_files(folder):
            target = Path(local, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(read_bytes(join(folder, name)))
        yield local


def read_text(path: str) -> str:
    return read_bytes(path).decode()


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode())


def read_parquet(path: str) -> pa.Table:
    return pq.read_table(io.BytesIO(read_bytes(path)))


def write_parquet(table: pa.Table, path: str) -> None:
    out = io.BytesIO()
    pq.write_table(table, out)
    write_bytes(path, out.getvalue())


def mirror(local_dir: str, dest: str) -> None:
    """Make `dest` hold exactly the files below `local_dir`, each replaced whole."""
    names = list_files(local_dir)
    for name in names:
        write_bytes(join(dest, name), Path(local_dir, name).read_bytes())
    for name in set(list_files(dest)) - set(names):
        remove(join(dest, name))


def publish_dir(local_dir: str, dest: str) -> None:
    """Copy a folder to `dest` so that readers see the old complete folder, or the new one."""
    remove(join(dest, COMPLETE))
    mirror(local_dir, dest)
    mark_complete(dest)


def mark_complete(folder: str) -> None:
    write_bytes(join(folder, COMPLETE), b"")


def is_complete(folder: str) -> bool:
    return exists(join(folder, COMPLETE))


def weights_in(folder: str) -> str:
    """The path (prefix) of the TensorFlow checkpoint in local `folder`: WEIGHTS_PREFIX's, or an older run's."""
    for prefix in (WEIGHTS_PREFIX, OLD_WEIGHTS_PREFIX):
        if os.path.exists(os.path.join(folder, f"{prefix}.index")):
            return os.path.join(folder, prefix)
    return os.path.join(folder, WEIGHTS_PREFIX)


def pyarrow_filesystem(path: str):
    """(filesystem, path within it) for Ray Train's and Ray Data's storage arguments: a local path
    goes as it is (relative ones too: on a cluster, the job's working folder on every node)."""
    return _filesystem(path) if is_gcs(path) else (None, path)


def _filesystem(path: str) -> tuple[pafs.FileSystem, str]:
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


# Beyond the file-system layer: what pyarrow's file systems cannot do. Folders (Cloud Storage has
# none to make); a local file replaced whole (pyarrow writes in place; a Cloud Storage upload
# appears whole anyway); a hard link; and the claims' conditional writes, an atomic create and a
# delete of one version, which pyarrow's GcsFileSystem lacks, on Cloud Storage through its own
# client (google-cloud-storage's preconditions).


def make_folder(folder: str) -> None:
    """Create a local folder (and its parents), or raise a UsageError saying why it cannot be;
    Cloud Storage has no folders to make."""
    if not is_gcs(folder):
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as err:
            raise UsageError(f"cannot create the folder {folder}: {err}") from None


def missing_folders(folder: str) -> list[str]:
    """The local folders that creating `folder` would create, deepest first (none on Cloud Storage)."""
    if is_gcs(folder):
        return []
    missing, path = [], Path(os.path.abspath(folder))
    while not path.exists() and path != path.parent:
        missing.append(str(path))
        path = path.parent
    return missing


def remove_empty_folders(folders: list[str]) -> None:
    """Remove those of `folders` (deepest first) that are empty."""
    for folder in folders:
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def write_bytes(path: str, content: bytes) -> None:
    """Replace the file at `path` whole: one upload on Cloud Storage, locally a new file renamed over it."""
    if is_gcs(path):
        filesystem, inner = _filesystem(path)
        _named(path, lambda: _upload(filesystem, inner, content))
        return
    with _named_problems(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(content)
            os.replace(tmp, path)
        except BaseException:
            os.remove(tmp)
            raise


def _upload(filesystem: pafs.FileSystem, path: str, content: bytes) -> None:
    """One upload: the object appears, whole, when the stream is closed (below 8 MiB, its one request)."""
    with filesystem.open_output_stream(path, metadata={}) as stream:
        stream.write(content)


def share(source: str, dest: str) -> None:
    """Put the file at `source` at `dest` too, without writing its bytes again: a hard link
    locally (a copy where links are refused), a server-side copy on Cloud Storage."""
    if is_gcs(source):
        filesystem, inner = _filesystem(source)
        _named(dest, lambda: filesystem.copy_file(inner, _filesystem(dest)[1]))
        return
    with _named_problems(dest):
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        try:
            os.link(source, dest)
        except OSError:
            shutil.copyfile(source, dest)


def create_exclusive(path: str, content: bytes) -> bool:
    """Create the file at `path` holding `content`, atomically, unless a file is there: whether it
    was created (locally an exclusive create, on Cloud Storage `if_generation_match=0`)."""
    if is_gcs(path):
        from google.api_core.exceptions import PreconditionFailed

        try:
            _gcs(lambda: _blob(path).upload_from_string(content, if_generation_match=0, **_limits()), path)
        except PreconditionFailed:
            return False
        return True
    with _named_problems(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(content)
    return True


def version(path: str) -> tuple[tuple, float] | None:
    """The version of the file at `path` (changed by every write) and when it was last written
    (Unix time), or None when there is no file."""
    if is_gcs(path):
        blob = _blob(path)
        if not _gcs(lambda: blob.exists(**_limits()), path):
            return None
        _gcs(lambda: blob.reload(**_limits()), path)
        return (blob.generation, blob.metageneration), blob.updated.timestamp()
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return (stat.st_ino, stat.st_mtime_ns), stat.st_mtime


def remove_if_unchanged(path: str, expected: tuple) -> bool:
    """Delete the file at `path` if its `version` is still `expected`: whether it was deleted."""
    if is_gcs(path):
        from google.api_core.exceptions import NotFound, PreconditionFailed

        generation, metageneration = expected
        try:
            _gcs(
                lambda: _blob(path).delete(
                    if_generation_match=generation, if_metageneration_match=metageneration, **_limits()
                ),
                path,
            )
        except (PreconditionFailed, NotFound, FileNotFoundError):
            return False
        return True
    aside = f"{path}.{os.getpid()}.removed"
    try:
        os.rename(path, aside)  # atomic: one command takes it
    except FileNotFoundError:
        return False
    stat = os.stat(aside)
    if (stat.st_ino, stat.st_mtime_ns) != expected:  # another command's, written meanwhile: put it back
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)
        os.remove(aside)
        return False
    os.remove(aside)
    return True


@functools.cache
def _limits() -> dict:
    """The retry deadline and (connect, read) timeouts of every Cloud Storage client call."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    return {"retry": DEFAULT_RETRY.with_timeout(GCS_SECONDS), "timeout": (5, 60)}


@functools.cache
def _client():
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import storage as gcs

    try:
        return gcs.Client()
    except DefaultCredentialsError:
        raise EnvironmentProblem(NO_CREDENTIALS) from None


def _missing_bucket(bucket: str) -> UsageError:
    return UsageError(f"Cloud Storage bucket {bucket!r} does not exist")


def _split(path: str) -> tuple[str, str]:
    bucket, _, name = path[len(GCS_PREFIX) :].partition("/")
    return bucket, name.rstrip("/")


def _blob(path: str):
    bucket, name = _split(path)
    return _client().bucket(bucket).blob(name)


def _gcs(call, path: str):
    """Run a Cloud Storage client call, its failures named as the file-system layer's are (`_named`)."""
    from google.api_core import exceptions as api
    from google.auth.exceptions import TransportError
    from requests.exceptions import ConnectionError as RequestsConnectionError

    try:
        return call()
    except api.NotFound as err:
        if "bucket" in str(err).lower():
            raise _missing_bucket(_split(path)[0]) from None
        raise FileNotFoundError(path) from None
    except api.Forbidden:
        raise _gcs_problem("PERMISSION_DENIED", path) from None
    except api.Unauthorized:
        raise _gcs_problem("UNAUTHENTICATED", path) from None
    except api.TooManyRequests:
        raise _gcs_problem("RESOURCE_EXHAUSTED", path) from None
    except (api.RetryError, api.ServiceUnavailable, RequestsConnectionError, TransportError):
        raise _gcs_problem("UNAVAILABLE", path) from None
