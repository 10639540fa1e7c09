// A circuit as the plan (qml_ray/gradients/plan/) lays it out: blocks on bit pairs, each a product of
// factors U(e) = sum_k exp(i pi e h_k) P_k with e = const + coef * values[symbol]; relabellings; segments;
// the start. Field names and shapes are plan.Circuit's. A masked block (a gate with more controls) acts only on the
// amplitudes whose control bits hold the control values.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "matrix.h"

namespace qml {

// A block's controls: it acts where index & bits == value (no bits: everywhere).
struct Mask {
  int64_t bits = 0;
  int64_t value = 0;
};

struct Circuit {
  int qubits = 0;
  std::vector<int64_t> block_qubits;  // [blocks, 2]: (hi, lo)
  std::vector<int64_t> block_mask;    // [blocks]: Mask::bits
  std::vector<int64_t> block_mask_value;  // [blocks]: Mask::value
  std::vector<int64_t> relabel;       // [blocks]: row of bit_maps applied before the block, or -1
  std::vector<int64_t> bit_maps;      // [relabellings, qubits]
  std::vector<int64_t> segments;      // [segments + 1]
  std::vector<int64_t> windows;       // [segments]: the bits a segment's tiles fix, a mask (0: one block)
  std::vector<int64_t> block_start;   // [blocks + 1]
  std::vector<int64_t> kind;          // [factors]
  std::vector<int64_t> symbol;        // [factors], -1 for a constant
  std::vector<double> coef;           // [factors]
  std::vector<double> constant;       // [factors] (plan.Circuit's const)
  std::vector<double> kind_eig;       // [kinds, 4]
  std::vector<cdouble> kind_proj;     // [kinds, 4, 4, 4]
  std::vector<cdouble> start_amplitudes;  // [qubits, 2]
  std::vector<int64_t> start_phase_bits;  // [phases, 2]
  std::vector<cdouble> start_phases;      // [phases, 4]
  std::vector<uint8_t> start_linked;      // [low]
  std::vector<int64_t> start_table_bits;  // [table bits]
  std::shared_ptr<const std::vector<float>> start_table;  // [2^table bits, 2, 2^low], shared (start_table_of)
  Form form = Form::kFourMult;            // how the passes multiply a block's matrix in (plan.Circuit's form)
  bool prefetch = false;                  // whether a segment fetches its next tile while on one (TileAhead)
  bool huge_pages = true;                 // whether its states (from 2 MiB) ask for transparent huge pages

  int blocks() const { return static_cast<int>(relabel.size()); }
  int hi(int b) const { return static_cast<int>(block_qubits[2 * b]); }
  int lo(int b) const { return static_cast<int>(block_qubits[2 * b + 1]); }
  Mask mask(int b) const { return {block_mask[b], block_mask_value[b]}; }
  int segment_count() const { return static_cast<int>(segments.size()) - 1; }
  const int64_t* bit_map(int r) const { return bit_maps.data() + static_cast<size_t>(r) * qubits; }
};

// Factor f's matrix at `values`, or with `derivative` its d/de.
Mat4 factor_matrix(const Circuit& c, int f, const double* values, bool derivative);

// Each factor's matrix, and each block's product of its factors (later factors on the left).
struct Unitaries {
  std::vector<Mat4> factors;
  std::vector<Mat4> blocks;
};
Unitaries block_unitaries(const Circuit& c, const double* values);

// Whether each block has a factor with a symbol.
std::vector<bool> with_symbols(const Circuit& c);

}  // namespace qml
