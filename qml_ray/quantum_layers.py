"""The TensorFlow Quantum layers of a model: their circuits, their qubits, and the quantum gradient
each gets from the config's `differentiator`.

A TFQ expectation layer binds its differentiator into its op when it is made
(`Differentiator.generate_differentiable_op` closes over it); `gradients` reads it back from that
closure and, where the rule says so, binds a BlockAdjoint to the same op instead:

- auto: a layer on TFQ's Adjoint gets BlockAdjoint. A differentiator the model chose (parameter
  shift, finite differences, BlockAdjoint itself) is kept, and so is a sampled layer (repetitions,
  a noisy backend) and one simulated by a backend of its own. A layer whose circuit the block
  method cannot take (a noise channel) keeps TFQ's gradient, with a warning.
- block: every layer gets BlockAdjoint, or a ModelError names the first that cannot take it.
- tfq: the model is left as built.

PQC, ControlledPQC and their noisy twins hold their circuit, which is checked here; a bare
Expectation layer's circuits arrive when it is called, and it gets BlockAdjoint on the grounds
that TFQ's analytic op, like the block method, takes no noise channel.
"""

import dataclasses
import inspect

import tensorflow_quantum as tfq
from tensorflow_quantum.python.layers.circuit_executors import expectation, sampled_expectation
from tensorflow_quantum.python.layers.high_level import controlled_pqc, noisy_controlled_pqc, noisy_pqc, pqc

from qml_ray import (
    keras_seeds,  # noqa: F401  (before the contract runs a model function that seeds tf-keras)
    tfq_autograph,  # noqa: F401  (before it builds one: TFQ's code left unconverted)
)
from qml_ray.errors import ModelError
from qml_ray.gradients import BlockAdjoint, UnsupportedGate
from qml_ray.gradients.plan import plan

# Layers that hold their circuit: the attribute of the executor (an Expectation-like layer, or the op
# itself), and of the circuit.
HOLDERS = {
    pqc.PQC: ("_executor", "_model_circuit"),
    controlled_pqc.ControlledPQC: ("_layer", "_circuit"),
    noisy_pqc.NoisyPQC: ("_executor", "_model_circuit"),
    noisy_controlled_pqc.NoisyControlledPQC: ("_executor", "_circuit"),
}
EXECUTORS = (expectation.Expectation, sampled_expectation.SampledExpectation)
OP = "_expectation_op"  # an executor layer's attribute holding its differentiable op
TFQ_OP = tfq.get_expectation_op().__code__  # the code of TFQ's own analytic op (a new closure per call)
BLOCK = "block"


@dataclasses.dataclass
class Site:
    """One expectation op of a model: the layer it serves, where the op is kept, and the circuit."""

    layer: object  # the Keras layer: PQC, Expectation, ...
    holder: object  # the object whose attribute `attribute` is the op
    attribute: str
    circuit: object = None  # a [1] tensor of the serialized circuit, or None: the circuits come at call time
    symbols: object = None

    @property
    def op(self):
        return getattr(self.holder, self.attribute)

    def bound(self) -> tuple:
        """(differentiator, the op it differentiates, whether sampled) of this op's closure."""
        wrapper = inspect.unwrap(self.op)
        cells = dict(zip(wrapper.__code__.co_freevars, (cell.cell_contents for cell in wrapper.__closure__)))
        sampled = "sampled_op" in cells
        return cells["self"], cells["sampled_op" if sampled else "analytic_op"], sampled

    def unsupported(self) -> str | None:
        """Why the block method cannot take this layer's circuit, or None (also when it comes at call time)."""
        if self.circuit is None:
            return None
        names = tuple(name.decode() for name in self.symbols.numpy())
        try:
            plan(self.circuit.numpy()[0], names)
        except UnsupportedGate as err:
            return str(err)
        return None


