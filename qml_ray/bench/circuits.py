"""A family of circuits' cost per circuit on this machine (the QCNN's, or multi-controlled gates'), and the
headline run projected from the QCNN's.

Forward: the model (or a TFQ expectation layer) on a batch of circuits. Forward + gradient: the same under a
GradientTape, then the gradient of the mean output with respect to every weight. Each with TFQ (its simulator
and Adjoint) and with qml_ray's block-fused kernel (its own forward and adjoint). Seconds per circuit =
seconds per batch / batch size. Run with one thread (the default), a figure is the cost on one vCPU.
Importing this module starts TensorFlow: size its thread pools first.
"""

import functools
import os
import subprocess
import sys
import threading
import time

import cirq
import numpy as np
import sympy
import tensorflow as tf
import tensorflow_quantum as tfq

from qml_ray import contract, data, kernel
from qml_ray.bench import peers
from qml_ray.config import Config, kept_states
from qml_ray.gradients import BlockAdjoint
from qml_ray.gradients.memory import state_memory
from qml_ray.gradients.plan import plan
from qml_ray.model import cluster_state_circuit, qcnn_circuit, qubits_for

# The original's headline: 23 qubits, 1000 examples, ~5 min/epoch on 32 nodes of 16 vCPUs,
# ~4 h/epoch on one worker.
HEADLINE = Config(qubits=23, examples=1000, test_fraction=0.3)
HEADLINE_VCPUS = 512
ORIGINAL_CLUSTER_MINUTES = 5
ORIGINAL_ONE_WORKER_HOURS = 4


NODE_VCPUS = 16  # one c2-standard-16 node
DIFFERENTIATORS = ("tfq", "block")
FAMILIES = {
    "qcnn": "the 1-layer QCNN",
    "controlled": "2 layers of a ry on every qubit, a ZZ on every pair of neighbours controlled by the next 2 "
    "(values 1, 0), and a rx on every qubit controlled by the next 3 (values 1, 0, 1), each gate with a symbol",
}


def default_circuits(qubits: int) -> int:
    """Circuits per batch: many where they are cheap, 2 at 23 qubits (64 MB of state each)."""
    return min(64, max(2, 2 ** (22 - qubits)))


def seconds_per_call(fn, min_seconds: float) -> float:
    """Seconds per call of `fn`, averaged over as many calls as fill `min_seconds` (at least one)."""
    calls, started = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - started
        if elapsed >= min_seconds:
            return elapsed / calls


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:  # Linux: sizes in pages, the second is resident
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """The process's peak resident memory above its level at the start, sampled every 5 ms."""

    def __enter__(self):
        self.start = self.peak = resident_bytes()
        self.done = threading.Event()
        self.sampler = threading.Thread(target=self.sample, daemon=True)
        self.sampler.start()
        return self

    def sample(self):
        while not self.done.wait(0.005):
            self.peak = max(self.peak, resident_bytes())

    def __exit__(self, *exc):
        self.done.set()
        self.sampler.join()

    @property
    def extra_bytes(self) -> int:
        return self.peak - self.start


