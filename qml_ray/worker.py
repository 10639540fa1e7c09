"""What each Ray Train worker runs: MultiWorkerMirroredStrategy training of the QCNN.

Ray's TensorflowTrainer sets TF_CONFIG on every worker before this runs. Each worker
trains on its own shard of the run's data set, reports every epoch to Ray Train and,
every `checkpoint_every` epochs (and at the next step boundary when a node of the run is
draining), saves weights, optimizer state, the metrics history and the TensorBoard logs as a
Ray Train checkpoint (the per-epoch work: callbacks.py).

TensorFlow is imported inside the functions: Ray Train's controller imports this module
to unpickle `train_worker`, and has no use for TensorFlow.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING

import ray.train

from qml_ray import runtime, storage
from qml_ray.checkpoints import whole
from qml_ray.config import Config

if TYPE_CHECKING:
    import tensorflow as tf


def train_worker(params: dict) -> None:
    """Ray Train's train_loop_per_worker; rank 0's lines go to the command's console.Console,
    if it gave one (else to this worker's log)."""
    import tensorflow as tf

    config, run, console = Config(**params["config"]), params["run"], params.get("console")
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    context = ray.train.get_context()
    if params.get("new_run"):  # rank 0 writes the data set (drawing it needs TFQ) and config, once
        from ray.train.collective import barrier

        from qml_ray.train import prepare_run

        if context.get_world_rank() == 0 and not storage.exists(storage.join(run, storage.CONFIG)):
            prepare_run(config, run, resume=False)
        barrier()
    from qml_ray.console import problems_told

    with problems_told(console, run):
        train_replica(
            config,
            run,
            strategy,
            context.get_world_rank(),
            context.get_world_size(),
            ray.train.get_checkpoint(),
            ray_train=True,
            local_rank=context.get_local_rank(),
            say=console.say if console else print,
        )


def train_replica(
    config: Config,
    run: str,
    strategy: tf.distribute.Strategy,
    rank: int,
    world_size: int,
    checkpoint: ray.train.Checkpoint | None = None,
    ray_train: bool = False,
    local_rank: int = 0,
    say: Callable[[str], None] = print,
) -> None:
    """Train this replica on its shard of the run's data, from `checkpoint` if given.

    Every runtime shares this: Ray Train workers (`ray_train`: report each epoch and save
    checkpoints), and the benchmark's plain TF_CONFIG processes and single process. Create
    `strategy` before calling: importing TFQ starts TensorFlow's runtime, after which a
    MultiWorkerMirroredStrategy can no longer be set up. `local_rank` (this worker's index on
    its node) offsets the profiler server's port. Rank 0 hands its console lines to `say`."""
    import tensorflow as tf

    from qml_ray.callbacks import (
        ConsoleLine,
        EpochClock,
        MetricsHistory,
        ProgressLine,
        RayMetrics,
        RayReport,
        RunLogs,
        StepProfiler,
        TensorBoardLog,
        Timings,
    )

    tf.get_logger().setLevel("ERROR")
    if config.profiler_port:
        tf.profiler.experimental.server.start(config.profiler_port + local_rank)
    from qml_ray import data
    from qml_ray.model import build_model

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
    done, step, rows = restore(model, checkpoint, summaries_dir)
    if rank == 0 and checkpoint is not None:  # a restart, or a resumed run
        say(f"continuing from the checkpoint of epoch {done}")

    clock = EpochClock()
    history = MetricsHistory(rows, clock, train_table.num_rows, train_steps)
    callbacks = [clock, history]  # in this order: each callback reads what those before it recorded
    if rank == 0:
        callbacks += [
            ProgressLine(config.epochs, train_steps, train_table.num_rows, say=say),
            ConsoleLine(history, config.epochs, say),
            TensorBoardLog(history, summaries_dir, data.shard(test_table, rank, world_size).num_rows),
            RunLogs(history, run, summaries_dir),
        ]
    if ray_train:
        callbacks.append(RayReport(history, config, summaries_dir, train_steps))
    if ray_train and rank == 0:
        callbacks.append(RayMetrics(history, os.path.basename(run)))
    profile_steps = config.profile_range()
    if rank == 0 and profile_steps:
        callbacks.insert(0, StepProfiler(profile_steps, summaries_dir, say))  # done before the logs publish
    if ray_train and (hold := os.environ.get(runtime.HOLD_ENV)):
        from qml_ray.hold import HoldAtStep

        callbacks.insert(0, HoldAtStep(hold))  # before RayReport, which checkpoints a drain seen there
    if timings := os.environ.get(runtime.TIMINGS_ENV):
        callbacks.append(Timings(os.path.join(timings, f"rank-{rank}.json")))

    def fit(steps: int, first_epoch: int, end_epoch: int) -> None:
        model.fit(
            train_set,
            steps_per_epoch=steps,
            validation_data=test_set,
            validation_steps=test_steps,
            epochs=end_epoch,
            initial_epoch=first_epoch,
            callbacks=callbacks,
            verbose=0,
        )

    if step:  # a checkpoint taken mid-epoch, on a drain notice: that epoch's remaining steps first
        if rank == 0:
            say(f"resuming epoch {done + 1} at step {step + 1} of {train_steps} (a node drained)")
        fit(train_steps - step, done, done + 1)
        done += 1
    if done < config.epochs:
        fit(train_steps, done, config.epochs)


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
        model.load_weights(os.path.join(folder, storage.WEIGHTS_PREFIX))
        with open(os.path.join(folder, storage.STATE_FILE)) as f:
            state = json.load(f)
        if summaries_dir:
            shutil.unpack_archive(os.path.join(folder, storage.SUMMARIES), summaries_dir)
    return state["epoch"], state.get("step", 0), state["history"]
