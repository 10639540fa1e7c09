"""Compiled state-vector kernels of the block adjoint method (numba, one circuit per call).

A state of n qubits is complex64 held as two float32 planes (real, imaginary), so loops over
contiguous runs vectorise; qubit q is bit q of an amplitude's index. A block
is a 4x4 unitary on two qubits (hi, lo), its basis index 2 * bit(hi) + bit(lo). Transition
matrices and gradients are accumulated in double precision. Every function releases the GIL,
so threads run circuits side by side; and a circuit's passes can cut the state into `parts` that
numba's own threads run side by side (for a batch with fewer circuits than threads). A segment of
consecutive blocks (`plan.Circuit.segments`) is applied tile by tile: all its blocks to one tile of
the state, while the tile is in cache, before the next. A tile is the amplitudes whose bits in the
segment's window (bits no block of it touches) are the same.
"""

import numba
import numpy as np

# Circuits run on several Python threads at once, each may start numba's threads: only the TBB and
# OpenMP layers allow that (numba's own workqueue layer aborts the process).
numba.config.THREADING_LAYER = "threadsafe"

JIT = {"nogil": True, "cache": True, "fastmath": True}


@numba.njit(**JIT)
def factor_matrix(eig, proj, exponent, derivative):
    """sum_k exp(i pi e h_k) P_k, or with `derivative` its d/de, sum_k i pi h_k exp(i pi e h_k) P_k."""
    out = np.zeros((4, 4), np.complex128)
    for k in range(eig.shape[0]):
        phase = np.exp(1j * np.pi * exponent * eig[k])
        if derivative:
            phase *= 1j * np.pi * eig[k]
        out += phase * proj[k]
    return out


@numba.njit(**JIT)
def factor_exponent(circuit, f, values):
    s = circuit.symbol[f]
    return circuit.const[f] + (circuit.coef[f] * values[s] if s >= 0 else 0.0)


@numba.njit(**JIT)
def factor_of(circuit, f, values, derivative):
    """Factor f's matrix at `values`, or with `derivative` its d/de."""
    kind = circuit.kind[f]
    return factor_matrix(
        circuit.kind_eig[kind], circuit.kind_proj[kind], factor_exponent(circuit, f, values), derivative
    )


@numba.njit(**JIT)
def block_unitaries(circuit, values):
    """Each factor's 4x4 matrix, and each block's product of them (later factors on the left)."""
    starts = circuit.block_start
    factors = np.empty((circuit.kind.shape[0], 4, 4), np.complex128)
    blocks = np.empty((starts.shape[0] - 1, 4, 4), np.complex128)
    for b in range(blocks.shape[0]):
        u = np.eye(4, dtype=np.complex128)
        for f in range(starts[b], starts[b + 1]):
            factors[f] = factor_of(circuit, f, values, False)
            u = factors[f] @ u
        blocks[b] = u
    return factors, blocks


@numba.njit(**JIT)
def scalars(u):
    """A 4x4 complex matrix as two row-major 16-tuples of float32: real and imaginary parts."""
    r = u.real.astype(np.float32).ravel()
    i = u.imag.astype(np.float32).ravel()
    return (
        (r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]),
        (i[0], i[1], i[2], i[3], i[4], i[5], i[6], i[7], i[8], i[9], i[10], i[11], i[12], i[13], i[14], i[15]),
    )


@numba.njit(inline="always", **JIT)
def row(mr, mi, r, x):
    """Row r of the matrix (mr, mi) times the 4 amplitudes x = (re0, im0, ..., re3, im3)."""
    k = 4 * r
    yr = (
        mr[k] * x[0]
        - mi[k] * x[1]
        + mr[k + 1] * x[2]
        - mi[k + 1] * x[3]
        + mr[k + 2] * x[4]
        - mi[k + 2] * x[5]
        + mr[k + 3] * x[6]
        - mi[k + 3] * x[7]
    )
    yi = (
        mr[k] * x[1]
        + mi[k] * x[0]
        + mr[k + 1] * x[3]
        + mi[k + 1] * x[2]
        + mr[k + 2] * x[5]
        + mi[k + 2] * x[4]
        + mr[k + 3] * x[7]
        + mi[k + 3] * x[6]
    )
    return yr, yi


