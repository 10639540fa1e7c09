"""Other simulators on the QCNN's circuits, for `bench circuits --peers`: qsim's forward pass (qsimcirq, at
its fastest fused-gate size) and PennyLane Lightning's adjoint gradient (lightning.qubit, complex64 and
complex128). Each takes the circuits the block kernel runs, and returns its seconds per circuit with its
values, for the caller to check against the block method's.

The peers are an optional extra: this module imports them, cirq and sympy only when it runs them, so that
every bench command can ask `missing()` cheaply and before the peers' thread pools start.
"""

import importlib.util

import numpy as np

INSTALL = "pip install -e '.[peers]'"
PACKAGES = ("qsimcirq", "pennylane", "pennylane_lightning")
QSIM_FUSED_SIZES = (2, 3, 4)
FIXED_GATES = ("Hadamard", "CZ", "CNOT")  # PennyLane's names of H, CZ and CNOT: gates without an angle
LIGHTNING_DTYPES = {"complex64": np.complex64, "complex128": np.complex128}
# Largest difference from the block method's values (complex64 state, float32 results) that counts as
# agreement, as a share of the largest block value (at least 1): expectations and gradients alike. The
# peers in double precision differ by ~1e-6 at 16 and 20 qubits, in single precision by ~1e-5.
TOLERANCE = 1e-4


def missing() -> list[str]:
    """The peers' packages that are not installed."""
    return [name for name in PACKAGES if importlib.util.find_spec(name) is None]


def difference(found, expected) -> float:
    """The largest difference of `found` from `expected`, as a share of the largest |expected| (at least 1)."""
    expected = np.asarray(expected, np.float64)
    return float(np.abs(np.asarray(found, np.float64) - expected).max() / max(1.0, np.abs(expected).max()))


def qsim_calls(circuits, readouts, resolver, threads: int) -> dict:
    """qsim's expectations of the readouts for each circuit, one call per fused-gate size (size -> call). The
    circuits are resolved once and qsim keeps each one translated (its memoization), so a call's time is qsim's
    simulation, not cirq's resolving and qsimcirq's translating in Python (6-8 times the simulation at 16
    qubits)."""
    import cirq
    import qsimcirq

    resolved = [cirq.resolve_parameters(c, resolver) for c in circuits]
    calls = {}
    for size in QSIM_FUSED_SIZES:
        options = qsimcirq.QSimOptions(max_fused_gate_size=size, cpu_threads=threads)
        simulator = qsimcirq.QSimSimulator(options, circuit_memoization_size=len(resolved))
        calls[size] = lambda simulator=simulator: [simulator.simulate_expectation_values(c, readouts) for c in resolved]
    return calls


def qsim_forward(circuits, readouts, resolver, threads: int, timer) -> dict:
    """qsim's expectations at each fused-gate size (`qsim_calls`; the first call's, untimed, for the values):
    the fastest size's seconds per circuit, the size, and the values."""
    fastest = {"seconds": float("inf")}
    for size, forward in qsim_calls(circuits, readouts, resolver, threads).items():
        values = np.real(forward())
        seconds = timer(forward) / len(circuits)
        if seconds < fastest["seconds"]:
            fastest = {"seconds": seconds, "fused_gate_size": size, "values": values}
    return fastest


def lightning_gradient(circuits, readouts, symbols, weights, dtype: str, timer) -> dict:
    """Lightning's expectations of the readouts for each circuit (untimed) and, by its adjoint method, the
    gradient of their sum with respect to the weights (forward included): seconds per circuit and the values.
    The gradient is Lightning's vector-Jacobian product (device_vjp: one co-state, as the block kernel's),
    not the Jacobian of every readout (10 co-states at 20 qubits, 9-13x slower there)."""
    import pennylane as qml

    wires = sorted(circuits[0].all_qubits())
    device = qml.device("lightning.qubit", wires=len(wires), c_dtype=LIGHTNING_DTYPES[dtype])
    index = {symbol: i for i, symbol in enumerate(symbols)}
    observed = [wires.index(q) for op in readouts for q in op.qubits]

    def qnode(circuit):
        program = pennylane_ops(circuit, {q: i for i, q in enumerate(wires)}, index)

        @qml.qnode(device, diff_method="adjoint", device_vjp=True)
        def expectations(w):
            apply(program, w)
            return [qml.expval(qml.PauliZ(wire)) for wire in observed]

        return expectations

    nodes = [qnode(c) for c in circuits]
    w = qml.numpy.array(weights, requires_grad=True)

    def gradient():
        return [qml.grad(lambda w, node=node: qml.math.sum(qml.math.stack(node(w))))(w) for node in nodes]

    return {
        "values": np.array([qml.math.stack(node(w)) for node in nodes], np.float64),
        "gradients": np.array(gradient(), np.float64),
        "seconds": timer(gradient) / len(circuits),
    }


