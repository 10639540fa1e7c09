"""`python -m qml_ray.sweep`: a hyperparameter sweep, every trial a full qml_ray training.

Every combination of the --grid values, times --seeds seeds, is one trial. Ray Tune runs the
trials, as many side by side as the cluster holds (capped by --max-concurrent); each trial is a
Ray Tune function that launches its own Ray Train run (`train.fit`) into an ordinary run folder,
<storage>/<sweep>/<trial>/. The sweep's folder also holds Tune's state (tune/), the sweep's
trials (sweep.yaml), and, at the end, results.csv, results.md and curves.png.
"""

import itertools
import logging
import os
import posixpath
import sys
import time
from dataclasses import dataclass

import yaml
from ray import tune
from ray.tune.progress_reporter import TrialProgressCallback

from qml_ray import claims, cli, config as config_lib, contract, datasets, interrupts, results, runtime, storage, train
from qml_ray.errors import UsageError, one_line

TUNE_DIR = "tune"  # Ray Tune's experiment state, within the sweep's folder
SPEC = "sweep.yaml"  # the sweep's trials and early stopping, checked on --resume
DEFAULT_METRIC = "val_loss"
# Keys that define a data set (data.generate reads these): trials sharing them share one.
DATA_KEYS = ("qubits", "examples", "test_fraction", "seed")
NOT_SWEPT = ("storage", "params")  # the sweep's folder holds its trials; params are swept one by one
PARAM = "param."  # --grid param.NAME=...: a parameter of the model function
# What a trial's driver (the Tune function that runs its Ray Train run) reserves: no CPU, so the
# CPUs go to the trials' workers, and some memory, since Tune needs a resource to place it.
DRIVER_RESOURCES = {"cpu": 0, "memory": 300 * 2**20}
TRIAL_RETRIES = 2  # Tune's restarts of a failed trial, each continuing from its checkpoints


@dataclass(frozen=True)
class Trial:
    name: str
    keys: dict  # the swept keys and their values
    config: config_lib.Config
    run: str  # its run folder


def parse_args(argv=None):
    parser = cli.ArgumentParser(
        prog="python -m qml_ray.sweep",
        description="Sweep config keys with Ray Tune: every combination of the --grid values times "
        "--seeds seeds is one trial, a full qml_ray training (its own Ray Train run) with its own run folder.",
    )
    cli.add_config_flags(parser)
    sweep = parser.add_argument_group("sweep")
    sweep.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=VALUE,VALUE,...",
        help="a config key, or param.NAME for a parameter of the model function, and the values to try "
        "(read as the config file reads them); repeat for more keys",
    )
    sweep.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help="run every combination with N seeds: the config's seed, seed + 1, ... [default: 1]",
    )
    sweep.add_argument("--name", help="sweep name (default: a timestamp); the sweep's folder is <storage>/<name>")
    sweep.add_argument(
        "--max-concurrent",
        type=int,
        metavar="N",
        help="run at most N trials at a time (default: as many as the cluster's CPUs hold; on an "
        "autoscaling cluster, with --capacity-timeout, N trials are started and wait for their nodes)",
    )
    sweep.add_argument(
        "--early-stop",
        choices=results.EARLY_STOP_METRICS,
        metavar="METRIC",
        help="stop weak trials early with Tune's ASHA scheduler, judged on METRIC "
        f"({', '.join(results.EARLY_STOP_METRICS)}) at epochs checkpoint_every x 4^k; the results are ranked by it "
        f"[default: no early stopping, ranked by {DEFAULT_METRIC}]",
    )
    sweep.add_argument(
        "--resume",
        action="store_true",
        help="continue sweep --name: finished trials are kept, unfinished ones continue from their checkpoints",
    )
    cli.add_address_flag(parser)
    return parser.parse_args(argv)


