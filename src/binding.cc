// The Python module of one SIMD path (QML_KERNEL_MODULE, QML_KERNEL_PATH set by CMakeLists.txt): circuits and
// readouts made from the plan's arrays, the passes, and what the dispatch needs. Every pass releases the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/complex.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "adjoint.h"
#include "blocks.h"
#include "dispatch.h"
#include "relabel.h"
#include "roofline.h"

namespace nb = nanobind;
using namespace qml;

namespace {

template <class T, class... Extra>
using Array = nb::ndarray<T, nb::c_contig, nb::device::cpu, Extra...>;
// A state's two planes, each contiguous, the imaginary one `stride(0)` floats after the real one (plane_stride).
using StateArray = nb::ndarray<float, nb::device::cpu, nb::shape<2, -1>>;
using Matrix = Array<cdouble, nb::shape<4, 4>>;

// A field of the plan's NamedTuple as a vector.
template <class T>
std::vector<T> field(nb::handle tuple, const char* name) {
  const auto a = nb::cast<Array<const T>>(tuple.attr(name));
  return std::vector<T>(a.data(), a.data() + a.size());
}

// The start's tables, one copy for every circuit whose tables are the same (a data set's circuits share their
// start): up to 128 KiB each, and a worker keeps thousands of plans.
std::shared_ptr<const std::vector<float>> start_table_of(std::vector<float> table) {
  static std::mutex lock;
  static std::map<std::string, std::weak_ptr<const std::vector<float>>> shared;  // by the tables' bytes
  const std::string key(reinterpret_cast<const char*>(table.data()), table.size() * sizeof(float));
  std::lock_guard<std::mutex> hold(lock);
  if (auto found = shared.find(key); found != shared.end())
    if (auto kept = found->second.lock()) return kept;
  for (auto it = shared.begin(); it != shared.end();) it = it->second.expired() ? shared.erase(it) : std::next(it);
  auto made = std::make_shared<const std::vector<float>>(std::move(table));
  shared[key] = made;
  return made;
}

Circuit circuit_from(nb::handle t) {
  Circuit c;
  c.qubits = nb::cast<int>(t.attr("qubits"));
  c.block_qubits = field<int64_t>(t, "block_qubits");
  c.block_mask = field<int64_t>(t, "block_mask");
  c.block_mask_value = field<int64_t>(t, "block_mask_value");
  c.relabel = field<int64_t>(t, "relabel");
  c.bit_maps = field<int64_t>(t, "bit_maps");
  c.segments = field<int64_t>(t, "segments");
  c.windows = field<int64_t>(t, "windows");
  c.block_start = field<int64_t>(t, "block_start");
  c.kind = field<int64_t>(t, "kind");
  c.symbol = field<int64_t>(t, "symbol");
  c.coef = field<double>(t, "coef");
  c.constant = field<double>(t, "const");
  c.kind_eig = field<double>(t, "kind_eig");
  c.kind_proj = field<cdouble>(t, "kind_proj");
  c.start_amplitudes = field<cdouble>(t, "start_amplitudes");
  c.start_phase_bits = field<int64_t>(t, "start_phase_bits");
  c.start_phases = field<cdouble>(t, "start_phases");
  const std::vector<bool> linked = field<bool>(t, "start_linked");
  c.start_linked.assign(linked.begin(), linked.end());
  c.start_table_bits = field<int64_t>(t, "start_table_bits");
  c.start_table = start_table_of(field<float>(t, "start_table"));
  c.form = static_cast<Form>(nb::cast<int>(t.attr("form")));
  c.prefetch = nb::cast<bool>(t.attr("prefetch"));
  c.huge_pages = nb::cast<bool>(t.attr("huge_pages"));
  return c;
}

Readouts readouts_from(nb::handle t) {
  return Readouts{field<int64_t>(t, "op"), field<double>(t, "coef"), field<int64_t>(t, "flip"),
                  field<int64_t>(t, "signs"), field<int64_t>(t, "y_count")};
}

using NumpyState = nb::ndarray<nb::numpy, float, nb::shape<2, -1>>;

Planes array_planes(StateArray state) {
  if (state.shape(1) > 1 && state.stride(1) != 1) throw std::invalid_argument("a state's planes are not contiguous");
  return {state.data(), state.data() + state.stride(0), static_cast<index_t>(state.shape(1))};
}

// A new state of 2^qubits amplitudes, owned by the numpy array it is returned as.
NumpyState new_state(int qubits, bool huge_pages) {
  float* data = allocate_state(qubits, huge_pages);
  nb::capsule owner(data, [](void* p) noexcept { release_state(p); });
  return {data, {2, size_t(1) << qubits}, owner, {plane_stride(qubits), 1}};
}

nb::ndarray<nb::numpy, cdouble, nb::shape<4, 4>> to_numpy(const Mat4& m) {
  auto* data = new cdouble[16];
  std::memcpy(static_cast<void*>(data), m.data(), sizeof(Mat4));
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<cdouble*>(p); });
  return {data, {4, 4}, owner};
}

Mat4 from_numpy(Matrix u) {
  Mat4 m;
  std::memcpy(static_cast<void*>(m.data()), u.data(), sizeof(Mat4));
  return m;
}

// The circuit's state at `values`; out[k] += the expectation of readout k. Returns the state.
NumpyState circuit_expectations(const Circuit& c, Array<const double> values, const Readouts& readouts,
                                Array<double> out, int parts) {
  NumpyState psi = new_state(c.qubits, c.huge_pages);
  const Planes planes = planes_of(psi.data(), c.qubits);
  {
    nb::gil_scoped_release released;
    simulate(planes, c, values.data(), parts);
    add_expectations(planes, readouts, out.data(), parts);
  }
  return psi;
}