@numba.njit(inline="always", **JIT)
def accumulate_row(acc, p, x):
    """acc += p conj(x_c) for c = 0..3, in double precision (acc: 4 complex as 8 floats; p, x_c: (re, im))."""
    pr, pi = np.float64(p[0]), np.float64(p[1])
    return (
        acc[0] + pr * x[0][0] + pi * x[0][1],
        acc[1] + pi * x[0][0] - pr * x[0][1],
        acc[2] + pr * x[1][0] + pi * x[1][1],
        acc[3] + pi * x[1][0] - pr * x[1][1],
        acc[4] + pr * x[2][0] + pi * x[2][1],
        acc[5] + pi * x[2][0] - pr * x[2][1],
        acc[6] + pr * x[3][0] + pi * x[3][1],
        acc[7] + pi * x[3][0] - pr * x[3][1],
    )


VECTOR_BITS = 4  # a block whose lower qubit is at least this bit runs over contiguous runs of >= 16 amplitudes
PARKED_BITS = 5  # the plan parks the qubits needed last on the bits below this (so blocks run on runs of >= 32)

GROUPS_AT_ONCE = 8  # groups per step of the loop for lower blocks (a fixed count LLVM unrolls)
MIN_QUBITS = 5  # states are padded to this many qubits, so they hold a whole number of GROUPS_AT_ONCE


@numba.njit(inline="always", **JIT)
def mix(views, j, mr, mi):
    """Apply the matrix (mr, mi) to the group at j of four runs' views (re, im of runs 00, 01, 10, 11)."""
    r0, i0, r1, i1, r2, i2, r3, i3 = views
    x = (r0[j], i0[j], r1[j], i1[j], r2[j], i2[j], r3[j], i3[j])
    r0[j], i0[j] = row(mr, mi, 0, x)
    r1[j], i1[j] = row(mr, mi, 1, x)
    r2[j], i2[j] = row(mr, mi, 2, x)
    r3[j], i3[j] = row(mr, mi, 3, x)


@numba.njit(inline="always", **JIT)
def mix_group(state, index, mr, mi):
    """Apply the matrix (mr, mi) to the amplitudes state[:, index[r]]; returns them after, as 4 (re, im)."""
    re, im = state[0], state[1]
    x = (re[index[0]], im[index[0]], re[index[1]], im[index[1]], re[index[2]], im[index[2]], re[index[3]], im[index[3]])
    q = (row(mr, mi, 0, x), row(mr, mi, 1, x), row(mr, mi, 2, x), row(mr, mi, 3, x))
    for r in range(4):
        re[index[r]], im[index[r]] = q[r]
    return q


@numba.njit(**JIT)
def group_index(group, hi, lo):
    """The amplitude indices of a group: its number with zero bits put in at hi and lo, then each bit set."""
    small, big = min(hi, lo), max(hi, lo)
    i = ((group >> small) << (small + 1)) | (group & ((1 << small) - 1))
    i = ((i >> big) << (big + 1)) | (i & ((1 << big) - 1))
    return i, i + (1 << lo), i + (1 << hi), i + (1 << hi) + (1 << lo)


@numba.njit(inline="always", **JIT)
def add_transition(total, p, q, length):
    """total[r] += sum_j p_r[j] conj(q_c[j]) for c = 0..3 (re, im interleaved), j < length, summed in float32."""
    for r in range(4):
        pr, pi = p[2 * r], p[2 * r + 1]
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
        for j in range(length):
            a, b = pr[j], pi[j]
            s0 += a * q[0][j] + b * q[1][j]
            s1 += b * q[0][j] - a * q[1][j]
            s2 += a * q[2][j] + b * q[3][j]
            s3 += b * q[2][j] - a * q[3][j]
            s4 += a * q[4][j] + b * q[5][j]
            s5 += b * q[4][j] - a * q[5][j]
            s6 += a * q[6][j] + b * q[7][j]
            s7 += b * q[6][j] - a * q[7][j]
        total[r, 0] += s0
        total[r, 1] += s1
        total[r, 2] += s2
        total[r, 3] += s3
        total[r, 4] += s4
        total[r, 5] += s5
        total[r, 6] += s6
        total[r, 7] += s7


CHUNK_BITS = 8  # runs are taken in chunks of at most 2^8 amplitudes


