"""The model contract: a function that returns a compiled tf.keras model taking serialized circuits.

The config's `model` names it as MODULE:FUNCTION (importable from the working folder or an
installed package); `qml_ray.fit` also takes the function itself. It is called on every worker,
inside the distribution strategy's scope, with keyword arguments: `params`, and for each of its
parameters named like a config key (qubits, layers, learning_rate, seed, ...) that key's value.
The built-in QCNN, `qml_ray.model:qcnn`, is one such function.

The driver checks what it can without importing the function's module (which imports TensorFlow):
that the module exists, defines the function, and takes the params. This module imports no
TensorFlow: the workers build the model by the contract's `arguments`, and check it, in replica.py.
"""

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import re
from collections.abc import Callable
from pathlib import Path

from qml_ray import storage
from qml_ray.config import FIELDS, parse_model
from qml_ray.errors import ModelError, UsageError

NOT_A_NAME = re.compile(r"\W")
PICKLE = "model.pkl"  # in a run folder: the model function, when it was given as a Python callable


@dataclasses.dataclass(frozen=True)
class Signature:
    """The keyword parameters a model function takes, and whether it takes any (**kwargs)."""

    names: tuple[str, ...]
    open_ended: bool


def name_of(function: Callable) -> str:
    """The MODULE:FUNCTION a Python callable is known by (recorded in the run's config; the run
    keeps the callable itself, pickled)."""
    return f"{function.__module__}:{re.sub(NOT_A_NAME, '_', function.__qualname__)}"


def pickled(function: Callable) -> bytes:
    """The callable by value (its code, not a reference to its module), so that the workers and
    later commands need not import the script or notebook that defined it."""
    import sys

    from ray import cloudpickle

    module = sys.modules.get(function.__module__)
    by_value = (
        module is not None and function.__module__ != "__main__" and not function.__module__.startswith("qml_ray")
    )
    if by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(function)
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)


def unpickled(content: bytes) -> Callable:
    from ray import cloudpickle

    return cloudpickle.loads(content)


def record(run: str, function: Callable) -> None:
    """Keep a model function given as a callable in the run folder, for resuming and inference."""
    storage.write_bytes(storage.join(run, PICKLE), pickled(function))


def recorded(run: str) -> Callable | None:
    """The model function a run was given as a callable (None: its config's MODULE:FUNCTION)."""
    path = storage.join(run, PICKLE)
    return unpickled(storage.read_bytes(path)) if storage.exists(path) else None


def signature(model: str | Callable, what: str = "model") -> Signature | None:
    """The parameters of the model function (or another function `what` names), found without
    importing its module (None where its source cannot tell); a UsageError when the module or
    function does not exist."""
    if callable(model):
        return _of_parameters(inspect.signature(model).parameters.values())
    module, function = parse_model(model, what)
    try:
        spec = importlib.util.find_spec(module)
    except Exception as err:  # a parent package failed to import, or is no package
        raise UsageError(f"cannot import {what} module {module!r}: {type(err).__name__}: {err}") from None
    if spec is None:
        raise UsageError(
            f"{what} module {module!r} not found: run from the folder that holds it (or, on a cluster, "
            "submit with --working-dir), or install it"
        )
    if not (spec.origin or "").endswith(".py"):
        return None  # compiled or namespace: the workers find out
    try:
        tree = ast.parse(Path(spec.origin).read_bytes(), spec.origin)
    except SyntaxError as err:
        raise UsageError(f"cannot import {what} module {module!r}: SyntaxError: {err}") from None
    definitions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    if function in definitions:
        arguments = definitions[function].args
        names = [arg.arg for arg in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
        return Signature(tuple(names), arguments.kwarg is not None)
    if function not in _top_level_names(tree):
        raise UsageError(f"{what} module {module!r} ({spec.origin}) has no function {function!r}")
    return None


def _of_parameters(parameters) -> Signature:
    names = tuple(p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
    return Signature(names, any(p.kind == p.VAR_KEYWORD for p in parameters))


def _top_level_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level, other than by `def`."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(target.id for target in targets if isinstance(target, ast.Name))
    return names


def check(config, model: str | Callable | None = None) -> None:
    """In the driver: a UsageError unless the model function exists and takes the config's params,
    and the `callbacks` function, if named, exists."""
    if config.callbacks:
        signature(config.callbacks, "callbacks")
    takes = signature(model or config.model)
    if takes is None:
        _check_names(config.params)
    else:
        arguments(config, takes)


def arguments(config, takes: Signature) -> dict:
    """The keyword arguments for the model function: for each of its parameters named like a config
    key, that key's value, then `params`; a UsageError for a param the function does not take."""
    params = config.params
    _check_names(params)
    unknown = sorted(set(params) - set(takes.names))
    if unknown and not takes.open_ended:
        raise UsageError(
            f"the model function {config.model} takes no parameter {unknown[0]!r} "
            f"(its parameters: {', '.join(takes.names) or 'none'})"
        )
    from_config = {name: getattr(config, name) for name in takes.names if name in FIELDS and name != "params"}
    return {**from_config, **params}


def _check_names(params: dict) -> None:
    clashing = sorted(set(params) & set(FIELDS))
    if clashing:
        raise UsageError(f"param {clashing[0]!r} is a config key: set it with --{clashing[0].replace('_', '-')}")


def resolve(model: str | Callable, what: str = "model") -> Callable:
    """The model function itself, or another function `what` names (imports its module)."""
    if callable(model):
        return model
    module, function = parse_model(model, what)
    try:
        found = getattr(importlib.import_module(module), function, None)
    except Exception as err:  # the user's module: any error it raises on import
        raise ModelError(f"cannot import {what} module {module!r}: {type(err).__name__}: {err}") from None
    if not callable(found):
        raise ModelError(f"{what} module {module!r} has no function {function!r}")
    return found
