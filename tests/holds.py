"""For the fault tests: a command's training held at a step, or its inference at a batch, while a
file exists, so that a test injects its fault while the work certainly runs.

The test names the file in the command's environment (HOLD_ENV; on a cluster, in the job's runtime
environment) holding a number of epochs N (empty: 0). Training held: the command runs with HOLD
(`--callbacks tests.holds:hold`), and every worker waits before each training step from the first
after N epochs while rank 0 sees the file, but for one step once Ray Train reports a node of the
run draining (the drain's checkpoint comes at that step's end; then it waits again). Inference
held: the run's model is `held_qcnn`, the QCNN whose calls in `infer`'s actors wait while the file
exists. While they wait, FILE.held exists. The test starts the command with the file in place,
waits for FILE.held, injects its fault (a signal, a second command, a drain notice, a lost node),
then removes the file. Nothing here depends on how fast the machine is.
"""

import os
import time
from pathlib import Path

import ray.train
import tensorflow as tf
from ray.train.collective import broadcast_from_rank_zero

HOLD_ENV = "QML_RAY_HOLD"
HOLD = ("--callbacks", "tests.holds:hold")  # a command's options for a held training
POLL_SECONDS = 0.2


def hold(rank: int, run: str) -> list:
    """The `callbacks` function of a held training: HoldAtStep, when HOLD_ENV names a file."""
    return [HoldAtStep(os.environ[HOLD_ENV])] if HOLD_ENV in os.environ else []


class HoldAtStep(tf.keras.callbacks.Callback):
    """Waits before every step after the epochs in the file at `path` while it exists, but the first
    step after a node is seen draining. Every rank asks rank 0 the same questions in the same order
    (both are collective)."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self.drained = False  # a drain let one step run

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs_done = epoch

    def on_train_batch_begin(self, batch, logs=None):
        while broadcast_from_rank_zero(self.held()):
            if ray.train.get_preemption_info() is not None and not self.drained:
                self.drained = True  # this step runs, and the drain's checkpoint comes at its end
                return
            Path(f"{self.path}.held").touch()  # tells the test that training waits
            time.sleep(POLL_SECONDS)

    def held(self) -> bool:
        try:
            with open(self.path) as f:
                return self.epochs_done >= int(f.read().strip() or 0)
        except FileNotFoundError:
            return False


def held_qcnn(qubits: int, layers: int, hidden_activation: str, learning_rate: float, seed: int) -> tf.keras.Model:
    """The QCNN (qml_ray.model:qcnn, so a QCNN run's weights load into it), whose eager calls (an
    inference actor's, one per batch) first wait while the file HOLD_ENV names exists."""
    from qml_ray.model import qcnn

    model = qcnn(qubits, layers, hidden_activation, learning_rate, seed)
    call = model.call

    def held_call(inputs, training=None, mask=None):
        while tf.executing_eagerly() and Path(os.environ[HOLD_ENV]).exists():
            Path(f"{os.environ[HOLD_ENV]}.held").touch()
            time.sleep(POLL_SECONDS)
        return call(inputs, training=training, mask=mask)

    model.call = held_call
    return model
