// The machine's roofline as this path's code meets it: memory bandwidth (a STREAM-like triad) and the peak
// rate of float32 fused multiply-adds, each on `threads` threads, to set the kernel's passes against.
#pragma once

#include <cstdint>

namespace qml {

// Seconds of the fastest of `repeats` triads a[i] = b[i] + s c[i] over `floats` floats an array, on `threads`.
double triad_seconds(int64_t floats, int threads, int repeats);

// Seconds of the fastest of `repeats` runs of `rounds` rounds of kFmaChains independent vector FMAs
// (kFmaLanes float lanes each) on each of `threads` threads.
double fma_seconds(int64_t rounds, int threads, int repeats);

constexpr int kFmaChains = 12;  // enough chains to hide an FMA's latency on two pipes
int fma_lanes();                // floats per vector on this path

}  // namespace qml
