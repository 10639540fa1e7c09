"""Block-fused adjoint gradients for TensorFlow Quantum circuits.

`BlockAdjoint` is a `tfq.differentiators.Differentiator`: use it wherever TFQ takes one,
e.g. `tfq.layers.PQC(circuit, readouts, differentiator=BlockAdjoint())`. The forward pass
stays TFQ's; the gradient runs one backward sweep over the circuit fused into two-qubit
blocks (see `kernel`), one circuit per thread across the batch.
"""

import concurrent.futures
import os

import numpy as np
import tensorflow as tf
import tensorflow_quantum as tfq
from tensorflow_quantum.python.differentiators import differentiator

from qml_ray.gradients import kernel
from qml_ray.gradients.plan import UnsupportedGate, plan, readout_terms

__all__ = ["BlockAdjoint", "UnsupportedGate", "default_threads"]


def default_threads() -> int:
    """TensorFlow's intra-op pool size if set (qml_ray's workers set it to their CPUs), else the
    CPUs this process may run on."""
    return int(os.environ.get("TF_NUM_INTRAOP_THREADS") or 0) or len(os.sched_getaffinity(0))


class BlockAdjoint(tfq.differentiators.Differentiator):
    """Adjoint gradients over fused two-qubit blocks, on `threads` threads (default: `default_threads()`)."""

    def __init__(self, threads: int | None = None):
        self.threads = threads or default_threads()
        self._pool = None

    def generate_differentiable_op(self, *, sampled_op=None, analytic_op=None):
        if sampled_op is not None:
            raise ValueError("BlockAdjoint differentiates analytic expectations only")
        return super().generate_differentiable_op(analytic_op=analytic_op)

    def get_gradient_circuits(self, programs, symbol_names, symbol_values):
        raise NotImplementedError("BlockAdjoint computes gradients from the state; it has no gradient circuits")

    @differentiator.catch_empty_inputs
    @tf.function
    def differentiate_analytic(self, programs, symbol_names, symbol_values, pauli_sums, forward_pass_vals, grad):
        gradient = tf.numpy_function(self.gradient, [programs, symbol_names, symbol_values, pauli_sums, grad],
                                     tf.float32, stateful=False, name="block_adjoint_gradient")
        return tf.reshape(gradient, tf.shape(symbol_values))

    def differentiate_sampled(self, programs, symbol_names, symbol_values, pauli_sums, num_samples,
                              forward_pass_vals, grad):
        raise NotImplementedError("BlockAdjoint differentiates analytic expectations only")

    def gradient(self, programs, symbol_names, symbol_values, pauli_sums, upstream) -> np.ndarray:
        """d/d symbol_values of sum(upstream * expectations), as numpy arrays (batch-major)."""
        names = tuple(name.decode() for name in symbol_names)
        values = symbol_values.astype(np.float64)
        upstream = upstream.astype(np.float64)
        out = np.zeros(values.shape, np.float64)

        def one(row: int) -> None:
            circuit = plan(programs[row], names)
            qubit_ids = tuple(circuit.qubit_index.items())
            terms = [(op, *term) for op, pauli_sum in enumerate(pauli_sums[row])
                     for term in readout_terms(pauli_sum, qubit_ids)]
            op, coef, flip, signs, y_count = (np.array(column) for column in zip(*terms)) if terms else [
                np.zeros(0, np.int64)] * 5
            kernel.circuit_gradient(*circuit.arrays(), values[row], op.astype(np.int64), coef.astype(np.float64),
                                    flip.astype(np.int64), signs.astype(np.int64), y_count.astype(np.int64),
                                    upstream[row], out[row])

        list(self.pool().map(one, range(len(programs))))
        return out.astype(np.float32)

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.threads, thread_name_prefix="block-adjoint")
        return self._pool
