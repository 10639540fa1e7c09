"""What each Ray Train worker runs: MultiWorkerMirroredStrategy training of the QCNN.

Ray's TensorflowTrainer sets TF_CONFIG on every worker before this runs. Each worker
trains on its own shard of the run's data set, reports every epoch to Ray Train and,
every `checkpoint_every` epochs, saves weights, optimizer state and the metrics history
as a Ray Train checkpoint. All ranks save (Keras synchronises metric variables while
saving under the strategy); rank 0's copy is the one kept.
"""

import csv
import io
import json
import math
import os
import sys
import tempfile
import time

import ray.train
import tensorflow as tf

from qml_ray import storage
from qml_ray.config import Config

WEIGHTS_PREFIX = "qcnn"  # TensorFlow checkpoint prefix inside a checkpoint or weights folder
STATE_FILE = "state.json"  # epochs done and the metrics history, beside the weights
HISTORY_FIELDS = ("epoch", "loss", "accuracy", "val_loss", "val_accuracy", "epoch_seconds", "circuits_per_second")


def train_worker(params: dict) -> None:
    """Ray Train's train_loop_per_worker."""
    config, run = Config(**params["config"]), params["run"]
    tf.get_logger().setLevel("ERROR")
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    # Importing TFQ starts TensorFlow's runtime, after which the strategy cannot be set up.
    from qml_ray import data
    from qml_ray.model import build_model, readout_model

    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()

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
    done, history = restore(model, ray.train.get_checkpoint())

    readouts = readout_model(model) if rank == 0 else None
    reporter = EpochReporter(config, run, history, train_table.num_rows, test_table, readouts)
    model.fit(train_set, steps_per_epoch=train_steps, validation_data=test_set, validation_steps=test_steps,
              epochs=config.epochs, initial_epoch=done, callbacks=[reporter], verbose=0)


def restore(model: tf.keras.Model, checkpoint: ray.train.Checkpoint | None) -> tuple[int, list[dict]]:
    """Load a checkpoint's weights and optimizer state; return its epochs done and history."""
    if checkpoint is None:
        return 0, []
    with tempfile.TemporaryDirectory() as folder:  # per worker: as_directory() is shared on a node
        checkpoint.to_directory(folder)
        model.load_weights(os.path.join(folder, WEIGHTS_PREFIX))
        with open(os.path.join(folder, STATE_FILE)) as f:
            state = json.load(f)
    return state["epoch"], state["history"]


def history_csv(history: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=HISTORY_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(history)
    return out.getvalue()


class EpochReporter(tf.keras.callbacks.Callback):
    """Per epoch: metrics to Ray Train (and so the dashboard), a checkpoint when due, and on
    rank 0 one console line, the metrics history and TensorBoard summaries."""

    def __init__(self, config: Config, run: str, history: list[dict], train_examples: int, test_table,
                 readouts: tf.keras.Model | None):
        """`readouts` (the QCNN's quantum part) is given on rank 0 only."""
        super().__init__()
        self.config, self.run, self.history = config, run, history
        self.train_examples, self.readouts, self.is_chief = train_examples, readouts, readouts is not None
        if self.is_chief:
            self.test_circuits = tf.constant(test_table.column("circuit").to_pylist(), dtype=tf.string)
            self.summaries_dir = tempfile.mkdtemp(prefix="tensorboard-")
            self.summaries = tf.summary.create_file_writer(self.summaries_dir)

    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self.started
        row = {key: float(logs[key]) for key in HISTORY_FIELDS[1:5]}
        row = {"epoch": epoch + 1, **row, "epoch_seconds": seconds,
               "circuits_per_second": self.train_examples / seconds}
        self.history.append(row)
        if self.is_chief:
            self.log(row)
        due = row["epoch"] % self.config.checkpoint_every == 0 or row["epoch"] == self.config.epochs
        if not due:
            ray.train.report(row)
            return
        with tempfile.TemporaryDirectory() as folder:
            self.model.save_weights(os.path.join(folder, WEIGHTS_PREFIX))
            with open(os.path.join(folder, STATE_FILE), "w") as f:
                json.dump({"epoch": row["epoch"], "history": self.history}, f)
            checkpoint = ray.train.Checkpoint.from_directory(folder) if self.is_chief else None
            ray.train.report(row, checkpoint=checkpoint, checkpoint_dir_name=f"epoch-{row['epoch']:05d}")

    def log(self, row: dict) -> None:
        # Straight to stdout, which Ray forwards to the driver (print is re-routed to logging).
        sys.stdout.write(
            f"epoch {row['epoch']}/{self.config.epochs}  loss {row['loss']:.4f}  accuracy {row['accuracy']:.3f}  "
            f"val_loss {row['val_loss']:.4f}  val_accuracy {row['val_accuracy']:.3f}  "
            f"{row['epoch_seconds']:.1f}s  {row['circuits_per_second']:.0f} circuits/s\n"
        )
        sys.stdout.flush()
        storage.write_text(storage.join(self.run, storage.HISTORY), history_csv(self.history))
        with self.summaries.as_default(step=row["epoch"]):
            for key, value in row.items():
                if key != "epoch":
                    tf.summary.scalar(key, value)
            tf.summary.histogram("qcnn_readout", self.readouts(self.test_circuits))
        self.summaries.flush()
        storage.mirror(self.summaries_dir, storage.join(self.run, storage.TENSORBOARD))
