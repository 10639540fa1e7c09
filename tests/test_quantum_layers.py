"""The quantum gradient each TFQ layer of any model gets from the config's `differentiator`, built in
this process (real TFQ): the examples' gradients through the block method against TFQ's Adjoint, a
differentiator the model chose, a noise channel, and `block` where it cannot be had; and the tutorial
trained with TFQ's gradient against its run with the block gradient."""

import csv
import importlib
import json

import cirq
import numpy as np
import pyarrow.parquet as pq
import pytest
import sympy
import tensorflow as tf
import tensorflow_quantum as tfq

from qml_ray import config as config_lib, replica, storage
from qml_ray.errors import ModelError
from qml_ray.worker import record_gradients

from conftest import TUTORIAL, command_env, run_command
from test_your_model import gradients_of

BATCH = 16
QUBITS = cirq.LineQubit.range(2)
ANGLE = sympy.Symbol("angle")
EXAMPLES = [("hea_classifier", "examples.hea_classifier:classifier"), ("regression", "examples.regression:regressor")]


def built(model, differentiator: str) -> tuple:
    """The model (a MODULE:FUNCTION or a function) as the contract builds it, and its gradients."""
    config = config_lib.Config(differentiator=differentiator)
    if isinstance(model, str):
        return replica.build_with_gradients(config.replace(model=model))
    return replica.build_with_gradients(config, model)


def loss_gradients(model, circuits, labels) -> list[np.ndarray]:
    with tf.GradientTape() as tape:
        loss = model.compiled_loss(labels, model(circuits, training=True))
    return [gradient.numpy() for gradient in tape.gradient(loss, model.trainable_variables)]


def example_rows(example: str, folder, rows: int) -> tuple:
    """The first `rows` circuits and labels of the example's data set, written to `folder`."""
    importlib.import_module(f"examples.{example}").make_data(str(folder))
    table = pq.read_table(folder).slice(0, rows)
    labels = np.stack(table.column("label").to_numpy(zero_copy_only=False)).reshape(rows, -1)
    return tf.constant(table.column("circuit").to_pylist()), tf.constant(labels, tf.float32)


@pytest.mark.core
@pytest.mark.parametrize("example, spec", EXAMPLES)
def test_the_examples_get_the_block_gradient_and_it_matches_tfqs_adjoint(example, spec, tmp_path):
    circuits, labels = example_rows(example, tmp_path, BATCH)
    block, [gradient] = built(spec, "auto")
    assert (gradient.kind, gradient.gradient, gradient.warning) == ("PQC", "BlockAdjoint", False)
    tfqs, [kept] = built(spec, "tfq")
    assert kept.gradient == "Adjoint"
    tfqs.set_weights(block.get_weights())
    for ours, theirs in zip(loss_gradients(block, circuits, labels), loss_gradients(tfqs, circuits, labels)):
        np.testing.assert_allclose(ours, theirs, atol=1e-4)


def trained_losses(spec: str, circuits, labels) -> list[float]:
    """Two epochs of the model the contract builds (seeded), on `circuits` and `labels`."""
    model, _ = built(spec, "auto")
    history = model.fit(circuits, labels, epochs=2, batch_size=4, shuffle=False, verbose=0)
    return history.history["loss"]


@pytest.mark.core
@pytest.mark.parametrize("example, spec", EXAMPLES)
def test_tfqs_code_runs_unconverted_and_trains_as_converted(example, spec, tmp_path, monkeypatch):
    """TFQ's functions are left to run as written (qml_ray.tfq_autograph); converted by autograph, as
    TensorFlow would without that rule, the same model trains to the same losses."""
    from tensorflow.python.autograph.core import config as autograph
    from tensorflow.python.autograph.impl import conversion

    assert conversion.is_allowlisted(tfq.layers.Expectation.call) and conversion.is_allowlisted(tfq.layers.PQC.call)
    circuits, labels = example_rows(example, tmp_path, 8)
    unconverted = trained_losses(spec, circuits, labels)
    rules = [rule for rule in autograph.CONVERSION_RULES if not rule.matches("tensorflow_quantum")]
    monkeypatch.setattr(autograph, "CONVERSION_RULES", tuple(rules))
    assert not conversion.is_allowlisted(tfq.layers.Expectation.call)
    np.testing.assert_allclose(unconverted, trained_losses(spec, circuits, labels), rtol=1e-6)


