"""The project's fault battery: what goes wrong in a user's first week, with real processes, real
signals and real servers. Each command starts in a process group of its own, as a terminal starts
it, and its training is held at a step (tests/holds.py) while the fault comes; every case checks
the exit status, the last line, that no traceback is printed, the time taken, and what is left in
the tree."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from qml_ray import checkpoints, claims, config as config_lib, interrupts, storage
from qml_ray.errors import UsageError

from conftest import ROOT, SMOKE, command_env, require, run_command, running_pids, wait_for
from holds import HOLD, HOLD_FILE, held_marker
from test_bad_input import snapshot
from test_end_to_end import epoch_lines

MARK_ENV = "QML_RAY_TEST_HOLD"  # in a command's environment: marks its processes, and its local Ray's
# Bounds that tell a hang from an exit, however busy the machine (the times taken are printed):
STOP_SECONDS = 60  # a signal stops the command, and every process of it, within this
REFUSE_SECONDS = 120  # a second writer is refused within this (before its Ray starts)
AT_ONCE_SECONDS = 10  # a second Ctrl-C ends the command within this, without its exit handlers


@dataclass
class Ended:
    status: int
    stdout: str
    stderr: str
    seconds: float  # from the fault (or the start) to the command's exit

    @property
    def last_line(self) -> str:
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else ""

    def assert_clean(self, status: int, last_line: str) -> None:
        assert self.status == status, self.stdout[-2000:] + self.stderr[-2000:]
        assert self.last_line.startswith(last_line), self.stderr[-2000:]
        assert "Traceback" not in self.stdout + self.stderr, self.stderr[-3000:]


class Command:
    """`python -m qml_ray.<module> args...` in a process group of its own (a terminal's job)."""

    def __init__(self, module: str, *args, env: dict | None = None):
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", f"qml_ray.{module}", *map(str, args)],
            cwd=ROOT,
            env=env or command_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def signal(self, signum: int) -> None:
        """Send `signum` to the command's process group, as a terminal sends Ctrl-C."""
        self.started = time.monotonic()
        os.killpg(self.process.pid, signum)

    def end(self, timeout: float = 300) -> Ended:
        stdout, stderr = self.process.communicate(timeout=timeout)
        return Ended(self.process.returncode, stdout, stderr, time.monotonic() - self.started)


def held(hold: Path, epochs: int = 1, **env: str) -> dict:
    """A command's environment whose training (given HOLD; `hold` is the test's HOLD_FILE) waits after
    `epochs` epochs while `hold` exists. MARK_ENV names `hold` in it, which marks the command's
    processes, and its local Ray's."""
    hold.write_text(str(epochs))
    return command_env(**{MARK_ENV: str(hold)}, **env)


def held_now(hold: Path):
    """Whether the training waits at a step (tests/holds.py says so)."""
    return held_marker(hold).exists


def held_run(run: Path, hold: Path) -> Path:
    """The QCNN run `run`, its model now holds.held_qcnn: the same QCNN, whose inference waits while
    `hold` (written by `held`) exists."""
    config = config_lib.of_run(str(run)).replace(model="tests.holds:held_qcnn", params={"hold": str(hold)})
    storage.write_text(storage.join(str(run), storage.CONFIG), config.to_yaml())
    return run


def processes_holding(hold: Path) -> list[int]:
    """The processes (the command, its Ray's workers) whose environment names the hold file."""
    marker = f"{MARK_ENV}={hold}".encode()
    found = []
    for pid in running_pids():
        try:
            if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(pid)
        except OSError:
            continue
    return found


def epochs_done(run: str) -> int:
    try:
        return len(storage.read_text(storage.join(run, storage.HISTORY)).strip().splitlines()) - 1
    except FileNotFoundError:
        return 0


def contents(folder: Path) -> dict:
    """The files below `folder` with their sizes and times, and its folders, but any claim: what a
    command that claims a run (creating and deleting its claim) may not change."""
    return {
        path: (path.stat().st_size, path.stat().st_mtime_ns) if path.is_file() else "folder"
        for path in folder.rglob("*")
        if path.name != claims.CLAIM
    }


# Signals: SIGTERM (as `kill` and Kubernetes send it) to a training, Ctrl-C to an inference; Ctrl-C to
# a training comes in the two-commands test below, to a sweep (and its resume) in test_sweep.

ONE_WORKER = ("--workers", 1)  # a held training's options: how many workers does not matter here


def interrupt(command: Command, signum: int, hold: Path, what: str) -> Ended:
    """Send `signum` to the held command's process group; how it ended, once its every process (its
    local Ray's too, if it started one) is gone, which must be within STOP_SECONDS of the signal. Prints
    the times. (What an attached command ran on the shared cluster must be gone after the test: shared_ray.)"""
    command.signal(signum)
    ended = command.end()
    wait_for(lambda: not processes_holding(hold), "every process of the command gone", STOP_SECONDS)
    stopped = time.monotonic() - command.started
    assert ended.seconds < STOP_SECONDS and stopped < STOP_SECONDS, (ended.seconds, stopped)
    name = signal.Signals(signum).name
    exited, gone = f"{ended.seconds:.1f}", f"{stopped:.1f}"
    print(f"\n{what}, {name}: the command exited after {exited} s, its processes were gone after {gone} s")
    return ended


@pytest.mark.slow  # a training
def test_sigterm_stops_training_at_once_and_says_how_to_continue(tmp_path):
    runs, hold = tmp_path / "runs", tmp_path / HOLD_FILE
    options = (*ONE_WORKER, *HOLD, "--storage", runs, "--name", "r")
    command = Command("train", "--config", SMOKE, *options, env=held(hold))
    wait_for(held_now(hold), "training held at epoch 2's first step")
    ended = interrupt(command, signal.SIGTERM, hold, "train")

    ended.assert_clean(128 + signal.SIGTERM, "interrupted: continue with --name r --resume")
    # SIGTERM reaches the local Ray too, and Ray Train may take its raylet's stop for a drain and
    # checkpoint on the way out; whatever was written is whole or recognisably not.
    assert not list(runs.rglob(".tmp-*")) and not (runs / "r" / storage.WEIGHTS).exists()
    assert not (runs / "r" / claims.CLAIM).exists()


def test_ctrl_c_stops_inference_at_once_leaving_no_predictions(run_copy, tmp_path, shared_ray):
    hold = tmp_path / "hold"
    command = Command("infer", "--run", held_run(run_copy, hold), "--address", shared_ray, env=held(hold))
    wait_for(held_now(hold), "inference held at its first batch")
    before = contents(run_copy)
    ended = interrupt(command, signal.SIGINT, hold, "infer")

    ended.assert_clean(128 + signal.SIGINT, "interrupted: no predictions were completed; run the command again")
    assert contents(run_copy) == before and not (run_copy / storage.PREDICTIONS).exists()


def test_a_second_ctrl_c_exits_at_once(tmp_path, shared_ray):
    """Two Ctrl-Cs while the command waits for the cluster to grow (its exit handlers would withdraw
    its request to the autoscaler; the cluster has none to act on it)."""
    options = ("--workers", 64, "--capacity-timeout", 300, "--storage", tmp_path, "--name", "r")
    options += ("--address", shared_ray)
    command = Command("train", "--config", SMOKE, *options)
    assert "waiting for the cluster to grow" in command.process.stdout.readline()
    command.signal(signal.SIGINT)
    time.sleep(0.1)
    command.signal(signal.SIGINT)
    ended = command.end()
    assert ended.status == 130 and "Traceback" not in ended.stdout + ended.stderr, ended.stderr[-3000:]
    assert ended.seconds < AT_ONCE_SECONDS, ended.seconds  # from the second
    print(f"\ntwo Ctrl-Cs: the command exited {ended.seconds:.2f} s after the second")


def test_the_reaper_kills_what_outlives_sigterm():
    """An interrupted command leaves the processes it started to a reaper (`interrupts.stop`): SIGTERM, then
    SIGKILL for any still running TERM_SECONDS later (here one that ignores SIGTERM)."""

    def sleeper(ignore_sigterm: bool) -> subprocess.Popen:
        handler = "signal.signal(signal.SIGTERM, signal.SIG_IGN)" if ignore_sigterm else "None"
        code = f"import signal, time; {handler}; print(flush=True); time.sleep(120)"
        process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        process.stdout.readline()  # its handler is in place
        return process

    stubborn, polite = sleeper(ignore_sigterm=True), sleeper(ignore_sigterm=False)
    try:
        interrupts.stop([stubborn.pid, polite.pid])
        assert stubborn.wait(timeout=10) == -signal.SIGKILL
        assert polite.poll() is not None  # ended by SIGTERM (the reaper waited for it, so its status is gone)
    finally:
        stubborn.kill()  # (if the test failed)
        polite.kill()


# One run, one writer


def two_at_once(runs: str, *options, env: dict | None = None) -> tuple[Command, Ended]:
    """Start two `train --storage RUNS --name r OPTIONS` at the same moment; return the one still
    running and how the other ended."""
    first, second = (Command("train", "--storage", runs, "--name", "r", *options, env=env) for _ in range(2))
    wait_for(lambda: first.process.poll() is not None or second.process.poll() is not None, "one refused")
    loser, winner = (first, second) if first.process.poll() is not None else (second, first)
    refused = loser.end()
    refused.assert_clean(2, f"error: run {runs}/r is in use by another command (process {winner.process.pid} on ")
    assert refused.seconds < REFUSE_SECONDS, refused.seconds
    return winner, refused


@pytest.mark.slow  # a training
def test_two_commands_on_one_run_one_is_refused_and_so_is_a_resume_while_it_trains(tmp_path, in_process, shared_ray):
    """Then Ctrl-C stops the training at once, and nothing is written after the refusals either."""
    runs, hold = tmp_path / "runs", tmp_path / HOLD_FILE
    options = ("--config", SMOKE, *ONE_WORKER, *HOLD, "--address", shared_ray)
    winner, refused = two_at_once(str(runs), *options, env=held(hold))
    wait_for(held_now(hold), "the winner's training held")
    before = contents(runs)
    started = time.monotonic()
    done = in_process("train", "--storage", runs, "--name", "r", "--resume")  # refused before Ray starts
    resumed = Ended(done.returncode, done.stdout, done.stderr, time.monotonic() - started)
    resumed.assert_clean(2, f"error: run {runs / 'r'} is in use by another command")
    interrupt(winner, signal.SIGINT, hold, "train").assert_clean(130, "interrupted: continue with --name r --resume")
    assert contents(runs) == before  # the training, held, wrote nothing more
    assert not list(runs.rglob(".tmp-*")) and not (runs / "r" / claims.CLAIM).exists()
    print(f"\nsecond writer refused after {refused.seconds:.1f} s, --resume meanwhile after {resumed.seconds:.1f} s")


def test_a_claim_left_by_a_killed_command_is_taken_over(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    folder = tmp_path / "run"
    folder.mkdir()
    claim = folder / claims.CLAIM
    claim.write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "since": time.time()}))
    with claims.claimed(str(folder), "run"):  # same host, process gone: stale at once
        assert json.loads(claim.read_text())["pid"] == os.getpid()
    assert not claim.exists()

    claim.write_text(json.dumps({"host": "elsewhere", "pid": 1, "since": time.time()}))
    with (
        pytest.raises(UsageError, match="in use by another command \\(process 1 on elsewhere"),
        claims.claimed(str(folder), "run"),
    ):
        pass
    old = time.time() - claims.LEASE_SECONDS - 1
    os.utime(claim, (old, old))  # its command has not renewed it for longer than the lease
    with claims.claimed(str(folder), "run"):
        pass
    assert list(folder.iterdir()) == []


