"""The Keras callbacks of a worker's training, one concern each.

Keras calls callbacks in list order, and each per-epoch one reads what those before it
recorded: EpochClock times the epoch, MetricsHistory makes the epoch's row from that and
Keras's metrics, then on rank 0 ConsoleLine says the row, TensorBoardLog writes it to
the TensorBoard logs and RunLogs publishes metrics.csv and those logs to the run folder,
and under Ray Train RayReport reports it, with a checkpoint when one is due (or a node is
draining). ProgressLine (rank 0: lines within long epochs) and StepProfiler (rank 0, before
the others) stand apart. Under Ray Train, rank 0's RayMetrics sets each row as Ray metrics, for
the dashboard and Prometheus. The callbacks the config's `callbacks` function returns (the user's;
the benchmark's timings, the fault tests' hold) come last.
"""

import csv
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np
import ray.train
import tensorflow as tf

from qml_ray import contract, storage
from qml_ray.checkpoints import write_manifest
from qml_ray.config import Config
from qml_ray.errors import ModelError

PROGRESS_SECONDS = 30  # the shortest time between two of an epoch's progress lines
# Ray's metrics agent drops a gauge not set again within two export intervals (each at least 1 s),
# so the last epoch's values are set again this often (half the shortest interval) while training.
METRICS_REFRESH_SECONDS = 0.5
# A history row: the epoch, the model's own metrics (loss, its compiled metrics, val_ each), then these.
RAY_METRICS = {  # the history's keys exported as Ray metrics (every model has them), and what each means
    "epoch": "epochs trained",
    "loss": "the last epoch's training loss",
    "val_loss": "the last epoch's validation loss",
    "circuits_per_second": "the last epoch's training circuits per second",
}


def for_replica(
    job, rank: int, inputs, rows: list[dict], summaries_dir: str | None, extra: Callable | None = None
) -> list:
    """The callbacks of one replica's training (`job` a worker.Job, `inputs` its worker.Inputs), in
    the order Keras must call them (each per-epoch one reads what those before it recorded): the
    step profiler first (rank 0, when asked for); timing and history on every rank; on rank 0 the
    progress and epoch lines, TensorBoard and the run logs; then those `extra(history,
    summaries_dir)` makes (the runtime's: Ray Train's, ray_train) and last those the config's
    `callbacks` function returns (the user's)."""
    config = job.config
    clock = EpochClock()
    history = MetricsHistory(rows, clock, inputs.train_circuits, inputs.steps, inputs.workers)
    profile_steps = rank == 0 and config.profile_range()
    callbacks = [StepProfiler(profile_steps, config.epochs, summaries_dir, job.say)] if profile_steps else []
    callbacks += [clock, history]
    if rank == 0:
        callbacks += [
            PlanLines(job.say),
            ProgressLine(config.epochs, inputs.steps, inputs.train_circuits, say=job.say),
            ConsoleLine(history, config.epochs, job.say, config.elastic),
            TensorBoardLog(history, summaries_dir),
            RunLogs(history, job.run, summaries_dir),
        ]
    return callbacks + (extra(history, summaries_dir) if extra else []) + configured(config, rank, job.run)


def ray_train(config: Config, run: str, rank: int, inputs):
    """for_replica's `extra` under Ray Train (`inputs` the replica's worker.Inputs): each epoch reported,
    with its checkpoints (every rank), and the rows as Ray metrics (rank 0)."""

    def extra(history: MetricsHistory, summaries_dir: str | None) -> list:
        report = [RayReport(history, config, summaries_dir, inputs.steps, inputs.workers < config.workers)]
        return [*report, RayMetrics(history, os.path.basename(run))] if rank == 0 else report

    return extra


def configured(config: Config, rank: int, run: str) -> list:
    """The Keras callbacks the config's `callbacks` function (MODULE:FUNCTION, the user's) returns
    for this replica, called as FUNCTION(rank=RANK, run=RUN_FOLDER); none when the key is empty."""
    if not config.callbacks:
        return []
    function = contract.resolve(config.callbacks, "callbacks")
    try:
        found = function(rank=rank, run=run)
    except Exception as err:  # the user's function: any error it raises
        raise ModelError(f"the callbacks function {config.callbacks} failed: {type(err).__name__}: {err}") from None
    if not isinstance(found, list | tuple) or not all(isinstance(c, tf.keras.callbacks.Callback) for c in found):
        raise ModelError(f"the callbacks function {config.callbacks} must return a list of Keras callbacks")
    return list(found)


