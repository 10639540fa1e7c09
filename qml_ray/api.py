"""qml_ray's Python API: train and infer from a script or a notebook, as the commands do.

    import qml_ray

    trained = qml_ray.fit(model=my_model, data="circuits.parquet", workers=2, epochs=20, name="mine")
    predictions = qml_ray.predict(trained.run, "new-circuits.parquet")

`fit` takes every config key as a keyword argument (see `python -m qml_ray.train --help`),
`model` as MODULE:FUNCTION or the function itself (one defined in the calling script or notebook
too), and returns the run folder and the final epoch's metrics. Mistakes raise
qml_ray.errors.UsageError before anything is written; a training that fails for good raises
qml_ray.train.TrainingFailed, its checkpoints kept for `resume=True`. Both leave the caller's
environment variables and working folder as they found them.
"""

from collections.abc import Callable

from qml_ray import config as config_lib, infer, runtime, train
from qml_ray.train import Trained

__all__ = ["Trained", "fit", "predict"]


def fit(
    config: str | None = None,
    *,
    model: str | Callable | None = None,
    name: str | None = None,
    resume: bool = False,
    address: str | None = None,
    verbose: bool = False,
    **keys,
) -> Trained:
    """Train as `python -m qml_ray.train` does: `config` a YAML file (default: the built-in
    defaults), `keys` config keys over it (params=... a dict), `model` a MODULE:FUNCTION or a
    callable; on the Ray this process has joined, else as `address` says."""
    base = config_lib.given(config_lib.load(config)) if config else {}
    if isinstance(model, str):
        keys["model"] = model
    resolved = config_lib.from_mapping({**base, **keys})
    with runtime.process_as_found():
        return train.train(resolved, name, resume, address, verbose, model if callable(model) else None)


def predict(
    run: str,
    data: str | None = None,
    *,
    actors: int = 1,
    batch_size: int = 64,
    address: str | None = None,
    verbose: bool = False,
) -> str:
    """Infer as `python -m qml_ray.infer` does; return the predictions folder."""
    with runtime.process_as_found():
        return infer.infer(run, data, actors, batch_size, address, verbose)
