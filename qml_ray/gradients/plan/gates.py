"""The plan's first stage: a serialized program's gates as factors.

Each gate becomes one or more factors U(e) = sum_k exp(i pi e h_k) P_k on one or two qubits, with the exponent
e = const + coef * symbol (the forms TFQ serializes: a number, or a number times one symbol). A gate on more
than two qubits with its controls is masked: its factors act on two of its qubits where its other controls
hold their values, and become a block of their own (`fusion`).
"""

import functools
from dataclasses import dataclass

import cirq
import numpy as np
import tensorflow_quantum as tfq
from tensorflow_quantum.core.serialize.serializer import EIGEN_GATES_DICT, SERIALIZERS

EIGEN_GATES = {name: gate for gate, name in EIGEN_GATES_DICT.items()}
_CHANNEL_TYPES = {type(channel) for channel in tfq.util.get_supported_channels()}
CHANNELS = {s.serialized_gate_id: s.gate_type.__name__ for s in SERIALIZERS if s.gate_type in _CHANNEL_TYPES}


class UnsupportedGate(ValueError):
    """A gate the block method cannot differentiate."""


@dataclass(frozen=True)
class Factor:
    qubits: tuple  # qubit indices, the first the most significant in `proj`'s basis
    eig: tuple  # h_k: eigen half-turns plus the global shift
    proj: tuple  # P_k
    const: float
    coef: float
    symbol: str | None
    controls: tuple = ()  # ((qubit, value), ...): a masked factor acts only where these qubits hold these values

    @property
    def diagonal(self) -> bool:
        """Whether the factor is diagonal in the computational basis (then it commutes with every other such)."""
        return all(np.count_nonzero(p - np.diag(np.diag(p))) == 0 for p in self.proj)


def qubit_index(ops) -> dict[str, int]:
    """Each qubit the operations act on or are controlled by (its serialized id) -> its index, in cirq's order."""
    ids = {q.id for op in ops for q in op.qubits} | {q for op in ops for q in _controls(op)[0]}
    return {q: i for i, q in enumerate(sorted(ids, key=_qubit_key))}


def factors(ops, index: dict) -> list[Factor]:
    """The factors of the operations, in time order, on the qubits' indices."""
    return [factor for op in ops for factor in _op_factors(op, index)]


def _qubit_key(qubit_id: str) -> tuple:
    return tuple(int(part) for part in qubit_id.split("_"))


def _arg(op, name: str) -> tuple[float, float, str | None]:
    """An argument as (const, coef, symbol), its scalar multiplier applied."""
    value, scalar = op.args[name], op.args[name + "_scalar"].arg_value.float_value
    if value.symbol:
        return 0.0, scalar, value.symbol
    return value.arg_value.float_value * scalar, 0.0, None


def _scaled(param: tuple, by: float) -> tuple:
    const, coef, symbol = param
    return const * by, coef * by, symbol


@functools.cache
def _eigen(gate_type, global_shift: float = 0.0) -> tuple[tuple, tuple]:
    components = gate_type(exponent=1.0, global_shift=global_shift)._eigen_components()
    return tuple(h + global_shift for h, _ in components), tuple(np.asarray(p) for _, p in components)


def _controls(op) -> tuple[list[str], list[int]]:
    qubits = op.args["control_qubits"].arg_value.string_value if "control_qubits" in op.args else ""
    values = op.args["control_values"].arg_value.string_value if "control_values" in op.args else ""
    return [q for q in qubits.split(",") if q], [int(v) for v in values.split(",") if v]


