"""`ray job submit` of training, inference and a sweep on a real multi-node Ray cluster on this
machine (scripts/local_cluster.sh): a head that runs no work and two worker nodes of one CPU each,
like the RayCluster on GKE; and a shell without the cluster's token, refused in one line."""

import hashlib
import re
import shutil
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from qml_ray import claims, config as config_lib, datasets, storage
from qml_ray.errors import ENVIRONMENT_STATUS
from qml_ray.runtime import ENDED

from conftest import FILES, SMOKE, command_env, ray_cli, run_command, submit
from holds import HOLD, HOLD_FILE, held_marker
from test_bad_input import assert_error, snapshot
from test_your_model import gradients_of

pytestmark = pytest.mark.slow  # a 3-node cluster and its jobs

EPOCHS = 3  # the training is held after the first until its exported epoch gauge is scraped
SEED = 5  # the user's model's run: which rows are held out for validation
TEST_FRACTION = 0.25
GAUGE_SECONDS = 3  # more than Ray keeps a gauge not set again: 2 export intervals of 1 s (conftest.cluster)


def scraped_epoch(cluster, run: str) -> float | None:
    """The run's `epoch` gauge on any node's metrics endpoint (found as Prometheus finds them,
    through the dashboard's service discovery), or None before one exports it."""
    for group in cluster.get("/api/prometheus/sd"):
        for target in group["targets"]:
            with urllib.request.urlopen(f"http://{target}/metrics", timeout=30) as response:
                text = response.read().decode()
            if found := re.search(rf'^ray_qml_ray_epoch{{[^}}]*run="{run}"[^}}]*}} (\S+)$', text, re.M):
                return float(found.group(1))
    return None


def wait_until_held(hold: Path, cluster, job: str) -> None:
    """Until the job's training waits at a step for `hold` to go (tests/holds.py)."""
    deadline = time.monotonic() + 300
    while not held_marker(hold).exists():
        assert time.monotonic() < deadline and cluster.job_status(job) not in ENDED, "the training was never held"
        time.sleep(0.5)


def test_a_users_model_trains_on_shards_as_a_job_is_stopped_resumed_and_inferred(cluster, user_project, tmp_path):
    """The user's module and data are in the job's working folder only: the driver, every worker
    and every Ray Data task find them there; its model's two inputs take the data's columns of their
    names (a circuit, and a command feeding the ControlledPQC through a Dense layer). Streamed by Ray
    Data (as a data set too large to keep would be), each worker trains on a shard of its own, and
    its epoch gauge is exported. Then `ray job stop` (SIGTERM to the job's driver, as a RayJob's
    deletion sends) stops it within seconds, its log ending with how to continue, the run free for
    --resume and nothing in it complete. Run again with --resume and the data kept in memory (a flag
    wins on resume), each worker reads its shard once and trains on it every epoch in another order;
    then the run's held-out rows are inferred."""
    url, env = cluster.url, cluster.env
    hold, run, notes = tmp_path / HOLD_FILE, tmp_path / "mine", tmp_path / "notes"
    hold.write_text("1")
    notes.mkdir()
    options = ("--model", "mymodel:build", "--data", "data", "--workers", 2, "--epochs", EPOCHS, "--batch-size", 8)
    options += ("--seed", SEED, "--test-fraction", TEST_FRACTION, "--param", f"notes={notes}", *HOLD)
    command = ("qml_ray.train", *options, "--storage", tmp_path, "--name", "mine")
    streamed = (*command, "--data-in-memory-mb", 0)
    train = submit(url, env, *streamed, wait=False, working_dir=user_project)
    wait_until_held(hold, cluster, train)  # held in epoch 2: rank 0 set the gauges at epoch 1's end
    time.sleep(GAUGE_SECONDS)  # without a refresh, Ray's agent would have dropped them by now
    exported = scraped_epoch(cluster, "mine")  # ray_qml_ray_epoch{run="mine"} while it trains
    started = time.monotonic()
    ray_cli(env, "job", "stop", train, "--address", url)
    stopped_after = time.monotonic() - started
    assert exported == 1
    assert_stopped_cleanly(cluster, train, run, stopped_after)
    rows = pq.read_table(user_project / "data").to_pandas()
    held_out = datasets.held_out(rows["circuit"], SEED, TEST_FRACTION)
    training = {circuit_hash(circuit) for circuit in rows["circuit"][~held_out]}
    assert_streamed_in_shards(run, notes, training)

    hold.unlink()
    resumed = submit(url, env, *command, "--resume", "--data-in-memory-mb", 1, working_dir=user_project)
    assert_resumed_in_memory(cluster, resumed, run, notes, training)
    assert_inferred(cluster, submit(url, env, "qml_ray.infer", "--run", run, working_dir=user_project), run, rows)
    print(f"\n`ray job stop` ended the job in {stopped_after:.1f} s")


