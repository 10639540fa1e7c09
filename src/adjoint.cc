#include "adjoint.h"

#include <algorithm>

#include "blocks.h"
#include "relabel.h"

namespace qml {
namespace {

void relabel_before(Planes state, const Circuit& c, int b, int parts) {
  relabel_bits(state, c.bit_map(static_cast<int>(c.relabel[b])), c.qubits, parts);
}

// The relabelling segment s starts with, if the segment can take it tile by tile (it has several blocks and the
// relabelling leaves its window alone); else none. A tile is in cache, so the relabelling costs no pass of its
// own over the state.
const int64_t* relabelling_in_tiles(const Circuit& c, int s) {
  const int b = static_cast<int>(c.segments[s]);
  if (c.relabel[b] < 0 || c.windows[s] == 0) return nullptr;
  const int64_t* bit_map = c.bit_map(static_cast<int>(c.relabel[b]));
  return leaves_alone(bit_map, c.windows[s]) ? bit_map : nullptr;
}

// Block b's part of the gradient, m its transition matrix: d/de of the block (L F(e) R) contributes
// 2 Re Tr(dF/de . R M L).
void add_block_gradient(const Circuit& c, const double* values, const std::vector<Mat4>& factors, int b,
                        const Mat4& m, double* grad) {
  const int start = static_cast<int>(c.block_start[b]), stop = static_cast<int>(c.block_start[b + 1]);
  std::vector<Mat4> right(stop - start + 1);  // right[j]: the factors before start + j
  right[0] = identity();
  for (int j = 0; j < stop - start; ++j) right[j + 1] = factors[start + j] * right[j];
  Mat4 left = identity();  // the factors after f
  for (int f = stop - 1; f >= start; --f) {
    const int64_t s = c.symbol[f];
    if (s >= 0) grad[s] += 2.0 * c.coef[f] * real_trace(factor_matrix(c, f, values, true) * right[f - start] * m * left);
    left = left * factors[f];
  }
}

}  // namespace

// The first segment writes the start as it goes (tile by tile), unless a relabelling comes before it.
void simulate(Planes psi, const Circuit& c, const double* values, int parts) {
  const std::vector<Mat4> blocks = block_unitaries(c, values).blocks;
  const bool start_in_segment = c.segment_count() > 0 && c.relabel[0] < 0;
  if (!start_in_segment) write_start(psi, c, parts);
  for (int s = 0; s < c.segment_count(); ++s) {
    const int b = static_cast<int>(c.segments[s]);
    const int64_t* in_tiles = relabelling_in_tiles(c, s);
    if (c.relabel[b] >= 0 && !in_tiles) relabel_before(psi, c, b, parts);
    apply_segment(psi, c, blocks, s, parts, s == 0 && start_in_segment, in_tiles);
  }
}

void sweep_gradient(Planes psi, const Circuit& c, const double* values, const Readouts& readouts,
                    const double* upstream, double* grad, int parts) {
  const Unitaries u = block_unitaries(c, values);
  const StateBuffer co_state = new_state_buffer(c.qubits, c.huge_pages);
  const Planes lam = planes_of(co_state.get(), c.qubits);
  set_observable(lam, psi, readouts, upstream, parts);
  const std::vector<bool> symbolic = with_symbols(c);
  const int first = static_cast<int>(std::find(symbolic.begin(), symbolic.end(), true) - symbolic.begin());
  for (int s = c.segment_count() - 1; s >= 0; --s) {
    const int b = std::max(static_cast<int>(c.segments[s]), first), e = static_cast<int>(c.segments[s + 1]);
    if (e <= first) break;
    const int64_t* in_tiles = b > first ? relabelling_in_tiles(c, s) : nullptr;  // b > first: b starts segment s
    if (e - b == 1 && symbolic[b]) {
      const Mat4 m = unapply_with_transition(psi, lam, u.blocks[b], c.hi(b), c.lo(b), parts, c.mask(b), c.form);
      add_block_gradient(c, values, u.factors, b, m, grad);
    } else if (e - b == 1) {
      for (Planes state : {psi, lam}) apply_block(state, dagger(u.blocks[b]), c.hi(b), c.lo(b), parts, c.mask(b), c.form);
    } else {
      const std::vector<Mat4> m =
          unapply_segment(psi, lam, c, u.blocks, symbolic, b, e, c.windows[s], parts, in_tiles);
      for (int k = b; k < e; ++k)
        if (symbolic[k]) add_block_gradient(c, values, u.factors, k, m[k - b], grad);
    }
    if (c.relabel[b] >= 0 && b > first && !in_tiles)
      for (Planes state : {psi, lam}) relabel_before(state, c, b, parts);
  }
}

}  // namespace qml
