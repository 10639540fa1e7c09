"""The QCNN's cost per circuit on this machine, and the headline run projected from it.

Forward: the model on a batch of circuits. Forward + gradient: the same under a GradientTape,
then the gradient of the mean output with respect to every weight. Each with TFQ (its simulator and
Adjoint) and with qml_ray's block-fused kernel (its own forward and adjoint). Seconds per circuit =
seconds per batch / batch size. Run with one thread (the default), a figure is the cost on one vCPU.
Importing this module starts TensorFlow: size its thread pools first.
"""

import os
import threading
import time

import cirq
import numpy as np
import tensorflow as tf
import tensorflow_quantum as tfq

from qml_ray import contract, data
from qml_ray.bench import peers as peer_simulators
from qml_ray.config import Config
from qml_ray.gradients import BlockAdjoint
from qml_ray.gradients.plan import plan
from qml_ray.model import cluster_state_circuit, qcnn_circuit, qubits_for

# The original's headline: 23 qubits, 1000 examples, ~5 min/epoch on 32 nodes of 16 vCPUs,
# ~4 h/epoch on one worker.
HEADLINE = Config(qubits=23, examples=1000, test_fraction=0.3)
HEADLINE_VCPUS = 512
ORIGINAL_CLUSTER_MINUTES = 5
ORIGINAL_ONE_WORKER_HOURS = 4


NODE_VCPUS = 16  # one c2-standard-16 node
DIFFERENTIATORS = ("tfq", "block")


def default_circuits(qubits: int) -> int:
    """Circuits per batch: many where they are cheap, 2 at 23 qubits (64 MB of state each)."""
    return min(64, max(2, 2 ** (22 - qubits)))


def seconds_per_call(fn, min_seconds: float) -> float:
    """Seconds per call of `fn`, averaged over as many calls as fill `min_seconds` (at least one)."""
    calls, started = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - started
        if elapsed >= min_seconds:
            return elapsed / calls


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:  # Linux: sizes in pages, the second is resident
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """The process's peak resident memory above its level at the start, sampled every 5 ms."""

    def __enter__(self):
        self.start = self.peak = resident_bytes()
        self.done = threading.Event()
        self.sampler = threading.Thread(target=self.sample, daemon=True)
        self.sampler.start()
        return self

    def sample(self):
        while not self.done.wait(0.005):
            self.peak = max(self.peak, resident_bytes())

    def __exit__(self, *exc):
        self.done.set()
        self.sampler.join()

    @property
    def extra_bytes(self) -> int:
        return self.peak - self.start


def probe(qubits: int, circuits: int, threads: int, with_peers: bool = False, min_seconds: float = 2.0) -> dict:
    """Seconds per circuit of the 1-layer QCNN on `qubits` qubits: forward, and forward + gradient,
    with each differentiator; the peak memory of a gradient per circuit in flight, in state vectors
    (complex64, 8 bytes per amplitude); the memory traffic of the block kernel against the machine's
    bandwidth; and with `with_peers`, qsim and Lightning on the same circuits."""
    config = Config(qubits=qubits, examples=max(10, 2 * circuits))
    batch = tf.constant(data.generate(config)["train"].column("circuit").to_pylist()[:circuits])
    state_bytes = 8 * 2**qubits
    in_flight = min(threads, circuits)
    result = {"qubits": qubits, "circuits": circuits}
    for name in DIFFERENTIATORS:
        model = contract.build(config.replace(differentiator=name))

        def forward(inputs=batch, model=model):
            return model(inputs, training=False)

        def forward_and_gradient(inputs=batch, model=model):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(model(inputs, training=True))
            return tape.gradient(loss, model.trainable_variables)

        forward(batch), forward_and_gradient(batch[:1])  # warm-up: compiling and plans of the batch stay out
        result[f"{name}_forward_seconds"] = seconds_per_call(forward, min_seconds) / circuits
        with PeakMemory() as memory:
            result[f"{name}_forward_gradient_seconds"] = seconds_per_call(forward_and_gradient, min_seconds) / circuits
        result[f"{name}_peak_state_vectors"] = memory.extra_bytes / in_flight / state_bytes
        result[f"{name}_gradient_to_forward"] = (
            result[f"{name}_forward_gradient_seconds"] - result[f"{name}_forward_seconds"]
        ) / result[f"{name}_forward_seconds"]
    result["speedup"] = result["tfq_forward_gradient_seconds"] / result["block_forward_gradient_seconds"]
    circuits_of_model = model_circuits(config, model, batch)
    result.update(memory_traffic(circuits_of_model, result, state_bytes))
    if with_peers:
        result["peers"] = peers(circuits_of_model, threads, min_seconds)
    return result


