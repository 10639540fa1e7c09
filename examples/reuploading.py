"""A classifier of classical features by data re-uploading: no circuit in the data at all.

The model is the re-uploading PQC of TensorFlow Quantum's reinforcement-learning tutorial used as a
supervised classifier: each of its layers rotates every qubit by trainable angles, entangles the
qubits with a ring of CZs, then writes the features in again as rx angles, each scaled by a trainable
weight. The features reach the circuit as a ControlledPQC's symbol values, on empty circuits tiled
over the batch, so the model's one Keras input, `features`, takes the data's `features` column.

The data: points in the square [-1, 1]^2 (a `features` column of two numbers each), labelled 1 inside
the circle holding half the square's area, else 0.

    python -m examples.reuploading data/circle   # writes the data set as Parquet
    python -m qml_ray.train --model examples.reuploading:classifier --data data/circle --name circle
"""

import sys

import cirq
import numpy as np
import pyarrow as pa
import sympy
import tensorflow as tf
import tensorflow_quantum as tfq

from examples.regression import write_parquet


def reuploading_circuit(qubits: list, layers: int) -> tuple[cirq.Circuit, list, list]:
    """The circuit, its trainable rotation symbols and its input symbols (layer by layer, qubit by qubit)."""
    thetas = np.array(sympy.symbols(f"theta(0:{layers + 1})(0:{len(qubits)})(0:3)")).reshape(layers + 1, len(qubits), 3)
    inputs = np.array(sympy.symbols(f"x(0:{layers})(0:{len(qubits)})")).reshape(layers, len(qubits))
    ring = list(zip(qubits, qubits[1:] + qubits[:1])) if len(qubits) > 2 else [tuple(qubits)]
    circuit = cirq.Circuit()
    for layer in range(layers + 1):
        circuit += [
            gate(angle)(qubit)
            for qubit, angles in zip(qubits, thetas[layer])
            for gate, angle in zip((cirq.rx, cirq.ry, cirq.rz), angles)
        ]
        if layer < layers:
            circuit += [cirq.CZ(a, b) for a, b in ring]
            circuit += [cirq.rx(angle)(qubit) for qubit, angle in zip(qubits, inputs[layer])]
    return circuit, list(thetas.flat), list(inputs.flat)


class ReUploadingPQC(tf.keras.layers.Layer):
    """The tutorial's layer: the trainable rotations and the scaled features joined into the symbol
    values of a ControlledPQC (in its sorted symbol order), fed empty circuits tiled over the batch."""

    def __init__(self, qubits: list, layers: int, observables: list, **kwargs):
        super().__init__(**kwargs)
        circuit, thetas, inputs = reuploading_circuit(qubits, layers)
        self.layers_count = layers
        self.theta = self.add_weight(
            name="theta", shape=(1, len(thetas)), initializer=tf.keras.initializers.RandomUniform(0, np.pi)
        )
        self.lmbd = self.add_weight(name="lambda", shape=(len(inputs),), initializer="ones")
        names = [str(symbol) for symbol in thetas + inputs]
        self.indices = tf.constant([names.index(name) for name in sorted(names)])
        self.empty_circuit = tfq.convert_to_tensor([cirq.Circuit()])
        self.computation = tfq.layers.ControlledPQC(circuit, observables)

    def call(self, features):
        batch = tf.shape(features)[0]
        circuits = tf.repeat(self.empty_circuit, repeats=batch)
        thetas = tf.tile(self.theta, [batch, 1])
        angles = self.lmbd * tf.tile(features, [1, self.layers_count])
        return self.computation([circuits, tf.gather(tf.concat([thetas, angles], axis=1), self.indices, axis=1)])


def classifier(n_qubits: int = 2, n_layers: int = 3, learning_rate: float = 0.05, seed: int = 0) -> tf.keras.Model:
    """`features` (one number per qubit) through the re-uploading PQC, <Z> of each qubit, then Dense(1, sigmoid).
    (The tutorial's parameter names: `qubits` and `layers` are config keys, which a model function
    taking them would be given.)"""
    tf.keras.utils.set_random_seed(seed)
    line = cirq.LineQubit.range(n_qubits)
    features = tf.keras.Input(shape=(n_qubits,), dtype=tf.float32, name="features")
    readouts = ReUploadingPQC(line, n_layers, [cirq.Z(qubit) for qubit in line])(features)
    model = tf.keras.Model(features, tf.keras.layers.Dense(1, activation="sigmoid")(readouts))
    model.compile(
        optimizer=tf.keras.optimizers.Adam(learning_rate),
        loss=tf.keras.losses.BinaryCrossentropy(),
        metrics=[tf.keras.metrics.BinaryAccuracy(name="accuracy")],
    )
    return model


def make_data(folder: str, examples: int = 200, files: int = 4, seed: int = 3) -> None:
    """`examples` points and their labels in `files` Parquet files (id, features, label)."""
    rng = np.random.default_rng(seed)
    points = rng.uniform(-1, 1, size=(examples, 2)).astype(np.float32)
    inside = (points**2).sum(axis=1) < 2 / np.pi  # the circle of half the square's area
    table = pa.table(
        {
            "id": np.arange(examples),
            "features": pa.FixedSizeListArray.from_arrays(pa.array(points.ravel()), 2),
            "label": pa.array(inside.astype(np.float32)),
        }
    )
    write_parquet(table, folder, files)


if __name__ == "__main__":
    make_data(sys.argv[1])
