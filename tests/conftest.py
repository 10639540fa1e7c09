"""Shared fixtures: the commands run as a user runs them, in subprocesses with their own local Ray."""

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import qml_ray  # noqa: F401  (first: it selects tf-keras before any test imports TensorFlow)

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"


def command_env(**changes: str | None) -> dict:
    """The environment for a command: no RAY_ADDRESS, so each command starts (and stops) its
    own Ray; `changes` set (or, given None, remove) variables."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONUNBUFFERED"] = "1"
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # this python, ray
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_command(module: str, *args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m qml_ray.<module> args...` and return its completed process (text output)."""
    return subprocess.run(
        [sys.executable, "-m", f"qml_ray.{module}", *map(str, args)],
        cwd=ROOT, env=env or command_env(), capture_output=True, text=True, timeout=timeout,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class TrainedRun:
    path: Path  # the run folder
    output: str  # what the train command printed


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> TrainedRun:
    """The smoke config trained with 2 Ray Train workers (seeded)."""
    storage = tmp_path_factory.mktemp("runs")
    done = run_command("train", "--config", SMOKE, "--workers", 2, "--storage", storage, "--name", "smoke")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return TrainedRun(storage / "smoke", done.stdout + done.stderr)
