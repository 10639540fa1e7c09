"""TensorFlow Quantum programs as the block kernel runs them.

Each gate of a serialized program becomes one or more factors U(e) = sum_k exp(i pi e h_k) P_k on one or two
qubits, with the exponent e = const + coef * symbol (the forms TFQ serializes: a number, or a number times one
symbol). A gate on more than two qubits with its controls is masked: its factors act on two of its qubits
where its other controls hold their values, a block of its own. The circuit's start, the constant factors that
take |0...0> to a product state times diagonal phases (a data encoding's Hadamards and CZs, say), is written
as that state in one pass (`Circuit`'s start_* arrays). The other factors are fused into blocks on qubit
pairs, one-qubit factors folded into a neighbouring block, as qsim fuses its forward pass. Qubits are then
placed on bits so that blocks run on the kernel's fast high bits: the qubits needed last wait on the low bits,
and the state is relabelled when a block needs one of them (Belady's rule). Between relabellings the blocks
are put in an order that gathers them into segments: runs of blocks that leave the same window of bits
untouched, which the kernel applies tile by tile (cache blocking).
"""

import functools
from dataclasses import dataclass
from typing import NamedTuple

import cirq
import numpy as np
import tensorflow_quantum as tfq
from tensorflow_quantum.core.proto import pauli_sum_pb2, program_pb2
from tensorflow_quantum.core.serialize.serializer import EIGEN_GATES_DICT, SERIALIZERS

from qml_ray import kernel

EIGEN_GATES = {name: gate for gate, name in EIGEN_GATES_DICT.items()}
_CHANNEL_TYPES = {type(channel) for channel in tfq.util.get_supported_channels()}
CHANNELS = {s.serialized_gate_id: s.gate_type.__name__ for s in SERIALIZERS if s.gate_type in _CHANNEL_TYPES}
SWAP = np.eye(4)[[0, 2, 1, 3]]
# A segment's tile: 2^16 amplitudes, 512 KiB (both planes), so it stays in a core's L2 cache while every
# block of the segment passes over it: a segment costs one pass over memory instead of one per block.
# A tile is the amplitudes with the same bits in the segment's window: qubits - TILE_BITS bits that no
# block of the segment touches, from bit w, LOWEST_WINDOW <= w <= TILE_BITS. The tile is then runs of
# 2^w amplitudes or more (w = TILE_BITS: one run); from 2^10 (4 KiB, a page, per plane), since shorter
# runs were slower at 20 qubits (BENCHMARKS section 4). (TILE_BITS at least kernel.CHUNK_BITS + 2 and
# LOWEST_WINDOW at least kernel.CHUNK_BITS: a tile's runs then hold whole chunks of every pass.)
TILE_BITS = 16
LOWEST_WINDOW = 10


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


class Circuit(NamedTuple):
    """One circuit's fused blocks and factors: the arrays `kernel.Circuit` is made from."""

    qubits: int
    block_qubits: np.ndarray  # [blocks, 2] int64: the bits (hi, lo) the block acts on
    block_mask: np.ndarray  # [blocks] int64: the block's control bits (0: unmasked), it acts only where
    block_mask_value: np.ndarray  # [blocks] int64: ... the state's bits & block_mask equal this
    relabel: np.ndarray  # [blocks] int64: row of bit_maps applied to the state before the block, or -1
    bit_maps: np.ndarray  # [relabellings, qubits] int64: bit q of every index moves to bit bit_maps[r, q] (swaps)
    segments: np.ndarray  # [segments + 1] int64: segment s holds blocks segments[s]:segments[s + 1] (see _schedule)
    windows: np.ndarray  # [segments] int64: the first bit of segment s's window (-1 for a segment of one block)
    tile_bits: int  # a segment of several blocks is applied to tiles of 2^tile_bits amplitudes, one after another
    block_start: np.ndarray  # [blocks + 1] int64: block b holds factors block_start[b]:block_start[b + 1]
    kind: np.ndarray  # [factors] int64: row of kind_eig / kind_proj
    symbol: np.ndarray  # [factors] int64: index into the symbol names, -1 for a constant
    coef: np.ndarray  # [factors] float64
    const: np.ndarray  # [factors] float64
    kind_eig: np.ndarray  # [kinds, 4] float64
    kind_proj: np.ndarray  # [kinds, 4, 4, 4] complex128: projectors in the block's basis
    start_amplitudes: np.ndarray  # [qubits, 2] complex128: per bit, its qubit after the start's one-qubit factors
    start_phase_bits: np.ndarray  # [phases, 2] int64: the bits (hi, lo) of the start's two-qubit diagonals
    start_phases: np.ndarray  # [phases, 4] complex128: its diagonal, indexed 2 * bit(hi) + bit(lo)
    start_linked: np.ndarray  # [low] bool: bits below low = min(kernel.START_BITS, qubits) in a phase with one above
    start_table: np.ndarray  # [2, 2^low] float32: the start on the bits below low, but for the linked bits' amplitudes


