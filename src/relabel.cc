#include "relabel.h"

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "tiles.h"

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

// A relabelling's pairs of bits, lows[k] swapped with highs[k] (at most kParkedBits), and what every range of
// its passes needs, computed once: the moved bits in order, and where each setting of the lows and of the
// highs puts an amplitude.
struct Swaps {
  std::vector<int> lows, highs, moved;
  index_t at_low[1 << kParkedBits], at_high[1 << kParkedBits];
  Swaps(const int64_t* bit_map, int qubits) {
    for (int q = 0; q < qubits; ++q)
      if (bit_map[q] > q) lows.push_back(q), highs.push_back(static_cast<int>(bit_map[q]));
    moved = lows;
    moved.insert(moved.end(), highs.begin(), highs.end());
    std::sort(moved.begin(), moved.end());
    for (int t = 0; t < 1 << lows.size(); ++t) at_low[t] = deposit(t, lows), at_high[t] = deposit(t, highs);
  }
  int count_bits() const { return static_cast<int>(lows.size()); }
};

// Swaps `count_bits` low bits with as many high bits on one plane, for the settings first..last of the
// other bits: the amplitude with low bits u, high bits t trades places with the one with low bits t, high
// bits u (a count x count transpose through a tile, so each cache line is read once and written once). The
// count is fixed when compiled so the swaps unroll; `lowest`: the low bits are bits 0..count_bits - 1, so part
// u sits at offset u.
template <int count_bits, bool lowest>
void swap_parts(float* values, const Swaps& swaps, index_t first, index_t last) {
  constexpr int count = 1 << count_bits;
  const index_t* at_low = swaps.at_low;
  const index_t* at_high = swaps.at_high;
  alignas(64) float tile[count][count];
  for (index_t rest = first; rest < last; ++rest) {
    const index_t base = without_bits(rest, swaps.moved);
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

// A row of W floats as one vector: 8 (one AVX register; two SSE registers on the portable path), or 16 (one
// AVX-512 register).
typedef float Row8 __attribute__((vector_size(32)));
typedef float Row16 __attribute__((vector_size(64)));
template <int W>
struct RowOf;
template <>
struct RowOf<8> {
  using type = Row8;
};
template <>
struct RowOf<16> {
  using type = Row16;
};
template <int W>
using Row = typename RowOf<W>::type;

#ifdef __AVX512F__
constexpr int kRowFloats = 16;  // 16x16 blocks: a third fewer shuffles per float than 8x8 ones
#else
constexpr int kRowFloats = 8;
#endif

// Rows i and i + g (bit g of i clear) with their off-diagonal g x g blocks swapped: row i takes row i + g's
// columns j - g at its columns j with bit g set, and row i + g row i's columns j + g at those with it clear.
template <int W, int g, bool second, size_t... j>
inline Row<W> swapped(Row<W> a, Row<W> b, std::index_sequence<j...>) {
  return __builtin_shufflevector(a, b, (second ? ((j & g) ? W + j : j + g) : ((j & g) ? W + j - g : j))...);
}

template <int W, int g>
inline void swap_blocks(Row<W> r[W]) {
  for (int i = 0; i < W; ++i)
    if (!(i & g)) {
      const Row<W> a = r[i], b = r[i + g];
      r[i] = swapped<W, g, false>(a, b, std::make_index_sequence<W>{});
      r[i + g] = swapped<W, g, true>(a, b, std::make_index_sequence<W>{});
    }
}

// r <- its transpose: the off-diagonal blocks swapped at every scale (halves, quarters, ...), a shuffle a row
// each.
template <int W>
inline void transpose(Row<W> r[W]) {
  if constexpr (W == 16) swap_blocks<W, 8>(r);
  swap_blocks<W, 4>(r);
  swap_blocks<W, 2>(r);
  swap_blocks<W, 1>(r);
}

// The W x W block of rows `rows` (each a pointer to W floats) read, transposed.
template <int W>
inline void load_transposed(float* const rows[W], Row<W> r[W]) {
  for (int k = 0; k < W; ++k) __builtin_memcpy(&r[k], rows[k], sizeof(Row<W>));
  transpose<W>(r);
}

template <int W>
inline void store(float* const rows[W], const Row<W> r[W]) {
  for (int k = 0; k < W; ++k) __builtin_memcpy(rows[k], &r[k], sizeof(Row<W>));
}

// swap_parts when the low bits are bits 0..count_bits - 1 (count_bits >= 3): each rest's count x count tile
// (row t at base + at_high[t], its columns consecutive) transposed in place by W x W blocks through
// registers, block (x, y) swapped with block (y, x).
template <int count_bits>
void swap_rows(float* values, const Swaps& swaps, index_t first, index_t last) {
  constexpr int count = 1 << count_bits, W = count < kRowFloats ? count : kRowFloats;
  const index_t* at_high = swaps.at_high;
  for (index_t rest = first; rest < last; ++rest) {
    float* const base = values + without_bits(rest, swaps.moved);
    for (int x = 0; x < count; x += W)
      for (int y = x; y < count; y += W) {
        float *at_xy[W], *at_yx[W];
        for (int k = 0; k < W; ++k) at_xy[k] = base + at_high[x + k] + y, at_yx[k] = base + at_high[y + k] + x;
        Row<W> xy[W], yx[W];
        load_transposed<W>(at_xy, xy);
        if (x == y) {
          store<W>(at_xy, xy);
          continue;
        }
        load_transposed<W>(at_yx, yx);
        store<W>(at_yx, xy);
        store<W>(at_xy, yx);
      }
  }
}

template <int count_bits>
void swap_parts(float* values, const Swaps& swaps, index_t first, index_t last) {
  const bool lowest = swaps.lows.back() == count_bits - 1;
  if constexpr (count_bits >= 3)
    if (lowest) return swap_rows<count_bits>(values, swaps, first, last);
  if (lowest) return swap_parts<count_bits, true>(values, swaps, first, last);
  swap_parts<count_bits, false>(values, swaps, first, last);
}

// The relabelling on both planes, for the settings first..last of the other bits.
void relabel_range(Planes state, const Swaps& swaps, index_t first, index_t last) {
  for (float* plane : {state.re, state.im}) switch (swaps.count_bits()) {
      case 5: swap_parts<5>(plane, swaps, first, last); break;
      case 4: swap_parts<4>(plane, swaps, first, last); break;
      case 3: swap_parts<3>(plane, swaps, first, last); break;
      case 2: swap_parts<2>(plane, swaps, first, last); break;
      default: swap_parts<1>(plane, swaps, first, last);
    }
}

}  // namespace

void relabel_bits(Planes state, const int64_t* bit_map, int qubits, int parts) {
  const Swaps swaps(bit_map, qubits);
  if (swaps.lows.empty()) return;
  const index_t rests = state.size >> (2 * swaps.lows.size());
  in_parts(parts, [&](int part) {
    relabel_range(state, swaps, share(part, parts, rests, 0), share(part + 1, parts, rests, 0));
  });
}

// The settings of the other bits (the moved ones taken out) that fall in the tile, run by run.
void relabel_tile(Planes state, const int64_t* bit_map, int qubits, index_t window, index_t tile) {
  const Swaps swaps(bit_map, qubits);
  if (swaps.lows.empty()) return;
  index_t moved = 0;
  for (int bit : swaps.moved) moved |= index_t(1) << bit;
  const TileRuns runs(window, moved, qubits);
  runs.each(tile, [&](index_t first) { relabel_range(state, swaps, first, first + runs.length); });
}

bool leaves_alone(const int64_t* bit_map, index_t window) {
  for (int b = 0; b < 64; ++b)
    if ((window >> b) & 1 && bit_map[b] != b) return false;
  return true;
}

}  // namespace qml
