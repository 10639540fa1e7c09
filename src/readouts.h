// A circuit's readouts: term t adds coef[t] times a Pauli string to readout op[t]; the string has X or Y
// on flip[t]'s bits, Y or Z on signs[t]'s (plan.Readouts).
#pragma once

#include <cstdint>
#include <vector>

#include "state.h"

namespace qml {

struct Readouts {
  std::vector<int64_t> op;
  std::vector<double> coef;
  std::vector<int64_t> flip;
  std::vector<int64_t> signs;
  std::vector<int64_t> y_count;

  size_t terms() const { return op.size(); }
};

// out[k] += <psi|O_k|psi>, O_k the sum of the terms of readout k: strings of Z only in one pass over psi,
// cut into `parts` parts.
void add_expectations(Planes psi, const Readouts& readouts, double* out, int parts);

// lam <- sum_k upstream[k] O_k psi (lam's values before are not read): strings of Z only in one pass, cut
// into `parts` parts.
void set_observable(Planes lam, Planes psi, const Readouts& readouts, const double* upstream, int parts);

}  // namespace qml
