"""A regression of a continuous quantity: the two-qubit correlation <Z0 Z1> of an entangled state.

The data: ry(a) on qubit 0, ry(b) on qubit 1, then a CNOT, with a and b random; the label is
<Z0 Z1> of that state, a float in [-1, 1]. The model: a trainable layer of rotations,
Z readouts, and a linear Dense(1), trained with mean squared error.

    python -m examples.regression data/correlation   # writes the data set as Parquet
    python -m qml_ray.train --model examples.regression:regressor --data data/correlation --name corr
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


def regressor(readout_layers: int = 1, learning_rate: float = 0.05, seed: int = 0) -> tf.keras.Model:
    """Trainable rotations on both qubits, <Z0>, <Z1> and <Z0 Z1>, then Dense(1)."""
    tf.keras.utils.set_random_seed(seed)
    qubits = cirq.LineQubit.range(2)
    symbols = iter(sympy.symbols(f"phi0:{2 * readout_layers * len(qubits)}"))
    ansatz = cirq.Circuit()
    for _ in range(readout_layers):
        ansatz += [cirq.ry(next(symbols))(q) for q in qubits]
        ansatz += [cirq.rx(next(symbols))(q) for q in qubits]
    first, second = qubits
    circuits = tf.keras.Input(shape=(), dtype=tf.string)
    readouts = tfq.layers.PQC(ansatz, [cirq.Z(first), cirq.Z(second), cirq.Z(first) * cirq.Z(second)])(circuits)
    value = tf.keras.layers.Dense(1)(readouts)
    model = tf.keras.Model(circuits, value)
    model.compile(
        optimizer=tf.keras.optimizers.Adam(learning_rate),
        loss=tf.keras.losses.MeanSquaredError(),
        metrics=[tf.keras.metrics.MeanAbsoluteError(name="mae")],
    )
    return model


def make_data(folder: str, examples: int = 200, files: int = 4, seed: int = 2) -> None:
    """`examples` circuits and their <Z0 Z1> in `files` Parquet files (id, circuit, label)."""
    rng = np.random.default_rng(seed)
    first, second = cirq.LineQubit.range(2)
    angles = rng.uniform(0, 2 * np.pi, size=(examples, 2))
    circuits = [cirq.Circuit(cirq.ry(a)(first), cirq.ry(b)(second), cirq.CNOT(first, second)) for a, b in angles]
    simulator, correlation = cirq.Simulator(dtype=np.complex128), cirq.Z(first) * cirq.Z(second)
    labels = [simulator.simulate_expectation_values(circuit, [correlation])[0].real for circuit in circuits]
    table = pa.table(
        {
            "id": np.arange(examples),
            "circuit": pa.array(tfq.convert_to_tensor(circuits).numpy(), pa.binary()),
            "label": pa.array(labels, pa.float32()),
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
