"""The plan's second stage: the circuit's start, written as a state in one pass.

The start is the constant factors that take |0...0> to a product state times diagonal phases (a data
encoding's Hadamards and CZs, say). The kernel writes that state directly instead of applying them gate by
gate; the factors after the start go on to `fusion`.
"""

import functools

import numpy as np

from qml_ray import kernel
from qml_ray.gradients.plan.gates import Factor


def split(factors: list[Factor], qubits: int) -> tuple[list[Factor], list[Factor]]:
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


# At most this many bits above low choose the start's table for a chunk: 2^4 tables of 2^10 amplitudes, 128 KiB.
TABLE_BITS = 4


def arrays(start: list[Factor], bit: list[int]) -> dict:
    """The start as the Circuit's start_* arrays, qubit q on bit bit[q]. The kernel writes the state in chunks
    of 2^low amplitudes, each a table over the bits below low times what the bits above give: a constant, and
    for each linked bit (in a diagonal factor with a bit above) two values. The diagonal factors that link a
    bit below low to one of the first TABLE_BITS bits above (`start_table_bits`) are in the tables instead, one
    table for each setting of those bits, so a chunk costs one complex product an amplitude (the QCNN's ring of
    CZs links 2-3 bits below low to 2-3 bits above)."""
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
    crossing = [pair for pair in phase_bits if min(pair) < low <= max(pair)]
    table_bits = tuple(sorted({max(pair) for pair in crossing})[:TABLE_BITS])
    linked = np.zeros(low, np.bool_)
    for pair in crossing:
        linked[min(pair)] |= max(pair) not in table_bits
    phases = np.array(phases, np.complex128).reshape(-1, 4)
    pairs = tuple(tuple(pair) for pair in phase_bits)
    return {
        "start_amplitudes": amplitudes,
        "start_phase_bits": np.array(phase_bits, np.int64).reshape(-1, 2),
        "start_phases": phases,
        "start_linked": linked,
        "start_table_bits": np.array(table_bits, np.int64),
        "start_table": _tables(low, table_bits, linked.tobytes(), amplitudes.tobytes(), pairs, phases.tobytes()),
    }


@functools.lru_cache(maxsize=64)
def _tables(low: int, table_bits: tuple, linked: bytes, amplitudes: bytes, pairs: tuple, phases: bytes) -> np.ndarray:
    """The start's tables (`arrays`), one array for every plan of the same start: a data set's circuits share
    theirs, and a worker keeps thousands of plans."""
    linked_bits = np.frombuffer(linked, np.bool_)
    amplitudes_of = np.frombuffer(amplitudes, np.complex128).reshape(-1, 2)
    diagonals = np.frombuffer(phases, np.complex128).reshape(-1, 4)
    j = np.arange(1 << low)
    tables = []
    for setting in range(1 << len(table_bits)):
        value = {b: (setting >> k) & 1 for k, b in enumerate(table_bits)}  # the table's bits above low
        value.update((b, (j >> b) & 1) for b in range(low))
        table = np.ones(1 << low, np.complex128)
        for b in np.flatnonzero(~linked_bits):
            table *= amplitudes_of[b, value[b]]
        for (hi, lo), diagonal in zip(pairs, diagonals):
            if min(hi, lo) < low and hi in value and lo in value:  # (the scale has those of two bits above)
                table *= diagonal[2 * value[hi] + value[lo]]
        tables.append(np.stack([table.real, table.imag]))
    made = np.array(tables, np.float32)
    made.flags.writeable = False
    return made


def _matrix(factor: Factor) -> np.ndarray:
    """A constant factor's unitary, sum_k exp(i pi e h_k) P_k."""
    return sum(np.exp(1j * np.pi * factor.const * h) * p for h, p in zip(factor.eig, factor.proj))
