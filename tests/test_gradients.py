"""BlockAdjoint's gradients against TFQ's Adjoint and central differences of cirq's double-precision
simulator, on the QCNN, on random circuits of every supported gate family, and in training."""

import csv

import cirq
import numpy as np
import pytest
import sympy
import tensorflow as tf
import tensorflow_quantum as tfq

from qml_ray.gradients import BlockAdjoint, UnsupportedGate, kernel
from qml_ray.gradients.plan import plan
from qml_ray.model import cluster_state_circuit, qcnn_circuit, qubits_for

from conftest import ROOT, run_command

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


def check(circuits, symbols, values, readouts, upstream, tfq_tolerance=1e-4) -> None:
    """Block expectations equal cirq's and TFQ's within 1e-5; block gradients equal cirq's central
    differences within 1e-4, and TFQ's Adjoint within `tfq_tolerance` (TFQ's own float32 gradient strays
    further on some gate mixes)."""
    block_forward, block = forward_and_gradient(BlockAdjoint(threads=2), circuits, symbols, values, readouts, upstream)
    tfq_forward, adjoint = forward_and_gradient(
        tfq.differentiators.Adjoint(), circuits, symbols, values, readouts, upstream
    )
    exact = [cirq_expectations(c, symbols, v, r) for c, v, r in zip(circuits, values.astype(np.float64), readouts)]
    np.testing.assert_allclose(block_forward, exact, atol=1e-5)
    np.testing.assert_allclose(block_forward, tfq_forward, atol=1e-5)
    reference = finite_differences(circuits, symbols, values, readouts, upstream)
    assert np.abs(reference).max() > 0.01  # a real gradient, not zeros everywhere
    np.testing.assert_allclose(block, reference, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(block, adjoint, rtol=tfq_tolerance, atol=tfq_tolerance)


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


@pytest.mark.parametrize("lo", range(12))
def test_a_block_on_every_bit_pair(lo):
    """Every pass of a block (each chunk length, and the bits below the chunks) against numpy in
    double precision: the forward, and the backward's un-applied states and transition matrix."""
    qubits, rng = 12, np.random.default_rng(lo)
    u = np.linalg.qr(rng.standard_normal((4, 4)) + 1j * rng.standard_normal((4, 4)))[0]
    for hi in set(range(qubits)) - {lo}:
        psi, lam = random_state(rng, qubits), random_state(rng, qubits)
        expected_psi = on_bits(u, psi, hi, lo, qubits)
        applied = psi.copy()
        kernel.apply_block(applied, u, hi, lo)
        np.testing.assert_allclose(as_tensor(applied, qubits), expected_psi, atol=1e-5)

        ud = u.conj().T
        back_psi, back_lam = on_bits(ud, psi, hi, lo, qubits), on_bits(ud, lam, hi, lo, qubits)
        rows = np.moveaxis(back_psi, [qubits - 1 - hi, qubits - 1 - lo], [0, 1]).reshape(4, -1)
        columns = np.moveaxis(as_tensor(lam, qubits), [qubits - 1 - hi, qubits - 1 - lo], [0, 1]).reshape(4, -1)
        transition = kernel.unapply_with_transition(psi, lam, u, hi, lo)
        np.testing.assert_allclose(as_tensor(psi, qubits), back_psi, atol=1e-5)
        np.testing.assert_allclose(as_tensor(lam, qubits), back_lam, atol=1e-5)
        np.testing.assert_allclose(transition, rows @ columns.conj().T, atol=1e-3)


SYMBOLS = sympy.symbols("a b c d")


def random_parameter(rng):
    """A number, a symbol, or a number times a symbol (the forms TFQ serializes)."""
    symbol = SYMBOLS[rng.integers(len(SYMBOLS))]
    return [float(rng.uniform(-1, 1)), symbol, float(rng.uniform(-3, 3)) * symbol][rng.integers(3)]


def random_gate(rng, qubits):
    """One gate of a random supported family on random qubits."""
    a, b = (qubits[i] for i in rng.choice(len(qubits), size=2, replace=False))
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
    ]
    return families[rng.integers(len(families))]()


