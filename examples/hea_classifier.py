"""A hardware-efficient ansatz classifier: two Z readouts, a Dense head, two classes.

The data: product states rx(a) x rx(b) x ... on four qubits; the class is whether the first
two qubits lean towards |0> together: cos a + cos b > 0. The label is one-hot, [1, 0] or
[0, 1]: the model has two outputs, a softmax over the classes.

    python -m examples.hea_classifier data/hea       # writes the data set as Parquet
    python -m qml_ray.train --model examples.hea_classifier:classifier --data data/hea --name hea
"""

import os
import sys

import cirq
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import sympy
import tensorflow as tf
import tensorflow_quantum as tfq


def hardware_efficient_ansatz(qubits, depth: int) -> cirq.Circuit:
    """`depth` layers of ry, rz on every qubit, then a ring of CZs."""
    symbols = iter(sympy.symbols(f"theta0:{2 * depth * len(qubits)}"))
    circuit = cirq.Circuit()
    for _ in range(depth):
        circuit += [cirq.ry(next(symbols))(q) for q in qubits]
        circuit += [cirq.rz(next(symbols))(q) for q in qubits]
        circuit += [cirq.CZ(a, b) for a, b in zip(qubits, qubits[1:] + qubits[:1])]
    return circuit


def classifier(wires: int = 4, depth: int = 1, learning_rate: float = 0.1, seed: int = 0) -> tf.keras.Model:
    """Z on the first two qubits after the ansatz, then Dense(2) with softmax."""
    tf.keras.utils.set_random_seed(seed)
    qubits = cirq.LineQubit.range(wires)
    circuits = tf.keras.Input(shape=(), dtype=tf.string)
    readouts = tfq.layers.PQC(hardware_efficient_ansatz(qubits, depth), [cirq.Z(qubits[0]), cirq.Z(qubits[1])])(
        circuits
    )
    classes = tf.keras.layers.Dense(2, activation="softmax")(readouts)
    model = tf.keras.Model(circuits, classes)
    model.compile(
        optimizer=tf.keras.optimizers.Adam(learning_rate),
        loss=tf.keras.losses.CategoricalCrossentropy(),
        metrics=[tf.keras.metrics.CategoricalAccuracy(name="accuracy")],
    )
    return model


def make_data(folder: str, examples: int = 240, wires: int = 4, files: int = 4, seed: int = 1) -> None:
    """`examples` labelled circuits in `files` Parquet files (id, circuit, label)."""
    rng = np.random.default_rng(seed)
    qubits = cirq.LineQubit.range(wires)
    angles = rng.uniform(0, 2 * np.pi, size=(examples, wires))
    circuits = [cirq.Circuit(cirq.rx(a)(q) for a, q in zip(row, qubits)) for row in angles]
    up = np.cos(angles[:, 0]) + np.cos(angles[:, 1]) > 0
    labels = np.stack([up, ~up], axis=1).astype(np.float32)
    table = pa.table(
        {
            "id": np.arange(examples),
            "circuit": pa.array(tfq.convert_to_tensor(circuits).numpy(), pa.binary()),
            "label": pa.FixedSizeListArray.from_arrays(pa.array(labels.ravel()), 2),
        }
    )
    write_parquet(table, folder, files)


def write_parquet(table: pa.Table, folder: str, files: int) -> None:
    """The table as `files` Parquet files in `folder`."""
    os.makedirs(folder, exist_ok=True)
    for part, rows in enumerate(np.array_split(np.arange(table.num_rows), files)):
        pq.write_table(table.take(rows), os.path.join(folder, f"part-{part:03d}.parquet"))


if __name__ == "__main__":
    make_data(sys.argv[1])
