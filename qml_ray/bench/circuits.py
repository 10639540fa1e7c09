"""A family of circuits' cost per circuit on this machine (the QCNN's, or multi-controlled gates'), as
`bench circuits` writes it, with the block kernel's memory traffic (`traffic`), the roofline (`roofline`), the
peers on the same circuits, and the headline run projected from the QCNN's (`projection`).

Forward: the model (or a TFQ expectation layer) on a batch of circuits. Forward + gradient: the same under a
GradientTape, then the gradient of the mean output with respect to every weight. Each with TFQ (its simulator
and Adjoint) and with qml_ray's block-fused kernel (its own forward and adjoint). Seconds per circuit =
seconds per batch / batch size. Run with one thread (the default), a figure is the cost on one vCPU.
Importing this module starts TensorFlow: size its thread pools first.
"""

import sys

import cirq
import numpy as np
import tensorflow as tf

from qml_ray import kernel, replica
from qml_ray.bench import families, peers
from qml_ray.bench.measure import PeakMemory, seconds_per_call
from qml_ray.bench.projection import projection_lines
from qml_ray.bench.roofline import ROOFLINE_FROM_QUBITS, roofline, roofline_lines
from qml_ray.bench.traffic import memory_traffic, traffic_lines
from qml_ray.gradients import BlockAdjoint
from qml_ray.memory import kept_states, state_memory


def default_circuits(qubits: int) -> int:
    """Circuits per batch: many where they are cheap, 2 at 23 qubits (64 MB of state each)."""
    return min(64, max(2, 2 ** (22 - qubits)))


def probe(qubits: int, circuits: int, threads: int, with_peers: bool, family: str, min_seconds: float) -> dict:
    """Seconds per circuit of the family's circuits on `qubits` qubits: forward, and forward + gradient,
    with each differentiator; the peak memory of a gradient per circuit in flight, in state vectors
    (complex64, 8 bytes per amplitude); the block kernel's memory traffic against a state-sized pass's;
    and `with_peers`, the peers on the same circuits against the block kernel."""
    whole, calls = families.calls(family, qubits, circuits)
    state_bytes = 8 * 2**qubits
    in_flight = min(threads, circuits)
    result = {"qubits": qubits, "circuits": circuits}
    for name, (forward, forward_and_gradient) in calls.items():
        result[f"{name}_forward_seconds"] = seconds_per_call(forward, min_seconds) / circuits
        with PeakMemory() as memory:
            result[f"{name}_forward_gradient_seconds"] = seconds_per_call(forward_and_gradient, min_seconds) / circuits
        result[f"{name}_peak_state_vectors"] = memory.extra_bytes / in_flight / state_bytes
        result[f"{name}_gradient_to_forward"] = (
            result[f"{name}_forward_gradient_seconds"] - result[f"{name}_forward_seconds"]
        ) / result[f"{name}_forward_seconds"]
    result["speedup"] = result["tfq_forward_gradient_seconds"] / result["block_forward_gradient_seconds"]
    kept = min(circuits, kept_states(threads, state_bytes, state_memory(threads))) / circuits
    result.update(memory_traffic(whole, result, state_bytes, kept))
    if qubits >= ROOFLINE_FROM_QUBITS:
        result["roofline"] = roofline(threads)
    if with_peers:
        result["peers"] = against_peers(whole, threads, min_seconds)
    return result


def against_peers(whole: dict, threads: int, min_seconds: float) -> dict:
    """The block kernel, outside TensorFlow, against the peers on the same circuits: forward (expectations)
    against qsim's, the gradient of the readouts' sum (forward included) against Lightning's adjoint; seconds
    per circuit, and each peer's largest difference from the block values (`peers.difference`)."""
    block = BlockAdjoint(threads)
    inputs = (whole["programs"], whole["names"], np.tile(whole["weights"], (len(whole["programs"]), 1)))
    sums = whole["pauli_sums"]
    ones = np.ones(sums.shape, np.float32)

    def timer(fn):
        return seconds_per_call(fn, min_seconds)

    expected = block.expectations(*inputs, sums)  # the first calls also plan the circuits
    expected_gradient = block.gradient(*inputs, sums, ones)
    found = {
        "block": {
            "forward_seconds": timer(lambda: block.expectations(*inputs, sums, keep_states=False)) / len(sums),
            "gradient_seconds": timer(lambda: block.gradient(*inputs, sums, ones)) / len(sums),
        }
    }
    resolver = cirq.ParamResolver(dict(zip(whole["symbols"], whole["weights"].tolist())))
    qsim = peers.qsim_forward(whole["circuits"], whole["readouts"], resolver, threads, timer)
    qsim["difference"] = peers.difference(qsim.pop("values"), expected)
    found["qsim"] = qsim
    for dtype in peers.LIGHTNING_DTYPES:
        lightning = peers.lightning_gradient(
            whole["circuits"], whole["readouts"], whole["symbols"], whole["weights"], dtype, timer
        )
        lightning["difference"] = max(
            peers.difference(lightning.pop("values"), expected),
            peers.difference(lightning.pop("gradients"), expected_gradient),
        )
        found[f"lightning_{dtype}"] = lightning
    return found


