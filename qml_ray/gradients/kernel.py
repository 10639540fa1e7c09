"""Compiled state-vector kernels of the block adjoint method (numba, one circuit per call).

A state of n qubits is complex64 held as two float32 planes (real, imaginary), so loops over
contiguous runs vectorise; qubit q is bit q of an amplitude's index. A block
is a 4x4 unitary on two qubits (hi, lo), its basis index 2 * bit(hi) + bit(lo). Transition
matrices and gradients are accumulated in double precision. Every function releases the GIL,
so threads run circuits side by side.
"""

import numba
import numpy as np

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
def factor_exponent(factor, symbol, coef, const, values):
    s = symbol[factor]
    return const[factor] + (coef[factor] * values[s] if s >= 0 else 0.0)


@numba.njit(**JIT)
def block_unitaries(block_start, kind, symbol, coef, const, kind_eig, kind_proj, values):
    """Each factor's 4x4 matrix, and each block's product of them (later factors on the left)."""
    factors = np.empty((kind.shape[0], 4, 4), np.complex128)
    blocks = np.empty((block_start.shape[0] - 1, 4, 4), np.complex128)
    for b in range(blocks.shape[0]):
        u = np.eye(4, dtype=np.complex128)
        for f in range(block_start[b], block_start[b + 1]):
            e = factor_exponent(f, symbol, coef, const, values)
            factors[f] = factor_matrix(kind_eig[kind[f]], kind_proj[kind[f]], e, False)
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
    def apply_chunks(state, mr, mi, hi, lo):
        small, big = min(hi, lo), max(hi, lo)
        for outer in range(0, state.shape[1], 1 << (big + 1)):
            for run in range(outer, outer + (1 << big), 1 << (small + 1)):
                for start in range(run, run + (1 << small), length):
                    views = chunk_views(state, start, hi, lo)
                    for j in range(length):
                        mix(views, j, mr, mi)

    @numba.njit(**JIT)
    def unapply_chunks(psi, lam, mr, mi, hi, lo, total):
        small, big = min(hi, lo), max(hi, lo)
        for outer in range(0, psi.shape[1], 1 << (big + 1)):
            for run in range(outer, outer + (1 << big), 1 << (small + 1)):
                for start in range(run, run + (1 << small), length):
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
def apply_block(state, u, hi, lo):
    """state <- (u on qubits hi, lo) state."""
    mr, mi = scalars(u)
    small = min(hi, lo)
    if small >= CHUNK_BITS:
        apply_256(state, mr, mi, hi, lo)
    elif small == 7:
        apply_128(state, mr, mi, hi, lo)
    elif small == 6:
        apply_64(state, mr, mi, hi, lo)
    elif small == 5:
        apply_32(state, mr, mi, hi, lo)
    elif small == VECTOR_BITS:
        apply_16(state, mr, mi, hi, lo)
    else:
        for first in range(0, state.shape[1] >> 2, GROUPS_AT_ONCE):
            for group in range(first, first + GROUPS_AT_ONCE):
                mix_group(state, group_index(group, hi, lo), mr, mi)


@numba.njit(**JIT)
def unapply_with_transition(psi, lam, u, hi, lo):
    """One pass over both states: psi <- u^dagger psi; lam <- u^dagger lam; returns
    M[r, c] = sum over the other qubits of psi_r conj(lam_c), with lam before the step (complex128 4x4)."""
    ud = np.conj(u.T)
    mr, mi = scalars(ud)
    small = min(hi, lo)
    total = np.zeros((4, 8))
    if small >= CHUNK_BITS:
        unapply_256(psi, lam, mr, mi, hi, lo, total)
    elif small == 7:
        unapply_128(psi, lam, mr, mi, hi, lo, total)
    elif small == 6:
        unapply_64(psi, lam, mr, mi, hi, lo, total)
    elif small == 5:
        unapply_32(psi, lam, mr, mi, hi, lo, total)
    elif small == VECTOR_BITS:
        unapply_16(psi, lam, mr, mi, hi, lo, total)
    else:
        zero = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        acc = (zero, zero, zero, zero)
        for first in range(0, psi.shape[1] >> 2, GROUPS_AT_ONCE):
            for group in range(first, first + GROUPS_AT_ONCE):
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


@numba.njit(**JIT)
def add_z(out, state, weight, signs):
    """out += weight * P state for the string of Z on `signs`' bits: each amplitude stays in place."""
    w = np.float32(weight)
    for i in range(state.shape[1]):
        signed = -w if parity(i & signs) else w
        out[0, i] += signed * state[0, i]
        out[1, i] += signed * state[1, i]


@numba.njit(**JIT)
def add_pauli(out, state, weight, flip, signs, y_count):
    """out += weight * P state for the Pauli string with X or Y on `flip`'s bits, Y or Z on `signs`'."""
    if flip == 0:
        add_z(out, state, weight, signs)
        return
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


RELABEL_RUN_BITS = 10  # relabelling moves runs of up to 2^10 amplitudes at a time


