"""Checkpoints that can be trusted: each one lists its files and their sizes, so a damaged one is known.

A checkpoint folder (checkpoints/epoch-NNNNN[-step-SSSSS]/) holds MANIFEST, the size of every other
file in it, written with them before Ray Train uploads the folder. A checkpoint is whole when its
manifest is there and every file it lists is there with its size: a crash during an upload, a bad
copy or a truncated file all show. Training resumes from the newest whole checkpoint; the damaged
ones after it are skipped, each named in one line.
"""

import json
import os
import posixpath

import pyarrow.fs as pafs
import ray.train

from qml_ray import storage
from qml_ray.errors import EnvironmentProblem

MANIFEST = "manifest.json"


def write_manifest(folder: str) -> None:
    """List the files below the local checkpoint `folder`, with their sizes, in its MANIFEST."""
    sizes = {name: os.path.getsize(os.path.join(folder, name)) for name in storage.list_files(folder)}
    with open(os.path.join(folder, MANIFEST), "w") as f:
        json.dump(sizes, f)


def damage(filesystem: pafs.FileSystem, path: str) -> str | None:
    """What is wrong with the checkpoint at `path` in `filesystem`, or None when it is whole."""
    found = {
        posixpath.relpath(info.path, path): info.size
        for info in filesystem.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
        if info.type == pafs.FileType.File
    }
    if MANIFEST not in found:
        return f"no {MANIFEST}: it was not written whole"
    with filesystem.open_input_stream(posixpath.join(path, MANIFEST)) as f:
        try:
            expected = json.loads(f.read())
        except ValueError:
            return f"its {MANIFEST} is damaged"
    for name, size in sorted(expected.items()):
        if name not in found:
            return f"{name} is missing"
        if found[name] != size:
            return f"{name} has {found[name]} bytes, not {size}"
    return None


def newest_whole(run: str, say=None) -> str | None:
    """The folder name (checkpoints/...) of the run's newest whole checkpoint; each newer damaged one
    is told to `say`, if given. None when the run has no checkpoint; an EnvironmentProblem naming the
    newest when none is whole."""
    filesystem, path = storage.pyarrow_filesystem(run)
    return _newest_whole(filesystem or pafs.LocalFileSystem(), path, run, say=say)


def whole(checkpoint: ray.train.Checkpoint) -> ray.train.Checkpoint:
    """`checkpoint` (Ray Train's latest), or the newest whole one before it when it is damaged."""
    folder = checkpoint.path.rstrip("/")
    run = posixpath.dirname(posixpath.dirname(folder))
    name = posixpath.relpath(folder, run)
    chosen = _newest_whole(checkpoint.filesystem, run, run, until=name)
    return checkpoint if chosen == name else ray.train.Checkpoint(posixpath.join(run, chosen), checkpoint.filesystem)


def _newest_whole(filesystem: pafs.FileSystem, path: str, run: str, until: str | None = None, say=None):
    """newest_whole for the run at `path` in `filesystem` (`run` names it), no newer than `until`."""
    folder = posixpath.join(path, storage.CHECKPOINTS)
    files = filesystem.get_file_info(pafs.FileSelector(folder, recursive=True, allow_not_found=True))
    # The folders that hold files (Cloud Storage has no folders of its own), newest first.
    relative = [posixpath.relpath(info.path, folder) for info in files if info.type == pafs.FileType.File]
    names = sorted({f"{storage.CHECKPOINTS}/{name.split('/')[0]}" for name in relative if "/" in name}, reverse=True)
    names = [name for name in names if until is None or name <= until]
    for name in names:
        problem = damage(filesystem, posixpath.join(path, name))
        if problem is None:
            return name
        if say:
            say(f"skipping the damaged checkpoint {storage.join(run, name)}: {problem}")
    if names:
        raise EnvironmentProblem(
            f"no whole checkpoint to resume from: {storage.join(run, names[0])} is damaged "
            f"({damage(filesystem, posixpath.join(path, names[0]))}), and so is every older one"
        )
    return None
