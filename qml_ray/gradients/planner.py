"""The plan's choices measured on the machine that runs them, as FFTW's planner does (docs/kernel-notes.md#the-planner).

A circuit's shape (qubits, blocks, threads) gets the `Choice` whose forward pass this CPU runs fastest: the first
circuit of a shape is timed under each choice in turn, one field at a time from the best so far, within a budget
of seconds (`QML_RAY_PLAN_SECONDS`, the config's `plan_seconds`; 0 measures nothing). What was measured is kept in
a small JSON file under the user's cache folder, one file per CPU model and kernel build, so a worker measures
only what is missing; a damaged or foreign file is ignored with one warning. `QML_RAY_KERNEL_PLAN` (the config's
`kernel_plan`) fixes any of the choice's fields, and `QML_RAY_KERNEL_PATH` its path.
"""

import concurrent.futures
import contextlib
import fcntl
import functools
import hashlib
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np
import pydantic

from qml_ray import choices, kernel
from qml_ray.choices import Choice
from qml_ray.errors import UsageError
from qml_ray.gradients.plan import canonical_plan, placement

BETTER = 0.97  # a choice replaces the best so far only when at least 3% faster (the rest is the machine's noise)
HUGE_PAGE_QUBITS = 18  # states of 2 MiB (2^18 complex64 amplitudes) and more ask for huge pages


class Shape(NamedTuple):
    qubits: int
    blocks: int
    threads: int

    def __str__(self) -> str:
        return f"{self.qubits} qubits, {self.blocks} blocks, {self.threads} thread{'s' * (self.threads > 1)}"


class Record(pydantic.BaseModel):
    """What is known of a shape: the best choice so far, the seconds of each choice measured, the fields tried;
    on several threads, how a batch spreads over them (`choices.SPREADS`) and the seconds of each spread."""

    model_config = pydantic.ConfigDict(extra="forbid")
    best: str
    seconds: dict[str, float]
    tried: list[str]
    spread: Literal[choices.SPREADS] | None = None
    spread_seconds: dict[str, float] = {}