class EpochClock(tf.keras.callbacks.Callback):
    """Timing: the seconds the last epoch took, and the Unix time it ended."""

    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds = time.perf_counter() - self.started
        self.finished_at = round(time.time(), 3)


class MetricsHistory(tf.keras.callbacks.Callback):
    """The history: each epoch's row (the epoch, the model's metrics, storage.RECORD_FIELDS) appended to
    `rows`, which start with the epochs trained before (restored from a checkpoint). An epoch of
    `steps` steps on `workers` workers trains on `train_examples` circuits; one resumed mid-way (after a
    drain) on its remaining steps' share."""

    def __init__(self, rows: list[dict], clock: EpochClock, train_examples: int, steps: int, workers: int = 1):
        super().__init__()
        self.rows, self.clock, self.train_examples, self.steps = rows, clock, train_examples, steps
        self.workers = workers

    def on_epoch_end(self, epoch, logs=None):
        metrics = {key: float(value) for key, value in logs.items() if np.ndim(value) == 0}
        circuits = self.train_examples * self.params["steps"] / self.steps
        self.rows.append(
            {
                "epoch": epoch + 1,
                **metrics,
                "epoch_seconds": self.clock.seconds,
                "circuits_per_second": circuits / self.clock.seconds,
                "finished_at": self.clock.finished_at,
                "workers": self.workers,
            }
        )

    @property
    def latest(self) -> dict:
        return self.rows[-1]


class ConsoleLine(tf.keras.callbacks.Callback):
    """One line per epoch, handed to `say` (under Ray Train, a console.Console's); in an `elastic` run,
    with the workers that trained it."""

    def __init__(self, history: MetricsHistory, epochs: int, say: Callable[[str], None], elastic: bool = False):
        super().__init__()
        self.history, self.epochs, self.say, self.elastic = history, epochs, say, elastic

    def on_epoch_end(self, epoch, logs=None):
        row = self.history.latest
        metrics = "  ".join(
            f"{key} {row[key]:.4f}" if "loss" in key or "error" in key else f"{key} {row[key]:.3f}"
            for key in storage.metric_names(row)
        )
        self.say(
            f"epoch {row['epoch']}/{self.epochs}  {metrics}  "
            f"{row['epoch_seconds']:.1f}s  {row['circuits_per_second']:.3g} circuits/s"
            + (f"  on {row['workers']} workers" if self.elastic else "")
        )


class PlanLines(tf.keras.callbacks.Callback):
    """The block kernel planner's lines (a new circuit shape's choice, measured or from the cache; a cache file
    ignored), said after the step that planned it: the console's first lines, and a line more for a shape that
    comes later (validation's last short batch on fewer threads)."""

    def __init__(self, say: Callable[[str], None]):
        super().__init__()
        self.say = say

    def on_train_batch_end(self, batch, logs=None):
        planner = sys.modules.get("qml_ray.gradients.planner")  # imported with BlockAdjoint, if the model uses it
        for line in planner.planner().said() if planner else ():
            self.say(line)

    on_test_batch_end = on_train_batch_end


class ProgressLine(tf.keras.callbacks.Callback):
    """Within a long epoch, a line on stdout at most every `interval` seconds, in the epoch
    lines' style: training steps done of the epoch's `steps`, circuits/s so far, and the seconds
    the epoch's training steps have left at that pace (validation comes after)."""

    def __init__(
        self,
        epochs: int,
        steps: int,
        train_examples: int,
        interval: float = PROGRESS_SECONDS,
        say: Callable[[str], None] = print,
    ):
        super().__init__()
        self.epochs, self.steps, self.train_examples, self.interval = epochs, steps, train_examples, interval
        self.say = say  # under Ray Train, a console.Console's

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch, self.started = epoch, time.perf_counter()
        self.last_line = self.started

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        if now - self.last_line < self.interval:
            return
        self.last_line, done, elapsed = now, batch + 1, now - self.started
        left = self.params["steps"] - done  # fewer steps than `steps` in an epoch resumed mid-way
        self.say(
            f"epoch {self.epoch + 1}/{self.epochs}  step {self.steps - left}/{self.steps}  "
            f"{self.train_examples / self.steps * done / elapsed:.3g} circuits/s  "
            f"{elapsed / done * left:.0f}s of training left in the epoch"
        )


