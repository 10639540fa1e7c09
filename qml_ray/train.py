"""`python -m qml_ray.train` and `qml_ray.fit`: train a model with Ray Train across --workers workers.

The run folder (<storage>/<name>/) gets config.yaml and the record of its data (data.json, and
the QCNN's generated data set when it names no `data`) first, then Ray Train checkpoints, the
metrics history and TensorBoard logs as training goes, and the final weights once it is done.
"""

import functools
import json
import os
import posixpath
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from qml_ray import (
    checkpoints,
    choices,
    claims,
    cli,
    config as config_lib,
    contract,
    datasets,
    interrupts,
    runtime,
    storage,
)
from qml_ray.errors import UsageError, one_line
from qml_ray.worker_setup import TRAINING_WORKER_ENV

STATE_TRACKING_ENV = "RAY_TRAIN_ENABLE_STATE_TRACKING"
START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
TRAIN_METRICS_ENV = "RAY_TRAIN_METRICS_ENABLED"
# How often Ray Train asks, while an elastic run trains short of workers, whether more fit again: each
# time they do, it restarts the worker group, larger, from the latest checkpoint.
GROW_CHECK_SECONDS = 5
# Keys that define a run's data set and model: a resumed run must keep them.
FIXED_ON_RESUME = (
    "model",
    "params",
    "data",
    "validation_data",
    "qubits",
    "layers",
    "examples",
    "test_fraction",
    "seed",
    "hidden_activation",
)


@dataclass(frozen=True)
class Trained:
    """What a training gives back: the run folder and the final epoch's metrics."""

    run: str
    metrics: dict


class TrainingFailed(Exception):
    """Training of `run` stopped for good (the message is one line); its checkpoints are kept."""

    def __init__(self, message: str, run: str):
        super().__init__(message)
        self.run = run


def parse_args(argv=None):
    parser = cli.ArgumentParser(
        prog="python -m qml_ray.train",
        description="Train a TensorFlow Quantum model (by default the QCNN) on Ray: Ray Train workers under "
        "MultiWorkerMirroredStrategy, fed by Ray Data.",
    )
    cli.add_config_flags(parser)
    parser.add_argument("--name", help="run name (default: a timestamp); the run folder is <storage>/<name>")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue run --name from its latest checkpoint to the configured epochs, "
        "or start it if it does not exist yet (so a rerun after a crash continues); the run's stored config "
        "holds but for the keys given as flags or in --config's file, which win even at their default value "
        "(--epochs 50 sets a run trained to 60 back to 50)",
    )
    cli.add_address_flag(parser)
    cli.add_verbose_flag(parser)
    return parser.parse_args(argv)


def locate_run(requested: config_lib.Config, name: str | None, resume: bool) -> str:
    """The run folder of `name` (default: a timestamp) in `requested`'s storage."""
    storage.check_reachable(requested.storage)
    if resume and not name:
        raise UsageError("--resume needs the --name of the run to continue")
    return storage.run_dir(requested.storage, time.strftime("%Y%m%d-%H%M%S") if name is None else name)


def run_exists(run: str) -> UsageError:
    return UsageError(f"run folder {run} already exists: choose another --name, or add --resume")


def resolve_run(requested: config_lib.Config, run: str, resume: bool, found: bool) -> tuple[config_lib.Config, bool]:
    """The config to train with, and whether training continues the stored run (`found`: the run
    folder is there). Resuming, the stored config is taken with the keys `requested` was given
    (`config.given`: the flags, the --config file's keys), a default's value too."""
    if not resume:
        if found:
            raise run_exists(run)
        return requested, False
    if not storage.exists(storage.join(run, storage.CONFIG)):  # never started, or stopped before its config
        print(f"no run at {run} yet: starting it", flush=True)
        return requested, False
    if storage.exists(storage.join(run, storage.CHECKPOINTS, storage.CHECKPOINT_LIST)):
        raise UsageError(
            f"cannot resume {run}: an earlier qml_ray trained it, keeping Ray Train's checkpoint list in "
            f"{storage.CHECKPOINTS}/, and Ray Train would start it over; resume it with that version, "
            "or start a new run"
        )
    stored = config_lib.asdict(config_lib.of_run(run))
    resumed = config_lib.from_mapping(config_lib.overlaid(stored, config_lib.given(requested)))
    changed = [key for key in FIXED_ON_RESUME if getattr(resumed, key) != stored[key]]
    if changed:
        raise UsageError(f"cannot resume {run} with another {', '.join(changed)}: they define its data and model")
    checkpoints.newest_whole(run, say=lambda line: print(line, flush=True))  # fails when none is whole
    return resumed, True


