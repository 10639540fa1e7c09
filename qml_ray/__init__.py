"""qml_ray: train and serve TensorFlow Quantum models on Ray.

`qml_ray.fit(...)` trains as `python -m qml_ray.train` does, `qml_ray.predict(run, data)`
infers as `python -m qml_ray.infer` does (see qml_ray.api), and `qml_ray.serve(run)` serves as
`python -m qml_ray.serve` does (see qml_ray.serve).
"""

import os

# TFQ layers are tf-keras layers: Keras 2 must be chosen before TensorFlow is imported, whatever the
# shell says (TFQ fails under Keras 3). Ray workers get the same through the job's runtime environment.
os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

__all__ = ["fit", "predict", "serve"]


def __getattr__(name: str):
    """fit, predict and serve, imported when first used (importing qml_ray stays light)."""
    if name == "serve":  # the module, callable
        import importlib

        return importlib.import_module("qml_ray.serve")
    if name in __all__:
        from qml_ray import api

        return getattr(api, name)
    raise AttributeError(f"module 'qml_ray' has no attribute {name!r}")