def assert_stopped_cleanly(cluster, job: str, run: Path, stopped_after: float) -> None:
    """`ray job stop` ended the job within seconds, its log ending with how to continue, the run free for
    --resume and nothing in it complete."""
    logs = cluster.job_logs(job)
    assert cluster.job_status(job) == "STOPPED"
    assert logs.strip().splitlines()[-1] == "interrupted: continue with --name mine --resume", logs[-3000:]
    assert "Traceback" not in logs and stopped_after < 120, stopped_after
    assert not (run / claims.CLAIM).exists() and not (run / "weights").exists()


def assert_streamed_in_shards(run: Path, notes: Path, training: set) -> None:
    """Epoch 1, streamed: disjoint shards of one size, together every training row (but the last
    rows % 2), and never the whole data set."""
    per_worker = len(training) // 2
    shards = [noted(notes, rank) for rank in (0, 1)]
    assert [len(shard) for shard in shards] == [per_worker, per_worker]
    assert not set(shards[0]) & set(shards[1]) and set(shards[0]) | set(shards[1]) <= training
    recorded = datasets.read_manifest(str(run))
    assert len(recorded["train"]) == FILES and recorded["rows"]["train"] == len(training)
    assert recorded["held_out"] == {"seed": SEED, "test_fraction": TEST_FRACTION}


def assert_resumed_in_memory(cluster, job: str, run: Path, notes: Path, training: set) -> None:
    """The resumed run, its data kept in memory: from epoch 1 again, each worker's shard read once and
    trained on every epoch in another order; the stopped and the finished run in the Train view, one
    training worker per worker node."""
    logs = cluster.job_logs(job)
    assert cluster.job_status(job) == "SUCCEEDED", logs[-3000:]
    # No checkpoint before the stop (every 5 epochs and the last): the run starts again from epoch 1.
    assert [int(e) for e in re.findall(rf"^epoch (\d+)/{EPOCHS}  loss", logs, re.M)] == list(range(1, EPOCHS + 1))
    assert len(logs.splitlines()) <= EPOCHS + 10, logs  # the job's log: the command's console, nothing of Ray's
    history = pd.read_csv(run / storage.HISTORY)
    assert list(history["epoch"]) == [1, 2, 3] and history["loss"].iloc[-1] < history["loss"].iloc[0]
    per_worker = len(training) // 2
    kept = [noted(notes, rank)[per_worker:] for rank in (0, 1)]  # each rank's epochs 1 to 3 in memory
    epochs = [[shard[e * per_worker : (e + 1) * per_worker] for e in range(EPOCHS)] for shard in kept]
    for shard in epochs:
        assert len(shard[-1]) == per_worker and all(set(e) == set(shard[0]) and e != shard[0] for e in shard[1:])
    assert not set(epochs[0][0]) & set(epochs[1][0]) and set(epochs[0][0]) | set(epochs[1][0]) <= training
    runs = [train_run for train_run in cluster.train_runs() if train_run["name"] == "mine"]  # the Train view
    stopped, finished = sorted(runs, key=lambda train_run: train_run["status"])
    assert (stopped["status"], finished["status"]) == ("ABORTED", "FINISHED")
    workers = cluster.listed("actors", class_name="RayTrainWorker", job_id=finished["job_id"])
    assert len({actor["node_id"] for actor in workers}) == 2  # one training worker per worker node