# A full disk


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs, where mounting is permitted (root with the right to mount); elsewhere the test
    is skipped, saying why, or fails with QML_RAY_NO_SKIP=1 (CI)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", disk], capture_output=True, text=True)
    require(
        mounted.returncode == 0,
        f"a full disk needs a small tmpfs, and mounting one is not permitted here: {mounted.stderr.strip()}",
    )
    try:
        yield disk
    finally:
        subprocess.run(["umount", "--lazy", disk], check=True)


def fill(disk: Path) -> None:
    """Write to `disk` until it is full."""
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 2**16)
                f.flush()
        except OSError:
            pass


@pytest.mark.slow  # a training
def test_a_full_disk_stops_training_at_once_naming_it(small_disk, tmp_path, shared_ray):
    hold = tmp_path / HOLD_FILE
    options = (*ONE_WORKER, "--max-failures", 3, "--storage", small_disk, "--name", "r", "--address", shared_ray)
    command = Command("train", "--config", SMOKE, *options, *HOLD, env=held(hold))
    wait_for(held_now(hold), "training held at epoch 2's first step")
    fill(small_disk)
    before = contents(small_disk / "r")
    hold.unlink()  # epoch 2 ends, and its metrics.csv cannot be written
    command.started = time.monotonic()
    ended = command.end()
    ended.assert_clean(1, f"error: storage full: {small_disk / 'r'}")
    assert ended.seconds < STOP_SECONDS, ended.seconds  # not after Ray Train's 3 restarts
    assert "--resume" not in ended.last_line
    assert contents(small_disk / "r") == before
    print(f"\nfull disk: the command stopped {ended.seconds:.1f} s after training met it")


