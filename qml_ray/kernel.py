"""The block adjoint method's compiled kernel (the C++ in src/), on the fastest SIMD path this CPU runs.

The kernel is built once per path, each a module of its own, as qsim builds its simulators: avx512, avx2
and portable on x86-64, portable elsewhere. Importing this module imports the fastest path the CPU (and
its OS) supports, or the one QML_RAY_KERNEL_PATH names: a lower path, for tests and for node pools of mixed
CPUs. No TensorFlow here, so a command can check the path before it starts anything. The tests run
every path in one process, so the path is switchable (`use`): the module holds one reference to the
running path's module, and its names are read through it.
"""

import importlib
import os

from qml_ray import _kernel_portable  # built for any CPU: it tells which paths this one runs
from qml_ray.choices import PATHS
from qml_ray.errors import UsageError

PATH_VARIABLE = "QML_RAY_KERNEL_PATH"
supported_paths, cpu_features = _kernel_portable.supported_paths, _kernel_portable.cpu_features


def compiled(path: str):
    """The kernel's module built for `path`."""
    return importlib.import_module(f"qml_ray._kernel_{path}")


def chosen_path() -> str:
    """QML_RAY_KERNEL_PATH if set, else the fastest path this CPU runs; a UsageError for an unknown path or
    one this CPU cannot run."""
    supported = supported_paths()
    forced = os.environ.get(PATH_VARIABLE, "").strip()
    if not forced:
        return supported[0]
    if forced not in PATHS:
        raise UsageError(f"{PATH_VARIABLE}={forced} names no kernel path: use one of {', '.join(PATHS)}")
    if forced not in supported:
        raise UsageError(
            f"{PATH_VARIABLE}={forced}: this CPU cannot run the {forced} kernel (its features: "
            f"{cpu_features()}); it runs {', '.join(supported)}"
        )
    return forced


_running = None  # the compiled module of the path the kernel runs on: `use` switches it


def use(path: str) -> str | None:
    """Run the kernel on `path` (one this CPU runs) from now on, in this process: the tests run every path
    so, and the benchmark a forced one. Returns the path it ran on before. Plans are made per path. This
    one reference is all a switch changes: every name is read through it (`__getattr__`)."""
    global _running
    before = _running and _running.PATH
    _running = compiled(path)
    return before


def __getattr__(name: str):
    """The running path's names (`PATH`, `Circuit`, `apply_block`, ...), read at each use, so that callers
    (`kernel.PATH`) see the path `use` chose last."""
    return getattr(_running, name)


use(chosen_path())
PATH: str
MIN_QUBITS: int
START_BITS: int
PARKED_BITS: int
CHUNK_BITS: int