def parse_grid(specs: list[str]) -> dict[str, list]:
    """{key: values} from --grid KEY=VALUE,VALUE,... flags (values as YAML reads them)."""
    grid = {}
    for spec in specs:
        key, equals, values = spec.partition("=")
        key = key.strip()
        key = key if key.startswith(PARAM) else key.replace("-", "_")
        if not equals or not key or key == PARAM:
            raise UsageError(f"--grid takes KEY=VALUE,VALUE,..., got {spec!r}")
        if key not in config_lib.FIELDS and not key.startswith(PARAM):
            raise UsageError(f"--grid {spec}: unknown config key {key!r} (a model parameter is param.NAME)")
        if key in NOT_SWEPT:
            raise UsageError(f"--grid {spec}: {key} cannot be swept (the sweep's folder holds its trials)")
        if key in grid:
            raise UsageError(f"--grid {key} is given twice: give all its values in one flag")
        texts = [text.strip() for text in values.split(",")]
        if not any(texts) or not all(texts):
            raise UsageError(f"--grid {spec}: give one or more comma-separated values")
        if len(set(texts)) < len(texts):
            raise UsageError(f"--grid {spec}: a value is repeated")
        grid[key] = [yaml.safe_load(text) for text in texts]
    return grid


def plan(args) -> tuple[str, list[Trial]]:
    """The sweep's folder and its trials, every trial's config validated; nothing is written."""
    base = cli.config_from_args(args)
    grid = parse_grid(args.grid)
    if args.seeds < 1:
        raise UsageError("--seeds must be at least 1")
    if args.seeds > 1 and "seed" in grid:
        raise UsageError("give seeds with --seeds or with --grid seed=..., not both")
    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise UsageError("--max-concurrent must be at least 1")
    if args.resume and not args.name:
        raise UsageError("--resume needs the --name of the sweep to continue")
    sweep = storage.run_dir(base.storage, time.strftime("%Y%m%d-%H%M%S") if args.name is None else args.name)
    seeds = {} if "seed" in grid else {"seed": [base.seed + i for i in range(args.seeds)]}
    trials = []
    for values in itertools.product(*grid.values(), *seeds.values()):
        changes = dict(zip([*grid, *seeds], values))
        try:
            config = trial_config(base, changes, sweep)
            contract.check(config)
        except UsageError as err:
            shown = ", ".join(f"{key}={value}" for key, value in changes.items())
            raise UsageError(f"trial {shown}: {err}") from None
        keys = {
            key: config.params[key[len(PARAM) :]] if key.startswith(PARAM) else getattr(config, key) for key in changes
        }
        name = "-".join(f"{key}={_shown(value)}" for key, value in keys.items())
        trials.append(Trial(name, keys, config, storage.run_dir(sweep, name)))
    if len({trial.name for trial in trials}) < len(trials):
        raise UsageError("two --grid values give the same config value (e.g. 1 and 1.0): give each once")
    return sweep, trials


def trial_config(base: config_lib.Config, changes: dict, sweep: str) -> config_lib.Config:
    """The base config with a trial's values (param.NAME ones into params), stored in the sweep."""
    keys = {key: value for key, value in changes.items() if not key.startswith(PARAM)}
    params = {key[len(PARAM) :]: value for key, value in changes.items() if key.startswith(PARAM)}
    values = config_lib.asdict(base)
    return config_lib.from_mapping({**values, **keys, "params": {**values["params"], **params}, "storage": sweep})


