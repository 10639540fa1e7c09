#include "roofline.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

#include "state.h"

namespace qml {
namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
typedef float Vector __attribute__((vector_size(kLanes * sizeof(float))));

template <class Body>
double fastest(int repeats, Body&& body) {
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    body();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// kFmaChains chains of `rounds` FMAs each; the sum is returned so that none is optimised away.
float fma_chains(int64_t rounds, float seed) {
  Vector acc[kFmaChains];
  for (int k = 0; k < kFmaChains; ++k) acc[k] = Vector{} + seed * static_cast<float>(k + 1);
  const Vector a = Vector{} + 0.999999f, b = Vector{} + 1e-7f;
  for (int64_t i = 0; i < rounds; ++i)
#pragma GCC unroll 12
    for (int k = 0; k < kFmaChains; ++k) acc[k] = acc[k] * a + b;
  float total = 0;
  for (int k = 0; k < kFmaChains; ++k)
    for (int j = 0; j < kLanes; ++j) total += acc[k][j];
  return total;
}

}  // namespace

int fma_lanes() { return kLanes; }

double triad_seconds(int64_t floats, int threads, int repeats) {
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  std::unique_ptr<float, decltype(&std::free)> buffer(
      static_cast<float*>(std::aligned_alloc(kHugePage, 3 * ((bytes + kHugePage - 1) / kHugePage) * kHugePage)),
      &std::free);
  float* a = buffer.get();
  float* b = a + (bytes + kHugePage - 1) / kHugePage * kHugePage / sizeof(float);
  float* c = b + (b - a);
  const float s = 1.5f;
  auto triad = [&] {
    in_parts(threads, [&](int part) {
      const int64_t first = share(part, threads, floats, 4), last = share(part + 1, threads, floats, 4);
#pragma omp simd
      for (int64_t i = first; i < last; ++i) a[i] = b[i] + s * c[i];
    });
  };
  in_parts(threads, [&](int part) {  // each thread faults in its own share, as the timed runs read it
    const int64_t first = share(part, threads, floats, 4), last = share(part + 1, threads, floats, 4);
    for (int64_t i = first; i < last; ++i) a[i] = 0, b[i] = 1, c[i] = 2;
  });
  return fastest(repeats, triad);
}

double fma_seconds(int64_t rounds, int threads, int repeats) {
  volatile float sink = 0;
  return fastest(repeats, [&] {
    in_parts(threads, [&](int part) { sink = sink + fma_chains(rounds, static_cast<float>(part + 1)); });
  });
}

}  // namespace qml
