#include "relabel.h"

#include <algorithm>
#include <vector>

namespace qml {
namespace {

// The bits of `value`, the k-th put at bit bits[k].
index_t deposit(index_t value, const std::vector<int>& bits) {
  index_t out = 0;
  for (size_t k = 0; k < bits.size(); ++k) out |= ((value >> k) & 1) << bits[k];
  return out;
}

// `value` with a zero bit put in at each of `bits` (ascending).
index_t without_bits(index_t value, const std::vector<int>& bits) {
  for (int b : bits) value = ((value >> b) << (b + 1)) | (value & ((index_t(1) << b) - 1));
  return value;
}

// Swaps `count_bits` low bits with as many high bits on one plane, for the settings first..last of the
// other bits: the amplitude with low bits u, high bits t trades places with the one with low bits t, high
// bits u (a count x count transpose through a tile, so each cache line is read once and written once). The
// count is fixed when compiled so the swaps unroll; `lowest`: the low bits are bits 0..count_bits - 1, so part
// u sits at offset u.
template <int count_bits, bool lowest>
void swap_parts(float* values, const std::vector<int>& lows, const std::vector<int>& highs, index_t first,
                index_t last) {
  constexpr int count = 1 << count_bits;
  index_t at_low[count], at_high[count];
  for (int t = 0; t < count; ++t) at_low[t] = deposit(t, lows), at_high[t] = deposit(t, highs);
  std::vector<int> moved(lows);
  moved.insert(moved.end(), highs.begin(), highs.end());
  std::sort(moved.begin(), moved.end());
  alignas(64) float tile[count][count];
  for (index_t rest = first; rest < last; ++rest) {
    const index_t base = without_bits(rest, moved);
    for (int t = 0; t < count; ++t) {
      const float* line = values + base + at_high[t];
      for (int u = 0; u < count; ++u) tile[u][t] = line[lowest ? u : at_low[u]];
    }
    for (int u = 0; u < count; ++u) {
      float* line = values + base + at_high[u];
      for (int t = 0; t < count; ++t) line[lowest ? t : at_low[t]] = tile[u][t];
    }
  }
}

template <int count_bits>
void swap_parts(float* values, const std::vector<int>& lows, const std::vector<int>& highs, index_t first,
                index_t last) {
  if (lows.back() == count_bits - 1) return swap_parts<count_bits, true>(values, lows, highs, first, last);
  swap_parts<count_bits, false>(values, lows, highs, first, last);
}

void relabel_range(float* values, const std::vector<int>& lows, const std::vector<int>& highs, index_t first,
                   index_t last) {
  switch (lows.size()) {
    case 5: return swap_parts<5>(values, lows, highs, first, last);
    case 4: return swap_parts<4>(values, lows, highs, first, last);
    case 3: return swap_parts<3>(values, lows, highs, first, last);
    case 2: return swap_parts<2>(values, lows, highs, first, last);
    default: return swap_parts<1>(values, lows, highs, first, last);
  }
}

}  // namespace

void relabel_bits(Planes state, const int64_t* bit_map, int qubits, int parts) {
  std::vector<int> lows, highs;
  for (int q = 0; q < qubits; ++q)
    if (bit_map[q] > q) lows.push_back(q), highs.push_back(static_cast<int>(bit_map[q]));
  if (lows.empty()) return;
  const index_t rests = state.size >> (2 * lows.size());
  in_parts(parts, [&](int part) {
    for (float* plane : {state.re, state.im})
      relabel_range(plane, lows, highs, share(part, parts, rests, 0), share(part + 1, parts, rests, 0));
  });
}

}  // namespace qml
