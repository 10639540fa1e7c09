// Runtime dispatch, as qsim does it: the kernel is built once per SIMD path (avx512, avx2, portable), each
// a module of its own, and the fastest path this CPU runs is imported (qml_ray/kernel.py).
#pragma once

#include <string>
#include <vector>

namespace qml {

// The paths this CPU can run, fastest first; "portable" runs everywhere.
std::vector<std::string> supported_paths();

// The SIMD features of this CPU the paths need, e.g. "sse4.2 avx avx2 fma avx512f avx512dq avx512bw avx512vl".
std::string cpu_features();

}  // namespace qml
