"""Where runs live: a local folder, or Cloud Storage (gs://bucket/prefix).

The run folder's layout, and every whole-file read and write of a run's artifacts, so the code above takes
the same path for both; they go through one file-system layer (`filesystem`: pyarrow's LocalFileSystem and
GcsFileSystem, the layer Ray Train and Ray Data use), their failures named in one line (`storage_errors`).
What that layer cannot do is kept in one section, "Beyond the file-system layer", which says why. Nothing is
ever seen half-written: a single file is replaced whole (a rename locally, a single upload on Cloud Storage),
and a folder (weights, predictions) counts as complete only once its _COMPLETE marker exists, which is
written last and, when the folder is replaced, removed first.
"""

import contextlib
import io
import os
import posixpath
import re
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from qml_ray import filesystem
from qml_ray.errors import UsageError
from qml_ray.filesystem import GCS_PREFIX, is_gcs
from qml_ray.storage_errors import missing_bucket, named, named_problems

# The run folder, <storage>/<name>/, holds these (docs/storage.md, The run folder):
CONFIG = "config.yaml"  # the resolved config
DATA = "data"  # train.parquet and test.parquet (SPLIT_FILES)
# The generated data set's split files: the validation split's keeps the name the first runs wrote, so they resume.
SPLIT_FILES = {"train": "train.parquet", "validation": "test.parquet"}
CHECKPOINTS = "checkpoints"  # Ray Train checkpoints, one folder per checkpointed epoch
WEIGHTS = "weights"  # the final weights, published when training ends
HISTORY = "metrics.csv"  # one row per epoch
# metrics.csv's columns besides the epoch and the model's metrics (finished_at: Unix time, restarts show as gaps)
RECORD_FIELDS = ("epoch_seconds", "circuits_per_second", "finished_at", "workers")  # a history row's, beside metrics


def metric_names(columns) -> list[str]:
    """The model's own metrics among metrics.csv's columns (or a history row's keys)."""
    return [column for column in columns if column not in ("epoch", *RECORD_FIELDS)]


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
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")


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
    """The Parquet file of a data split ("train" or "validation") of a run."""
    return join(run, DATA, SPLIT_FILES[split])


def check_reachable(location: str) -> None:
    """Fail within seconds, in one line, when `location` cannot be used (bucket, network, rights)."""
    if not is_gcs(location):
        check_local_folder(location)
        return
    filesystem.client()  # no credentials: said at once, where the file-system layer would retry for long
    bucket, _ = filesystem.split(location)
    files, _ = filesystem.of(location)
    if named(location, lambda: files.get_file_info(bucket).type) == pafs.FileType.NotFound:
        raise missing_bucket(bucket)


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
    files, inner = filesystem.of(path)
    return named(path, lambda: files.get_file_info(inner).type) != pafs.FileType.NotFound


def read_bytes(path: str) -> bytes:
    files, inner = filesystem.of(path)

    def read():
        with files.open_input_stream(inner) as stream:
            return stream.read()

    return named(path, read)


def list_files(folder: str) -> list[str]:
    """The paths of the files below `folder`, relative to it (none if it does not exist)."""
    files, inner = filesystem.of(folder)
    below = pafs.FileSelector(inner, allow_not_found=True, recursive=True)
    found = named(folder, lambda: files.get_file_info(below))
    return sorted(posixpath.relpath(info.path, inner) for info in found if info.type == pafs.FileType.File)


def remove(path: str) -> None:
    """Delete the file at `path` if there is one."""
    files, inner = filesystem.of(path)
    with contextlib.suppress(FileNotFoundError):
        named(path, lambda: files.delete_file(inner))


def remove_folder(folder: str) -> None:
    """Delete `folder` and everything below it, as far as it can be (a failed command's leftovers)."""
    files, inner = filesystem.of(folder)
    with contextlib.suppress(OSError):
        files.delete_dir(inner)


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
    return filesystem.of(path) if is_gcs(path) else (None, path)


# Beyond the file-system layer: what pyarrow's file systems cannot do. Folders (Cloud Storage has
# none to make); a local file replaced whole (pyarrow writes in place; a Cloud Storage upload
# appears whole anyway); a hard link. (The claims' conditional writes are atomic_files'.)


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
        files, inner = filesystem.of(path)
        named(path, lambda: _upload(files, inner, content))
        return
    with named_problems(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(content)
            os.replace(tmp, path)
        except BaseException:
            os.remove(tmp)
            raise


def _upload(files: pafs.FileSystem, path: str, content: bytes) -> None:
    """One upload: the object appears, whole, when the stream is closed (below 8 MiB, its one request)."""
    with files.open_output_stream(path, metadata={}) as stream:
        stream.write(content)


def share(source: str, dest: str) -> None:
    """Put the file at `source` at `dest` too, without writing its bytes again: a hard link
    locally (a copy where links are refused), a server-side copy on Cloud Storage."""
    if is_gcs(source):
        files, inner = filesystem.of(source)
        named(dest, lambda: files.copy_file(inner, filesystem.of(dest)[1]))
        return
    with named_problems(dest):
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        try:
            os.link(source, dest)
        except OSError:
            shutil.copyfile(source, dest)