def chunk_kernels(length: int) -> tuple:
    """A block's pass over the state's runs in chunks of `length` amplitudes, `length` fixed when
    compiled: LLVM then vectorises each chunk whole, with no remainder loop (into which loops over short
    runs of a length known only at run time fell: a block on bit 4 cost 4x one on bit 8)."""

    @numba.njit(inline="always", **JIT)
    def chunk_views(state, start, hi, lo):
        """The chunk from `start` of the state's four runs (bit hi, bit lo) = 00, 01, 10, 11, as real
        and imaginary views."""
        o1, o2 = start + (1 << lo), start + (1 << hi)
        o3 = o2 + (1 << lo)
        re, im = state[0], state[1]
        return (
            re[start : start + length],
            im[start : start + length],
            re[o1 : o1 + length],
            im[o1 : o1 + length],
            re[o2 : o2 + length],
            im[o2 : o2 + length],
            re[o3 : o3 + length],
            im[o3 : o3 + length],
        )

    @numba.njit(**JIT)
    def apply_chunks(state, mr, mi, hi, lo, first, last):
        """Groups first..last, `length` at a time: consecutive groups of a run are consecutive indices."""
        for group in range(first, last, length):
            views = chunk_views(state, group_index(group, hi, lo)[0], hi, lo)
            for j in range(length):
                mix(views, j, mr, mi)

    @numba.njit(**JIT)
    def unapply_chunks(psi, lam, mr, mi, hi, lo, total, first, last):
        for group in range(first, last, length):
            start = group_index(group, hi, lo)[0]
            p, q = chunk_views(psi, start, hi, lo), chunk_views(lam, start, hi, lo)
            for j in range(length):
                mix(p, j, mr, mi)
            for j in range(length):
                mix(q, j, mr, mi)
            add_transition(total, p, q, length)

    return apply_chunks, unapply_chunks


apply_16, unapply_16 = chunk_kernels(16)
apply_32, unapply_32 = chunk_kernels(32)
apply_64, unapply_64 = chunk_kernels(64)
apply_128, unapply_128 = chunk_kernels(128)
apply_256, unapply_256 = chunk_kernels(1 << CHUNK_BITS)


@numba.njit(**JIT)
def apply_groups(state, mr, mi, hi, lo, first, last):
    """Groups first..last of a block on low bits, each gathered from four scattered amplitudes."""
    for step in range(first, last, GROUPS_AT_ONCE):
        for group in range(step, step + GROUPS_AT_ONCE):
            mix_group(state, group_index(group, hi, lo), mr, mi)


@numba.njit(**JIT)
def unapply_groups(psi, lam, mr, mi, hi, lo, total, first, last):
    zero = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    acc = (zero, zero, zero, zero)
    for step in range(first, last, GROUPS_AT_ONCE):
        for group in range(step, step + GROUPS_AT_ONCE):
            index = group_index(group, hi, lo)
            q = mix_group(psi, index, mr, mi)
            y = mix_group(lam, index, mr, mi)
            acc = (
                accumulate_row(acc[0], q[0], y),
                accumulate_row(acc[1], q[1], y),
                accumulate_row(acc[2], q[2], y),
                accumulate_row(acc[3], q[3], y),
            )
    for r in range(4):
        for c in range(8):
            total[r, c] += acc[r][c]


@numba.njit(**JIT)
def apply_range(state, mr, mi, hi, lo, first, last):
    """The matrix (mr, mi) on bits hi, lo, over groups first..last (multiples of 2^CHUNK_BITS)."""
    small = min(hi, lo)
    if small >= CHUNK_BITS:
        apply_256(state, mr, mi, hi, lo, first, last)
    elif small == 7:
        apply_128(state, mr, mi, hi, lo, first, last)
    elif small == 6:
        apply_64(state, mr, mi, hi, lo, first, last)
    elif small == 5:
        apply_32(state, mr, mi, hi, lo, first, last)
    elif small == VECTOR_BITS:
        apply_16(state, mr, mi, hi, lo, first, last)
    else:
        apply_groups(state, mr, mi, hi, lo, first, last)


@numba.njit(**JIT)
def unapply_range(psi, lam, mr, mi, hi, lo, total, first, last):
    """apply_range on both states, adding their transition sums to `total`."""
    small = min(hi, lo)
    if small >= CHUNK_BITS:
        unapply_256(psi, lam, mr, mi, hi, lo, total, first, last)
    elif small == 7:
        unapply_128(psi, lam, mr, mi, hi, lo, total, first, last)
    elif small == 6:
        unapply_64(psi, lam, mr, mi, hi, lo, total, first, last)
    elif small == 5:
        unapply_32(psi, lam, mr, mi, hi, lo, total, first, last)
    elif small == VECTOR_BITS:
        unapply_16(psi, lam, mr, mi, hi, lo, total, first, last)
    else:
        unapply_groups(psi, lam, mr, mi, hi, lo, total, first, last)


