"""The plan's fifth stage: between relabellings, the blocks put in an order that gathers them into segments.

A segment is a run of blocks that leave the same window of bits untouched, which the kernel applies tile by
tile (cache blocking): each tile of the state stays in a core's cache while every block of the segment passes
over it.
"""

from typing import NamedTuple

import numpy as np

from qml_ray.choices import DEFAULT_TILE_BITS

# A segment's tile: 2^16 amplitudes by default (the planner may choose another, `choices.TILES`), 512 KiB (both
# planes), so it stays in a core's L2 cache while every block of the segment passes over it: a segment costs
# one pass over memory instead of one per block.
# A tile is the amplitudes with the same bits in the segment's window: qubits - TILE_BITS bits that no
# block of the segment touches, none below LOWEST_WINDOW, in any places. The tile is then runs of 2^w
# amplitudes or more, w the window's lowest bit; from 2^10 (4 KiB, a page, per plane), since shorter runs were
# slower (docs/kernel-notes.md#segments-and-tiles). (TILE_BITS at least kernel.CHUNK_BITS + 2 and
# LOWEST_WINDOW at least kernel.CHUNK_BITS and kernel.START_BITS: a tile's runs then hold whole chunks of every
# pass, and of the start, which the first segment writes tile by tile.)
TILE_BITS = DEFAULT_TILE_BITS
LOWEST_WINDOW = 10


class Schedule(NamedTuple):
    order: list[int]  # the blocks, in the order they run
    segments: np.ndarray  # [segments + 1] int64: segment s holds order[segments[s]:segments[s + 1]]
    windows: np.ndarray  # [segments] int64: segment s's window as a mask of bits (0 for a segment of one block)


def schedule(
    placed: list[tuple[int, int]],
    relabel: list[int],
    masked: list[bool],
    qubits: int,
    bit_maps: list,
    tile_bits: int = TILE_BITS,
) -> Schedule:
    """The blocks' new order, where each segment starts (and the end), and each segment's window (0 for a
    segment of one block). Between two relabellings or masked blocks (a masked block is a segment of its own
    in its place) blocks that share no bit commute; each segment takes, in order, the blocks still to run
    whose bits avoid its window and that no block left behind shares a bit with, from the window that takes
    the most (`_windows`). The relabelling a stretch starts with (its row of `bit_maps`) counts as one more taken
    by its first segment's window if the window leaves its bits alone: the kernel then relabels tile by tile, in
    cache, with no pass of its own. A segment of one block is a pass of its own, as is every block of a state
    of at most one tile."""
    blocks = len(placed)
    if qubits <= tile_bits:
        return Schedule(list(range(blocks)), np.arange(blocks + 1, dtype=np.int64), np.zeros(blocks, np.int64))
    ends = [b for b in range(1, blocks) if relabel[b] >= 0 or masked[b] or masked[b - 1]] + [blocks]
    order, starts, chosen = [], [], []
    for first, end in zip([0, *ends[:-1]], ends):
        pending = list(range(first, end))
        moved = _moved(bit_maps[relabel[first]]) if relabel[first] >= 0 else set()
        while pending:
            window, taken = max(
                ((w, _segment(pending, placed, w)) for w in _windows(pending, placed, moved, qubits, tile_bits)),
                key=lambda wt: (len(wt[1]) + (bool(moved) and not moved & wt[0]), min(wt[0])),
            )
            if len(taken) < 2:
                window, taken = set(), pending[:1]
            starts.append(len(order))
            chosen.append(sum(1 << bit for bit in window))
            order += taken
            moved = set()  # the stretch's later segments come after its relabelling
            done = set(taken)
            pending = [b for b in pending if b not in done]
    return Schedule(order, np.array([*starts, blocks], np.int64), np.array(chosen, np.int64))


def _moved(bit_map) -> set[int]:
    """The bits a relabelling moves."""
    return {bit for bit, to in enumerate(bit_map) if to != bit}


def _windows(
    pending: list[int], placed: list[tuple[int, int]], moved: set[int], qubits: int, tile_bits: int
) -> list[set[int]]:
    """The windows a segment may take: the consecutive ones, and those that leave alone the bits of the blocks
    that fit in a tile in order (first fit), from none or from the bits the relabelling moves."""
    size = qubits - tile_bits
    consecutive = [set(range(w, w + size)) for w in range(LOWEST_WINDOW, tile_bits + 1)]
    seeds = [set(), {bit for bit in moved if bit >= LOWEST_WINDOW}]
    return consecutive + [_first_fit(pending, placed, seed, qubits, tile_bits) for seed in seeds]


def _first_fit(
    pending: list[int], placed: list[tuple[int, int]], free: set[int], qubits: int, tile_bits: int
) -> set[int]:
    """The window that leaves alone the bits `free` and those of each block of `pending` in turn that still fit
    in a tile (its bits from LOWEST_WINDOW up: tile_bits - LOWEST_WINDOW of them), the tile filled up from
    LOWEST_WINDOW (the longest runs)."""
    room = tile_bits - LOWEST_WINDOW
    free = set(free) if len(free) <= room else set()
    for b in pending:
        bits = free | {bit for bit in placed[b] if bit >= LOWEST_WINDOW}
        if len(bits) <= room:
            free = bits
    above = [bit for bit in range(LOWEST_WINDOW, qubits) if bit not in free]
    return set(above[room - len(free) :])


def _segment(pending: list[int], placed: list[tuple[int, int]], window: set[int]) -> list[int]:
    """The blocks of `pending` (in order) that one segment with this window can run: those whose bits avoid
    the window's, and share none with a block of `pending` left behind before them."""
    behind, taken = set(), []
    for b in pending:
        bits = set(placed[b])
        if bits & (window | behind):
            behind |= bits
        else:
            taken.append(b)
    return taken