def probe(qubits: int, circuits: int, threads: int, with_peers: bool, family: str, min_seconds: float) -> dict:
    """Seconds per circuit of the family's circuits on `qubits` qubits: forward, and forward + gradient,
    with each differentiator; the peak memory of a gradient per circuit in flight, in state vectors
    (complex64, 8 bytes per amplitude); the block kernel's memory traffic against a state-sized pass's;
    and `with_peers`, the peers on the same circuits against the block kernel."""
    whole, calls = {"qcnn": qcnn_calls, "controlled": controlled_calls}[family](qubits, circuits)
    state_bytes = 8 * 2**qubits
    in_flight = min(threads, circuits)
    result = {"qubits": qubits, "circuits": circuits}
    for name, (forward, forward_and_gradient) in calls.items():
        result[f"{name}_forward_seconds"] = seconds_per_call(forward, min_seconds) / circuits
        with PeakMemory() as memory:
            result[f"{name}_forward_gradient_seconds"] = seconds_per_call(forward_and_gradient, min_seconds) / circuits
        result[f"{name}_peak_state_vectors"] = memory.extra_bytes / in_flight / state_bytes
        result[f"{name}_gradient_to_forward"] = (
            result[f"{name}_forward_gradient_seconds"] - result[f"{name}_forward_seconds"]
        ) / result[f"{name}_forward_seconds"]
    result["speedup"] = result["tfq_forward_gradient_seconds"] / result["block_forward_gradient_seconds"]
    kept = min(circuits, kept_states(threads, state_bytes, state_memory(threads))) / circuits
    result.update(memory_traffic(whole, result, state_bytes, kept))
    if qubits >= ROOFLINE_FROM_QUBITS:
        result["roofline"] = roofline(threads)
    if with_peers:
        result["peers"] = against_peers(whole, threads, min_seconds)
    return result


def qcnn_batch(qubits: int, circuits: int) -> tuple[Config, tf.Tensor]:
    """The QCNN's config of `qubits` qubits, and a batch of `circuits` of its data set's circuits."""
    config = Config(qubits=qubits, examples=max(10, 2 * circuits))
    return config, tf.constant(data.generate(config)["train"].column("circuit").to_pylist()[:circuits])


def qcnn_calls(qubits: int, circuits: int) -> tuple[dict, dict]:
    """The QCNN's batch (`model_circuits`), and per differentiator its model's forward and forward + gradient
    on it, warmed up (compiling and plans of the batch stay out of the timings)."""
    config, batch = qcnn_batch(qubits, circuits)
    calls = {}
    for name in DIFFERENTIATORS:
        model = contract.build(config.replace(differentiator=name))

        def forward(inputs=batch, model=model):
            return model(inputs, training=False)

        def forward_and_gradient(inputs=batch, model=model):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(model(inputs, training=True))
            return tape.gradient(loss, model.trainable_variables)

        forward(batch), forward_and_gradient(batch[:1])
        calls[name] = forward, forward_and_gradient
    return model_circuits(config, model, batch), calls  # the block model's: the last built


def controlled_calls(qubits: int, circuits: int) -> tuple[dict, dict]:
    """A batch of the controlled family's circuits (`controlled_circuits`), and per differentiator a TFQ
    expectation layer's forward and forward + gradient (with respect to the weights) on it, warmed up."""
    whole = controlled_circuits(qubits, circuits)
    programs, names, sums = (tf.constant(whole[key]) for key in ("programs", "names", "pauli_sums"))
    calls = {}
    for name, differentiator in (("tfq", tfq.differentiators.Adjoint()), ("block", BlockAdjoint())):
        layer = tfq.layers.Expectation(differentiator=differentiator)
        weights = tf.Variable(np.tile(whole["weights"], (circuits, 1)))

        def forward(layer=layer, weights=weights):
            return layer(programs, symbol_names=names, symbol_values=weights, operators=sums)

        def forward_and_gradient(forward=forward, weights=weights):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(forward())
            return tape.gradient(loss, weights)

        forward(), forward_and_gradient()
        calls[name] = forward, forward_and_gradient
    return whole, calls


