"""The block kernel against qsim's forward, and on 2 threads against one, in rounds: each round times every
contender once, in a random order, and the figures are the medians over the rounds, so that a machine whose
speed drifts (a shared one) shifts them all alike.

    python -m qml_ray.bench.side_by_side 20 --circuits 4 --rounds 5   # one thread against qsim
    python -m qml_ray.bench.side_by_side 20 --rounds 30 --threads     # one circuit, 1 thread against 2

The 1-layer QCNN's batch (`families.model_circuits`) through `BlockAdjoint`'s own `expectations` and
`gradient` on numpy arrays, as `bench circuits --peers` runs it: the forward alone, as inference runs it (no
final state kept), and a training step's forward + gradient (its states kept, the sweep from them). qsim at
each of its fused-gate sizes, the best one's median counted. Needs the peers extra (`peers.INSTALL`).
TensorFlow, TFQ and cirq are imported once the arguments are checked.
"""

import argparse
import json
import time

import numpy as np

from qml_ray import cli
from qml_ray.bench import peers
from qml_ray.errors import UsageError


def seconds(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def qcnn_circuits(qubits: int, circuits: int) -> dict:
    """The QCNN's batch of `circuits` circuits as the block kernel and qsim take them (`model_circuits`)."""
    from qml_ray import replica
    from qml_ray.bench.families import model_circuits, qcnn_batch

    config, batch = qcnn_batch(qubits, circuits)
    return model_circuits(config, replica.build(config.replace(differentiator="block")), batch)


def block_calls(block, whole: dict) -> dict:
    """A forward alone, and a training step's forward + gradient, of the batch on `block` (a BlockAdjoint)."""
    inputs = (whole["programs"], whole["names"], np.tile(whole["weights"], (len(whole["programs"]), 1)))
    sums = whole["pauli_sums"]
    ones = np.ones(sums.shape, np.float32)
    return {
        "forward": lambda: block.expectations(*inputs, sums, keep_states=False),
        "forward_gradient": lambda: (block.expectations(*inputs, sums), block.gradient(*inputs, sums, ones)),
    }


def qsim_calls(whole: dict) -> dict:
    """qsim's forward of the batch on one thread at each fused-gate size (`peers.qsim_calls`)."""
    import cirq

    resolver = cirq.ParamResolver(dict(zip(whole["symbols"], whole["weights"].tolist())))
    calls = peers.qsim_calls(whole["circuits"], whole["readouts"], resolver, threads=1)
    return {f"qsim_{size}": call for size, call in calls.items()}


def in_rounds(calls: dict, rounds: int, per_call: int) -> dict:
    """Each call's median seconds over `rounds` rounds, per circuit of `per_call`: each call once a round, in
    a new random order every round (no call always follows the same one, whose traces in the caches and the
    OS's memory it would inherit), after one untimed call of each."""
    for call in calls.values():
        call()
    times = {name: [] for name in calls}
    order = np.random.default_rng(0)
    for _ in range(rounds):
        for name in order.permutation(list(calls)):
            times[name].append(seconds(calls[name]) / per_call)
    return {name: float(np.median(found)) for name, found in times.items()}


def against_qsim(qubits: int, circuits: int, rounds: int) -> dict:
    """One thread: the block forward and forward + gradient against qsim's best forward, the values checked."""
    from qml_ray.gradients import BlockAdjoint

    whole = qcnn_circuits(qubits, circuits)
    block = block_calls(BlockAdjoint(threads=1), whole)
    qsim = qsim_calls(whole)
    expected = block["forward"]()
    for name, call in qsim.items():
        if (difference := peers.difference(np.real(call()), expected)) > peers.TOLERANCE:
            raise SystemExit(f"error: {name}'s values differ from the block kernel's by {difference:.1e}")
    found = in_rounds(block | qsim, rounds, circuits)
    best = min(qsim, key=found.get)
    return {
        "qubits": qubits,
        "circuits": circuits,
        "seconds": found,
        "qsim_fused_gate_size": int(best.removeprefix("qsim_")),
        "forward_to_qsim": found["forward"] / found[best],
        "forward_gradient_in_qsim_forwards": found["forward_gradient"] / found[best],
    }


def on_two_threads(qubits: int, rounds: int) -> dict:
    """One circuit on 1 thread against 2: the speed-up of its forward and of its forward + gradient."""
    from qml_ray.gradients import BlockAdjoint

    whole = qcnn_circuits(qubits, 1)
    one, two = (block_calls(BlockAdjoint(threads=threads), whole) for threads in (1, 2))
    found = in_rounds({f"{name}_1": one[name] for name in one} | {f"{name}_2": two[name] for name in two}, rounds, 1)
    return {
        "qubits": qubits,
        "seconds": found,
        "forward_speedup": found["forward_1"] / found["forward_2"],
        "forward_gradient_speedup": found["forward_gradient_1"] / found["forward_gradient_2"],
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m qml_ray.bench.side_by_side", description=__doc__.split("\n\n")[0])
    parser.add_argument("qubits", type=int)
    parser.add_argument("--circuits", type=int, default=1, help="circuits per batch against qsim [default: 1]")
    parser.add_argument("--rounds", type=int, default=5, help="[default: 5]")
    parser.add_argument("--threads", action="store_true", help="one circuit on 1 thread against 2, not against qsim")
    args = parser.parse_args(argv)
    if not (4 <= args.qubits <= 30 and args.circuits >= 1 and args.rounds >= 1):
        raise UsageError("qubits must be 4 to 30, --circuits and --rounds at least 1")
    if args.threads:
        found = on_two_threads(args.qubits, args.rounds)
    else:
        if peers.missing():
            raise UsageError(f"against qsim needs {', '.join(peers.missing())}, not installed: {peers.INSTALL}")
        found = against_qsim(args.qubits, args.circuits, args.rounds)
    print(json.dumps(found | planned()), flush=True)


def planned() -> dict:
    """The CPU, and the planner's lines: the choice the block kernel ran with at each shape, measured or cached."""
    from qml_ray.gradients import planner

    return {"cpu": planner.machine()["cpu"], "kernel_plan": planner.planner().said()}


if __name__ == "__main__":
    cli.run(main)
