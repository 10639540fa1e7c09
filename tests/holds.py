"""For the fault tests: a command's training held at a step, or its inference at a batch, while a
file exists, so that a test injects its fault while the work certainly runs.

Training held: the command runs with HOLD (`--callbacks tests.holds:hold`), and a file named HOLD_FILE
in a folder above the run's (the test's own temporary folder) holds a number of epochs N (empty: 0).
Every worker, wherever it runs (a local Ray, a shared cluster, another node of a multi-node one),
waits before each training step from the first after N epochs while rank 0 sees the file, but for one
step once Ray Train reports a node of the run draining (the drain's checkpoint comes at that step's
end; then it waits again). Inference held: the run's model is `held_qcnn`, the QCNN whose calls in
`infer`'s actors, wherever they run, wait while the file its `hold` param names exists. While they
wait, FILE.held exists. The test starts the command with the file in place, waits for FILE.held,
injects its fault (a signal, a second command, a drain notice, a lost node), then removes the file.
Nothing here depends on how fast the machine is.
"""

import time
from pathlib import Path

import ray.train
import tensorflow as tf
from ray.train.collective import broadcast_from_rank_zero

HOLD_FILE = "hold"  # a held training's file, in a folder above its run's
HOLD = ("--callbacks", "tests.holds:hold")  # a command's options for a held training
POLL_SECONDS = 0.2


def held_marker(file) -> Path:
    """FILE.held: exists once a hold on `file` waits."""
    return Path(f"{file}.held")


def hold(rank: int, run: str) -> list:
    """The `callbacks` function of a held training (every rank's: the hold is collective)."""
    return [HoldAtStep(run)]


class HoldAtStep(tf.keras.callbacks.Callback):
    """Waits before every step after the epochs in the nearest HOLD_FILE above the run's folder (if
    the run is a local folder) while it exists, but the first step after a node is seen draining.
    Every rank asks rank 0 the same questions in the same order (both are collective)."""

    def __init__(self, run: str):
        super().__init__()
        self.files = [folder / HOLD_FILE for folder in Path(run).parents] if Path(run).is_absolute() else []
        self.drained = False  # a drain let one step run

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs_done = epoch

    def on_train_batch_begin(self, batch, logs=None):
        while file := broadcast_from_rank_zero(self.holding()):
            if ray.train.get_preemption_info() is not None and not self.drained:
                self.drained = True  # this step runs, and the drain's checkpoint comes at its end
                return
            held_marker(file).touch()  # tells the test that training waits
            time.sleep(POLL_SECONDS)

    def holding(self) -> Path | None:
        """The nearest hold file, if it holds this epoch's steps."""
        for file in self.files:
            try:
                epochs = int(file.read_text().strip() or 0)
            except FileNotFoundError:
                continue
            return file if self.epochs_done >= epochs else None
        return None


def held_qcnn(
    qubits: int, layers: int, hidden_activation: str, learning_rate: float, seed: int, hold: str
) -> tf.keras.Model:
    """The QCNN (qml_ray.model:qcnn, so a QCNN run's weights load into it), whose eager calls (an
    inference actor's, one per batch) first wait while the file `hold` exists."""
    from qml_ray.model import qcnn

    model = qcnn(qubits, layers, hidden_activation, learning_rate, seed)
    call = model.call

    def held_call(inputs, training=None, mask=None):
        while tf.executing_eagerly() and Path(hold).exists():
            held_marker(hold).touch()
            time.sleep(POLL_SECONDS)
        return call(inputs, training=training, mask=mask)

    model.call = held_call
    return model
