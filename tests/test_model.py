"""The QCNN: its circuits, parameters and outputs, checked against cirq's own simulator."""

import collections

import cirq
import numpy as np
import pytest
import sympy
import tensorflow as tf
import tensorflow_quantum as tfq

from qml_ray import replica
from qml_ray.config import Config, max_layers
from qml_ray.model import (
    CONV_PARAMS,
    POOL_PARAMS,
    cluster_state_circuit,
    qcnn_circuit,
    qubits_for,
    two_qubit_unitary,
)


def symbol_counts(circuit: cirq.Circuit) -> collections.Counter:
    """How many gates each symbol parameterises."""
    counts = collections.Counter()
    for op in circuit.all_operations():
        counts.update(cirq.parameter_symbols(op))
    return counts


def test_two_qubit_unitary_uses_every_symbol_exactly_once():
    symbols = sympy.symbols("s0:15")
    counts = symbol_counts(two_qubit_unitary(cirq.LineQubit.range(2), symbols))
    assert counts == dict.fromkeys(symbols, 1)


@pytest.mark.parametrize("qubits, layers", [(4, 1), (5, 2), (8, 1), (8, 3), (23, 1), (23, 5)])
def test_each_layer_has_its_own_parameters(qubits, layers):
    circuit, readout = qcnn_circuit(qubits_for(qubits), layers)
    counts = symbol_counts(circuit)
    assert len(counts) == layers * (CONV_PARAMS + POOL_PARAMS)
    names = sorted(int(str(s)[len("qcnn") :]) for s in counts)
    assert names == list(range(layers * (CONV_PARAMS + POOL_PARAMS)))
    expected_readout = qubits
    for _ in range(layers):
        expected_readout = (expected_readout + 1) // 2
    assert len(readout) == expected_readout


def test_odd_qubit_counts_close_the_ring():
    qubits = qubits_for(5)
    circuit, _ = qcnn_circuit(qubits, 1)
    pairs = {tuple(sorted(op.qubits)) for op in circuit.all_operations() if len(op.qubits) == 2}
    ring = {tuple(sorted((qubits[i], qubits[(i + 1) % 5]))) for i in range(5)}
    assert ring <= pairs


@pytest.mark.parametrize("qubits, readouts", [(4, 2), (8, 4)])
def test_parameter_count_and_output_shape(qubits, readouts):
    model = replica.build(Config(qubits=qubits))
    quantum = CONV_PARAMS + POOL_PARAMS
    dense = (readouts * 8 + 8) + (8 + 1)
    assert model.count_params() == quantum + dense
    circuits = tfq.convert_to_tensor([cirq.Circuit(cirq.X(q)) for q in qubits_for(qubits)])
    assert model(circuits).shape == (qubits, 1)


@pytest.mark.parametrize(
    "activation, expected", [("linear", tf.keras.activations.linear), ("relu", tf.keras.activations.relu)]
)
def test_hidden_layer_is_linear_unless_configured(activation, expected):
    model = replica.build(Config(qubits=4, hidden_activation=activation))
    assert model.get_layer("dense_hidden").activation is expected


def test_headline_23_qubit_model_builds():
    config = Config(qubits=23, layers=max_layers(23))
    model = replica.build(config)
    assert model.get_layer("qcnn").output.shape == (None, 1)
    assert model.count_params() == max_layers(23) * (CONV_PARAMS + POOL_PARAMS) + (1 * 8 + 8) + 9


@pytest.mark.core
def test_pqc_expectations_equal_cirq_simulator():
    config = Config(qubits=4)
    model = replica.build(config)
    qcnn = model.get_layer("qcnn")
    rng = np.random.default_rng(3)
    qcnn.set_weights([rng.uniform(0, 2 * np.pi, size=w.shape).astype(np.float32) for w in qcnn.get_weights()])

    qubits = qubits_for(config.qubits)
    excitations = [cirq.Circuit(cirq.rx(angle)(qubits[i])) for i, angle in enumerate([0.3, -1.2, 2.5, -2.9])]
    readout_model = tf.keras.Model(model.inputs, qcnn.output)
    got = readout_model(tfq.convert_to_tensor(excitations)).numpy()

    circuit, readout_qubits = qcnn_circuit(qubits, config.layers)
    resolver = {symbol: float(value) for symbol, value in qcnn.symbol_values().items()}
    simulator = cirq.Simulator()
    for row, excitation in zip(got, excitations):
        full = cluster_state_circuit(qubits) + excitation + cirq.resolve_parameters(circuit, resolver)
        state = simulator.simulate(full, qubit_order=qubits).final_state_vector
        expected = [
            cirq.Z(q).expectation_from_state_vector(state, {q: i for i, q in enumerate(qubits)}).real
            for q in readout_qubits
        ]
        np.testing.assert_allclose(row, expected, atol=1e-4)