def _gate_factors(op) -> list[tuple[tuple[int, ...], tuple, tuple, tuple]]:
    """The gate's factors in time order: (positions among its targets, eig, proj, (const, coef, symbol))."""
    gate = op.gate.id
    if gate in EIGEN_GATES:
        shift = op.args["global_shift"].arg_value.float_value
        return [(tuple(range(len(op.qubits))), *_eigen(EIGEN_GATES[gate], shift), _arg(op, "exponent"))]
    if gate == "PXP":  # Z^-p, X^t (with the global shift), Z^p
        phase, shift = _arg(op, "phase_exponent"), op.args["global_shift"].arg_value.float_value
        return [
            ((0,), *_eigen(cirq.ZPowGate), _scaled(phase, -1)),
            ((0,), *_eigen(cirq.XPowGate, shift), _arg(op, "exponent")),
            ((0,), *_eigen(cirq.ZPowGate), phase),
        ]
    if gate == "PISP":  # Z^p (x) Z^-p, ISWAP^t (with the global shift), Z^-p (x) Z^p
        phase, shift = _arg(op, "phase_exponent"), op.args["global_shift"].arg_value.float_value
        z = _eigen(cirq.ZPowGate)
        return [
            ((0,), *z, phase),
            ((1,), *z, _scaled(phase, -1)),
            ((0, 1), *_eigen(cirq.ISwapPowGate, shift), _arg(op, "exponent")),
            ((0,), *z, _scaled(phase, -1)),
            ((1,), *z, phase),
        ]
    if gate == "FSIM":  # ISWAP^(-2 theta / pi), then CZ^(-phi / pi): they commute
        return [
            ((0, 1), *_eigen(cirq.ISwapPowGate), _scaled(_arg(op, "theta"), -2 / np.pi)),
            ((0, 1), *_eigen(cirq.CZPowGate), _scaled(_arg(op, "phi"), -1 / np.pi)),
        ]
    if gate == "I":
        return []
    if gate in CHANNELS:
        raise UnsupportedGate(
            f"the block differentiator cannot differentiate noise channel {CHANNELS[gate]}: it simulates pure "
            f"states, as TFQ's Adjoint does; a noisy circuit takes tfq.layers.NoisyPQC (or SampledExpectation) "
            f"with a sampled differentiator such as tfq.differentiators.ParameterShift"
        )
    raise UnsupportedGate(
        f"the block differentiator cannot differentiate gate {_gate_name(op)}: use the tfq differentiator"
    )


def _gate_name(op) -> str:
    """The cirq name of a serialized gate where there is one (CNotPowGate for CNP), else TFQ's id."""
    return EIGEN_GATES[op.gate.id].__name__ if op.gate.id in EIGEN_GATES else repr(op.gate.id)


def _op_factors(op, index: dict) -> list[Factor]:
    """The gate's factors. A one-qubit gate takes its first control into its projectors; a gate with more
    qubits than two in all is masked by its other controls, each of its factors on the same pair."""
    targets = tuple(index[q.id] for q in op.qubits)
    controls = tuple((index[q], v) for q, v in zip(*_controls(op)))
    folded, mask = (controls[:1], controls[1:]) if len(targets) == 1 else ((), controls)
    made = []
    for positions, eig, proj, (const, coef, symbol) in _gate_factors(op):
        qubits = tuple(targets[p] for p in positions)
        if mask and len(qubits) < len(targets):  # a one-qubit factor of a masked two-qubit gate: on its pair
            proj, qubits = tuple(on_pair(p, positions[0]) for p in proj), targets
        if folded:  # |v><v| (x) U(e) + |not v><not v| (x) I, the control the more significant
            ((control, value),) = folded
            on = np.diag([1.0 - value, float(value)])
            eig, proj = (*eig, 0.0), (*(np.kron(on, p) for p in proj), np.kron(np.eye(2) - on, np.eye(2)))
            qubits = (control, *qubits)
        made.append(Factor(qubits, eig, proj, const, coef, symbol, mask))
    return made


def on_pair(proj: np.ndarray, position: int) -> np.ndarray:
    """A one-qubit projector on position 0 (the more significant) or 1 of a pair: kron(proj, I) or kron(I, proj),
    written in place (a plan makes hundreds, and np.kron took half of its time)."""
    pair = np.zeros((4, 4), np.result_type(proj, np.float64))
    for k in (0, 1):
        rows = slice(k, None, 2) if position == 0 else slice(2 * k, 2 * k + 2)
        pair[rows, rows] = proj
    return pair