# Names


@pytest.fixture(scope="module")
def named_run(tmp_path_factory, shared_cluster) -> Path:
    """A smoke run of 4 epochs (checkpoints after 2 and 4) named in Chinese."""
    storage_folder = tmp_path_factory.mktemp("named")
    options = (*ONE_WORKER, "--epochs", 4, "--checkpoint-every", 2, "--storage", storage_folder, "--name", "测试-run")
    options += ("--address", shared_cluster.address)
    done = run_command("train", "--config", SMOKE, *options)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stdout + done.stderr
    return storage_folder / "测试-run"


def test_a_name_of_any_script_trains(named_run):
    assert (named_run / storage.WEIGHTS / storage.COMPLETE).is_file()
    assert epochs_done(str(named_run)) == 4
    assert list((named_run / storage.TENSORBOARD).glob("events.out.tfevents.*"))
    assert not (named_run / claims.CLAIM).exists()


# Damaged checkpoints


def truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


DAMAGES = {  # each way a checkpoint is found damaged, and the reason given
    "truncated": (lambda folder: truncate(folder / "model.index"), "model.index has"),
    "missing-file": (lambda folder: (folder / storage.STATE_FILE).unlink(), "state.json is missing"),
    "missing-manifest": (lambda folder: (folder / checkpoints.MANIFEST).unlink(), "no manifest.json"),
}


