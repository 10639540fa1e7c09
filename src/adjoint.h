// The forward pass and the adjoint sweep of a circuit: its state from the start through its segments, the
// readouts' expectations, and the gradient swept back over the blocks.
#pragma once

#include "circuit.h"
#include "readouts.h"
#include "state.h"

namespace qml {

// psi <- the circuit's state at `values`: the start, then each segment (relabelled where the plan says).
void simulate(Planes psi, const Circuit& c, const double* values, int parts);

// grad[s] += d/d values[s] of sum_k upstream[k] <psi|O_k|psi>, `psi` the circuit's state at `values` (as
// simulate leaves it), consumed: the sweep un-applies the blocks from it in place. The sweep collects a
// transition matrix only for blocks with a symbol, un-applies the others from both states, and stops at
// the first block with a symbol (the blocks before it, such as a data encoding, have nothing to
// differentiate).
void sweep_gradient(Planes psi, const Circuit& c, const double* values, const Readouts& readouts,
                    const double* upstream, double* grad, int parts);

}  // namespace qml
