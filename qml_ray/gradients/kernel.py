"""The simulator of the block method (numba): a circuit's fused blocks applied to a state, and un-applied
from the state and its co-state with each block's transition matrix, for the adjoint gradient.

A block is a 4x4 unitary on two bits (hi, lo), its basis index 2 * bit(hi) + bit(lo). The plan (see
`plan.Circuit`) cuts the circuit into steps: a relabelling of the state's bits, or a run of consecutive
blocks on one tile's bits. A run is applied tile by tile: each tile gathered into a buffer that stays in
cache (or worked on in place where it is one slice of the state), all the run's blocks applied to it,
scattered back, so a run costs one pass over memory. Each step splits its tiles into `parts` for threads.
Transition matrices and gradients are accumulated in double precision. Every function releases the GIL.
"""

import numba
import numpy as np

from qml_ray.gradients import state as state_space
from qml_ray.gradients.state import JIT

LOW_BITS = 7  # blocks run on bits >= 7 where the state allows: their runs of >= 128 amplitudes vectorise
TILE_BITS = 17  # a tile of 2^17 amplitudes (1 MiB) stays in cache
VECTOR_BITS = 4  # below this bit a block runs group by group, unvectorised
GROUPS_AT_ONCE = 8  # groups per step of the loop for lower blocks (a fixed count LLVM unrolls)
MIN_QUBITS = 5  # states are padded to this many qubits, so they hold a whole number of GROUPS_AT_ONCE
CHUNK = 256  # amplitudes per run summed in float32 before the transition matrix takes them in double


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
def factor_exponent(circuit, factor, values):
    s = circuit.symbol[factor]
    return circuit.const[factor] + (circuit.coef[factor] * values[s] if s >= 0 else 0.0)


@numba.njit(**JIT)
def block_unitaries(circuit, values):
    """Each factor's 4x4 matrix, and each block's product of them (later factors on the left)."""
    factors = np.empty((circuit.kind.shape[0], 4, 4), np.complex128)
    blocks = np.empty((circuit.block_start.shape[0] - 1, 4, 4), np.complex128)
    for b in range(blocks.shape[0]):
        u = np.eye(4, dtype=np.complex128)
        for f in range(circuit.block_start[b], circuit.block_start[b + 1]):
            kind = circuit.kind[f]
            factors[f] = factor_matrix(
                circuit.kind_eig[kind], circuit.kind_proj[kind], factor_exponent(circuit, f, values), False
            )
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
def mix_group(re, im, index, mr, mi):
    """Apply the matrix (mr, mi) to the amplitudes at index[r]; returns them after, as 4 (re, im)."""
    x = (re[index[0]], im[index[0]], re[index[1]], im[index[1]], re[index[2]], im[index[2]], re[index[3]], im[index[3]])
    q = (row(mr, mi, 0, x), row(mr, mi, 1, x), row(mr, mi, 2, x), row(mr, mi, 3, x))
    for r in range(4):
        re[index[r]], im[index[r]] = q[r]
    return q


@numba.njit(**JIT)
def run_views(re, im, start, hi, lo):
    """The four runs of the groups from `start`, (bit hi, bit lo) = 00, 01, 10, 11, each as real and
    imaginary views: separate views over contiguous runs let LLVM vectorise loops over them."""
    length, o1, o2 = 1 << min(hi, lo), start + (1 << lo), start + (1 << hi)
    o3 = o2 + (1 << lo)
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
def group_index(group, hi, lo):
    """The amplitude indices of a group: its number with zero bits put in at hi and lo, then each bit set."""
    small, big = min(hi, lo), max(hi, lo)
    i = ((group >> small) << (small + 1)) | (group & ((1 << small) - 1))
    i = ((i >> big) << (big + 1)) | (i & ((1 << big) - 1))
    return i, i + (1 << lo), i + (1 << hi), i + (1 << hi) + (1 << lo)


@numba.njit(**JIT)
def apply_block(re, im, u, hi, lo):
    """(re, im) <- (u on bits hi, lo) (re, im)."""
    mr, mi = scalars(u)
    small, big = min(hi, lo), max(hi, lo)
    if small >= VECTOR_BITS:
        for outer in range(0, re.shape[0], 1 << (big + 1)):
            for start in range(outer, outer + (1 << big), 1 << (small + 1)):
                views = run_views(re, im, start, hi, lo)
                for j in range(views[0].shape[0]):
                    mix(views, j, mr, mi)
        return
    for first in range(0, re.shape[0] >> 2, GROUPS_AT_ONCE):
        for group in range(first, first + GROUPS_AT_ONCE):
            mix_group(re, im, group_index(group, hi, lo), mr, mi)


