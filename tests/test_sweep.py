"""`python -m qml_ray.sweep`: real Ray Tune running real trainings of the smoke config, each trial
its own Ray Train run and run folder; stopped with Ctrl-C part way and resumed, which trials share
a data set, and every bad input. The sweep as a job on the multi-node cluster: test_multinode."""

import os
import re
import signal
from pathlib import Path

import pandas as pd
import pytest

from qml_ray import claims
from qml_ray.errors import UsageError

from conftest import SMOKE, run_command, wait_for
from holds import HOLD, HOLD_FILE, held_marker
from test_bad_input import CPUS, assert_usage_error
from test_faults import Command, contents, held, interrupt

EPOCHS = 4  # the smoke config's 6, shortened: checkpoints at epochs 2 and 4
SMALL = ("--config", SMOKE, "--workers", 1, "--epochs", EPOCHS)  # the sweep job's too (test_multinode)


def sweep_args(storage: Path, address: str) -> list:
    """Two trials side by side on the cluster at `address`, one of 3 epochs and one of 8, held (given a
    hold file) at the longer one's 4th epoch, past its first checkpoint (epoch 2)."""
    options = ("--grid", "epochs=3,8", "--checkpoint-every", 2, *HOLD, "--address", address)
    return [*SMALL, *options, "--storage", storage, "--name", "k"]


