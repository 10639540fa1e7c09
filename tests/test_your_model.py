"""A model function of the caller's own, trained with qml_ray.fit and inferred with qml_ray.predict.
A user's module and data trained, stopped, resumed and inferred as jobs, and swept: test_multinode;
the classifier example trained through lost nodes: test_preemption."""

import json
import os
from pathlib import Path

import cirq
import pyarrow.parquet as pq
import pytest
import tensorflow_quantum as tfq

from qml_ray import storage

from conftest import ROWS_PER_FILE


def gradients_of(run: Path) -> list[tuple[str, str]]:
    """(layer, gradient) of each TFQ layer, as the run recorded them."""
    return [
        (layer["layer"], layer["gradient"]) for layer in json.loads((run / storage.GRADIENTS).read_text())["layers"]
    ]


@pytest.mark.slow  # a training
def test_fit_takes_a_function_defined_by_the_caller(user_project, tmp_path, shared_ray):
    """qml_ray.fit trains a model function of the caller's, and qml_ray.predict infers with its weights; both
    leave the caller's environment variables and working folder as they found them."""
    project = user_project
    import qml_ray

    def tiny(learning_rate=0.1):
        import sympy
        import tensorflow as tf

        qubit = cirq.GridQubit(0, 0)
        circuits = tf.keras.Input(shape=(), dtype=tf.string)
        readout = tfq.layers.PQC(cirq.Circuit(cirq.ry(sympy.Symbol("v"))(qubit)), cirq.Z(qubit))(circuits)
        model = tf.keras.Model(circuits, tf.keras.layers.Dense(1)(readout))
        model.compile(tf.keras.optimizers.Adam(learning_rate), loss="mse", metrics=["mae"])
        return model

    import ray

    found = dict(os.environ), os.getcwd()
    try:
        trained = qml_ray.fit(
            model=tiny,
            data=str(project / "data"),
            workers=1,
            epochs=2,
            storage=str(tmp_path),
            name="fitted",
            address=shared_ray,
        )
        assert trained.run == str(tmp_path / "fitted")
        assert {"loss", "mae", "val_loss", "val_mae"} <= set(trained.metrics)
        assert (dict(os.environ), os.getcwd()) == found, "qml_ray.fit changed the caller's environment or folder"
        out = qml_ray.predict(trained.run, str(project / "data" / "part-000.parquet"))
        assert (dict(os.environ), os.getcwd()) == found, "qml_ray.predict changed the caller's environment or folder"
    finally:
        ray.shutdown()
    predicted = pq.read_table(out).to_pandas()
    assert list(predicted["id"]) == list(range(ROWS_PER_FILE))
    assert storage.is_complete(out)