@numba.njit(inline="always", **JIT)
def chunk_views(views, start, stop):
    return (
        views[0][start:stop],
        views[1][start:stop],
        views[2][start:stop],
        views[3][start:stop],
        views[4][start:stop],
        views[5][start:stop],
        views[6][start:stop],
        views[7][start:stop],
    )


@numba.njit(inline="always", **JIT)
def add_transition(total, p, q):
    """total[r] += sum_j p_r[j] conj(q_c[j]) for c = 0..3 (re, im interleaved), summed in float32."""
    for r in range(4):
        pr, pi = p[2 * r], p[2 * r + 1]
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
        for j in range(pr.shape[0]):
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


@numba.njit(**JIT)
def unapply_with_transition(psi, lam, u, hi, lo, total):
    """One pass over both states (each a pair of planes): psi <- u^dagger psi; lam <- u^dagger lam; adds
    sum over the other bits of psi_r conj(lam_c), both after the step, to total[r] (4 complex as 8 floats)."""
    mr, mi = scalars(np.conj(u.T))
    small, big = min(hi, lo), max(hi, lo)
    if small >= VECTOR_BITS:
        for outer in range(0, psi[0].shape[0], 1 << (big + 1)):
            for start in range(outer, outer + (1 << big), 1 << (small + 1)):
                psi_run = run_views(psi[0], psi[1], start, hi, lo)
                lam_run = run_views(lam[0], lam[1], start, hi, lo)
                for first in range(0, psi_run[0].shape[0], CHUNK):
                    p = chunk_views(psi_run, first, first + CHUNK)
                    q = chunk_views(lam_run, first, first + CHUNK)
                    for j in range(p[0].shape[0]):
                        mix(p, j, mr, mi)
                    for j in range(q[0].shape[0]):
                        mix(q, j, mr, mi)
                    add_transition(total, p, q)
        return
    zero = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    acc = (zero, zero, zero, zero)
    for first in range(0, psi[0].shape[0] >> 2, GROUPS_AT_ONCE):
        for group in range(first, first + GROUPS_AT_ONCE):
            index = group_index(group, hi, lo)
            q = mix_group(psi[0], psi[1], index, mr, mi)
            y = mix_group(lam[0], lam[1], index, mr, mi)
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
def apply_run(tile, circuit, blocks, first, stop):
    """Blocks first..stop - 1 applied to one tile (a pair of planes)."""
    for b in range(first, stop):
        apply_block(tile[0], tile[1], blocks[b], circuit.block_bits[b, 0], circuit.block_bits[b, 1])


@numba.njit(**JIT)
def unapply_run(psi, lam, circuit, blocks, first, stop, transitions):
    """Blocks stop - 1 down to first un-applied from one tile of psi and of lam, adding to their transitions."""
    for b in range(stop - 1, first - 1, -1):
        unapply_with_transition(psi, lam, blocks[b], circuit.block_bits[b, 0], circuit.block_bits[b, 1], transitions[b])


@numba.njit(**JIT)
def tile_buffer(circuit):
    return np.empty((2, 1 << (circuit.low + circuit.step_bits.shape[1])), np.float32)


@numba.njit(**JIT)
def forward(psi, circuit, blocks, first_step, stop_step, part, parts, buffer):
    """Steps first_step..stop_step - 1 applied to psi, this part's tiles (of `parts`) only."""
    for step in range(first_step, stop_step):
        if circuit.step_relabel[step] >= 0:
            state_space.relabel_bits(
                psi, circuit.bit_maps[circuit.step_relabel[step]], circuit.low, part, parts, buffer
            )
            continue
        first, stop = circuit.step_start[step], circuit.step_start[step + 1]
        bits, low = circuit.step_bits[step], circuit.low
        runs, bases = state_space.tile_layout(circuit.qubits, low, bits)
        size = buffer.shape[1]
        for t in range(part, bases.shape[0], parts):
            if state_space.contiguous(low, bits):
                base = bases[t]
                apply_run((psi[0, base : base + size], psi[1, base : base + size]), circuit, blocks, first, stop)
            else:
                state_space.gather(psi, bases[t], runs, low, buffer)
                apply_run((buffer[0], buffer[1]), circuit, blocks, first, stop)
                state_space.scatter(buffer, bases[t], runs, low, psi)


