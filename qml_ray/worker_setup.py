"""What every process of a job does first: `start` is the job's `worker_process_setup_hook`
(runtime.connect), so it runs in each worker process before its task or actor.

Its cluster. Ray looks "the cluster" up again inside its workers: Ray Train's placement-group
cleaner (a state API call without an address) takes RAY_ADDRESS, else the cluster of the last
`ray start` on the machine, else any GCS process found there. With two Rays on one machine (a
local run beside a `ray start` cluster) that found the other cluster, or both: the cleaner failed,
or missed the run's controller there and removed its live placement group. `start` names the
process's own cluster in RAY_ADDRESS.

Its imports, in a training worker. Ray Train creates its workers, then spends seconds setting
the group up (its dataset manager, the train context, TF_CONFIG) before the training function
runs; the worker process sits idle meanwhile. In a process that Ray Train starts as a training
worker (fit marks them with TRAINING_WORKER_ENV), `start` imports TensorFlow and TFQ's
pure-Python dependencies in a background thread, so that the imports overlap that set-up instead
of following it. Not TFQ itself: importing it starts TensorFlow's runtime, and the worker must
create its MultiWorkerMirroredStrategy first. An import the worker makes meanwhile waits for the
thread's (Python's import lock), so nothing is imported twice or half.

Its garbage collector. Importing TensorFlow, TFQ and cirq makes half a million objects, hardly any of
them garbage, and every later collection of Python's oldest generation walks them all again while the
worker builds and traces its model. `collector_paused` keeps them out of it; the inference actors
and the serving replicas build their models within it too.
"""

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

import ray

TRAINING_WORKER_ENV = "QML_RAY_TRAINING_WORKER"


def start() -> None:
    """Ray's worker_process_setup_hook: name this process's cluster; begin a training worker's imports."""
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    if os.environ.get(TRAINING_WORKER_ENV):
        threading.Thread(target=_import, name="qml_ray-warm-up", daemon=True).start()


def _import() -> None:
    with collector_paused():
        import tensorflow  # noqa: F401, I001  (first: Ray Train's set-up imports it next, tf_backend.py)
        import sympy  # noqa: F401
        import cirq  # noqa: F401


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's garbage collector paused while the body imports TensorFlow or builds a model (hardly
    any of what it makes is garbage), then everything it made moved out of the collector's way (gc.freeze):
    1.5 of the 12.5 CPU-seconds of a smoke training's worker here (docs/testing.md)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
