#include "circuit.h"

#include <cmath>

namespace qml {

Mat4 factor_matrix(const Circuit& c, int f, const double* values, bool derivative) {
  const int64_t s = c.symbol[f];
  const double exponent = c.constant[f] + (s >= 0 ? c.coef[f] * values[s] : 0.0);
  const double* eig = &c.kind_eig[4 * c.kind[f]];
  const cdouble* proj = &c.kind_proj[64 * c.kind[f]];
  Mat4 out{};
  for (int k = 0; k < 4; ++k) {
    cdouble phase = std::polar(1.0, M_PI * exponent * eig[k]);
    if (derivative) phase *= cdouble(0.0, M_PI * eig[k]);
    for (int e = 0; e < 16; ++e) out[e] += phase * proj[16 * k + e];
  }
  return out;
}

Unitaries block_unitaries(const Circuit& c, const double* values) {
  Unitaries u{std::vector<Mat4>(c.kind.size()), std::vector<Mat4>(c.blocks())};
  for (int b = 0; b < c.blocks(); ++b) {
    Mat4 product = identity();
    for (int64_t f = c.block_start[b]; f < c.block_start[b + 1]; ++f) {
      u.factors[f] = factor_matrix(c, static_cast<int>(f), values, false);
      product = u.factors[f] * product;
    }
    u.blocks[b] = product;
  }
  return u;
}

std::vector<bool> with_symbols(const Circuit& c) {
  std::vector<bool> out(c.blocks(), false);
  for (int b = 0; b < c.blocks(); ++b)
    for (int64_t f = c.block_start[b]; f < c.block_start[b + 1]; ++f) out[b] = out[b] || c.symbol[f] >= 0;
  return out;
}

}  // namespace qml
