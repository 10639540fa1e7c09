"""`ray job submit` of training, inference and a sweep on a real multi-node Ray cluster on this
machine (scripts/local_cluster.sh): a head that runs no work and two worker nodes of one CPU each,
like the RayCluster on GKE."""

import json
import os
import re
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from qml_ray import claims, config as config_lib

from conftest import ray_cli, submit
from holds import HOLD, HOLD_ENV
from test_sweep import EPOCHS as TRIAL_EPOCHS, SMALL

pytestmark = pytest.mark.slow  # a 3-node cluster and its jobs

EPOCHS = 3  # the training is held after the first until its exported epoch gauge is scraped
GAUGE_SECONDS = 5  # more than Ray keeps a gauge not set again: 2 export intervals of 1 s (conftest.cluster)


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


def ended(url: str, env: dict, job: str) -> bool:
    return bool(re.search(r"SUCCEEDED|FAILED|STOPPED", ray_cli(env, "job", "status", job, "--address", url)))


def wait_until_held(hold: Path, url: str, env: dict, job: str) -> None:
    """Until the job's training waits at a step for `hold` to go (tests/holds.py)."""
    deadline = time.monotonic() + 300
    while not Path(f"{hold}.held").exists():
        assert time.monotonic() < deadline and not ended(url, env, job), "the training was never held"
        time.sleep(0.5)


def test_a_users_model_trains_as_a_job_is_stopped_resumed_and_inferred(cluster, user_project, tmp_path):
    """The user's module and data are in the job's working folder only: the driver, every worker
    and every Ray Data task find them there. While it trains, its epoch gauge is exported. Then
    `ray job stop` (SIGTERM to the job's driver, as a RayJob's deletion sends) stops it within
    seconds, its log ending with how to continue, the run free for --resume and nothing in it
    complete; run again with --resume, the job finishes it."""
    url, env = cluster.url, cluster.env
    hold, run = tmp_path / "hold", tmp_path / "mine"
    hold.write_text("1")
    options = ("--model", "mymodel:build", "--data", "data", "--workers", 2, "--epochs", EPOCHS, *HOLD)
    command = ("qml_ray.train", *options, "--storage", tmp_path, "--name", "mine")
    train = submit(url, env, *command, wait=False, working_dir=user_project, env_vars={HOLD_ENV: str(hold)})
    wait_until_held(hold, url, env, train)  # held in epoch 2: rank 0 set the gauges at epoch 1's end
    time.sleep(GAUGE_SECONDS)  # without a refresh, Ray's agent would have dropped them by now
    exported = scraped_epoch(cluster, "mine")  # ray_qml_ray_epoch{run="mine"} while it trains
    started = time.monotonic()
    ray_cli(env, "job", "stop", train, "--address", url)
    stopped_after = time.monotonic() - started
    logs = ray_cli(env, "job", "logs", train, "--address", url)
    assert exported == 1
    assert "stopped" in ray_cli(env, "job", "status", train, "--address", url).lower()
    assert logs.strip().splitlines()[-1] == "interrupted: continue with --name mine --resume", logs[-3000:]
    assert "Traceback" not in logs and stopped_after < 30, stopped_after
    assert not (run / claims.CLAIM).exists() and not (run / "weights").exists()

    resumed = submit(url, env, *command, "--resume", working_dir=user_project)  # no hold: it trains on
    logs = ray_cli(env, "job", "logs", resumed, "--address", url)
    assert "succeeded" in ray_cli(env, "job", "status", resumed, "--address", url).lower(), logs[-3000:]
    # No checkpoint before the stop (every 5 epochs and the last): the run starts again from epoch 1.
    assert [int(e) for e in re.findall(rf"^epoch (\d+)/{EPOCHS}  loss", logs, re.M)] == list(range(1, EPOCHS + 1))
    assert len(logs.splitlines()) <= EPOCHS + 10, logs  # the job's log: the command's console, nothing of Ray's
    runs = [train_run for train_run in cluster.train_runs() if train_run["name"] == "mine"]  # the Train view
    stopped, finished = sorted(runs, key=lambda train_run: train_run["status"])
    assert (stopped["status"], finished["status"]) == ("ABORTED", "FINISHED")
    listing = "list actors --filter class_name=RayTrainWorker --detail --format json".split()
    actors = json.loads(ray_cli(env, *listing, "--address", url))
    workers = [actor for actor in actors if actor["job_id"] == finished["job_id"]]
    assert len({actor["node_id"] for actor in workers}) == 2  # one training worker per worker node

    infer = submit(url, env, "qml_ray.infer", "--run", run, working_dir=user_project)
    assert "succeeded" in ray_cli(env, "job", "status", infer, "--address", url).lower()
    assert re.search(r"^loss \d\.\d+$", ray_cli(env, "job", "logs", infer, "--address", url), re.M)
    assert (run / "weights" / "_COMPLETE").is_file()
    jobs = json.loads(ray_cli(env, "list", "jobs", "--format", "json", "--address", url))
    assert {job["type"] for job in jobs} == {"SUBMISSION"}  # no job of the script's (a client joining Ray)
    print(f"\n`ray job stop` ended the job in {stopped_after:.1f} s")


TRIALS = {f"learning_rate={rate}-seed=7": (rate, 7) for rate in (0.05, 0.1)}  # the sweep job's
RUN_FILES = {"config.yaml", "data/train.parquet", "data/test.parquet", "metrics.csv", "weights/_COMPLETE"}


def trial_folders(sweep: Path) -> list[Path]:
    return sorted(p for p in sweep.iterdir() if p.is_dir() and "=" in p.name)


def test_sweep_job_on_the_multi_node_cluster(cluster, tmp_path):
    """2 trials (2 learning rates) of one 1-CPU worker each on 2 one-CPU nodes, side by side."""
    url, env = cluster.url, cluster.env
    options = ("--grid", "learning_rate=0.05,0.1", "--storage", tmp_path, "--name", "lr")
    job = submit(url, env, "qml_ray.sweep", *SMALL, *options)
    assert "succeeded" in ray_cli(env, "job", "status", job, "--address", url).lower()
    logs = ray_cli(env, "job", "logs", job, "--address", url)

    sweep = tmp_path / "lr"
    runs = trial_folders(sweep)
    assert [run.name for run in runs] == list(TRIALS)
    for run in runs:
        assert {p.relative_to(run).as_posix() for p in run.rglob("*")} >= RUN_FILES, run
        assert sorted(p.name for p in (run / "checkpoints").glob("epoch-*")) == ["epoch-00002", "epoch-00004"]
        assert pd.read_csv(run / "metrics.csv")["epoch"].tolist() == list(range(1, TRIAL_EPOCHS + 1))
        config = config_lib.of_run(str(run))
        assert (config.learning_rate, config.seed) == TRIALS[run.name]
    assert os.path.samefile(runs[0] / "data/test.parquet", runs[1] / "data/test.parquet")  # one seed, one data set

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

    infer = submit(url, env, "qml_ray.infer", "--run", best["run"])
    assert "succeeded" in ray_cli(env, "job", "status", infer, "--address", url).lower()
