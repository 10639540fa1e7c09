"""Models that take classical data: the block gradient where a circuit's symbol values come from the
model's own layers (TFQ's "Hello, many worlds" controller, the re-uploading PQC, a bare Expectation),
against TFQ's Adjoint and central differences of cirq's double-precision simulator on the classical
weights; and how a data set's columns feed a model's inputs (features.py). (Trained end to end:
test_your_model.)"""

import cirq
import numpy as np
import pyarrow as pa
import pytest
import sympy
import tensorflow as tf
import tensorflow_quantum as tfq

from examples.reuploading import classifier
from qml_ray import features, quantum_layers
from qml_ray.errors import UsageError
from qml_ray.gradients import BlockAdjoint

STEP = 1e-5  # central differences in double precision
QUBIT = cirq.GridQubit(0, 0)
# The tutorial's model circuit: three rotations whose angles the controller gives.
ANGLES = sympy.symbols("theta_1 theta_2 theta_3")
MODEL_CIRCUIT = cirq.Circuit(cirq.rz(ANGLES[0])(QUBIT), cirq.ry(ANGLES[1])(QUBIT), cirq.rx(ANGLES[2])(QUBIT))


def controlled(differentiator: str) -> tf.keras.Model:
    """The tutorial's controller (Dense 10 elu, Dense 3) feeding a ControlledPQC, seeded, its quantum
    gradient given by the `differentiator` rule (auto: BlockAdjoint for TFQ's Adjoint; tfq: as built)."""
    tf.keras.utils.set_random_seed(1)
    circuits = tf.keras.Input(shape=(), dtype=tf.string, name="circuits_input")
    commands = tf.keras.Input(shape=(1,), dtype=tf.float32, name="commands_input")
    controller = tf.keras.Sequential([tf.keras.layers.Dense(10, activation="elu"), tf.keras.layers.Dense(3)])
    expectation = tfq.layers.ControlledPQC(MODEL_CIRCUIT, cirq.Z(QUBIT))([circuits, controller(commands)])
    model = tf.keras.Model([circuits, commands], expectation)
    model.compile(tf.keras.optimizers.Adam(0.05), loss="mse")
    quantum_layers.gradients(model, differentiator)
    return model


def noisy_preparations(count: int, seed: int = 0) -> list[cirq.Circuit]:
    """The tutorial's inputs: small random rotations of the qubit."""
    angles = np.random.default_rng(seed).uniform(0, 2 * np.pi, size=(count, 2)) * 0.1
    return [cirq.Circuit(cirq.rx(a)(QUBIT), cirq.ry(b)(QUBIT)) for a, b in angles]


def loss_gradients(model, inputs, labels) -> list[np.ndarray]:
    """d mse / d every trainable variable of `model` on one batch."""
    with tf.GradientTape() as tape:
        loss = model.compiled_loss(tf.constant(labels, tf.float32), model(inputs, training=True))
    return [gradient.numpy() for gradient in tape.gradient(loss, model.trainable_variables)]


def cirq_controlled_loss(weights: list[np.ndarray], circuits, commands, labels) -> float:
    """The controller's mse, in double precision: numpy for the Dense layers, cirq for the circuits."""
    w1, b1, w2, b2 = weights
    hidden = commands @ w1 + b1
    angles = np.where(hidden > 0, hidden, np.expm1(hidden)) @ w2 + b2
    simulator = cirq.Simulator(dtype=np.complex128)
    outputs = []
    for circuit, values in zip(circuits, angles):
        resolved = cirq.resolve_parameters(circuit + MODEL_CIRCUIT, dict(zip(ANGLES, values)))
        state = simulator.simulate(resolved, qubit_order=[QUBIT]).final_state_vector
        outputs.append(cirq.Z(QUBIT).expectation_from_state_vector(state, {QUBIT: 0}).real)
    return float(np.mean((np.array(outputs) - labels) ** 2))