def _shown(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def check_folder(sweep: str, spec: dict, resume: bool, found: bool) -> bool:
    """Whether the sweep continues a stored one (`found`: its folder was there); raises UsageError
    when it cannot."""
    stored = storage.join(sweep, SPEC)
    if not resume:
        if found:
            raise UsageError(f"sweep folder {sweep} already exists: choose another --name, or add --resume")
        return False
    if not storage.exists(stored):
        print(f"no sweep at {sweep} yet: starting it", flush=True)
        return False
    if yaml.safe_load(storage.read_text(stored)) != spec:
        raise UsageError(
            f"cannot resume {sweep} with other trials or early stopping: give the command it was started with"
        )
    return True


def side_by_side(trials: list[Trial], max_concurrent: int | None) -> int:
    """How many trials run at once: as many as the cluster can place the workers of (each trial
    needs workers x cpus_per_worker), at most --max-concurrent; with capacity_timeout, every
    trial's workers may wait for an autoscaler that long, so --max-concurrent is taken as given."""
    needs = {(trial.config.workers, trial.config.cpus_per_worker) for trial in trials}
    timeout = max(trial.config.capacity_timeout for trial in trials)
    remedy = "lower --workers or --cpus-per-worker"
    fits = min(
        runtime.require_capacity(workers, cpus, "worker(s) for one trial", remedy, timeout) // workers
        for workers, cpus in needs
    )
    if max_concurrent and timeout > 0:
        return min(max_concurrent, len(trials))
    return min(fits, max_concurrent or fits, len(trials))


def prepare(trials: list[Trial]) -> None:
    """Each trial's config.yaml and, for the QCNN's generated data, its data set; trials with the same
    data keys share one data set, generated and written once (the others link to it), and what a
    resumed sweep has is kept. A data set is drawn by a Ray task (train.generate_data), so that the driver
    imports no TFQ."""
    groups = itertools.groupby(
        sorted(trials, key=lambda t: [getattr(t.config, k) for k in DATA_KEYS]),
        key=lambda t: [getattr(t.config, k) for k in DATA_KEYS],
    )
    for _, group in groups:
        source = None
        for trial in group:
            if not trial.config.data and not storage.exists(storage.split_path(trial.run, "validation")):
                if source is None:
                    train.generate_data(trial.config, trial.run)
                else:
                    for split in datasets.SPLITS:
                        storage.share(storage.split_path(source, split), storage.split_path(trial.run, split))
            source = source or trial.run
            if not storage.exists(storage.join(trial.run, storage.CONFIG)):
                storage.write_text(storage.join(trial.run, storage.CONFIG), trial.config.to_yaml())


def run_trial(params: dict) -> None:
    """Ray Tune's function for one trial: train its run folder with Ray Train, reporting every
    epoch to Tune, and publish the weights (a trial already trained is left as it is)."""
    from ray.tune.integration.ray_train import TuneReportCallback

    trial = params["trial"]
    config, run = config_lib.from_mapping(trial["config"]), trial["run"]
    if train.published_epochs(run) >= config.epochs:
        return
    result = train.fit(config, run, train.prepare_data(config, run), callbacks=[TuneReportCallback()])
    train.publish_weights(result.checkpoint, run)


def trial_name(trial) -> str:
    """Tune's name, and folder name under tune/, of a trial: the sweep's. (A trial's Result has its
    config only once the trial has reported: a failed trial's result is named by its folder.)"""
    return trial.config["trial"]["name"]


def error_text(error: BaseException) -> str:
    """A failed trial's error in one line: the trial function's own exception, not Ray's wrapping."""
    return one_line(getattr(error, "cause", None) or error)


def trial_error(trial) -> BaseException | str | None:
    """A failed trial's error: Tune's own copy, written in the trial's local folder as it fails (the
    sweep's storage gets it only at Tune's next sync), else the one in storage; None when Tune itself
    ended the trial."""
    from ray import cloudpickle

    if trial.pickled_error_file and os.path.exists(trial.pickled_error_file):
        with open(trial.pickled_error_file, "rb") as file:
            return cloudpickle.load(file)
    return trial.get_pickled_error() or trial.get_error()


class TrialLines(TrialProgressCallback):
    """Prints one line per trial as it finishes, stops early or fails: in place of Tune's own progress
    lines (a progress callback given, Tune adds none), whose "Trial ... completed" came even at verbose=0
    for every trial finished before a --resume."""

    def __init__(self, trials: list[Trial], metric: str):
        super().__init__()
        self.trials, self.metric = {trial.name: trial for trial in trials}, metric

    def on_trial_result(self, iteration, trials, trial, result, **info):
        pass

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.print(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        error = trial_error(trial)
        self.print(trial, error_text(error) if error else "failed")

    def print(self, trial, error: str = "") -> None:
        print(results.line(trial_row(self.trials[trial_name(trial)], error), self.metric), flush=True)


def trial_row(trial: Trial, error: str = "") -> dict:
    return results.trial_row(trial.name, trial.keys, trial.run, trial.config.epochs, error)


def run_tune(sweep: str, trials: list[Trial], at_once: int, metric: str, early_stop: bool, resume: bool):
    """Run (or, resuming, continue) the trials with Ray Tune; return its ResultGrid. The process's
    environment and working folder, which Tune's settings below change, are put back after."""
    with runtime.process_as_found():
        return tune_trials(sweep, trials, at_once, metric, early_stop, resume)


def tune_trials(sweep: str, trials: list[Trial], at_once: int, metric: str, early_stop: bool, resume: bool):
    """run_tune's work: Tune's settings made, then its trials run."""
    from ray.tune.schedulers import ASHAScheduler

    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # Tune's older console output, silent at verbose=0
    # No CSV, JSON and TensorBoard loggers of Tune's: each trial's run folder has its metrics, and
    # tensorboardX's imports (TensorFlow, Cloud Storage's client) printed their warnings on the console.
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    # Tune resolves its result paths against the working directory, and under `ray job submit`
    # Ray may delete and recreate the job's while no process of it holds it: stand where nothing
    # moves (every path here is absolute).
    os.chdir("/")
    logging.getLogger("ray.tune").setLevel(logging.CRITICAL)  # failures are told by TrialLines and results
    filesystem, path = storage.pyarrow_filesystem(sweep)
    trainable = tune.with_resources(run_trial, DRIVER_RESOURCES)
    experiment = storage.join(path, TUNE_DIR)
    if resume and tune.Tuner.can_restore(experiment, storage_filesystem=filesystem):
        tuner = tune.Tuner.restore(
            experiment, trainable, resume_unfinished=True, resume_errored=True, storage_filesystem=filesystem
        )
        return tuner.fit()
    scheduler = None
    if early_stop:
        epochs = max(trial.config.epochs for trial in trials)
        grace = min(min(trial.config.checkpoint_every for trial in trials), epochs)
        scheduler = ASHAScheduler(
            metric=metric, mode=results.mode(metric), time_attr="epoch", max_t=epochs, grace_period=grace
        )
    tuner = tune.Tuner(
        trainable,
        param_space={
            "trial": tune.grid_search(
                [{"name": t.name, "config": config_lib.asdict(t.config), "run": t.run} for t in trials]
            )
        },
        tune_config=tune.TuneConfig(
            max_concurrent_trials=at_once,
            scheduler=scheduler,
            trial_name_creator=trial_name,
            trial_dirname_creator=trial_name,
        ),
        run_config=tune.RunConfig(
            name=TUNE_DIR,
            storage_path=path,
            storage_filesystem=filesystem,
            callbacks=[TrialLines(trials, metric)],
            # A trial whose driver fails (e.g. Ray Train 2.60's placement group cleaner taking a live
            # run's controller for dead, seen under heavy load) runs again from its checkpoints.
            failure_config=tune.FailureConfig(max_failures=TRIAL_RETRIES),
            verbose=0,
        ),
    )
    return tuner.fit()


def main(argv=None) -> None:
    args = parse_args(argv)
    sweep, trials = plan(args)
    storage.check_reachable(sweep)
    train.check_data(trials[0].config, trials[0].run, resume=False)
    with claims.claimed(sweep, "sweep") as found:
        interrupts.say_on_interrupt(f"continue with --name {posixpath.basename(sweep)} --resume")
        run_sweep(args, sweep, trials, found)
    runtime.leave()


def run_sweep(args, sweep: str, trials: list[Trial], found: bool) -> None:
    """Run the claimed sweep's trials (`found`: its folder was there), then write and print its results."""
    metric = args.early_stop or DEFAULT_METRIC
    spec = {
        "early_stop": args.early_stop,
        "trials": {trial.name: config_lib.asdict(trial.config) for trial in trials},
    }
    resuming = check_folder(sweep, spec, args.resume, found)
    runtime.connect(args.address, log_to_driver=False)
    at_once = side_by_side(trials, args.max_concurrent)
    print(f"sweep folder: {sweep}: {len(trials)} trial(s), up to {at_once} at a time", flush=True)
    if not resuming:
        storage.write_text(storage.join(sweep, SPEC), yaml.safe_dump(spec, sort_keys=False))
    prepare(trials)
    grid = interrupts.waited(run_tune, sweep, trials, at_once, metric, bool(args.early_stop), resuming)
    errors = {posixpath.basename(result.path): error_text(result.error) for result in grid if result.error}
    rows = [trial_row(trial, errors.get(trial.name, "")) for trial in trials]
    table = results.ranked(rows, metric)
    results.write(sweep, table)
    best = table.iloc[0]
    print(f"results: {storage.join(sweep, results.RESULTS_MD)}", flush=True)
    if f"best_{metric}" in best:
        print(f"best trial ({metric} {best[f'best_{metric}']:.4f}): {best['run']}", flush=True)
    else:
        print(f"no trial reports {metric}: results in their order", flush=True)
    if errors:
        print(f"error: {len(errors)} of {len(trials)} trials failed", file=sys.stderr)
        print(f"rerun the command with --resume (--name {posixpath.basename(sweep)}) to retry them", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    cli.run(main)
