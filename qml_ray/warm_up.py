"""A training worker starts importing TensorFlow the moment its process starts.

Ray Train creates its workers, then spends seconds setting the group up (its dataset manager,
the train context, TF_CONFIG) before the training function runs; the worker process sits idle
meanwhile. `start` is the job's `worker_process_setup_hook` (runtime.connect): in a process
that Ray Train starts as a training worker (fit marks them with TRAINING_WORKER_ENV), it
imports TensorFlow and TFQ's pure-Python dependencies in a background thread, so that the
imports overlap that set-up instead of following it. Not TFQ itself: importing it starts
TensorFlow's runtime, and the worker must create its MultiWorkerMirroredStrategy first.
Every other process of the job returns at once. An import the worker makes meanwhile waits for
the thread's (Python's import lock), so nothing is imported twice or half.
"""

import os
import threading

TRAINING_WORKER_ENV = "QML_RAY_TRAINING_WORKER"


def start() -> None:
    """Ray's worker_process_setup_hook: begin the imports in a training worker."""
    if os.environ.get(TRAINING_WORKER_ENV):
        threading.Thread(target=_import, name="qml_ray-warm-up", daemon=True).start()


def _import() -> None:
    import tensorflow  # noqa: F401, I001  (first: Ray Train's set-up imports it next, tf_backend.py)
    import sympy  # noqa: F401
    import cirq  # noqa: F401