def model_circuits(config: Config, model, batch) -> dict:
    """The batch's whole circuits as the QCNN layer simulates them (cluster state, excitation, model),
    its symbols, their weights in the model, and its readouts."""
    qubits = qubits_for(config.qubits)
    circuit, readout_qubits = qcnn_circuit(qubits, config.layers)
    weights = model.get_layer("qcnn").symbol_values()
    symbols = sorted(weights, key=str)
    return {
        "circuits": [cluster_state_circuit(qubits) + c + circuit for c in tfq.from_tensor(batch)],
        "symbols": symbols,
        "weights": np.array([weights[s] for s in symbols], np.float64),
        "readouts": [cirq.Z(q) for q in readout_qubits],
    }


def memory_traffic(model: dict, result: dict, state_bytes: int) -> dict:
    """The bytes the block kernel moves per circuit, counted from its plan (each step reads and writes the
    state; the gradient's backward sweep does so on the state and its co-state, after writing the
    co-state once per readout), the rate it reaches, and the machine's: a copy of a state-sized array."""
    program = tfq.convert_to_tensor(model["circuits"][:1]).numpy()[0]
    steps = len(plan(program, tuple(str(s) for s in model["symbols"])).circuit.step_relabel)
    forward = 2 * state_bytes * steps
    gradient = forward + 2 * state_bytes * (2 * steps + len(model["readouts"]))
    source = np.ones(state_bytes // 4, np.float32)
    target = np.empty_like(source)
    copy_seconds = seconds_per_call(lambda: np.copyto(target, source), 0.5)
    return {
        "copy_bandwidth": 2 * state_bytes / copy_seconds,
        "block_forward_bytes": forward,
        "block_forward_gradient_bytes": gradient,
        "block_forward_rate": forward / result["block_forward_seconds"],
        "block_forward_gradient_rate": gradient / result["block_forward_gradient_seconds"],
    }


def peers(model: dict, threads: int, min_seconds: float) -> dict:
    """qsim's forward and Lightning's forward + adjoint gradient on the model's circuits, each with the
    largest difference from the block method's values (expectations; gradients of their sum)."""
    circuits, symbols, weights, readouts = (model[k] for k in ("circuits", "symbols", "weights", "readouts"))
    block = BlockAdjoint(threads)
    programs = tfq.convert_to_tensor(circuits).numpy()
    names = np.array([str(s).encode() for s in symbols])
    values = np.tile(weights, (len(circuits), 1)).astype(np.float32)
    sums = tfq.convert_to_tensor([readouts] * len(circuits)).numpy()
    expected = block.expectations(programs, names, values, sums)
    expected_gradient = block.gradient(programs, names, values, sums, np.ones(sums.shape, np.float32))

    def timer(fn):
        fn()
        return seconds_per_call(fn, min_seconds)

    resolver = cirq.ParamResolver(dict(zip(symbols, weights)))
    qsim = peer_simulators.qsim_forward(circuits, readouts, resolver, threads, timer)
    found = {"qsim": {**qsim, "max_difference": float(np.abs(np.array(qsim.pop("values")) - expected).max())}}
    for dtype in peer_simulators.LIGHTNING_DTYPES:
        lightning = peer_simulators.lightning_forward_gradient(circuits, readouts, symbols, weights, dtype, timer)
        difference = max(
            np.abs(np.array(lightning.pop("values")) - expected).max(),
            np.abs(np.array(lightning.pop("gradients")) - expected_gradient).max(),
        )
        found[f"lightning_{dtype}"] = {**lightning, "max_difference": float(difference)}
    return found


def project(probed: dict, efficiency: float, efficiency_source: str) -> dict:
    """The headline's epoch from the cost per circuit at its qubit count, for each differentiator:
    every training example costs a forward + gradient, every validation example a forward, spread
    over the vCPUs at `efficiency` (one node: at 1). A projection, not a measurement."""
    train, test = data.split_sizes(HEADLINE)
    projection = {
        "qubits": HEADLINE.qubits,
        "train_examples": train,
        "test_examples": test,
        "vcpus": HEADLINE_VCPUS,
        "node_vcpus": NODE_VCPUS,
        "parallel_efficiency": efficiency,
        "efficiency_source": efficiency_source,
        "original_cluster_epoch_minutes": ORIGINAL_CLUSTER_MINUTES,
        "original_one_worker_epoch_hours": ORIGINAL_ONE_WORKER_HOURS,
    }
    for name in DIFFERENTIATORS:
        cpu_seconds = train * probed[f"{name}_forward_gradient_seconds"] + test * probed[f"{name}_forward_seconds"]
        projection[name] = {
            "one_vcpu_epoch_hours": cpu_seconds / 3600,
            "cluster_epoch_minutes": cpu_seconds / (HEADLINE_VCPUS * efficiency) / 60,
            "node_epoch_hours": cpu_seconds / NODE_VCPUS / 3600,
        }
    return projection


def traffic_lines(probes: list[dict]) -> list[str]:
    return [
        "",
        "Memory traffic of the block kernel per circuit (counted from its plan: each step reads and writes "
        "the state), the rate it reaches, and the machine's (a copy of a state-sized array, read + write):",
        "",
        "| qubits | copy bandwidth (GB/s) | block forward: MB, GB/s, share of the copy's "
        "| block forward + gradient: MB, GB/s, share of the copy's |",
        "| ---: | ---: | ---: | ---: |",
        *(
            f"| {p['qubits']} | {p['copy_bandwidth'] / 1e9:.1f} "
            f"| {p['block_forward_bytes'] / 1e6:.4g}, {p['block_forward_rate'] / 1e9:.1f}, "
            f"{p['block_forward_rate'] / p['copy_bandwidth']:.0%} "
            f"| {p['block_forward_gradient_bytes'] / 1e6:.4g}, {p['block_forward_gradient_rate'] / 1e9:.1f}, "
            f"{p['block_forward_gradient_rate'] / p['copy_bandwidth']:.0%} |"
            for p in probes
        ),
    ]


def peer_lines(probes: list[dict]) -> list[str]:
    lines = [
        "",
        "The peers on the same circuits, seconds per circuit (the QCNN's circuit alone, outside TensorFlow; "
        "qsim at its fastest fused-gate size); the largest difference from the block method's expectations "
        "and gradients:",
        "",
        "| qubits | forward: block, qsim (fused size) | forward + gradient: block, Lightning complex64, "
        "complex128 | largest difference: qsim, Lightning complex64, complex128 |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for p in (p for p in probes if "peers" in p):
        qsim, single, double = (p["peers"][k] for k in ("qsim", "lightning_complex64", "lightning_complex128"))
        lines.append(
            f"| {p['qubits']} | {p['block_forward_seconds']:.4g}, {qsim['seconds']:.4g} "
            f"({qsim['fused_gate_size']}) | {p['block_forward_gradient_seconds']:.4g}, {single['seconds']:.4g}, "
            f"{double['seconds']:.4g} | {qsim['max_difference']:.1e}, {single['max_difference']:.1e}, "
            f"{double['max_difference']:.1e} |"
        )
    return lines


def markdown(doc: dict) -> str:
    """The costs as a Markdown table, and the projection, said to be one."""
    lines = [
        f"Seconds per circuit with {doc['threads']} thread(s) (TensorFlow's pools and the block kernel's) on "
        f"this machine ({doc['machine_cpus']} CPUs); the 1-layer QCNN. Memory: the gradient's peak above the "
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
    if any("peers" in p for p in doc["probes"]):
        lines += peer_lines(doc["probes"])
    projection = doc["projection"]
    if projection:
        lines += [
            "",
            (
                f"**Projection, not a measurement.** The headline run ({projection['qubits']} qubits, "
                f"{projection['train_examples']} training examples at forward + gradient, "
                f"{projection['test_examples']} validation examples at forward), at the cost per circuit above, "
                f"on {projection['vcpus']} vCPUs at parallel efficiency {projection['parallel_efficiency']:.2f} "
                f"({projection['efficiency_source']}) and on one {projection['node_vcpus']}-vCPU node:"
            ),
            "",
            "| gradient | vCPU-hours per epoch | min per epoch, 512 vCPUs | h per epoch, one 16-vCPU node |",
            "| --- | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {name} | {projection[name]['one_vcpu_epoch_hours']:.2f} "
            f"| {projection[name]['cluster_epoch_minutes']:.2f} | {projection[name]['node_epoch_hours']:.2f} |"
            for name in DIFFERENTIATORS
        ]
        lines += [
            f"| the original (TFQ, tf-operator) | | ~{projection['original_cluster_epoch_minutes']} "
            f"| ~{projection['original_one_worker_epoch_hours']} (one worker) |"
        ]
    return "\n".join(lines) + "\n"
