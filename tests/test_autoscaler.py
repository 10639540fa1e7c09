"""The capacity request of a command on Ray's autoscaler v2 (KubeRay's default), on a real
autoscaling cluster on this machine: a head with the `fake_multinode` provider, whose nodes are
real raylets that the autoscaler starts and stops. The cluster grows for the training's workers,
and once the command has ended its request is gone (v2 keeps one in the GCS until it is replaced)
and the cluster shrinks back to the head; a command stopped with SIGTERM (`ray job stop`) withdraws
its request too."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID
from ray.autoscaler.v2.sdk import get_cluster_status

from conftest import ROOT, SMOKE, command_env, free_port, is_running, run_command, running_commands, wait_for

pytestmark = pytest.mark.slow  # an autoscaling cluster

IDLE_MINUTES = 0.1  # a node idle this long is stopped


def autoscaling_config(gcs: str) -> dict:
    """A head that runs no work, and up to two worker nodes of one CPU."""
    commands = ("initialization", "setup", "head_setup", "worker_setup", "head_start_ray", "worker_start_ray")
    return {
        "cluster_name": "qml-ray-test",
        "max_workers": 2,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": IDLE_MINUTES,
        "provider": {  # fake_multinode as an external provider: the wheel lacks its default config
            "type": "external",
            "module": "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider",
            "launch_multiple": True,
            "head_node_id": FAKE_HEAD_NODE_ID,
            "gcs_address": gcs,
        },
        "auth": {"ssh_user": "ray"},
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
            "cpu": {"resources": {"CPU": 1}, "node_config": {}, "min_workers": 0, "max_workers": 2},
        },
        "head_node_type": "ray.head.default",
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        **{f"{name}_commands": [] for name in commands},
    }


def cluster_processes(port: int) -> list[int]:
    """PIDs of this cluster's processes: every one names its GCS port on its command line."""
    address, bare = f":{port}".encode(), str(port).encode()
    return [
        pid
        for pid, args in running_commands()
        if any(arg.endswith(address) or arg == bare for arg in args) and is_running(pid)
    ]


@pytest.fixture(scope="module")
def autoscaling_cluster(tmp_path_factory):
    """The head's GCS address, for the module's tests in turn (each leaves it without worker nodes
    or requests). The head runs autoscaler v2 with the fake_multinode provider, which starts worker
    nodes (raylets) itself; all of the cluster's processes are stopped by PID after."""
    tmp_path = tmp_path_factory.mktemp("autoscaling")
    port = free_port()
    gcs = f"127.0.0.1:{port}"
    dashboard = free_port()
    env = command_env(
        RAY_API_SERVER_ADDRESS=f"http://127.0.0.1:{dashboard}",  # its own state, as the shared Ray's (conftest)
        RAY_enable_autoscaler_v2="1",
        RAY_FAKE_CLUSTER="1",
        RAY_CLOUD_INSTANCE_ID=FAKE_HEAD_NODE_ID,
        RAY_OVERRIDE_NODE_ID_FOR_TESTING=FAKE_HEAD_NODE_ID,
        AUTOSCALER_UPDATE_INTERVAL_S="1",
        RAY_AUTH_MODE="disabled",  # `ray start --head` turns token authentication on by default
    )
    config = tmp_path / "autoscaling.yaml"
    config.write_text(json.dumps(autoscaling_config(gcs)))
    head = subprocess.Popen(
        [
            *("ray", "start", "--head", "--block", "--disable-usage-stats", "--port", str(port), "--num-cpus", "0"),
            *("--dashboard-port", str(dashboard), "--autoscaling-config", str(config)),
        ],
        env=env,
        stdout=open(tmp_path / "head.log", "w"),  # noqa: SIM115 (the process keeps it)
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for(lambda: cluster_status(gcs), "the head started", 60)
        yield gcs
    finally:
        # Killed: a graceful stop would wait about 30 s for the detached actors (Ray Train's, Ray
        # Data's) that the commands left behind, which no test needs.
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(timeout=60)
        for pid in cluster_processes(port):  # the worker nodes the autoscaler left, if any
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not cluster_processes(port), "the cluster's processes stopped", 30)
        current = Path("/tmp/ray/ray_current_cluster")  # `ray start --head` recorded this cluster
        if current.exists() and current.read_text().strip().endswith(f":{port}"):
            current.unlink()


def cluster_status(gcs: str) -> tuple[int, list] | None:
    """(worker nodes alive, the bundles that cluster resource constraints in the GCS ask for), or
    None if the GCS is unreachable."""
    try:
        status = get_cluster_status(gcs, timeout=5)
    except Exception:  # the GCS is not up (yet)
        return None
    workers = [
        node for node in status.active_nodes + status.idle_nodes if node.node_id and node.ray_node_type_name == "cpu"
    ]
    constraints = status.resource_demands.cluster_constraint_demand
    return len(workers), [bundles for constraint in constraints for bundles in constraint.bundles_by_count]


def test_the_cluster_grows_for_the_run_and_its_request_ends_with_the_command(autoscaling_cluster, tmp_path):
    gcs = autoscaling_cluster
    assert cluster_status(gcs) == (0, [])
    env = command_env(RAY_ADDRESS=None)
    started = time.monotonic()
    done = run_command(
        "train",
        *("--config", SMOKE, "--workers", 1, "--epochs", 2, "--capacity-timeout", 180, "--address", gcs),
        *("--storage", tmp_path, "--name", "autoscaled"),
        env=env,
    )
    ran = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "waiting for the cluster to grow: 0 of 1 training workers placeable" in done.stdout
    assert "trained 2 epochs on 1 worker(s)" in done.stdout  # on the node the autoscaler added

    assert cluster_status(gcs)[1] == []  # the request went with the command
    ended = time.monotonic()
    wait_for(lambda: cluster_status(gcs)[0] == 0, "the worker nodes stopped", 120)
    print(f"\ntrained in {ran:.0f} s on an added node; back to 0 worker nodes {time.monotonic() - ended:.0f} s after")


def test_a_command_stopped_with_sigterm_withdraws_its_request(autoscaling_cluster, tmp_path):
    gcs = autoscaling_cluster
    command = [sys.executable, "-m", "qml_ray.train", "--config", str(SMOKE), "--workers", "3"]  # 2 nodes at most
    command += ["--capacity-timeout", "300", "--address", gcs, "--storage", str(tmp_path)]
    train = subprocess.Popen(
        command, cwd=ROOT, env=command_env(RAY_ADDRESS=None), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert "waiting for the cluster to grow" in train.stdout.readline()
        assert cluster_status(gcs)[1]  # the request is in the GCS
        train.send_signal(signal.SIGTERM)
        _, stderr = train.communicate(timeout=30)
    finally:
        train.kill()
    assert train.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr
    assert cluster_status(gcs)[1] == []  # withdrawn on the way out