def controlled_circuits(qubits: int, circuits: int) -> dict:
    """The controlled family (FAMILIES) after a data encoding (H on every qubit, then a rx of the circuit's own
    angle on each), readouts Z on every fourth qubit, weights drawn once; as `model_circuits` gives them."""
    register = cirq.LineQubit.range(qubits)
    symbols = []

    def symbol() -> sympy.Symbol:
        symbols.append(sympy.Symbol(f"c{len(symbols)}"))
        return symbols[-1]

    def near(q: int, *steps: int) -> list:
        return [register[(q + step) % qubits] for step in steps]

    model = cirq.Circuit()
    for _ in range(2):
        model += (cirq.ry(symbol())(q) for q in register)
        model += (
            (cirq.ZZ(*near(q, 0, 1)) ** symbol()).controlled_by(*near(q, 2, 3), control_values=[1, 0])
            for q in range(qubits)
        )
        model += (
            cirq.rx(symbol())(register[q]).controlled_by(*near(q, 1, 2, 3), control_values=[1, 0, 1])
            for q in range(qubits)
        )
    rng = np.random.default_rng(qubits)
    encodings = [
        cirq.Circuit(cirq.H.on_each(register), (cirq.rx(a)(q) for a, q in zip(rng.uniform(-3, 3, qubits), register)))
        for _ in range(circuits)
    ]
    whole = [encoding + model for encoding in encodings]
    readouts = [cirq.Z(q) for q in register[::4]]
    return {
        "circuits": whole,
        "symbols": symbols,
        "weights": rng.uniform(-3, 3, len(symbols)).astype(np.float32),
        "readouts": readouts,
        "programs": tfq.convert_to_tensor(whole).numpy(),
        "names": np.array([str(s).encode() for s in symbols]),
        "pauli_sums": tfq.convert_to_tensor([readouts] * len(whole)).numpy(),
    }


def model_circuits(config: Config, model, batch) -> dict:
    """The batch's whole circuits as the QCNN layer simulates them (cluster state, excitation, model
    circuit), their symbols and the model's weights for them, their readouts, and the same serialized as
    the block kernel takes them."""
    qubits = qubits_for(config.qubits)
    circuit, readout_qubits = qcnn_circuit(qubits, config.layers)
    weights = model.get_layer("qcnn").symbol_values()
    symbols = sorted(weights, key=str)
    whole = [cluster_state_circuit(qubits) + excitation + circuit for excitation in tfq.from_tensor(batch)]
    readouts = [cirq.Z(q) for q in readout_qubits]
    return {
        "circuits": whole,
        "symbols": symbols,
        "weights": np.array([weights[s] for s in symbols], np.float32),
        "readouts": readouts,
        "programs": tfq.convert_to_tensor(whole).numpy(),
        "names": np.array([str(s).encode() for s in symbols]),
        "pauli_sums": tfq.convert_to_tensor([readouts] * len(whole)).numpy(),
    }


def forward_bytes(whole: dict) -> float:
    """Bytes the block kernel's forward moves per circuit (mean over the batch): each pass over the state (the
    start's, a segment's: one block, or several applied tile by tile; or a relabelling) reads and writes it
    once (complex64, padded to the kernel's least qubits); a masked block's, the cache lines (of 16 amplitudes
    per plane) holding its matching amplitudes: half for each control bit above the lowest 4."""
    moved = []
    for program in whole["programs"]:
        circuit = plan(program, tuple(s.decode() for s in whole["names"])).circuit
        masks = circuit.block_mask[circuit.segments[:-1]]  # a masked block is a segment of its own
        segments = sum(0.5 ** bin(int(mask) >> 4).count("1") for mask in masks)
        passes = 1 + segments + int(np.count_nonzero(circuit.relabel >= 0))  # the start's, segments', relabellings'
        moved.append(2 * 8 * 2**circuit.qubits * passes)
    return float(np.mean(moved))


