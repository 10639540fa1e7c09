"""State-space helpers of the block kernel (numba): a state's tiles, relabelling its bits, Pauli strings.

A state of n qubits is complex64 held as two float32 planes (real, imaginary); qubit q is bit q of an
amplitude's index. A tile is the part of the state in which every bit but the `low` lowest and the tile's
own high bits is fixed: 2^len(bits) runs of 2^low contiguous amplitudes, gathered into a buffer in cache.
"""

import numba
import numpy as np

JIT = {"nogil": True, "cache": True, "fastmath": True}


@numba.njit(**JIT)
def deposit(value, bits):
    """The bits of `value`, the k-th put at bit bits[k]."""
    out = 0
    for k in range(bits.shape[0]):
        out |= ((value >> k) & 1) << bits[k]
    return out


@numba.njit(**JIT)
def tile_layout(qubits, low, bits):
    """The offsets of a tile's runs (bits `bits` set as the run's index says) and the bases of the tiles
    (the other high bits set as the tile's index says)."""
    outside = np.array([q for q in range(low, qubits) if not (bits == q).any()], np.int64)
    runs = np.array([deposit(i, bits) for i in range(1 << bits.shape[0])], np.int64)
    bases = np.array([deposit(t, outside) for t in range(1 << outside.shape[0])], np.int64)
    return runs, bases


@numba.njit(**JIT)
def contiguous(low, bits):
    """Whether a tile with these high bits is one contiguous slice of the state."""
    return (bits == np.arange(low, low + bits.shape[0])).all()


@numba.njit(**JIT)
def gather(state, base, runs, low, buffer):
    """The tile at `base` (its runs at base + runs[k], 2^low amplitudes each) into the buffer's start."""
    width = 1 << low
    for plane in range(2):
        source, target = state[plane], buffer[plane]
        for k in range(runs.shape[0]):
            start, at = base + runs[k], k * width
            for j in range(width):
                target[at + j] = source[start + j]


@numba.njit(**JIT)
def scatter(buffer, base, runs, low, state):
    """The buffer's start back into the tile at `base`."""
    width = 1 << low
    for plane in range(2):
        source, target = buffer[plane], state[plane]
        for k in range(runs.shape[0]):
            start, at = base + runs[k], k * width
            for j in range(width):
                target[start + j] = source[at + j]


@numba.njit(**JIT)
def swap_bits(tile, a, b):
    """In place: bit a (< b) of every index trades with bit b, by swapping the runs of 2^a amplitudes
    with bit a set and bit b clear against those with bit a clear and bit b set."""
    width = 1 << a
    for outer in range(0, tile.shape[0], 1 << (b + 1)):
        for start in range(outer + width, outer + (1 << b), 2 * width):
            one, other = tile[start : start + width], tile[start - width + (1 << b) : start + (1 << b)]
            for j in range(width):
                one[j], other[j] = other[j], one[j]


@numba.njit(**JIT)
def relabel_bits(state, bit_map, low, part, parts, buffer):
    """In place, this part's tiles (of `parts`): the amplitude at index i moves to the index with bit q of i
    at bit bit_map[q], where bit_map swaps pairs of bits, one below `low`, one above (so it is its own
    inverse). Tile by tile: the tiles span the low bits and the high bits swapped, each gathered into
    `buffer`, its bits swapped there, and scattered back."""
    lows = np.array([q for q in range(low) if bit_map[q] != q], np.int64)
    if lows.shape[0] == 0:
        return
    runs, bases = tile_layout(bit_map.shape[0], low, bit_map[lows])
    size = runs.shape[0] << low
    for t in range(part, bases.shape[0], parts):
        gather(state, bases[t], runs, low, buffer)
        for plane in range(2):
            for k in range(lows.shape[0]):
                swap_bits(buffer[plane, :size], lows[k], low + k)
        scatter(buffer, bases[t], runs, low, state)


@numba.njit(**JIT)
def parity(x):
    x ^= x >> 32
    x ^= x >> 16
    x ^= x >> 8
    x ^= x >> 4
    x ^= x >> 2
    x ^= x >> 1
    return x & 1


@numba.njit(**JIT)
def add_pauli(out, state, weight, flip, signs, y_count):
    """out += weight * P state for the Pauli string with X or Y on `flip`'s bits, Y or Z on `signs`'."""
    w = weight * (1j ** (y_count % 4))
    wr, wi = np.float32(w.real), np.float32(w.imag)
    for i in range(state.shape[1]):
        sign = np.float32(-1.0) if parity(i & signs) else np.float32(1.0)
        out[0, i ^ flip] += sign * (wr * state[0, i] - wi * state[1, i])
        out[1, i ^ flip] += sign * (wr * state[1, i] + wi * state[0, i])


@numba.njit(**JIT)
def pauli_expectation(state, flip, signs, y_count):
    """<state| P |state> for the Pauli string with X or Y on `flip`'s bits, Y or Z on `signs`' (in double)."""
    total = 0.0 + 0.0j
    for i in range(state.shape[1]):
        sign = -1.0 if parity(i & signs) else 1.0
        j = i ^ flip
        total += sign * complex(state[0, j], -state[1, j]) * complex(state[0, i], state[1, i])
    return (total * 1j ** (y_count % 4)).real
