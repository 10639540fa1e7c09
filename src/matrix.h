// 4x4 complex matrices of a block (double precision), and the float32 scalars the passes use.
#pragma once

#include <array>
#include <complex>

namespace qml {

using cdouble = std::complex<double>;

// A block's unitary on bits (hi, lo), row-major, its basis index 2 * bit(hi) + bit(lo).
using Mat4 = std::array<cdouble, 16>;

inline Mat4 identity() {
  Mat4 m{};
  for (int k = 0; k < 4; ++k) m[5 * k] = 1.0;
  return m;
}

inline Mat4 operator*(const Mat4& a, const Mat4& b) {
  Mat4 out{};
  for (int r = 0; r < 4; ++r)
    for (int k = 0; k < 4; ++k)
      for (int c = 0; c < 4; ++c) out[4 * r + c] += a[4 * r + k] * b[4 * k + c];
  return out;
}

inline Mat4 dagger(const Mat4& a) {
  Mat4 out;
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) out[4 * r + c] = std::conj(a[4 * c + r]);
  return out;
}

inline double real_trace(const Mat4& a) { return a[0].real() + a[5].real() + a[10].real() + a[15].real(); }

// How a pass multiplies a block's matrix into its amplitudes (a choice the planner measures per CPU):
// kFourMult, each complex product as four real multiply-adds; kThreeMult, three, the fourth traded for an
// add per amplitude: yr = sum mr (xr + xi) - (mr + mi) xi, yi = sum mr (xr + xi) + (mi - mr) xr, 12 FMAs a row
// instead of 16 (docs/kernel-notes.md#blocks-and-chunks).
enum class Form : int { kFourMult = 0, kThreeMult = 1 };

// A matrix as the passes read it: real and imaginary parts, row-major, in float32; and for kThreeMult the
// negated sums -(mr + mi) and the differences mi - mr.
struct Scalars {
  float r[16];
  float i[16];
  float neg_sum[16];
  float diff[16];
  Form form;
};

inline Scalars scalars(const Mat4& u, Form form) {
  Scalars s;
  for (int k = 0; k < 16; ++k) {
    s.r[k] = static_cast<float>(u[k].real());
    s.i[k] = static_cast<float>(u[k].imag());
    s.neg_sum[k] = static_cast<float>(-(u[k].real() + u[k].imag()));
    s.diff[k] = static_cast<float>(u[k].imag() - u[k].real());
  }
  s.form = form;
  return s;
}

// Transition sums of one block: total[r][2c], total[r][2c + 1] = re, im of sum psi_r conj(lam_c).
using Totals = std::array<std::array<double, 8>, 4>;

// Totals as a complex matrix times `right`.
inline Mat4 transition(const Totals& t, const Mat4& right) {
  Mat4 m;
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) m[4 * r + c] = cdouble(t[r][2 * c], t[r][2 * c + 1]);
  return m * right;
}

}  // namespace qml
