"""BlockAdjoint's gradients against TFQ's Adjoint and central differences of cirq's double-precision
simulator, on the QCNN, on random circuits of every supported gate family (TFQ's own random circuits among
them, with any controls). (In training: test_quantum_layers.)"""

import concurrent.futures
import contextlib
import importlib
import itertools
import random
import sys
import threading

import cirq
import numpy as np
import pytest
import sympy
import tensorflow as tf
import tensorflow_quantum as tfq

from qml_ray import choices, kernel, memory as state_model
from qml_ray.choices import Choice
from qml_ray.gradients import (
    BlockAdjoint,
    FinalStates,
    UnsupportedGate,
    planner,
    process_final_states,
    sharing_threads,
)
from qml_ray.gradients.plan import plan
from qml_ray.model import cluster_state_circuit, qcnn_circuit, qubits_for

STEP = 1e-4  # central differences: error ~STEP^2 in double precision


def forward_and_gradient(differentiator, circuits, symbols, values, readouts, upstream) -> tuple:
    """The expectations, and d/d values of sum(upstream * expectations), through `differentiator`'s op
    (made from TFQ's expectation op)."""
    op = differentiator.generate_differentiable_op(analytic_op=tfq.get_expectation_op())
    values = tf.constant(values, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(values)
        expectations = op(
            tfq.convert_to_tensor(circuits),
            tf.constant([str(s) for s in symbols]),
            values,
            tfq.convert_to_tensor(readouts),
        )
        loss = tf.reduce_sum(expectations * tf.constant(upstream, tf.float32))
    return expectations.numpy(), tape.gradient(loss, values).numpy()


def cirq_expectations(circuit, symbols, values, readouts) -> np.ndarray:
    """<O_k> of each readout, simulated by cirq in double precision."""
    resolved = cirq.resolve_parameters(circuit, dict(zip(symbols, values)))
    qubits = sorted(circuit.all_qubits() | {q for op in readouts for q in op.qubits})
    state = cirq.Simulator(dtype=np.complex128).simulate(resolved, qubit_order=qubits).final_state_vector
    index = {q: i for i, q in enumerate(qubits)}
    return np.array([cirq.PauliSum.wrap(op).expectation_from_state_vector(state, index).real for op in readouts])


def cirq_objective(circuit, symbols, values, readouts, upstream) -> float:
    """sum_k upstream[k] <O_k>, simulated by cirq in double precision."""
    return float(np.dot(upstream, cirq_expectations(circuit, symbols, values, readouts)))


def finite_differences(circuits, symbols, values, readouts, upstream) -> np.ndarray:
    out = np.zeros(values.shape)
    for row, circuit in enumerate(circuits):
        for s in range(len(symbols)):
            shifted = [values[row].astype(np.float64) for _ in range(2)]
            shifted[0][s] += STEP
            shifted[1][s] -= STEP
            plus, minus = (cirq_objective(circuit, symbols, v, readouts[row], upstream[row]) for v in shifted)
            out[row, s] = (plus - minus) / (2 * STEP)
    return out


DIRECTIONS = 3  # random directions per circuit along which check() takes central differences


def directional_differences(circuits, symbols, values, readouts, upstream, directions) -> np.ndarray:
    """Central differences of each circuit's objective along each of `directions` (unit vectors over its
    symbols): (circuits, directions)."""
    out = np.zeros((len(circuits), len(directions)))
    for row, circuit in enumerate(circuits):
        point = values[row].astype(np.float64)
        for k, direction in enumerate(directions):
            plus, minus = (
                cirq_objective(circuit, symbols, point + sign * STEP * direction, readouts[row], upstream[row])
                for sign in (1, -1)
            )
            out[row, k] = (plus - minus) / (2 * STEP)
    return out


THREADS = (1, 2, 3)


def check(circuits, symbols, values, readouts, upstream, tfq_tolerance=1e-4, threads=THREADS, memory=None) -> dict:
    """Block expectations equal cirq's and TFQ's within 1e-5; block gradients equal TFQ's Adjoint, component
    by component, within `tfq_tolerance` (TFQ's own float32 gradient strays further on some gate mixes), and
    cirq's central differences within 1e-4 along random directions (a wrong component shows in every direction
    but those orthogonal to it: none, almost surely; two simulations per direction where one per symbol would
    take 2 per symbol). The references once; the block method on every SIMD path this CPU runs, each on each
    of `threads` threads (a batch one circuit per thread, or one circuit's passes shared between them), with
    `memory` bytes for its states (None: the default). Returns the block method's expectations and gradient
    for each (path, threads)."""
    tfq_forward, adjoint = forward_and_gradient(
        tfq.differentiators.Adjoint(), circuits, symbols, values, readouts, upstream
    )
    exact = [cirq_expectations(c, symbols, v, r) for c, v, r in zip(circuits, values.astype(np.float64), readouts)]
    directions = np.random.default_rng(len(symbols)).standard_normal((DIRECTIONS, len(symbols)))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    reference = directional_differences(circuits, symbols, values, readouts, upstream, directions)
    assert np.abs(reference).max() > 0.01  # a real gradient, not zeros everywhere
    found = {}
    for path, n in itertools.product(kernel.supported_paths(), threads):
        for choice in choice_variants(path):
            with kernel_on(path):
                found[path, n] = block_forward, block = forward_and_gradient(
                    BlockAdjoint(threads=n, memory=memory, choice=choice), circuits, symbols, values, readouts, upstream
                )
            where = f"{choice} on {n} thread(s)"
            np.testing.assert_allclose(block_forward, exact, atol=1e-5, err_msg=where)
            np.testing.assert_allclose(block_forward, tfq_forward, atol=1e-5, err_msg=where)
            np.testing.assert_allclose(block @ directions.T, reference, rtol=1e-4, atol=1e-4, err_msg=where)
            np.testing.assert_allclose(block, adjoint, rtol=tfq_tolerance, atol=tfq_tolerance, err_msg=where)
    return found


def choice_variants(path: str) -> list[Choice]:
    """The planner's choices on `path` that take other code in the kernel, each field's other value in one:
    the default (the tiles the test set), and the three-multiplication form with the next tile fetched ahead,
    small pages and the other number of parked bits. (Other tiles only cut other segments, which the tests of
    tiles cover.)"""
    default = choices.default()._replace(path=path)
    other_parked = next(p for p in choices.PARKS if p != default.parked)
    return [default, default._replace(form=3, prefetch=True, huge_pages=False, parked=other_parked)]


@contextlib.contextmanager
def kernel_on(path: str):
    """The kernel on `path` within the block (`kernel.use`), then on the path it ran on before."""
    before = kernel.use(path)
    try:
        yield
    finally:
        kernel.use(before)


@pytest.mark.core
@pytest.mark.parametrize("qubits, layers", [(4, 1), (4, 2), (5, 3), (8, 1), (8, 3), (11, 1), (11, 2)])
def test_qcnn_gradients(qubits, layers):
    rng = np.random.default_rng(qubits * 10 + layers)
    register = qubits_for(qubits)
    model, readout_qubits = qcnn_circuit(register, layers)
    symbols = sorted(cirq.parameter_symbols(model), key=str)
    circuits = [
        cluster_state_circuit(register) + cirq.rx(rng.uniform(-np.pi, np.pi))(register[i]) + model
        for i in rng.choice(qubits, size=3, replace=False)
    ]
    values = rng.uniform(-2, 2, size=(3, len(symbols)))
    readouts = [[cirq.Z(q) for q in readout_qubits]] * 3
    upstream = rng.uniform(-1, 1, size=(3, len(readout_qubits)))
    check(circuits, symbols, values, readouts, upstream)


@pytest.mark.parametrize("states, kept", [(5, 3), (3, 1)])
def test_the_gradient_from_kept_and_from_simulated_states(monkeypatch, states, kept):
    """A batch of 3 circuits on one thread with memory for `states` of their states: the forward keeps the final
    states the memory leaves beside a circuit in flight (2 states), all three or the last one's only, and the
    gradient sweeps back from those, simulating the others again: the same values either way, cirq's, central
    differences' and TFQ's."""
    rng = np.random.default_rng(9)
    register = qubits_for(9)
    model, readout_qubits = qcnn_circuit(register, 1)
    symbols = sorted(cirq.parameter_symbols(model), key=str)
    circuits = [cluster_state_circuit(register) + cirq.rx(0.3 * i)(register[i]) + model for i in range(3)]
    values = rng.uniform(-2, 2, size=(3, len(symbols)))
    readouts = [[cirq.Z(q) for q in readout_qubits]] * 3
    upstream = rng.uniform(-1, 1, size=(3, len(readout_qubits)))
    memory = states * state_model.AMPLITUDE_BYTES * 2**9
    final_states, from_kept = process_final_states(1, memory), []
    take = final_states.take

    def counted(key):
        state = take(key)
        from_kept.append(state.size > 0)
        return state

    monkeypatch.setattr(final_states, "take", counted)
    check(circuits, symbols, values, readouts, upstream, threads=(1,), memory=memory)
    runs = len(kernel.supported_paths()) * len(choice_variants(kernel.PATH))
    assert from_kept == ([False] * (3 - kept) + [True] * kept) * runs


def test_only_a_forward_a_gradient_may_follow_keeps_its_states():
    """The forward op keeps its final states where a gradient tape watches its symbol values (a training step),
    run eagerly or traced with its tape in a tf.function (as Keras traces a step); not without a tape
    (inference, validation) nor in one that watches other tensors."""
    circuits, symbols, values, readouts, _ = ladder_batch(8, 3, seed=5)
    adjoint = BlockAdjoint(threads=1)
    op = adjoint.generate_differentiable_op(analytic_op=tfq.get_expectation_op())
    inputs = (
        tfq.convert_to_tensor(circuits),
        tf.constant([str(s) for s in symbols]),
        tf.constant(values, tf.float32),
        tfq.convert_to_tensor(readouts),
    )

    def forward(tape: bool, watched: bool) -> tf.Tensor:
        with tf.GradientTape() if tape else contextlib.nullcontext() as recording:
            if watched:
                recording.watch(inputs[2])
            return op(*inputs)

    def kept_by(run, tape: bool, watched: bool) -> int:
        adjoint._states.clear()
        run(tape, watched)
        return len(adjoint._states._states)

    for run in (forward, tf.function(forward)):
        assert [kept_by(run, True, True), kept_by(run, True, False), kept_by(run, False, False)] == [3, 0, 0]


def test_final_states_are_kept_while_the_memory_holds_them():
    """Final states are kept while they fit the memory beside the circuits in flight (2 states each, one per
    thread while each fits with its kept state); the oldest go first."""
    states = FinalStates(threads=2, memory=16 * state_model.AMPLITUDE_BYTES * 2**23)
    for qubits, kept in ((23, 12), (25, 2)):  # 16 states of 23 qubits: 2 circuits in flight; 4 of 25: one
        state = np.empty((2, 2**qubits), np.float32)  # pages never touched: no memory taken
        for key in range(kept + 3):
            states.keep(key, state)
        assert [states.take(key) is state for key in range(kept + 3)] == [False] * 3 + [True] * kept


def test_the_memory_rule_of_a_16_vcpu_64_gib_node():
    """A worker of 15 CPUs on a 16-vCPU, 64 GiB node gives its states 0.75 x 60 GiB: 23 qubits (64 MiB a
    state) one circuit per thread and 690 kept states; 28 qubits (2 GiB) 7 circuits at once and 8 kept states;
    30 qubits (8 GiB) one circuit and 3 kept states; with no bound, every state is kept."""
    gib = 2**30
    memory = state_model.worker_state_memory(64 * gib, 16, 15)
    assert memory == 45 * gib
    for qubits, at_once, kept in ((23, 15, 690), (28, 7, 8), (30, 1, 3)):
        one = state_model.AMPLITUDE_BYTES * 2**qubits
        assert (state_model.circuits_at_once(one, 15, memory), state_model.kept_states(15, one, memory)) == (
            at_once,
            kept,
        )
        assert state_model.state_bytes(qubits, 15, memory) == (2 * at_once + kept) * one <= memory
    assert state_model.kept_states(15, 8 * 2**32, 15 * gib) == 0  # 32 qubits: one circuit, nothing kept
    assert state_model.kept_states(2, 8 * 2**23) == sys.maxsize


@pytest.mark.core
def test_one_circuit_shared_between_threads():
    """A batch of one 16-qubit circuit on 2 threads cuts every pass of the circuit in two: the values
    still equal cirq's, central differences and TFQ's; and on 1, 2 or 3 threads they agree within 1e-6, on
    every path."""
    rng = np.random.default_rng(16)
    register = qubits_for(16)
    model, readout_qubits = qcnn_circuit(register, 1)
    symbols = sorted(cirq.parameter_symbols(model), key=str)
    circuits = [cluster_state_circuit(register) + cirq.rx(0.7)(register[5]) + model]
    values = rng.uniform(-2, 2, size=(1, len(symbols)))
    readouts = [[cirq.Z(q) for q in readout_qubits]]
    upstream = rng.uniform(-1, 1, size=(1, len(readout_qubits)))
    found = check(circuits, symbols, values, readouts, upstream)
    for path in kernel.supported_paths():
        one, *shared = (found[path, threads] for threads in THREADS)
        for other in shared:
            np.testing.assert_allclose(other[0], one[0], atol=1e-6)
            np.testing.assert_allclose(other[1], one[1], atol=1e-6)


def count_states(monkeypatch, final_states: FinalStates) -> tuple[list, set]:
    """From here to the test's end: [states in flight now, the most the kernel's circuits in flight (2 states
    each) and `final_states`' kept states held at once], and the (thread, parts) of the kernel's calls."""
    held, parts_seen, lock = [0, 0], set(), threading.Lock()

    def counted(real, parts_at):
        def run(*args):
            with lock:
                held[0] += 2
                held[1] = max(held[1], held[0] + len(final_states._states))
                parts_seen.add((threading.current_thread().name.removesuffix("_0"), args[parts_at]))
            try:
                return real(*args)
            finally:
                with lock:
                    held[0] -= 2

        return run

    running = kernel.compiled(kernel.PATH)  # the module the plans' default choice runs on
    monkeypatch.setattr(running, "circuit_expectations", counted(running.circuit_expectations, 4))
    monkeypatch.setattr(running, "circuit_gradient", counted(running.circuit_gradient, 5))
    return held, parts_seen


@pytest.mark.parametrize(
    "states, slots",  # the memory in states of 16 qubits; the threads of each circuit run at once
    [(9, [1, 1, 1]), (6, [2, 1]), (3, [3]), (2, [3])],
)
def test_a_batch_fills_the_threads_by_size(monkeypatch, states, slots):
    """A batch of 3 circuits of 16 qubits on 3 threads, with memory for `states` of their states: one circuit
    per thread while each fits with its kept state (3 states), else as many at once as fit so, at least one,
    each on its share of the threads (no more than the CPUs), each slot on a thread of its own (its lane); the
    circuits in flight (2 states each) and the kept states never hold more states than the memory; the values
    equal one thread's with no bound within 1e-6."""
    circuits, symbols, values, readouts, upstream = ladder_batch(16, 3, seed=3)
    one_state = state_model.AMPLITUDE_BYTES * 2**16
    adjoint = BlockAdjoint(threads=3, memory=states * one_state)
    assert adjoint.slots(3, 16) == slots and adjoint.slots(1, 16) == [3]
    held, parts_seen = count_states(monkeypatch, adjoint._states)
    block = forward_and_gradient(adjoint, circuits, symbols, values, readouts, upstream)
    lanes = {(f"block-adjoint-{lane}", min(parts, sharing_threads())) for lane, parts in enumerate(slots)}
    assert held[1] <= max(states, 2) and parts_seen and parts_seen <= lanes
    monkeypatch.undo()
    reference = forward_and_gradient(BlockAdjoint(threads=1), circuits, symbols, values, readouts, upstream)
    np.testing.assert_allclose(block[0], reference[0], atol=1e-6)
    np.testing.assert_allclose(block[1], reference[1], atol=1e-6)


def test_a_shared_circuit_runs_on_its_lanes_thread_whoever_calls(monkeypatch):
    """Called from several threads in turn (as TensorFlow calls the op from its pool), a circuit shared
    between 2 threads always runs on the same thread, lane 0's, so that its passes always have the same
    OpenMP team."""
    circuits, symbols, values, readouts, _ = ladder_batch(16, 1, seed=6)
    adjoint = BlockAdjoint(threads=2)
    programs, names = tfq.convert_to_tensor(circuits).numpy(), np.array([str(s).encode() for s in symbols])
    sums = tfq.convert_to_tensor(readouts).numpy()
    _, seen = count_states(monkeypatch, adjoint._states)
    for _ in range(3):
        with concurrent.futures.ThreadPoolExecutor(1) as caller:
            caller.submit(adjoint.expectations, programs, names, values, sums, keep_states=False).result()
    assert seen == {("block-adjoint-0", min(2, sharing_threads()))}


def test_the_differentiators_of_a_process_share_its_memory(monkeypatch):
    """Two BlockAdjoints (two layers' gradients) with memory for 6 states of 16 qubits, each a batch of 3
    circuits on 3 threads, at the same time: they keep their states in one place, and their circuits in flight
    and kept states together never hold more than the 6 states (each alone would run 2 circuits at once); the
    values equal one thread's within 1e-6."""
    circuits, symbols, values, readouts, upstream = ladder_batch(16, 3, seed=4)
    memory = 6 * state_model.AMPLITUDE_BYTES * 2**16
    first, second = BlockAdjoint(threads=3, memory=memory), BlockAdjoint(threads=3, memory=memory)
    assert first._states is second._states and first.slots(3, 16) == [2, 1]
    programs, names = tfq.convert_to_tensor(circuits).numpy(), np.array([str(s).encode() for s in symbols])
    sums = tfq.convert_to_tensor(readouts).numpy()

    def forward_and_gradient_of(adjoint) -> tuple:
        return (
            adjoint.expectations(programs, names, values, sums),
            adjoint.gradient(programs, names, values, sums, upstream),
        )

    held, _ = count_states(monkeypatch, first._states)
    with concurrent.futures.ThreadPoolExecutor(2) as both:
        found = list(both.map(forward_and_gradient_of, (first, second)))
    assert held[1] <= 6
    monkeypatch.undo()
    reference = forward_and_gradient_of(BlockAdjoint(threads=1))
    for block in found:
        np.testing.assert_allclose(block[0], reference[0], atol=1e-6)
        np.testing.assert_allclose(block[1], reference[1], atol=1e-6)


@pytest.fixture
def tiles(monkeypatch):
    """tiles(bits, parked): plans made with tiles of 2^bits amplitudes (and `parked` parked bits) from then to
    the test's end (the plan cache cleared then, and again after the test)."""
    plans = importlib.import_module("qml_ray.gradients.plan")

    def planned_in_tiles_of(bits: int, parked: int = choices.DEFAULT_PARKED) -> None:
        monkeypatch.setattr(choices, "DEFAULT_TILE_BITS", bits)
        monkeypatch.setattr(choices, "DEFAULT_PARKED", parked)
        plans._plan.cache_clear()
        planner.planner.cache_clear()  # its choices made with other tiles

    yield planned_in_tiles_of
    plans._plan.cache_clear()  # the plans made with other tiles
    planner.planner.cache_clear()


@pytest.fixture
def tiles_of_10_bits(tiles):
    """Plans made with tiles of 2^10 amplitudes (the smallest the chunked passes allow), so that a small
    circuit's state holds several tiles and its blocks on bits below 10 form segments."""
    tiles(10)


def iswap_batch(qubits: int, pairs, circuits: int, seed: int) -> tuple:
    """Circuits of iSWAP**a on each pair (low, high) of register indices in turn, each followed by a rotation
    of the pair's upper qubit, each circuit with its own excitation. Its symbols, values, readouts (Z of every
    third qubit) and upstream."""
    rng = np.random.default_rng(seed)
    register = cirq.LineQubit.range(qubits)
    a, b = sympy.symbols("a b")
    body = cirq.Circuit(cirq.H.on_each(register))
    for low, high in pairs:
        body += [cirq.ISWAP(register[low], register[high]) ** a, cirq.rx(b * (1 + high / qubits))(register[high])]
    batch = [cirq.Circuit(cirq.ry(0.4 + i)(register[2 * i + 1])) + body for i in range(circuits)]
    readouts = [[cirq.Z(q) for q in register[::3]]] * circuits
    values = rng.uniform(-2, 2, size=(circuits, 2))
    return batch, [a, b], values, readouts, rng.uniform(-1, 1, size=(circuits, len(readouts[0])))


def ladder_batch(qubits: int, circuits: int, seed: int) -> tuple:
    """A ladder: every neighbouring pair in turn, so consecutive blocks share a qubit and do not commute."""
    return iswap_batch(qubits, itertools.pairwise(range(qubits)), circuits, seed)


def plan_of(circuits, symbols, readouts, row: int = 0) -> tuple:
    """A circuit's plan, and its readouts' arrays."""
    planned = plan(tfq.convert_to_tensor(circuits[row : row + 1]).numpy()[0], tuple(str(s) for s in symbols))
    return planned, planned.readout_arrays(tuple(tfq.convert_to_tensor(readouts[row : row + 1]).numpy()[0]))


@pytest.fixture(params=kernel.supported_paths())
def path_kernel(request):
    """The kernel's module of each SIMD path this CPU runs."""
    return kernel.compiled(request.param)


def kernel_forward_and_gradient(compiled, planned, readouts, values, upstream, parts: int) -> tuple:
    """A circuit's expectations and gradient straight from a kernel module, `parts` parts per pass."""
    circuit, kernel_readouts = compiled.Circuit(planned.circuit), compiled.Readouts(readouts)
    out, grad = np.zeros(len(upstream)), np.zeros(len(values))
    state = compiled.circuit_expectations(circuit, values, kernel_readouts, out, parts)
    compiled.circuit_gradient(circuit, values, kernel_readouts, upstream, grad, parts, state)
    return out, grad


def brickwork_batch(qubits: int, active: int, layers: int, circuits: int, seed: int) -> tuple:
    """Brickwork layers on the first `active` qubits: the even neighbouring pairs, then the odd ones (blocks of
    one layer commute, of the next do not)."""
    pairs = [(low, low + 1) for layer in range(layers) for low in range(layer % 2, active - 1, 2)]
    return iswap_batch(qubits, pairs, circuits, seed)


def bits_of(mask: int) -> set[int]:
    return {bit for bit in range(64) if (int(mask) >> bit) & 1}


def segments_of(circuit) -> list[tuple[set[int], np.ndarray]]:
    """Each segment of several blocks: its window's bits and its blocks' bits."""
    ends = circuit.segments
    return [
        (bits_of(circuit.windows[s]), circuit.block_qubits[ends[s] : ends[s + 1]])
        for s in range(len(ends) - 1)
        if ends[s + 1] - ends[s] > 1
    ]


def test_segments_applied_tile_by_tile(tiles_of_10_bits):
    """12 qubits in tiles of 2^10 amplitudes: consecutive blocks on the bits below 10 (which do not
    commute) are segments, each applied and un-applied a tile at a time; the values still equal cirq's,
    central differences and TFQ's, on every path and on 1, 2 and 3 threads."""
    circuits, symbols, values, readouts, upstream = ladder_batch(12, 2, seed=12)
    circuit = plan_of(circuits, symbols, readouts)[0].circuit
    assert circuit.tile_bits == 10 and np.diff(circuit.segments).max() >= 3
    check(circuits, symbols, values, readouts, upstream)


def test_segments_with_windows_among_the_high_bits(tiles):
    """Brickwork on 12 of 17 qubits (the idle ones parked on the lowest bits, so no relabelling) in tiles of 2^13
    amplitudes: blocks are put out of the circuit's order into segments, some on the highest bits, whose
    tiles are runs of the state far apart, some with windows of bits that are not consecutive; the values
    still equal cirq's, central differences and TFQ's, on every path and on 1, 2 and 3 threads."""
    tiles(13)
    circuits, symbols, values, readouts, upstream = brickwork_batch(17, 12, 4, 2, seed=17)
    circuit = plan_of(circuits, symbols, readouts)[0].circuit
    segments = segments_of(circuit)
    assert max(bits.max() for _, bits in segments) >= circuit.tile_bits
    assert any(max(window) - min(window) >= len(window) for window, _ in segments)  # a gap among its bits
    check(circuits, symbols, values, readouts, upstream)


def relabellings_in_tiles(circuit) -> list[bool]:
    """For each segment of several blocks that a relabelling starts: whether the relabelling leaves the
    segment's window alone, so that the kernel relabels tile by tile within the segment's pass."""
    found = []
    for s, window in enumerate(circuit.windows):
        row = circuit.relabel[circuit.segments[s]]
        if row >= 0 and window:
            found.append(all(circuit.bit_maps[row][bit] == bit for bit in bits_of(window)))
    return found


def test_relabellings_tile_by_tile(tiles):
    """Brickwork on 12 of 14 qubits in tiles of 2^10 amplitudes, five bits parked: relabellings that leave their
    segment's window alone are done tile by tile (before the segment's blocks on each tile, and after them in
    the backward sweep), another as a pass of its own; the values still equal cirq's, central differences and
    TFQ's, on every path and on 1, 2 and 3 threads."""
    tiles(10, parked=5)
    circuits, symbols, values, readouts, upstream = brickwork_batch(14, 12, 6, 2, seed=14)
    assert set(relabellings_in_tiles(plan_of(circuits, symbols, readouts)[0].circuit)) == {False, True}
    check(circuits, symbols, values, readouts, upstream)


def test_the_schedule_keeps_the_order_of_blocks_that_share_a_bit():
    """Random blocks (with relabellings and masked blocks among them) put into segments: every block once; a
    segment's blocks avoid its window; blocks that share a bit, or a relabelling between them, keep their
    order; a masked block keeps its place, a segment of its own; a window is qubits - TILE_BITS bits from
    LOWEST_WINDOW up; tiles with bits above TILE_BITS, windows with gaps and blocks out of order all occur, and
    there are fewer segments than blocks; a relabelling's first segment often has a window that leaves the
    relabelled bits alone (the kernel then relabels tile by tile)."""
    from qml_ray.gradients.plan.segments import LOWEST_WINDOW, TILE_BITS, schedule

    rng = np.random.default_rng(0)
    qubits, reordered, high_tiles, gaps, relabelled_in_tiles = 20, 0, 0, 0, 0
    for _ in range(50):
        placed = [tuple(rng.choice(np.arange(5, qubits), 2, replace=False)) for _ in range(30)]
        relabel = [-1 if b == 0 or rng.random() > 0.1 else 0 for b in range(30)]
        masked = list(rng.random(30) < 0.05)
        bit_map = np.arange(qubits)
        highs = rng.choice(np.arange(5, qubits), 5, replace=False)
        bit_map[:5], bit_map[highs] = highs, np.arange(5)
        order, segments, windows = schedule(placed, relabel, masked, qubits, [bit_map])
        assert sorted(order) == list(range(30)) and len(windows) == len(segments) - 1 < 30
        position = {b: i for i, b in enumerate(order)}
        stretch = np.cumsum([r >= 0 or m for r, m in zip(relabel, masked)])
        for a, b in itertools.combinations(range(30), 2):
            if set(placed[a]) & set(placed[b]) or stretch[a] != stretch[b]:
                assert position[a] < position[b]
        for b in np.flatnonzero(masked):
            assert order[b] == b and b in segments and b + 1 in segments
        for s, mask in enumerate(windows):
            blocks, window = order[segments[s] : segments[s + 1]], bits_of(mask)
            assert window or len(blocks) == 1
            if not window:
                continue
            assert len(window) == qubits - TILE_BITS and min(window) >= LOWEST_WINDOW
            assert window.isdisjoint(bit for b in blocks for bit in placed[b])
            high_tiles += max(window) < qubits - 1
            gaps += max(window) - min(window) >= len(window)
            if relabel[segments[s]] >= 0:  # a relabelling keeps its place, starting its stretch
                relabelled_in_tiles += window.isdisjoint(highs)
        reordered += order != sorted(order)
    assert reordered and high_tiles and gaps and relabelled_in_tiles


@pytest.mark.parametrize("parts", [2, 3])
def test_segments_cut_between_threads_agree_with_one_thread(tiles_of_10_bits, path_kernel, parts):
    """One 16-qubit circuit in tiles of 2^10 amplitudes, its segments' tiles shared between `parts` of the
    kernel's threads: the expectations and gradient equal one thread's within 1e-6, on every path."""
    circuits, symbols, values, readouts, upstream = ladder_batch(16, 1, seed=16)
    planned, arrays = plan_of(circuits, symbols, readouts)
    assert np.diff(planned.circuit.segments).max() >= 3
    one, shared = (
        kernel_forward_and_gradient(path_kernel, planned, arrays, values[0], upstream[0], n) for n in (1, parts)
    )
    assert np.abs(one[1]).max() > 0.01  # a real gradient
    np.testing.assert_allclose(shared[0], one[0], atol=1e-6)
    np.testing.assert_allclose(shared[1], one[1], atol=1e-6)


@pytest.mark.slow
def test_26_qubits_against_a_closed_form():
    """26 qubits (512 MiB per state), one circuit on 2 threads: pairs of far-apart qubits, each put in a
    parametrised two-qubit state, then CZ between every neighbour, which leaves each Z's expectation
    alone. So <Z_q> is its pair's, simulated by cirq on two qubits in double precision, and the gradient
    is central differences of those."""
    qubits = 26
    register = cirq.LineQubit.range(qubits)
    pairs = [(register[k], register[k + qubits // 2]) for k in range(qubits // 2)]
    symbols = sympy.symbols(f"t0:{3 * len(pairs)}")

    def pair_circuit(k: int) -> cirq.Circuit:
        a, b = pairs[k]
        x, y, z = symbols[3 * k : 3 * k + 3]
        return cirq.Circuit(cirq.rx(x)(a), cirq.ry(y)(b), cirq.XXPowGate(exponent=z)(a, b), cirq.rz(x)(b))

    circuit = sum((pair_circuit(k) for k in range(len(pairs))), cirq.Circuit())
    circuit += cirq.Circuit(cirq.CZ(a, b) for a, b in itertools.pairwise(register))
    rng = np.random.default_rng(26)
    values = rng.uniform(-2, 2, size=len(symbols))
    upstream = rng.uniform(-1, 1, size=qubits)
    readouts = [cirq.Z(q) for q in register]

    def pair_objective(k: int, pair_values) -> float:
        a, b = pairs[k]
        weights = upstream[[register.index(a), register.index(b)]]
        return cirq_objective(pair_circuit(k), symbols[3 * k : 3 * k + 3], pair_values, [cirq.Z(a), cirq.Z(b)], weights)

    expected = np.zeros(qubits)
    gradient = np.zeros(len(symbols))
    for k, (a, b) in enumerate(pairs):
        own = values[3 * k : 3 * k + 3]
        expected[[register.index(a), register.index(b)]] = cirq_expectations(
            pair_circuit(k), symbols[3 * k : 3 * k + 3], own, [cirq.Z(a), cirq.Z(b)]
        )
        for j in range(3):
            step = np.eye(3)[j] * STEP
            gradient[3 * k + j] = (pair_objective(k, own + step) - pair_objective(k, own - step)) / (2 * STEP)
    forward, block = forward_and_gradient(
        BlockAdjoint(threads=2), [circuit], symbols, values[None], [readouts], upstream[None]
    )
    np.testing.assert_allclose(forward[0], expected, atol=1e-5)
    np.testing.assert_allclose(block[0], gradient, atol=1e-4)


def random_state(rng, qubits: int) -> np.ndarray:
    """A random state as the kernel holds it: float32 planes (real, imaginary)."""
    return rng.standard_normal((2, 1 << qubits)).astype(np.float32)


def as_tensor(state: np.ndarray, qubits: int) -> np.ndarray:
    """The state as a complex128 tensor with one axis per qubit, bit q on axis qubits - 1 - q."""
    return (state[0].astype(np.float64) + 1j * state[1]).reshape((2,) * qubits)


def on_bits(u: np.ndarray, state: np.ndarray, hi: int, lo: int, qubits: int) -> np.ndarray:
    """u (basis index 2 * bit(hi) + bit(lo)) applied to the state's bits hi and lo, in double precision."""
    axes = (qubits - 1 - hi, qubits - 1 - lo)
    moved = np.tensordot(u.reshape(2, 2, 2, 2), as_tensor(state, qubits), axes=([2, 3], list(axes)))
    return np.moveaxis(moved, [0, 1], list(axes))


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("lo", range(12))
def test_a_block_on_every_bit_pair(path_kernel, lo, parts):
    """Every pass of a block (each chunk length, and the bits below the chunks) against numpy in
    double precision, on every path: the forward, and the backward's un-applied states and transition
    matrix; whole, and cut into 3 parts run on the kernel's threads."""
    qubits, rng = 12, np.random.default_rng(lo)
    u = np.linalg.qr(rng.standard_normal((4, 4)) + 1j * rng.standard_normal((4, 4)))[0]
    for hi in set(range(qubits)) - {lo}:
        psi, lam = random_state(rng, qubits), random_state(rng, qubits)
        expected_psi = on_bits(u, psi, hi, lo, qubits)
        applied = psi.copy()
        path_kernel.apply_block(applied, u, hi, lo, parts)
        np.testing.assert_allclose(as_tensor(applied, qubits), expected_psi, atol=1e-5)

        ud = u.conj().T
        back_psi, back_lam = on_bits(ud, psi, hi, lo, qubits), on_bits(ud, lam, hi, lo, qubits)
        rows = np.moveaxis(back_psi, [qubits - 1 - hi, qubits - 1 - lo], [0, 1]).reshape(4, -1)
        columns = np.moveaxis(as_tensor(lam, qubits), [qubits - 1 - hi, qubits - 1 - lo], [0, 1]).reshape(4, -1)
        transition = path_kernel.unapply_with_transition(psi, lam, u, hi, lo, parts)
        np.testing.assert_allclose(as_tensor(psi, qubits), back_psi, atol=1e-5)
        np.testing.assert_allclose(as_tensor(lam, qubits), back_lam, atol=1e-5)
        np.testing.assert_allclose(transition, rows @ columns.conj().T, atol=1e-3)


def test_large_states_keep_their_planes_off_a_power_of_two(path_kernel):
    """From 2 MiB (18 qubits) a state's imaginary plane starts a gap after its real one's 2^n floats (planes
    exactly 2^26 floats apart alias in an AMD Zen core's L1, docs/kernel-notes.md#the-state-two-planes). A pass
    reads a state by its strides: a block on such a state agrees with numpy's."""
    (circuit, *_), symbols, values, readouts, _ = ladder_batch(18, 1, seed=4)
    planned, kernel_readouts = plan_of([circuit], symbols, readouts)
    out = np.zeros(len(readouts[0]))
    state = path_kernel.circuit_expectations(
        path_kernel.Circuit(planned.circuit), values[0], path_kernel.Readouts(kernel_readouts), out, 1
    )
    assert state.shape == (2, 2**18) and state.strides[0] > 4 * 2**18 and state.strides[1] == 4
    u = np.linalg.qr(np.random.default_rng(5).standard_normal((4, 4)) + 0j)[0]
    expected = on_bits(u, state, 17, 9, 18)
    path_kernel.apply_block(state, u, 17, 9, 1)
    np.testing.assert_allclose(as_tensor(state, 18), expected, atol=1e-5)


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("lows", [(0,), (1, 3), (0, 2, 3), (0, 1, 2), (0, 1, 2, 4), (0, 1, 2, 3), (0, 1, 2, 3, 4)])
def test_a_relabelling_swaps_bits(path_kernel, lows, parts):
    """A relabelling moves every amplitude to the index with its low bits and high bits swapped: the
    state's tensor with those axes exchanged, exactly, on every path; whole, and cut into 3 parts."""
    qubits, rng = 12, np.random.default_rng(len(lows))
    highs = rng.choice(range(kernel.PARKED_BITS, qubits), size=len(lows), replace=False)
    bit_map = np.arange(qubits)
    bit_map[list(lows)], bit_map[highs] = highs, lows
    state = random_state(rng, qubits)
    axes = [qubits - 1 - q for q in bit_map]  # bit q's axis goes where bit bit_map[q]'s was
    expected = np.moveaxis(as_tensor(state, qubits), [qubits - 1 - q for q in range(qubits)], axes)
    path_kernel.relabel_bits(state, bit_map, parts)
    np.testing.assert_array_equal(as_tensor(state, qubits), expected)


SYMBOLS = sympy.symbols("a b c d")


def random_parameter(rng):
    """A number, a symbol, or a number times a symbol (the forms TFQ serializes)."""
    symbol = SYMBOLS[rng.integers(len(SYMBOLS))]
    return [float(rng.uniform(-1, 1)), symbol, float(rng.uniform(-3, 3)) * symbol][rng.integers(3)]


def random_gate(rng, qubits):
    """One gate of a random supported family on random qubits."""
    a, b, c = (qubits[i] for i in rng.choice(len(qubits), size=3, replace=False))
    p, t = random_parameter(rng), random_parameter(rng)
    families = [
        lambda: cirq.X(a) ** p,
        lambda: cirq.Y(a) ** p,
        lambda: cirq.Z(a) ** p,
        lambda: cirq.H(a) ** p,
        lambda: cirq.S(a),
        lambda: cirq.T(a),
        lambda: cirq.H(a),
        lambda: cirq.rx(p)(a),
        lambda: cirq.ry(p)(a),
        lambda: cirq.rz(p)(a),
        lambda: cirq.CZ(a, b) ** p,
        lambda: cirq.CNOT(a, b) ** p,
        lambda: cirq.SWAP(a, b) ** p,
        lambda: cirq.ISWAP(a, b) ** p,
        lambda: cirq.XX(a, b) ** p,
        lambda: cirq.YY(a, b) ** p,
        lambda: cirq.ZZ(a, b) ** p,
        lambda: cirq.FSimGate(theta=p, phi=t)(a, b),
        lambda: cirq.PhasedXPowGate(phase_exponent=p, exponent=t)(a),
        lambda: cirq.PhasedISwapPowGate(phase_exponent=p, exponent=t)(a, b),
        lambda: cirq.ry(p)(a).controlled_by(b),
        lambda: cirq.rx(p)(a).controlled_by(b, c, control_values=[0, 1]),
        lambda: (cirq.XX(a, b) ** p).controlled_by(c, control_values=[0]),
    ]
    return families[rng.integers(len(families))]()


def random_readouts(rng, qubits):
    """Three readouts: a single Z, a two-term Pauli sum with a multi-qubit string, a Y string."""
    a, b, c = (qubits[i] for i in rng.choice(len(qubits), size=3, replace=False))
    return [cirq.Z(a), 0.5 * cirq.X(a) * cirq.Y(b) - 1.5 * cirq.Z(b) * cirq.Z(c), -0.8 * cirq.Y(c) * cirq.X(b)]


@pytest.mark.core
@pytest.mark.parametrize("qubits", [3, 4, 5, 6, 8])
def test_random_circuits_of_every_gate_family(qubits):
    rng = np.random.default_rng(qubits)
    register = cirq.GridQubit.rect(1, qubits)
    circuits = [
        cirq.Circuit(cirq.H.on_each(register), (random_gate(rng, register) for _ in range(30))) for _ in range(3)
    ]
    values = rng.uniform(-1.5, 1.5, size=(3, len(SYMBOLS)))
    readouts = [random_readouts(rng, register) for _ in circuits]
    upstream = rng.uniform(-1, 1, size=(3, 3))
    check(circuits, SYMBOLS, values, readouts, upstream, tfq_tolerance=1e-3)


@pytest.mark.core
@pytest.mark.parametrize("qubits", [6, 12])
def test_every_path_against_cirq(path_kernel, qubits):
    """Random circuits of every gate family straight through each path's kernel, whole and in 2 parts:
    expectations equal cirq's within 1e-5, gradients central differences' within 1e-4."""
    rng = np.random.default_rng(100 + qubits)
    register = cirq.GridQubit.rect(1, qubits)
    circuits = [
        cirq.Circuit(cirq.H.on_each(register), (random_gate(rng, register) for _ in range(3 * qubits)))
        for _ in range(2)
    ]
    values = rng.uniform(-1.5, 1.5, size=(2, len(SYMBOLS)))
    readouts = [random_readouts(rng, register) for _ in circuits]
    upstream = rng.uniform(-1, 1, size=(2, 3))
    reference = finite_differences(circuits, SYMBOLS, values, readouts, upstream)
    assert np.abs(reference).max() > 0.01  # a real gradient
    for row, circuit in enumerate(circuits):
        planned, arrays = plan_of(circuits, SYMBOLS, readouts, row)
        exact = cirq_expectations(circuit, SYMBOLS, values[row], readouts[row])
        for parts in (1, 2):
            out, grad = kernel_forward_and_gradient(path_kernel, planned, arrays, values[row], upstream[row], parts)
            np.testing.assert_allclose(out, exact, atol=1e-5)
            np.testing.assert_allclose(grad, reference[row], rtol=1e-4, atol=1e-4)


def test_diagonal_gates_wait_for_the_block_on_their_pair():
    """CZ and ZZ commute with each other, so the fusion moves them to the next block on their pair
    unless a gate that does not commute with them must come first (the rx before ZZ(c, a) below forces
    CZ(a, b) out first), or, constant, into the circuit's start; the result still equals cirq's."""
    a, b, c = register = cirq.GridQubit.rect(1, 3)
    p, q, r, s = SYMBOLS
    cluster = cirq.Circuit(cirq.H.on_each(register), cirq.CZ(a, b) ** p, cirq.CZ(b, c), cirq.CZ(c, a) ** q)
    conv = cirq.Circuit(cirq.rx(r)(a), cirq.ry(s)(b), cirq.XX(a, b) ** q)
    forced = cirq.Circuit(
        cirq.H.on_each(register), cirq.CZ(a, b) ** p, cirq.rx(r)(a), cirq.ZZ(c, a) ** q, cirq.XX(a, b) ** s
    )
    names = tuple(str(x) for x in SYMBOLS)
    merged, kept = (plan(tfq.convert_to_tensor([c]).numpy()[0], names) for c in (cluster + conv, forced))
    assert len(merged.circuit.block_qubits) == 2  # CZ(a, b) joined the XX block, CZ(b, c) the start
    assert len(kept.circuit.block_qubits) == 3  # three two-qubit gates, each in a block of its own
    rng = np.random.default_rng(7)
    values = rng.uniform(-1.5, 1.5, size=(2, len(SYMBOLS)))
    readouts = [random_readouts(rng, register) for _ in range(2)]
    check([cluster + conv, forced], SYMBOLS, values, readouts, rng.uniform(-1, 1, size=(2, 3)))


def random_start(rng, register) -> tuple[cirq.Circuit, cirq.Circuit]:
    """A circuit's start, as the plan writes it in one pass: two constant one-qubit gates on each qubit,
    then constant diagonal gates on random pairs; and a ZZ with a symbol among the diagonal gates, which
    stays out of the start (the constant ones after it commute past it into the start)."""
    ones = [cirq.H, cirq.X**0.3, cirq.Y**-0.7, cirq.rx(0.4), cirq.PhasedXPowGate(phase_exponent=0.2, exponent=0.6)]
    product = cirq.Circuit(ones[i](q) for q in register for i in rng.choice(len(ones), size=2))

    def diagonal(a, b):
        return [
            cirq.CZ(a, b),
            cirq.CZ(a, b) ** rng.uniform(-1, 1),
            cirq.ZZ(a, b) ** rng.uniform(-1, 1),
            cirq.rz(rng.uniform(-1, 1))(a),
            cirq.Z(a).controlled_by(b, control_values=[0]),
        ][rng.integers(5)]

    pairs = [rng.choice(len(register), size=2, replace=False) for _ in range(2 * len(register))]
    diagonals = [diagonal(register[i], register[j]) for i, j in pairs]
    symbolic = cirq.ZZ(register[0], register[-1]) ** SYMBOLS[0]
    return product + diagonals[: len(register)] + symbolic + diagonals[len(register) :], cirq.Circuit(symbolic)


@pytest.mark.parametrize(("qubits", "tile_bits"), [(3, None), (12, None), (14, 12), (16, None)])
def test_the_start_is_written_as_a_state(tiles, qubits, tile_bits):
    """The constant one-qubit gates at a circuit's start and the constant diagonal gates after them are no
    blocks but the state the first block starts from; with any gates after (from a rx with a symbol on every
    qubit, which ends every qubit's start), expectations and gradients still equal cirq's (3 qubits: padded to
    the kernel's 5; 12: the start written in chunks, with diagonal gates linking bits inside and outside a
    chunk, a table for each setting of the bits above; 14 in tiles of 2^12: written by the first segment tile
    by tile, each tile two runs of 2^11; 16: more bits above linked than the tables take, the rest of the
    links multiplied in bit by bit)."""
    if tile_bits:
        tiles(tile_bits)
    rng = np.random.default_rng(qubits)
    register = cirq.GridQubit.rect(1, qubits)
    names = tuple(str(x) for x in SYMBOLS)
    circuits, beyond_tables = [], []
    for _ in range(3):
        start, left_in = random_start(rng, register)
        after = cirq.Circuit(cirq.rx(SYMBOLS[1])(q) for q in register)
        if tile_bits:  # blocks on disjoint pairs first, so that the first segment takes several
            after += (cirq.CNOT(register[q], register[q + 1]) for q in range(0, qubits - 1, 2))
        after += (random_gate(rng, register) for _ in range(2 * qubits))
        circuits.append(start + after)
        full, without = (plan(tfq.convert_to_tensor([c]).numpy()[0], names) for c in (start + after, left_in + after))
        assert len(full.circuit.block_qubits) == len(without.circuit.block_qubits)
        assert not tile_bits or bits_of(full.circuit.windows[0]) == {11, 12}  # the first segment's window
        assert (len(full.circuit.start_table_bits) > 0) == (qubits > 10)  # links to bits above in the tables
        beyond_tables.append(full.circuit.start_linked.any())  # links multiplied in bit by bit
    assert any(beyond_tables) == (qubits == 16)
    values = rng.uniform(-1.5, 1.5, size=(3, len(SYMBOLS)))
    readouts = [random_readouts(rng, register) for _ in circuits]
    check(circuits, SYMBOLS, values, readouts, rng.uniform(-1, 1, size=(3, 3)), tfq_tolerance=1e-3)


def test_every_gate_family_is_covered():
    """The random circuits above draw from every family, each with a symbol somewhere."""
    rng = np.random.default_rng(0)
    register = cirq.GridQubit.rect(1, 3)
    gates = [random_gate(rng, register) for _ in range(2000)]
    kinds = {type(op.gate).__name__ for op in gates if cirq.is_parameterized(op)}
    assert {
        "XPowGate",
        "YPowGate",
        "ZPowGate",
        "HPowGate",
        "Rx",
        "Ry",
        "Rz",
        "CZPowGate",
        "CXPowGate",
        "SwapPowGate",
        "ISwapPowGate",
        "XXPowGate",
        "YYPowGate",
        "ZZPowGate",
        "FSimGate",
        "PhasedXPowGate",
        "PhasedISwapPowGate",
        "ControlledGate",
    } <= kinds | {type(op).__name__ for op in gates}


@pytest.mark.parametrize("qubits, moments", [(5, 12), (8, 10), (12, 6)])
def test_tfq_random_circuits_with_controls(qubits, moments):
    """Circuits drawn by TFQ's own generator: every gate of tfq.util.get_supported_gates(), half of them with
    up to 3 controls of random values; expectations and gradients against cirq's, central differences' and
    TFQ's Adjoint."""
    random.seed(qubits), np.random.seed(qubits)  # TFQ's generator draws from both
    names = [f"s{k}" for k in range(5)]
    circuits, resolvers = tfq.util.random_symbol_circuit_resolver_batch(
        cirq.GridQubit.rect(1, qubits), names, 2, n_moments=moments
    )
    assert any(len(op.qubits) > 2 for c in circuits for op in c.all_operations())  # masked gates among them
    rng = np.random.default_rng(qubits)
    values = np.array([[r.value_of(name) for name in names] for r in resolvers])
    readouts = [random_readouts(rng, sorted(c.all_qubits())) for c in circuits]
    check(circuits, sympy.symbols(names), values, readouts, rng.uniform(-1, 1, size=(2, 3)), tfq_tolerance=1e-3)


@pytest.mark.core
@pytest.mark.parametrize("controls", [0, 1, 2, 3])
def test_every_tfq_gate_with_controls(controls):
    """Each gate of tfq.util.get_supported_gates() (identity included) with a symbol and `controls` controls of
    random values, after a rotation of each of its qubits: expectations and gradients against cirq's,
    central differences' and TFQ's Adjoint."""
    rng = np.random.default_rng(controls)
    register = cirq.GridQubit.rect(1, 6)
    a, b = SYMBOLS[:2]
    circuits, readouts = [], []
    for gate, arity in tfq.util.get_supported_gates().items():
        chosen = [register[i] for i in rng.choice(len(register), size=arity + controls, replace=False)]
        operation = gate.on(*chosen[:arity]) if gate == cirq.I else (gate ** (0.7 * b)).on(*chosen[:arity])
        if controls:  # as TFQ's generator makes them (cirq's controlled_by gives CCZ, CCX: TFQ cannot serialize)
            operation = cirq.ControlledOperation(chosen[arity:], operation, rng.integers(2, size=controls).tolist())
        rotations = cirq.Circuit(cirq.ry(a * (1 + k / 3))(q) for k, q in enumerate(register))
        circuits.append(rotations + operation + cirq.rx(a)(chosen[0]))
        readouts.append(random_readouts(rng, chosen if len(chosen) >= 3 else register[:3]))
    values = rng.uniform(-1.5, 1.5, size=(len(circuits), 2))
    check(circuits, SYMBOLS[:2], values, readouts, rng.uniform(-1, 1, size=(len(circuits), 3)), tfq_tolerance=1e-3)


def masked_on_bits(u, state, hi, lo, mask, value, qubits) -> np.ndarray:
    """u on the state's bits hi and lo where its bits & mask == value, the other amplitudes as they are."""
    match = (np.arange(1 << qubits) & mask) == value
    return np.where(match.reshape((2,) * qubits), on_bits(u, state, hi, lo, qubits), as_tensor(state, qubits))


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("lo", [0, 2, 4, 5, 8, 11])
def test_a_masked_block_on_every_bit_position(path_kernel, lo, parts):
    """A block masked by 1 to 3 control bits of values 0 and 1, its pair and controls on every bit (the parked
    bits below kernel.PARKED_BITS, below and above the chunks' kernel.CHUNK_BITS, controls above and below the
    pair) against numpy in double precision, on every path, whole and in 3 parts: the forward touches only the
    matching amplitudes, the backward un-applies there and sums the transition matrix over them."""
    qubits, rng = 12, np.random.default_rng(lo)
    u = np.linalg.qr(rng.standard_normal((4, 4)) + 1j * rng.standard_normal((4, 4)))[0]
    for hi in set(range(qubits)) - {lo}:
        others = [bit for bit in range(qubits) if bit not in (hi, lo)]
        controls = rng.choice(others, size=1 + hi % 3, replace=False)
        mask, value = sum(1 << int(c) for c in controls), sum(int(rng.integers(2)) << int(c) for c in controls)
        psi, lam = random_state(rng, qubits), random_state(rng, qubits)
        applied = psi.copy()
        path_kernel.apply_block(applied, u, hi, lo, parts, mask, value)
        expected = masked_on_bits(u, psi, hi, lo, mask, value, qubits)
        np.testing.assert_allclose(as_tensor(applied, qubits), expected, atol=1e-5)

        ud = u.conj().T
        back_psi = masked_on_bits(ud, psi, hi, lo, mask, value, qubits)
        back_lam = masked_on_bits(ud, lam, hi, lo, mask, value, qubits)
        match = ((np.arange(1 << qubits) & mask) == value).reshape((2,) * qubits)
        pair = [qubits - 1 - hi, qubits - 1 - lo]
        matching = np.moveaxis(match, pair, [0, 1]).reshape(4, -1)[0]
        rows = np.moveaxis(back_psi, pair, [0, 1]).reshape(4, -1)[:, matching]
        columns = np.moveaxis(as_tensor(lam, qubits), pair, [0, 1]).reshape(4, -1)[:, matching]
        transition = path_kernel.unapply_with_transition(psi, lam, u, hi, lo, parts, mask, value)
        np.testing.assert_allclose(as_tensor(psi, qubits), back_psi, atol=1e-5)
        np.testing.assert_allclose(as_tensor(lam, qubits), back_lam, atol=1e-5)
        np.testing.assert_allclose(transition, rows @ columns.conj().T, atol=1e-3)


def test_masked_gates_among_segments_and_parked_qubits(tiles):
    """17 qubits in tiles of 2^13 amplitudes: brickwork on 12 (segments, some windows among the high bits)
    with multi-controlled gates between its layers, controlled by active qubits (high bits) and idle ones (parked
    on the five low bits), of values 0 and 1, targets on both sides of their controls; the values equal cirq's,
    central differences and TFQ's, on every path and on 1, 2 and 3 threads."""
    tiles(13, parked=5)
    qubits = 17
    circuits, symbols, values, readouts, upstream = brickwork_batch(qubits, 12, 4, 2, seed=17)
    register = cirq.LineQubit.range(qubits)
    a, b = symbols
    masked = [
        (cirq.ISWAP(register[3], register[4]) ** a).controlled_by(register[15], control_values=[0]),
        cirq.ry(b)(register[1]).controlled_by(register[16], register[8], register[13], control_values=[1, 0, 1]),
        (cirq.ZZ(register[10], register[6]) ** b).controlled_by(register[14], register[2], control_values=[1, 1]),
        cirq.rx(a)(register[11]).controlled_by(register[0], register[12], control_values=[0, 0]),
    ]
    circuits = [cirq.Circuit(c[: len(c) // 2], masked, c[len(c) // 2 :]) for c in circuits]
    planned = plan_of(circuits, symbols, readouts)[0]
    circuit = planned.circuit
    masks = [int(m) for m in circuit.block_mask if m]
    assert len(masks) == 4 and len(segments_of(circuit)) >= 2
    assert any(m >> circuit.tile_bits for m in masks)  # controls on the high bits ...
    assert any(m & ((1 << planned.choice.parked) - 1) for m in masks)  # ... and on the parked ones
    check(circuits, symbols, values, readouts, upstream)


def test_a_noise_channel_is_one_line_naming_the_route():
    """A circuit with a noise channel: one error line naming the channel and what can take it, as TFQ's own
    Adjoint cannot either."""
    qubits = cirq.GridQubit.rect(1, 3)
    circuit = cirq.Circuit(cirq.H.on_each(qubits), cirq.depolarize(0.1)(qubits[1]), cirq.X(qubits[0]) ** SYMBOLS[0])
    with pytest.raises((tf.errors.OpError, UnsupportedGate)) as raised:  # eager: as raised; in a graph: wrapped
        forward_and_gradient(BlockAdjoint(), [circuit], SYMBOLS[:1], np.array([[0.3]]), [[cirq.Z(qubits[2])]], [[1.0]])
    lines = [line for line in str(raised.value).splitlines() if "cannot differentiate" in line]
    assert lines and "DepolarizingChannel" in lines[0] and "NoisyPQC" in lines[0] and "ParameterShift" in lines[0]
