"""The QCNN's cost per circuit on this machine, and the headline run projected from it.

Forward: the model on a batch of circuits. Forward + gradient: the same under a GradientTape,
then the gradient of the mean output with respect to every weight (TFQ's analytic adjoint
gradient, the PQC layer's default). Seconds per circuit = seconds per batch / batch size.
Run with one TensorFlow thread (the default), a figure is the cost on one vCPU.
Importing this module starts TensorFlow: size its thread pools first.
"""

import time

import tensorflow as tf

from qml_ray import data
from qml_ray.config import Config
from qml_ray.model import build_model

# The original's headline: 23 qubits, 1000 examples, ~5 min/epoch on 32 nodes of 16 vCPUs,
# ~4 h/epoch on one worker.
HEADLINE = Config(qubits=23, examples=1000, test_fraction=0.3)
HEADLINE_VCPUS = 512
ORIGINAL_CLUSTER_MINUTES = 5
ORIGINAL_ONE_WORKER_HOURS = 4


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


def probe(qubits: int, circuits: int, min_seconds: float = 2.0) -> dict:
    """Forward and forward + gradient seconds per circuit of the 1-layer QCNN on `qubits` qubits."""
    config = Config(qubits=qubits, examples=max(10, 2 * circuits))
    batch = tf.constant(data.generate(config)["train"].column("circuit").to_pylist()[:circuits])
    model = build_model(config)

    def forward(inputs=batch):
        return model(inputs, training=False)

    def forward_and_gradient(inputs=batch):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(inputs, training=True))
        return tape.gradient(loss, model.trainable_variables)

    forward(batch[:1]), forward_and_gradient(batch[:1])  # warm-up: first-call costs stay out
    forward_seconds = seconds_per_call(forward, min_seconds) / circuits
    both_seconds = seconds_per_call(forward_and_gradient, min_seconds) / circuits
    return {"qubits": qubits, "circuits": circuits, "forward_seconds": forward_seconds,
            "forward_gradient_seconds": both_seconds,
            "gradient_to_forward": (both_seconds - forward_seconds) / forward_seconds}


def project(probed: dict, efficiency: float, efficiency_source: str) -> dict:
    """The headline's epoch from the cost per circuit at its qubit count: every training example
    costs a forward + gradient, every validation example a forward, spread over the vCPUs at
    `efficiency`. A projection, not a measurement."""
    train, test = data.split_sizes(HEADLINE)
    cpu_seconds = train * probed["forward_gradient_seconds"] + test * probed["forward_seconds"]
    return {
        "qubits": HEADLINE.qubits, "train_examples": train, "test_examples": test, "vcpus": HEADLINE_VCPUS,
        "parallel_efficiency": efficiency, "efficiency_source": efficiency_source,
        "one_vcpu_epoch_hours": cpu_seconds / 3600,
        "cluster_epoch_minutes": cpu_seconds / (HEADLINE_VCPUS * efficiency) / 60,
        "original_cluster_epoch_minutes": ORIGINAL_CLUSTER_MINUTES,
        "original_one_worker_epoch_hours": ORIGINAL_ONE_WORKER_HOURS,
    }


def markdown(doc: dict) -> str:
    """The costs as a Markdown table, and the projection, said to be one."""
    lines = [
        f"Seconds per circuit with {doc['threads']} TensorFlow thread(s) on this machine "
        f"({doc['machine_cpus']} CPUs); the 1-layer QCNN, TFQ's adjoint gradient.",
        "",
        "| qubits | circuits per batch | forward (s/circuit) | forward + gradient (s/circuit) | gradient / forward |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [f"| {p['qubits']} | {p['circuits']} | {p['forward_seconds']:.4g} | {p['forward_gradient_seconds']:.4g} "
              f"| {p['gradient_to_forward']:.1f} |" for p in doc["probes"]]
    projection = doc["projection"]
    if projection:
        lines += ["", (
            f"**Projection, not a measurement.** The headline run ({projection['qubits']} qubits, "
            f"{projection['train_examples']} training examples at forward + gradient, "
            f"{projection['test_examples']} validation examples at forward) costs "
            f"{projection['one_vcpu_epoch_hours']:.1f} vCPU-hours per epoch at the cost per circuit above. "
            f"On {projection['vcpus']} vCPUs at parallel efficiency {projection['parallel_efficiency']:.2f} "
            f"({projection['efficiency_source']}) that is **{projection['cluster_epoch_minutes']:.1f} min per epoch**, "
            f"against the original's ~{projection['original_cluster_epoch_minutes']} min per epoch on 32 nodes "
            f"(512 vCPUs) and ~{projection['original_one_worker_epoch_hours']} h per epoch on one worker."
        )]
    return "\n".join(lines) + "\n"
