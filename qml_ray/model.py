"""The hybrid quantum convolutional neural network of the TensorFlow Quantum QCNN tutorial.

A cluster state on n qubits is excited by the input circuit, then `layers` rounds of
quantum convolution (a 15-parameter two-qubit unitary over neighbouring pairs) and
quantum pooling (a 6-parameter gate moving half of the qubits' information onto the
other half). Z readouts on the qubits left feed Dense(8) and Dense(1), both linear as in
the original (`hidden_activation: relu` puts a ReLU on the Dense(8)); MSE loss, Adam.

With 8 qubits and one layer this is the circuit and model of the original, TFQ's
multi-worker QCNN example (`qcnn_multiworker`, the tutorial's hybrid model), but for
these deliberate differences:

- The symbol fix: the original raises ZZ, YY and XX to symbols 7, 8 and 9 of its
  two-qubit unitary, so symbol 6 is never used and symbol 9 drives both XX and the
  next rotation; here they take 6, 7 and 8, and each of the 15 parameters is used once.
- Sign accuracy: the original's Keras "accuracy" becomes binary accuracy for one
  output, (prediction > 0.5) == label, which never holds for the -1 labels; here
  accuracy is the share of predictions whose sign matches the +-1 label.
- The seeded shared data set: the original draws its examples unseeded in every
  worker, so each worker trains and validates on data of its own; here the driver
  draws them once from `seed` (data.py), writes them to the run folder, and the
  workers train on disjoint shards of that one set. The weights start from `seed` too.
- The random choice of excited qubit: the original excites each qubit in turn (20
  rounds over the 8 qubits); here each example's qubit is drawn at random with its
  angle, so any qubit count and number of examples work.
- Any size: the original is fixed at 8 qubits and one conv + pool layer; here `qubits`
  (4 or more, odd too) and `layers` are free.
"""

import cirq
import sympy
import tensorflow as tf
import tensorflow_quantum as tfq

from qml_ray import (
    keras_seeds,  # noqa: F401  (the QCNN seeds tf-keras: see keras_seeds)
    tfq_autograph,  # noqa: F401  (TFQ's code left unconverted: see tfq_autograph)
)

tf.get_logger().setLevel("ERROR")  # TF's Python info and warnings drown the run's own output

CONV_PARAMS = 15
POOL_PARAMS = 6


def qubits_for(count: int) -> list[cirq.GridQubit]:
    return cirq.GridQubit.rect(1, count)


def cluster_state_circuit(qubits) -> cirq.Circuit:
    """Hadamards, then CZ around the ring."""
    circuit = cirq.Circuit(cirq.H.on_each(qubits))
    for this, following in zip(qubits, qubits[1:] + qubits[:1]):
        circuit.append(cirq.CZ(this, following))
    return circuit


def one_qubit_unitary(qubit, symbols) -> cirq.Circuit:
    """A general single-qubit rotation from X, Y and Z powers (3 symbols)."""
    return cirq.Circuit(cirq.X(qubit) ** symbols[0], cirq.Y(qubit) ** symbols[1], cirq.Z(qubit) ** symbols[2])


def two_qubit_unitary(qubits, symbols) -> cirq.Circuit:
    """A parameterised two-qubit unitary (15 symbols, each used exactly once)."""
    first, second = qubits
    return cirq.Circuit(
        one_qubit_unitary(first, symbols[0:3]),
        one_qubit_unitary(second, symbols[3:6]),
        cirq.ZZ(first, second) ** symbols[6],
        cirq.YY(first, second) ** symbols[7],
        cirq.XX(first, second) ** symbols[8],
        one_qubit_unitary(first, symbols[9:12]),
        one_qubit_unitary(second, symbols[12:15]),
    )


def two_qubit_pool(source, sink, symbols) -> cirq.Circuit:
    """Pool source onto sink (6 symbols); the sink's basis change is undone with its inverse."""
    sink_basis = one_qubit_unitary(sink, symbols[0:3])
    source_basis = one_qubit_unitary(source, symbols[3:6])
    return cirq.Circuit(sink_basis, source_basis, cirq.CNOT(source, sink), sink_basis**-1)


def neighbour_pairs(qubits) -> list[tuple]:
    """Pairs (0,1), (2,3), ... then (1,2), (3,4), ... closing the ring, for any qubit count."""
    n = len(qubits)
    even = [(qubits[i], qubits[i + 1]) for i in range(0, n - 1, 2)]
    odd = [(qubits[i], qubits[(i + 1) % n]) for i in range(1, n, 2)]
    closing = [(qubits[-1], qubits[0])] if n % 2 and n > 2 else []
    return even + odd + closing


