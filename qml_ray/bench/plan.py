"""What the block kernel's planner chooses on this machine and why, and the roofline it chooses against: the
machine's memory bandwidth (a STREAM-like triad) and FMA peak on 1 and 2 threads, and at each size each kind of
the kernel's pass, and the QCNN's whole forward (its passes over memory and its multiply-adds), against them.

    python -m qml_ray.bench.plan 20 26 28 --threads 1,2 --seconds 60 --out plan.json

Every choice the planner measures is printed with its seconds, fastest first, so a run on one CPU can be read
against a run on another. The planner measures here in a cache folder of its own (nothing of the user's cache is
read or written). TensorFlow, TFQ and cirq are imported once the arguments are checked.
"""

import argparse
import json
import tempfile
from pathlib import Path

from qml_ray import cli, kernel
from qml_ray.bench import roofline
from qml_ray.errors import UsageError

TRIAD_FLOATS = 2**26  # three arrays of 256 MiB: far beyond any cache
FMA_ROUNDS = 10**7
FMA_PER_AMPLITUDE = 16  # a block's pass: 4 complex multiply-adds per amplitude in the four-multiplication form
AMPLITUDE_BYTES = 16  # read and written: complex64


def peaks(threads: int) -> dict:
    """This machine's memory bandwidth (bytes/s of a triad, its three arrays counted) and FMA peak (float32
    multiply-adds/s) on `threads` threads, as the running path's code meets them."""
    module = kernel.compiled(kernel.PATH)
    triad = 3 * 4 * TRIAD_FLOATS / module.triad_seconds(TRIAD_FLOATS, threads, 5)
    fma = FMA_ROUNDS * module.FMA_CHAINS * module.FMA_LANES * threads / module.fma_seconds(FMA_ROUNDS, threads, 3)
    return {"triad_bytes_per_second": triad, "fma_per_second": fma}


def planned(qubits: int, threads: int, seconds: float) -> dict:
    """The planner's measurement of the QCNN's circuit at `qubits` on `threads` threads (a fresh cache), each
    choice's forward seconds, the choice, and the forward's passes, bytes and multiply-adds under it."""
    from qml_ray.bench.side_by_side import qcnn_circuits
    from qml_ray.bench.traffic import forward_bytes
    from qml_ray.gradients import planner
    from qml_ray.gradients.plan import canonical, canonical_plan

    whole = qcnn_circuits(qubits, 1)
    names = tuple(name.decode() for name in whole["names"])
    program = canonical(whole["programs"][0])
    with tempfile.TemporaryDirectory() as folder:
        cache = Path(folder) / "plans.json"
        choice = planner.Planner({}, seconds, cache).choice(program, names, whole["pauli_sums"][0], threads)
        record = planner.CacheFile.model_validate_json(cache.read_text()).shapes.popitem()[1]
    circuit = canonical_plan(program, names, choice).circuit
    passes = {kind: seconds * 2**qubits for kind, seconds in roofline.pass_seconds(qubits, threads, 0.3).items()}
    return {
        "pass_seconds": passes,
        "qubits": qubits,
        "threads": threads,
        "choice": str(choice),
        "seconds": dict(sorted(record.seconds.items(), key=lambda item: item[1])),
        "fields_tried": record.tried,
        "bytes": forward_bytes(whole, choice),
        "multiply_adds": FMA_PER_AMPLITUDE * 2**circuit.qubits * len(circuit.relabel),
    }


def against_peaks(found: dict, peak: dict) -> dict:
    """The forward's time against its two bounds on this machine: its bytes at the triad's bandwidth, and its
    multiply-adds at the FMA peak."""
    best = found["seconds"][found["choice"]]
    memory = found["bytes"] / peak["triad_bytes_per_second"]
    arithmetic = found["multiply_adds"] / peak["fma_per_second"]
    return {
        "memory_bound_seconds": memory,
        "fma_bound_seconds": arithmetic,
        "of_the_bound": max(memory, arithmetic) / best,
    }


def pass_lines(found: dict, peak: dict) -> list[str]:
    """Each kind of pass over the whole state (`roofline.PASS_KINDS`), against the triad's bandwidth and the FMA
    peak: the share of each it reaches."""
    out = []
    for kind, seconds in found["pass_seconds"].items():
        flops, moved = roofline.PASS_KINDS[kind]
        amplitudes = 2 ** found["qubits"]
        bandwidth = moved * amplitudes / seconds / peak["triad_bytes_per_second"]
        arithmetic = flops / 2 * amplitudes / seconds / peak["fma_per_second"]
        out.append(
            f"  pass {kind}: {seconds * 1e3:.4g} ms, {bandwidth:.0%} of the triad's bandwidth, {arithmetic:.0%} of "
            "the FMA peak"
        )
    return out


def lines(found: dict, peak: dict) -> list[str]:
    """What a reader sees of one size: the choice and the others' seconds, and the forward against the roofline."""
    bound = against_peaks(found, peak)
    best, slowest = found["seconds"][found["choice"]], max(found["seconds"].values())
    out = [
        f"{found['qubits']} qubits, {found['threads']} thread(s): chose {found['choice']}: {best:.4g} s a forward "
        f"(the slowest choice measured {slowest:.4g} s; fields tried: {', '.join(found['fields_tried'])})"
    ]
    out += [f"  {seconds:9.4g} s  {choice}" for choice, seconds in found["seconds"].items()]
    memory, arithmetic = bound["memory_bound_seconds"], bound["fma_bound_seconds"]
    out.append(
        f"  roofline: {found['bytes'] / 2**30:.2f} GiB over memory ({memory:.3g} s at the triad's bandwidth), "
        f"{found['multiply_adds'] / 1e9:.2f} G multiply-adds ({arithmetic:.3g} s at the FMA peak): the forward at "
        f"{bound['of_the_bound']:.0%} of its bound"
    )
    return out + pass_lines(found, peak)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m qml_ray.bench.plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("qubits", type=int, nargs="+")
    parser.add_argument("--threads", default="1", help="comma-separated thread counts [default: 1]")
    parser.add_argument("--seconds", type=float, default=60.0, help="the planner's budget per size [default: 60]")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON to this file")
    args = parser.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",") if t.strip().isdigit()]
    if not threads or min(threads) < 1 or not all(16 <= q <= 30 for q in args.qubits) or args.seconds <= 0:
        raise UsageError("qubits must be 16 to 30, --threads comma-separated whole numbers, --seconds positive")
    from qml_ray.gradients.planner import machine

    here = machine()
    print(f"{here['cpu']} ({here['caches']}); paths {', '.join(here['paths'])}, running {kernel.PATH}", flush=True)
    doc = {"machine": here, "peaks": {}, "sizes": []}
    for n in threads:
        doc["peaks"][n] = peak = peaks(n)
        print(
            f"{n} thread(s): triad {peak['triad_bytes_per_second'] / 1e9:.1f} GB/s, "
            f"FMA peak {peak['fma_per_second'] / 1e9:.1f} G multiply-adds/s",
            flush=True,
        )
    for qubits in args.qubits:
        for n in threads:
            found = planned(qubits, n, args.seconds)
            doc["sizes"].append(found | against_peaks(found, doc["peaks"][n]))
            print("\n".join(lines(found, doc["peaks"][n])), flush=True)
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1, default=float))


if __name__ == "__main__":
    cli.run(main)