def assert_inferred(cluster, job: str, run: Path, rows: pd.DataFrame) -> None:
    """The run's held-out rows inferred, each given a prediction beside its other columns."""
    assert cluster.job_status(job) == "SUCCEEDED"
    assert re.search(r"^loss \d\.\d+$", cluster.job_logs(job), re.M)
    [out] = (run / storage.PREDICTIONS).iterdir()
    predicted = pq.read_table(out).to_pandas()
    held_out = datasets.held_out(rows["circuit"], SEED, TEST_FRACTION)
    assert sorted(predicted["id"]) == sorted(rows["id"][held_out])
    assert list(predicted.columns) == ["id", "command", "label", "prediction"]  # less the circuits it fed the model
    assert predicted["prediction"].dtype == np.float32 and predicted["prediction"].notna().all()
    assert {job["type"] for job in cluster.jobs()} == {"SUBMISSION"}  # no job of the script's (a client joining Ray)


def circuit_hash(circuit: bytes) -> str:
    return hashlib.sha1(circuit).hexdigest()


def noted(notes: Path, rank: int) -> list[str]:
    """The circuits rank `rank` trained on, in order (the user's module notes them: conftest.MODULE)."""
    return (notes / f"rank-{rank}.txt").read_text().split()


TRIALS = {f"param.readout_layers={layers}-seed=0": layers for layers in (1, 2)}  # the sweep job's
TRIAL_EPOCHS = 4  # checkpoints at epochs 2 and 4
RUN_FILES = {"config.yaml", "data.json", "metrics.csv", "gradients.json", "weights/_COMPLETE"}


def trial_folders(sweep: Path) -> list[Path]:
    return sorted(p for p in sweep.iterdir() if p.is_dir() and "=" in p.name)


def test_sweep_job_over_a_users_model_on_the_multi_node_cluster(cluster, tmp_path):
    """Ray Tune trials of the regression example, one per value of one of its own parameters, of one
    1-CPU worker each on 2 one-CPU nodes, side by side, ranked by validation loss. (An inference job
    on this cluster: the test above.)"""
    from examples import regression

    url, env = cluster.url, cluster.env
    regression.make_data(str(tmp_path / "data"))
    options = ("--model", "examples.regression:regressor", "--data", tmp_path / "data", "--workers", 1)
    options += ("--epochs", TRIAL_EPOCHS, "--batch-size", 16, "--checkpoint-every", 2)
    grid = ("--grid", "param.readout_layers=1,2", "--storage", tmp_path, "--name", "layers")
    job = submit(url, env, "qml_ray.sweep", *options, *grid)
    assert cluster.job_status(job) == "SUCCEEDED"
    logs = cluster.job_logs(job)

    sweep = tmp_path / "layers"
    runs = trial_folders(sweep)
    assert [run.name for run in runs] == list(TRIALS)
    for run in runs:
        assert {p.relative_to(run).as_posix() for p in run.rglob("*")} >= RUN_FILES, run
        assert sorted(p.name for p in (run / "checkpoints").glob("epoch-*")) == ["epoch-00002", "epoch-00004"]
        history = pd.read_csv(run / "metrics.csv")
        assert history["epoch"].tolist() == list(range(1, TRIAL_EPOCHS + 1)) and "val_mae" in history
        assert history["loss"].iloc[-1] < history["loss"].iloc[0]
        assert gradients_of(run) == [("pqc", "BlockAdjoint")]
        config = config_lib.of_run(str(run))
        assert (config.model, config.params["readout_layers"]) == ("examples.regression:regressor", TRIALS[run.name])

    # side by side: some trial's Ray Train run started before another's ended (as the dashboard shows them)
    spans = sorted((run["start_time_ns"], run["end_time_ns"]) for run in cluster.train_runs() if run["name"] in TRIALS)
    assert len(spans) == 2 and spans[1][0] < spans[0][1], spans

    table = pd.read_csv(sweep / "results.csv")
    assert len(table) == 2 and set(table["state"]) == {"finished"} and (table["epochs"] == TRIAL_EPOCHS).all()
    assert table["best_val_loss"].is_monotonic_increasing  # ranked by val_loss, best first
    best = table.iloc[0]
    assert best["best_val_loss"] == pytest.approx(pd.read_csv(Path(best["run"]) / "metrics.csv")["val_loss"].min())
    assert (sweep / "results.md").read_text().count("\n") == 2 + 2
    assert (sweep / "curves.png").read_bytes()[:4] == b"\x89PNG"

    trial_lines = [line for line in logs.splitlines() if line.startswith("trial ")]
    assert len(trial_lines) == 2 and all(": finished, 4 epochs" in line for line in trial_lines), logs
    assert f"best trial (val_loss {best['best_val_loss']:.4f}): {best['run']}" in logs
    assert "epoch 1/4" not in logs  # the trainings' epoch lines stay in Ray's logs