class Readouts(NamedTuple):
    """A circuit's readouts, the arrays `kernel.Readouts` is made from: term t adds coef[t] times a Pauli
    string to readout op[t]."""

    op: np.ndarray  # [terms] int64
    coef: np.ndarray  # [terms] float64
    flip: np.ndarray  # [terms] int64: the bits with X or Y
    signs: np.ndarray  # [terms] int64: the bits with Y or Z
    y_count: np.ndarray  # [terms] int64


@dataclass(frozen=True)
class Plan:
    """A circuit's arrays, the kernel's circuit made from them, and the bit each of its qubits ends on (for
    its readouts)."""

    circuit: Circuit
    compiled: kernel.Circuit
    qubit_index: dict  # serialized qubit id -> its bit at the end of the circuit

    def readouts(self, pauli_sums: tuple) -> kernel.Readouts:
        """The serialized Pauli sums on this circuit's qubits, as the kernel reads them."""
        return _compiled_readouts(pauli_sums, tuple(self.qubit_index.items()))

    def readout_arrays(self, pauli_sums: tuple) -> Readouts:
        """The serialized Pauli sums on this circuit's qubits: the arrays `kernel.Readouts` is made from."""
        return _readouts(pauli_sums, tuple(self.qubit_index.items()))


def plan(program: bytes, symbol_names: tuple) -> Plan:
    """The plan of a serialized program, its symbols numbered as in `symbol_names`. Plans are cached by
    the program's deterministic serialization: TFQ's ops serialize argument maps in varying order."""
    return _plan(program_pb2.Program.FromString(program).SerializeToString(deterministic=True), symbol_names)


@functools.lru_cache(maxsize=8192)
def _plan(program: bytes, symbol_names: tuple) -> Plan:
    proto = program_pb2.Program.FromString(program)
    ops = [op for moment in proto.circuit.moments for op in moment.operations]
    ids = sorted({q.id for op in ops for q in op.qubits} | {q for op in ops for q in _controls(op)[0]}, key=_qubit_key)
    index = {q: i for i, q in enumerate(ids)}
    factors = [factor for op in ops for factor in _op_factors(op, index)]
    names = {name: i for i, name in enumerate(symbol_names)}
    missing = {f.symbol for f in factors if f.symbol is not None} - set(names)
    if missing:
        raise ValueError(f"the circuit's symbol(s) {', '.join(sorted(missing))} are not in symbol_names")
    qubits = max(kernel.MIN_QUBITS, len(ids))
    start, rest = _split_start(factors, qubits)
    return _to_arrays(_fuse(rest, qubits), start, qubits, names, index)


@functools.lru_cache(maxsize=8192)
def _readouts(pauli_sums: tuple, qubit_index: tuple) -> Readouts:
    terms = [(op, *term) for op, pauli_sum in enumerate(pauli_sums) for term in _terms(pauli_sum, dict(qubit_index))]
    columns = list(zip(*terms)) if terms else [()] * len(Readouts._fields)
    dtypes = (np.int64, np.float64, np.int64, np.int64, np.int64)
    return Readouts(*(np.array(column, dtype) for column, dtype in zip(columns, dtypes)))


@functools.lru_cache(maxsize=8192)
def _compiled_readouts(pauli_sums: tuple, qubit_index: tuple) -> kernel.Readouts:
    return kernel.Readouts(_readouts(pauli_sums, qubit_index))


