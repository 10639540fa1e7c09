"""`ray job submit` on a real multi-node Ray cluster on this machine (scripts/local_cluster.sh):
a head that runs no work and two worker nodes of one CPU each, like the RayCluster on GKE."""

import json
import re
import time
import urllib.request
from pathlib import Path

from conftest import SMOKE, ray_cli, submit

EPOCHS = 20  # long enough for the workers to export their metrics while training


def dashboard_get(url: str, path: str):
    """A dashboard API answer (JSON), with Ray's token as the browser sends it."""
    token = (Path.home() / ".ray" / "auth_token").read_text().strip()
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def scraped_epoch(url: str, run: str) -> float | None:
    """The run's `epoch` gauge on any node's metrics endpoint (found as Prometheus finds them,
    through the dashboard's service discovery), or None before one exports it."""
    for group in dashboard_get(url, "/api/prometheus/sd"):
        for target in group["targets"]:
            with urllib.request.urlopen(f"http://{target}/metrics", timeout=30) as response:
                text = response.read().decode()
            if found := re.search(rf'^ray_qml_ray_epoch{{[^}}]*run="{run}"[^}}]*}} (\S+)$', text, re.M):
                return float(found.group(1))
    return None


def ended(url: str, env: dict, job: str) -> bool:
    return bool(re.search(r"SUCCEEDED|FAILED|STOPPED", ray_cli(env, "job", "status", job, "--address", url)))


def test_training_and_inference_jobs_on_a_multi_node_cluster(cluster, tmp_path):
    url, env = cluster.url, cluster.env

    options = ("--config", SMOKE, "--workers", 2, "--epochs", EPOCHS, "--storage", tmp_path, "--name", "smoke")
    train = submit(url, env, "qml_ray.train", *options, wait=False)
    exported = None
    while exported is None and not ended(url, env, train):
        exported = scraped_epoch(url, "smoke")  # ray_qml_ray_epoch{run="smoke"} while it trains
        time.sleep(1)
    logs = ray_cli(env, "job", "logs", train, "--address", url, "--follow")
    assert "succeeded" in ray_cli(env, "job", "status", train, "--address", url).lower(), logs[-3000:]
    assert exported is not None and 1 <= exported <= EPOCHS
    assert [int(e) for e in re.findall(rf"^epoch (\d+)/{EPOCHS}  loss", logs, re.M)] == list(range(1, EPOCHS + 1))
    assert len(logs.splitlines()) <= EPOCHS + 10, logs  # the job's log: the command's console, nothing of Ray's
    listing = "list actors --filter class_name=RayTrainWorker --detail --format json".split()
    actors = json.loads(ray_cli(env, *listing, "--address", url))
    assert len({actor["node_id"] for actor in actors}) == 2  # one training worker per worker node
    [run] = dashboard_get(url, "/api/train/v2/runs/v1")["train_runs"]  # the dashboard's Train view
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
