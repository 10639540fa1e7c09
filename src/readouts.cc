#include "readouts.h"

#include <algorithm>
#include <complex>

namespace qml {
namespace {

constexpr int kSignBits = 8;  // strings of Z take the state in chunks of 2^8 amplitudes, signed through a table

// [terms, width]: (-1)^parity(j & signs[t]), the sign of string t on the bits below the chunk's width.
std::vector<float> sign_table(const std::vector<int64_t>& signs, index_t width) {
  std::vector<float> table(signs.size() * width);
  for (size_t t = 0; t < signs.size(); ++t)
    for (index_t j = 0; j < width; ++j) table[t * width + j] = parity(j & signs[t]) ? -1.0f : 1.0f;
  return table;
}

// <psi| Z_t |psi> for every string: per chunk, each string's low-bit signs dotted with the probabilities,
// times the sign of its bits above the chunk.
std::vector<double> z_expectations(Planes psi, const std::vector<int64_t>& signs) {
  if (signs.empty()) return {};
  const index_t width = std::min<index_t>(index_t(1) << kSignBits, psi.size);
  const std::vector<float> table = sign_table(signs, width);
  std::vector<float> probability(width);
  std::vector<double> totals(signs.size(), 0.0);
  for (index_t start = 0; start < psi.size; start += width) {
    const float* re = psi.re + start;
    const float* im = psi.im + start;
#pragma omp simd
    for (index_t j = 0; j < width; ++j) probability[j] = re[j] * re[j] + im[j] * im[j];
    for (size_t t = 0; t < signs.size(); ++t) {
      const float* sign = &table[t * width];
      float chunk = 0.0f;
#pragma omp simd reduction(+ : chunk)
      for (index_t j = 0; j < width; ++j) chunk += sign[j] * probability[j];
      totals[t] += parity(start & signs[t]) ? -chunk : chunk;
    }
  }
  return totals;
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

// out += sum_t weights[t] Z_t psi for strings of Z, in one pass: per chunk the weighted sum of the
// strings' signs, then each amplitude scaled by it.
void add_z(Planes out, Planes psi, const std::vector<double>& weights, const std::vector<int64_t>& signs) {
  if (signs.empty()) return;
  const index_t width = std::min<index_t>(index_t(1) << kSignBits, psi.size);
  const std::vector<float> table = sign_table(signs, width);
  std::vector<float> scale(width);
  for (index_t start = 0; start < psi.size; start += width) {
    std::fill(scale.begin(), scale.end(), 0.0f);
    for (size_t t = 0; t < signs.size(); ++t) {
      const float w = static_cast<float>(parity(start & signs[t]) ? -weights[t] : weights[t]);
      const float* sign = &table[t * width];
#pragma omp simd
      for (index_t j = 0; j < width; ++j) scale[j] += w * sign[j];
    }
#pragma omp simd
    for (index_t j = 0; j < width; ++j) {
      out.re[start + j] += scale[j] * psi.re[start + j];
      out.im[start + j] += scale[j] * psi.im[start + j];
    }
  }
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

void add_expectations(Planes psi, const Readouts& r, double* out) {
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
  const std::vector<double> z = z_expectations(psi, z_signs);
  for (size_t k = 0; k < z_terms.size(); ++k) out[r.op[z_terms[k]]] += r.coef[z_terms[k]] * z[k];
}

void add_observable(Planes lam, Planes psi, const Readouts& r, const double* upstream) {
  std::vector<int64_t> z_signs;
  std::vector<double> z_weights;
  for (size_t t = 0; t < r.terms(); ++t) {
    const double weight = upstream[r.op[t]] * r.coef[t];
    if (r.flip[t] == 0) {
      z_signs.push_back(r.signs[t]);
      z_weights.push_back(weight);
    } else {
      add_pauli(lam, psi, weight, r.flip[t], r.signs[t], r.y_count[t]);
    }
  }
  add_z(lam, psi, z_weights, z_signs);
}

}  // namespace qml