def _terms(pauli_sum: bytes, index: dict) -> list[tuple[float, int, int, int]]:
    """(coefficient, flip mask, sign mask, Y count) of each term of a serialized Pauli sum."""
    terms = []
    for term in pauli_sum_pb2.PauliSum.FromString(pauli_sum).terms:
        flip = signs = y_count = 0
        for pauli in term.paulis:
            if pauli.qubit_id not in index:
                raise ValueError(f"a readout acts on qubit {pauli.qubit_id}, which the circuit does not use")
            bit = 1 << index[pauli.qubit_id]
            flip |= bit if pauli.pauli_type in "XY" else 0
            signs |= bit if pauli.pauli_type in "YZ" else 0
            y_count += pauli.pauli_type == "Y"
        terms.append((term.coefficient_real, flip, signs, y_count))
    return terms


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
    factors = []
    for positions, eig, proj, (const, coef, symbol) in _gate_factors(op):
        qubits = tuple(targets[p] for p in positions)
        if mask and len(qubits) < len(targets):  # a one-qubit factor of a masked two-qubit gate: on its pair
            proj, qubits = tuple(_on_pair(p, positions[0]) for p in proj), targets
        if folded:  # |v><v| (x) U(e) + |not v><not v| (x) I, the control the more significant
            ((control, value),) = folded
            on = np.diag([1.0 - value, float(value)])
            eig, proj = (*eig, 0.0), (*(np.kron(on, p) for p in proj), np.kron(np.eye(2) - on, np.eye(2)))
            qubits = (control, *qubits)
        factors.append(Factor(qubits, eig, proj, const, coef, symbol, mask))
    return factors


def _on_pair(proj: np.ndarray, position: int) -> np.ndarray:
    """A one-qubit projector on position 0 (the more significant) or 1 of a pair."""
    return np.kron(proj, np.eye(2)) if position == 0 else np.kron(np.eye(2), proj)


def _split_start(factors: list[Factor], qubits: int) -> tuple[list[Factor], list[Factor]]:
    """The circuit's start and the factors after it. The start holds, per qubit, the constant one-qubit
    factors before anything else acts on it, then constant diagonal factors: they take |0...0> to a
    product state times a diagonal. A constant diagonal factor joins even after a diagonal factor with a
    symbol, since diagonal factors commute; any other factor on a qubit ends its start. A masked factor never
    joins, and is diagonal on its controls."""
    product, diagonal, ended = range(3)
    phase = [product] * qubits
    start, rest = [], []
    for factor in factors:
        constant, on = factor.symbol is None, factor.qubits
        if factor.controls:
            joins = False
            for q in on:
                phase[q] = max(phase[q], diagonal) if factor.diagonal else ended
            for q, _ in factor.controls:
                phase[q] = max(phase[q], diagonal)
        elif len(on) == 1 and phase[on[0]] == product:
            joins = constant
            if not joins:
                phase[on[0]] = diagonal if factor.diagonal else ended
        elif factor.diagonal:
            joins = constant and all(phase[q] != ended for q in on)
            for q in on:
                phase[q] = max(phase[q], diagonal)
        else:
            joins = False
            for q in on:
                phase[q] = ended
        (start if joins else rest).append(factor)
    return start, rest


def _matrix(factor: Factor) -> np.ndarray:
    """A constant factor's unitary, sum_k exp(i pi e h_k) P_k."""
    return sum(np.exp(1j * np.pi * factor.const * h) * p for h, p in zip(factor.eig, factor.proj))


