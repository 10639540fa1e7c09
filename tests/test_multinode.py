"""`ray job submit` on a real multi-node Ray cluster on this machine (scripts/local_cluster.sh):
a head that runs no work and two worker nodes of one CPU each, like the RayCluster on GKE."""

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest

from qml_ray import claims

from conftest import SMOKE, ray_cli, submit
from holds import HOLD, HOLD_ENV

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


def test_training_and_inference_jobs_on_a_multi_node_cluster(cluster, tmp_path):
    url, env = cluster.url, cluster.env

    hold = tmp_path / "hold"
    hold.write_text("1")
    options = ("--config", SMOKE, "--workers", 2, "--epochs", EPOCHS, *HOLD, "--storage", tmp_path, "--name", "smoke")
    train = submit(url, env, "qml_ray.train", *options, wait=False, env_vars={HOLD_ENV: str(hold)})
    wait_until_held(hold, url, env, train)  # held in epoch 2: rank 0 set the gauges at epoch 1's end
    time.sleep(GAUGE_SECONDS)  # without a refresh, Ray's agent would have dropped them by now
    exported = scraped_epoch(cluster, "smoke")  # ray_qml_ray_epoch{run="smoke"} while it trains
    hold.unlink()
    logs = ray_cli(env, "job", "logs", train, "--address", url, "--follow")
    assert "succeeded" in ray_cli(env, "job", "status", train, "--address", url).lower(), logs[-3000:]
    assert exported == 1
    assert [int(e) for e in re.findall(rf"^epoch (\d+)/{EPOCHS}  loss", logs, re.M)] == list(range(1, EPOCHS + 1))
    assert len(logs.splitlines()) <= EPOCHS + 10, logs  # the job's log: the command's console, nothing of Ray's
    listing = "list actors --filter class_name=RayTrainWorker --detail --format json".split()
    actors = json.loads(ray_cli(env, *listing, "--address", url))
    assert len({actor["node_id"] for actor in actors}) == 2  # one training worker per worker node
    [run] = cluster.train_runs()  # the dashboard's Train view
    assert run["name"] == "smoke" and run["status"] == "FINISHED"

    infer = submit(url, env, "qml_ray.infer", "--run", tmp_path / "smoke")
    assert "succeeded" in ray_cli(env, "job", "status", infer, "--address", url).lower()
    assert re.search(r"loss \d\.\d+  accuracy \d\.\d+", ray_cli(env, "job", "logs", infer, "--address", url))
    assert (tmp_path / "smoke" / "weights" / "_COMPLETE").is_file()
    jobs = json.loads(ray_cli(env, "list", "jobs", "--format", "json", "--address", url))
    assert sorted(str(job["submission_id"]) for job in jobs) == sorted([train, infer])  # no job of the script's


def test_a_users_model_travels_with_the_jobs_working_folder(cluster, user_project, tmp_path):
    """The user's module and data are in the job's working folder only: the driver, every worker
    and every Ray Data task find them there."""
    url, env = cluster.url, cluster.env
    options = ("--model", "mymodel:build", "--data", "data", "--workers", 2, "--epochs", 2)
    train = submit(
        url, env, "qml_ray.train", *options, "--storage", tmp_path, "--name", "mine", working_dir=user_project
    )
    logs = ray_cli(env, "job", "logs", train, "--address", url)
    assert "succeeded" in ray_cli(env, "job", "status", train, "--address", url).lower(), logs[-3000:]
    assert re.findall(r"^epoch (\d)/2  loss", logs, re.M) == ["1", "2"]
    infer = submit(url, env, "qml_ray.infer", "--run", tmp_path / "mine", working_dir=user_project)
    assert re.search(r"^loss \d\.\d+$", ray_cli(env, "job", "logs", infer, "--address", url), re.M)


def test_ray_job_stop_stops_the_training_at_once_and_says_how_to_continue(cluster, tmp_path):
    """`ray job stop` (SIGTERM to the job's driver, as a RayJob's deletion sends) while the training
    is held at a step: the job stops within seconds, its log ends with how to continue, the run is
    free for --resume and nothing in it looks complete."""
    url, env = cluster.url, cluster.env
    hold, run = tmp_path / "hold", tmp_path / "stopped"
    hold.write_text("1")
    options = ("--config", SMOKE, "--workers", 2, *HOLD, "--storage", tmp_path, "--name", "stopped")
    job = submit(url, env, "qml_ray.train", *options, wait=False, env_vars={HOLD_ENV: str(hold)})
    wait_until_held(hold, url, env, job)
    started = time.monotonic()
    ray_cli(env, "job", "stop", job, "--address", url)
    stopped_after = time.monotonic() - started
    logs = ray_cli(env, "job", "logs", job, "--address", url)
    assert "stopped" in ray_cli(env, "job", "status", job, "--address", url).lower()
    assert logs.strip().splitlines()[-1] == "interrupted: continue with --name stopped --resume", logs[-3000:]
    assert "Traceback" not in logs and stopped_after < 30, stopped_after
    assert not (run / claims.CLAIM).exists() and not (run / "weights").exists()
    print(f"\n`ray job stop` ended the job in {stopped_after:.1f} s")