def markdown(doc: dict) -> str:
    """The costs as a Markdown table, then the memory traffic, the roofline, the peers and the projection."""
    lines = [
        f"Seconds per circuit with {doc['threads']} thread(s) (TensorFlow's pools and the block kernel's) on "
        f"this machine ({doc['machine_cpus']} CPUs), the block kernel on its {doc['kernel_path']} path; "
        f"{families.FAMILIES[doc['family']]}. Memory: the gradient's peak above the "
        "process's level, per circuit in flight, in state vectors (8 bytes per amplitude), sampled.",
        "",
        "| qubits | circuits per batch | forward: TFQ, block | forward + gradient: TFQ | block "
        "| speed-up | gradient / forward: TFQ, block | peak state vectors: TFQ, block |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {p['qubits']} | {p['circuits']} | {p['tfq_forward_seconds']:.4g}, {p['block_forward_seconds']:.4g} "
        f"| {p['tfq_forward_gradient_seconds']:.4g} | {p['block_forward_gradient_seconds']:.4g} "
        f"| **{p['speedup']:.1f}x** | {p['tfq_gradient_to_forward']:.1f}, {p['block_gradient_to_forward']:.1f} "
        f"| {p['tfq_peak_state_vectors']:.1f}, {p['block_peak_state_vectors']:.1f} |"
        for p in doc["probes"]
    ]
    lines += traffic_lines(doc["probes"])
    lines += roofline_lines(doc["probes"])
    if any("peers" in p for p in doc["probes"]):
        lines += peers.markdown_lines(doc["probes"])
    if doc["projection"]:
        lines += projection_lines(doc["projection"])
    return "\n".join(lines) + "\n"


def one_large_circuit(qubits: int, min_seconds: float = 1.0) -> dict:
    """One QCNN circuit of `qubits` qubits through the block model on this process's threads: seconds of its
    forward and forward + gradient (each over at least `min_seconds`, after a first forward), the peak resident
    memory above the process's level before the first simulation (in state vectors too), and qsim's best
    forward of the same circuit on as many threads."""
    config, batch = families.qcnn_batch(qubits, 1)
    model = replica.build(config.replace(differentiator="block"))

    def forward_and_gradient():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(batch, training=True))
        return tape.gradient(loss, model.trainable_variables)

    found = {"qubits": qubits, "threads": BlockAdjoint().threads, "kernel_path": kernel.PATH}
    with PeakMemory() as memory:
        model(batch, training=False)
        found["forward_seconds"] = seconds_per_call(lambda: model(batch, training=False), min_seconds)
        found["forward_gradient_seconds"] = seconds_per_call(forward_and_gradient, min_seconds)
    found["peak_bytes"] = memory.extra_bytes
    found["peak_state_vectors"] = memory.extra_bytes / (8 * 2**qubits)
    whole = families.model_circuits(config, model, batch)
    resolver = cirq.ParamResolver(dict(zip(whole["symbols"], whole["weights"].tolist())))
    qsim = peers.qsim_forward(
        whole["circuits"], whole["readouts"], resolver, found["threads"], lambda fn: seconds_per_call(fn, min_seconds)
    )
    found["qsim_forward_seconds"], found["qsim_fused_gate_size"] = qsim["seconds"], qsim["fused_gate_size"]
    return found


if __name__ == "__main__":  # TF_NUM_INTRAOP_THREADS=2 python -m qml_ray.bench.circuits 26: one circuit, as JSON
    import json

    print(json.dumps(one_large_circuit(int(sys.argv[1]))), flush=True)