def central_differences(loss, weights: list[np.ndarray]) -> list[np.ndarray]:
    found = []
    for index, weight in enumerate(weights):
        gradient = np.zeros_like(weight)
        for position in np.ndindex(weight.shape):
            shifted = [[w.copy() for w in weights] for _ in range(2)]
            shifted[0][index][position] += STEP
            shifted[1][index][position] -= STEP
            gradient[position] = (loss(shifted[0]) - loss(shifted[1])) / (2 * STEP)
        found.append(gradient)
    return found


@pytest.mark.core
def test_the_controllers_gradient_through_the_block_method():
    """The classical weights' gradient flows back through the symbol values of each example: as central
    differences in double precision have it, BlockAdjoint (in double precision inside) within 2e-6, and
    TFQ's Adjoint (in single precision) within 5e-5."""
    block, adjoint = controlled("auto"), controlled("tfq")
    assert isinstance(quantum_layers.sites(block)[0].bound()[0], BlockAdjoint)
    assert type(quantum_layers.sites(adjoint)[0].bound()[0]) is tfq.differentiators.Adjoint
    circuits = noisy_preparations(4)
    commands, labels = np.array([[0.0], [1.0], [0.0], [1.0]]), np.array([[1.0], [-1.0], [1.0], [-1.0]])
    inputs = [tfq.convert_to_tensor(circuits), tf.constant(commands, tf.float32)]
    by_block, by_adjoint = loss_gradients(block, inputs, labels), loss_gradients(adjoint, inputs, labels)
    weights = [w.numpy().astype(np.float64) for w in block.trainable_variables]
    oracle = central_differences(lambda w: cirq_controlled_loss(w, circuits, commands, labels.ravel()), weights)
    for found, expected, other in zip(by_block, oracle, by_adjoint):  # errors seen: 3-7e-7 and 1.2-1.8e-5
        np.testing.assert_allclose(found, expected, atol=2e-6)
        np.testing.assert_allclose(other, expected, atol=5e-5)
    assert max(np.abs(g).max() for g in oracle) > 0.01  # the weights do move the loss


@pytest.mark.core
def test_the_reuploading_pqc_and_a_bare_expectation_take_the_block_gradient():
    """Symbol values from the model's layers: the re-uploading PQC's joined rotations and scaled
    features, and a bare Expectation fed a Dense layer's output; every trainable weight's gradient and
    the features' own are the same with BlockAdjoint as with TFQ's Adjoint."""
    features_in = tf.constant(np.random.default_rng(1).uniform(-1, 1, (5, 2)), tf.float32)
    labels = tf.constant([[1.0], [0.0], [1.0], [0.0], [1.0]])
    found = {}
    for rule in ("auto", "tfq"):
        model = classifier(seed=4)
        found[rule] = [quantum_layers.gradients(model, rule)[0].gradient]
        with tf.GradientTape() as tape:
            tape.watch(features_in)
            loss = model.compiled_loss(labels, model(features_in, training=True))
        found[rule] += [g.numpy() for g in tape.gradient(loss, [features_in, *model.trainable_variables])]
    assert found["auto"][0] == "BlockAdjoint" and found["tfq"][0] == "Adjoint"
    for block, adjoint in zip(found["auto"][1:], found["tfq"][1:]):  # TFQ's Adjoint in single precision
        np.testing.assert_allclose(block, adjoint, atol=1e-5)

    qubits = cirq.LineQubit.range(2)
    circuit = cirq.Circuit(
        cirq.ry(sympy.Symbol("a"))(qubits[0]), cirq.CNOT(*qubits), cirq.rx(sympy.Symbol("b"))(qubits[1])
    )
    values = tf.constant(np.random.default_rng(2).normal(size=(3, 4)), tf.float32)
    gradients = {}
    for rule in ("auto", "tfq"):
        tf.keras.utils.set_random_seed(5)
        points = tf.keras.Input(shape=(4,), name="points")
        angles = tf.keras.layers.Dense(2)(points)
        programs = tf.repeat(tfq.convert_to_tensor([circuit]), tf.shape(points)[0])
        expectation = tfq.layers.Expectation()(
            programs, symbol_names=["a", "b"], symbol_values=angles, operators=[cirq.Z(qubits[1])]
        )
        model = tf.keras.Model(points, expectation)
        assert quantum_layers.gradients(model, rule)[0].gradient == ("BlockAdjoint" if rule == "auto" else "Adjoint")
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(values) ** 2)
        gradients[rule] = [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]
    for block, adjoint in zip(gradients["auto"], gradients["tfq"]):
        np.testing.assert_allclose(block, adjoint, atol=1e-5)