def pass_bandwidth(state_bytes: int, min_seconds: float = 0.5) -> float:
    """Bytes per second of an in-place pass over a state-sized array, each value read and written once as in
    every pass of the kernel, counted as read + write (2 bytes moved per byte). A copy into a second array
    is no measure of that: it also reads the target's lines before it writes them."""
    values = np.ones(state_bytes // 4, np.float32)
    return 2 * state_bytes / seconds_per_call(lambda: np.multiply(values, np.float32(1), out=values), min_seconds)


def memory_traffic(whole: dict, result: dict, state_bytes: int, kept: float) -> dict:
    """The bytes the block kernel moves per circuit, the rate it reaches, and a state-sized pass's. Counted:
    every pass of the forward (a segment, or a relabelling) reads and writes the state once (`forward_bytes`);
    the gradient op simulates the forward again for the circuits whose state the forward did not keep (all
    but the share `kept`), then every pass of its backward sweep reads and writes two states (the state and
    its co-state): forward + gradient = forward op + gradient op = 1 + (1 - kept) + 2 forwards. Not
    counted: the readouts' passes and zeroing the co-state (two or three passes per circuit)."""
    forward = forward_bytes(whole)
    gradient = (4 - kept) * forward
    return {
        "pass_bandwidth": pass_bandwidth(state_bytes),
        "block_forward_bytes": forward,
        "block_forward_gradient_bytes": gradient,
        "block_forward_rate": forward / result["block_forward_seconds"],
        "block_forward_gradient_rate": gradient / result["block_forward_gradient_seconds"],
    }


# Each pass kind of the kernel: (floating-point operations, bytes moved) per amplitude, complex64, a multiply-add
# counted as 2 operations. A block: 4 complex multiply-adds per amplitude, the amplitude read and written. Its
# un-applying in the backward sweep: the same on the state and the co-state, and the transition sums (4 more
# complex multiply-adds per amplitude), both states read and written. A relabelling: no arithmetic.
PASS_KINDS = {"block": (32, 16), "block un-applied + transition": (96, 32), "relabelling": (0, 16)}
ROOFLINE_QUBITS = {"in cache": 15, "from memory": 26}  # 256 KiB (within a core's L2) and 512 MiB a state
ROOFLINE_FROM_QUBITS = 20  # a run that probes so many qubits measures the roofline too (once)


def peak_flops(threads: int, min_seconds: float = 1.0) -> float:
    """Floating-point operations per second of float32 matrix products (numpy's BLAS) on `threads` threads,
    in a process of its own (BLAS sizes its threads when it loads)."""
    code = (
        "import time, numpy as np\n"
        "a = np.ones((1024, 1024), np.float32); a @ a\n"
        "calls, t = 0, time.perf_counter()\n"
        f"while time.perf_counter() - t < {min_seconds}: a @ a; calls += 1\n"
        "print(2 * 1024**3 * calls / (time.perf_counter() - t))"
    )
    pools = {name: str(threads) for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **pools}, capture_output=True, text=True)
    return float(done.stdout.strip())


@functools.cache
def roofline(threads: int, qubits: tuple = tuple(ROOFLINE_QUBITS.items()), min_seconds: float = 0.3) -> dict:
    """This machine's peaks on `threads` threads (float32 matrix products; an in-place pass over a state in a
    core's cache and from memory) and the kernel's rate in each pass kind (`PASS_KINDS`), one pass on a block
    of bits (n - 3, 9), `threads` parts: operations and bytes per second, and nanoseconds per amplitude. Each
    figure timed over `min_seconds`; `qubits` the states' sizes, (where, qubits) pairs."""
    found = {"peak_flops": peak_flops(threads, 3 * min_seconds), "qubits": dict(qubits), "kinds": {}}
    for where, size in qubits:
        found[f"pass_bandwidth {where}"] = pass_bandwidth(8 * 2**size, min_seconds)
        for kind, seconds in pass_seconds(size, threads, min_seconds).items():
            flops, moved = PASS_KINDS[kind]
            measured = found["kinds"].setdefault(kind, {"flops_per_amplitude": flops, "bytes_per_amplitude": moved})
            measured[where] = {"ns_per_amplitude": seconds * 1e9, "flops": flops / seconds, "bytes": moved / seconds}
    return found


