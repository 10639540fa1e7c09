"""`python -m qml_ray.train`: train the QCNN with Ray Train across --workers workers.

The run folder (<storage>/<name>/) gets config.yaml and the data set first, then Ray
Train checkpoints, the metrics history and TensorBoard logs as training goes, and the
final weights once it is done.
"""

import json
import os
import posixpath
import shutil
import sys
import tempfile
import time

from qml_ray import checkpoints, claims, cli, config as config_lib, interrupts, runtime, storage
from qml_ray.errors import UsageError, one_line

STATE_TRACKING_ENV = "RAY_TRAIN_ENABLE_STATE_TRACKING"
START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
TRAIN_METRICS_ENV = "RAY_TRAIN_METRICS_ENABLED"
MIN_REPLACEMENT_WAIT_SECONDS = 60  # Ray Train's own default wait for a worker group to start
# Keys that define a run's data set and model: a resumed run must keep them.
FIXED_ON_RESUME = ("qubits", "layers", "examples", "test_fraction", "seed", "hidden_activation")


def parse_args(argv=None):
    parser = cli.ArgumentParser(
        prog="python -m qml_ray.train",
        description="Train the hybrid QCNN on Ray (Ray Train TensorflowTrainer + MultiWorkerMirroredStrategy).",
    )
    cli.add_config_flags(parser)
    parser.add_argument("--name", help="run name (default: a timestamp); the run folder is <storage>/<name>")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue run --name from its latest checkpoint to the configured epochs, "
        "or start it if it does not exist yet (so a rerun after a crash continues)",
    )
    cli.add_address_flag(parser)
    cli.add_verbose_flag(parser)
    return parser.parse_args(argv)


def locate_run(args) -> tuple[config_lib.Config, str]:
    """The config the file and flags ask for, and the run folder."""
    requested = cli.config_from_args(args)
    storage.check_reachable(requested.storage)
    if args.resume and not args.name:
        raise UsageError("--resume needs the --name of the run to continue")
    return requested, storage.run_dir(
        requested.storage, time.strftime("%Y%m%d-%H%M%S") if args.name is None else args.name
    )


def resolve_run(args, requested: config_lib.Config, run: str, found: bool) -> tuple[config_lib.Config, bool]:
    """The config to train with, and whether training continues the stored run (claimed by this
    command; `found`: it was there before)."""
    if not args.resume:
        if found:
            raise UsageError(f"run folder {run} already exists: choose another --name, or add --resume")
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
    stored = config_lib.of_run(run)
    resumed = (
        requested if args.config else config_lib.from_mapping({**config_lib.asdict(stored), **cli.overrides(args)})
    )
    changed = [key for key in FIXED_ON_RESUME if getattr(resumed, key) != getattr(stored, key)]
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


def prepare_run(config: config_lib.Config, run: str, resume: bool) -> None:
    """Write the resolved config, and on a new run first the data set every worker will read."""
    if not resume:
        from qml_ray import data

        data.write(config, run)
    storage.write_text(storage.join(run, storage.CONFIG), config.to_yaml())


def replacement_wait(config: config_lib.Config) -> float:
    """Seconds Ray Train waits, after losing workers, for the cluster to place them all again."""
    return max(config.capacity_timeout, MIN_REPLACEMENT_WAIT_SECONDS)


def fit(config: config_lib.Config, run: str, callbacks=(), console=None, new_run=False):
    """Run the Ray Train job, named after the run; Ray Train resumes from the run's checkpoints
    (<run>/checkpoints/, listed in <run>/checkpoint_manager_snapshot.json) when it holds any.
    Rank 0 says its lines to `console` (a console.Console), if given, else to its log; the
    workers of a `new_run` first have rank 0 write its data set and config (prepare_run).

    A lost worker (or its node) restarts the whole worker group from the latest checkpoint,
    up to `max_failures` times. If the cluster cannot place every worker again within
    `replacement_wait` seconds, training stops (raising TrainingFailedError): it never
    waits for capacity without end, and never continues with fewer workers.
    `callbacks`: Ray Train callbacks for the run (a sweep passes Tune's report callback)."""
    from ray.train import FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    from qml_ray.tf_backend import TFConfig
    from qml_ray.worker import train_worker

    os.environ.update(
        {  # read by Ray Train in this process, and passed on to its controller
            STATE_TRACKING_ENV: "1",  # the run and its attempts in the dashboard's Train view
            START_TIMEOUT_ENV: str(replacement_wait(config)),
        }
    )
    if not posixpath.basename(run).isascii():  # Ray Train tags its own metrics with the run's name: ASCII only
        os.environ[TRAIN_METRICS_ENV] = "0"
    filesystem, path = storage.pyarrow_filesystem(run)
    trainer = DataParallelTrainer(  # Ray's TensorflowTrainer, less its import of TensorFlow (tf_backend.py)
        train_worker,
        backend_config=TFConfig(),
        train_loop_config={"config": config_lib.asdict(config), "run": run, "console": console, "new_run": new_run},
        scaling_config=ScalingConfig(num_workers=config.workers, resources_per_worker={"CPU": config.cpus_per_worker}),
        run_config=RunConfig(
            name=posixpath.basename(path),  # the run's name, under which the dashboard shows it
            storage_path=posixpath.dirname(path),  # so Ray Train's folder is the run folder
            storage_filesystem=filesystem,
            failure_config=FailureConfig(max_failures=config.max_failures, controller_failure_limit=0),
            logging_config=LoggingConfig(log_level="WARNING"),
            callbacks=list(callbacks),
            worker_runtime_env={"env_vars": runtime.worker_env(config.cpus_per_worker, config.size_thread_pools)},
        ),
    )
    return trainer.fit()


