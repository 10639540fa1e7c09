// Relabelling: the state's amplitudes moved so that qubits change bits (the plan parks the qubits needed
// last on the low bits and swaps them up when a block needs them).
#pragma once

#include <cstdint>

#include "state.h"

namespace qml {

constexpr int kParkedBits = 5;  // the plan parks qubits on the bits below this

// In place: the amplitude at index i moves to the index with bit q of i at bit bit_map[q], where bit_map
// swaps pairs (low, high) of bits, every low below kParkedBits (so it is its own inverse).
void relabel_bits(Planes state, const int64_t* bit_map, int qubits, int parts);

// relabel_bits on one tile's amplitudes only: those whose bits in `window` (a mask) read `tile`, bits the
// relabelling leaves alone (so it moves amplitudes within each tile).
void relabel_tile(Planes state, const int64_t* bit_map, int qubits, index_t window, index_t tile);

// Whether the relabelling leaves the bits of `window` (a mask) alone.
bool leaves_alone(const int64_t* bit_map, index_t window);

}  // namespace qml