class TensorBoardLog(tf.keras.callbacks.Callback):
    """Per epoch, into the TensorBoard logs at `logdir`: the row's metrics as scalars, and a
    histogram of every array the model's evaluation step adds to its logs (the QCNN's readouts,
    model.HybridQCNN), over this worker's validation shard: taken from the validation pass itself,
    no simulation of its own, so the other workers never wait for it."""

    def __init__(self, history: MetricsHistory, logdir: str):
        super().__init__()
        self.history, self.arrays = history, {}
        self.writer = tf.summary.create_file_writer(logdir)

    def on_test_begin(self, logs=None):
        self.arrays = {}

    def on_test_batch_end(self, batch, logs=None):
        for key, value in (logs or {}).items():
            if np.ndim(value) > 0:
                self.arrays.setdefault(key, []).append(value)

    def on_epoch_end(self, epoch, logs=None):
        row = self.history.latest
        with self.writer.as_default(step=row["epoch"]):
            for key, value in row.items():
                if key not in ("epoch", "finished_at"):
                    tf.summary.scalar(key, value)
            for key, batches in self.arrays.items():
                tf.summary.histogram(key, np.concatenate(batches))
        self.writer.flush()


class RunLogs(tf.keras.callbacks.Callback):
    """Publishing: the run's metrics.csv and TensorBoard folder made to match the history and
    the logs at `logdir` when training starts and after every epoch. So when training resumes
    from a checkpoint, both are first rewritten to its epochs: every epoch appears once. The logs
    go first: an epoch's row reaches metrics.csv only once its TensorBoard logs are published, so
    a worker lost just after leaves no row without its logs."""

    def __init__(self, history: MetricsHistory, run: str, logdir: str):
        super().__init__()
        self.history, self.run, self.logdir = history, run, logdir

    def on_train_begin(self, logs=None):
        self.publish()

    def on_epoch_end(self, epoch, logs=None):
        self.publish()

    def publish(self) -> None:
        storage.mirror(self.logdir, storage.join(self.run, storage.TENSORBOARD))
        storage.write_text(storage.join(self.run, storage.HISTORY), history_csv(self.history.rows))


def history_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    fields = list(dict.fromkeys(key for row in rows for key in row)) or ["epoch"]  # an older run's rows lack some
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


class RayReport(tf.keras.callbacks.Callback):
    """Ray Train: each epoch's row reported (and so shown by the dashboard), with a checkpoint
    every `checkpoint_every` epochs and at the last (every epoch while an elastic run is `short` of
    workers: growing back restarts from the latest checkpoint), and one at the first step boundary after
    Ray Train sees a node of the run draining (a spot VM's reclaim notice), so the restart
    continues from that step. Every rank saves its weights, optimizer state and history (Keras
    synchronises metric variables while saving under the strategy); rank 0, the one given its
    TensorBoard `logdir`, adds those logs and hands its checkpoint to Ray Train."""

    def __init__(self, history: MetricsHistory, config: Config, logdir: str | None, steps: int, short: bool = False):
        super().__init__()
        self.history, self.config, self.logdir, self.steps, self.short = history, config, logdir, steps, short
        self.drained = self.drain_due = False  # a drain was seen; its checkpoint waits for the epoch's end

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        # A barrier: every rank asks at every step boundary, and all get rank 0's answer.
        if ray.train.get_preemption_info() is None or self.drained:
            return
        self.drained = True
        step = self.steps - self.params["steps"] + batch + 1  # an epoch resumed mid-way has fewer steps
        if step == self.steps:  # the epoch's last step: checkpoint the whole epoch at its end
            self.drain_due = True
        else:
            self.save({"epoch": self.epoch, "step": step}, self.epoch, step)

    def on_epoch_end(self, epoch, logs=None):
        row = self.history.latest
        due = (
            self.short
            or row["epoch"] % self.config.checkpoint_every == 0
            or row["epoch"] == self.config.epochs
            or self.drain_due
        )
        self.drain_due = False
        if due:
            self.save(row, row["epoch"])
        else:
            ray.train.report(row)

    def save(self, metrics: dict, epochs: int, step: int = 0) -> None:
        """Report `metrics` with a checkpoint taken after `epochs` epochs and `step` steps of the next."""
        with tempfile.TemporaryDirectory() as folder:
            self.model.save_weights(os.path.join(folder, storage.WEIGHTS_PREFIX))
            with open(os.path.join(folder, storage.STATE_FILE), "w") as f:
                json.dump({"epoch": epochs, "step": step, "history": self.history.rows}, f)
            checkpoint = None
            if self.logdir:
                shutil.make_archive(os.path.join(folder, storage.SUMMARIES.removesuffix(".zip")), "zip", self.logdir)
                write_manifest(folder)  # last: its sizes tell a whole checkpoint from a damaged one
                checkpoint = ray.train.Checkpoint.from_directory(folder)
            ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=storage.checkpoint_name(epochs, step))


