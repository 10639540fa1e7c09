"""The memory a process's state vectors may take: its threads' share of the machine's (or its container's)
memory and CPUs, as `config.worker_state_memory` sizes it, or QML_RAY_STATE_MEMORY_GIB.

`BlockAdjoint` runs as many circuits at once as this holds (`config.circuits_at_once`) and keeps as many
final states as it leaves (`config.kept_states`); the commands' memory check (`runtime.require_state_memory`)
sizes a worker by the same rule from its Ray node's memory and CPUs.
"""

import functools
import os
from pathlib import Path

from qml_ray import config
from qml_ray.errors import UsageError

MEMORY_VARIABLE = "QML_RAY_STATE_MEMORY_GIB"
CGROUP = Path("/sys/fs/cgroup")


def state_memory(threads: int) -> int:
    """Bytes for the state vectors of this process simulating on `threads` threads: QML_RAY_STATE_MEMORY_GIB
    if set, else `config.worker_state_memory` of this machine's memory and CPUs."""
    forced = os.environ.get(MEMORY_VARIABLE, "").strip()
    if forced:
        try:
            gib = float(forced)
        except ValueError:
            gib = -1.0
        if not gib > 0:
            raise UsageError(f"{MEMORY_VARIABLE}={forced} is no number of GiB above 0")
        return int(gib * 2**30)
    return config.worker_state_memory(machine_memory(), machine_cpus(), threads)


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
