"""What each Ray Train worker runs: MultiWorkerMirroredStrategy training of the run's model.

The command hands every worker a Job (train.job_for); Ray Train sets TF_CONFIG on every worker before
this runs (tf_backend.py) and hands each worker its shard of the run's Ray Datasets. The worker
builds the model (the model contract, contract.py), fits it on its shard with the run's callbacks
(callbacks.py: the epoch lines, metrics.csv, TensorBoard, reports and checkpoints to Ray Train,
then the config's own) and, when it restarts, continues from the latest checkpoint.

TensorFlow is imported inside the functions: Ray Train's controller imports this module to
unpickle `train_worker`, and has no use for TensorFlow.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import ray.train

from qml_ray import contract, datasets, features, runtime, storage
from qml_ray.checkpoints import whole
from qml_ray.config import Config, worker_batch
from qml_ray.errors import ModelError

if TYPE_CHECKING:
    import tensorflow as tf

    from qml_ray.console import Console

SHUFFLE_ROWS = 10_000  # a worker shuffles its shard's rows within a buffer of this many (at least a batch)


@dataclasses.dataclass(frozen=True)
class Job:
    """What the driver hands every worker (train.job_for): the run's config and folder, each split's
    rows, the labels' width, whether the data is kept in memory and, if so, each split's table (a Ray
    object ref, which every worker shards; None: the workers draw the QCNN's data set), the data's columns (empty:
    the drawn data set's), the command's console (None: rank 0's lines go to its log) and the model
    function pickled (None: the config's)."""

    config: Config
    run: str
    rows: dict
    label_width: int
    in_memory: bool
    shards: dict | None = None
    console: Console | None = None
    model: bytes | None = None
    columns: tuple = ()

    def say(self, line: str) -> None:
        """Rank 0's line to the command's console, or to the worker's log."""
        if self.console:
            self.console.say(line)
        else:
            print(line, flush=True)

    def tell_workers(self, workers: int) -> None:
        """Rank 0, as an attempt of an elastic run's worker group starts: how many workers it has. The
        command's console says when that changed (a node lost, or back); without one, the worker's log."""
        if self.console:
            self.console.workers(workers, self.config.workers)
        else:
            print(f"training on {workers} of {self.config.workers} workers", flush=True)


@dataclasses.dataclass
class Inputs:
    """A replica's data: makers of its own training and validation batches, the steps of one pass
    over each, the circuits one epoch trains on (all `workers` workers together), whether the batches
    repeat (held in memory: one `fit` serves every epoch) or are one pass, made anew every epoch
    (streamed from Ray Data), and the first row's circuits of its training shard when held in memory."""

    train: Callable[[], tf.data.Dataset]
    validation: Callable[[], tf.data.Dataset]
    steps: int
    validation_steps: int
    train_circuits: int
    workers: int
    repeat: bool
    first_circuits: tuple = ()


def train_worker(job: Job) -> None:
    """Ray Train's train_loop_per_worker (given `job` by train.fit). A model that breaks the contract
    is told to the command, which ends at once in one line (Ray Train's restarts would only meet it again)."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    from qml_ray.callbacks import ray_train  # after the strategy, as every import of Keras and TFQ
    from qml_ray.console import problems_told

    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    if rank == 0 and job.config.elastic:
        job.tell_workers(world_size)
    with problems_told(job.console, job.run):  # the model, its data, its size or a full disk: one line
        model = build_replica(job, strategy, rank, context.get_local_rank())
        if job.in_memory:
            inputs = kept_inputs(job, model, kept_shards(job, rank, world_size), rank, world_size)
        else:
            inputs = streamed_inputs(job, model, rank, world_size)
        require_state_memory(model, inputs.first_circuits, job.config.cpus_per_worker)
        extra = ray_train(job.config, job.run, rank, inputs)
        train_replica(job, model, strategy, inputs, rank, ray.train.get_checkpoint(), extra)


def kept_shards(job: Job, rank: int, world_size: int) -> dict:
    """This worker's shard of each split (a pyarrow table), of the table the command handed over or, for
    a new run's generated data set (`job.shards` None), drawn here as on every worker (rank 0 writes
    the data set and data.json to the run folder)."""
    if job.shards is not None:
        return {split: datasets.shard(ray.get(table), rank, world_size) for split, table in job.shards.items()}
    from qml_ray import data  # after the strategy: importing TFQ starts TensorFlow's runtime

    tables = data.generate(job.config)
    if rank == 0:
        datasets.write_generated(job.config, job.run, tables)
    return {split: datasets.shard(table, rank, world_size) for split, table in tables.items()}


def model_feed(job: Job, model: tf.keras.Model, columns: tuple = ()) -> features.Feed:
    """Which of the data's columns (the driver's description, else `columns`) feeds each of the model's
    inputs; a UsageError when one has none that fits."""
    where = job.config.data or "the generated data set"
    return features.feed(features.model_inputs(model), job.columns or columns, where)


def kept_inputs(job: Job, model: tf.keras.Model, shards: dict, rank: int, world_size: int) -> Inputs:
    """A worker's inputs from its shards (pyarrow tables) held in memory: one `fit` serves every
    epoch, each pass over the training shard in a new order."""
    config, width, batch = job.config, job.label_width, worker_batch(job.config, world_size)
    feed = model_feed(job, model, features.columns_of(shards["train"].schema))
    arrays = {split: datasets.numpy_columns(table, [*feed.columns, features.LABEL]) for split, table in shards.items()}
    kept = (
        in_memory_batches(feed, arrays["train"], batch, width, config.seed + rank),
        in_memory_batches(feed, arrays["validation"], batch, width),
    )
    inputs = sized_inputs(config, (lambda: kept[0], lambda: kept[1]), job.rows, world_size, repeat=True)
    first = tuple(bytes(arrays["train"][name][0]) for name in feed.circuit_columns)
    return dataclasses.replace(inputs, first_circuits=first)


def streamed_inputs(job: Job, model: tf.keras.Model, rank: int, world_size: int) -> Inputs:
    """A worker's inputs streamed from its shards of the run's Ray Datasets, one pass per epoch.
    Ray Train splits each into equal shards (a split's last rows_count % workers rows sit out), so
    every worker runs the same steps; every worker starts each pass over a split together with the
    others, as Ray Data's split needs."""
    config, width, feed = job.config, job.label_width, model_feed(job, model)
    batch = worker_batch(config, world_size)
    train, validation = (ray.train.get_dataset_shard(split) for split in ("train", "validation"))
    rows_per_worker, passes = job.rows["train"] // world_size, itertools.count()
    makers = (
        lambda: streamed_batches(feed, train, batch, width, rows_per_worker, config.seed + rank + 7919 * next(passes)),
        lambda: streamed_batches(feed, validation, batch, width),
    )
    return sized_inputs(config, makers, job.rows, world_size, repeat=False)


def sized_inputs(config: Config, makers: tuple, rows: dict, world_size: int, repeat: bool) -> Inputs:
    """Inputs of the batch makers (training, validation), each worker's steps from the splits' rows and
    its batch (config.worker_batch)."""
    per_worker, batch = {split: count // world_size for split, count in rows.items()}, worker_batch(config, world_size)
    return Inputs(
        *makers,
        steps=-(-per_worker["train"] // batch),
        validation_steps=-(-per_worker["validation"] // batch),
        train_circuits=per_worker["train"] * world_size,
        workers=world_size,
        repeat=repeat,
    )


def in_memory_batches(
    feed: features.Feed, columns: dict, batch_size: int, label_width: int, shuffle_seed: int | None = None
):
    """(inputs, label) batches of a shard held in memory (numpy columns), pass after pass, each pass
    in a new order when a seed is given: no pass touches Ray Data again."""
    import tensorflow as tf
    from ray.train.tensorflow import prepare_dataset_shard

    from qml_ray.tf_data import untuned

    rows = len(columns[features.LABEL])
    dataset = tf.data.Dataset.from_tensor_slices((feed.inputs(columns), labels(columns[features.LABEL], label_width)))
    if shuffle_seed is not None:
        dataset = dataset.shuffle(rows, seed=shuffle_seed, reshuffle_each_iteration=True)
    return prepare_dataset_shard(untuned(dataset.batch(batch_size).repeat()))


def streamed_batches(
    feed: features.Feed, shard, batch_size: int, label_width: int, rows: int = 0, shuffle_seed: int | None = None
):
    """One pass of (inputs, label) batches streamed from a Ray Data shard, shuffled within a buffer
    when a seed is given."""
    import tensorflow as tf
    from ray.train.tensorflow import prepare_dataset_shard

    from qml_ray.tf_data import untuned

    shuffle = {}
    if shuffle_seed is not None:
        shuffle = {
            "local_shuffle_buffer_size": max(batch_size, min(rows, SHUFFLE_ROWS)),
            "local_shuffle_seed": shuffle_seed,
        }

    def batches():
        for batch in shard.iter_batches(batch_size=batch_size, batch_format="numpy", **shuffle):
            yield feed.inputs(batch), labels(batch[features.LABEL], label_width)

    spec = (feed.spec(), tf.TensorSpec([None, label_width], tf.float32))
    return prepare_dataset_shard(untuned(tf.data.Dataset.from_generator(batches, output_signature=spec)))


def labels(column: np.ndarray, width: int) -> np.ndarray:
    """A batch's labels as a (rows, width) float32 array (a list column arrives as arrays of rows)."""
    rows = np.stack(column) if column.dtype == object else column
    return np.asarray(rows, np.float32).reshape(len(column), width)


def build_replica(job: Job, strategy: tf.distribute.Strategy, rank: int, local_rank: int = 0) -> tf.keras.Model:
    """The replica's model, built by the contract inside `strategy`'s scope (default: the config's
    model function); rank 0 says and records the quantum gradient of each of its TFQ layers. Every
    runtime shares this: Ray Train workers, and the benchmark's plain TF_CONFIG processes and single
    process. Create `strategy` before calling: importing TFQ starts TensorFlow's runtime, after which
    a MultiWorkerMirroredStrategy can no longer be set up. `local_rank` (this worker's index on its
    node) offsets the profiler server's port."""
    import tensorflow as tf

    from qml_ray import replica

    tf.get_logger().setLevel("ERROR")
    config = job.config
    if config.profiler_port:
        tf.profiler.experimental.server.start(config.profiler_port + local_rank)
    with strategy.scope():
        built, gradients = replica.build_with_gradients(config, job.model and contract.unpickled(job.model))
        require_outputs(built, job.label_width, config)
        built.optimizer.build(built.trainable_variables)  # so a checkpoint's slots restore now
    if rank == 0:
        record_gradients(job.run, config.differentiator, gradients, job.say)
    return built


def train_replica(
    job: Job,
    model: tf.keras.Model,
    strategy: tf.distribute.Strategy,
    inputs: Inputs,
    rank: int,
    checkpoint: ray.train.Checkpoint | None = None,
    extra: Callable | None = None,
) -> None:
    """Train this replica's `model` (build_replica's) on `inputs`, from `checkpoint` if given, with
    the callbacks of callbacks.for_replica: `extra` makes those the runtime adds (Ray Train's
    reports and checkpoints, callbacks.ray_train)."""
    from qml_ray.callbacks import for_replica
    from qml_ray.tf_data import untune_device_pipelines

    untune_device_pipelines()  # no wait at the end of `fit` (tf_data.py)
    summaries_dir = tempfile.mkdtemp(prefix="tensorboard-") if rank == 0 else None
    done, step, rows = restore(model, checkpoint, summaries_dir)
    if rank == 0 and checkpoint is not None:  # a restart, or a resumed run
        job.say(f"continuing from the checkpoint of epoch {done}")
    callbacks = for_replica(job, rank, inputs, rows, summaries_dir, extra)

    def distributed(make: Callable[[], tf.data.Dataset]):
        """Each worker's batches as its replica's own: no rebatching into a global batch."""
        return strategy.distribute_datasets_from_function(lambda _: make())

    if step and rank == 0:  # a checkpoint taken mid-epoch, on a drain notice: that epoch's remaining steps first
        job.say(f"resuming epoch {done + 1} at step {step + 1} of {inputs.steps} (a node drained)")
    for first, end in fit_spans(done, step, job.config.epochs, inputs.repeat):
        model.fit(
            distributed(inputs.train),
            steps_per_epoch=inputs.steps - (step if first == done else 0),
            validation_data=distributed(inputs.validation),
            validation_steps=inputs.validation_steps,
            epochs=end,
            initial_epoch=first,
            callbacks=callbacks,
            verbose=0,
        )


def fit_spans(done: int, step: int, epochs: int, repeat: bool) -> list[tuple[int, int]]:
    """The epochs (first, end) of each `fit` call, from `done` epochs and `step` steps of the next:
    one epoch a call when each pass needs fresh batches (streamed); else one call for them all,
    after one for the rest of an epoch a drain cut short."""
    if not repeat:
        return [(epoch, epoch + 1) for epoch in range(done, epochs)]
    spans = [(done, done + 1)] if step else []
    rest = done + 1 if step else done
    return spans + ([(rest, epochs)] if rest < epochs else [])


def require_state_memory(model: tf.keras.Model, first_circuits: tuple, threads: int) -> None:
    """A UsageError unless the cluster's largest node holds this worker's state vectors, sized from the
    model's circuits and the first row's of its training shard (held in memory) together."""
    from qml_ray import quantum_layers

    qubits = len(quantum_layers.qubits(model, list(first_circuits)))
    runtime.require_state_memory(qubits, threads, "a training worker", "lower --cpus-per-worker")


def record_gradients(run: str, differentiator: str, gradients: list, say: Callable[[str], None]) -> None:
    """Say which quantum gradient each TFQ layer got, and record it in the run folder (gradients.json)."""
    for gradient in gradients:
        say(gradient.line())
    record = {"differentiator": differentiator, "layers": [dataclasses.asdict(gradient) for gradient in gradients]}
    storage.write_text(storage.join(run, storage.GRADIENTS), json.dumps(record, indent=1) + "\n")


def require_outputs(model: tf.keras.Model, label_width: int, config: Config) -> None:
    """A ModelError unless the model has one output of `label_width` values per circuit."""
    shape = model.output_shape
    if not isinstance(shape, tuple) or (shape[1:] or (1,)) != (label_width,):
        raise ModelError(
            f"the model of {config.model} outputs {shape} per batch, but the data's labels hold "
            f"{label_width} value(s) per circuit: its output must be (None, {label_width})"
        )


def restore(
    model: tf.keras.Model, checkpoint: ray.train.Checkpoint | None, summaries_dir: str | None
) -> tuple[int, int, list[dict]]:
    """Load a checkpoint's weights and optimizer state, and (into `summaries_dir`, if given)
    its TensorBoard logs; return its epochs done, steps done of the next and metrics history."""
    if checkpoint is None:
        return 0, 0, []
    checkpoint = whole(checkpoint)  # Ray Train's latest, or the newest whole one before it
    with tempfile.TemporaryDirectory() as folder:  # per worker: as_directory() is shared on a node
        checkpoint.to_directory(folder)
        model.load_weights(storage.weights_in(folder))
        with open(os.path.join(folder, storage.STATE_FILE)) as f:
            state = json.load(f)
        if summaries_dir:
            shutil.unpack_archive(os.path.join(folder, storage.SUMMARIES), summaries_dir)
    return state["epoch"], state.get("step", 0), state["history"]
