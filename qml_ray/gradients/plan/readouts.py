"""A circuit's readouts, serialized Pauli sums, as the kernel reads them: each term a coefficient, the bits it
flips, the bits whose value signs it, and its count of Ys."""

import functools
from typing import NamedTuple

import numpy as np
from tensorflow_quantum.core.proto import pauli_sum_pb2

from qml_ray import kernel


class Readouts(NamedTuple):
    """A circuit's readouts, the arrays `kernel.Readouts` is made from: term t adds coef[t] times a Pauli
    string to readout op[t]."""

    op: np.ndarray  # [terms] int64
    coef: np.ndarray  # [terms] float64
    flip: np.ndarray  # [terms] int64: the bits with X or Y
    signs: np.ndarray  # [terms] int64: the bits with Y or Z
    y_count: np.ndarray  # [terms] int64


@functools.lru_cache(maxsize=8192)
def arrays(pauli_sums: tuple, qubit_index: tuple) -> Readouts:
    """The serialized Pauli sums, on the bits `qubit_index` gives their qubits ((id, bit), ...), as arrays."""
    terms = [(op, *term) for op, pauli_sum in enumerate(pauli_sums) for term in _terms(pauli_sum, dict(qubit_index))]
    columns = list(zip(*terms)) if terms else [()] * len(Readouts._fields)
    dtypes = (np.int64, np.float64, np.int64, np.int64, np.int64)
    return Readouts(*(np.array(column, dtype) for column, dtype in zip(columns, dtypes)))


@functools.lru_cache(maxsize=8192)
def compiled(pauli_sums: tuple, qubit_index: tuple, path: str):
    """The same as the kernel's own copy, for the kernel on `path` (a `kernel.compiled(path).Readouts`)."""
    return kernel.compiled(path).Readouts(arrays(pauli_sums, qubit_index))


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