def columns(**fields: pa.DataType) -> tuple[features.Column, ...]:
    return features.columns_of(pa.schema(list(fields.items())))


def inputs(**shapes) -> tuple[features.ModelInput, ...]:
    """Model inputs by name: a shape, or 'circuits'."""
    return tuple(
        features.ModelInput(name, shape == "circuits", () if shape == "circuits" else shape)
        for name, shape in shapes.items()
    )


@pytest.mark.core
def test_named_inputs_take_their_columns_and_one_unnamed_input_takes_circuit():
    data = columns(id=pa.int64(), circuits_input=pa.binary(), commands_input=pa.float32(), label=pa.float32())
    feed = features.feed(inputs(circuits_input="circuits", commands_input=(1,)), data, "d")
    assert feed.columns == ["circuits_input", "commands_input"] and feed.circuit_columns == ["circuits_input"]
    batch = {"circuits_input": np.array([b"a", b"b"], object), "commands_input": np.array([0.0, 1.0])}
    fed = feed.inputs(batch)
    assert set(fed) == {"circuits_input", "commands_input"} and fed["commands_input"].shape == (2, 1)
    assert fed["commands_input"].dtype == np.float32

    qcnn = features.feed(inputs(excitations="circuits"), columns(circuit=pa.binary(), label=pa.float32()), "d")
    assert qcnn.columns == ["circuit"]
    vectors = columns(features=pa.list_(pa.float32(), 4), label=pa.float32())
    feed = features.feed(inputs(features=(4,)), vectors, "d")
    rows = np.array([np.arange(4.0), np.arange(4.0) + 1], object)
    assert feed.inputs({"features": rows}).shape == (2, 4)


@pytest.mark.parametrize(
    "model, data, message",
    [
        (
            {"circuits_input": "circuits", "commands_input": (1,)},
            {"circuits_input": pa.binary(), "label": pa.float32()},
            "model input 'commands_input' has no column of its name (the model's inputs: circuits_input "
            "(circuits), commands_input (float32 (1,)); the columns of d: circuits_input (circuits), label (number))",
        ),
        (
            {"x": "circuits"},
            {"id": pa.int64(), "label": pa.float32()},
            "model input 'x' has no column of its name and no",
        ),
        ({"x": (4,)}, {"x": pa.binary()}, "column x (circuits) cannot feed model input 'x', which takes numbers"),
        (
            {"x": "circuits"},
            {"x": pa.float64()},
            "column x (number) cannot feed model input 'x', which takes serialized",
        ),
        (
            {"x": (4,)},
            {"x": pa.list_(pa.float32(), 3)},
            "column x (numbers of 3) does not fit model input x (float32 (4,))",
        ),
        ({"x": (1,)}, {"x": pa.list_(pa.float32())}, "the lists of column 'x' differ in length"),
        ({"x": (1,)}, {"x": pa.list_(pa.string())}, "column x (other) cannot feed model input 'x'"),
    ],
)
def test_a_column_that_cannot_feed_its_input_is_named(model, data, message):
    with pytest.raises(UsageError) as raised:
        features.feed(inputs(**model), columns(**data), "d")
    assert message in str(raised.value)


def test_held_out_keys_are_the_same_from_any_batch_layout():
    """Without a circuit column, a row's hash is keyed by its values: a list column as arrays of
    objects (pyarrow) and as a 2-d array (Ray Data's numpy batches) key the same rows alike."""
    points = np.arange(6, dtype=np.float32).reshape(3, 2)
    as_objects = {"id": np.arange(3), "features": np.array([*points, None], object)[:3], "label": np.ones(3)}
    as_array = {"id": np.arange(3), "features": points, "label": np.zeros(3)}
    assert features.row_keys(as_objects) == features.row_keys(as_array)
    assert len(set(features.row_keys(as_array))) == 3
