"""`ray job submit` on a real multi-node Ray cluster on this machine (scripts/local_cluster.sh):
a head that runs no work and two worker nodes of one CPU each, like the RayCluster on GKE."""

import json
import re
import subprocess

from pathlib import Path

import pytest

from conftest import ROOT, SMOKE, command_env, free_port

SCRIPT = ROOT / "scripts" / "local_cluster.sh"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(dashboard URL, env) of a 3-node cluster; the script stops its nodes by PID afterwards."""
    state = tmp_path_factory.mktemp("cluster")
    dashboard = free_port()
    env = command_env(QML_RAY_CLUSTER_DIR=str(state), RAY_PORT=str(free_port()), DASHBOARD_PORT=str(dashboard),
                      RAY_AUTH_MODE="token")
    pids = []
    try:
        up = subprocess.run([SCRIPT, "up", "2", "1"], env=env, capture_output=True, text=True, timeout=200)
        pids = [int(p) for p in (state / "pids").read_text().split()] if (state / "pids").exists() else []
        assert up.returncode == 0, up.stdout + up.stderr
        assert len(pids) == 3
        yield f"http://127.0.0.1:{dashboard}", env
    finally:
        pids = pids or ([int(p) for p in (state / "pids").read_text().split()] if (state / "pids").exists() else [])
        down = subprocess.run([SCRIPT, "down"], env=env, capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr
        assert not [pid for pid in pids if is_running(pid)]
        assert not Path("/tmp/ray/ray_current_cluster").exists()  # no stale cluster for later ray.init()


def is_running(pid: int) -> bool:
    """Whether the process runs (a zombie waiting for its reaper has stopped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def ray_cli(env: dict, *args: str) -> str:
    """Run a `ray` CLI command (they use the dashboard's job and state APIs); its stdout."""
    done = subprocess.run(["ray", *map(str, args)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def submit(url: str, env: dict, *command: str) -> str:
    """`ray job submit` a qml_ray command with the project as working dir; return the job id."""
    output = ray_cli(env, "job", "submit", "--address", url, "--working-dir", ROOT, "--", "python", "-m", *command)
    return re.search(r"Job '(raysubmit_\w+)' submitted successfully", output).group(1)


def test_training_and_inference_jobs_on_a_multi_node_cluster(cluster, tmp_path):
    url, env = cluster

    train = submit(url, env, "qml_ray.train", "--config", SMOKE, "--workers", 2, "--storage", tmp_path,
                   "--name", "smoke")
    assert "succeeded" in ray_cli(env, "job", "status", train, "--address", url).lower()
    logs = ray_cli(env, "job", "logs", train, "--address", url)
    assert "epoch 6/6" in logs and "val_accuracy" in logs
    actors = json.loads(ray_cli(env, "list", "actors", "--address", url, "--filter", "class_name=RayTrainWorker",
                                "--detail", "--format", "json"))
    assert len({actor["node_id"] for actor in actors}) == 2  # one training worker per worker node

    infer = submit(url, env, "qml_ray.infer", "--run", tmp_path / "smoke")
    assert "succeeded" in ray_cli(env, "job", "status", infer, "--address", url).lower()
    assert re.search(r"mse \d\.\d+  accuracy \d\.\d+", ray_cli(env, "job", "logs", infer, "--address", url))
    assert (tmp_path / "smoke" / "weights" / "_COMPLETE").is_file()