def warn_idle_threads(config: config_lib.Config) -> None:
    """One line on stderr when the config's steps leave over 10% of a worker's threads idle (only
    when its thread pools are sized to its CPUs: else the node's cores decide)."""
    if not config.size_thread_pools:
        return
    train = config_lib.split_sizes(config)[0]
    if warning := runtime.thread_rounds_warning(train, config.workers, config.batch_size, config.cpus_per_worker):
        print(warning, file=sys.stderr, flush=True)


def failure_message(err: Exception, config: config_lib.Config) -> str:
    """One line on why training stopped."""
    from qml_ray.ray_internals import WorkerGroupStartupTimeoutError

    reason = err
    if isinstance(getattr(err, "controller_failure", None), WorkerGroupStartupTimeoutError):
        reason = (
            f"the cluster could not place all {config.workers} workers ({config.cpus_per_worker} CPU(s) each) "
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


def main(argv=None) -> None:
    args = parse_args(argv)
    requested, run = locate_run(args)
    with claims.claimed(run, "run") as found:
        interrupts.say_on_interrupt(f"continue with --name {posixpath.basename(run)} --resume")
        config, resuming = resolve_run(args, requested, run, found)
        train_run(args, config, run, resuming)


def train_run(args, config: config_lib.Config, run: str, resuming: bool) -> None:
    """Train the claimed run: check the cluster, write the config (and data), train, publish the weights."""
    done = published_epochs(run) if resuming else 0
    if done >= config.epochs:  # e.g. a job retried after it finished
        print(
            f"run {run} has already trained {done} epochs: its weights are in "
            f"{storage.join(run, storage.WEIGHTS)} (raise --epochs to train on)",
            flush=True,
        )
        return
    warn_idle_threads(config)
    runtime.connect(args.address, log_to_driver=args.verbose)
    runtime.require_capacity(
        config.workers,
        config.cpus_per_worker,
        "training workers",
        "lower --workers or --cpus-per-worker",
        config.capacity_timeout,
    )
    runtime.require_memory(
        config_lib.state_bytes(config.qubits, config.cpus_per_worker),
        f"a training worker's state vectors ({config.qubits} qubits, {config.cpus_per_worker} thread(s))",
        "lower --qubits or --cpus-per-worker",
    )
    storage.make_folder(run)
    print(f"run folder: {run}", flush=True)
    if resuming:  # else rank 0 writes the data set, which needs TFQ: this process need not import it
        prepare_run(config, run, resuming)
    from ray.train import TrainingFailedError

    from qml_ray.console import Console

    console = Console()
    try:
        with console.printing():
            result = interrupts.waited(fit, config, run, console=console, new_run=not resuming)
    except TrainingFailedError as err:  # failed more than max_failures times, or lost capacity for good
        print(f"error: {failure_message(err, config)}", file=sys.stderr)
        print(f"the checkpoints are kept: continue with --name {os.path.basename(run)} --resume", file=sys.stderr)
        sys.exit(1)
    weights = publish_weights(result.checkpoint, run)
    metrics = result.metrics or {}
    print(
        f"trained {config.epochs} epochs on {config.workers} worker(s): "
        f"val_accuracy {metrics.get('val_accuracy', float('nan')):.3f}; weights in {weights}",
        flush=True,
    )


if __name__ == "__main__":
    cli.run(main)