class RayMetrics(tf.keras.callbacks.Callback):
    """The last epoch's row as Ray metrics (ray.util.metrics gauges, tagged with the run's name), which
    every node's metrics endpoint serves to Prometheus as ray_qml_ray_<key> and the dashboard's
    Metrics view and Grafana chart. A thread sets them again every METRICS_REFRESH_SECONDS while
    each `fit` call runs (a streamed data set's training makes one per epoch), as Ray forgets a
    gauge that is not set again within seconds."""

    def __init__(self, history: MetricsHistory, run_name: str):
        super().__init__()
        from ray.util.metrics import Gauge

        self.history, self.tags = history, {"run": run_name.encode("ascii", "backslashreplace").decode()}  # ASCII only
        self.gauges = {
            key: Gauge(f"qml_ray_{key}", description=text, tag_keys=("run",)) for key, text in RAY_METRICS.items()
        }

    def on_train_begin(self, logs=None):
        self.ended = threading.Event()  # this fit call's own: the thread of the call before ends with its own
        threading.Thread(target=self.refresh, args=(self.ended,), name="ray-metrics", daemon=True).start()

    def on_epoch_end(self, epoch, logs=None):
        self.set_latest()

    def on_train_end(self, logs=None):
        self.ended.set()

    def refresh(self, ended: threading.Event):
        while not ended.wait(METRICS_REFRESH_SECONDS):
            self.set_latest()

    def set_latest(self):
        """The gauges set to the last epoch's row (none before the first, unless resumed)."""
        if self.history.rows:
            for key, gauge in self.gauges.items():
                gauge.set(self.history.latest[key], tags=self.tags)


class StepProfiler(tf.keras.callbacks.Callback):
    """Traces training steps `first..last` (counted from 1 in this training, across epochs) with
    the TF profiler into `logdir`, where TensorBoard's Profile tab finds it. A trace still open
    when the last of the `epochs` ends is closed then, so the epoch's log publishing includes it.
    A trace the profiler is too busy for is skipped with a line to `say`."""

    def __init__(self, steps: tuple[int, int], epochs: int, logdir: str, say: Callable[[str], None]):
        super().__init__()
        (self.first, self.last), self.logdir, self.step, self.tracing = steps, logdir, 0, False
        self.epochs, self.say = epochs, say

    def on_train_batch_begin(self, batch, logs=None):
        self.step += 1
        if self.step == self.first:
            try:
                tf.profiler.experimental.start(self.logdir)
                self.tracing = True
            except tf.errors.OpError as err:  # e.g. an on-demand capture is running
                self.say(f"profile_steps: no trace, the profiler is busy: {err.message}")

    def on_train_batch_end(self, batch, logs=None):
        if self.tracing and self.step == self.last:
            self.stop()

    def on_epoch_end(self, epoch, logs=None):
        if self.tracing and epoch + 1 == self.epochs:
            self.stop()

    def stop(self) -> None:
        tf.profiler.experimental.stop()
        self.tracing = False
