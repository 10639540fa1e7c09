"""What each Ray Train worker runs: MultiWorkerMirroredStrategy training of the QCNN.

Ray's TensorflowTrainer sets TF_CONFIG on every worker before this runs. Each worker
trains on its own shard of the run's data set, reports every epoch to Ray Train and,
every `checkpoint_every` epochs, saves weights, optimizer state, the metrics history and
the TensorBoard logs as a Ray Train checkpoint. All ranks save (Keras synchronises metric
variables while saving under the strategy); rank 0's copy is the one kept.
"""

import csv
import io
import json
import math
import os
import resource
import shutil
import sys
import tempfile
import time

import ray.train
import tensorflow as tf

from qml_ray import runtime, storage
from qml_ray.storage import STATE_FILE, SUMMARIES, WEIGHTS_PREFIX
from qml_ray.config import Config

HISTORY_FIELDS = ("epoch", "loss", "accuracy", "val_loss", "val_accuracy", "epoch_seconds", "circuits_per_second",
                  "finished_at")  # finished_at: Unix time, so restarts show as gaps


def train_worker(params: dict) -> None:
    """Ray Train's train_loop_per_worker."""
    config, run = Config(**params["config"]), params["run"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    context = ray.train.get_context()
    train_replica(config, run, strategy, context.get_world_rank(), context.get_world_size(),
                  ray.train.get_checkpoint(), ray_train=True, local_rank=context.get_local_rank())


def train_replica(config: Config, run: str, strategy: tf.distribute.Strategy, rank: int, world_size: int,
                  checkpoint: ray.train.Checkpoint | None = None, ray_train: bool = False,
                  local_rank: int = 0) -> None:
    """Train this replica on its shard of the run's data, from `checkpoint` if given.

    Every runtime shares this: Ray Train workers (`ray_train`: report each epoch and save
    checkpoints), and the benchmark's plain TF_CONFIG processes and single process. Create
    `strategy` before calling: importing TFQ starts TensorFlow's runtime, after which a
    MultiWorkerMirroredStrategy can no longer be set up. `local_rank` (this worker's index on
    its node) offsets the profiler server's port."""
    tf.get_logger().setLevel("ERROR")
    if config.profiler_port:
        tf.profiler.experimental.server.start(config.profiler_port + local_rank)
    from qml_ray import data
    from qml_ray.model import build_model, readout_model

    train_table, test_table = data.read(run, "train"), data.read(run, "test")

    def distribute(table, shuffle_seed=None):
        """This worker's shard, repeated, as its per-replica input, and the steps for one pass.

        Every worker runs the same number of steps: that of the largest shard. Where shard
        sizes differ by one, the smaller shards start their next pass a batch early."""
        shard = data.shard(table, rank, world_size)
        dataset = data.to_tf_dataset(shard, config.batch_size, shuffle_seed).repeat()
        steps = math.ceil(math.ceil(table.num_rows / world_size) / config.batch_size)
        return strategy.distribute_datasets_from_function(lambda _: dataset), steps

    train_set, train_steps = distribute(train_table, shuffle_seed=config.seed + rank)
    test_set, test_steps = distribute(test_table)
    with strategy.scope():
        model = build_model(config)
        model.optimizer.build(model.trainable_variables)  # so a checkpoint's slots restore now
    summaries_dir = tempfile.mkdtemp(prefix="tensorboard-") if rank == 0 else None
    done, history = restore(model, checkpoint, summaries_dir)

    callbacks = [EpochReporter(config, run, history, train_table.num_rows, test_table, ray_train,
                               readouts=readout_model(model) if rank == 0 else None, summaries_dir=summaries_dir)]
    profile_steps = config.profile_range()
    if rank == 0 and profile_steps:
        callbacks.insert(0, StepProfiler(profile_steps, summaries_dir))  # done before the logs publish
    if timings := os.environ.get(runtime.TIMINGS_ENV):
        callbacks.append(Timings(os.path.join(timings, f"rank-{rank}.json")))
    model.fit(train_set, steps_per_epoch=train_steps, validation_data=test_set, validation_steps=test_steps,
              epochs=config.epochs, initial_epoch=done, callbacks=callbacks, verbose=0)


def restore(model: tf.keras.Model, checkpoint: ray.train.Checkpoint | None,
            summaries_dir: str | None) -> tuple[int, list[dict]]:
    """Load a checkpoint's weights and optimizer state, and (into `summaries_dir`, if given)
    its TensorBoard logs; return its epochs done and metrics history."""
    if checkpoint is None:
        return 0, []
    with tempfile.TemporaryDirectory() as folder:  # per worker: as_directory() is shared on a node
        checkpoint.to_directory(folder)
        model.load_weights(os.path.join(folder, WEIGHTS_PREFIX))
        with open(os.path.join(folder, STATE_FILE)) as f:
            state = json.load(f)
        if summaries_dir:
            shutil.unpack_archive(os.path.join(folder, SUMMARIES), summaries_dir)
    return state["epoch"], state["history"]


def history_csv(history: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=HISTORY_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(history)
    return out.getvalue()


class EpochReporter(tf.keras.callbacks.Callback):
    """Per epoch: with `ray_train`, metrics to Ray Train (and so the dashboard) and a
    checkpoint when due; on rank 0, one console line, the metrics history and TensorBoard.

    The run's metrics.csv and TensorBoard folder always match the history up to the last
    epoch: when training resumes from a checkpoint, both are rewritten to the checkpoint's
    epochs before training goes on, so every epoch appears exactly once."""

    def __init__(self, config: Config, run: str, history: list[dict], train_examples: int, test_table,
                 ray_train: bool, readouts: tf.keras.Model | None, summaries_dir: str | None):
        """`readouts` (the QCNN's quantum part) and `summaries_dir` are given on rank 0 only."""
        super().__init__()
        self.config, self.run, self.history, self.ray_train = config, run, history, ray_train
        self.train_examples, self.readouts, self.is_chief = train_examples, readouts, readouts is not None
        if self.is_chief:
            self.test_circuits = tf.constant(test_table.column("circuit").to_pylist(), dtype=tf.string)
            self.summaries_dir = summaries_dir
            self.summaries = tf.summary.create_file_writer(summaries_dir)

    def on_train_begin(self, logs=None):
        if self.is_chief:
            self.publish_logs()

    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self.started
        row = {key: float(logs[key]) for key in HISTORY_FIELDS[1:5]}
        row = {"epoch": epoch + 1, **row, "epoch_seconds": seconds,
               "circuits_per_second": self.train_examples / seconds, "finished_at": round(time.time(), 3)}
        self.history.append(row)
        if self.is_chief:
            self.log(row)
        if not self.ray_train:
            return
        due = row["epoch"] % self.config.checkpoint_every == 0 or row["epoch"] == self.config.epochs
        if not due:
            ray.train.report(row)
            return
        with tempfile.TemporaryDirectory() as folder:
            self.model.save_weights(os.path.join(folder, WEIGHTS_PREFIX))
            with open(os.path.join(folder, STATE_FILE), "w") as f:
                json.dump({"epoch": row["epoch"], "history": self.history}, f)
            checkpoint = None
            if self.is_chief:
                shutil.make_archive(os.path.join(folder, SUMMARIES.removesuffix(".zip")), "zip", self.summaries_dir)
                checkpoint = ray.train.Checkpoint.from_directory(folder)
            ray.train.report(row, checkpoint=checkpoint, checkpoint_dir_name=storage.checkpoint_name(row["epoch"]))

    def log(self, row: dict) -> None:
        # Straight to stdout, which Ray forwards to the driver (print is re-routed to logging).
        sys.stdout.write(
            f"epoch {row['epoch']}/{self.config.epochs}  loss {row['loss']:.4f}  accuracy {row['accuracy']:.3f}  "
            f"val_loss {row['val_loss']:.4f}  val_accuracy {row['val_accuracy']:.3f}  "
            f"{row['epoch_seconds']:.1f}s  {row['circuits_per_second']:.0f} circuits/s\n"
        )
        sys.stdout.flush()
        with self.summaries.as_default(step=row["epoch"]):
            for key, value in row.items():
                if key not in ("epoch", "finished_at"):
                    tf.summary.scalar(key, value)
            tf.summary.histogram("qcnn_readout", self.readouts(self.test_circuits))
        self.summaries.flush()
        self.publish_logs()

    def publish_logs(self) -> None:
        """The run's metrics.csv and TensorBoard folder made to match the history."""
        storage.write_text(storage.join(self.run, storage.HISTORY), history_csv(self.history))
        storage.mirror(self.summaries_dir, storage.join(self.run, storage.TENSORBOARD))


class StepProfiler(tf.keras.callbacks.Callback):
    """Traces training steps `first..last` (counted from 1 in this training, across epochs) with
    the TF profiler into `logdir`, where TensorBoard's Profile tab finds it. A trace still open
    when the last epoch ends is closed then, so the epoch's log publishing includes it."""

    def __init__(self, steps: tuple[int, int], logdir: str):
        super().__init__()
        (self.first, self.last), self.logdir, self.step, self.tracing = steps, logdir, 0, False

    def on_train_batch_begin(self, batch, logs=None):
        self.step += 1
        if self.step == self.first:
            try:
                tf.profiler.experimental.start(self.logdir)
                self.tracing = True
            except tf.errors.OpError as err:  # e.g. an on-demand capture is running
                sys.stdout.write(f"profile_steps: no trace, the profiler is busy: {err.message}\n")

    def on_train_batch_end(self, batch, logs=None):
        if self.tracing and self.step == self.last:
            self.stop()

    def on_epoch_end(self, epoch, logs=None):
        if self.tracing and epoch + 1 == self.params["epochs"]:
            self.stop()

    def stop(self) -> None:
        tf.profiler.experimental.stop()
        self.tracing = False


class Timings(tf.keras.callbacks.Callback):
    """For the benchmark: when the first training step started (Unix time), each epoch's
    seconds and the process's peak memory, written as JSON to `path` when training ends."""

    def __init__(self, path: str):
        super().__init__()
        self.path, self.first_step_at, self.epoch_seconds = path, None, []

    def on_train_batch_begin(self, batch, logs=None):
        if self.first_step_at is None:
            self.first_step_at = time.time()

    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_seconds.append(time.perf_counter() - self.started)

    def on_train_end(self, logs=None):
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
        with open(self.path, "w") as f:
            json.dump({"first_step_at": self.first_step_at, "epoch_seconds": self.epoch_seconds,
                       "peak_memory_mb": peak_mb}, f)
