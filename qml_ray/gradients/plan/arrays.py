"""The plan's last stage: the blocks in their order, their factors and the start as the arrays the kernel
is made from (`Circuit`, which `kernel.Circuit` copies once per plan).

Each factor's eigenvalues and projectors are written in its block's basis, and factors of the same kind (the
same eigenvalues and projectors, the gate's exponent aside) share one row of kind_eig and kind_proj.
"""

from typing import NamedTuple

import numpy as np

from qml_ray.choices import FORMS, Choice
from qml_ray.gradients.plan import segments, start
from qml_ray.gradients.plan.fusion import Block
from qml_ray.gradients.plan.gates import Factor, on_pair
from qml_ray.gradients.plan.placement import Placement

SWAP = np.eye(4)[[0, 2, 1, 3]]


class Circuit(NamedTuple):
    """One circuit's fused blocks and factors: the arrays `kernel.Circuit` is made from."""

    qubits: int
    block_qubits: np.ndarray  # [blocks, 2] int64: the bits (hi, lo) the block acts on
    block_mask: np.ndarray  # [blocks] int64: the block's control bits (0: unmasked), it acts only where
    block_mask_value: np.ndarray  # [blocks] int64: ... the state's bits & block_mask equal this
    relabel: np.ndarray  # [blocks] int64: row of bit_maps applied to the state before the block, or -1
    bit_maps: np.ndarray  # [relabellings, qubits] int64: bit q of every index moves to bit bit_maps[r, q] (swaps)
    segments: np.ndarray  # [segments + 1] int64: segment s holds blocks segments[s]:segments[s + 1] (see `segments`)
    windows: np.ndarray  # [segments] int64: segment s's window, the bits its tiles fix, a mask (0: one block)
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
    # (not one of the table bits)
    start_table_bits: np.ndarray  # [table bits] int64: bits above low whose setting picks a chunk's table
    start_table: np.ndarray  # [2^table bits, 2, 2^low] float32: the start on the bits below low (but the linked
    # bits' amplitudes), with its diagonals on them and the table bits, for each setting of the table bits
    form: int  # a block's pass in the kernel's form 0 (four real multiply-adds a complex product) or 1 (three)
    prefetch: bool  # whether a segment fetches its next tile into the cache while its blocks work on one
    huge_pages: bool  # whether its states (from 2 MiB) ask for transparent huge pages


def circuit(
    blocks: list[Block],
    placement: Placement,
    schedule: segments.Schedule,
    start_factors: list[Factor],
    names: dict,
    choice: Choice,
) -> Circuit:
    """The circuit's arrays: the blocks in the schedule's order on the bits `placement` gives them, in its
    segments and windows, their factors' symbols numbered as in `names`, the start's arrays, and the passes
    as `choice` has them (the schedule made with its tiles)."""
    qubits = len(placement.first)
    bits, masks, order = placement.bits, placement.masks, schedule.order
    factors = _Factors(names)
    for b in order:
        factors.add_block(blocks[b])
    return Circuit(
        qubits=qubits,
        block_qubits=np.array([bits[b] for b in order], np.int64).reshape(-1, 2),
        block_mask=np.array([masks[b][0] for b in order], np.int64),
        block_mask_value=np.array([masks[b][1] for b in order], np.int64),
        # a relabelling starts its stretch of blocks, which keeps its place
        relabel=np.array(placement.relabel, np.int64),
        bit_maps=np.array(placement.bit_maps, np.int64).reshape(-1, qubits),
        segments=schedule.segments,
        windows=schedule.windows,
        tile_bits=choice.tile_bits,
        **factors.arrays(),
        **start.arrays(start_factors, placement.first),
        form=FORMS.index(choice.form),
        prefetch=choice.prefetch,
        huge_pages=choice.huge_pages,
    )


class _Factors:
    """The blocks' factors as rows (kind, symbol, coef, const), block after block, and their kinds."""

    def __init__(self, names: dict):
        self.names = names
        self.kinds: dict[bytes, int] = {}
        self.kind_eig, self.kind_proj, self.rows, self.starts = [], [], [], [0]

    def add_block(self, block: Block) -> None:
        for factor in block.factors:
            symbol = self.names[factor.symbol] if factor.symbol is not None else -1
            self.rows.append((self._kind(factor, block.pair), symbol, factor.coef, factor.const))
        self.starts.append(len(self.rows))

    def _kind(self, factor: Factor, pair: tuple[int, int]) -> int:
        """The row of kind_eig / kind_proj of the factor in its block's basis, added if it is new."""
        eig = np.zeros(4)
        proj = np.zeros((4, 4, 4), np.complex128)
        eig[: len(factor.eig)] = factor.eig
        proj[: len(factor.eig)] = _embedded(factor, pair)
        key = eig.tobytes() + proj.tobytes()
        if key not in self.kinds:
            self.kinds[key] = len(self.kind_eig)
            self.kind_eig.append(eig)
            self.kind_proj.append(proj)
        return self.kinds[key]

    def arrays(self) -> dict:
        kind, symbol, coef, const = zip(*self.rows) if self.rows else ((), (), (), ())
        return {
            "block_start": np.array(self.starts, np.int64),
            "kind": np.array(kind, np.int64),
            "symbol": np.array(symbol, np.int64),
            "coef": np.array(coef, np.float64),
            "const": np.array(const, np.float64),
            "kind_eig": np.array(self.kind_eig, np.float64).reshape(-1, 4),
            "kind_proj": np.array(self.kind_proj, np.complex128).reshape(-1, 4, 4, 4),
        }


def _embedded(factor: Factor, pair: tuple[int, int]) -> tuple:
    """The factor's projectors in the basis of the block on `pair` (pair[0] the more significant)."""
    if factor.qubits == pair:
        return factor.proj
    if len(factor.qubits) == 2:
        return tuple(SWAP @ p @ SWAP for p in factor.proj)
    return tuple(on_pair(p, 0 if factor.qubits[0] == pair[0] else 1) for p in factor.proj)
