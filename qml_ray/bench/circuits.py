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

import tensorflow as tf

from qml_ray import contract, data
from qml_ray.config import Config

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


def probe(qubits: int, circuits: int, threads: int, min_seconds: float = 2.0) -> dict:
    """Seconds per circuit of the 1-layer QCNN on `qubits` qubits: forward, and forward + gradient,
    with each differentiator; and the peak memory of a gradient per circuit in flight, in
    state vectors (complex64, 8 bytes per amplitude)."""
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
    return result


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