def pennylane_gate(gate) -> str:
    """PennyLane's name for a cirq gate of the QCNN's circuits: a power t of X, Y, Z, XX, YY or ZZ is that
    rotation by pi t (equal up to a global phase, whatever the gate's global shift); H, CZ and CNOT as
    they are."""
    import cirq

    fixed = dict(zip((cirq.H, cirq.CZ, cirq.CNOT), FIXED_GATES))
    if gate in fixed:
        return fixed[gate]
    rotations = {
        cirq.XPowGate: "RX",
        cirq.YPowGate: "RY",
        cirq.ZPowGate: "RZ",
        cirq.XXPowGate: "IsingXX",
        cirq.YYPowGate: "IsingYY",
        cirq.ZZPowGate: "IsingZZ",
    }
    return next(name for kind, name in rotations.items() if isinstance(gate, kind))


def pennylane_ops(circuit, wire: dict, index: dict) -> list[tuple]:
    """The circuit as (PennyLane gate name, wires, angle, weight index or -1) per operation, the angle
    (pi times the exponent's number) multiplying the weight where the exponent is a number times a weight;
    no angle for the fixed gates."""
    import sympy

    ops = []
    for op in circuit.all_operations():
        name, wires = pennylane_gate(op.gate), [wire[q] for q in op.qubits]
        if name in FIXED_GATES:
            ops.append((name, wires, None, -1))
            continue
        coef, symbol = sympy.sympify(op.gate.exponent).as_coeff_Mul()
        ops.append((name, wires, np.pi * float(coef), -1 if symbol == 1 else index[symbol]))
    return ops


def apply(program: list[tuple], weights) -> None:
    """Queue a program of `pennylane_ops` in the current PennyLane circuit."""
    import pennylane as qml

    for name, wires, angle, k in program:
        gate = getattr(qml, name)
        if angle is None:
            gate(wires=wires)
        else:
            gate(angle * weights[k] if k >= 0 else angle, wires=wires)


def disagreements(probes: list[dict]) -> list[str]:
    """Each peer, at each qubit count, whose values differ from the block method's by more than TOLERANCE."""
    return [
        f"{name} at {p['qubits']} qubits ({found['difference']:.1e})"
        for p in probes
        for name, found in p.get("peers", {}).items()
        if found.get("difference", 0) > TOLERANCE
    ]


def progress_line(found: dict) -> str:
    """One probe's peers against the block kernel, in a line."""
    return (
        f"forward: block {found['block']['forward_seconds']:.4g}, qsim {found['qsim']['seconds']:.4g} s/circuit; "
        f"gradient: block {found['block']['gradient_seconds']:.4g}, Lightning complex64 "
        f"{found['lightning_complex64']['seconds']:.4g}, complex128 {found['lightning_complex128']['seconds']:.4g} "
        f"s/circuit (outside TensorFlow)"
    )


def markdown_lines(probes: list[dict]) -> list[str]:
    """The peers against the block kernel, one row per qubit count probed with them."""
    lines = [
        "",
        "The peers on the same circuits, seconds per circuit: the QCNN layer's whole circuits outside TensorFlow, "
        "the block kernel on the same; forward = expectations (qsim at its fastest fused-gate size, each circuit "
        "translated once), gradient = the gradient of the readouts' sum, its forward included (Lightning's "
        "adjoint vector-Jacobian product). Largest difference from "
        f"the block values (expectations and gradients) as a share of the largest (at least 1); agreement is "
        f"at most {TOLERANCE:.0e}:",
        "",
        "| qubits | forward: block, qsim (fused size) | gradient: block, Lightning complex64, complex128 "
        "| largest difference: qsim, Lightning complex64, complex128 |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for p in (p for p in probes if "peers" in p):
        block, qsim, single, double = (
            p["peers"][k] for k in ("block", "qsim", "lightning_complex64", "lightning_complex128")
        )
        lines.append(
            f"| {p['qubits']} | {block['forward_seconds']:.4g}, {qsim['seconds']:.4g} ({qsim['fused_gate_size']}) "
            f"| {block['gradient_seconds']:.4g}, {single['seconds']:.4g}, {double['seconds']:.4g} "
            f"| {qsim['difference']:.1e}, {single['difference']:.1e}, {double['difference']:.1e} |"
        )
    return lines
