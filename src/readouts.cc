#include "readouts.h"

#include <algorithm>
#include <complex>

namespace qml {
namespace {

constexpr int kSignBits = 8;  // strings of Z take the state in chunks of 2^8 amplitudes, signed through a table

// Strings of Z as a pass reads them in chunks of `width` amplitudes: each string's sign on the bits below
// the width through a table, and on the bits above it (from the chunk's first index). A string on low bits
// only is summed over the chunks' probabilities (or scaled) once at the end; one on high bits only takes
// a chunk's total; the others, a table's dot product per chunk.
struct ZStrings {
  index_t width;
  std::vector<int64_t> signs;
  std::vector<float> table;  // [terms, width]: (-1)^parity(j & signs[t])

  ZStrings(const std::vector<int64_t>& signs, index_t size)
      : width(std::min<index_t>(index_t(1) << kSignBits, size)), signs(signs), table(signs.size() * width) {
    for (size_t t = 0; t < signs.size(); ++t)
      for (index_t j = 0; j < width; ++j) table[t * width + j] = parity(j & signs[t]) ? -1.0f : 1.0f;
  }
  bool low_only(size_t t) const { return signs[t] < width; }
  bool high_only(size_t t) const { return (signs[t] & (width - 1)) == 0; }
  const float* sign(size_t t) const { return &table[t * width]; }
  float high_sign(size_t t, index_t start) const { return parity(start & signs[t]) ? -1.0f : 1.0f; }
};

// <psi|Z_t|psi> for every string, in `parts` parts: per part the probabilities summed by their low bits
// over the chunks, each chunk's total, and the mixed strings' dot products.
std::vector<double> z_expectations(Planes psi, const std::vector<int64_t>& signs, int parts) {
  if (signs.empty()) return {};
  const ZStrings z(signs, psi.size);
  const index_t width = z.width, chunks = psi.size / width;
  std::vector<std::vector<double>> found(parts, std::vector<double>(signs.size() + width, 0.0));
  in_parts(parts, [&](int part) {
    double* totals = found[part].data();
    double* by_low = totals + signs.size();
    std::vector<float> probability(width);
    for (index_t chunk = share(part, parts, chunks, 0); chunk < share(part + 1, parts, chunks, 0); ++chunk) {
      const index_t start = chunk * width;
      const float* re = psi.re + start;
      const float* im = psi.im + start;
      float all = 0.0f;
#pragma omp simd reduction(+ : all)
      for (index_t j = 0; j < width; ++j) {
        probability[j] = re[j] * re[j] + im[j] * im[j];
        all += probability[j];
        by_low[j] += probability[j];
      }
      for (size_t t = 0; t < signs.size(); ++t) {
        if (z.low_only(t)) continue;
        float chunk_total = all;
        if (!z.high_only(t)) {
          const float* sign = z.sign(t);
          chunk_total = 0.0f;
#pragma omp simd reduction(+ : chunk_total)
          for (index_t j = 0; j < width; ++j) chunk_total += sign[j] * probability[j];
        }
        totals[t] += z.high_sign(t, start) * chunk_total;
      }
    }
  });
  std::vector<double> out(signs.size(), 0.0);
  for (const std::vector<double>& f : found)
    for (size_t t = 0; t < signs.size(); ++t) {
      out[t] += f[t];
      if (z.low_only(t))
        for (index_t j = 0; j < width; ++j) out[t] += z.sign(t)[j] * f[signs.size() + j];
    }
  return out;
}

// i^k
std::complex<double> i_power(int64_t k) {
  static const std::complex<double> powers[4] = {{1, 0}, {0, 1}, {-1, 0}, {0, -1}};
  return powers[k % 4];
}

// <psi|P|psi> for the string with X or Y on `flip`'s bits, Y or Z on `signs`' (in double precision).
double pauli_expectation(Planes psi, int64_t flip, int64_t signs, int64_t y_count) {
  double total_re = 0.0, total_im = 0.0;
  for (index_t i = 0; i < psi.size; ++i) {
    const double sign = parity(i & signs) ? -1.0 : 1.0;
    const index_t j = i ^ flip;
    const double ar = psi.re[j], ai = -psi.im[j], br = psi.re[i], bi = psi.im[i];
    total_re += sign * (ar * br - ai * bi);
    total_im += sign * (ar * bi + ai * br);
  }
  return (std::complex<double>(total_re, total_im) * i_power(y_count)).real();
}

// out <- sum_t weights[t] Z_t psi for strings of Z (zeros for none), in one pass in `parts` parts: per
// chunk the strings' signs weighted and summed (the low-only strings' sum made once), then each amplitude
// scaled by it.
void set_z(Planes out, Planes psi, const std::vector<double>& weights, const std::vector<int64_t>& signs,
           int parts) {
  const ZStrings z(signs, psi.size);
  const index_t width = z.width, chunks = psi.size / width;
  std::vector<float> low(width, 0.0f);
  for (size_t t = 0; t < signs.size(); ++t)
    if (z.low_only(t))
      for (index_t j = 0; j < width; ++j) low[j] += static_cast<float>(weights[t]) * z.sign(t)[j];
  in_parts(parts, [&](int part) {
    std::vector<float> scale(width);
    for (index_t chunk = share(part, parts, chunks, 0); chunk < share(part + 1, parts, chunks, 0); ++chunk) {
      const index_t start = chunk * width;
      float high = 0.0f;
      for (size_t t = 0; t < signs.size(); ++t)
        if (z.high_only(t) && !z.low_only(t)) high += z.high_sign(t, start) * static_cast<float>(weights[t]);
      for (index_t j = 0; j < width; ++j) scale[j] = low[j] + high;
      for (size_t t = 0; t < signs.size(); ++t) {
        if (z.low_only(t) || z.high_only(t)) continue;
        const float w = z.high_sign(t, start) * static_cast<float>(weights[t]);
        const float* sign = z.sign(t);
#pragma omp simd
        for (index_t j = 0; j < width; ++j) scale[j] += w * sign[j];
      }
      float* __restrict out_re = out.re + start;
      float* __restrict out_im = out.im + start;
#pragma omp simd
      for (index_t j = 0; j < width; ++j) {
        out_re[j] = scale[j] * psi.re[start + j];
        out_im[j] = scale[j] * psi.im[start + j];
      }
    }
  });
}

// out += weight P psi for the string with X or Y on `flip`'s bits, Y or Z on `signs`'.
void add_pauli(Planes out, Planes psi, double weight, int64_t flip, int64_t signs, int64_t y_count) {
  const std::complex<double> w = weight * i_power(y_count);
  const float wr = static_cast<float>(w.real()), wi = static_cast<float>(w.imag());
  for (index_t i = 0; i < psi.size; ++i) {
    const float sign = parity(i & signs) ? -1.0f : 1.0f;
    out.re[i ^ flip] += sign * (wr * psi.re[i] - wi * psi.im[i]);
    out.im[i ^ flip] += sign * (wr * psi.im[i] + wi * psi.re[i]);
  }
}

}  // namespace

void add_expectations(Planes psi, const Readouts& r, double* out, int parts) {
  std::vector<int64_t> z_signs;
  std::vector<size_t> z_terms;
  for (size_t t = 0; t < r.terms(); ++t) {
    if (r.flip[t] == 0) {
      z_signs.push_back(r.signs[t]);
      z_terms.push_back(t);
    } else {
      out[r.op[t]] += r.coef[t] * pauli_expectation(psi, r.flip[t], r.signs[t], r.y_count[t]);
    }
  }
  const std::vector<double> z = z_expectations(psi, z_signs, parts);
  for (size_t k = 0; k < z_terms.size(); ++k) out[r.op[z_terms[k]]] += r.coef[z_terms[k]] * z[k];
}

void set_observable(Planes lam, Planes psi, const Readouts& r, const double* upstream, int parts) {
  std::vector<int64_t> z_signs;
  std::vector<double> z_weights;
  for (size_t t = 0; t < r.terms(); ++t)
    if (r.flip[t] == 0) {
      z_signs.push_back(r.signs[t]);
      z_weights.push_back(upstream[r.op[t]] * r.coef[t]);
    }
  set_z(lam, psi, z_weights, z_signs, parts);
  for (size_t t = 0; t < r.terms(); ++t)
    if (r.flip[t] != 0) add_pauli(lam, psi, upstream[r.op[t]] * r.coef[t], r.flip[t], r.signs[t], r.y_count[t]);
}

}  // namespace qml