def published_epochs(run: str) -> int:
    """Epochs trained into the run's published weights (0 when none are published)."""
    weights = storage.join(run, storage.WEIGHTS)
    if not storage.is_complete(weights):
        return 0
    return json.loads(storage.read_text(storage.join(weights, storage.STATE_FILE)))["epoch"]


def replacement_wait(config: config_lib.Config) -> float:
    """Seconds Ray Train waits, after losing workers, for the cluster to place them all again:
    `capacity_timeout`, or Ray Train's default when that is 0 (which fails at once only at the start)."""
    return config.capacity_timeout or config_lib.REPLACEMENT_WAIT_SECONDS


@dataclass(frozen=True)
class RunData:
    """What the workers train on, each split's rows, the labels' width and the data's columns (empty:
    the generated data set's, drawn by the workers). A data set within `data_in_memory_mb` is kept in
    memory: `shards` holds, per split, its table (a Ray object ref each worker shards), or is None when the workers
    draw the QCNN's data set themselves (a new run's generated one). A larger one streams from
    `datasets`, the splits' Ray Datasets, every epoch."""

    datasets: dict
    shards: dict | None
    rows: dict
    label_width: int
    in_memory: bool
    columns: tuple = ()


def check_data(config: config_lib.Config, run: str, resume: bool) -> None:
    """In the driver, before anything is written: the user's data (not the QCNN's generated set)
    is readable Parquet of circuits and labels, and, resuming, the data the run started on."""
    if not config.data:
        return
    train, validation = datasets.sources(config, run)
    recorded = datasets.read_manifest(run) if resume else None
    if recorded:
        datasets.require_unchanged(run, recorded, train, validation)


def prepare_data(config: config_lib.Config, run: str, model: Callable | None = None) -> RunData:
    """What the workers train on, and what a new run records (config.yaml, data.json, a model
    function given as a callable, and the QCNN's generated data set: drawn by the workers when
    kept in memory, else here, by a Ray task) or a resumed one reads back."""
    new = not storage.exists(storage.join(run, datasets.MANIFEST))
    drawn = not config.data and not storage.exists(storage.split_path(run, "validation"))
    if drawn and datasets.generated_fits_in_memory(config):
        rows = dict(zip(datasets.SPLITS, config_lib.split_sizes(config)))
        inputs = RunData(datasets={}, shards=None, rows=rows, label_width=1, in_memory=True)
    else:
        if drawn:
            generate_data(config, run)
        train, validation = datasets.sources(config, run)
        inputs = feed(config, train, validation)
        if new:
            datasets.write_manifest(run, datasets.manifest(config, train, validation, inputs.rows))
    for split, count in inputs.rows.items():
        if count < config.workers:
            raise UsageError(f"the {split} data has {count} row(s), fewer than the {config.workers} workers")
    if new and model is not None:
        contract.record(run, model)
    storage.write_text(storage.join(run, storage.CONFIG), config.to_yaml())
    return inputs


def feed(config: config_lib.Config, train: datasets.Source, validation: datasets.Source | None) -> RunData:
    """The data's splits for the workers: read here and handed over whole when kept in memory (no Ray
    Data pipeline; each worker takes its shard of however many workers there are), else the Ray
    Datasets they stream."""
    described = {"label_width": train.label_width, "columns": train.columns}
    if not datasets.fits_in_memory(config, train, validation):
        found, rows = datasets.for_training(config, train, validation)
        return RunData(datasets=found, shards=None, rows=rows, in_memory=False, **described)
    import ray

    tables = datasets.kept_splits(config, train, validation)
    shards = {split: ray.put(table) for split, table in tables.items()}
    rows = {split: table.num_rows for split, table in tables.items()}
    return RunData(datasets={}, shards=shards, rows=rows, in_memory=True, **described)


def generate_data(config: config_lib.Config, run: str) -> None:
    """The QCNN's excitation data set, drawn and written by a Ray task (drawing needs TFQ, which
    this process does not import)."""
    import ray

    write = ray.remote(_write_generated).options(num_cpus=1, runtime_env={"env_vars": runtime.worker_env(1)})
    ray.get(write.remote(config, run))


def _write_generated(config: config_lib.Config, run: str) -> None:
    from qml_ray import data

    data.write(config, run)