def two_layers():
    """A PQC on parameter shift, chosen on purpose, beside a bare Expectation layer (TFQ's Adjoint)."""
    circuits = tf.keras.Input(shape=(), dtype=tf.string)
    shifted = tfq.layers.PQC(
        cirq.Circuit(cirq.rx(ANGLE)(QUBITS[0])),
        cirq.Z(QUBITS[0]),
        differentiator=tfq.differentiators.ParameterShift(),
        name="shifted",
    )(circuits)
    bare = tfq.layers.Expectation(name="bare")(circuits, symbol_names=[ANGLE], operators=cirq.Z(QUBITS[0]))
    model = tf.keras.Model(circuits, tf.keras.layers.Concatenate()([shifted, bare]))
    model.compile(tf.keras.optimizers.Adam(0.1), loss="mse")
    return model


def test_a_chosen_differentiator_is_kept_but_by_block(tmp_path):
    _, gradients = built(two_layers, "auto")
    assert [(g.layer, g.kind, g.gradient, g.why) for g in gradients] == [
        ("shifted", "PQC", "ParameterShift", "chosen by the model"),
        ("bare", "Expectation", "BlockAdjoint", "differentiator auto, for Adjoint"),
    ]
    _, gradients = built(two_layers, "block")
    assert [g.gradient for g in gradients] == ["BlockAdjoint", "BlockAdjoint"]
    _, gradients = built(two_layers, "tfq")
    assert [g.gradient for g in gradients] == ["ParameterShift", "Adjoint"]


def noisy(learning_rate=0.1):
    """A NoisyPQC whose circuit holds a depolarizing channel."""
    circuits = tf.keras.Input(shape=(), dtype=tf.string)
    model_circuit = cirq.Circuit(cirq.rx(ANGLE)(QUBITS[0]), cirq.depolarize(0.01)(QUBITS[0]))
    readout = tfq.layers.NoisyPQC(model_circuit, cirq.Z(QUBITS[0]), repetitions=20, sample_based=False, name="noisy")(
        circuits
    )
    model = tf.keras.Model(circuits, readout)
    model.compile(tf.keras.optimizers.Adam(learning_rate), loss="mse")
    return model


