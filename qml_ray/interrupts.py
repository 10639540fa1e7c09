"""Ctrl-C (SIGINT) and SIGTERM (`ray job stop`, a pod's deletion): the command stops at once.

The first signal raises Interrupted in the main thread, wherever it waits. The command then says
how to continue and exits with 128 + the signal's number, after its cleanups (the run's claim
released, the autoscaler's request withdrawn; at most EXIT_SECONDS), asking every process it
started to stop (a local Ray and its workers), killing those still there TERM_SECONDS later; a
second signal exits at once. Ray Train's and Ray Tune's own SIGINT handlers (a graceful abort,
during which the workers train on) never see it: `waited` runs their calls off the main thread,
where they install none.
"""

import contextlib
import os
import signal
import subprocess
import sys
import threading

import psutil

SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_SECONDS = 5  # the longest an interrupted command's cleanups may take
TERM_SECONDS = 2  # then the processes it started have this long to end on SIGTERM before they are killed
_received: list[int] = []
_cleanups: list = []
_waiting: list["_Call"] = []
_abandoned: list["_Call"] = []  # calls `fail` ended while their threads ran on
_next_step = [""]  # what the interrupted command's last line says to do


class Interrupted(BaseException):  # not an Exception: no `except Exception` on the way swallows it
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.status = 128 + signum


def install() -> None:
    """Catch SIGINT and SIGTERM from now on (again after anything that sets handlers of its own, as ray.init)."""
    for signum in SIGNALS:
        signal.signal(signum, _on_signal)


def _on_signal(signum, frame):
    if _received:  # the second: no more waiting
        os._exit(128 + signum)
    _received.append(signum)
    raise Interrupted(signum)


def on_interrupt(cleanup) -> None:
    """Run `cleanup` (once) when the command is interrupted, before it exits."""
    if cleanup not in _cleanups:
        _cleanups.append(cleanup)


def exit_interrupted(status: int) -> None:
    """Exit with `status` now, after the cleanups (at most EXIT_SECONDS), stopping every process the
    command started (`stop`). No other exit handler runs: Ray's would disconnect from Ray while
    a thread still waits on it, and wait for a local Ray to stop (which SIGTERM to the command's process
    group may be stopping already); either way Ray would end the process with status 1 and a line of its
    own. On a cluster, the command's actors go with it."""
    timer = threading.Timer(EXIT_SECONDS, exit_now, (status,))
    timer.daemon = True
    timer.start()
    for cleanup in reversed(_cleanups):
        with contextlib.suppress(Exception):
            cleanup()
    exit_now(status)


def exit_now(status: int) -> None:
    """Hand the processes this one started, and theirs, to a reaper (`stop`, in a process of its own: a
    wait here would let Ray's core worker end this one with status 1 when its raylet goes), then exit
    with `status` at once (no exit handler runs)."""
    started = [process.pid for process in psutil.Process().children(recursive=True)]
    if started:
        reaper = [sys.executable, "-m", "qml_ray.interrupts", *map(str, started)]
        quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        subprocess.Popen(reaper, **quiet, start_new_session=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def stop(pids: list[int]) -> None:
    """Ask the processes `pids` (a local Ray's GCS, raylet, agents and workers) to stop (SIGTERM), and kill
    those still running TERM_SECONDS later (a worker busy in a kernel, on a loaded machine): none outlives
    the command by more."""
    processes = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):  # gone already
            process = psutil.Process(pid)
            process.terminate()
            processes.append(process)
    _, running = psutil.wait_procs(processes, timeout=TERM_SECONDS)
    for process in running:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def say_on_interrupt(next_step: str) -> None:
    """From now on, an interrupted command's last line is 'interrupted: <next_step>'."""
    _next_step[0] = next_step


def last_line() -> str:
    return f"interrupted: {_next_step[0]}" if _next_step[0] else "interrupted"


class _Call:
    def __init__(self):
        self.done, self.result, self.error = threading.Event(), None, None

    def end(self, result=None, error: BaseException | None = None) -> None:
        if not self.done.is_set():
            self.result, self.error = result, error
            self.done.set()


def waited(call, *args, **kwargs):
    """`call(*args, **kwargs)`, run in a thread of its own while the main thread waits for it, so a
    signal interrupts the wait; its result, or its exception (or the one `fail` gave meanwhile)."""
    pending = _Call()

    def run():
        try:
            pending.end(result=call(*args, **kwargs))
        except BaseException as err:  # handed to the waiting thread
            pending.end(error=err)

    _waiting.append(pending)
    threading.Thread(target=run, daemon=True).start()
    try:
        pending.done.wait()
    finally:
        _waiting.remove(pending)
    if pending.error is not None:
        raise pending.error
    return pending.result


def fail(error: BaseException) -> None:
    """End the calls being `waited` for with `error` (from any thread: the console's relay, say).
    Their threads still run: the command must then end as an interrupted one does (`abandoned`)."""
    for pending in list(_waiting):
        _abandoned.append(pending)
        pending.end(error=error)


def abandoned() -> bool:
    """Whether `fail` left a call running (so the command must exit by `exit_interrupted`)."""
    return bool(_abandoned)


if __name__ == "__main__":  # the reaper `exit_now` starts
    stop([int(pid) for pid in sys.argv[1:]])
