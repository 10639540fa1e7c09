// A segment's tiles: the amplitudes that share the values of the segment's window, a set of bits (a mask) that
// none of its blocks touch. Tile t is the amplitudes whose window bits read t.
#pragma once

#include <initializer_list>

#include "state.h"

namespace qml {

// `value`'s bits put in turn at the bits of `mask` (as x86's pdep).
inline index_t deposit_bits(index_t value, index_t mask) {
  index_t out = 0;
  for (; mask; mask &= mask - 1, value >>= 1) out |= (value & 1) ? (mask & -mask) : 0;
  return out;
}

// `mask` as it reads in indices with the bits `removed` taken out (its bits among the others, closed up).
inline index_t without_bits_of(index_t mask, index_t removed) {
  index_t out = 0;
  for (; mask; mask &= mask - 1) {
    const index_t bit = mask & -mask;
    out |= bit >> __builtin_popcountll(removed & (bit - 1));
  }
  return out;
}

inline index_t tile_count(index_t window) { return index_t(1) << __builtin_popcountll(window); }

// A tile in a space of indices with some bits of an amplitude's index taken out (a block's pair: its groups; a
// relabelling's moved bits; none: the amplitudes): runs of `length` consecutive indices, 2^(the window's
// lowest bit there), one from each setting of the tile's bits above them.
struct TileRuns {
  index_t window, above, length;
  TileRuns(index_t window_bits, index_t removed, int qubits) {
    const index_t all = without_bits_of((index_t(1) << qubits) - 1 - removed, removed);
    window = without_bits_of(window_bits, removed);
    length = window & -window;
    above = all & ~window & ~(length - 1);
  }
  // run(first) for each run of tile `tile`, in order.
  template <class Run>
  void each(index_t tile, Run&& run) const {
    const index_t at = deposit_bits(tile, window);
    index_t x = 0;
    do run(at | x);
    while ((x = (x - above) & above) != 0);
  }
};

// The next tile of one or two states fetched into the cache line by line (prefetchw), spread evenly over the
// work a segment does on the tile before it, so that the segment's pass over memory overlaps its arithmetic
// instead of following it. `work`: the units of work (groups) the segment does on a tile; `advance(done)`
// after each `done` of them fetches the lines due by then, a line of each plane in turn.
class TileAhead {
 public:
  TileAhead(std::initializer_list<Planes> states, index_t window, int qubits, index_t tile, index_t work)
      : runs_(window, 0, qubits), at_(deposit_bits(tile, runs_.window)), work_(work) {
    for (const Planes& s : states) planes_[count_++] = s.re, planes_[count_++] = s.im;
    lines_ = index_t(count_) << (qubits - __builtin_popcountll(window) - kLineBits);
  }

  void advance(index_t done) {
    done_ += done;
    for (const index_t due = lines_ * done_ / work_; next_ < due; ++next_) {
      const index_t amplitude = (next_ / count_) << kLineBits;
      const index_t run = amplitude / runs_.length, within = amplitude % runs_.length;
      __builtin_prefetch(planes_[next_ % count_] + (at_ | deposit_bits(run, runs_.above)) + within, 1, 2);
    }
  }

 private:
  static constexpr int kLineBits = 4;  // 16 floats, 64 bytes, a cache line
  TileRuns runs_;
  index_t at_, work_, lines_ = 0, done_ = 0, next_ = 0;
  const float* planes_[4];
  int count_ = 0;
};

}  // namespace qml