def fit(config: config_lib.Config, run: str, inputs: RunData, callbacks=(), console=None, model=None):
    """Run the Ray Train job, named after the run; Ray Train resumes from the run's checkpoints
    (<run>/checkpoints/, listed in <run>/checkpoint_manager_snapshot.json) when it holds any.
    Rank 0 says its lines to `console` (a console.Console), if given, else to its log. `model`:
    the model function as a callable (default: the config's MODULE:FUNCTION).

    A lost worker (or its node) restarts the whole worker group from the latest checkpoint,
    up to `max_failures` times. An elastic run restarts at once on the workers that fit (at least
    `min_workers`), and grows back to `workers` when they fit again. A fixed one waits for every
    worker: if the cluster cannot place them all again within `replacement_wait` seconds, training
    stops (raising TrainingFailedError): it never waits for capacity without end.
    `callbacks`: Ray Train callbacks for the run (a sweep passes Tune's report callback)."""
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    from qml_ray.tf_backend import TFConfig
    from qml_ray.worker import train_worker

    set_ray_train_env(config, run)
    trainer = DataParallelTrainer(  # Ray's TensorflowTrainer, less its import of TensorFlow (tf_backend.py)
        functools.partial(train_worker, job_for(config, run, inputs, console, model)),
        backend_config=TFConfig(),
        datasets=inputs.datasets,
        scaling_config=scaling_config(config),
        run_config=run_config(config, run, callbacks),
    )
    return trainer.fit()


def set_ray_train_env(config: config_lib.Config, run: str) -> None:
    """The env vars Ray Train reads in this process, and passes on to its controller."""
    os.environ.update(
        {
            STATE_TRACKING_ENV: "1",  # the run and its attempts in the dashboard's Train view
            START_TIMEOUT_ENV: str(replacement_wait(config)),
        }
    )
    if not posixpath.basename(run).isascii():  # Ray Train tags its own metrics with the run's name: ASCII only
        os.environ[TRAIN_METRICS_ENV] = "0"


def job_for(config: config_lib.Config, run: str, inputs: RunData, console, model: Callable | None):
    """The `worker.Job` every worker runs: the config, the run folder, its data, the console, the model."""
    from qml_ray.worker import Job

    return Job(
        config=config,
        run=run,
        rows=inputs.rows,
        label_width=inputs.label_width,
        in_memory=inputs.in_memory,
        shards=inputs.shards,
        console=console,
        model=model and contract.pickled(model),
        columns=inputs.columns,
    )


def scaling_config(config: config_lib.Config):
    """Ray Train's workers: a fixed count, or an elastic range checked for growth every GROW_CHECK_SECONDS."""
    from ray.train import ScalingConfig

    return ScalingConfig(
        num_workers=(config.fewest_workers, config.workers) if config.elastic else config.workers,
        resources_per_worker={"CPU": config.cpus_per_worker},
        elastic_resize_monitor_interval_s=GROW_CHECK_SECONDS,
    )


def run_config(config: config_lib.Config, run: str, callbacks=()):
    """Ray Train's run: named after the run folder, which is Ray Train's folder too; its retries, log level,
    callbacks and the training workers' env vars."""
    from ray.train import FailureConfig, LoggingConfig, RunConfig

    filesystem, path = storage.pyarrow_filesystem(run)
    return RunConfig(
        name=posixpath.basename(path),  # the run's name, under which the dashboard shows it
        storage_path=posixpath.dirname(path),  # so Ray Train's folder is the run folder
        storage_filesystem=filesystem,
        failure_config=FailureConfig(
            max_failures=config.max_failures,
            # An elastic run's group that could not be placed is sized again on what is left.
            controller_failure_limit=config.max_failures if config.elastic else 0,
        ),
        logging_config=LoggingConfig(log_level="WARNING"),
        callbacks=list(callbacks),
        worker_runtime_env={"env_vars": training_worker_env(config)},
    )


def training_worker_env(config: config_lib.Config) -> dict:
    """A training worker's env vars: its thread pools, the kernel plan's fixes and budget, and the mark that starts
    its imports early (worker_setup.py)."""
    plan = {choices.PLAN_VARIABLE: config.kernel_plan, choices.SECONDS_VARIABLE: str(config.plan_seconds)}
    return {**runtime.worker_env(config.cpus_per_worker, config.size_thread_pools), TRAINING_WORKER_ENV: "1", **plan}


def warn_idle_threads(config: config_lib.Config, train_rows: int | None = None) -> None:
    """One line on stderr when the config's steps over `train_rows` training rows (default: the
    generated data set's) leave over 10% of a worker's threads idle (only when its thread pools
    are sized to its CPUs: else the node's cores decide)."""
    if not config.size_thread_pools:
        return
    train = config_lib.split_sizes(config)[0] if train_rows is None else train_rows
    if warning := runtime.thread_rounds_warning(train, config.workers, config.batch_size, config.cpus_per_worker):
        print(warning, file=sys.stderr, flush=True)


def failure_message(err: Exception, config: config_lib.Config) -> str:
    """One line on why training stopped."""
    from qml_ray.ray_internals import WorkerGroupStartupTimeoutError

    reason = err
    if isinstance(getattr(err, "controller_failure", None), WorkerGroupStartupTimeoutError):
        wanted = f"{config.fewest_workers} (of {config.workers})" if config.elastic else f"all {config.workers}"
        reason = (
            f"the cluster could not place {wanted} workers ({config.cpus_per_worker} CPU(s) each) "
            f"within {replacement_wait(config):.0f} s: add nodes, raise --capacity-timeout or lower --workers"
        )
    return one_line(f"training failed: {reason}")


