"""The TF profiler: a trace of chosen steps in the run's TensorBoard logs, and a profiler
server on every worker (port + local rank) while training runs."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SMOKE, command_env, free_port, wait_for
from holds import HOLD, HOLD_FILE


@pytest.mark.slow  # a training
def test_profile_steps_trace_and_a_profiler_server_per_worker(tmp_path, shared_ray):
    port = free_port()  # the two workers on this node serve on port and port + 1
    run, hold = tmp_path / "profiled", tmp_path / HOLD_FILE
    hold.write_text("1")  # held after epoch 1 while the servers are asked for
    command = [sys.executable, "-m", "qml_ray.train", "--config", str(SMOKE), "--workers", "2", "--epochs", "2"]
    profiling = ["--profile-steps", "2,3", "--profiler-port", str(port), *HOLD, "--address", shared_ray]
    with open(tmp_path / "train.log", "w") as log:
        training = subprocess.Popen(
            [*command, *profiling, "--storage", str(tmp_path), "--name", run.name],
            cwd=ROOT,
            env=command_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        # Steps 2-3 are in epoch 1, whose end publishes the trace; the servers started before.
        wait_for(lambda: training.poll() is not None or traces(run), "epoch 1's trace published")
        for worker_port in (port, port + 1):
            socket.create_connection(("127.0.0.1", worker_port), timeout=10).close()
        hold.unlink()
        assert training.wait(timeout=600) == 0, (tmp_path / "train.log").read_text()[-3000:]
    finally:
        if training.poll() is None:
            training.kill()
            training.wait()

    assert len(traces(run)) == 1


def traces(run: Path) -> list[Path]:
    """The profiler traces in the run's TensorBoard logs."""
    return list(run.glob("tensorboard/plugins/profile/*/*.xplane.pb"))