def test_a_noise_channel_keeps_tfqs_gradient_with_one_warning_and_trains(tmp_path):
    model, gradients = built(noisy, "auto")
    lines = []
    record_gradients(str(tmp_path), "auto", gradients, lines.append)
    [line] = lines
    assert line.startswith("warning: layer noisy (NoisyPQC) keeps TFQ's ParameterShift: ")
    assert "noise channel DepolarizingChannel" in line
    record = json.loads((tmp_path / storage.GRADIENTS).read_text())
    assert record["differentiator"] == "auto"
    assert [(layer["layer"], layer["gradient"], layer["warning"]) for layer in record["layers"]] == [
        ("noisy", "ParameterShift", True)
    ]
    circuits = tfq.convert_to_tensor([cirq.Circuit(cirq.rx(a)(QUBITS[0])) for a in np.linspace(0, np.pi, 8)])
    before = model.get_weights()[0].copy()
    history = model.fit(circuits, np.cos(np.linspace(0, np.pi, 8)).reshape(-1, 1), epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all() and not np.allclose(model.get_weights()[0], before)


def test_block_on_a_model_that_cannot_take_it_is_a_model_error():
    """What a training's workers meet as they build the model: the command then ends in one line
    (test_bad_input's training whose worker finds its model wrong)."""
    with pytest.raises(
        ModelError, match=r"differentiator block: layer noisy \(NoisyPQC\) cannot take the block gradient"
    ):
        built(noisy, "block")


def on_qubits(count: int):
    """A model whose PQC holds a circuit on `count` qubits (a rotation on each)."""
    qubits = cirq.LineQubit.range(count)
    circuits = tf.keras.Input(shape=(), dtype=tf.string)
    readout = tfq.layers.PQC(cirq.Circuit(cirq.rx(ANGLE).on_each(qubits)), cirq.Z(qubits[-1]))(circuits)
    return tf.keras.Model(circuits, readout)


def test_the_memory_check_counts_the_models_and_the_datas_qubits(shared_ray):
    """Sized from the circuits, not from the `qubits` key: 34 qubits fit no node here, 4 fit any."""
    import ray

    from qml_ray import runtime
    from qml_ray.errors import UsageError
    from qml_ray.worker import require_state_memory

    runtime.connect(shared_ray, log_to_driver=False)
    try:
        require_state_memory(on_qubits(4), (), 1)
        with pytest.raises(UsageError, match=r"a training worker's state vectors \(34 qubits, 1 thread\(s\)\) need"):
            require_state_memory(on_qubits(34), (), 1)
        data = tfq.convert_to_tensor([cirq.Circuit(cirq.X.on_each(cirq.LineQubit.range(4, 34)))]).numpy()[0]
        with pytest.raises(UsageError, match=r"\(34 qubits, 1 thread\(s\)\)"):  # the model's 4, the data's 30
            require_state_memory(on_qubits(4), (data,), 1)
    finally:
        ray.shutdown()


TFQ_EPOCHS = 5  # of the tutorial's 50


def losses(path) -> list[float]:
    with open(path / "metrics.csv") as f:
        return [float(row["loss"]) for row in csv.DictReader(f)]


def test_training_with_block_and_tfq_gradients_agree(trained_run, tmp_path, shared_ray):
    """The tutorial's model on 2 workers, MultiWorkerMirroredStrategy on Ray Train, the same seed: the
    same losses, epoch by epoch, with TFQ's gradient as with the block gradient (the session's
    tutorial run, conftest.trained_run)."""
    options = ("--workers", 2, "--epochs", TFQ_EPOCHS, "--differentiator", "tfq", "--storage", tmp_path)
    done = run_command("train", "--config", TUTORIAL, *options, "--name", "tfq", "--address", shared_ray)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert gradients_of(trained_run.path) == [("qcnn", "BlockAdjoint")]
    assert gradients_of(tmp_path / "tfq") != gradients_of(trained_run.path)
    block, tfq_losses = losses(trained_run.path)[:TFQ_EPOCHS], losses(tmp_path / "tfq")
    assert len(block) == len(tfq_losses) == TFQ_EPOCHS
    assert block[-1] < block[0]  # it learns
    np.testing.assert_allclose(block, tfq_losses, atol=1e-3, rtol=0)


SAMPLES = "it samples its expectations (repetitions or a noisy backend); the block method computes them exactly"


@pytest.mark.slow  # a training
def test_every_kind_of_layer_trains_and_the_console_names_its_gradient(tmp_path, shared_ray):
    """A NoisyPQC, a NoisyControlledPQC, a sampled PQC, a bare SampledExpectation and a PQC whose
    differentiator the model sets (tests/layer_kinds.py), trained by the command: each layer's gradient
    is one console line, and recorded. The command joins the cluster as `--address auto` finds it (RAY_ADDRESS)."""
    from examples import regression

    regression.make_data(str(tmp_path / "data"), examples=24, files=1)
    options = ("--model", "tests.layer_kinds:every_kind", "--data", tmp_path / "data", "--epochs", 1, "--workers", 1)
    options += ("--batch-size", 8, "--storage", tmp_path / "runs", "--name", "kinds", "--address", "auto")
    done = run_command("train", *options, env=command_env(RAY_ADDRESS=shared_ray))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = [line for line in done.stdout.splitlines() if line.startswith("quantum gradient of layer")]
    assert sorted(said) == [
        "quantum gradient of layer chosen (PQC): ForwardDifference (chosen by the model)",
        f"quantum gradient of layer noisy (NoisyPQC): ParameterShift ({SAMPLES})",
        f"quantum gradient of layer noisy_controlled (NoisyControlledPQC): ParameterShift ({SAMPLES})",
        f"quantum gradient of layer sampled (PQC): ParameterShift ({SAMPLES})",
        f"quantum gradient of layer sampled_expectation (SampledExpectation): ParameterShift ({SAMPLES})",
    ]
    assert len(gradients_of(tmp_path / "runs" / "kinds")) == len(said)
