"""A model of every kind of TFQ layer a user may train but the analytic PQC: a NoisyPQC, a
NoisyControlledPQC, a sampled PQC (`repetitions`), a bare SampledExpectation, and a PQC whose
differentiator the model sets; each reads the regression example's two qubits (examples/regression.py)."""

import cirq
import sympy
import tensorflow as tf
import tensorflow_quantum as tfq

QUBITS = cirq.LineQubit.range(2)
REPETITIONS = 20


class SampledReadout(tf.keras.layers.Layer):
    """<Z0 Z1> of the circuits with an ansatz of two trainable angles appended, from a bare SampledExpectation."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.symbols = sympy.symbols("s0 s1")
        self.ansatz = cirq.Circuit(cirq.ry(self.symbols[0])(QUBITS[0]), cirq.ry(self.symbols[1])(QUBITS[1]))
        self.append = tfq.layers.AddCircuit()
        self.expectation = tfq.layers.SampledExpectation(name="sampled_expectation")

    def build(self, input_shape):
        self.angles = self.add_weight(name="angles", shape=(1, 2), initializer="zeros")

    def call(self, circuits):
        batch = tf.shape(circuits)[0]
        return self.expectation(
            self.append(circuits, append=self.ansatz),
            symbol_names=[str(symbol) for symbol in self.symbols],
            symbol_values=tf.tile(self.angles, [batch, 1]),
            operators=cirq.Z(QUBITS[0]) * cirq.Z(QUBITS[1]),
            repetitions=REPETITIONS,
        )


def every_kind(learning_rate: float = 0.05) -> tf.keras.Model:
    a, b = sympy.symbols("a b")
    ansatz = cirq.Circuit(cirq.ry(a)(QUBITS[0]), cirq.rx(b)(QUBITS[1]))
    readout = cirq.Z(QUBITS[0]) * cirq.Z(QUBITS[1])
    circuits = tf.keras.Input(shape=(), dtype=tf.string)
    noisy = tfq.layers.NoisyPQC(ansatz, readout, repetitions=REPETITIONS, sample_based=False, name="noisy")(circuits)
    controls = tf.keras.layers.Dense(2)(noisy)
    controlled = tfq.layers.NoisyControlledPQC(
        ansatz, readout, repetitions=REPETITIONS, sample_based=True, name="noisy_controlled"
    )([circuits, controls])
    sampled = tfq.layers.PQC(ansatz, readout, repetitions=REPETITIONS, name="sampled")(circuits)
    chosen = tfq.layers.PQC(ansatz, readout, differentiator=tfq.differentiators.ForwardDifference(), name="chosen")(
        circuits
    )
    bare = SampledReadout(name="bare")(circuits)
    readouts = tf.keras.layers.Concatenate()([noisy, controlled, sampled, chosen, bare])
    model = tf.keras.Model(circuits, tf.keras.layers.Dense(1)(readouts))
    model.compile(tf.keras.optimizers.Adam(learning_rate), loss="mse")
    return model
