"""The roofline: this machine's peaks (float32 matrix products; an in-place pass over a state in a core's cache
and from memory) and the block kernel's rate in each kind of pass against them, measured once by a
`bench circuits` run from `ROOFLINE_FROM_QUBITS` qubits. No TensorFlow."""

import functools
import os
import subprocess
import sys

import numpy as np

from qml_ray import kernel
from qml_ray.bench.measure import pass_bandwidth, seconds_per_call

# Each pass kind of the kernel: (floating-point operations, bytes moved) per amplitude, complex64, a multiply-add
# counted as 2 operations. A block: 4 complex multiply-adds per amplitude, the amplitude read and written. Its
# un-applying in the backward sweep: the same on the state and the co-state, and the transition sums (4 more
# complex multiply-adds per amplitude), both states read and written. A relabelling: no arithmetic.
PASS_KINDS = {"block": (32, 16), "block un-applied + transition": (96, 32), "relabelling": (0, 16)}
ROOFLINE_QUBITS = {"in cache": 15, "from memory": 26}  # 256 KiB (within a core's L2) and 512 MiB a state
ROOFLINE_FROM_QUBITS = 20  # a run that probes so many qubits measures the roofline too (once)


def peak_flops(threads: int, min_seconds: float = 1.0) -> float:
    """Floating-point operations per second of float32 matrix products (numpy's BLAS) on `threads` threads,
    in a process of its own (BLAS sizes its threads when it loads)."""
    code = (
        "import time, numpy as np\n"
        "a = np.ones((1024, 1024), np.float32); a @ a\n"
        "calls, t = 0, time.perf_counter()\n"
        f"while time.perf_counter() - t < {min_seconds}: a @ a; calls += 1\n"
        "print(2 * 1024**3 * calls / (time.perf_counter() - t))"
    )
    pools = {name: str(threads) for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **pools}, capture_output=True, text=True)
    return float(done.stdout.strip())


@functools.cache
def roofline(threads: int, qubits: tuple = tuple(ROOFLINE_QUBITS.items()), min_seconds: float = 0.3) -> dict:
    """This machine's peaks on `threads` threads (float32 matrix products; an in-place pass over a state in a
    core's cache and from memory) and the kernel's rate in each pass kind (`PASS_KINDS`), one pass on a block
    of bits (n - 3, 9), `threads` parts: operations and bytes per second, and nanoseconds per amplitude. Each
    figure timed over `min_seconds`; `qubits` the states' sizes, (where, qubits) pairs."""
    found = {"peak_flops": peak_flops(threads, 3 * min_seconds), "qubits": dict(qubits), "kinds": {}}
    for where, size in qubits:
        found[f"pass_bandwidth {where}"] = pass_bandwidth(8 * 2**size, min_seconds)
        for kind, seconds in pass_seconds(size, threads, min_seconds).items():
            flops, moved = PASS_KINDS[kind]
            measured = found["kinds"].setdefault(kind, {"flops_per_amplitude": flops, "bytes_per_amplitude": moved})
            measured[where] = {"ns_per_amplitude": seconds * 1e9, "flops": flops / seconds, "bytes": moved / seconds}
    return found


def pass_seconds(qubits: int, threads: int, min_seconds: float) -> dict:
    """Seconds per amplitude of one pass of each kind over a state of `qubits` qubits, in `threads` parts."""
    rng = np.random.default_rng(0)
    u = np.linalg.qr(rng.standard_normal((4, 4)) + 1j * rng.standard_normal((4, 4)))[0]
    psi = np.full((2, 2**qubits), 2 ** (-qubits / 2), np.float32)
    lam = psi.copy()
    bit_map = np.arange(qubits)
    bit_map[:5], bit_map[qubits - 5 :] = np.arange(qubits - 5, qubits), np.arange(5)
    passes = {
        "block": lambda: kernel.apply_block(psi, u, qubits - 3, 9, threads),
        "block un-applied + transition": lambda: kernel.unapply_with_transition(psi, lam, u, qubits - 3, 9, threads),
        "relabelling": lambda: kernel.relabel_bits(psi, bit_map, threads),
    }
    return {kind: seconds_per_call(run, min_seconds) / 2**qubits for kind, run in passes.items()}


def roofline_lines(probes: list[dict]) -> list[str]:
    """The roofline table of the first probe that measured it (the same at every qubit count)."""
    found = next((p["roofline"] for p in probes if p.get("roofline")), None)
    if not found:
        return []
    peak = found["peak_flops"]
    lines = [
        "",
        f"Roofline (one pass of each kind, a state of {found['qubits']['in cache']} qubits in a core's cache and of "
        f"{found['qubits']['from memory']} from memory): this machine's peaks are {peak / 1e9:.0f} GFLOP/s (float32 "
        f"matrix products) and an in-place pass's {found['pass_bandwidth in cache'] / 1e9:.0f} GB/s in cache, "
        f"{found['pass_bandwidth from memory'] / 1e9:.0f} GB/s from memory (read + write).",
        "",
        "| pass | FLOP, bytes per amplitude | in cache: ns per amplitude, GFLOP/s (share of peak), GB/s (share) "
        "| from memory: ns per amplitude, GFLOP/s (share of peak), GB/s (share) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for kind, measured in found["kinds"].items():
        cells = []
        for where in found["qubits"]:
            m, bandwidth = measured[where], found[f"pass_bandwidth {where}"]
            cells.append(
                f"{m['ns_per_amplitude']:.3g}, {m['flops'] / 1e9:.0f} ({m['flops'] / peak:.0%}), "
                f"{m['bytes'] / 1e9:.1f} ({m['bytes'] / bandwidth:.0%})"
            )
        per_amplitude = f"{measured['flops_per_amplitude']}, {measured['bytes_per_amplitude']}"
        lines.append(f"| {kind} | {per_amplitude} | {cells[0]} | {cells[1]} |")
    return lines
