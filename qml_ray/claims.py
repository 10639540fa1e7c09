"""One run, one writer: a command claims its run (or sweep) folder before it writes anything there.

The claim is a file, <folder>/_CLAIM, created atomically where none is (atomic_files.create_exclusive:
an exclusive create locally, `if_generation_match=0` on Cloud Storage), naming the command's host
and process. The command rewrites it every RENEW_SECONDS while it runs and deletes it when it ends,
however it ends short of being killed. A claim left by a killed command is stale once its process
is gone (seen from its host) or, from another host, once it has gone LEASE_SECONDS without renewal;
the next command then takes it over.
"""

import contextlib
import json
import os
import socket
import threading
import time

from qml_ray import atomic_files, storage
from qml_ray.errors import UsageError

CLAIM = "_CLAIM"
RENEW_SECONDS = 10
LEASE_SECONDS = 60


@contextlib.contextmanager
def claimed(folder: str, what: str):
    """Hold the claim on `folder` (a run or sweep, as `what` says) while the block runs, which is
    given whether the folder was there before; a UsageError naming the holder when another live
    command holds it."""
    path = storage.join(folder, CLAIM)
    mine = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}).encode()
    created = storage.missing_folders(folder)
    found = storage.exists(folder)
    try:
        storage.make_folder(folder)
        while not atomic_files.create_exclusive(path, mine):
            _take_over_if_stale(path, folder, what)
        stop = threading.Event()
        threading.Thread(target=_renew, args=(path, mine, stop), daemon=True).start()
        try:
            yield found
        finally:
            stop.set()
            _release(path, mine)
    finally:
        storage.remove_empty_folders(created)  # a command that wrote nothing leaves nothing


def _release(path: str, mine: bytes) -> None:
    found = atomic_files.version(path)
    if found and storage.read_bytes(path) == mine:
        atomic_files.remove_if_unchanged(path, found[0])


def require_free(folder: str, what: str) -> None:
    """A UsageError naming the command that holds the claim on `folder`, if a live one does (a look
    only: `claimed` takes the claim)."""
    path = storage.join(folder, CLAIM)
    if found := atomic_files.version(path):
        _refuse_if_alive(path, folder, what, found[1])


def _take_over_if_stale(path: str, folder: str, what: str) -> None:
    """Delete the claim at `path` if its command is gone, else raise a UsageError naming that command."""
    found = atomic_files.version(path)
    if found is None:  # released meanwhile
        return
    _refuse_if_alive(path, folder, what, found[1])
    atomic_files.remove_if_unchanged(path, found[0])


def _refuse_if_alive(path: str, folder: str, what: str, renewed: float) -> None:
    try:
        holder = json.loads(storage.read_bytes(path))
    except (FileNotFoundError, ValueError):  # released meanwhile, or cut short by a crash
        holder = {}
    if _alive(holder, renewed):
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["since"]))
        raise UsageError(
            f"{what} {folder} is in use by another command (process {holder['pid']} on {holder['host']}, "
            f"since {since}): wait for it to end, or stop it"
        )


def _alive(holder: dict, renewed: float) -> bool:
    """Whether the command that wrote a claim, last renewed at `renewed`, may still run: on this
    host, whether its process runs; from another, whether it renewed the claim within the lease."""
    if not {"host", "pid", "since"} <= holder.keys():
        return False
    if holder["host"] != socket.gethostname():
        return time.time() - renewed <= LEASE_SECONDS
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _renew(path: str, mine: bytes, stop: threading.Event) -> None:
    """Rewrite the claim every RENEW_SECONDS while it is this command's, until `stop`."""
    while not stop.wait(RENEW_SECONDS):
        with contextlib.suppress(Exception):  # a renewal missed is retried; the lease outlasts several
            if storage.read_bytes(path) == mine:
                storage.write_bytes(path, mine)