def pass_seconds(qubits: int, threads: int, min_seconds: float) -> dict:
    """Seconds per amplitude of one pass of each kind over a state of `qubits` qubits, in `threads` parts."""
    rng = np.random.default_rng(0)
    u = np.linalg.qr(rng.standard_normal((4, 4)) + 1j * rng.standard_normal((4, 4)))[0]
    psi = np.full((2, 2**qubits), 2 ** (-qubits / 2), np.float32)
    lam = psi.copy()
    bit_map = np.arange(qubits)
    bit_map[:5], bit_map[qubits - 5 :] = np.arange(qubits - 5, qubits), np.arange(5)
    passes = {
        "block": lambda: kernel.apply_block(psi, u, qubits - 3, 9, threads),
        "block un-applied + transition": lambda: kernel.unapply_with_transition(psi, lam, u, qubits - 3, 9, threads),
        "relabelling": lambda: kernel.relabel_bits(psi, bit_map, threads),
    }
    return {kind: seconds_per_call(run, min_seconds) / 2**qubits for kind, run in passes.items()}


def roofline_lines(probes: list[dict]) -> list[str]:
    """The roofline table of the first probe that measured it (the same at every qubit count)."""
    found = next((p["roofline"] for p in probes if p.get("roofline")), None)
    if not found:
        return []
    peak = found["peak_flops"]
    lines = [
        "",
        f"Roofline (one pass of each kind, a state of {found['qubits']['in cache']} qubits in a core's cache and of "
        f"{found['qubits']['from memory']} from memory): this machine's peaks are {peak / 1e9:.0f} GFLOP/s (float32 "
        f"matrix products) and an in-place pass's {found['pass_bandwidth in cache'] / 1e9:.0f} GB/s in cache, "
        f"{found['pass_bandwidth from memory'] / 1e9:.0f} GB/s from memory (read + write).",
        "",
        "| pass | FLOP, bytes per amplitude | in cache: ns per amplitude, GFLOP/s (share of peak), GB/s (share) "
        "| from memory: ns per amplitude, GFLOP/s (share of peak), GB/s (share) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for kind, measured in found["kinds"].items():
        cells = []
        for where in found["qubits"]:
            m, bandwidth = measured[where], found[f"pass_bandwidth {where}"]
            cells.append(
                f"{m['ns_per_amplitude']:.3g}, {m['flops'] / 1e9:.0f} ({m['flops'] / peak:.0%}), "
                f"{m['bytes'] / 1e9:.1f} ({m['bytes'] / bandwidth:.0%})"
            )
        per_amplitude = f"{measured['flops_per_amplitude']}, {measured['bytes_per_amplitude']}"
        lines.append(f"| {kind} | {per_amplitude} | {cells[0]} | {cells[1]} |")
    return lines


def against_peers(whole: dict, threads: int, min_seconds: float) -> dict:
    """The block kernel, outside TensorFlow, against the peers on the same circuits: forward (expectations)
    against qsim's, the gradient of the readouts' sum (forward included) against Lightning's adjoint; seconds
    per circuit, and each peer's largest difference from the block values (`peers.difference`)."""
    block = BlockAdjoint(threads)
    inputs = (whole["programs"], whole["names"], np.tile(whole["weights"], (len(whole["programs"]), 1)))
    sums = whole["pauli_sums"]
    ones = np.ones(sums.shape, np.float32)

    def timer(fn):
        return seconds_per_call(fn, min_seconds)

    expected = block.expectations(*inputs, sums)  # the first calls also plan the circuits
    expected_gradient = block.gradient(*inputs, sums, ones)
    found = {
        "block": {
            "forward_seconds": timer(lambda: block.expectations(*inputs, sums, keep_states=False)) / len(sums),
            "gradient_seconds": timer(lambda: block.gradient(*inputs, sums, ones)) / len(sums),
        }
    }
    resolver = cirq.ParamResolver(dict(zip(whole["symbols"], whole["weights"].tolist())))
    qsim = peers.qsim_forward(whole["circuits"], whole["readouts"], resolver, threads, timer)
    qsim["difference"] = peers.difference(qsim.pop("values"), expected)
    found["qsim"] = qsim
    for dtype in peers.LIGHTNING_DTYPES:
        lightning = peers.lightning_gradient(
            whole["circuits"], whole["readouts"], whole["symbols"], whole["weights"], dtype, timer
        )
        lightning["difference"] = max(
            peers.difference(lightning.pop("values"), expected),
            peers.difference(lightning.pop("gradients"), expected_gradient),
        )
        found[f"lightning_{dtype}"] = lightning
    return found


def project(probed: dict, efficiency: float, efficiency_source: str) -> dict:
    """The headline's epoch from the cost per circuit at its qubit count, for each differentiator:
    every training example costs a forward + gradient, every validation example a forward, spread
    over the vCPUs at `efficiency` (one node: at 1). A projection, not a measurement."""
    train, test = data.split_sizes(HEADLINE)
    projection = {
        "qubits": HEADLINE.qubits,
        "train_examples": train,
        "test_examples": test,
        "vcpus": HEADLINE_VCPUS,
        "node_vcpus": NODE_VCPUS,
        "parallel_efficiency": efficiency,
        "efficiency_source": efficiency_source,
        "original_cluster_epoch_minutes": ORIGINAL_CLUSTER_MINUTES,
        "original_one_worker_epoch_hours": ORIGINAL_ONE_WORKER_HOURS,
    }
    for name in DIFFERENTIATORS:
        cpu_seconds = train * probed[f"{name}_forward_gradient_seconds"] + test * probed[f"{name}_forward_seconds"]
        projection[name] = {
            "one_vcpu_epoch_hours": cpu_seconds / 3600,
            "cluster_epoch_minutes": cpu_seconds / (HEADLINE_VCPUS * efficiency) / 60,
            "node_epoch_hours": cpu_seconds / NODE_VCPUS / 3600,
        }
    return projection


def traffic_lines(probes: list[dict]) -> list[str]:
    """The block kernel's memory traffic per circuit (`memory_traffic`) against a state-sized pass's."""
    return [
        "",
        "The block kernel's memory traffic per circuit (its passes over the state, each a read and a write; the "
        "gradient's sweep over two states), the rate it reaches in the times above, and the share of a "
        "state-sized in-place pass's (read + write) that is:",
        "",
        "| qubits | state-sized pass (GB/s) | block forward: MB, GB/s, share of the pass's "
        "| block forward + gradient: MB, GB/s, share of the pass's |",
        "| ---: | ---: | ---: | ---: |",
        *(
            f"| {p['qubits']} | {p['pass_bandwidth'] / 1e9:.1f} "
            f"| {p['block_forward_bytes'] / 1e6:.4g}, {p['block_forward_rate'] / 1e9:.1f}, "
            f"{p['block_forward_rate'] / p['pass_bandwidth']:.0%} "
            f"| {p['block_forward_gradient_bytes'] / 1e6:.4g}, {p['block_forward_gradient_rate'] / 1e9:.1f}, "
            f"{p['block_forward_gradient_rate'] / p['pass_bandwidth']:.0%} |"
            for p in probes
        ),
    ]


def markdown(doc: dict) -> str:
    """The costs as a Markdown table, and the projection, said to be one."""
    lines = [
        f"Seconds per circuit with {doc['threads']} thread(s) (TensorFlow's pools and the block kernel's) on "
        f"this machine ({doc['machine_cpus']} CPUs), the block kernel on its {doc['kernel_path']} path; "
        f"{FAMILIES[doc['family']]}. Memory: the gradient's peak above the "
        "process's level, per circuit in flight, in state vectors (8 bytes per amplitude), sampled.",
        "",
        "| qubits | circuits per batch | forward: TFQ, block | forward + gradient: TFQ | block "
        "| speed-up | gradient / forward: TFQ, block | peak state vectors: TFQ, block |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {p['qubits']} | {p['circuits']} | {p['tfq_forward_seconds']:.4g}, {p['block_forward_seconds']:.4g} "
        f"| {p['tfq_forward_gradient_seconds']:.4g} | {p['block_forward_gradient_seconds']:.4g} "
        f"| **{p['speedup']:.1f}x** | {p['tfq_gradient_to_forward']:.1f}, {p['block_gradient_to_forward']:.1f} "
        f"| {p['tfq_peak_state_vectors']:.1f}, {p['block_peak_state_vectors']:.1f} |"
        for p in doc["probes"]
    ]
    lines += traffic_lines(doc["probes"])
    lines += roofline_lines(doc["probes"])
    if any("peers" in p for p in doc["probes"]):
        lines += peers.markdown_lines(doc["probes"])
    projection = doc["projection"]
    if projection:
        lines += [
            "",
            (
                f"**Projection, not a measurement.** The headline run ({projection['qubits']} qubits, "
                f"{projection['train_examples']} training examples at forward + gradient, "
                f"{projection['test_examples']} validation examples at forward), at the cost per circuit above, "
                f"on {projection['vcpus']} vCPUs at parallel efficiency {projection['parallel_efficiency']:.2f} "
                f"({projection['efficiency_source']}) and on one {projection['node_vcpus']}-vCPU node:"
            ),
            "",
            "| gradient | vCPU-hours per epoch | min per epoch, 512 vCPUs | h per epoch, one 16-vCPU node |",
            "| --- | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {name} | {projection[name]['one_vcpu_epoch_hours']:.2f} "
            f"| {projection[name]['cluster_epoch_minutes']:.2f} | {projection[name]['node_epoch_hours']:.2f} |"
            for name in DIFFERENTIATORS
        ]
        lines += [
            f"| the original (TFQ, tf-operator) | | ~{projection['original_cluster_epoch_minutes']} "
            f"| ~{projection['original_one_worker_epoch_hours']} (one worker) |"
        ]
    return "\n".join(lines) + "\n"


def one_large_circuit(qubits: int, min_seconds: float = 1.0) -> dict:
    """One QCNN circuit of `qubits` qubits through the block model on this process's threads: seconds of its
    forward and forward + gradient (each over at least `min_seconds`, after a first forward), the peak resident
    memory above the process's level before the first simulation (in state vectors too), and qsim's best
    forward of the same circuit on as many threads."""
    config, batch = qcnn_batch(qubits, 1)
    model = contract.build(config.replace(differentiator="block"))

    def forward_and_gradient():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(batch, training=True))
        return tape.gradient(loss, model.trainable_variables)

    found = {"qubits": qubits, "threads": BlockAdjoint().threads, "kernel_path": kernel.PATH}
    with PeakMemory() as memory:
        model(batch, training=False)
        found["forward_seconds"] = seconds_per_call(lambda: model(batch, training=False), min_seconds)
        found["forward_gradient_seconds"] = seconds_per_call(forward_and_gradient, min_seconds)
    found["peak_bytes"] = memory.extra_bytes
    found["peak_state_vectors"] = memory.extra_bytes / (8 * 2**qubits)
    whole = model_circuits(config, model, batch)
    resolver = cirq.ParamResolver(dict(zip(whole["symbols"], whole["weights"].tolist())))
    qsim = peers.qsim_forward(
        whole["circuits"], whole["readouts"], resolver, found["threads"], lambda fn: seconds_per_call(fn, min_seconds)
    )
    found["qsim_forward_seconds"], found["qsim_fused_gate_size"] = qsim["seconds"], qsim["fused_gate_size"]
    return found


if __name__ == "__main__":  # TF_NUM_INTRAOP_THREADS=2 python -m qml_ray.bench.circuits 26: one circuit, as JSON
    import json

    print(json.dumps(one_large_circuit(int(sys.argv[1]))), flush=True)
