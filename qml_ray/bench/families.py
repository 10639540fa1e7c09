"""The circuit families `bench circuits` times, each a batch of whole circuits (as cirq circuits, and
serialized as TFQ and the block kernel take them) and, per differentiator, its timed calls: the QCNN's model,
or a TFQ expectation layer on multi-controlled gates. Importing this module starts TensorFlow."""

import cirq
import numpy as np
import sympy
import tensorflow as tf
import tensorflow_quantum as tfq

from qml_ray import data, replica
from qml_ray.config import Config
from qml_ray.gradients import BlockAdjoint
from qml_ray.model import cluster_state_circuit, qcnn_circuit, qubits_for

DIFFERENTIATORS = ("tfq", "block")
FAMILIES = {
    "qcnn": "the 1-layer QCNN",
    "controlled": "2 layers of a ry on every qubit, a ZZ on every pair of neighbours controlled by the next 2 "
    "(values 1, 0), and a rx on every qubit controlled by the next 3 (values 1, 0, 1), each gate with a symbol",
}


def calls(family: str, qubits: int, circuits: int) -> tuple[dict, dict]:
    """The family's batch of `circuits` circuits on `qubits` qubits, and its calls per differentiator."""
    return {"qcnn": qcnn_calls, "controlled": controlled_calls}[family](qubits, circuits)


def qcnn_batch(qubits: int, circuits: int) -> tuple[Config, tf.Tensor]:
    """The QCNN's config of `qubits` qubits, and a batch of `circuits` of its data set's circuits."""
    config = Config(qubits=qubits, examples=max(10, 2 * circuits))
    return config, tf.constant(data.generate(config)["train"].column("circuit").to_pylist()[:circuits])


def qcnn_calls(qubits: int, circuits: int) -> tuple[dict, dict]:
    """The QCNN's batch (`model_circuits`), and per differentiator its model's forward and forward + gradient
    on it, warmed up (compiling and plans of the batch stay out of the timings)."""
    config, batch = qcnn_batch(qubits, circuits)
    calls = {}
    for name in DIFFERENTIATORS:
        model = replica.build(config.replace(differentiator=name))

        def forward(inputs=batch, model=model):
            return model(inputs, training=False)

        def forward_and_gradient(inputs=batch, model=model):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(model(inputs, training=True))
            return tape.gradient(loss, model.trainable_variables)

        forward(batch), forward_and_gradient(batch[:1])
        calls[name] = forward, forward_and_gradient
    return model_circuits(config, model, batch), calls  # the block model's: the last built


def controlled_calls(qubits: int, circuits: int) -> tuple[dict, dict]:
    """A batch of the controlled family's circuits (`controlled_circuits`), and per differentiator a TFQ
    expectation layer's forward and forward + gradient (with respect to the weights) on it, warmed up."""
    whole = controlled_circuits(qubits, circuits)
    programs, names, sums = (tf.constant(whole[key]) for key in ("programs", "names", "pauli_sums"))
    calls = {}
    for name, differentiator in (("tfq", tfq.differentiators.Adjoint()), ("block", BlockAdjoint())):
        layer = tfq.layers.Expectation(differentiator=differentiator)
        weights = tf.Variable(np.tile(whole["weights"], (circuits, 1)))

        def forward(layer=layer, weights=weights):
            return layer(programs, symbol_names=names, symbol_values=weights, operators=sums)

        def forward_and_gradient(forward=forward, weights=weights):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(forward())
            return tape.gradient(loss, weights)

        forward(), forward_and_gradient()
        calls[name] = forward, forward_and_gradient
    return whole, calls


def controlled_circuits(qubits: int, circuits: int) -> dict:
    """The controlled family (FAMILIES) after a data encoding (H on every qubit, then a rx of the circuit's own
    angle on each), readouts Z on every fourth qubit, weights drawn once; as `model_circuits` gives them."""
    register = cirq.LineQubit.range(qubits)
    symbols = []

    def symbol() -> sympy.Symbol:
        symbols.append(sympy.Symbol(f"c{len(symbols)}"))
        return symbols[-1]

    def near(q: int, *steps: int) -> list:
        return [register[(q + step) % qubits] for step in steps]

    model = cirq.Circuit()
    for _ in range(2):
        model += (cirq.ry(symbol())(q) for q in register)
        model += (
            (cirq.ZZ(*near(q, 0, 1)) ** symbol()).controlled_by(*near(q, 2, 3), control_values=[1, 0])
            for q in range(qubits)
        )
        model += (
            cirq.rx(symbol())(register[q]).controlled_by(*near(q, 1, 2, 3), control_values=[1, 0, 1])
            for q in range(qubits)
        )
    rng = np.random.default_rng(qubits)
    encodings = [
        cirq.Circuit(cirq.H.on_each(register), (cirq.rx(a)(q) for a, q in zip(rng.uniform(-3, 3, qubits), register)))
        for _ in range(circuits)
    ]
    weights = rng.uniform(-3, 3, len(symbols)).astype(np.float32)
    readouts = [cirq.Z(q) for q in register[::4]]
    return serialized([encoding + model for encoding in encodings], symbols, weights, readouts)


def model_circuits(config: Config, model, batch) -> dict:
    """The batch's whole circuits as the QCNN layer simulates them (cluster state, excitation, model
    circuit), their symbols and the model's weights for them, their readouts, and the same serialized as
    the block kernel takes them."""
    qubits = qubits_for(config.qubits)
    circuit, readout_qubits = qcnn_circuit(qubits, config.layers)
    weights = model.get_layer("qcnn").symbol_values()
    symbols = sorted(weights, key=str)
    whole = [cluster_state_circuit(qubits) + excitation + circuit for excitation in tfq.from_tensor(batch)]
    values = np.array([weights[s] for s in symbols], np.float32)
    return serialized(whole, symbols, values, [cirq.Z(q) for q in readout_qubits])


def serialized(whole: list, symbols: list, weights: np.ndarray, readouts: list) -> dict:
    """Whole circuits, their symbols, weights and readouts, and the same serialized as TFQ takes them."""
    return {
        "circuits": whole,
        "symbols": symbols,
        "weights": weights,
        "readouts": readouts,
        "programs": tfq.convert_to_tensor(whole).numpy(),
        "names": np.array([str(s).encode() for s in symbols]),
        "pauli_sums": tfq.convert_to_tensor([readouts] * len(whole)).numpy(),
    }
