#include "state.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#include <sys/mman.h>

#include "circuit.h"

namespace qml {
namespace {

// A buffer's bytes, and whether its pages are huge.
struct Kind {
  size_t bytes;
  bool huge;
  bool operator==(const Kind& other) const { return bytes == other.bytes && huge == other.huge; }
};

// Every state buffer handed out, by its kind, and the released ones kept for reuse (oldest first).
struct Recycler {
  std::mutex lock;
  std::unordered_map<void*, Kind> kinds;
  std::vector<std::pair<Kind, float*>> kept;
  size_t kept_bytes = 0;

  float* take(Kind kind) {
    for (auto it = kept.rbegin(); it != kept.rend(); ++it)
      if (it->first == kind) {
        float* buffer = it->second;
        kept.erase(std::next(it).base());
        kept_bytes -= kind.bytes;
        return buffer;
      }
    return nullptr;
  }

  void drop_oldest() {
    kinds.erase(kept.front().second);
    kept_bytes -= kept.front().first.bytes;
    std::free(kept.front().second);
    kept.erase(kept.begin());
  }
};

Recycler& recycler() {
  static Recycler* const r = new Recycler;  // never destroyed: numpy may release states at the process's exit
  return *r;
}

}  // namespace

float* allocate_state(int qubits, bool huge_pages) {
  const size_t size = size_t(plane_stride(qubits) + (index_t(1) << qubits)) * sizeof(float);
  const Kind kind{size, huge_pages && size >= kHugePage};
  Recycler& r = recycler();
  {
    std::lock_guard<std::mutex> hold(r.lock);
    if (float* buffer = r.take(kind)) return buffer;
    if (size > kRecycledBytes)  // a large state of another kind or size: the kept ones go back first
      while (!r.kept.empty()) r.drop_oldest();
  }
  const size_t align = size >= kHugePage ? kHugePage : 64;
  float* buffer = static_cast<float*>(std::aligned_alloc(align, size));
  if (!buffer) throw std::bad_alloc();
  if (align == kHugePage) madvise(buffer, size, kind.huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  std::lock_guard<std::mutex> hold(r.lock);
  r.kinds[buffer] = kind;
  return buffer;
}

void release_state(void* buffer) noexcept {
  if (!buffer) return;
  Recycler& r = recycler();
  std::lock_guard<std::mutex> hold(r.lock);
  const Kind kind = r.kinds.at(buffer);
  const size_t keep = std::max(kInFlightStates * kind.bytes, kRecycledBytes);
  while (!r.kept.empty() && r.kept_bytes + kind.bytes > keep) r.drop_oldest();
  r.kept.emplace_back(kind, static_cast<float*>(buffer));
  r.kept_bytes += kind.bytes;
}

namespace {

// What the start gives the chunk at `base` (its bits above `low` fixed): its table (by the setting of the
// table bits), one constant for all its amplitudes, and for each linked bit below `low` the two values its
// setting contributes (its qubit's amplitudes times the diagonal factors linking it to a bit above).
struct ChunkFactors {
  index_t table = 0;
  cdouble scale = 1.0;
  cdouble per_bit[2 * kStartBits];  // [low, 2]
};

ChunkFactors chunk_factors(const Circuit& c, index_t base, int low) {
  ChunkFactors out;
  index_t in_tables = 0;  // the table bits, a mask
  for (size_t k = 0; k < c.start_table_bits.size(); ++k) {
    out.table |= ((base >> c.start_table_bits[k]) & 1) << k;
    in_tables |= index_t(1) << c.start_table_bits[k];
  }
  std::copy(c.start_amplitudes.begin(), c.start_amplitudes.begin() + 2 * low, out.per_bit);
  for (int b = low; b < c.qubits; ++b) out.scale *= c.start_amplitudes[2 * b + ((base >> b) & 1)];
  const size_t phases = c.start_phases.size() / 4;
  for (size_t g = 0; g < phases; ++g) {
    const int hi = static_cast<int>(c.start_phase_bits[2 * g]), lo = static_cast<int>(c.start_phase_bits[2 * g + 1]);
    const cdouble* phase = &c.start_phases[4 * g];
    const int x_hi = (base >> hi) & 1, x_lo = (base >> lo) & 1;
    if (hi >= low && lo >= low) {
      out.scale *= phase[2 * x_hi + x_lo];
    } else if (hi >= low && !((in_tables >> hi) & 1)) {
      out.per_bit[2 * lo] *= phase[2 * x_hi];
      out.per_bit[2 * lo + 1] *= phase[2 * x_hi + 1];
    } else if (lo >= low && !((in_tables >> lo) & 1)) {
      out.per_bit[2 * hi] *= phase[x_lo];
      out.per_bit[2 * hi + 1] *= phase[2 + x_lo];
    }
  }
  return out;
}

// Amplitude j of the chunk times, for each linked bit b, values_b[bit b of j]: the bits' values blended
// arithmetically in registers (32-bit indices, so they convert to floats in one instruction) and multiplied
// together, in one pass over the chunk for all the linked bits (`count` fixed when compiled, so it unrolls).
template <int count>
void scale_by_bits(float* __restrict re, float* __restrict im, int width, const int* bits, const float (*blend)[4]) {
#pragma omp simd
  for (int j = 0; j < width; ++j) {
    float fr = 1.0f, fi = 0.0f;
    for (int k = 0; k < count; ++k) {
      const float on = static_cast<float>((j >> bits[k]) & 1);
      const float vr = blend[k][0] + on * blend[k][2], vi = blend[k][1] + on * blend[k][3];
      const float t = fr * vr - fi * vi;
      fi = fr * vi + fi * vr, fr = t;
    }
    const float x = re[j], y = im[j];
    re[j] = fr * x - fi * y;
    im[j] = fr * y + fi * x;
  }
}

// The chunk times its linked bits' values (`per_bit`), up to four bits a pass.
void scale_by_linked_bits(float* re, float* im, int width, const Circuit& c, const cdouble* per_bit) {
  int bits[kStartBits];
  float blend[kStartBits][4];  // value(k) = (re0 + k dre, im0 + k dim) for the bit's setting k
  int linked = 0;
  for (int b = 0; b < static_cast<int>(c.start_linked.size()); ++b)
    if (c.start_linked[b]) {
      const cdouble v0 = per_bit[2 * b], v1 = per_bit[2 * b + 1];
      bits[linked] = b;
      blend[linked][0] = float(v0.real()), blend[linked][1] = float(v0.imag());
      blend[linked][2] = float(v1.real() - v0.real()), blend[linked][3] = float(v1.imag() - v0.imag());
      ++linked;
    }
  for (int k = 0; k < linked; k += 4) {
    switch (std::min(linked - k, 4)) {
      case 1: scale_by_bits<1>(re, im, width, bits + k, blend + k); break;
      case 2: scale_by_bits<2>(re, im, width, bits + k, blend + k); break;
      case 3: scale_by_bits<3>(re, im, width, bits + k, blend + k); break;
      default: scale_by_bits<4>(re, im, width, bits + k, blend + k);
    }
  }
}

}  // namespace

void write_start_range(Planes psi, const Circuit& c, index_t first, index_t last) {
  const int low = static_cast<int>(c.start_linked.size());
  const index_t width = index_t(1) << low;
  for (index_t base = first; base < last; base += width) {
    const ChunkFactors factors = chunk_factors(c, base, low);
    const float* table_re = c.start_table->data() + 2 * width * factors.table;
    const float* table_im = table_re + width;
    float* __restrict re = psi.re + base;
    float* __restrict im = psi.im + base;
    const float sr = static_cast<float>(factors.scale.real()), si = static_cast<float>(factors.scale.imag());
#pragma omp simd
    for (int j = 0; j < width; ++j) {
      re[j] = sr * table_re[j] - si * table_im[j];
      im[j] = sr * table_im[j] + si * table_re[j];
    }
    scale_by_linked_bits(re, im, static_cast<int>(width), c, factors.per_bit);
  }
}

void write_start(Planes psi, const Circuit& c, int parts) {
  const int low = static_cast<int>(c.start_linked.size());
  const index_t chunks = psi.size >> low;
  in_parts(parts, [&](int part) {
    write_start_range(psi, c, (chunks * part / parts) << low, (chunks * (part + 1) / parts) << low);
  });
}

}  // namespace qml