@numba.njit(**JIT)
def share(part, parts, count, unit_bits):
    """Where part `part` of `parts` starts among `count` items, cut at multiples of 2^unit_bits."""
    return count if part == parts else ((count >> unit_bits) * part // parts) << unit_bits


@numba.njit(parallel=True, **JIT)
def apply_parts(state, mr, mi, hi, lo, parts):
    groups = state.shape[1] >> 2
    for part in numba.prange(parts):
        first, last = share(part, parts, groups, CHUNK_BITS), share(part + 1, parts, groups, CHUNK_BITS)
        apply_range(state, mr, mi, hi, lo, first, last)


@numba.njit(parallel=True, **JIT)
def unapply_parts(psi, lam, mr, mi, hi, lo, parts):
    groups = psi.shape[1] >> 2
    totals = np.zeros((parts, 4, 8))
    for part in numba.prange(parts):
        first, last = share(part, parts, groups, CHUNK_BITS), share(part + 1, parts, groups, CHUNK_BITS)
        unapply_range(psi, lam, mr, mi, hi, lo, totals[part], first, last)
    return totals.sum(axis=0)


@numba.njit(**JIT)
def apply_block(state, u, hi, lo, parts):
    """state <- (u on qubits hi, lo) state, the state cut into `parts` run side by side on threads."""
    mr, mi = scalars(u)
    if parts > 1:
        apply_parts(state, mr, mi, hi, lo, parts)
    else:
        apply_range(state, mr, mi, hi, lo, 0, state.shape[1] >> 2)


@numba.njit(**JIT)
def unapply_with_transition(psi, lam, u, hi, lo, parts):
    """One pass over both states: psi <- u^dagger psi; lam <- u^dagger lam; returns
    M[r, c] = sum over the other qubits of psi_r conj(lam_c), with lam before the step (complex128 4x4)."""
    ud = np.conj(u.T)
    mr, mi = scalars(ud)
    if parts > 1:
        total = unapply_parts(psi, lam, mr, mi, hi, lo, parts)
    else:
        total = np.zeros((4, 8))
        unapply_range(psi, lam, mr, mi, hi, lo, total, 0, psi.shape[1] >> 2)
    # summed against lam after the step, lam_after = u^dagger lam_before: M = M_after u^dagger
    return (total[:, 0::2] + 1j * total[:, 1::2]) @ ud


@numba.njit(**JIT)
def parity(x):
    x ^= x >> 32
    x ^= x >> 16
    x ^= x >> 8
    x ^= x >> 4
    x ^= x >> 2
    x ^= x >> 1
    return x & 1


SIGN_BITS = 8  # Z readouts take the state in chunks of 2^8 amplitudes, signed through a table


@numba.njit(**JIT)
def sign_table(signs, width):
    """[terms, width] float32: (-1)^parity(j & signs[t]), the sign of Z string t on the bits below width."""
    table = np.empty((signs.shape[0], width), np.float32)
    for t in range(signs.shape[0]):
        for j in range(width):
            table[t, j] = -1.0 if parity(j & signs[t]) else 1.0
    return table


@numba.njit(**JIT)
def z_expectations(state, signs):
    """<state| Z_t |state> for the strings of Z on signs[t]'s bits, all in one pass: per chunk, each
    string's low-bit signs dotted with the probabilities, times the sign of its bits above the chunk."""
    width = min(1 << SIGN_BITS, state.shape[1])
    table = sign_table(signs, width)
    probability = np.empty(width, np.float32)
    totals = np.zeros(signs.shape[0])
    for start in range(0, state.shape[1], width):
        for j in range(width):
            probability[j] = state[0, start + j] ** 2 + state[1, start + j] ** 2
        for t in range(signs.shape[0]):
            chunk = np.float32(0.0)
            for j in range(width):
                chunk += table[t, j] * probability[j]
            totals[t] += -chunk if parity(start & signs[t]) else chunk
    return totals


@numba.njit(**JIT)
def add_z(out, state, weights, signs):
    """out += sum_t weights[t] Z_t state for the strings of Z on signs[t]'s bits, all in one pass: per
    chunk, the weighted sum of the strings' signs, then each amplitude scaled by it."""
    width = min(1 << SIGN_BITS, state.shape[1])
    table = sign_table(signs, width)
    scale = np.empty(width, np.float32)
    for start in range(0, state.shape[1], width):
        scale[:] = 0.0
        for t in range(signs.shape[0]):
            w = np.float32(-weights[t] if parity(start & signs[t]) else weights[t])
            for j in range(width):
                scale[j] += w * table[t, j]
        for j in range(width):
            out[0, start + j] += scale[j] * state[0, start + j]
            out[1, start + j] += scale[j] * state[1, start + j]


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
def deposit(value, bits):
    """The bits of `value`, the k-th put at bit bits[k]."""
    out = 0
    for k in range(bits.shape[0]):
        out |= ((value >> k) & 1) << bits[k]
    return out


@numba.njit(**JIT)
def without_bits(value, bits):
    """`value` with a zero bit put in at each of `bits` (ascending)."""
    for b in bits:
        value = ((value >> b) << (b + 1)) | (value & ((1 << b) - 1))
    return value


def part_swapper(count_bits: int):
    """Relabelling that swaps `count_bits` low bits with as many high bits, the count fixed when compiled
    so LLVM unrolls the swaps; with all PARKED_BITS low bits swapped, part u sits at offset u."""
    count, whole = 1 << count_bits, count_bits == PARKED_BITS

    @numba.njit(**JIT)
    def swap_parts(values, lows, highs, first, last):
        """For every setting of the other bits: the amplitude with low bits u, high bits t trades places
        with the one with low bits t, high bits u (a count x count transpose through a tile, so each
        cache line is read once and written once); the settings first..last of the other bits."""
        at_low = np.array([deposit(t, lows) for t in range(count)])
        at_high = np.array([deposit(t, highs) for t in range(count)])
        moved = np.sort(np.concatenate((lows, highs)))
        tile = np.empty((count, count), np.float32)
        for rest in range(first, last):
            base = without_bits(rest, moved)
            for t in range(count):
                line = base + at_high[t]
                for u in range(count):
                    tile[u, t] = values[line + (u if whole else at_low[u])]
            for u in range(count):
                line = base + at_high[u]
                for t in range(count):
                    values[line + (t if whole else at_low[t])] = tile[u, t]

    return swap_parts


swap_1, swap_2, swap_3, swap_4, swap_5 = (part_swapper(bits) for bits in range(1, PARKED_BITS + 1))


@numba.njit(**JIT)
def relabel_range(values, lows, highs, first, last):
    """swap_parts on one plane for its settings first..last of the other bits."""
    if lows.shape[0] == 5:
        swap_5(values, lows, highs, first, last)
    elif lows.shape[0] == 4:
        swap_4(values, lows, highs, first, last)
    elif lows.shape[0] == 3:
        swap_3(values, lows, highs, first, last)
    elif lows.shape[0] == 2:
        swap_2(values, lows, highs, first, last)
    else:
        swap_1(values, lows, highs, first, last)


@numba.njit(parallel=True, **JIT)
def relabel_parts(state, lows, highs, parts):
    rests = state.shape[1] >> (2 * lows.shape[0])
    for job in numba.prange(2 * parts):
        plane, part = job // parts, job % parts
        relabel_range(state[plane], lows, highs, share(part, parts, rests, 0), share(part + 1, parts, rests, 0))


@numba.njit(**JIT)
def relabel_bits(state, bit_map, parts):
    """In place: the amplitude at index i moves to the index with bit q of i at bit bit_map[q], where
    bit_map swaps pairs (low, high) of bits, every low below PARKED_BITS (so it is its own inverse)."""
    lows = np.array([q for q in range(bit_map.shape[0]) if bit_map[q] > q])
    highs = bit_map[lows]
    if lows.shape[0] == 0:
        return
    if parts > 1:
        relabel_parts(state, lows, highs, parts)
    else:
        for plane in range(2):
            relabel_range(state[plane], lows, highs, 0, state.shape[1] >> (2 * lows.shape[0]))


@numba.njit(**JIT)
def pauli_expectation(state, flip, signs, y_count):
    """<state| P |state> for the Pauli string with X or Y on `flip`'s bits, Y or Z on `signs`' (in double)."""
    total = 0.0 + 0.0j
    for i in range(state.shape[1]):
        sign = -1.0 if parity(i & signs) else 1.0
        j = i ^ flip
        total += sign * complex(state[0, j], -state[1, j]) * complex(state[0, i], state[1, i])
    return (total * 1j ** (y_count % 4)).real


START_BITS = 10  # the start state is written in chunks of 2^10 amplitudes (plan.Circuit.start_table)


@numba.njit(**JIT)
def start_phase(circuit, g, index):
    """The start's diagonal factor g at the amplitude `index`."""
    hi, lo = circuit.start_phase_bits[g]
    return circuit.start_phases[g, 2 * ((index >> hi) & 1) + ((index >> lo) & 1)]


@numba.njit(**JIT)
def chunk_factors(circuit, base, low):
    """For the chunk at `base`: the constant the start gives all its amplitudes (from the bits above
    `low`), and for each linked bit below, the two values its setting contributes (its qubit's amplitudes
    times the diagonal factors linking it to a bit above, whose setting the chunk fixes)."""
    scale = 1.0 + 0.0j
    for b in range(low, circuit.qubits):
        scale *= circuit.start_amplitudes[b, (base >> b) & 1]
    per_bit = circuit.start_amplitudes[:low].copy()
    for g in range(circuit.start_phases.shape[0]):
        hi, lo = circuit.start_phase_bits[g]
        if min(hi, lo) >= low:
            scale *= start_phase(circuit, g, base)
        elif hi >= low:
            x = (base >> hi) & 1
            per_bit[lo] *= circuit.start_phases[g, 2 * x : 2 * x + 2]
        elif lo >= low:
            x = (base >> lo) & 1
            per_bit[hi, 0] *= circuit.start_phases[g, x]
            per_bit[hi, 1] *= circuit.start_phases[g, 2 + x]
    return scale, per_bit


@numba.njit(inline="always", **JIT)
def scale_by_bit(re, im, b, values):
    """Amplitude j of the chunk times values[bit b of j] (complex), blended arithmetically so it vectorises."""
    r0, i0 = np.float32(values[0].real), np.float32(values[0].imag)
    dr, di = np.float32(values[1].real) - r0, np.float32(values[1].imag) - i0
    for j in range(re.shape[0]):
        k = np.float32((j >> b) & 1)
        fr, fi = r0 + k * dr, i0 + k * di
        x, y = re[j], im[j]
        re[j], im[j] = fr * x - fi * y, fr * y + fi * x


@numba.njit(**JIT)
def start_range(psi, circuit, first, last):
    """Chunks first..last of the start state: the chunk's constant times the table every chunk shares
    (`plan.Circuit.start_table`), times the values of its linked bits."""
    table, linked = circuit.start_table, circuit.start_linked
    width, low = table.shape[1], linked.shape[0]
    for c in range(first, last):
        base = c * width
        scale, per_bit = chunk_factors(circuit, base, low)
        re, im = psi[0, base : base + width], psi[1, base : base + width]
        sr, si = np.float32(scale.real), np.float32(scale.imag)
        for j in range(width):
            re[j] = sr * table[0, j] - si * table[1, j]
            im[j] = sr * table[1, j] + si * table[0, j]
        for b in range(low):
            if linked[b]:
                scale_by_bit(re, im, b, per_bit[b])


@numba.njit(parallel=True, **JIT)
def start_parts(psi, circuit, parts):
    chunks = psi.shape[1] // circuit.start_table.shape[1]
    for part in numba.prange(parts):
        start_range(psi, circuit, chunks * part // parts, chunks * (part + 1) // parts)


@numba.njit(**JIT)
def start_state(circuit, parts):
    """The state after the circuit's start (`plan.Circuit`'s start_*), from |0...0>: its qubits' product
    state times its diagonal factors, written in one pass, in `parts` parts side by side."""
    psi = np.empty((2, 1 << circuit.qubits), np.float32)
    if parts > 1:
        start_parts(psi, circuit, parts)
    else:
        start_range(psi, circuit, 0, psi.shape[1] // circuit.start_table.shape[1])
    return psi


@numba.njit(inline="always", **JIT)
def tile_count(circuit):
    """A segment's tiles: one for each setting of its window's qubits - tile_bits bits."""
    return 1 << (circuit.qubits - circuit.tile_bits)


@numba.njit(inline="always", **JIT)
def tile_runs(circuit, window, hi, lo, tile):
    """A segment's tile `tile` as block (hi, lo)'s groups: the tile fixes the state's bits window..window + fixed
    (fixed = qubits - tile_bits) to `tile`; with bits hi and lo taken out of an amplitude's index they are its
    group's bits p..p + fixed, so the tile is `count` runs of 2^p consecutive groups, run r from
    offset + r * step. Returns (offset, step, count, length)."""
    fixed = circuit.qubits - circuit.tile_bits
    p = window - (hi < window) - (lo < window)
    return tile << p, 1 << (p + fixed), 1 << (circuit.qubits - 2 - p - fixed), 1 << p


@numba.njit(**JIT)
def apply_segment_range(state, circuit, blocks, b, e, window, first, last):
    """Blocks b..e (a segment: their bits outside its window) on tiles first..last, a tile at a time: every
    block on one tile, while it is in cache, then the next tile."""
    for tile in range(first, last):
        for k in range(b, e):
            mr, mi = scalars(blocks[k])
            hi, lo = circuit.block_qubits[k]
            offset, step, count, length = tile_runs(circuit, window, hi, lo, tile)
            for run in range(offset, offset + count * step, step):
                apply_range(state, mr, mi, hi, lo, run, run + length)


@numba.njit(parallel=True, **JIT)
def apply_segment_parts(state, circuit, blocks, b, e, window, parts):
    tiles = tile_count(circuit)
    for part in numba.prange(parts):
        first, last = share(part, parts, tiles, 0), share(part + 1, parts, tiles, 0)
        apply_segment_range(state, circuit, blocks, b, e, window, first, last)


@numba.njit(**JIT)
def apply_segment(state, circuit, blocks, s, parts):
    """state <- segment s's blocks applied in order: one block in one pass, several tile by tile; the
    state cut into `parts` run side by side on threads."""
    b, e, window = circuit.segments[s], circuit.segments[s + 1], circuit.windows[s]
    if e - b == 1:
        apply_block(state, blocks[b], circuit.block_qubits[b, 0], circuit.block_qubits[b, 1], parts)
    elif parts > 1:
        apply_segment_parts(state, circuit, blocks, b, e, window, parts)
    else:
        apply_segment_range(state, circuit, blocks, b, e, window, 0, tile_count(circuit))


@numba.njit(**JIT)
def unapply_segment_range(psi, lam, circuit, daggers, symbolic, b, e, window, totals, first, last):
    """Blocks e-1..b (of a segment) un-applied from both states on tiles first..last, a tile at a time; each
    block with a symbol adds its transition sums to totals[k - b]."""
    for tile in range(first, last):
        for k in range(e - 1, b - 1, -1):
            mr, mi = scalars(daggers[k - b])
            hi, lo = circuit.block_qubits[k]
            offset, step, count, length = tile_runs(circuit, window, hi, lo, tile)
            for run in range(offset, offset + count * step, step):
                if symbolic[k]:
                    unapply_range(psi, lam, mr, mi, hi, lo, totals[k - b], run, run + length)
                else:
                    apply_range(psi, mr, mi, hi, lo, run, run + length)
                    apply_range(lam, mr, mi, hi, lo, run, run + length)


@numba.njit(parallel=True, **JIT)
def unapply_segment_parts(psi, lam, circuit, daggers, symbolic, b, e, window, parts):
    tiles = tile_count(circuit)
    totals = np.zeros((parts, e - b, 4, 8))
    for part in numba.prange(parts):
        first, last = share(part, parts, tiles, 0), share(part + 1, parts, tiles, 0)
        unapply_segment_range(psi, lam, circuit, daggers, symbolic, b, e, window, totals[part], first, last)
    return totals.sum(axis=0)


@numba.njit(**JIT)
def unapply_segment(psi, lam, circuit, blocks, symbolic, b, e, window, parts):
    """Blocks e-1..b of a segment (window its window) un-applied from both states, tile by tile; returns each
    block's transition matrix (as unapply_with_transition's), zeros for a block with no symbol."""
    daggers = np.empty((e - b, 4, 4), np.complex128)
    for k in range(b, e):
        daggers[k - b] = np.conj(blocks[k].T)
    if parts > 1:
        totals = unapply_segment_parts(psi, lam, circuit, daggers, symbolic, b, e, window, parts)
    else:
        totals = np.zeros((e - b, 4, 8))
        unapply_segment_range(psi, lam, circuit, daggers, symbolic, b, e, window, totals, 0, tile_count(circuit))
    out = np.empty((e - b, 4, 4), np.complex128)
    for k in range(e - b):
        out[k] = (totals[k, :, 0::2] + 1j * totals[k, :, 1::2]) @ daggers[k]
    return out


@numba.njit(**JIT)
def simulate(circuit, blocks, parts):
    """The state (planes: real, imaginary) after the circuit's start and its blocks, segment by segment,
    each pass in `parts` parts."""
    psi = start_state(circuit, parts)
    for s in range(circuit.segments.shape[0] - 1):
        b = circuit.segments[s]
        if circuit.relabel[b] >= 0:
            relabel_bits(psi, circuit.bit_maps[circuit.relabel[b]], parts)
        apply_segment(psi, circuit, blocks, s, parts)
    return psi


@numba.njit(**JIT)
def circuit_expectations(circuit, values, readouts, out, parts):
    """out[k] += <psi|O_k|psi>, psi the circuit's state (a `plan.Circuit`), O_k the sum of the
    `readouts`' terms t with readouts.op[t] == k: readouts.coef[t] times a Pauli string on the bits of
    the circuit's end. Each pass over the state runs in `parts` parts side by side on numba's threads.
    Returns psi (`circuit_gradient` can start from it)."""
    _, blocks = block_unitaries(circuit, values)
    psi = simulate(circuit, blocks, parts)
    z = readouts.flip == 0
    for t, value in zip(np.nonzero(z)[0], z_expectations(psi, readouts.signs[z])):
        out[readouts.op[t]] += readouts.coef[t] * value
    for t in np.nonzero(~z)[0]:
        value = pauli_expectation(psi, readouts.flip[t], readouts.signs[t], readouts.y_count[t])
        out[readouts.op[t]] += readouts.coef[t] * value
    return psi


@numba.njit(**JIT)
def add_observable(lam, psi, readouts, upstream):
    """lam += sum_k upstream[k] O_k psi (O_k as in circuit_expectations)."""
    weights = upstream[readouts.op] * readouts.coef
    z = readouts.flip == 0
    add_z(lam, psi, weights[z], readouts.signs[z])
    for t in np.nonzero(~z)[0]:
        add_pauli(lam, psi, weights[t], readouts.flip[t], readouts.signs[t], readouts.y_count[t])


@numba.njit(**JIT)
def circuit_gradient(circuit, values, readouts, upstream, grad, parts, psi):
    """grad[s] += d/d(values[s]) of sum_k upstream[k] <psi|O_k|psi> (as in circuit_expectations). `psi` is the
    circuit's state at `values` as circuit_expectations returns it, which the sweep consumes (un-applies in
    place), or an array of no amplitudes, to simulate it here.

    The backward sweep collects a transition matrix only for blocks with a symbol, un-applies the others
    from both states, and stops at the first block with a symbol (the blocks before it, such as a data
    encoding, have nothing to differentiate)."""
    factors, blocks = block_unitaries(circuit, values)
    if psi.shape[1] == 0:
        psi = simulate(circuit, blocks, parts)
    lam = np.zeros_like(psi)
    add_observable(lam, psi, readouts, upstream)
    symbolic = with_symbols(circuit)
    first = np.argmax(symbolic) if symbolic.any() else symbolic.shape[0]
    for s in range(circuit.segments.shape[0] - 2, -1, -1):
        b, e = max(circuit.segments[s], first), circuit.segments[s + 1]
        if e <= first:
            break
        hi, lo = circuit.block_qubits[b]
        if e - b == 1 and symbolic[b]:
            m = unapply_with_transition(psi, lam, blocks[b], hi, lo, parts)
            add_block_gradient(circuit, values, factors, b, m, grad)
        elif e - b == 1:
            for state in (psi, lam):
                apply_block(state, np.conj(blocks[b].T), hi, lo, parts)
        else:
            transitions = unapply_segment(psi, lam, circuit, blocks, symbolic, b, e, circuit.windows[s], parts)
            for k in range(b, e):
                if symbolic[k]:
                    add_block_gradient(circuit, values, factors, k, transitions[k - b], grad)
        if circuit.relabel[b] >= 0 and b > first:
            relabel_bits(psi, circuit.bit_maps[circuit.relabel[b]], parts)
            relabel_bits(lam, circuit.bit_maps[circuit.relabel[b]], parts)


@numba.njit(**JIT)
def with_symbols(circuit):
    """[blocks] bool: whether block b has a factor with a symbol."""
    starts = circuit.block_start
    out = np.zeros(starts.shape[0] - 1, np.bool_)
    for b in range(out.shape[0]):
        out[b] = (circuit.symbol[starts[b] : starts[b + 1]] >= 0).any()
    return out


@numba.njit(**JIT)
def add_block_gradient(circuit, values, factors, b, m, grad):
    """Block b's part of the gradient, m its transition matrix: d/de of the block (L F(e) R)
    contributes 2 Re Tr(dF/de . R M L)."""
    start, stop = circuit.block_start[b], circuit.block_start[b + 1]
    right = np.empty((stop - start + 1, 4, 4), np.complex128)  # right[j]: factors before start + j
    right[0] = np.eye(4, dtype=np.complex128)
    for j in range(stop - start):
        right[j + 1] = factors[start + j] @ right[j]
    left = np.eye(4, dtype=np.complex128)  # factors after f
    for f in range(stop - 1, start - 1, -1):
        s = circuit.symbol[f]
        if s >= 0:
            d = factor_of(circuit, f, values, True)
            grad[s] += 2.0 * circuit.coef[f] * np.real(np.trace(d @ right[f - start] @ m @ left))
        left = left @ factors[f]
