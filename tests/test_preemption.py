"""Training that loses a worker node (with or without a drain notice first), its driver, or
capacity for good, on a real multi-node Ray cluster on this machine (scripts/local_cluster.sh:
a head and two 1-CPU worker nodes).

Each fault comes while the training is held at a step (tests/holds.py), so it certainly comes
during training however fast the machine is; each test starts on two live worker nodes, whatever
the one before it left (conftest.cluster)."""

import contextlib
import csv
import json
import math
import os
import re
import signal
import time
from pathlib import Path

import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from qml_ray import datasets, storage
from qml_ray.runtime import ENDED

from conftest import SMOKE, command_line, proc_stat, ray_cli, running_commands, session_processes, submit, wait_for
from holds import HOLD, HOLD_FILE
from test_your_model import gradients_of

pytestmark = pytest.mark.slow  # a 3-node cluster, nodes killed and replaced

EPOCHS, CHECKPOINT_EVERY = 8, 3
WAIT = 5  # --capacity-timeout of the run whose capacity is lost for good: seconds its replacement is waited for
LOST_AFTER = 4  # the epochs the fixed run trains before its node is lost (a checkpoint at 3)


def train_command(storage: Path, name: str, workers: str = "2", model: tuple = ()) -> tuple:
    """The smoke config, with more epochs, as the RayJob runs it (--resume), held while the test's
    HOLD_FILE exists (tests/holds.py); `model`: the options of a user's model and data instead of the QCNN's."""
    options = ("--workers", workers, "--epochs", EPOCHS, "--checkpoint-every", CHECKPOINT_EVERY, *model, *HOLD)
    return ("qml_ray.train", "--config", SMOKE, *options, "--storage", storage, "--name", name, "--resume")


def history(run: Path) -> list[dict]:
    """The rows of the run's metrics.csv (none before it is written)."""
    try:
        with open(run / "metrics.csv") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


def epochs(run: Path) -> list[int]:
    return [int(row["epoch"]) for row in history(run)]