// grad[s] += d/d values[s] of sum_k upstream[k] <O_k>. `psi`: the circuit's state at `values` as
// circuit_expectations returns it, consumed; or an array of no amplitudes, to simulate it here.
void circuit_gradient(const Circuit& c, Array<const double> values, const Readouts& readouts,
                      Array<const double> upstream, Array<double> grad, int parts, StateArray psi) {
  if (psi.shape(1) != 0 && psi.shape(1) != size_t(1) << c.qubits)
    throw std::invalid_argument("psi is not a state of the circuit's qubits");
  nb::gil_scoped_release released;
  StateBuffer simulated;
  Planes planes = array_planes(psi);
  if (planes.size == 0) {
    simulated = new_state_buffer(c.qubits, c.huge_pages);
    planes = planes_of(simulated.get(), c.qubits);
    simulate(planes, c, values.data(), parts);
  }
  sweep_gradient(planes, c, values.data(), readouts, upstream.data(), grad.data(), parts);
}

}  // namespace

NB_MODULE(QML_KERNEL_MODULE, m) {
  m.doc() = "The block adjoint method's compiled kernel, built for the " QML_KERNEL_PATH " path.";
  nb::set_leak_warnings(false);  // plans cached for the process's life hold circuits until Python's last moment
  m.attr("PATH") = QML_KERNEL_PATH;
  m.attr("MIN_QUBITS") = kMinQubits;
  m.attr("START_BITS") = kStartBits;
  m.attr("PARKED_BITS") = kParkedBits;
  m.attr("CHUNK_BITS") = kChunkBits;

  nb::class_<Circuit>(m, "Circuit", "A plan.Circuit's arrays, as the kernel runs them.")
      .def("__init__", [](Circuit* self, nb::handle plan) { new (self) Circuit(circuit_from(plan)); })
      .def_ro("qubits", &Circuit::qubits);
  nb::class_<Readouts>(m, "Readouts", "A plan.Readouts' arrays, as the kernel reads them.")
      .def("__init__", [](Readouts* self, nb::handle plan) { new (self) Readouts(readouts_from(plan)); });

  m.def("triad_seconds", &triad_seconds, nb::arg("floats"), nb::arg("threads"), nb::arg("repeats"),
        nb::call_guard<nb::gil_scoped_release>(),
        "Seconds of the fastest of `repeats` triads a = b + s c over arrays of `floats` floats, on `threads`.");
  m.def("fma_seconds", &fma_seconds, nb::arg("rounds"), nb::arg("threads"), nb::arg("repeats"),
        nb::call_guard<nb::gil_scoped_release>(),
        "Seconds of the fastest of `repeats` runs of `rounds` x FMA_CHAINS vector FMAs on each of `threads`.");
  m.attr("FMA_CHAINS") = kFmaChains;
  m.attr("FMA_LANES") = fma_lanes();
  m.def("supported_paths", &supported_paths, "The paths this CPU can run, fastest first.");
  m.def("cpu_features", &cpu_features, "The SIMD features of this CPU that the paths need.");
  m.def("circuit_expectations", &circuit_expectations, nb::arg("circuit"), nb::arg("values"), nb::arg("readouts"),
        nb::arg("out").noconvert(), nb::arg("parts"), "The circuit's state; out[k] += <O_k>.");
  m.def("circuit_gradient", &circuit_gradient, nb::arg("circuit"), nb::arg("values"), nb::arg("readouts"),
        nb::arg("upstream"), nb::arg("grad").noconvert(), nb::arg("parts"), nb::arg("psi").noconvert(),
        "grad[s] += d/d values[s] of sum_k upstream[k] <O_k>, from the state `psi` (consumed) or simulated.");
  m.def(
      "apply_block",
      [](StateArray state, Matrix u, int hi, int lo, int parts, int64_t mask, int64_t value) {
        const Mat4 matrix = from_numpy(u);
        nb::gil_scoped_release released;
        apply_block(array_planes(state), matrix, hi, lo, parts, {mask, value});
      },
      nb::arg("state").noconvert(), nb::arg("u"), nb::arg("hi"), nb::arg("lo"), nb::arg("parts"), nb::arg("mask") = 0,
      nb::arg("value") = 0, "state <- (u on bits hi, lo) state, where state's bits & mask == value.");
  m.def(
      "unapply_with_transition",
      [](StateArray psi, StateArray lam, Matrix u, int hi, int lo, int parts, int64_t mask, int64_t value) {
        const Mat4 matrix = from_numpy(u);
        Mat4 out;
        {
          nb::gil_scoped_release released;
          out = unapply_with_transition(array_planes(psi), array_planes(lam), matrix, hi, lo, parts, {mask, value});
        }
        return to_numpy(out);
      },
      nb::arg("psi").noconvert(), nb::arg("lam").noconvert(), nb::arg("u"), nb::arg("hi"), nb::arg("lo"),
      nb::arg("parts"), nb::arg("mask") = 0, nb::arg("value") = 0,
      "psi, lam <- u^dagger psi, u^dagger lam where their bits & mask == value; returns their transition matrix "
      "summed there.");
  m.def(
      "relabel_bits",
      [](StateArray state, Array<const int64_t> bit_map, int parts) {
        nb::gil_scoped_release released;
        relabel_bits(array_planes(state), bit_map.data(), static_cast<int>(bit_map.size()), parts);
      },
      nb::arg("state").noconvert(), nb::arg("bit_map"), nb::arg("parts"),
      "In place: bit q of every amplitude's index moves to bit bit_map[q] (swaps of low and high bits).");
}
