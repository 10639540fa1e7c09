"""The simulator's memory model: what a process's state vectors may take (its threads' share of the machine's,
or its container's, memory and CPUs: `worker_state_memory`, or QML_RAY_STATE_MEMORY_GIB), how many circuits it
runs at once in that (`circuits_at_once`) and how many final states it keeps (`kept_states`).

`BlockAdjoint` sizes itself by it; the commands' memory checks (`runtime.require_state_memory`, the
benchmark's) size a process by the same rule, from a Ray node's or this machine's memory and CPUs. No
TensorFlow: the driver checks with it.
"""

import functools
import os
import sys
from pathlib import Path

from qml_ray.errors import UsageError

MEMORY_VARIABLE = "QML_RAY_STATE_MEMORY_GIB"
CGROUP = Path("/sys/fs/cgroup")
AMPLITUDE_BYTES = 8  # complex64
# A circuit's states at once: TFQ's adjoint gradient keeps 3, the block method 2 (IN_FLIGHT_STATES) and the
# final state its forward keeps for the gradient.
STATES_PER_CIRCUIT = 3
IN_FLIGHT_STATES = 2  # the block method's state and co-state of each circuit it runs (its kept state among them)
# A process gives its state vectors this share of its CPUs' share of the machine's memory: a worker runs as
# many circuits at once as fit it (docs/kernel-notes.md#threads); QML_RAY_STATE_MEMORY_GIB overrides it.
STATE_MEMORY_SHARE = 0.75


def state_memory(threads: int) -> int:
    """Bytes for the state vectors of this process simulating on `threads` threads: QML_RAY_STATE_MEMORY_GIB
    if set, else `worker_state_memory` of this machine's memory and CPUs."""
    forced = os.environ.get(MEMORY_VARIABLE, "").strip()
    if forced:
        try:
            gib = float(forced)
        except ValueError:
            gib = -1.0
        if not gib > 0:
            raise UsageError(f"{MEMORY_VARIABLE}={forced} is no number of GiB above 0")
        return int(gib * 2**30)
    return worker_state_memory(machine_memory(), machine_cpus(), threads)


@functools.cache
def machine_memory() -> int:
    """This machine's memory, or its container's limit when lower (cgroup v2 or v1)."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in (CGROUP / "memory.max", CGROUP / "memory" / "memory.limit_in_bytes"):
        value = _read(limit)
        if value.isdigit():
            memory = min(memory, int(value))
    return memory


@functools.cache
def machine_cpus() -> float:
    """The CPUs this process may use: its container's quota when it has one (cgroup v2), else the CPUs it
    may run on."""
    cpus = float(len(os.sched_getaffinity(0)))
    quota = _read(CGROUP / "cpu.max").split()
    if len(quota) == 2 and quota[0].isdigit() and quota[1].isdigit() and int(quota[1]):
        cpus = min(cpus, int(quota[0]) / int(quota[1]))
    return cpus


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def state_bytes(qubits: int, threads: int, memory: int) -> int:
    """Memory the state vectors of a process simulating on `threads` threads take at most, with `memory` bytes
    for them: IN_FLIGHT_STATES for each circuit it runs at once (`circuits_at_once`) and the final states it
    keeps (`kept_states`). Never more than `memory` once one circuit fits it."""
    one = AMPLITUDE_BYTES * 2**qubits
    return (IN_FLIGHT_STATES * circuits_at_once(one, threads, memory) + kept_states(threads, one, memory)) * one


def circuits_at_once(one_state_bytes: int, threads: int, memory: int | None = None) -> int:
    """How many circuits of states of `one_state_bytes` a process on `threads` threads, with `memory` bytes
    for its states (None: no bound), runs at once, each on its share of the threads: one per thread while
    each fits with its kept final state (STATES_PER_CIRCUIT), else as many as fit so, at least one."""
    if memory is None:
        return threads
    return max(1, min(threads, memory // (STATES_PER_CIRCUIT * one_state_bytes)))


def kept_states(threads: int, one_state_bytes: int, memory: int | None = None) -> int:
    """How many final states a process simulating on `threads` threads keeps for its gradients: as many as
    `memory` bytes leave beside its circuits in flight (none, when they take it all), so that a training step's
    batch needs no circuit simulated again; with no bound (None), every one."""
    if memory is None:
        return sys.maxsize
    return max(0, memory // one_state_bytes - IN_FLIGHT_STATES * circuits_at_once(one_state_bytes, threads, memory))


def worker_state_memory(memory: int, cpus: float, threads: int) -> int:
    """The bytes a process on `threads` of a machine's `cpus` CPUs gives its state vectors, out of the
    machine's `memory`: STATE_MEMORY_SHARE of its CPUs' share of it (the rest for TensorFlow, Ray, the OS)."""
    return int(STATE_MEMORY_SHARE * memory * min(1.0, threads / max(cpus, 1e-9)))