def _start_arrays(start: list[Factor], bit: list[int]) -> dict:
    """The start as the Circuit's start_* arrays, qubit q on bit bit[q]. The kernel writes the state in chunks
    of 2^low amplitudes, each the same table over the bits below low times what the bits above give: a
    constant, and for each linked bit (in a diagonal factor with a bit above) two values."""
    amplitudes = np.zeros((len(bit), 2), np.complex128)
    amplitudes[:, 0] = 1
    phase_bits, phases = [], []
    for factor in start:
        if len(factor.qubits) == 1:  # the product's one-qubit factors, then one-qubit diagonals (they commute)
            q = bit[factor.qubits[0]]
            amplitudes[q] = _matrix(factor) @ amplitudes[q]
        else:
            phase_bits.append([bit[q] for q in factor.qubits])
            phases.append(np.diag(_matrix(factor)))
    low = min(kernel.START_BITS, len(bit))
    linked = np.zeros(low, np.bool_)
    for pair in phase_bits:
        if min(pair) < low <= max(pair):
            linked[min(pair)] = True
    j = np.arange(1 << low)
    table = np.ones(1 << low, np.complex128)
    for b in np.flatnonzero(~linked):
        table *= amplitudes[b, (j >> b) & 1]
    for (hi, lo), diagonal in zip(phase_bits, phases):
        if max(hi, lo) < low:
            table *= diagonal[2 * ((j >> hi) & 1) + ((j >> lo) & 1)]
    return {
        "start_amplitudes": amplitudes,
        "start_phase_bits": np.array(phase_bits, np.int64).reshape(-1, 2),
        "start_phases": np.array(phases, np.complex128).reshape(-1, 4),
        "start_linked": linked,
        "start_table": np.stack([table.real, table.imag]).astype(np.float32),
    }


@dataclass
class Block:
    """Fused factors on a qubit pair (pair[0] the more significant in their basis); a masked block (of one
    masked gate) acts only where its controls hold their values."""

    pair: tuple[int, int]
    factors: list[Factor]
    controls: tuple = ()  # ((qubit, value), ...)

    @property
    def qubits(self) -> tuple[int, ...]:
        return (*self.pair, *(q for q, _ in self.controls))


def _fuse(factors: list[Factor], qubits: int) -> list[Block]:
    """Greedy fusion. A non-diagonal two-qubit factor joins the block its qubits last met in if that
    block is on the same pair, else opens a block, taking with it the factors waiting on its qubits.
    Other factors wait: one-qubit ones for their qubit's next block; diagonal two-qubit ones (CZ, ZZ)
    commute with each other, so each waits for the next block on its own pair, and opens a block of
    its own only when a factor that does not commute with it must come first. A masked factor first
    places the factors waiting on its pair and controls, then opens a block of its own (or joins the
    previous factor's of the same gate). What still waits at the end opens or joins blocks the same way."""
    blocks: list[Block] = []
    last: dict[int, int] = {}
    waiting: dict[int, dict[int, Factor]] = {q: {} for q in range(qubits)}  # per qubit: time -> factor

    def join(pair: tuple[int, int], controls: tuple, members: list[Factor]) -> None:
        """Adds the factors to the block their qubits last met in if it is on the same pair with the same
        controls, else to a new block."""
        block = Block(pair, [], controls)
        target = last.get(pair[0])
        if (
            target is None
            or any(last.get(q) != target for q in block.qubits)
            or set(blocks[target].pair) != set(pair)
            or blocks[target].controls != controls
        ):
            blocks.append(block)
            target = len(blocks) - 1
        blocks[target].factors.extend(members)
        for q in block.qubits:
            last[q] = target

    def place(time: int, factor: Factor) -> None:
        a, b = factor.qubits
        for q in (a, b):
            waiting[q].pop(time, None)
        earlier = {t: f for q in (a, b) for t, f in waiting[q].items() if t < time}
        # waiting factors on another pair go first if they must precede a non-diagonal member
        must_precede = (
            time if not factor.diagonal else max((t for t, f in earlier.items() if not f.diagonal), default=-1)
        )
        for t in sorted(earlier):
            other_pair = len(earlier[t].qubits) == 2 and set(earlier[t].qubits) != {a, b}
            if other_pair and t < must_precede and t in waiting[earlier[t].qubits[0]]:
                place(t, earlier[t])
        members = {
            t: f
            for q in (a, b)
            for t, f in waiting[q].items()
            if t < time and (len(f.qubits) == 1 or set(f.qubits) == {a, b})
        }
        for t, f in members.items():
            for q in f.qubits:
                waiting[q].pop(t)
        join((a, b), (), [members[t] for t in sorted(members)] + [factor])

    def settle(on: tuple, before: int) -> None:
        """Places the factors waiting on the qubits `on` from before time `before`: the two-qubit ones, then
        each qubit's one-qubit ones into the block it last met in, or if there is none or it is masked, into
        new blocks, two qubits' to a block."""
        for q in on:
            for t in sorted(t for t, f in waiting[q].items() if t < before and len(f.qubits) == 2):
                if t in waiting[q]:
                    place(t, waiting[q][t])
        homeless = []
        for q in on:
            rest = [waiting[q].pop(t) for t in sorted(t for t in waiting[q] if t < before)]
            if rest and q in last and not blocks[last[q]].controls:
                blocks[last[q]].factors.extend(rest)
            elif rest:
                homeless.append((q, rest))
        for k in range(0, len(homeless), 2):
            both = homeless[k : k + 2]
            pair = (both[0][0], both[1][0] if len(both) == 2 else (both[0][0] + 1) % qubits)
            blocks.append(Block(pair, [f for _, rest in both for f in rest]))
            for q, _ in both:
                last[q] = len(blocks) - 1

    for time, factor in enumerate(factors):
        if factor.controls:
            settle((*factor.qubits, *(q for q, _ in factor.controls)), time)
            join(factor.qubits, factor.controls, [factor])
        elif len(factor.qubits) == 2 and not factor.diagonal:
            place(time, factor)
        else:
            for q in factor.qubits:
                waiting[q][time] = factor
    for time, factor in sorted({t: f for q in waiting for t, f in waiting[q].items() if len(f.qubits) == 2}.items()):
        if time in waiting[factor.qubits[0]]:
            place(time, factor)
    settle(tuple(range(qubits)), len(factors))
    return blocks