@pytest.fixture
def run_copy(named_run, tmp_path) -> Path:
    return Path(shutil.copytree(named_run, tmp_path / named_run.name))


def test_resume_skips_a_damaged_newest_checkpoint_and_continues_the_epoch_counter(run_copy, shared_ray):
    """--resume to more epochs, its newest checkpoint damaged: it goes on from the one before, and
    with --verbose the workers' logs (Ray's) are shown too."""
    before = pd.read_csv(run_copy / storage.HISTORY)
    truncate(run_copy / "checkpoints" / "epoch-00004" / "model.data-00000-of-00001")
    resume = ("--name", run_copy.name, "--resume", "--epochs", 6, "--verbose", "--address", shared_ray)
    done = run_command("train", "--storage", run_copy.parent, *resume)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"skipping the damaged checkpoint {run_copy}/checkpoints/epoch-00004: model.data" in done.stdout
    assert "continuing from the checkpoint of epoch 2\n" in done.stdout
    assert epoch_lines(done.stdout + done.stderr) == [(epoch, 6) for epoch in range(3, 7)]
    assert "(RayTrainWorker pid=" in done.stdout + done.stderr

    after = pd.read_csv(run_copy / storage.HISTORY)
    assert after["epoch"].tolist() == list(range(1, 7))
    pd.testing.assert_frame_equal(after.iloc[:2], before.iloc[:2])
    assert config_lib.of_run(str(run_copy)).epochs == 6


@pytest.mark.parametrize("damage", DAMAGES)
def test_resume_with_no_whole_checkpoint_changes_nothing(run_copy, damage):
    spoil, reason = DAMAGES[damage]
    for folder in (run_copy / "checkpoints").iterdir():
        spoil(folder)
    before = contents(run_copy)
    started = time.monotonic()
    done = run_command("train", "--storage", run_copy.parent, "--name", run_copy.name, "--resume", "--epochs", 6)
    ended = Ended(done.returncode, done.stdout, done.stderr, time.monotonic() - started)
    ended.assert_clean(1, f"error: no whole checkpoint to resume from: {run_copy}/checkpoints/epoch-00004 is damaged")
    assert reason in ended.last_line and ended.seconds < 60
    assert contents(run_copy) == before and not (run_copy / claims.CLAIM).exists()


# Config files

# Runs a command and prints its peak memory (KiB). The command must be started by a small process:
# Linux carries a process's peak memory across exec, so a child started straight from this test
# process (TensorFlow loaded) would report this process's peak instead of its own.
PEAK_MEMORY = (
    "import resource, subprocess, sys; status = subprocess.call(sys.argv[1:]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(status)"
)


@pytest.mark.parametrize(
    "content, message",
    [
        (
            "a: &a [x, x, x, x, x, x, x, x, x]\n"
            + "".join(f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))
            + "qubits: [*i, *i, *i, *i, *i, *i, *i, *i, *i]\n",
            "holds more than 10000 values once its aliases are expanded",
        ),
        ("[" * 100_000 + "]" * 100_000, "nests its values too deeply"),
        ("# padding\n" * 200_000, "is larger than 1 MiB"),
    ],
    ids=["alias-bomb", "deeply-nested", "huge"],
)
def test_a_hostile_config_file_is_refused_at_once_in_little_memory(tmp_path, content, message):
    config = tmp_path / "config.yaml"
    config.write_text(content)
    before = snapshot(tmp_path)
    started = time.monotonic()
    command = [sys.executable, "-m", "qml_ray.train", "--config", config, "--storage", tmp_path / "runs"]
    done = subprocess.run(
        [sys.executable, "-c", PEAK_MEMORY, *command],
        cwd=ROOT,
        env=command_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    ended = Ended(done.returncode, "", done.stderr, time.monotonic() - started)
    ended.assert_clean(2, "error: ")
    assert message in ended.last_line and len(ended.last_line) <= 600
    peak = int(done.stdout.split()[-1])  # KiB
    assert ended.seconds < 60 and peak < 1 << 20, (ended.seconds, peak)  # under 1 GiB
    assert snapshot(tmp_path) == before