def wait_for_epoch(run: Path, epoch: int, timeout: float = 300) -> int:
    """Wait until metrics.csv reaches `epoch`; return the last epoch it then holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (done := epochs(run)) and done[-1] >= epoch:
            return done[-1]
        time.sleep(0.2)
    raise AssertionError(f"training did not reach epoch {epoch} within {timeout} s")


def training_worker_nodes(cluster) -> list[tuple[str, int]]:
    """Node ID and raylet PID of the nodes running the two Ray Train workers (a worker process
    is its raylet's child). Just after a node is lost, Ray may still list a worker whose process
    has gone with it: the workers are asked for again until both are their raylets' children."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        nodes = [(actor["node_id"], parent_pid(actor["pid"])) for actor in alive_training_workers(cluster)]
        if len(nodes) == 2 and all(pid and b"raylet" in command_line(pid) for _, pid in nodes):
            return nodes
        time.sleep(1)
    raise AssertionError("the two training workers did not start, as their raylets' children, within 300 s")


def alive_training_workers(cluster) -> list[dict]:
    return cluster.listed("actors", class_name="RayTrainWorker", state="ALIVE")


def wait_until_no_training_workers(cluster) -> None:
    wait_for(lambda: not alive_training_workers(cluster), "no training workers alive", 60)


def training_worker_raylets(cluster) -> list[int]:
    return [raylet for _, raylet in training_worker_nodes(cluster)]


def lose_node(raylet: int) -> None:
    """Lose the node whose raylet is `raylet` as a reclaimed VM is lost: every process of its
    session (its `ray start`, raylet, agents and workers) killed at once. A raylet killed alone
    leaves its workers a moment to train on before they notice."""
    session = int(proc_stat(raylet)[3])
    deadline = time.monotonic() + 10
    while processes := session_processes(session):
        assert time.monotonic() < deadline, f"processes of the lost node left: {processes}"
        for pid in processes:
            with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def parent_pid(pid: int) -> int | None:
    """The parent's PID of process `pid`, or None once it is gone."""
    fields = proc_stat(pid)
    return int(fields[1]) if fields else None


def epochs_by_attempt(logs: str) -> list[list[int]]:
    """The epoch lines in the job's log, per attempt of the worker group (an attempt that
    restores a checkpoint first says so, and which)."""
    attempts = re.split(r"^(?:continuing from the checkpoint of epoch \d+|resuming epoch .*)$", logs, flags=re.M)
    epochs = [[int(epoch) for epoch in re.findall(rf"^epoch (\d+)/{EPOCHS}  loss", part, re.M)] for part in attempts]
    return [attempt for attempt in epochs if attempt]


def follow(cluster, job: str) -> str:
    """The job's log, once it has ended: its own lines only (`ray job logs --follow` adds a failed
    job's status message, which repeats the log's last lines)."""
    wait_for(lambda: cluster.job_status(job) in ENDED, f"job {job} ended", 600)
    return cluster.job_logs(job)


def assert_every_epoch_once(run: Path, last: int = EPOCHS) -> None:
    """metrics.csv and the TensorBoard logs hold each epoch to `last` exactly once, in order."""
    assert epochs(run) == list(range(1, last + 1))
    steps = [
        event.step
        for file in sorted((run / "tensorboard").glob("events.out.tfevents.*"))
        for event in EventFileLoader(str(file)).Load()
        if any(value.tag == "loss" for value in event.summary.value)
    ]
    assert sorted(steps) == list(range(1, last + 1))


def driver_pid(name: str) -> int:
    """The job's driver: the Python process running qml_ray.train for run `name`."""
    for pid, args in running_commands():
        if b"qml_ray.train" in args and name.encode() in args and b"python" in Path(args[0].decode()).name.encode():
            return pid
    raise AssertionError(f"no driver process for run {name}")


def lose_the_driver(cluster, job: str, name: str) -> str:
    """Kill the driver of `job` (training run `name`), as its pod is lost; return the job's log once it
    has failed and Ray has stopped its training workers."""
    os.kill(driver_pid(name), signal.SIGKILL)
    logs = follow(cluster, job)
    assert cluster.job_status(job) == "FAILED"
    wait_until_no_training_workers(cluster)
    return logs


def registered_checkpoints(run: Path) -> list[str]:
    """The folder names of the run's checkpoints that Ray Train's controller has registered (its
    checkpoint_manager_snapshot.json in the run folder): those a restart resumes from. A checkpoint's
    folder is written before its report reaches the controller."""
    try:
        snapshot = json.loads((run / "checkpoint_manager_snapshot.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):  # none yet, or being written
        return []
    return [Path(result["checkpoint_dir_name"]).name for result in snapshot["checkpoint_results"]]


def wait_until_registered(run: Path, epoch: int) -> None:
    """Until Ray Train's controller has registered the periodic checkpoint of `epoch`."""
    name = f"epoch-{epoch:05d}"
    wait_for(lambda: name in registered_checkpoints(run), f"checkpoint {name} registered", 60)


def wait_for_drain_checkpoint(run: Path, timeout: float = 120) -> tuple[int, int]:
    """Wait until the checkpoint a drain notice brings (before the run's first of its own) is
    registered; return its epochs done and steps of the next (0 when the notice came at an epoch's
    last step, whose checkpoint is taken at the epoch's end)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in registered_checkpoints(run):
            found = re.fullmatch(r"epoch-(\d+)(?:-step-(\d+))?", name)
            if found and int(found.group(1)) < EPOCHS:
                return int(found.group(1)), int(found.group(2) or 0)
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint of the drain registered after {timeout} s")


def test_an_elastic_run_goes_on_at_once_without_a_lost_node_and_grows_back_when_one_returns(cluster, tmp_path):
    """One elastic run (--workers 1-2) of a model and data of the user's own (the classifier example), not
    the QCNN, loses a worker node after a drain notice (GKE's for a spot VM): it is checkpointed at the step
    it was held at and, with no node added, goes on from the next on the one worker left. A node joins
    again: it grows back to 2 workers from its latest checkpoint (every epoch's, while short of workers).
    Then its driver dies: the same command again, as a RayJob's retry runs it, resumes it from its last
    checkpoint and trains to the end. (A loss without notice, elastic: bench elastic; fixed: the test below.)"""
    from examples import hea_classifier

    run, hold = tmp_path / "elastic", tmp_path / HOLD_FILE
    hea_classifier.make_data(str(tmp_path / "data"))
    model = ("--model", "examples.hea_classifier:classifier", "--data", tmp_path / "data", "--batch-size", 16)
    hold.write_text("2")
    command = train_command(tmp_path, "elastic", "1-2", model)
    job = submit(cluster.url, cluster.env, *command, wait=False)
    node, raylet = training_worker_nodes(cluster)[0]
    wait_for_epoch(run, 2)  # held at epoch 3's first step, which the drain lets run; then held again
    drain(cluster, node)
    epoch, step = wait_for_drain_checkpoint(run)
    lose_node(raylet)  # the reclaim, a little early
    lost_at = time.time()
    hold.write_text("4")  # on the worker left, on to epoch 4, checkpointed as every epoch is while short
    wait_for_epoch(run, 4)
    wait_until_registered(run, 4)
    cluster.script("add", "1")  # a node returns, as GKE brings a new spot node
    wait_for(lambda: "back to 2 workers" in cluster.job_logs(job), "the run grown back to 2 workers", 120)
    hold.write_text("6")  # on 2 workers to epoch 6, checkpointed (every 3rd epoch's, on all its workers)
    wait_for_epoch(run, 6)
    wait_until_registered(run, 6)
    logs = lose_the_driver(cluster, job, "elastic")
    hold.unlink()
    rerun = submit(cluster.url, cluster.env, *command, wait=False)
    logs += follow(cluster, rerun)
    assert cluster.job_status(rerun) == "SUCCEEDED", logs[-3000:]
    assert (epoch, step) == (2, 1)  # the step it was held at
    statuses = assert_went_on_and_grew_back(cluster, run, logs, epoch, step)
    history_rows = history(run)  # the user's model learnt, with its own metrics
    assert float(history_rows[-1]["loss"]) < float(history_rows[0]["loss"]) and "val_accuracy" in history_rows[0]
    assert gradients_of(run) == [("pqc", "BlockAdjoint")]
    resumed_after = float(history_rows[epoch]["finished_at"]) - lost_at  # the drained epoch's rest, on one worker
    print(f"\nstatuses {statuses}; node lost, the drained epoch's rest done on one worker {resumed_after:.1f} s later")


def assert_went_on_and_grew_back(cluster, run: Path, logs: str, epoch: int, step: int) -> list[str]:
    """The elastic run resumed from the drained step on one worker, grew back to 2, and trained every step
    once; its attempts' statuses in the dashboard's Train view."""
    rows = datasets.read_manifest(str(run))["rows"]["train"]
    steps = math.ceil(rows // 2 / 16)  # per epoch, 2 workers of 16 a batch, as 1 of 32
    assert steps == math.ceil(rows / 32)
    assert f"resuming epoch {epoch + 1} at step {step + 1} of {steps} (a node drained)" in logs, logs[-3000:]
    assert epochs_by_attempt(logs) == [[1, 2], [3, 4], [5, 6], [7, 8]], logs[-3000:]
    said = [line for line in logs.splitlines() if re.match(r"(continuing on|back to) ", line)]
    assert said == ["continuing on 1 of 2 workers (a node was lost)", "back to 2 workers"], logs[-3000:]
    assert "(raylet)" not in logs, logs[-3000:]  # Ray's messages of the lost node stay in its log files
    assert_every_epoch_once(run)
    assert [int(row["workers"]) for row in history(run)] == [2, 2, 1, 1, 2, 2, 2, 2]
    assert re.search(r"^epoch 4/8  loss .* on 1 workers$", logs, re.M), logs[-3000:]
    # Adam counts the steps it took. Restored from each checkpoint, it ends at exactly one count per
    # step of the run: neither the restarts nor the worker counts repeated or skipped a step.
    weights = tf.train.load_checkpoint(str(run / "weights" / storage.WEIGHTS_PREFIX))
    assert weights.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE") == EPOCHS * steps
    # The dashboard's Train view: the lost driver's run, and the rerun's, finished in one attempt.
    runs = [train_run for train_run in cluster.train_runs() if train_run["name"] == "elastic"]
    lost, rerun = sorted(runs, key=lambda train_run: train_run["start_time_ns"])
    statuses = [attempt["status"] for attempt in lost["attempts"]]
    assert len(statuses) == 3 and rerun["status"] == "FINISHED" and len(rerun["attempts"]) == 1, (statuses, rerun)
    return statuses


def drain(cluster, node: str) -> None:
    """Tell Ray that `node` is to be preempted in 30 s (GKE's notice for a spot VM)."""
    ray_cli(
        cluster.env,
        *("drain-node", "--address", f"127.0.0.1:{cluster.env['RAY_PORT']}", "--node-id", node),
        *("--reason", "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "spot VM reclaimed"),
        *("--deadline-remaining-seconds", 30),
    )


def test_a_fixed_run_that_loses_a_node_for_good_fails_clearly_after_its_capacity_timeout(cluster, tmp_path):
    """A fixed run (--resume of a run not there yet starts it) loses a worker node for good: after
    --capacity-timeout, the job fails with one line that says why and how to continue. (A driver lost and
    the command run again, resuming from the last checkpoint: the elastic run above.)"""
    run, hold = tmp_path / "capacity-lost", tmp_path / HOLD_FILE
    command = (*train_command(tmp_path, "capacity-lost"), "--capacity-timeout", WAIT)
    hold.write_text(str(LOST_AFTER))
    job = submit(cluster.url, cluster.env, *command, wait=False)
    raylet = training_worker_raylets(cluster)[0]
    wait_for_epoch(run, LOST_AFTER)
    lose_node(raylet)  # and no replacement comes
    killed = time.monotonic()
    hold.unlink()
    logs = follow(cluster, job)
    waited = time.monotonic() - killed

    assert "yet: starting it" in logs, logs[-3000:]
    assert epochs_by_attempt(logs) == [list(range(1, LOST_AFTER + 1))], logs[-3000:]  # no restart: no capacity came
    assert_every_epoch_once(run, LOST_AFTER)
    assert cluster.job_status(job) == "FAILED"
    assert f"error: training failed: the cluster could not place all 2 workers (1 CPU(s) each) within {WAIT} s" in logs
    assert "continue with --name capacity-lost --resume" in logs
    assert WAIT <= waited < WAIT + 300, waited  # the wait asked for, plus detecting the loss and stopping
    print(f"\ncapacity lost for good: the job failed {waited:.0f} s after the node's raylet was killed")
