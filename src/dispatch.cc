#include "dispatch.h"

namespace qml {
namespace {

#if defined(__x86_64__) || defined(__i386__)
struct Feature {
  const char* name;
  bool present;
};

// The features the x86 paths are built with (CMakeLists.txt's flags), and whether this CPU (and its OS) has each.
std::vector<Feature> x86_features() {
  __builtin_cpu_init();
  return {
      {"sse4.2", __builtin_cpu_supports("sse4.2") != 0},     {"avx", __builtin_cpu_supports("avx") != 0},
      {"avx2", __builtin_cpu_supports("avx2") != 0},         {"fma", __builtin_cpu_supports("fma") != 0},
      {"avx512f", __builtin_cpu_supports("avx512f") != 0},   {"avx512dq", __builtin_cpu_supports("avx512dq") != 0},
      {"avx512bw", __builtin_cpu_supports("avx512bw") != 0}, {"avx512vl", __builtin_cpu_supports("avx512vl") != 0},
  };
}

bool has_all(const std::vector<Feature>& features, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    bool found = false;
    for (const Feature& f : features) found = found || (std::string(f.name) == name && f.present);
    if (!found) return false;
  }
  return true;
}
#endif

}  // namespace

std::vector<std::string> supported_paths() {
  std::vector<std::string> paths;
#if defined(__x86_64__) || defined(__i386__)
  const std::vector<Feature> features = x86_features();
  if (has_all(features, {"avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl"})) paths.push_back("avx512");
  if (has_all(features, {"avx2", "fma"})) paths.push_back("avx2");
#endif
  paths.push_back("portable");
  return paths;
}

std::string cpu_features() {
  std::string out;
#if defined(__x86_64__) || defined(__i386__)
  for (const Feature& f : x86_features())
    if (f.present) out += (out.empty() ? "" : " ") + std::string(f.name);
#endif
  return out.empty() ? "none of avx, avx2, avx512" : out;
}

}  // namespace qml