def random_readouts(rng, qubits):
    """Three readouts: a single Z, a two-term Pauli sum with a multi-qubit string, a Y string."""
    a, b, c = (qubits[i] for i in rng.choice(len(qubits), size=3, replace=False))
    return [cirq.Z(a), 0.5 * cirq.X(a) * cirq.Y(b) - 1.5 * cirq.Z(b) * cirq.Z(c), -0.8 * cirq.Y(c) * cirq.X(b)]


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


def test_diagonal_gates_wait_for_the_block_on_their_pair():
    """CZ and ZZ commute with each other, so the fusion moves them to the next block on their pair
    unless a gate that does not commute with them must come first (the rx before ZZ(c, a) below forces
    CZ(a, b) out first); the result still equals cirq's."""
    a, b, c = register = cirq.GridQubit.rect(1, 3)
    p, q, r, s = SYMBOLS
    cluster = cirq.Circuit(cirq.H.on_each(register), cirq.CZ(a, b) ** p, cirq.CZ(b, c), cirq.CZ(c, a) ** q)
    conv = cirq.Circuit(cirq.rx(r)(a), cirq.ry(s)(b), cirq.XX(a, b) ** q)
    forced = cirq.Circuit(
        cirq.H.on_each(register), cirq.CZ(a, b) ** p, cirq.rx(r)(a), cirq.ZZ(c, a) ** q, cirq.XX(a, b) ** s
    )
    names = tuple(str(x) for x in SYMBOLS)
    merged, kept = (plan(tfq.convert_to_tensor([c]).numpy()[0], names) for c in (cluster + conv, forced))
    assert len(merged.circuit.block_qubits) == 3  # four two-qubit gates: CZ(a, b) joined the XX block
    assert len(kept.circuit.block_qubits) == 3  # three two-qubit gates, each in a block of its own
    rng = np.random.default_rng(7)
    values = rng.uniform(-1.5, 1.5, size=(2, len(SYMBOLS)))
    readouts = [random_readouts(rng, register) for _ in range(2)]
    check([cluster + conv, forced], SYMBOLS, values, readouts, rng.uniform(-1, 1, size=(2, 3)))


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


def test_unsupported_gate_is_one_line_naming_it():
    qubits = cirq.GridQubit.rect(1, 3)
    circuit = cirq.Circuit(
        cirq.H.on_each(qubits),
        cirq.ISWAP(qubits[1], qubits[2]).controlled_by(qubits[0]),
        cirq.X(qubits[0]) ** SYMBOLS[0],
    )
    with pytest.raises((tf.errors.OpError, UnsupportedGate)) as raised:  # eager: as raised; in a graph: wrapped
        forward_and_gradient(BlockAdjoint(), [circuit], SYMBOLS[:1], np.array([[0.3]]), [[cirq.Z(qubits[2])]], [[1.0]])
    lines = [line for line in str(raised.value).splitlines() if "cannot differentiate" in line]
    assert lines and "ISwapPowGate" in lines[0] and "3 qubits" in lines[0]


EPOCHS = 5  # of the tutorial's 50


def losses(path) -> list[float]:
    with open(path / "metrics.csv") as f:
        return [float(row["loss"]) for row in csv.DictReader(f)]


def test_training_with_block_and_tfq_gradients_agree(tmp_path):
    """The tutorial's model on 2 workers, MultiWorkerMirroredStrategy on Ray Train, the same seed:
    the same losses."""
    for name in ("block", "tfq"):
        options = ("--workers", 2, "--epochs", EPOCHS, "--differentiator", name, "--storage", tmp_path, "--name", name)
        done = run_command("train", "--config", ROOT / "configs" / "tutorial.yaml", *options)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    block, tfq_losses = losses(tmp_path / "block"), losses(tmp_path / "tfq")
    assert len(block) == len(tfq_losses) == EPOCHS
    assert block[-1] < block[0]  # it learns
    np.testing.assert_allclose(block, tfq_losses, atol=1e-3, rtol=0)


@pytest.mark.parametrize(
    "choice, qubits, expected",
    [
        ("auto", 12, tfq.differentiators.Adjoint),
        ("auto", 16, BlockAdjoint),
        ("block", 8, BlockAdjoint),
        ("tfq", 20, tfq.differentiators.Adjoint),
    ],
)
def test_differentiator_choice(choice, qubits, expected):
    from qml_ray.model import quantum_gradient

    assert type(quantum_gradient(choice, qubits)) is expected
