"""Every user mistake: one clear error line, exit status 2, no traceback, nothing written or lost."""

import shutil
from pathlib import Path

import pytest
from ray._private.utils import get_num_cpus

from qml_ray import storage
from qml_ray.errors import MAX_LINE, one_line

from conftest import SMOKE, run_command


def snapshot(folder: Path) -> dict:
    """Every file below `folder` with its size and modification time."""
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")} if folder.exists() else {}


def assert_usage_error(done, message: str) -> None:
    stderr = done.stderr.strip()
    assert done.returncode == 2, done.stdout[-2000:] + stderr[-2000:]
    assert "Traceback" not in stderr and "Traceback" not in done.stdout
    assert message in stderr.splitlines()[-1], stderr[-2000:]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--qubits", "3"], "error: qubits must be at least 4"),
        (["--workers", "0"], "error: workers must be at least 1"),
        (["--epochs", "0"], "error: epochs must be at least 1"),
        (["--workers", "two"], "error: workers must be a whole number, got 'two'"),
        (["--config", "configs/missing.yaml"], "error: config file not found: configs/missing.yaml"),
        (["--layers", "9"], "error: layers must be 1..3 for 8 qubits"),
        (["--resume"], "error: --resume needs the --name"),
        (["--learning-rate", "fast"], "error: learning_rate must be a number, got 'fast'"),
        (["--size-thread-pools", "maybe"], "error: size_thread_pools must be true or false, got 'maybe'"),
        (["--hidden-activation", "sigmoid"], "error: hidden_activation must be one of linear, relu, got 'sigmoid'"),
        (["--frobnicate"], "error: unrecognized arguments: --frobnicate"),
    ],
)
def test_bad_train_flags(tmp_path, args, message):
    done = run_command("train", "--storage", tmp_path / "runs", *args)
    assert_usage_error(done, message)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "text, message",
    [
        ("qubits: 6\nqbits: 4\n", "error: unknown config key(s): qbits"),
        ("qubits: [6\n", "error: cannot read config file"),
        ("epochs: -3\n", "error: epochs must be at least 1"),
    ],
)
def test_bad_config_files(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert_usage_error(run_command("train", "--config", path, "--storage", tmp_path / "runs"), message)
    assert not (tmp_path / "runs").exists()


# The CPUs a local Ray started on this machine gives itself (its cgroup quota or CPU affinity).
CPUS = get_num_cpus()


def test_more_workers_than_the_cluster_can_place_fails_at_once(tmp_path):
    done = run_command("train", "--config", SMOKE, "--workers", CPUS + 1, "--storage", tmp_path, timeout=120)
    assert_usage_error(
        done,
        f"the Ray cluster ({CPUS} CPUs) can place {CPUS} process(es) of 1 CPU(s), "
        f"not {CPUS + 1} training workers: lower --workers or --cpus-per-worker, or add nodes",
    )
    assert list(tmp_path.iterdir()) == []


def test_capacity_that_never_comes_fails_after_the_timeout(tmp_path):
    options = ("--workers", 1, "--cpus-per-worker", CPUS + 1, "--capacity-timeout", 3)
    done = run_command("train", "--config", SMOKE, *options, "--storage", tmp_path, timeout=120)
    assert_usage_error(done, f"can place 0 process(es) of {CPUS + 1} CPU(s), not 1 training workers after 3 s")
    assert "waiting for the cluster to grow: 0 of 1 training workers placeable" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_existing_run_is_never_overwritten(trained_run):
    before = snapshot(trained_run.path)
    done = run_command("train", "--config", SMOKE, "--storage", trained_run.path.parent, "--name", "smoke")
    assert_usage_error(done, "already exists: choose another --name, or add --resume")
    assert snapshot(trained_run.path) == before


def test_resume_refuses_another_data_set_or_model(trained_run):
    before = snapshot(trained_run.path)
    done = run_command("train", "--storage", trained_run.path.parent, "--name", "smoke", "--resume", "--qubits", "6")
    assert_usage_error(done, "with another qubits")
    assert snapshot(trained_run.path) == before


@pytest.fixture
def run_copy(trained_run, tmp_path) -> Path:
    """A copy of the trained run, free to damage."""
    return Path(shutil.copytree(trained_run.path, tmp_path / "copy", ignore=shutil.ignore_patterns("predictions")))


def remove_weights(run: Path) -> None:
    shutil.rmtree(run / storage.WEIGHTS)


def corrupt_weights(run: Path) -> None:
    data_file = next((run / storage.WEIGHTS).glob("qcnn.data-*"))
    data_file.write_bytes(b"\x00garbage" * 16)


def change_model_shape(run: Path) -> None:
    config = run / storage.CONFIG
    config.write_text(config.read_text().replace("qubits: 4", "qubits: 8"))


@pytest.mark.parametrize(
    "damage, message",
    [
        (remove_weights, "error: no weights in"),
        (corrupt_weights, "error: cannot load the weights in"),
        (change_model_shape, "error: cannot load the weights in"),
    ],
)
def test_infer_with_missing_corrupt_or_mismatched_weights(run_copy, damage, message):
    damage(run_copy)
    done = run_command("infer", "--run", run_copy)
    assert_usage_error(done, message)
    assert not (run_copy / storage.PREDICTIONS).exists()


def test_infer_without_a_run_or_its_data(run_copy, tmp_path):
    assert_usage_error(run_command("infer", "--run", tmp_path / "nothing"), "error: no run at")
    assert_usage_error(
        run_command("infer", "--run", run_copy, "--data", tmp_path / "none.parquet"), "error: no data at"
    )
    assert_usage_error(run_command("infer", "--run", run_copy, "--actors", "0"), "must be at least 1")
    assert not (run_copy / storage.PREDICTIONS).exists()


def test_training_that_keeps_failing_says_how_to_continue(run_copy):
    (run_copy / "data" / "train.parquet").unlink()  # every worker fails to read its shard
    done = run_command(
        "train", "--storage", run_copy.parent, "--name", run_copy.name, "--resume", "--epochs", 8, "--max-failures", 0
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()  # Ray's forwarded worker logs may come in between
    assert [line for line in lines if line.startswith("error: training failed: Training failed due to worker errors")]
    assert "the checkpoints are kept: continue with --name copy --resume" in lines


def test_error_text_is_one_bounded_line():
    assert one_line(ValueError("cannot\n  open\tfile")) == "cannot open file"
    long = one_line("x " * MAX_LINE)
    assert len(long) == MAX_LINE and long.endswith("...")