def publish_weights(checkpoint, run: str) -> str:
    """Copy a Ray Train checkpoint (the final one), less its TensorBoard logs, to <run>/weights/."""
    weights = storage.join(run, storage.WEIGHTS)
    with checkpoint.as_directory() as folder, tempfile.TemporaryDirectory() as copy:
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns(storage.SUMMARIES), dirs_exist_ok=True)
        storage.publish_dir(copy, weights)
    return weights


def train(
    config: config_lib.Config,
    name: str | None = None,
    resume: bool = False,
    address: str | None = None,
    verbose: bool = False,
    model: Callable | None = None,
) -> Trained:
    """Train run `name` (see `python -m qml_ray.train --help`): what the command and `qml_ray.fit`
    do. Bad input raises UsageError before anything is written; a training that fails for good,
    TrainingFailed (its checkpoints kept)."""
    if model is not None:
        config = config.replace(model=contract.name_of(model))
    locations = {
        key: storage.absolute(getattr(config, key)) for key in ("data", "validation_data") if getattr(config, key)
    }
    config = config.replace(**locations)
    run = locate_run(config, name, resume)
    claims.require_free(run, "run")
    config, resuming = resolve_run(config, run, resume, storage.exists(run))
    done = published_epochs(run) if resuming else 0
    if done >= config.epochs:  # e.g. a job retried after it finished
        print(
            f"run {run} has already trained {done} epochs: its weights are in "
            f"{storage.join(run, storage.WEIGHTS)} (raise --epochs to train on)",
            flush=True,
        )
        return Trained(run, {})
    model = model or contract.recorded(run)
    contract.check(config, model)
    check_data(config, run, resuming)
    with claims.claimed(run, "run") as found:  # nothing was written before, all is written after
        if found and not resume:  # another command made it meanwhile
            raise run_exists(run)
        interrupts.say_on_interrupt(f"continue with --name {posixpath.basename(run)} --resume")
        return train_claimed(config, run, resuming, address, verbose, model)


def train_claimed(
    config: config_lib.Config, run: str, resuming: bool, address: str | None, verbose: bool, model: Callable | None
) -> Trained:
    """Train the run this command has claimed: check the cluster, then train_in."""
    runtime.connect(address, log_to_driver=verbose)
    runtime.quiet_ray_data(verbose)
    runtime.require_capacity(
        config.fewest_workers,
        config.cpus_per_worker,
        "training workers",
        "lower --workers or --cpus-per-worker",
        config.capacity_timeout,
    )
    if config.model == config_lib.DEFAULT_MODEL:  # the QCNN's circuits are `qubits` wide: checked before writing
        runtime.require_state_memory(
            config.qubits, config.cpus_per_worker, "a training worker", "lower --qubits or --cpus-per-worker"
        )
    storage.make_folder(run)
    print(f"run folder: {run}", flush=True)
    try:
        return train_in(config, run, model)
    except UsageError:
        if not resuming:
            storage.remove_folder(run)
        raise


def train_in(config: config_lib.Config, run: str, model: Callable | None) -> Trained:
    """Train in run folder `run` (made, but for a resumed run empty) and publish its weights."""
    from ray.train import TrainingFailedError

    from qml_ray.console import Console

    inputs = prepare_data(config, run, model)
    warn_idle_threads(config, inputs.rows["train"])
    console = Console()
    try:
        with console.printing():
            result = interrupts.waited(fit, config, run, inputs, console=console, model=model)
    except TrainingFailedError as err:  # failed more than max_failures times, or lost capacity for good
        raise TrainingFailed(failure_message(err, config), run) from None
    weights = publish_weights(result.checkpoint, run)
    metrics = {key: value for key, value in (result.metrics or {}).items() if key != "finished_at"}
    shown = "  ".join(f"{key} {value:.3f}" for key, value in metrics.items() if key.startswith("val_"))
    trained = f"trained {config.epochs} epochs on {config.worker_range} worker(s)"
    print(f"{trained}: {shown}; weights in {weights}", flush=True)
    return Trained(run, metrics)


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        train(cli.config_from_args(args), args.name, args.resume, args.address, args.verbose)
    except TrainingFailed as err:
        print(f"error: {err}", file=sys.stderr)
        print(f"the checkpoints are kept: continue with --name {posixpath.basename(err.run)} --resume", file=sys.stderr)
        sys.exit(1)
    runtime.leave()


if __name__ == "__main__":
    cli.run(main)
