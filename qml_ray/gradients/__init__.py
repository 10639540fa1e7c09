"""Block-fused adjoint gradients for TensorFlow Quantum circuits.

`BlockAdjoint` is a `tfq.differentiators.Differentiator`: use it wherever TFQ takes one,
e.g. `tfq.layers.PQC(circuit, readouts, differentiator=BlockAdjoint())`. Both passes run on the
circuit fused into two-qubit blocks (see `kernel`): the forward simulates it, the gradient runs one
backward sweep over the blocks; one circuit per thread across the batch.
"""

import concurrent.futures
import os

import numpy as np
import tensorflow as tf
import tensorflow_quantum as tfq
from tensorflow_quantum.python.differentiators import differentiator

from qml_ray.gradients import kernel
from qml_ray.gradients.plan import Circuit, Readout, UnsupportedGate, plan, readout

__all__ = ["BlockAdjoint", "UnsupportedGate", "default_threads"]


def default_threads() -> int:
    """TensorFlow's intra-op pool size if set (qml_ray's workers set it to their CPUs), else the
    CPUs this process may run on."""
    return int(os.environ.get("TF_NUM_INTRAOP_THREADS") or 0) or len(os.sched_getaffinity(0))


def kernel_inputs(program: bytes, names: tuple, pauli_sums: np.ndarray) -> tuple[Circuit, Readout]:
    """A circuit's plan and readouts as the kernel takes them."""
    planned = plan(program, names)
    return planned.circuit, readout(tuple(pauli_sums), tuple(planned.qubit_index.items()))


def tiles(circuit: Circuit) -> int:
    return 1 << (circuit.qubits - circuit.low - circuit.step_bits.shape[1])


def by_steps(run, steps: int, parts: int, pool, reverse: bool = False) -> None:
    """run(first_step, stop_step, part) over every step: in one call, or with `parts` > 1 step by step,
    the parts side by side on the pool."""
    if parts == 1:
        run(0, steps, 0)
        return
    for step in reversed(range(steps)) if reverse else range(steps):
        list(pool.map(lambda part, step=step: run(step, step + 1, part), range(parts)))


def simulate(circuit: Circuit, blocks: np.ndarray, parts: int, pool) -> np.ndarray:
    """The circuit's state, its tiles split into `parts` run on the pool."""
    psi = np.zeros((2, 1 << circuit.qubits), np.float32)  # numpy's large arrays sit on huge pages
    psi[0, 0] = 1
    buffers = [kernel.tile_buffer(circuit) for _ in range(parts)]

    def run(first, stop, part):
        kernel.forward(psi, circuit, blocks, first, stop, part, parts, buffers[part])

    by_steps(run, len(circuit.step_relabel), parts, pool)
    return psi


def circuit_expectations(circuit: Circuit, readout: Readout, values, out, parts: int = 1, pool=None) -> None:
    """out[k] += <psi|O_k|psi>, psi the circuit's state, O_k its readouts."""
    _, blocks = kernel.block_unitaries(circuit, values)
    parts = min(parts, tiles(circuit))
    kernel.expectations(simulate(circuit, blocks, parts, pool), readout, out)


def circuit_gradient(circuit: Circuit, readout: Readout, values, upstream, grad, parts: int = 1, pool=None) -> None:
    """grad[s] += d/d(values[s]) of sum_k upstream[k] <psi|O_k|psi>, psi the circuit's state."""
    factors, blocks = kernel.block_unitaries(circuit, values)
    parts = min(parts, tiles(circuit))
    psi = simulate(circuit, blocks, parts, pool)
    lam = np.zeros_like(psi)
    kernel.add_co_state(lam, psi, readout, upstream)
    buffers = np.empty((parts, 2, *kernel.tile_buffer(circuit).shape), np.float32)
    transitions = np.zeros((parts, len(blocks), 4, 8))

    def run(first, stop, part):
        kernel.backward(psi, lam, circuit, blocks, first, stop, part, parts, buffers[part], transitions[part])

    by_steps(run, len(circuit.step_relabel), parts, pool, reverse=True)
    kernel.gradient(circuit, values, factors, blocks, transitions.sum(axis=0), grad)


