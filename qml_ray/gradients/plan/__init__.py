"""A serialized TensorFlow Quantum program as the block kernel runs it: `plan(program, symbol_names)`.

The plan is a pipeline of stages, each a module to read on its own, in this order:

1. `gates`: each gate as factors U(e) = sum_k exp(i pi e h_k) P_k on one or two qubits, e = const + coef *
   symbol; a gate with more controls is masked.
2. `start`: the constant factors that take |0...0> to a product state times diagonal phases, written as
   that state in one pass.
3. `fusion`: the other factors fused into blocks on qubit pairs, one-qubit factors folded into a
   neighbouring block, as qsim fuses its forward pass.
4. `placement`: the qubits placed on bits so that blocks run on the kernel's fast high bits; the qubits
   needed last wait on the low bits, and the state is relabelled when a block needs one of them.
5. `segments`: between relabellings, the blocks put in an order that gathers them into segments, which the
   kernel applies tile by tile (cache blocking).
6. `arrays`: all of it as the arrays of a `Circuit`, which the kernel copies (`kernel.Circuit`).

The last two take a `choice.Choice`: what is left to the CPU (the SIMD path, the tiles, the pass's form, ...),
which `qml_ray.gradients.planner` measures; without one, `choice.default()`.

Beside them, `readouts`: a circuit's Pauli sums as the arrays of `Readouts` (`kernel.Readouts`).
"""

import collections
import functools
import hashlib
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import NamedTuple

from tensorflow_quantum.core.proto import program_pb2

from qml_ray import choices, kernel
from qml_ray.choices import Choice
from qml_ray.gradients.plan import arrays, fusion, gates, placement, readouts, segments, start
from qml_ray.gradients.plan.arrays import Circuit
from qml_ray.gradients.plan.gates import UnsupportedGate
from qml_ray.gradients.plan.readouts import Readouts

__all__ = ["Choice", "Circuit", "Plan", "Readouts", "UnsupportedGate", "canonical", "canonical_plan", "plan"]


@dataclass(frozen=True)
class Plan:
    """A circuit's arrays, the kernel's module (of the choice's path) and its circuit made from them, and the
    bit each of its qubits ends on (for its readouts)."""

    circuit: Circuit
    kernel: ModuleType
    compiled: object  # self.kernel.Circuit
    qubit_index: dict  # serialized qubit id -> its bit at the end of the circuit
    choice: Choice

    def readouts(self, pauli_sums: tuple):
        """The serialized Pauli sums on this circuit's qubits, as the kernel reads them."""
        return readouts.compiled(pauli_sums, tuple(self.qubit_index.items()), self.choice.path)

    def readout_arrays(self, pauli_sums: tuple) -> Readouts:
        """The serialized Pauli sums on this circuit's qubits: the arrays `kernel.Readouts` is made from."""
        return readouts.arrays(pauli_sums, tuple(self.qubit_index.items()))


def plan(program: bytes, symbol_names: tuple, choice: Choice | None = None) -> Plan:
    """The plan of a serialized program, its symbols numbered as in `symbol_names`, made as `choice` says
    (default: `choice.default()`, on the kernel's path, `kernel.use`). Plans are cached by the program's
    deterministic serialization (TFQ's ops serialize argument maps in varying order) and the choice."""
    return canonical_plan(canonical(program), symbol_names, choice)


def canonical_plan(program: bytes, symbol_names: tuple, choice: Choice | None = None) -> Plan:
    """`plan` of a program `canonical` serialized."""
    return _plan(program, symbol_names, choice or choices.default())


CANONICAL_FORMS = 8192  # programs whose canonical form is kept (by digest), as many as plans


def canonical(program: bytes) -> bytes:
    """A serialized program as the same program always serializes: TFQ's ops serialize argument maps in
    varying order. Kept by the program's digest (parsing a 20-qubit program and serializing it again takes a
    third of a millisecond, its digest a twentieth)."""
    digest = hashlib.blake2b(program, digest_size=16).digest()
    with _canonical_lock:
        if digest in _canonical_forms:
            _canonical_forms.move_to_end(digest)
            return _canonical_forms[digest]
    form = program_pb2.Program.FromString(program).SerializeToString(deterministic=True)
    with _canonical_lock:
        _canonical_forms[digest] = form
        if len(_canonical_forms) > CANONICAL_FORMS:
            _canonical_forms.popitem(last=False)
    return form


_canonical_forms: collections.OrderedDict = collections.OrderedDict()  # digest -> canonical form, oldest first
_canonical_lock = threading.Lock()


class _Fused(NamedTuple):
    """A program through the stages that no choice changes."""

    index: dict  # serialized qubit id -> its qubit number
    names: dict  # symbol name -> its number
    start_factors: list
    blocks: list
    qubits: int


@functools.lru_cache(maxsize=8192)
def _fused(program: bytes, symbol_names: tuple) -> _Fused:
    """The stages up to the fusion, the same for every choice."""
    proto = program_pb2.Program.FromString(program)
    ops = [op for moment in proto.circuit.moments for op in moment.operations]
    index = gates.qubit_index(ops)
    factors = gates.factors(ops, index)
    names = _symbol_numbers(factors, symbol_names)
    qubits = max(kernel.MIN_QUBITS, len(index))
    start_factors, rest = start.split(factors, qubits)
    return _Fused(index, names, start_factors, fusion.fuse(rest, qubits), qubits)


@functools.lru_cache(maxsize=8192)
def _placed(program: bytes, symbol_names: tuple, parked: int) -> placement.Placement:
    """The fused program's placement with `parked` low bits, the same for every other field of a choice."""
    fused = _fused(program, symbol_names)
    return placement.place(fused.blocks, fused.qubits, parked)


@functools.lru_cache(maxsize=8192)
def _plan(program: bytes, symbol_names: tuple, choice: Choice) -> Plan:
    """The segments and arrays of a placed program as `choice` has them, for the kernel on its path."""
    f, placed = _fused(program, symbol_names), _placed(program, symbol_names, choice.parked)
    masked = [bool(b.controls) for b in f.blocks]
    scheduled = segments.schedule(placed.bits, placed.relabel, masked, f.qubits, placed.bit_maps, choice.tile_bits)
    circuit = arrays.circuit(f.blocks, placed, scheduled, f.start_factors, f.names, choice)
    module = kernel.compiled(choice.path)
    return Plan(circuit, module, module.Circuit(circuit), {q: placed.final[i] for q, i in f.index.items()}, choice)


def _symbol_numbers(factors: list[gates.Factor], symbol_names: tuple) -> dict[str, int]:
    """Each symbol name -> its number; a ValueError if a factor's symbol is not among them."""
    names = {name: i for i, name in enumerate(symbol_names)}
    missing = {f.symbol for f in factors if f.symbol is not None} - set(names)
    if missing:
        raise ValueError(f"the circuit's symbol(s) {', '.join(sorted(missing))} are not in symbol_names")
    return names
