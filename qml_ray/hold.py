"""A training held at a step boundary, or an inference at a batch, so that a fault test injects its
fault while the work certainly runs.

With QML_RAY_HOLD (runtime.HOLD_ENV, which the commands pass on to their workers) naming a file
that holds a number of epochs N (empty: 0), every worker waits at each step boundary from the first
step after N epochs while rank 0 sees that file, unless Ray Train reports a node of the run
draining; while they wait, FILE.held exists. A test starts the command with the file in place,
waits for FILE.held, injects its fault
(a signal, a second command, a drain notice, a lost node), then removes the file. `infer`'s actors
likewise wait before every batch while the file exists (whatever it holds). Nothing here depends on
how fast the machine is.
"""

import time
from pathlib import Path

import ray.train
import tensorflow as tf
from ray.train.collective import broadcast_from_rank_zero

POLL_SECONDS = 0.2


class HoldAtStep(tf.keras.callbacks.Callback):
    """Waits at every step boundary after the epochs in the file at `path` while it exists and no node
    is draining. Every rank asks rank 0 the same questions in the same order (both are collective)."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs_done = epoch

    def on_train_batch_end(self, batch, logs=None):
        while broadcast_from_rank_zero(self.held()) and ray.train.get_preemption_info() is None:
            Path(f"{self.path}.held").touch()  # tells the test that training waits
            time.sleep(POLL_SECONDS)

    def held(self) -> bool:
        try:
            with open(self.path) as f:
                return self.epochs_done >= int(f.read().strip() or 0)
        except FileNotFoundError:
            return False


def wait_at_batch(path: str) -> None:
    """An inference actor's hold: wait while the file at `path` exists, saying so with FILE.held."""
    while Path(path).exists():
        Path(f"{path}.held").touch()
        time.sleep(POLL_SECONDS)