class BlockAdjoint(tfq.differentiators.Differentiator):
    """Expectations and their adjoint gradients over fused two-qubit blocks, on `threads` threads
    (default: `default_threads()`)."""

    def __init__(self, threads: int | None = None):
        self.threads = threads or default_threads()
        self._pools = {}

    def generate_differentiable_op(self, *, sampled_op=None, analytic_op=None):
        """The expectation op made differentiable; the forward is this class's own, not `analytic_op`."""
        if sampled_op is not None:
            raise ValueError("BlockAdjoint differentiates analytic expectations only")
        return super().generate_differentiable_op(analytic_op=self.expectation_op_of_blocks)

    def expectation_op_of_blocks(self, programs, symbol_names, symbol_values, pauli_sums):
        expectations = tf.numpy_function(
            self.expectations,
            [programs, symbol_names, symbol_values, pauli_sums],
            tf.float32,
            stateful=False,
            name="block_expectation",
        )
        return tf.reshape(expectations, tf.shape(pauli_sums))

    def get_gradient_circuits(self, programs, symbol_names, symbol_values):
        raise NotImplementedError("BlockAdjoint computes gradients from the state; it has no gradient circuits")

    @differentiator.catch_empty_inputs
    @tf.function
    def differentiate_analytic(self, programs, symbol_names, symbol_values, pauli_sums, forward_pass_vals, grad):
        gradient = tf.numpy_function(
            self.gradient,
            [programs, symbol_names, symbol_values, pauli_sums, grad],
            tf.float32,
            stateful=False,
            name="block_adjoint_gradient",
        )
        return tf.reshape(gradient, tf.shape(symbol_values))

    def differentiate_sampled(
        self, programs, symbol_names, symbol_values, pauli_sums, num_samples, forward_pass_vals, grad
    ):
        raise NotImplementedError("BlockAdjoint differentiates analytic expectations only")

    def expectations(self, programs, symbol_names, symbol_values, pauli_sums) -> np.ndarray:
        """<psi|O|psi> of each circuit's readouts, as numpy arrays (batch-major)."""
        names, values = self._names(symbol_names), symbol_values.astype(np.float64)
        out = np.zeros(pauli_sums.shape, np.float64)

        def one(row: int, parts: int) -> None:
            circuit, readouts = kernel_inputs(programs[row], names, pauli_sums[row])
            circuit_expectations(circuit, readouts, values[row], out[row], parts, self.pool("parts"))

        self.each_circuit(len(programs), one)
        return out.astype(np.float32)

    def gradient(self, programs, symbol_names, symbol_values, pauli_sums, upstream) -> np.ndarray:
        """d/d symbol_values of sum(upstream * expectations), as numpy arrays (batch-major)."""
        names, values = self._names(symbol_names), symbol_values.astype(np.float64)
        upstream = upstream.astype(np.float64)
        out = np.zeros(values.shape, np.float64)

        def one(row: int, parts: int) -> None:
            circuit, readouts = kernel_inputs(programs[row], names, pauli_sums[row])
            circuit_gradient(circuit, readouts, values[row], upstream[row], out[row], parts, self.pool("parts"))

        self.each_circuit(len(programs), one)
        return out.astype(np.float32)

    def each_circuit(self, count: int, one) -> None:
        """one(row, parts) for each circuit of a batch: a circuit per thread, and with fewer circuits than
        threads, each circuit's work split in parts over the threads left to it."""
        parts = max(1, self.threads // max(1, count))
        list(self.pool("circuits").map(lambda row: one(row, parts), range(count)))

    @staticmethod
    def _names(symbol_names) -> tuple:
        return tuple(name.decode() for name in symbol_names)

    def pool(self, work: str) -> concurrent.futures.ThreadPoolExecutor:
        """The pool of `work`: "circuits" run there, or the "parts" of a circuit's steps (apart, so a
        circuit waiting for its parts never holds a thread they need)."""
        if work not in self._pools:
            self._pools[work] = concurrent.futures.ThreadPoolExecutor(self.threads, thread_name_prefix=f"block-{work}")
        return self._pools[work]