def _placement(blocks: list[Block], qubits: int) -> tuple[list, list, list[int], list[list[int]], list, list]:
    """Bits for each block's qubits, each block's controls as (mask, value) on its bits, the relabellings
    (block index, bit map) on the way, and each qubit's first and final bit. The `low` qubits needed last
    wait on the bits below kernel.PARKED_BITS (controls may stay there); when a block needs one, the qubits
    needed last take the low bits by swapping with the ones leaving them."""
    low = max(1, min(kernel.PARKED_BITS, qubits // 2 - 1))
    pairs = [block.pair for block in blocks]
    uses = [[b for b, pair in enumerate(pairs) if q in pair] for q in range(qubits)]

    def needed_last(after: int) -> list[int]:
        following = [next((b for b in uses[q] if b >= after), len(pairs)) for q in range(qubits)]
        return sorted(range(qubits), key=lambda q: (-following[q], q))[:low]

    waiting = needed_last(0)
    bit = {q: i for i, q in enumerate(waiting)}
    bit.update({q: low + i for i, q in enumerate(q for q in range(qubits) if q not in bit)})
    first = [bit[q] for q in range(qubits)]
    placed, masks, relabel, bit_maps = [], [], [], []
    for b, (a, c) in enumerate(pairs):
        if min(bit[a], bit[c]) < low:
            staying = set(needed_last(b))
            leaving = [q for q in bit if bit[q] < low and q not in staying]
            entering = [q for q in sorted(staying) if bit[q] >= low]
            bit_map = list(range(qubits))
            for out, into in zip(leaving, entering):
                bit_map[bit[out]], bit_map[bit[into]] = bit[into], bit[out]
                bit[out], bit[into] = bit[into], bit[out]
            relabel.append(len(bit_maps))
            bit_maps.append(bit_map)
        else:
            relabel.append(-1)
        placed.append((bit[a], bit[c]))
        controls = blocks[b].controls
        masks.append((sum(1 << bit[q] for q, _ in controls), sum(v << bit[q] for q, v in controls)))
    return placed, masks, relabel, bit_maps, first, [bit[q] for q in range(qubits)]


def _schedule(
    placed: list[tuple[int, int]], relabel: list[int], masked: list[bool], qubits: int
) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The blocks' new order, where each segment starts (and the end), and each segment's window. Between
    two relabellings or masked blocks (a masked block is a segment of its own in its place) blocks that
    share no bit commute; each segment takes,
    in order, the blocks still to run whose bits avoid its window and that no block left behind shares a bit
    with, from the window that takes the most. A segment of one block is a pass of its own, as is every
    block of a state of at most one tile."""
    blocks = len(placed)
    if qubits <= TILE_BITS:
        return list(range(blocks)), np.arange(blocks + 1, dtype=np.int64), np.full(blocks, -1, np.int64)
    windows = range(TILE_BITS, LOWEST_WINDOW - 1, -1)
    ends = [b for b in range(1, blocks) if relabel[b] >= 0 or masked[b] or masked[b - 1]] + [blocks]
    order, starts, chosen = [], [], []
    for first, end in zip([0, *ends[:-1]], ends):
        pending = list(range(first, end))
        while pending:
            window, taken = max(((w, _segment(pending, placed, w, qubits)) for w in windows), key=lambda wt: len(wt[1]))
            if len(taken) < 2:
                window, taken = -1, pending[:1]
            starts.append(len(order))
            chosen.append(window)
            order += taken
            done = set(taken)
            pending = [b for b in pending if b not in done]
    return order, np.array([*starts, blocks], np.int64), np.array(chosen, np.int64)


def _segment(pending: list[int], placed: list[tuple[int, int]], window: int, qubits: int) -> list[int]:
    """The blocks of `pending` (in order) that one segment with this window can run: those whose bits avoid
    the window's, and share none with a block of `pending` left behind before them."""
    fixed = set(range(window, window + qubits - TILE_BITS))
    behind, taken = set(), []
    for b in pending:
        bits = set(placed[b])
        if bits & (fixed | behind):
            behind |= bits
        else:
            taken.append(b)
    return taken


def _embedded(factor: Factor, pair: tuple[int, int]) -> tuple:
    """The factor's projectors in the basis of the block on `pair` (pair[0] the more significant)."""
    if factor.qubits == pair:
        return factor.proj
    if len(factor.qubits) == 2:
        return tuple(SWAP @ p @ SWAP for p in factor.proj)
    return tuple(_on_pair(p, 0 if factor.qubits[0] == pair[0] else 1) for p in factor.proj)


def _to_arrays(blocks: list[Block], start: list[Factor], qubits: int, names: dict, index: dict) -> Plan:
    placed, masks, relabel, bit_maps, first, final = _placement(blocks, qubits)
    order, segments, windows = _schedule(placed, relabel, [bool(block.controls) for block in blocks], qubits)
    kinds: dict[bytes, int] = {}
    kind_eig, kind_proj, rows, starts = [], [], [], [0]
    for pair, members in ((blocks[b].pair, blocks[b].factors) for b in order):
        for factor in members:
            eig = np.zeros(4)
            proj = np.zeros((4, 4, 4), np.complex128)
            eig[: len(factor.eig)] = factor.eig
            proj[: len(factor.eig)] = _embedded(factor, pair)
            key = eig.tobytes() + proj.tobytes()
            if key not in kinds:
                kinds[key] = len(kind_eig)
                kind_eig.append(eig)
                kind_proj.append(proj)
            rows.append(
                (kinds[key], names[factor.symbol] if factor.symbol is not None else -1, factor.coef, factor.const)
            )
        starts.append(len(rows))
    kind, symbol, coef, const = zip(*rows) if rows else ((), (), (), ())
    circuit = Circuit(
        qubits=qubits,
        block_qubits=np.array([placed[b] for b in order], np.int64).reshape(-1, 2),
        block_mask=np.array([masks[b][0] for b in order], np.int64),
        block_mask_value=np.array([masks[b][1] for b in order], np.int64),
        relabel=np.array(relabel, np.int64),  # a relabelling starts its stretch of blocks, which keeps its place
        bit_maps=np.array(bit_maps, np.int64).reshape(-1, qubits),
        segments=segments,
        windows=windows,
        tile_bits=TILE_BITS,
        block_start=np.array(starts, np.int64),
        kind=np.array(kind, np.int64),
        symbol=np.array(symbol, np.int64),
        coef=np.array(coef, np.float64),
        const=np.array(const, np.float64),
        kind_eig=np.array(kind_eig, np.float64).reshape(-1, 4),
        kind_proj=np.array(kind_proj, np.complex128).reshape(-1, 4, 4, 4),
        **_start_arrays(start, first),
    )
    return Plan(circuit, kernel.Circuit(circuit), {q: final[i] for q, i in index.items()})