@numba.njit(**JIT)
def relabel_bits(state, bit_map):
    """In place: the amplitude at index i moves to the index with bit q of i at bit bit_map[q], where
    bit_map swaps pairs (low, high) of bits, every low below every high (so it is its own inverse).
    Works chunk by chunk below the lowest high bit: `count` chunks at a time trade their low-bit parts."""
    lows = np.array([q for q in range(bit_map.shape[0]) if bit_map[q] > q])
    if lows.shape[0] == 0:
        return
    highs = bit_map[lows]
    width, count = 1 << min(highs.min(), RELABEL_RUN_BITS), 1 << lows.shape[0]
    low_mask, high_mask = deposit(count - 1, lows), deposit(count - 1, highs)
    at_high = np.array([deposit(t, highs) for t in range(count)])
    at_low = np.array([deposit(t, lows) for t in range(count)])
    rests = np.array([v for v in range(width) if v & low_mask == 0])
    buffer = np.empty((2, count, width), np.float32)
    for start in range(0, state.shape[1], width):
        if start & high_mask:
            continue
        for t in range(count):
            for plane in range(2):
                buffer[plane, t] = state[plane, start + at_high[t] : start + at_high[t] + width]
        for t in range(count):  # chunk t's part with low bits u goes to chunk u's part with low bits t
            for u in range(count):
                source, target = at_low[u], start + at_high[u] + at_low[t]
                for rest in rests:
                    state[0, target + rest] = buffer[0, t, source + rest]
                    state[1, target + rest] = buffer[1, t, source + rest]


@numba.njit(**JIT)
def z_expectation(state, signs):
    """<state| P |state> for the string of Z on `signs`' bits: signed probabilities, no complex products."""
    total = 0.0
    for i in range(state.shape[1]):
        probability = np.float64(state[0, i]) ** 2 + np.float64(state[1, i]) ** 2
        total += -probability if parity(i & signs) else probability
    return total


@numba.njit(**JIT)
def pauli_expectation(state, flip, signs, y_count):
    """<state| P |state> for the Pauli string with X or Y on `flip`'s bits, Y or Z on `signs`' (in double)."""
    if flip == 0:
        return z_expectation(state, signs)
    total = 0.0 + 0.0j
    for i in range(state.shape[1]):
        sign = -1.0 if parity(i & signs) else 1.0
        j = i ^ flip
        total += sign * complex(state[0, j], -state[1, j]) * complex(state[0, i], state[1, i])
    return (total * 1j ** (y_count % 4)).real


@numba.njit(**JIT)
def simulate(qubits, block_qubits, relabel, bit_maps, blocks):
    """The state (planes: real, imaginary) after the blocks, from |0...0>."""
    psi = np.zeros((2, 1 << qubits), np.float32)
    psi[0, 0] = 1
    for b in range(blocks.shape[0]):
        if relabel[b] >= 0:
            relabel_bits(psi, bit_maps[relabel[b]])
        apply_block(psi, blocks[b], block_qubits[b, 0], block_qubits[b, 1])
    return psi


@numba.njit(**JIT)
def circuit_expectations(
    qubits,
    block_qubits,
    relabel,
    bit_maps,
    block_start,
    kind,
    symbol,
    coef,
    const,
    kind_eig,
    kind_proj,
    values,
    term_op,
    term_coef,
    term_flip,
    term_signs,
    term_y,
    out,
):
    """out[k] += <psi|O_k|psi>, psi the circuit's state, O_k as in circuit_gradient."""
    _, blocks = block_unitaries(block_start, kind, symbol, coef, const, kind_eig, kind_proj, values)
    psi = simulate(qubits, block_qubits, relabel, bit_maps, blocks)
    for t in range(term_op.shape[0]):
        out[term_op[t]] += term_coef[t] * pauli_expectation(psi, term_flip[t], term_signs[t], term_y[t])


@numba.njit(**JIT)
def circuit_gradient(
    qubits,
    block_qubits,
    relabel,
    bit_maps,
    block_start,
    kind,
    symbol,
    coef,
    const,
    kind_eig,
    kind_proj,
    values,
    term_op,
    term_coef,
    term_flip,
    term_signs,
    term_y,
    upstream,
    grad,
):
    """grad[s] += d/d(values[s]) of sum_k upstream[k] <psi|O_k|psi>, psi the circuit's state.

    O_k is the sum of the terms t with term_op[t] == k: term_coef[t] times a Pauli string (on the bits
    of the circuit's end)."""
    factors, blocks = block_unitaries(block_start, kind, symbol, coef, const, kind_eig, kind_proj, values)
    psi = simulate(qubits, block_qubits, relabel, bit_maps, blocks)
    lam = np.zeros_like(psi)
    for t in range(term_op.shape[0]):
        add_pauli(lam, psi, upstream[term_op[t]] * term_coef[t], term_flip[t], term_signs[t], term_y[t])
    for b in range(blocks.shape[0] - 1, -1, -1):
        m = unapply_with_transition(psi, lam, blocks[b], block_qubits[b, 0], block_qubits[b, 1])
        if relabel[b] >= 0:
            relabel_bits(psi, bit_maps[relabel[b]])
            relabel_bits(lam, bit_maps[relabel[b]])
        # d/de of the block (L F(e) R) contributes 2 Re Tr(dF/de . R M L).
        start, stop = block_start[b], block_start[b + 1]
        right = np.empty((stop - start + 1, 4, 4), np.complex128)  # right[j]: factors before start + j
        right[0] = np.eye(4, dtype=np.complex128)
        for j in range(stop - start):
            right[j + 1] = factors[start + j] @ right[j]
        left = np.eye(4, dtype=np.complex128)  # factors after f
        for f in range(stop - 1, start - 1, -1):
            if symbol[f] >= 0:
                e = factor_exponent(f, symbol, coef, const, values)
                d = factor_matrix(kind_eig[kind[f]], kind_proj[kind[f]], e, True)
                grad[symbol[f]] += 2.0 * coef[f] * np.real(np.trace(d @ right[f - start] @ m @ left))
            left = left @ factors[f]
