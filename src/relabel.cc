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

// Eight rows of eight floats, as one vector each (one AVX register; two SSE registers on the portable path).
using Row8 = float __attribute__((vector_size(32)));

// r <- its transpose, in three rounds of shuffles (pairs of rows, then fours, then halves).
inline void transpose8(Row8 r[8]) {
  Row8 a[8], b[8];
  for (int k = 0; k < 8; k += 2) {
    a[k] = __builtin_shufflevector(r[k], r[k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    a[k + 1] = __builtin_shufflevector(r[k], r[k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int k = 0; k < 8; k += 4)
    for (int h = 0; h < 2; ++h) {
      b[k + 2 * h] = __builtin_shufflevector(a[k + h], a[k + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      b[k + 2 * h + 1] = __builtin_shufflevector(a[k + h], a[k + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  for (int k = 0; k < 4; ++k) {
    r[k] = __builtin_shufflevector(b[k], b[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    r[k + 4] = __builtin_shufflevector(b[k], b[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

// The 8x8 block of rows `rows` (each a pointer to 8 floats) read, transposed.
inline void load_transposed(float* const rows[8], Row8 r[8]) {
  for (int k = 0; k < 8; ++k) __builtin_memcpy(&r[k], rows[k], sizeof(Row8));
  transpose8(r);
}

inline void store(float* const rows[8], const Row8 r[8]) {
  for (int k = 0; k < 8; ++k) __builtin_memcpy(rows[k], &r[k], sizeof(Row8));
}

// swap_parts when the low bits are bits 0..count_bits - 1 (count_bits >= 3): each rest's count x count tile
// (row t at base + at_high[t], its columns consecutive) transposed in place by 8x8 blocks through registers,
// block (x, y) swapped with block (y, x).
template <int count_bits>
void swap_rows(float* values, const Swaps& swaps, index_t first, index_t last) {
  constexpr int count = 1 << count_bits;
  const index_t* at_high = swaps.at_high;
  for (index_t rest = first; rest < last; ++rest) {
    float* const base = values + without_bits(rest, swaps.moved);
    for (int x = 0; x < count; x += 8)
      for (int y = x; y < count; y += 8) {
        float *at_xy[8], *at_yx[8];
        for (int k = 0; k < 8; ++k) at_xy[k] = base + at_high[x + k] + y, at_yx[k] = base + at_high[y + k] + x;
        Row8 xy[8], yx[8];
        load_transposed(at_xy, xy);
        if (x == y) {
          store(at_xy, xy);
          continue;
        }
        load_transposed(at_yx, yx);
        store(at_yx, xy);
        store(at_xy, yx);
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

// The settings of the other bits (the moved ones taken out) that fall in the tile: runs of 2^w consecutive
// ones, w the window's first bit among them.
void relabel_tile(Planes state, const int64_t* bit_map, int qubits, int window, int fixed, index_t tile) {
  const Swaps swaps(bit_map, qubits);
  if (swaps.lows.empty()) return;
  int w = window;
  for (size_t k = 0; k < swaps.lows.size(); ++k) w -= (swaps.lows[k] < window) + (swaps.highs[k] < window);
  const int others = qubits - 2 * static_cast<int>(swaps.lows.size());
  for (index_t high = 0; high < index_t(1) << (others - w - fixed); ++high) {
    const index_t first = (high << (w + fixed)) | (tile << w);
    relabel_range(state, swaps, first, first + (index_t(1) << w));
  }
}

bool leaves_alone(const int64_t* bit_map, int window, int fixed) {
  for (int b = window; b < window + fixed; ++b)
    if (bit_map[b] != b) return false;
  return true;
}

}  // namespace qml
