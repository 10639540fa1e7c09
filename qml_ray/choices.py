"""What the block kernel's plan leaves to the CPU: the choices that give the same numbers, each faster on some
machines than on others, which `qml_ray.gradients.planner` measures (docs/kernel-notes.md#the-planner). No
TensorFlow here, and the kernel's module is imported only when asked for (importing it checks
QML_RAY_KERNEL_PATH), so the commands check a config's `kernel_plan` before anything starts.

A `Choice` is written as words, `avx512 form=4 tiles=16 parked=4 prefetch=off huge_pages=on`, and read back from any
subset of them (PLAN_VARIABLE, the config's `kernel_plan`): what it names is fixed, the rest is left to the
planner.
"""

from typing import NamedTuple

from qml_ray.errors import UsageError

PLAN_VARIABLE = "QML_RAY_KERNEL_PLAN"  # fixes some of the choice's fields (the config's kernel_plan)
SECONDS_VARIABLE = "QML_RAY_PLAN_SECONDS"  # the planner's budget per shape (the config's plan_seconds)
DEFAULT_SECONDS = 10.0
# A segment's tile: 2^16 amplitudes, 512 KiB (both planes), so it stays in a core's L2 cache while every
# block of the segment passes over it (plan/segments.py).
DEFAULT_TILE_BITS = 16
PATHS = ("avx512", "avx2", "portable")  # the kernel's SIMD builds (CMakeLists.txt), fastest first
FORMS = (4, 3)  # real multiply-adds a complex product takes in a block's pass: four, or three and an add
TILES = (15, 16, 17, 18)  # a segment's tiles of 2^bits amplitudes: 256 KiB to 2 MiB with both planes
# The low bits where the qubits needed last wait (plan/placement.py): fewer make smaller relabellings, more keep
# blocks off short chunks. At most the kernel's PARKED_BITS (5).
PARKS = (4, 5)
DEFAULT_PARKED = 4
SWITCHES = {"on": True, "off": False}
# How a batch's circuits share a worker's threads, where the memory holds several at once: side by side, one a
# thread; or one at a time on every thread (shared), where they would contend for the memory's bandwidth.
SPREADS = ("side-by-side", "shared")


class Choice(NamedTuple):
    path: str  # the SIMD path (PATHS): avx2 can match avx512 where 512-bit FMAs are split in two
    form: int = 4  # FORMS: three multiply-adds where the CPU's adds issue beside its FMAs
    tile_bits: int = DEFAULT_TILE_BITS  # TILES: larger tiles make fewer segments, smaller ones stay in cache
    parked: int = DEFAULT_PARKED  # PARKS: four or five
    prefetch: bool = False  # a segment fetches its next tile while its blocks work on one
    huge_pages: bool = True  # states of 2 MiB and more ask for transparent huge pages

    def __str__(self) -> str:
        switch = {True: "on", False: "off"}
        return (
            f"{self.path} form={self.form} tiles={self.tile_bits} parked={self.parked} "
            f"prefetch={switch[self.prefetch]} huge_pages={switch[self.huge_pages]}"
        )


def default() -> Choice:
    """The choice before anything is measured: the process's kernel path and the plan's defaults."""
    from qml_ray import kernel

    return Choice(kernel.PATH, tile_bits=DEFAULT_TILE_BITS, parked=DEFAULT_PARKED)


def fixed(text: str, source: str) -> dict:
    """The fields a choice's words fix ("avx2 tiles=17 prefetch=on", any subset, in any order); a UsageError
    naming `source` for a word it cannot read."""
    fixes = {}
    for word in text.replace(",", " ").split():
        name, _, value = word.partition("=")
        if not value and name in PATHS:
            name, value = "path", name
        fixes[name] = _field(name, value, source)
    return fixes


def _field(name: str, value: str, source: str):
    readers = {
        "path": (PATHS, str),
        "form": (tuple(map(str, FORMS)), int),
        "tiles": (tuple(map(str, TILES)), int),
        "parked": (tuple(map(str, PARKS)), int),
        "prefetch": (tuple(SWITCHES), SWITCHES.get),
        "huge_pages": (tuple(SWITCHES), SWITCHES.get),
        "spread": (SPREADS, str),
    }
    if name not in readers or value not in readers[name][0]:
        allowed = "; ".join(f"{key}={'|'.join(values)}" for key, (values, _) in readers.items())
        raise UsageError(f"{source}: cannot read {name}={value or '?'} (it takes {allowed})")
    return readers[name][1](value)


def runnable(fixes: dict, source: str) -> dict:
    """`fixes`, if this CPU runs the path they name; else a UsageError naming `source`."""
    from qml_ray import kernel

    if fixes.get("path", kernel.PATH) not in kernel.supported_paths():
        runs = ", ".join(kernel.supported_paths())
        raise UsageError(f"{source}: this CPU cannot run the {fixes['path']} path (it runs {runs})")
    return fixes


def with_fixes(choice: Choice, fixes: dict) -> Choice:
    """`choice` with the fields `fixes` (from `fixed`) names set (`spread` is a batch's, not a plan's)."""
    fields = {("tile_bits" if name == "tiles" else name): value for name, value in fixes.items() if name != "spread"}
    return choice._replace(**fields)