class CacheFile(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    cpu: str
    kernel: str
    shapes: dict[str, Record]


@functools.cache
def machine() -> dict:
    """This CPU's model name and caches, and a digest of the kernel's builds (a rebuilt kernel plans anew)."""
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    digest = hashlib.blake2b(digest_size=8)
    for path in kernel.PATHS:
        with contextlib.suppress(ImportError):
            digest.update(Path(kernel.compiled(path).__file__).read_bytes())
    return {"cpu": cpu, "kernel": digest.hexdigest(), "caches": caches(), "paths": kernel.supported_paths()}


def caches() -> str:
    """This CPU's data caches, as the OS lists them (L1d 48K, L2 1024K, L3 32768K), for the reports."""
    found = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        with contextlib.suppress(OSError):
            if (index / "type").read_text().strip() != "Instruction":
                found.append(f"L{(index / 'level').read_text().strip()} {(index / 'size').read_text().strip()}")
    return ", ".join(found) or "caches unknown"


def cache_path() -> Path:
    """This machine kind's file: under $XDG_CACHE_HOME (default ~/.cache), qml_ray/plans-<digest>.json."""
    found = machine()
    key = hashlib.blake2b(f"{found['cpu']}\n{found['kernel']}".encode(), digest_size=6).hexdigest()
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "qml_ray" / f"plans-{key}.json"


class Planner:
    """The choice for each shape, from `fixes` (the fields a user fixed), the cache file and measurement."""

    def __init__(self, fixes: dict, seconds: float, path: Path):
        self.fixes, self.seconds, self.path = fixes, seconds, path
        self.lines: list[str] = []  # what it has to say, for the console (`said`)
        self._records, warning = read_records(path)
        self.lines += [warning] if warning else []
        self._chosen: dict[Shape, Choice] = {}
        self._spreads: dict[Shape, str] = {}
        self._lock = threading.RLock()

    def choice(self, program: bytes, names: tuple, pauli_sums: np.ndarray, threads: int) -> Choice:
        """The choice for the shape of `program` (canonical) on `threads` threads: known, or measured now."""
        shape = Shape(*size(program, names), threads)
        if known := self._chosen.get(shape):  # every circuit of a batch asks: no lock once known
            return known
        with self._lock:
            if shape not in self._chosen:
                default = choices.with_fixes(choices.default(), self.fixes)
                self._chosen[shape] = self._plan(shape, default, program, names, pauli_sums)
            return self._chosen[shape]

    def spread(self, program: bytes, names: tuple, pauli_sums: np.ndarray, threads: int) -> str:
        """How a batch of circuits of `program`'s shape spreads over `threads` threads, where the memory holds
        that many at once: fixed, known, or measured now (`threads` circuits side by side, one a thread, against
        as many one after another on every thread, each under its shape's choice)."""
        shape = Shape(*size(program, names), threads)
        with self._lock:
            if shape not in self._spreads:
                self._spreads[shape] = self._measure_spread(shape, program, names, pauli_sums)
            return self._spreads[shape]

    def _measure_spread(self, shape: Shape, program: bytes, names: tuple, pauli_sums) -> str:
        if "spread" in self.fixes:
            return self.fixes["spread"]
        alone, shared = (self.choice(program, names, pauli_sums, n) for n in (1, shape.threads))
        known = self._records.get(str(shape))
        if known and known.spread:
            return known.spread
        if self.seconds <= 0:
            return choices.SPREADS[0]
        every = Timer(program, names, pauli_sums, shape.threads)
        shared_seconds = shape.threads * every(shared, warm=True)
        seconds = {"side-by-side": side_by_side(Timer(program, names, pauli_sums, 1), alone, shape.threads)}
        seconds["shared"] = shared_seconds
        spread = "shared" if seconds["shared"] < BETTER * seconds["side-by-side"] else "side-by-side"
        base = self._records.get(str(shape)) or Record(best=str(shared), seconds={}, tried=[])
        self._save(shape, base.model_copy(update={"spread": spread, "spread_seconds": seconds}))
        self.lines.append(
            f"kernel plan for {shape}: a batch {spread} ({shape.threads} circuits in {seconds['side-by-side']:.3g} s "
            f"side by side, {seconds['shared']:.3g} s one at a time on every thread)"
        )
        return spread

    def said(self) -> list[str]:
        """The lines it has to say since it was last asked (the choices made, a cache ignored)."""
        with self._lock:
            lines, self.lines = self.lines, []
            return lines

    def _plan(self, shape: Shape, default: Choice, program: bytes, names: tuple, pauli_sums) -> Choice:
        record = self._records.get(str(shape))
        best = choices.with_fixes(_read_choice(record.best), self.fixes) if record else default
        trials = [t for t in field_trials(shape, self.fixes) if not record or t[0] not in record.tried]
        if not trials or self.seconds <= 0:
            self.lines.append(f"kernel plan for {shape}: {best} ({'from the cache' if record else 'not measured'})")
            return best
        timer = Timer(program, names, pauli_sums, shape.threads)
        seconds = dict(record.seconds) if record else {}
        tried = list(record.tried) if record else []
        started = time.perf_counter()
        seconds[str(best)] = timer(best, warm=True)
        for done, (field, values) in enumerate(trials):
            if done and time.perf_counter() - started > self.seconds:  # one field at least, past the budget
                break
            for value in values:
                candidate = best._replace(**{field: value})
                if str(candidate) not in seconds:
                    seconds[str(candidate)] = timer(candidate, warm=field == "huge_pages")
            best = min(
                (best._replace(**{field: v}) for v in values), key=lambda c: seconds[str(c)] * BETTER ** (c == best)
            )
            tried.append(field)
        spent = time.perf_counter() - started
        self._save(shape, Record(best=str(best), seconds=seconds, tried=tried))
        left = len(field_trials(shape, self.fixes)) - len(tried)
        by_default = seconds.get(str(default), seconds[str(best)])
        self.lines.append(
            f"kernel plan for {shape}: {best}, {seconds[str(best)]:.3g} s a forward against {by_default:.3g} s by "
            f"default ({len(seconds)} choices measured in {spent:.1f} s"
            + (f"; {left} fields left for the next run)" if left else ")")
        )
        return best

    def _save(self, shape: Shape, record: Record) -> None:
        """The record written into the cache file, merged with what other processes wrote (under a lock), the
        file replaced whole; a folder that cannot be written is said once and otherwise ignored."""
        self._records[str(shape)] = record
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path.with_suffix(".lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                on_disk = read_records(self.path)[0]
                here = machine()
                whole = CacheFile(cpu=here["cpu"], kernel=here["kernel"], shapes={**on_disk, str(shape): record})
                with tempfile.NamedTemporaryFile("w", dir=self.path.parent, delete=False, suffix=".tmp") as out:
                    out.write(whole.model_dump_json(indent=1))
                os.replace(out.name, self.path)
        except OSError as err:
            self.lines.append(f"warning: kernel plans not kept in {self.path}: {err.strerror}")


def read_records(path: Path) -> tuple[dict[str, Record], str | None]:
    """The cache file's records if it is this machine kind's and whole; else none and one warning line."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}, None
    except OSError as err:
        return {}, f"warning: kernel plans not read from {path}: {err.strerror}"
    try:
        found = CacheFile.model_validate_json(text)
        for record in found.shapes.values():
            _read_choice(record.best)
    except (pydantic.ValidationError, ValueError, UsageError) as err:
        return {}, f"warning: ignoring {path}, damaged ({str(err).splitlines()[0]}); plans are measured anew"
    here = machine()
    if (found.cpu, found.kernel) != (here["cpu"], here["kernel"]):
        return {}, (
            f"warning: ignoring {path}, written for another CPU or kernel build ({found.cpu}); plans are measured anew"
        )
    return dict(found.shapes), None


def field_trials(shape: Shape, fixes: dict) -> list[tuple[str, tuple]]:
    """The fields to measure for `shape`, each with its values, but those fixed or of no effect at its size:
    parked bits from 12 qubits, tiles and prefetch only where a state holds several of the smallest tiles, huge
    pages from 2 MiB."""
    fields = [("form", choices.FORMS), ("path", tuple(kernel.supported_paths()))]
    if len({placement.parked_bits(shape.qubits, parked) for parked in choices.PARKS}) > 1:
        fields.append(("parked", choices.PARKS))
    if shape.qubits > min(choices.TILES):
        fields += [("tile_bits", tuple(t for t in choices.TILES if t < shape.qubits)), ("prefetch", (False, True))]
    if shape.qubits >= HUGE_PAGE_QUBITS:
        fields.append(("huge_pages", (True, False)))
    named = {"tiles": "tile_bits"}
    return [(f, v) for f, v in fields if len(v) > 1 and f not in {named.get(k, k) for k in fixes}]


class Timer:
    """Seconds of a circuit's forward pass under a choice (its plan made first, out of the timing): the fastest of
    three passes where one takes under 0.1 s, of two under 1 s, else of one (the machine's noise weighs most on
    short passes, and a long one is the budget's)."""

    def __init__(self, program: bytes, names: tuple, pauli_sums: np.ndarray, threads: int):
        self.program, self.names, self.sums, self.threads = program, names, tuple(pauli_sums), threads
        self.values = np.zeros(len(names))
        self.last = np.inf

    def __call__(self, choice: Choice, warm: bool = False) -> float:
        """`warm`: one pass first, untimed (a new kind of buffer's pages faulted in, a new team of threads)."""
        if warm:
            self.last = self.once(choice)
        self.last = min(self.once(choice) for _ in range(1 + (self.last < 1) + (self.last < 0.1)))
        return self.last

    def once(self, choice: Choice) -> float:
        """Seconds of one pass."""
        planned = canonical_plan(self.program, self.names, choice)
        readouts, out = planned.readouts(self.sums), np.zeros(len(self.sums))
        started = time.perf_counter()
        planned.kernel.circuit_expectations(planned.compiled, self.values, readouts, out, self.threads)
        return time.perf_counter() - started


def side_by_side(one: "Timer", choice: Choice, threads: int) -> float:
    """Seconds of `threads` forward passes at once, one a thread: the fastest of two rounds where a pass takes
    under a second (the first makes the threads' buffers), else of one (a large state's fresh buffer is what a
    batch side by side pays too)."""
    alone = one.once(choice)
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        rounds = []
        for _ in range(1 + (alone < 1)):
            started = time.perf_counter()
            list(pool.map(lambda _: one.once(choice), range(threads)))
            rounds.append(time.perf_counter() - started)
    return min(rounds)


@functools.lru_cache(maxsize=8192)
def size(program: bytes, names: tuple) -> tuple[int, int]:
    """A program's qubits and blocks (any choice plans the same)."""
    circuit = canonical_plan(program, names).circuit
    return circuit.qubits, len(circuit.relabel)


def _read_choice(text: str) -> Choice:
    """A choice as `str(choice)` wrote it; a ValueError if any field is missing or unreadable."""
    fixes = choices.fixed(text, "the cache")
    if set(fixes) != {"path", "form", "tiles", "parked", "prefetch", "huge_pages"}:
        raise ValueError(f"a choice lacks fields: {text!r}")
    return choices.with_fixes(choices.default(), fixes)


@functools.cache
def planner() -> Planner:
    """This process's planner, from its environment (choices.PLAN_VARIABLE and SECONDS_VARIABLE)."""
    fixes = choices.fixed(os.environ.get(choices.PLAN_VARIABLE, ""), choices.PLAN_VARIABLE)
    if os.environ.get(kernel.PATH_VARIABLE, "").strip():
        fixes.setdefault("path", kernel.chosen_path())
    seconds = float(os.environ.get(choices.SECONDS_VARIABLE) or choices.DEFAULT_SECONDS)
    return Planner(choices.runnable(fixes, choices.PLAN_VARIABLE), seconds, cache_path())
