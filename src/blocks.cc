#include "blocks.h"

#include <algorithm>
#include <type_traits>

#include "relabel.h"
#include "tiles.h"

namespace qml {
namespace {

// The first amplitude index of group `group` of a block on (hi, lo): the group's number with zero bits put
// in at hi and lo. The group's four amplitudes are that index plus 0, 2^lo, 2^hi and 2^hi + 2^lo.
inline index_t first_index(index_t group, int hi, int lo) {
  const int small = std::min(hi, lo), big = std::max(hi, lo);
  index_t i = ((group >> small) << (small + 1)) | (group & ((index_t(1) << small) - 1));
  return ((i >> big) << (big + 1)) | (i & ((index_t(1) << big) - 1));
}

// The groups a block acts on, each four amplitudes from its first: first(g), + 2^lo, + 2^hi, + 2^hi + 2^lo.
// Every group of the block: group g is g with zero bits put in at hi and lo.
struct AllGroups {
  int hi, lo;
  index_t count(index_t size) const { return size >> 2; }
  index_t first(index_t group) const { return first_index(group, hi, lo); }
  int lowest_bit() const { return std::min(hi, lo); }
};

// A masked block's groups, only those whose control bits hold their values (the others are never read):
// group g is g with bits put in at hi and lo (zero) and at each control bit (its value).
struct MaskedGroups {
  int hi, lo;
  int bits[64];  // hi, lo and the control bits, ascending
  int inserted = 0;
  index_t value;
  MaskedGroups(int hi, int lo, Mask mask) : hi(hi), lo(lo), value(mask.value) {
    const index_t all = mask.bits | (index_t(1) << hi) | (index_t(1) << lo);
    for (int b = 0; b < 64; ++b)
      if ((all >> b) & 1) bits[inserted++] = b;
  }
  index_t count(index_t size) const { return size >> inserted; }
  index_t first(index_t group) const {
    for (int k = 0; k < inserted; ++k)
      group = ((group >> bits[k]) << (bits[k] + 1)) | (group & ((index_t(1) << bits[k]) - 1));
    return group | value;
  }
  int lowest_bit() const { return bits[0]; }
};

// body(groups) with the block's groups: all, or those `mask` lets through.
template <class Body>
void with_groups(int hi, int lo, Mask mask, Body&& body) {
  if (mask.bits == 0) return body(AllGroups{hi, lo});
  body(MaskedGroups(hi, lo, mask));
}

// a * b + c, fused on the paths whose CPUs have FMA (all but portable).
#ifdef __FMA__
#define QML_FMA(a, b, c) __builtin_fmaf(a, b, c)
#else
#define QML_FMA(a, b, c) ((a) * (b) + (c))
#endif

// Row r of the matrix (mr, mi) times the amplitudes x = (re0, im0, ..., re3, im3), each part a chain of FMAs:
// written as plain sums, the compiler (allowed to reassociate) split them into products and adds, a third
// more instructions, and the block pass took 1.13x the time (one thread, in cache, AVX-512 and AVX2 alike).
#define QML_ROW(r, yr, yi)                                                                                    \
  const float yr = QML_FMA(                                                                                   \
      mr[4 * r + 3], x6,                                                                                      \
      QML_FMA(-mi[4 * r + 3], x7,                                                                             \
              QML_FMA(mr[4 * r + 2], x4,                                                                      \
                      QML_FMA(-mi[4 * r + 2], x5,                                                             \
                              QML_FMA(mr[4 * r + 1], x2,                                                      \
                                      QML_FMA(-mi[4 * r + 1], x3, QML_FMA(mr[4 * r], x0, -mi[4 * r] * x1))))))); \
  const float yi = QML_FMA(                                                                                   \
      mr[4 * r + 3], x7,                                                                                      \
      QML_FMA(mi[4 * r + 3], x6,                                                                              \
              QML_FMA(mr[4 * r + 2], x5,                                                                      \
                      QML_FMA(mi[4 * r + 2], x4,                                                              \
                              QML_FMA(mr[4 * r + 1], x3,                                                      \
                                      QML_FMA(mi[4 * r + 1], x2, QML_FMA(mr[4 * r], x1, mi[4 * r] * x0)))))));

// The matrix applied to `length` consecutive groups of a block whose runs are at least that long: the four
// runs (bits hi, lo) = 00, 01, 10, 11 from `i`, as real and imaginary views.
template <int length>
inline void mix_chunk(float* __restrict r0, float* __restrict i0, float* __restrict r1, float* __restrict i1,
                      float* __restrict r2, float* __restrict i2, float* __restrict r3, float* __restrict i3,
                      const float* __restrict mr, const float* __restrict mi) {
#pragma omp simd
  for (int j = 0; j < length; ++j) {
    const float x0 = r0[j], x1 = i0[j], x2 = r1[j], x3 = i1[j], x4 = r2[j], x5 = i2[j], x6 = r3[j], x7 = i3[j];
    QML_ROW(0, y0, z0)
    QML_ROW(1, y1, z1)
    QML_ROW(2, y2, z2)
    QML_ROW(3, y3, z3)
    r0[j] = y0, i0[j] = z0, r1[j] = y1, i1[j] = z1, r2[j] = y2, i2[j] = z2, r3[j] = y3, i3[j] = z3;
  }
}

// Row r of kThreeMult's form, from the sums s_c = xr_c + xi_c: k = sum mr s (shared by both parts), then
// yr = k - sum (mr + mi) xi and yi = k + sum (mi - mr) xr, each a chain of FMAs.
#define QML_ROW3(r, yr, yi)                                                                                  \
  const float k##r = QML_FMA(mr[4 * r + 3], s3, QML_FMA(mr[4 * r + 2], s2, QML_FMA(mr[4 * r + 1], s1, mr[4 * r] * s0))); \
  const float yr = QML_FMA(ns[4 * r + 3], x7, QML_FMA(ns[4 * r + 2], x5, QML_FMA(ns[4 * r + 1], x3, QML_FMA(ns[4 * r], x1, k##r)))); \
  const float yi = QML_FMA(md[4 * r + 3], x6, QML_FMA(md[4 * r + 2], x4, QML_FMA(md[4 * r + 1], x2, QML_FMA(md[4 * r], x0, k##r))));

// mix_chunk in kThreeMult's form: 12 FMAs a row instead of 16, and four adds a group.
template <int length>
inline void mix_chunk3(float* __restrict r0, float* __restrict i0, float* __restrict r1, float* __restrict i1,
                       float* __restrict r2, float* __restrict i2, float* __restrict r3, float* __restrict i3,
                       const float* __restrict mr, const float* __restrict ns, const float* __restrict md) {
#pragma omp simd
  for (int j = 0; j < length; ++j) {
    const float x0 = r0[j], x1 = i0[j], x2 = r1[j], x3 = i1[j], x4 = r2[j], x5 = i2[j], x6 = r3[j], x7 = i3[j];
    const float s0 = x0 + x1, s1 = x2 + x3, s2 = x4 + x5, s3 = x6 + x7;
    QML_ROW3(0, y0, z0)
    QML_ROW3(1, y1, z1)
    QML_ROW3(2, y2, z2)
    QML_ROW3(3, y3, z3)
    r0[j] = y0, i0[j] = z0, r1[j] = y1, i1[j] = z1, r2[j] = y2, i2[j] = z2, r3[j] = y3, i3[j] = z3;
  }
}

// A chunk's eight views: re, im of the runs 00, 01, 10, 11 of a block from amplitude i.
struct Views {
  float* v[8];
  Views(Planes s, index_t i, index_t d_lo, index_t d_hi) {
    const index_t at[4] = {i, i + d_lo, i + d_hi, i + d_hi + d_lo};
    for (int k = 0; k < 4; ++k) v[2 * k] = s.re + at[k], v[2 * k + 1] = s.im + at[k];
  }
};

template <int length>
inline void mix_views(const Views& w, const Scalars& m) {
  if (m.form == Form::kThreeMult)
    return mix_chunk3<length>(w.v[0], w.v[1], w.v[2], w.v[3], w.v[4], w.v[5], w.v[6], w.v[7], m.r, m.neg_sum, m.diff);
  mix_chunk<length>(w.v[0], w.v[1], w.v[2], w.v[3], w.v[4], w.v[5], w.v[6], w.v[7], m.r, m.i);
}

// total[r] += sum_j p_r[j] conj(q_c[j]) for c = 0..3, summed over the chunk in float32.
template <int length>
inline void add_transition(Totals& total, const Views& p, const Views& q) {
  const float* __restrict q0 = q.v[0];
  const float* __restrict q1 = q.v[1];
  const float* __restrict q2 = q.v[2];
  const float* __restrict q3 = q.v[3];
  const float* __restrict q4 = q.v[4];
  const float* __restrict q5 = q.v[5];
  const float* __restrict q6 = q.v[6];
  const float* __restrict q7 = q.v[7];
  for (int r = 0; r < 4; ++r) {
    const float* __restrict pr = p.v[2 * r];
    const float* __restrict pi = p.v[2 * r + 1];
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3, s4, s5, s6, s7)
    for (int j = 0; j < length; ++j) {
      const float a = pr[j], b = pi[j];
      s0 += a * q0[j] + b * q1[j];
      s1 += b * q0[j] - a * q1[j];
      s2 += a * q2[j] + b * q3[j];
      s3 += b * q2[j] - a * q3[j];
      s4 += a * q4[j] + b * q5[j];
      s5 += b * q4[j] - a * q5[j];
      s6 += a * q6[j] + b * q7[j];
      s7 += b * q6[j] - a * q7[j];
    }
    const float s[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
    for (int k = 0; k < 8; ++k) total[r][k] += s[k];
  }
}

// Groups first..last of a block whose lowest bit (of its pair and mask) is at least log2(length), `length` at
// a time (consecutive groups of a run are consecutive amplitudes); `length` fixed when compiled, so each chunk
// vectorises whole.
template <int length, class Groups>
void apply_chunks(Planes s, const Scalars& m, const Groups& g, index_t first, index_t last) {
  const index_t d_lo = index_t(1) << g.lo, d_hi = index_t(1) << g.hi;
  for (index_t group = first; group < last; group += length) mix_views<length>(Views(s, g.first(group), d_lo, d_hi), m);
}

template <int length, class Groups>
void unapply_chunks(Planes psi, Planes lam, const Scalars& m, const Groups& g, Totals& total, index_t first,
                    index_t last) {
  const index_t d_lo = index_t(1) << g.lo, d_hi = index_t(1) << g.hi;
  for (index_t group = first; group < last; group += length) {
    const index_t i = g.first(group);
    const Views p(psi, i, d_lo, d_hi), q(lam, i, d_lo, d_hi);
    mix_views<length>(p, m);
    mix_views<length>(q, m);
    add_transition<length>(total, p, q);
  }
}

// The matrix on one group of four scattered amplitudes; returns them after, as (re, im) pairs.
inline void mix_group(Planes s, const index_t at[4], const Scalars& m, float y[8]) {
  const float* mr = m.r;
  const float* mi = m.i;
  const float x0 = s.re[at[0]], x1 = s.im[at[0]], x2 = s.re[at[1]], x3 = s.im[at[1]];
  const float x4 = s.re[at[2]], x5 = s.im[at[2]], x6 = s.re[at[3]], x7 = s.im[at[3]];
  QML_ROW(0, y0, z0)
  QML_ROW(1, y1, z1)
  QML_ROW(2, y2, z2)
  QML_ROW(3, y3, z3)
  const float out[8] = {y0, z0, y1, z1, y2, z2, y3, z3};
  for (int k = 0; k < 4; ++k) {
    s.re[at[k]] = y[2 * k] = out[2 * k];
    s.im[at[k]] = y[2 * k + 1] = out[2 * k + 1];
  }
}

template <class Groups>
inline void group_at(const Groups& g, index_t group, index_t at[4]) {
  at[0] = g.first(group);
  at[1] = at[0] + (index_t(1) << g.lo);
  at[2] = at[0] + (index_t(1) << g.hi);
  at[3] = at[2] + (index_t(1) << g.lo);
}

// Groups first..last of a block on low bits, each gathered from four scattered amplitudes.
template <class Groups>
void apply_groups(Planes s, const Scalars& m, const Groups& g, index_t first, index_t last) {
  index_t at[4];
  float y[8];
  for (index_t group = first; group < last; ++group) {
    group_at(g, group, at);
    mix_group(s, at, m, y);
  }
}

template <class Groups>
void unapply_groups(Planes psi, Planes lam, const Scalars& m, const Groups& g, Totals& total, index_t first,
                    index_t last) {
  Totals acc{};
  index_t at[4];
  float p[8], q[8];
  for (index_t group = first; group < last; ++group) {
    group_at(g, group, at);
    mix_group(psi, at, m, p);
    mix_group(lam, at, m, q);
    for (int r = 0; r < 4; ++r) {
      const double a = p[2 * r], b = p[2 * r + 1];
      for (int c = 0; c < 4; ++c) {
        acc[r][2 * c] += a * q[2 * c] + b * q[2 * c + 1];
        acc[r][2 * c + 1] += b * q[2 * c] - a * q[2 * c + 1];
      }
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int k = 0; k < 8; ++k) total[r][k] += acc[r][k];
}

// chunks(length) with the longest chunk length (a std::integral_constant) the block's runs allow (from its
// lowest bit), or groups() for a block on the bits below the chunks.
template <class Chunks, class Groups>
void by_run_length(int lowest_bit, Chunks&& chunks, Groups&& groups) {
  switch (std::min(lowest_bit, kChunkBits)) {
    case kChunkBits: return chunks(std::integral_constant<int, 256>{});
    case 7: return chunks(std::integral_constant<int, 128>{});
    case 6: return chunks(std::integral_constant<int, 64>{});
    case 5: return chunks(std::integral_constant<int, 32>{});
    case 4: return chunks(std::integral_constant<int, 16>{});
    default: return groups();
  }
}

// The matrix on the block's groups first..last.
template <class Groups>
void apply_range(Planes s, const Scalars& m, const Groups& g, index_t first, index_t last) {
  by_run_length(
      g.lowest_bit(), [&](auto length) { apply_chunks<decltype(length)::value>(s, m, g, first, last); },
      [&] { apply_groups(s, m, g, first, last); });
}

// apply_range on both states, adding their transition sums to `total`.
template <class Groups>
void unapply_range(Planes psi, Planes lam, const Scalars& m, const Groups& g, Totals& total, index_t first,
                   index_t last) {
  by_run_length(
      g.lowest_bit(), [&](auto length) { unapply_chunks<decltype(length)::value>(psi, lam, m, g, total, first, last); },
      [&] { unapply_groups(psi, lam, m, g, total, first, last); });
}

Totals sum(const std::vector<Totals>& parts) {
  Totals out{};
  for (const Totals& t : parts)
    for (int r = 0; r < 4; ++r)
      for (int k = 0; k < 8; ++k) out[r][k] += t[r][k];
  return out;
}

// Block k's groups in a tile of the window's: runs of consecutive groups.
TileRuns block_runs(const Circuit& c, index_t window, int k) {
  return TileRuns(window, (index_t(1) << c.hi(k)) | (index_t(1) << c.lo(k)), c.qubits);
}

// body(first, last) over the run's groups run..run + length, a slice of 2^kChunkBits at a time, then
// `ahead` told of them (with `ahead`: the next tile fetched as the slices go; without, the run in one call).
template <class Body>
void in_slices(index_t run, index_t length, TileAhead* ahead, Body&& body) {
  if (!ahead) return body(run, run + length);
  const index_t slice = std::min(length, index_t(1) << kChunkBits);
  for (index_t first = run; first < run + length; first += slice) {
    body(first, first + slice);
    ahead->advance(slice);
  }
}

// The groups a segment of `blocks` blocks works on in a tile of the window's: a quarter of the tile's amplitudes
// each.
index_t tile_work(int qubits, index_t window, int blocks) {
  return ((index_t(1) << (qubits - __builtin_popcountll(window))) >> 2) * blocks;
}

// The start written on a tile: its runs of amplitudes (at least 2^kStartBits each).
void write_start_tile(Planes state, const Circuit& c, index_t window, index_t tile) {
  const TileRuns runs(window, 0, c.qubits);
  runs.each(tile, [&](index_t first) { write_start_range(state, c, first, first + runs.length); });
}

}  // namespace

void apply_block(Planes state, const Mat4& u, int hi, int lo, int parts, Mask mask, Form form) {
  const Scalars m = scalars(u, form);
  with_groups(hi, lo, mask, [&](const auto& g) {
    const index_t groups = g.count(state.size);
    in_parts(parts, [&](int part) {
      apply_range(state, m, g, share(part, parts, groups, kChunkBits), share(part + 1, parts, groups, kChunkBits));
    });
  });
}

Mat4 unapply_with_transition(Planes psi, Planes lam, const Mat4& u, int hi, int lo, int parts, Mask mask,
                             Form form) {
  const Mat4 ud = dagger(u);
  const Scalars m = scalars(ud, form);
  std::vector<Totals> totals(parts, Totals{});
  with_groups(hi, lo, mask, [&](const auto& g) {
    const index_t groups = g.count(psi.size);
    in_parts(parts, [&](int part) {
      unapply_range(psi, lam, m, g, totals[part], share(part, parts, groups, kChunkBits),
                    share(part + 1, parts, groups, kChunkBits));
    });
  });
  return transition(sum(totals), ud);  // summed against lam after the step, lam_after = u^dagger lam_before
}

void apply_segment(Planes state, const Circuit& c, const std::vector<Mat4>& blocks, int s, int parts, bool start,
                   const int64_t* relabel) {
  const int b = static_cast<int>(c.segments[s]), e = static_cast<int>(c.segments[s + 1]);
  const index_t window = c.windows[s];
  if (e - b == 1) {
    if (start) write_start(state, c, parts);
    return apply_block(state, blocks[b], c.hi(b), c.lo(b), parts, c.mask(b), c.form);
  }
  std::vector<Scalars> m;
  for (int k = b; k < e; ++k) m.push_back(scalars(blocks[k], c.form));
  std::vector<TileRuns> runs;
  for (int k = b; k < e; ++k) runs.push_back(block_runs(c, window, k));
  const index_t tiles = tile_count(window);
  in_parts(parts, [&](int part) {
    const index_t last = share(part + 1, parts, tiles, 0);
    for (index_t tile = share(part, parts, tiles, 0); tile < last; ++tile) {
      TileAhead next({state}, window, c.qubits, tile + 1, tile_work(c.qubits, window, e - b));
      TileAhead* ahead = c.prefetch && !start && tile + 1 < last ? &next : nullptr;
      if (relabel) relabel_tile(state, relabel, c.qubits, window, tile);
      if (start) write_start_tile(state, c, window, tile);
      for (int k = b; k < e; ++k) {
        const AllGroups g{c.hi(k), c.lo(k)};
        runs[k - b].each(tile, [&](index_t run) {
          in_slices(run, runs[k - b].length, ahead,
                    [&](index_t first, index_t end) { apply_range(state, m[k - b], g, first, end); });
        });
      }
    }
  });
}

std::vector<Mat4> unapply_segment(Planes psi, Planes lam, const Circuit& c, const std::vector<Mat4>& blocks,
                                  const std::vector<bool>& symbolic, int b, int e, index_t window, int parts,
                                  const int64_t* relabel) {
  std::vector<Mat4> daggers;
  std::vector<Scalars> m;
  std::vector<TileRuns> runs;
  for (int k = b; k < e; ++k) {
    daggers.push_back(dagger(blocks[k]));
    m.push_back(scalars(daggers.back(), c.form));
    runs.push_back(block_runs(c, window, k));
  }
  const index_t tiles = tile_count(window);
  std::vector<std::vector<Totals>> totals(e - b, std::vector<Totals>(parts, Totals{}));  // [block][part]
  in_parts(parts, [&](int part) {
    const index_t last = share(part + 1, parts, tiles, 0);
    for (index_t tile = share(part, parts, tiles, 0); tile < last; ++tile) {
      TileAhead next({psi, lam}, window, c.qubits, tile + 1, tile_work(c.qubits, window, e - b));
      TileAhead* ahead = c.prefetch && tile + 1 < last ? &next : nullptr;
      for (int k = e - 1; k >= b; --k) {
        const AllGroups g{c.hi(k), c.lo(k)};
        runs[k - b].each(tile, [&](index_t run) {
          in_slices(run, runs[k - b].length, ahead, [&](index_t first, index_t end) {
            if (symbolic[k]) {
              unapply_range(psi, lam, m[k - b], g, totals[k - b][part], first, end);
            } else {
              apply_range(psi, m[k - b], g, first, end);
              apply_range(lam, m[k - b], g, first, end);
            }
          });
        });
      }
      if (relabel)
        for (Planes state : {psi, lam}) relabel_tile(state, relabel, c.qubits, window, tile);
    }
  });
  std::vector<Mat4> out(e - b);
  for (int k = 0; k < e - b; ++k) out[k] = transition(sum(totals[k]), daggers[k]);
  return out;
}

}  // namespace qml
