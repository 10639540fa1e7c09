"""The benchmark's timings, as the `callbacks` of its runs: each rank's Timings, written to
<run>/timings/rank-N.json when its training ends."""

import json
import os
import resource
import time

import tensorflow as tf

from qml_ray.bench.runtimes import TIMINGS_FOLDER


def per_rank(rank: int, run: str) -> list:
    """The `callbacks` function of the benchmark's runs (runtimes.TIMINGS)."""
    return [Timings(os.path.join(run, TIMINGS_FOLDER, f"rank-{rank}.json"))]


class Timings(tf.keras.callbacks.Callback):
    """For the benchmark: when the first training step started (Unix time), each epoch's
    seconds and the process's peak memory, written as JSON to `path` when training ends. Each
    epoch is split too: its training steps (each from just before Keras runs it to after every
    callback's end-of-step work, this one being last), its validation, and the end-of-epoch
    work of the other callbacks; the rest is Keras's own between steps."""

    PHASES = ("step_seconds", "validation_seconds", "epoch_end_seconds")

    def __init__(self, path: str):
        super().__init__()
        self.path, self.first_step_at, self.epoch_seconds = path, None, []
        self.phases = {phase: [] for phase in self.PHASES}

    def on_train_batch_begin(self, batch, logs=None):
        if self.first_step_at is None:
            self.first_step_at = time.time()
        self.step_started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.steps += time.perf_counter() - self.step_started

    def on_epoch_begin(self, epoch, logs=None):
        self.started, self.steps = time.perf_counter(), 0.0

    def on_test_begin(self, logs=None):
        self.validation_started = time.perf_counter()

    def on_test_end(self, logs=None):
        self.validation_ended = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        ended = time.perf_counter()
        self.epoch_seconds.append(ended - self.started)
        for phase, seconds in zip(
            self.PHASES,
            (self.steps, self.validation_ended - self.validation_started, ended - self.validation_ended),
            strict=True,
        ):
            self.phases[phase].append(seconds)

    def on_train_end(self, logs=None):
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "w") as f:
            json.dump(
                {
                    "first_step_at": self.first_step_at,
                    "epoch_seconds": self.epoch_seconds,
                    **self.phases,
                    "peak_memory_mb": peak_mb,
                },
                f,
            )
