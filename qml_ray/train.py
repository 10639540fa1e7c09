"""`python -m qml_ray.train`: train the QCNN with Ray Train across --workers workers.

The run folder (<storage>/<name>/) gets config.yaml and the data set first, then Ray
Train checkpoints, the metrics history and TensorBoard logs as training goes, and the
final weights once it is done.
"""

import os
import sys
import time

from qml_ray import cli, config as config_lib, runtime, storage
from qml_ray.errors import UsageError

# Keys that define a run's data set and model: a resumed run must keep them.
FIXED_ON_RESUME = ("qubits", "layers", "examples", "test_fraction", "seed")


def parse_args(argv=None):
    parser = cli.ArgumentParser(
        prog="python -m qml_ray.train",
        description="Train the hybrid QCNN on Ray (Ray Train TensorflowTrainer + MultiWorkerMirroredStrategy).",
    )
    cli.add_config_flags(parser)
    parser.add_argument("--name", help="run name (default: a timestamp); the run folder is <storage>/<name>")
    parser.add_argument("--resume", action="store_true",
                        help="continue run --name from its latest checkpoint to the configured epochs")
    cli.add_address_flag(parser)
    return parser.parse_args(argv)


def resolve_run(args) -> tuple[config_lib.Config, str]:
    """The config to train with and the run folder, checked against what is already stored."""
    requested = cli.config_from_args(args)
    storage.check_reachable(requested.storage)
    if args.resume and not args.name:
        raise UsageError("--resume needs the --name of the run to continue")
    run = storage.run_dir(requested.storage, args.name or time.strftime("%Y%m%d-%H%M%S"))
    if not args.resume:
        if storage.exists(run):
            raise UsageError(f"run folder {run} already exists: choose another --name, or add --resume")
        return requested, run
    stored = config_lib.of_run(run)
    resumed = requested if args.config else config_lib.from_mapping(
        {**config_lib.asdict(stored), **cli.overrides(args)})
    changed = [key for key in FIXED_ON_RESUME if getattr(resumed, key) != getattr(stored, key)]
    if changed:
        raise UsageError(f"cannot resume {run} with another {', '.join(changed)}: they define its data and model")
    return resumed, run


def prepare_run(config: config_lib.Config, run: str, resume: bool) -> None:
    """Write the resolved config, and on a new run the data set every worker will read."""
    if not resume:
        from qml_ray import data

        data.write(config, run)
    storage.write_text(storage.join(run, storage.CONFIG), config.to_yaml())


def fit(config: config_lib.Config, run: str):
    """Run the Ray Train job; Ray Train resumes from <run>/checkpoints/ when it holds any."""
    from ray.train import FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    from qml_ray.worker import train_worker

    filesystem, path = storage.pyarrow_filesystem(run)
    trainer = TensorflowTrainer(
        train_worker,
        train_loop_config={"config": config_lib.asdict(config), "run": run},
        scaling_config=ScalingConfig(num_workers=config.workers,
                                     resources_per_worker={"CPU": config.cpus_per_worker}),
        run_config=RunConfig(name=storage.CHECKPOINTS, storage_path=path, storage_filesystem=filesystem,
                             failure_config=FailureConfig(max_failures=config.max_failures),
                             logging_config=LoggingConfig(log_level="WARNING"),
                             worker_runtime_env={"env_vars": runtime.worker_env(config.cpus_per_worker)}),
    )
    return trainer.fit()


def publish_weights(result, run: str) -> str:
    """Copy the final checkpoint's weights to <run>/weights/."""
    weights = storage.join(run, storage.WEIGHTS)
    with result.checkpoint.as_directory() as folder:
        storage.publish_dir(folder, weights)
    return weights


def main(argv=None) -> None:
    args = parse_args(argv)
    config, run = resolve_run(args)
    runtime.connect(args.address)
    runtime.require_capacity(config.workers, config.cpus_per_worker, "training workers",
                             "lower --workers or --cpus-per-worker", config.capacity_timeout)
    print(f"run folder: {run}", flush=True)
    prepare_run(config, run, args.resume)
    from ray.train import TrainingFailedError

    try:
        result = fit(config, run)
    except TrainingFailedError as err:  # workers failed more than max_failures times
        print(f"error: training failed: {' '.join(str(err).split())[:500]}", file=sys.stderr)
        print(f"the checkpoints are kept: continue with --name {os.path.basename(run)} --resume", file=sys.stderr)
        sys.exit(1)
    weights = publish_weights(result, run)
    metrics = result.metrics or {}
    print(f"trained {config.epochs} epochs on {config.workers} worker(s): "
          f"val_accuracy {metrics.get('val_accuracy', float('nan')):.3f}; weights in {weights}", flush=True)


if __name__ == "__main__":
    cli.run(main)
