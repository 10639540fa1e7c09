"""Where runs live. Every artifact of a run is read and written through these functions.

Writes are atomic: a file or folder appears whole under its final name or not at all,
so a crash never leaves half-written weights, config or data behind.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# The run folder, <storage>/<name>/, holds these (see the README):
CONFIG = "config.yaml"  # the resolved config
DATA = "data"  # train.parquet and test.parquet
CHECKPOINTS = "checkpoints"  # Ray Train checkpoints, one folder per checkpointed epoch
WEIGHTS = "weights"  # the final weights, published when training ends
HISTORY = "metrics.csv"  # one row per epoch
TENSORBOARD = "tensorboard"  # per-epoch scalars and the readout histogram
PREDICTIONS = "predictions"  # one folder of Parquet per inference run


def run_dir(storage: str, name: str) -> str:
    """The absolute location of run `name` under `storage`."""
    return os.path.abspath(os.path.join(storage, name))


def split_path(run: str, split: str) -> str:
    """The Parquet file of a data split ("train" or "test") of a run."""
    return join(run, DATA, f"{split}.parquet")


def join(base: str, *parts: str) -> str:
    return os.path.join(base, *parts)


def exists(path: str) -> bool:
    return os.path.exists(path)


def make_dirs(path: str) -> None:
    os.makedirs(path, exist_ok=True)


def read_text(path: str) -> str:
    return Path(path).read_text()


def write_text(path: str, text: str) -> None:
    with _atomic_file(path) as tmp:
        Path(tmp).write_text(text)


def read_parquet(path: str) -> pa.Table:
    return pq.read_table(path)


def write_parquet(table: pa.Table, path: str) -> None:
    with _atomic_file(path) as tmp:
        pq.write_table(table, tmp)


def publish_dir(local_dir: str, dest: str) -> None:
    """Copy a folder to `dest`, replacing what was there only once the copy is complete."""
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".staging-", dir=parent)
    shutil.copytree(local_dir, staging, dirs_exist_ok=True)
    if os.path.exists(dest):
        retired = tempfile.mkdtemp(prefix=".retired-", dir=parent)
        os.replace(dest, os.path.join(retired, "old"))
        os.replace(staging, dest)
        shutil.rmtree(retired)
    else:
        os.replace(staging, dest)


def local_dir(path: str) -> str:
    """A local folder holding the contents of `path`."""
    return path


class _atomic_file:
    """Context manager yielding a temporary path that is renamed to `path` on success."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self) -> str:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        fd, self.tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(self.path) or ".")
        os.close(fd)
        return self.tmp

    def __exit__(self, kind, *_):
        if kind is None:
            os.replace(self.tmp, self.path)
        elif os.path.exists(self.tmp):
            os.remove(self.tmp)


def rename(src: str, dest: str) -> None:
    os.replace(src, dest)
