"""Other simulators on the QCNN's circuits, for `bench circuits --peers`: qsim's forward pass (qsimcirq, at
its fastest fused-gate size) and PennyLane Lightning's adjoint gradient (lightning.qubit, complex64 and
complex128). Each takes the same circuits as the block kernel, their weights resolved, and returns its
seconds per circuit with its values, for the caller to check against the block method's.
"""

import importlib.util

import cirq
import numpy as np
import sympy

INSTALL = "pip install -e '.[peers]'"
QSIM_FUSED_SIZES = (2, 3, 4)
LIGHTNING_DTYPES = {"complex64": np.complex64, "complex128": np.complex128}


def missing() -> list[str]:
    """The peers' packages that are not installed."""
    return [name for name in ("qsimcirq", "pennylane_lightning") if importlib.util.find_spec(name) is None]


def qsim_forward(circuits, readouts, resolver, threads: int, timer) -> dict:
    """qsim's <Z> of the readouts for each circuit, timed at each fused-gate size: the fastest's seconds
    per circuit, its size and the values."""
    import qsimcirq

    fastest = None
    for size in QSIM_FUSED_SIZES:
        simulator = qsimcirq.QSimSimulator(qsimcirq.QSimOptions(max_fused_gate_size=size, cpu_threads=threads))

        def forward(simulator=simulator):
            return [simulator.simulate_expectation_values(c, readouts, resolver) for c in circuits]

        seconds = timer(forward) / len(circuits)
        if fastest is None or seconds < fastest["seconds"]:
            fastest = {"seconds": seconds, "fused_gate_size": size}
    fastest["values"] = np.real(forward()).tolist()
    return fastest


def lightning_forward_gradient(circuits, readouts, symbols, weights, dtype, timer) -> dict:
    """Lightning's <Z> of the readouts for each circuit and, by its adjoint method, the gradient of their
    sum with respect to the weights: seconds per circuit and the values."""
    import pennylane as qml

    wires = sorted(circuits[0].all_qubits())
    device = qml.device("lightning.qubit", wires=len(wires), c_dtype=LIGHTNING_DTYPES[dtype])
    index = {symbol: i for i, symbol in enumerate(symbols)}
    programs = [pennylane_ops(c, {q: i for i, q in enumerate(wires)}, index) for c in circuits]
    observed = [wires.index(q) for op in readouts for q in op.qubits]

    def qnode(program):
        @qml.qnode(device, diff_method="adjoint")
        def expectations(w):
            apply(program, w)
            return [qml.expval(qml.PauliZ(wire)) for wire in observed]

        return expectations

    nodes = [qnode(p) for p in programs]
    w = qml.numpy.array(weights, requires_grad=True)

    def forward_and_gradient():
        return [(node(w), qml.grad(lambda w, node=node: qml.math.sum(qml.math.stack(node(w))))(w)) for node in nodes]

    seconds = timer(forward_and_gradient) / len(circuits)
    results = forward_and_gradient()
    return {
        "seconds": seconds,
        "values": [np.asarray(v, float).tolist() for v, _ in results],
        "gradients": [np.asarray(g, float).tolist() for _, g in results],
    }


ROTATIONS = {
    cirq.XPowGate: "RX",
    cirq.YPowGate: "RY",
    cirq.ZPowGate: "RZ",
    cirq.XXPowGate: "IsingXX",
    cirq.YYPowGate: "IsingYY",
    cirq.ZZPowGate: "IsingZZ",
}
FIXED = {cirq.H: "Hadamard", cirq.CZ: "CZ", cirq.CNOT: "CNOT"}


def pennylane_ops(circuit, wire: dict, index: dict) -> list[tuple]:
    """The circuit as (PennyLane gate name, wires, angle, weight index or -1) per operation: a power t of X,
    Y, Z, XX, YY or ZZ is that rotation by pi t (equal up to a global phase), the angle times the weight
    where t is a number times a weight; H, CZ and CNOT have no angle."""
    ops = []
    for op in circuit.all_operations():
        wires = [wire[q] for q in op.qubits]
        if op.gate in FIXED:
            ops.append((FIXED[op.gate], wires, None, -1))
            continue
        coef, symbol = sympy.sympify(op.gate.exponent).as_coeff_Mul()
        ops.append((ROTATIONS[type(op.gate)], wires, np.pi * float(coef), -1 if symbol == 1 else index[symbol]))
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