def quantum_conv_circuit(qubits, symbols) -> cirq.Circuit:
    """The same two-qubit unitary (shared weights) on every neighbouring pair."""
    return cirq.Circuit(two_qubit_unitary(pair, symbols) for pair in neighbour_pairs(qubits))


def quantum_pool_circuit(sources, sinks, symbols) -> cirq.Circuit:
    """The same pooling gate (shared weights) from each source onto its sink."""
    return cirq.Circuit(two_qubit_pool(source, sink, symbols) for source, sink in zip(sources, sinks))


def qcnn_circuit(qubits, layers: int) -> tuple[cirq.Circuit, list[cirq.GridQubit]]:
    """The model circuit and the qubits left to read out after `layers` conv + pool rounds."""
    symbols = sympy.symbols(f"qcnn0:{layers * (CONV_PARAMS + POOL_PARAMS)}")
    circuit = cirq.Circuit()
    active = list(qubits)
    for layer in range(layers):
        offset = layer * (CONV_PARAMS + POOL_PARAMS)
        conv = symbols[offset : offset + CONV_PARAMS]
        pool = symbols[offset + CONV_PARAMS : offset + CONV_PARAMS + POOL_PARAMS]
        sources, sinks = active[: len(active) // 2], active[len(active) // 2 :]
        circuit += quantum_conv_circuit(active, conv)
        circuit += quantum_pool_circuit(sources, sinks, pool)
        active = sinks
    return circuit, active


def sign_agreement(y_true, y_pred):
    """Per example, 1.0 where the predicted sign (>= 0 counts as +1) matches the label."""
    predicted = tf.where(y_pred >= 0, 1.0, -1.0)
    return tf.cast(tf.equal(tf.reshape(y_true, [-1]), tf.reshape(predicted, [-1])), tf.float32)


def qcnn(
    qubits: int = 8,
    layers: int = 1,
    hidden_activation: str = "linear",
    learning_rate: float = 0.02,
    seed: int = 0,
) -> tf.keras.Model:
    """The hybrid QCNN, compiled with MSE, Adam and sign accuracy: qml_ray's default model function
    (its parameters are config keys of the same names); the contract gives its PQC layer the quantum
    gradient the config's `differentiator` names. Call inside a strategy scope."""
    tf.keras.utils.set_random_seed(seed)
    qubits = qubits_for(qubits)
    model_circuit, readout_qubits = qcnn_circuit(qubits, layers)
    excitations = tf.keras.Input(shape=(), dtype=tf.string, name="circuit")
    prepared = tfq.layers.AddCircuit()(excitations, prepend=cluster_state_circuit(qubits))
    readouts = tfq.layers.PQC(model_circuit, [cirq.Z(q) for q in readout_qubits], name="qcnn")(prepared)
    hidden = tf.keras.layers.Dense(8, activation=hidden_activation, name="dense_hidden")(readouts)
    output = tf.keras.layers.Dense(1, name="dense_output")(hidden)
    model = HybridQCNN(excitations, output, readouts)
    model.compile(
        optimizer=tf.keras.optimizers.Adam(learning_rate=learning_rate),
        loss=tf.keras.losses.MeanSquaredError(),
        metrics=[tf.keras.metrics.MeanMetricWrapper(sign_agreement, name="accuracy")],
    )
    return model


class HybridQCNN(tf.keras.Model):
    """The functional hybrid model. Its evaluation step also hands the callbacks each batch's QCNN
    readouts (`qcnn_readout` in on_test_batch_end's logs), from the same forward pass: the readout
    histogram costs no simulation of its own. Step outputs are each worker's own
    (`distribute_reduction_method` "first"): Keras would otherwise sum them across workers."""

    def __init__(self, excitations, output, readouts):
        super().__init__(inputs=excitations, outputs=output, name="hybrid_qcnn")
        self.distribute_reduction_method = "first"
        self.with_readouts = tf.keras.Model(inputs=excitations, outputs=[readouts, output])

    def test_step(self, data):
        x, y, sample_weight = tf.keras.utils.unpack_x_y_sample_weight(data)
        readouts, y_pred = self.with_readouts(x, training=False)
        self.compute_loss(x, y, y_pred, sample_weight)
        return {**self.compute_metrics(x, y, y_pred, sample_weight), "qcnn_readout": readouts}
