// A state of n qubits: 2^n complex64 amplitudes held as two float32 planes (real, imaginary), so loops
// over contiguous runs vectorise; qubit q is bit q of an amplitude's index. Passes over a state can be
// cut into `parts` that OpenMP threads run side by side.
#pragma once

#include <cstdint>
#include <cstddef>
#include <memory>

namespace qml {

struct Circuit;

using index_t = int64_t;

constexpr int kMinQubits = 5;   // states are padded to this many qubits (a whole number of group steps)
constexpr int kStartBits = 10;  // the start state is written in chunks of 2^10 amplitudes
constexpr size_t kHugePage = size_t(1) << 21;  // a transparent huge page, 2 MiB

struct Planes {
  float* re;
  float* im;
  index_t size;  // amplitudes per plane
};

// Floats from a state's real plane to its imaginary one: 2^qubits, and from 2 MiB states on a gap of
// kPlaneGap more, so that an amplitude's two parts are never a large power of two apart. On AMD's Zen cores
// lines whose addresses differ only from bit 28 up share an L1 way's micro-tag and evict each other: with the
// planes 2^26 floats apart (26 qubits) a pass over a tile in cache took 2x-9x as long. The gap's odd 2 KiB puts
// the planes' runs in the two halves of the L1's sets (docs/kernel-notes.md#the-state-two-planes).
constexpr index_t kPlaneGap = (index_t(1) << 14) + (index_t(1) << 9);  // 66 KiB
inline index_t plane_stride(int qubits) {
  const index_t size = index_t(1) << qubits;
  return size * 2 * index_t(sizeof(float)) >= index_t(kHugePage) ? size + kPlaneGap : size;
}

// Both planes of 2^qubits amplitudes in one buffer (not initialised), 64-byte aligned; from 2 MiB on, with
// `huge_pages` on transparent huge pages where the OS gives them (fewer page faults and TLB misses), else on
// its small pages. A released buffer is kept for the next state of its size and pages, up to kRecycledBytes of
// them, or the latest kInFlightStates (a circuit's state and co-state) when larger, so a new state seldom faults
// in fresh pages (docs/kernel-notes.md#the-state-two-planes).
constexpr size_t kRecycledBytes = size_t(128) << 20;
constexpr size_t kInFlightStates = 2;
float* allocate_state(int qubits, bool huge_pages = true);
void release_state(void* buffer) noexcept;

struct ReleaseState {
  void operator()(float* buffer) const noexcept { release_state(buffer); }
};
using StateBuffer = std::unique_ptr<float, ReleaseState>;
inline StateBuffer new_state_buffer(int qubits, bool huge_pages) {
  return StateBuffer(allocate_state(qubits, huge_pages));
}

inline Planes planes_of(float* data, int qubits) {
  return {data, data + plane_stride(qubits), index_t(1) << qubits};
}

// Where part `part` of `parts` starts among `count` items, cut at multiples of 2^unit_bits.
inline index_t share(int part, int parts, index_t count, int unit_bits) {
  return part == parts ? count : ((count >> unit_bits) * part / parts) << unit_bits;
}

// body(part) for each of `parts` parts, side by side on OpenMP threads (inline when parts is 1).
template <class Body>
void in_parts(int parts, Body&& body) {
  if (parts <= 1) {
    body(0);
    return;
  }
#pragma omp parallel for num_threads(parts) schedule(static, 1)
  for (int part = 0; part < parts; ++part) body(part);
}

inline int parity(uint64_t x) { return __builtin_parityll(x); }

// psi <- the state after the circuit's start from |0...0>: its qubits' product state times its diagonal
// factors, written in one pass in chunks of 2^kStartBits amplitudes.
void write_start(Planes psi, const Circuit& circuit, int parts);

// The start's amplitudes first..last written (multiples of 2^kStartBits, or of the state's size if smaller).
void write_start_range(Planes psi, const Circuit& circuit, index_t first, index_t last);

}  // namespace qml
