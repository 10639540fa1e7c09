"""The excitation data set: rx(theta) on one qubit of the cluster state.

Label +1 when |theta| <= pi/2, else -1. The QCNN's data set when a run names no `data`: drawn
from the config's seed (the same on every worker that draws it) and written to the run folder as
Parquet (its "train" and "validation" splits, `storage.split_path`). The
benchmark's baseline, which runs without Ray, reads it here too, each process its own shard.
"""

import cirq
import numpy as np
import pyarrow as pa
import tensorflow_quantum as tfq

from qml_ray import storage
from qml_ray.config import Config, split_sizes
from qml_ray.model import qubits_for


def generate(config: Config) -> dict[str, pa.Table]:
    """The seeded data set, split into train and validation tables (id, circuit, label, angle, qubit)."""
    rng = np.random.default_rng(config.seed)
    qubits = qubits_for(config.qubits)
    excited = rng.integers(len(qubits), size=config.examples)
    angles = rng.uniform(-np.pi, np.pi, size=config.examples)
    circuits = [cirq.Circuit(cirq.rx(angle)(qubits[q])) for q, angle in zip(excited, angles)]
    table = pa.table(
        {
            "id": pa.array(np.arange(config.examples), pa.int64()),
            "circuit": pa.array(tfq.convert_to_tensor(circuits).numpy(), pa.binary()),
            "label": pa.array(np.where(np.abs(angles) <= np.pi / 2, 1.0, -1.0), pa.float32()),
            "angle": pa.array(angles, pa.float64()),
            "qubit": pa.array(excited, pa.int32()),
        }
    )
    n_train = split_sizes(config)[0]
    return {"train": table.slice(0, n_train), "validation": table.slice(n_train)}


def write(config: Config, run: str) -> None:
    for split, table in generate(config).items():
        storage.write_parquet(table, storage.split_path(run, split))


def read(run: str, split: str) -> pa.Table:
    return storage.read_parquet(storage.split_path(run, split))
