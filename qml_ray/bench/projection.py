"""The headline run (23 qubits, 1000 examples) projected from the cost per circuit at its qubit count: its
epoch on the original's cluster, on one node and on one vCPU, each differentiator beside the original's
figures. A projection, not a measurement. Importing this module starts TensorFlow (`families`)."""

from qml_ray import data
from qml_ray.bench.families import DIFFERENTIATORS
from qml_ray.config import Config

# The original's headline: 23 qubits, 1000 examples, ~5 min/epoch on 32 nodes of 16 vCPUs,
# ~4 h/epoch on one worker.
HEADLINE = Config(qubits=23, examples=1000, test_fraction=0.3)
HEADLINE_VCPUS = 512
ORIGINAL_CLUSTER_MINUTES = 5
ORIGINAL_ONE_WORKER_HOURS = 4
NODE_VCPUS = 16  # one c2-standard-16 node


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


def projection_lines(projection: dict) -> list[str]:
    """The projection as a Markdown table, said to be one."""
    return [
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
        *(
            f"| {name} | {projection[name]['one_vcpu_epoch_hours']:.2f} "
            f"| {projection[name]['cluster_epoch_minutes']:.2f} | {projection[name]['node_epoch_hours']:.2f} |"
            for name in DIFFERENTIATORS
        ),
        f"| the original (TFQ, tf-operator) | | ~{projection['original_cluster_epoch_minutes']} "
        f"| ~{projection['original_one_worker_epoch_hours']} (one worker) |",
    ]