@pytest.mark.slow  # a training
def test_ctrl_c_stops_the_sweep_at_once_and_resume_continues_it(tmp_path, shared_ray):
    """Ctrl-C once the shorter trial has finished and the longer is held past its first checkpoint: the
    command exits at once, saying how to continue, and nothing more is written. --resume keeps the first
    trial and continues the second from that checkpoint; joining, it releases whatever the interrupted
    job left reserved on the cluster (shared_ray checks that nothing is)."""
    first, second, hold = tmp_path / "k/epochs=3-seed=7", tmp_path / "k/epochs=8-seed=7", tmp_path / HOLD_FILE
    sweep = Command("sweep", *sweep_args(tmp_path, shared_ray), env=held(hold, epochs=3))
    first_done, second_held = (first / "weights/_COMPLETE").is_file, held_marker(hold).exists
    try:
        wait_for(
            lambda: (first_done() and second_held()) or sweep.process.poll() is not None,
            "the first done, the second held",
        )
        assert first_done() and sweep.process.poll() is None, sweep.end().stderr[-3000:]
        held_trial = contents(second)
        ended = interrupt(sweep, signal.SIGINT, hold, "sweep")
    finally:
        if sweep.process.poll() is None:  # failed before its Ctrl-C: nothing of it may hold the cluster
            sweep.signal(signal.SIGKILL)

    ended.assert_clean(128 + signal.SIGINT, "interrupted: continue with --name k --resume")
    assert contents(second) == held_trial  # Ray's processes ignore Ctrl-C: the trial, held, wrote nothing more
    assert not (second / "weights").exists() and not (tmp_path / "k/results.csv").exists()
    assert not list(tmp_path.rglob(".tmp-*")) and not list(tmp_path.rglob(claims.CLAIM))
    finished = (first / "weights/_COMPLETE").stat().st_mtime_ns, (first / "metrics.csv").read_text()
    before = pd.read_csv(second / "metrics.csv")
    assert before["epoch"].tolist() == [1, 2, 3]

    hold.unlink()
    done = run_command("sweep", *sweep_args(tmp_path, shared_ray), "--resume", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert finished == ((first / "weights/_COMPLETE").stat().st_mtime_ns, (first / "metrics.csv").read_text())
    after = pd.read_csv(second / "metrics.csv")
    assert after["epoch"].tolist() == list(range(1, 9))
    assert after["finished_at"].iloc[:2].tolist() == before["finished_at"].iloc[:2].tolist()  # kept, not retrained
    assert (second / "weights/_COMPLETE").is_file()
    table = pd.read_csv(tmp_path / "k/results.csv")
    assert len(table) == 2 and set(table["state"]) == {"finished"}
    assert "trial epochs=8-seed=7: finished, 8 epochs" in done.stdout
    firsts = [line.split()[0] for line in done.stdout.splitlines()]  # its own lines only, none of Tune's
    assert firsts == ["sweep", "trial", "trial", "results:", "best"], done.stdout


@pytest.mark.slow  # a training
def test_a_trial_that_dies_before_its_first_report_is_named_failed(tmp_path, shared_ray):
    """The re-uploading example (classical features, no circuit column): a trial whose Tune function
    fails before Tune has a result of it (here: a test fraction that leaves fewer validation rows than
    workers, found as the trial starts; the two trials of one worker each side by side) is a failed row of
    the results, named with its error, beside the trial that trained; the command ends in its usual lines."""
    from examples import reuploading

    reuploading.make_data(str(tmp_path / "circle"))
    data = ("--model", "examples.reuploading:classifier", "--data", tmp_path / "circle", "--epochs", 2, "--workers", 1)
    options = ("--grid", "test_fraction=0.3,0.001", "--storage", tmp_path, "--name", "d", "--address", shared_ray)
    done = run_command("sweep", "--config", SMOKE, *data, *options, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    states = pd.read_csv(tmp_path / "d/results.csv").set_index("trial")["state"]
    assert states["test_fraction=0.3-seed=7"] == "finished"
    failed = r"failed: the validation data has 0 row\(s\), fewer than the 1 workers"
    assert re.fullmatch(failed, states["test_fraction=0.001-seed=7"])
    history = pd.read_csv(tmp_path / "d/test_fraction=0.3-seed=7/metrics.csv")
    assert history["epoch"].tolist() == [1, 2] and history["accuracy"].notna().all()
    assert "trial test_fraction=0.001-seed=7: failed: the validation data has" in done.stdout, done.stdout
    assert done.stderr.splitlines()[-2:] == [
        "error: 1 of 2 trials failed",
        "rerun the command with --resume (--name d) to retry them",
    ]


@pytest.mark.slow  # two trainings
def test_seeds_run_one_at_a_time_and_early_stopping_stops_the_worse(tmp_path, shared_ray):
    """--seeds 2: a trial per seed; --max-concurrent 1: the second starts after the first ends, where the
    cluster holds both; --early-stop val_loss: ASHA's rungs (epochs 2 and 8 of 12, checkpoints every 2)
    stop the later trial at the first where its val_loss is worse than the earlier's there, else it trains on."""
    options = ("--seeds", 2, "--max-concurrent", 1, "--early-stop", "val_loss", "--checkpoint-every", 2)
    options += ("--epochs", 12, "--storage", tmp_path, "--name", "s", "--address", shared_ray)
    done = run_command("sweep", *SMALL, *options, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 trial(s), up to 1 at a time" in done.stdout
    runs = [pd.read_csv(tmp_path / "s" / f"seed={seed}" / "metrics.csv").set_index("epoch") for seed in (7, 8)]
    earlier, later = sorted(runs, key=lambda run: run["finished_at"].iloc[0])
    assert later["finished_at"].iloc[0] - later["epoch_seconds"].iloc[0] > earlier["finished_at"].iloc[-1]
    assert earlier.index.tolist() == list(range(1, 13))
    rung = next((epoch for epoch in (2, 8) if later["val_loss"][epoch] > earlier["val_loss"][epoch]), None)
    states = sorted(pd.read_csv(tmp_path / "s/results.csv")["state"])
    if rung is None:
        assert later.index.tolist() == list(range(1, 13)) and states == ["finished", "finished"]
    else:  # stopped at the rung, or soon after it (the trial trains on while Tune stops it)
        assert rung <= len(later) < 12 and later.index.tolist() == list(range(1, len(later) + 1))
        assert states == ["finished", f"stopped early at epoch {len(later)}"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--grid", "learning_rat=0.1,0.2"], "error: --grid learning_rat=0.1,0.2: unknown config key 'learning_rat'"),
        (["--grid", "learning_rate=0.1,-1"], "error: trial learning_rate=-1, seed=7: learning_rate must be"),
        (["--grid", "layers=1,two"], "error: trial layers=two, seed=7: layers must be a whole number, got 'two'"),
        (["--grid", "learning_rate="], "error: --grid learning_rate=: give one or more comma-separated values"),
        (["--grid", "learning_rate"], "error: --grid takes KEY=VALUE,VALUE,..., got 'learning_rate'"),
        (["--grid", "storage=a,b"], "error: --grid storage=a,b: storage cannot be swept"),
        (["--seeds", "0"], "error: --seeds must be at least 1"),
        (["--grid", "seed=1,2", "--seeds", "2"], "error: give seeds with --seeds or with --grid seed=..., not both"),
        (["--early-stop", "speed"], "error: argument --early-stop: invalid choice: 'speed'"),
    ],
)
def test_bad_sweeps(tmp_path, in_process, args, message):
    """Found before the sweep joins Ray: run in this process."""
    done = in_process("sweep", "--config", SMOKE, "--storage", tmp_path / "runs", *args)
    assert_usage_error(done, message)
    assert not (tmp_path / "runs").exists()


def test_a_trial_larger_than_the_cluster_is_refused(tmp_path, shared_ray):
    options = ("--cpus-per-worker", CPUS + 1, "--storage", tmp_path / "runs", "--address", shared_ray)
    done = run_command("sweep", "--config", SMOKE, *options)
    assert_usage_error(done, "not 2 worker(s) for one trial: lower --workers or --cpus-per-worker")
    assert not (tmp_path / "runs").exists()


def test_a_grid_over_model_parameters_makes_trials_of_params(tmp_path, monkeypatch):
    from qml_ray import sweep

    (tmp_path / "models.py").write_text("def build(depth=1, scale=1.0, learning_rate=0.01):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    grid = ("--grid", "param.depth=1,2", "--grid", "learning_rate=0.1,0.2", "--param", "scale=0.5")
    args = sweep.parse_args(["--model", "models:build", *grid, "--storage", str(tmp_path), "--name", "s"])
    folder, trials = sweep.plan(args)
    assert [trial.name for trial in trials] == [
        f"param.depth={depth}-learning_rate={rate}-seed=0" for depth in (1, 2) for rate in (0.1, 0.2)
    ]
    assert [(t.config.params, t.config.learning_rate) for t in trials][1] == ({"depth": 1, "scale": 0.5}, 0.2)
    assert trials[3].run == f"{folder}/param.depth=2-learning_rate=0.2-seed=0"
    with pytest.raises(UsageError, match="takes no parameter 'width'"):
        sweep.plan(sweep.parse_args(["--model", "models:build", "--grid", "param.width=1,2"]))


@pytest.fixture
def joined(shared_ray):
    """This process joined to the shared Ray as the sweep's driver joins it (not whatever Ray a bare
    ray.init() would find); after the test, left with its signal handlers as they were."""
    import ray

    from qml_ray import runtime

    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    runtime.connect(shared_ray, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def test_trials_with_the_same_seed_share_one_data_set(tmp_path, joined):
    """On disk (hard links), whatever their learning rate; another seed draws its own (in a Ray task, as the
    sweep's driver draws them)."""
    from qml_ray import sweep

    grid = ("--grid", "learning_rate=0.05,0.1", "--seeds", 2, "--storage", tmp_path, "--name", "s")
    _, trials = sweep.plan(sweep.parse_args([*map(str, (*SMALL, *grid))]))
    sweep.prepare(trials)
    runs = {trial.name: Path(trial.run) for trial in trials}
    same_seed = runs["learning_rate=0.05-seed=7"], runs["learning_rate=0.1-seed=7"]
    assert os.path.samefile(same_seed[0] / "data/test.parquet", same_seed[1] / "data/test.parquet")
    assert not os.path.samefile(
        same_seed[0] / "data/test.parquet", runs["learning_rate=0.05-seed=8"] / "data/test.parquet"
    )
    assert all((run / "config.yaml").is_file() for run in runs.values())


@pytest.mark.slow  # a training
def test_ray_tune_leaves_the_callers_environment_and_folder_as_it_found_them(tmp_path, joined):
    """Tune's settings (environment variables, the working folder) are the sweep's own: a script or
    notebook that runs the trials in its process carries none of them on."""
    from qml_ray import sweep

    folder, trials = sweep.plan(sweep.parse_args([*map(str, (*SMALL, "--epochs", 1, "--storage", tmp_path))]))
    sweep.prepare(trials)
    found = dict(os.environ), os.getcwd()
    grid = sweep.run_tune(folder, trials, 1, sweep.DEFAULT_METRIC, early_stop=False, resume=False)
    assert (dict(os.environ), os.getcwd()) == found
    [result] = grid
    assert result.error is None and result.metrics["epoch"] == 1


def test_existing_sweep_needs_resume_and_the_same_trials(tmp_path):
    sweep = tmp_path / "taken"
    sweep.mkdir()
    done = run_command("sweep", *map(str, SMALL), "--storage", tmp_path, "--name", "taken")
    assert_usage_error(done, f"error: sweep folder {sweep} already exists: choose another --name, or add --resume")
    (sweep / "sweep.yaml").write_text("early_stop: null\ntrials: {}\n")
    done = run_command("sweep", *map(str, SMALL), "--storage", tmp_path, "--name", "taken", "--resume")
    assert_usage_error(done, "error: cannot resume")
    assert [p.name for p in sweep.iterdir()] == ["sweep.yaml"]
