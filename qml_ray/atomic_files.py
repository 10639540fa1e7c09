"""What a claim (`claims`) needs beyond whole-file reads and writes: a file created atomically unless one is
there, a file's version, and a delete of one version. Locally an exclusive create and an atomic rename; on
Cloud Storage its own client's preconditions (`if_generation_match`), which pyarrow's GcsFileSystem lacks."""

import contextlib
import os

from qml_ray import filesystem
from qml_ray.storage_errors import named_problems


def create_exclusive(path: str, content: bytes) -> bool:
    """Create the file at `path` holding `content`, atomically, unless a file is there: whether it
    was created (locally an exclusive create, on Cloud Storage `if_generation_match=0`)."""
    if filesystem.is_gcs(path):
        from google.api_core.exceptions import PreconditionFailed

        def upload():
            filesystem.blob(path).upload_from_string(content, if_generation_match=0, **filesystem.limits())

        try:
            filesystem.call(upload, path)
        except PreconditionFailed:
            return False
        return True
    with named_problems(path):
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
    if filesystem.is_gcs(path):
        blob = filesystem.blob(path)
        if not filesystem.call(lambda: blob.exists(**filesystem.limits()), path):
            return None
        filesystem.call(lambda: blob.reload(**filesystem.limits()), path)
        return (blob.generation, blob.metageneration), blob.updated.timestamp()
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return (stat.st_ino, stat.st_mtime_ns), stat.st_mtime


def remove_if_unchanged(path: str, expected: tuple) -> bool:
    """Delete the file at `path` if its `version` is still `expected`: whether it was deleted."""
    if filesystem.is_gcs(path):
        return _remove_gcs_generation(path, *expected)
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


def _remove_gcs_generation(path: str, generation: int, metageneration: int) -> bool:
    from google.api_core.exceptions import NotFound, PreconditionFailed

    def delete():
        conditions = {"if_generation_match": generation, "if_metageneration_match": metageneration}
        filesystem.blob(path).delete(**conditions, **filesystem.limits())

    try:
        filesystem.call(delete, path)
    except (PreconditionFailed, NotFound, FileNotFoundError):
        return False
    return True