@numba.njit(**JIT)
def backward(psi, lam, circuit, blocks, first_step, stop_step, part, parts, buffers, transitions):
    """Steps stop_step - 1 down to first_step un-applied from psi and lam, this part's tiles (of `parts`)
    only, each block's transition sums added to transitions[block] (see `gradient`)."""
    for step in range(stop_step - 1, first_step - 1, -1):
        if circuit.step_relabel[step] >= 0:
            bit_map = circuit.bit_maps[circuit.step_relabel[step]]
            state_space.relabel_bits(psi, bit_map, circuit.low, part, parts, buffers[0])
            state_space.relabel_bits(lam, bit_map, circuit.low, part, parts, buffers[0])
            continue
        first, stop = circuit.step_start[step], circuit.step_start[step + 1]
        bits, low = circuit.step_bits[step], circuit.low
        runs, bases = state_space.tile_layout(circuit.qubits, low, bits)
        size = buffers.shape[2]
        for t in range(part, bases.shape[0], parts):
            if state_space.contiguous(low, bits):
                base = bases[t]
                psi_tile = (psi[0, base : base + size], psi[1, base : base + size])
                lam_tile = (lam[0, base : base + size], lam[1, base : base + size])
                unapply_run(psi_tile, lam_tile, circuit, blocks, first, stop, transitions)
            else:
                state_space.gather(psi, bases[t], runs, low, buffers[0])
                state_space.gather(lam, bases[t], runs, low, buffers[1])
                psi_tile, lam_tile = (buffers[0, 0], buffers[0, 1]), (buffers[1, 0], buffers[1, 1])
                unapply_run(psi_tile, lam_tile, circuit, blocks, first, stop, transitions)
                state_space.scatter(buffers[0], bases[t], runs, low, psi)
                state_space.scatter(buffers[1], bases[t], runs, low, lam)


@numba.njit(**JIT)
def expectations(psi, readout, out):
    """out[k] += <psi|O_k|psi>, O_k the sum of the readout's terms t with op[t] == k: coef[t] times a
    Pauli string (on the bits of the circuit's end)."""
    for t in range(readout.op.shape[0]):
        out[readout.op[t]] += readout.coef[t] * state_space.pauli_expectation(
            psi, readout.flip[t], readout.signs[t], readout.y_count[t]
        )


@numba.njit(**JIT)
def add_co_state(lam, psi, readout, upstream):
    """lam += sum_k upstream[k] O_k psi."""
    for t in range(readout.op.shape[0]):
        weight = upstream[readout.op[t]] * readout.coef[t]
        state_space.add_pauli(lam, psi, weight, readout.flip[t], readout.signs[t], readout.y_count[t])


@numba.njit(**JIT)
def gradient(circuit, values, factors, blocks, transitions, grad):
    """grad[s] += d/d(values[s]) of <psi|O|psi>, from each block's transition sums (psi_r conj(lam_c)
    summed with both after the block was un-applied)."""
    for b in range(blocks.shape[0]):
        # against lam before the step, lam_after = u^dagger lam_before: M = M_after u^dagger
        m = (transitions[b, :, 0::2] + 1j * transitions[b, :, 1::2]) @ np.conj(blocks[b].T)
        # d/de of the block (L F(e) R) contributes 2 Re Tr(dF/de . R M L).
        start, stop = circuit.block_start[b], circuit.block_start[b + 1]
        right = np.empty((stop - start + 1, 4, 4), np.complex128)  # right[j]: factors before start + j
        right[0] = np.eye(4, dtype=np.complex128)
        for j in range(stop - start):
            right[j + 1] = factors[start + j] @ right[j]
        left = np.eye(4, dtype=np.complex128)  # factors after f
        for f in range(stop - 1, start - 1, -1):
            s = circuit.symbol[f]
            if s >= 0:
                kind = circuit.kind[f]
                e = factor_exponent(circuit, f, values)
                d = factor_matrix(circuit.kind_eig[kind], circuit.kind_proj[kind], e, True)
                grad[s] += 2.0 * circuit.coef[f] * np.real(np.trace(d @ right[f - start] @ m @ left))
            left = left @ factors[f]