@dataclasses.dataclass(frozen=True)
class Gradient:
    """The quantum gradient a layer got, and why (a `warning` when it keeps TFQ's against the config)."""

    layer: str
    kind: str
    gradient: str
    why: str
    warning: bool = False

    def line(self) -> str:
        """What the console says of it."""
        if self.warning:
            return f"warning: layer {self.layer} ({self.kind}) keeps TFQ's {self.gradient}: {self.why}"
        return f"quantum gradient of layer {self.layer} ({self.kind}): {self.gradient} ({self.why})"


def sites(model) -> list[Site]:
    """Every TFQ expectation op of `model`, in the order of its layers (nested models' too)."""
    found, held = [], set()
    modules = [model, *model.submodules]
    for layer in modules:
        if attributes := next((names for kind, names in HOLDERS.items() if isinstance(layer, kind)), None):
            executor, circuit = attributes
            inner = getattr(layer, executor)
            holder, attribute = (inner, OP) if isinstance(inner, EXECUTORS) else (layer, executor)
            held.add(id(inner))
            found.append(Site(layer, holder, attribute, getattr(layer, circuit), layer._symbols))
    found += [Site(layer, layer, OP) for layer in modules if isinstance(layer, EXECUTORS) and id(layer) not in held]
    return found


def qubits(model, circuits=()) -> set:
    """The qubits the model simulates: those of the circuits its layers hold (a PQC's, a ControlledPQC's,
    programs a layer keeps to tile over the batch) and of `circuits` (serialized, e.g. a data set's
    first row's), together."""
    serialized = [site.circuit.numpy()[0] for site in sites(model) if site.circuit is not None]
    found = [*tfq.from_tensor([*serialized, *circuits]), *kept_programs(model)]
    return {qubit for circuit in found for qubit in circuit.all_qubits()}


def kept_programs(model) -> list:
    """The circuits of serialized programs (string tensors) the model's layers keep as attributes,
    as a layer does that tiles a program over the batch for a bare Expectation or ControlledPQC."""
    import cirq
    import tensorflow as tf

    tensors = [
        value
        for layer in [model, *model.submodules]
        for value in vars(layer).values()
        if isinstance(value, tf.Tensor | tf.Variable) and value.dtype == tf.string
    ]
    found = []
    for tensor in tensors:
        try:
            found += tfq.from_tensor(tf.reshape(tensor, [-1]))
        except Exception:  # TFQ fails on strings that are no programs in many ways: not a program, then
            continue
    return [circuit for circuit in found if isinstance(circuit, cirq.Circuit)]


def gradients(model, differentiator: str) -> list[Gradient]:
    """Give each expectation op of `model` its quantum gradient by the rule `differentiator` (auto, block,
    tfq) names; what each got. A ModelError when `block` cannot be had for one."""
    return [_assign(site, differentiator) for site in sites(model)]


def _assign(site: Site, differentiator: str) -> Gradient:
    chosen, op, sampled = site.bound()
    name, kind = site.layer.name, type(site.layer).__name__

    def kept(why: str, warning: bool = False) -> Gradient:
        return Gradient(name, kind, type(chosen).__name__, why, warning)

    if differentiator == "tfq":
        return kept("as the model built it")
    if isinstance(chosen, BlockAdjoint):
        return kept("chosen by the model")
    problem = site.unsupported()
    obstacle = problem or _obstacle(chosen, op, sampled)
    if differentiator == BLOCK and obstacle:
        raise ModelError(f"differentiator block: layer {name} ({kind}) cannot take the block gradient: {obstacle}")
    if problem:
        return kept(problem, warning=True)
    if differentiator == BLOCK or type(chosen) is tfq.differentiators.Adjoint:
        setattr(site.holder, site.attribute, BlockAdjoint().generate_differentiable_op(analytic_op=op))
        return Gradient(
            name, kind, BlockAdjoint.__name__, f"differentiator {differentiator}, for {type(chosen).__name__}"
        )
    return kept(obstacle or "chosen by the model")


def _obstacle(chosen, op, sampled: bool) -> str | None:
    """Why a layer's op cannot take the block gradient whatever its circuits, or None."""
    if sampled:
        return "it samples its expectations (repetitions or a noisy backend); the block method computes them exactly"
    if op.__code__ is not TFQ_OP:
        return "it is simulated by a backend of its own"
    return None