TOKEN_PLACES = "the cluster's token in ~/.ray/auth_token, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
TOKEN_MISMATCHES = {  # the shell's settings, what the one line says
    "disabled": ({"RAY_AUTH_MODE": "disabled"}, "does not (RAY_AUTH_MODE=disabled): set RAY_AUTH_MODE=token, with"),
    "wrong-token": (
        {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "not-the-clusters"},
        f"refuses this shell's token (from RAY_AUTH_TOKEN): give {TOKEN_PLACES}",
    ),
    "no-token": (
        {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "{tmp}/no-token"},
        f"uses token authentication and this shell finds no token in {{tmp}}/no-token: put {TOKEN_PLACES}",
    ),
}


@pytest.fixture(scope="module")
def tutorial_run(trained_run, tmp_path_factory) -> Path:
    """A copy of the trained tutorial run (the original's inference, in the other lane, writes into it)."""
    copy = tmp_path_factory.mktemp("tutorial") / "tutorial"
    return Path(shutil.copytree(trained_run.path, copy, ignore=shutil.ignore_patterns("predictions")))


@pytest.mark.parametrize("command, shell", [("infer", "disabled"), ("train", "wrong-token"), ("sweep", "no-token")])
def test_a_shell_without_the_clusters_token_is_one_line(command, shell, tutorial_run, tmp_path, multi_node_cluster):
    """The multi-node cluster uses token authentication: a command joining it from a shell without its
    token ends in one line saying what to set, and nothing is written nor asked of the cluster."""
    settings, message = TOKEN_MISMATCHES[shell]
    env = command_env(**{key: value and value.format(tmp=tmp_path) for key, value in settings.items()})
    address = ("--address", f"127.0.0.1:{multi_node_cluster.env['RAY_PORT']}")
    jobs, before = len(multi_node_cluster.jobs()), snapshot(tutorial_run)
    done = run_command(command, *token_mismatch_args(command, tutorial_run, tmp_path), *address, env=env)
    assert_error(done, message.format(tmp=tmp_path), ENVIRONMENT_STATUS)
    assert list(tmp_path.iterdir()) == [] and snapshot(tutorial_run) == before
    assert len(multi_node_cluster.jobs()) == jobs


def token_mismatch_args(command: str, run: Path, storage: Path) -> tuple:
    if command == "infer":
        return ("--run", run)
    return ("--config", SMOKE, "--storage", storage)
