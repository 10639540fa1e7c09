// Blocks and segments: a block's 4x4 unitary applied to a state in one pass over it, or un-applied from
// the state and co-state of the backward sweep together with its transition matrix; a segment of
// consecutive blocks applied tile by tile (all its blocks to one tile while it is in cache, then the next).
#pragma once

#include <vector>

#include "circuit.h"
#include "matrix.h"
#include "state.h"

namespace qml {

constexpr int kChunkBits = 8;  // runs are taken in chunks of at most 2^8 amplitudes

// state <- (u on bits hi, lo) state, on the amplitudes `mask` lets through (the others are not touched).
void apply_block(Planes state, const Mat4& u, int hi, int lo, int parts, Mask mask = {}, Form form = Form::kFourMult);

// psi <- u^dagger psi, lam <- u^dagger lam in one pass; returns M[r, c] = sum over the other bits of
// psi_r conj(lam_c), with lam before the step. With a mask: on and over the amplitudes it lets through.
Mat4 unapply_with_transition(Planes psi, Planes lam, const Mat4& u, int hi, int lo, int parts, Mask mask = {},
                             Form form = Form::kFourMult);

// state <- segment s's blocks applied in order: one block in one pass, several tile by tile. With `start`,
// a segment of several blocks first writes each tile's amplitudes of the circuit's start (the state's values
// before are not read); one of one block is applied after the start's own pass. With `relabel` (a bit map
// that leaves the segment's window alone), each tile is first relabelled.
void apply_segment(Planes state, const Circuit& c, const std::vector<Mat4>& blocks, int s, int parts,
                   bool start = false, const int64_t* relabel = nullptr);

// Blocks e-1..b of a segment (`window` its window, a mask of bits) un-applied from both states tile by tile, then with
// `relabel` each tile relabelled; each block's transition matrix (as unapply_with_transition's) where it has a
// symbol, zeros elsewhere.
std::vector<Mat4> unapply_segment(Planes psi, Planes lam, const Circuit& c, const std::vector<Mat4>& blocks,
                                  const std::vector<bool>& symbolic, int b, int e, index_t window, int parts,
                                  const int64_t* relabel = nullptr);

}  // namespace qml
