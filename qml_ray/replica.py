"""A model replica, as every worker builds it (and `infer`, and the benchmark): the model function called
with the contract's arguments (contract.py), checked to be a compiled tf.keras model, and the quantum
gradient each of its TFQ layers got. Imports TensorFlow and TFQ: the driver checks the contract without it.
"""

from collections.abc import Callable

import tensorflow as tf

from qml_ray import contract, quantum_layers
from qml_ray.errors import ModelError, UsageError


def build(config, model: str | Callable | None = None):
    """The compiled model, from `model` (default: the config's), with its quantum gradients as the
    config's `differentiator` says; call inside the strategy's scope."""
    return build_with_gradients(config, model)[0]


def build_with_gradients(config, model: str | Callable | None = None) -> tuple:
    """`build`'s model, and the quantum gradient each of its TFQ layers got (quantum_layers.Gradient)."""
    function = contract.resolve(model or config.model)
    takes = contract.signature(function)
    try:
        built = function(**contract.arguments(config, takes))
    except UsageError:
        raise
    except Exception as err:
        raise ModelError(f"the model function {config.model} failed: {type(err).__name__}: {err}") from None
    if not isinstance(built, tf.keras.Model):
        raise ModelError(
            f"the model function {config.model} returned {type(built).__name__}, not a tf.keras model "
            "(it must return a compiled tf.keras.Model)"
        )
    if built.optimizer is None or not built._is_compiled:
        raise ModelError(f"the model function {config.model} returned a model that is not compiled: call compile()")
    return built, quantum_layers.gradients(built, config.differentiator)
