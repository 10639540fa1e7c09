"""Block-fused adjoint gradients for TensorFlow Quantum circuits.

`BlockAdjoint` is a `tfq.differentiators.Differentiator`: use it wherever TFQ takes one,
e.g. `tfq.layers.PQC(circuit, readouts, differentiator=BlockAdjoint())`. Both passes run on the
circuit fused into two-qubit blocks (`plan`) in the compiled kernel (`qml_ray.kernel`): the forward
simulates it, the gradient runs one backward sweep over the blocks, from the state the forward left
where it can (`FinalStates`). A batch fills the threads by size: one circuit per thread while each fits
the process's memory with its kept state, else as many at once as fit, and when fewer circuits run at once
than there are threads, each circuit's passes are shared between its share of them (`BlockAdjoint.slots`).
"""

import collections
import concurrent.futures
import contextlib
import functools
import os
import queue
import threading
from types import ModuleType
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_quantum as tfq
from tensorflow.python.eager import record
from tensorflow_quantum.python.differentiators import differentiator

from qml_ray.gradients import planner
from qml_ray.gradients.plan import Choice, UnsupportedGate, canonical, canonical_plan
from qml_ray.memory import AMPLITUDE_BYTES, IN_FLIGHT_STATES, circuits_at_once, kept_states, state_memory

__all__ = ["BlockAdjoint", "FinalStates", "UnsupportedGate", "default_threads", "process_final_states"]

SHARED_FROM_QUBITS = 16  # smaller circuits' passes are too short to share (docs/kernel-notes.md#threads)
LANES_MADE = threading.Lock()  # held while a differentiator makes its lanes' threads (`lane_thread`)


def shared_parts(qubits: int, threads: int) -> int:
    """The parts a circuit's passes are cut into on a slot of `threads` threads: one below SHARED_FROM_QUBITS."""
    return min(threads, sharing_threads()) if qubits >= SHARED_FROM_QUBITS else 1


def default_threads() -> int:
    """TensorFlow's intra-op pool size if set (qml_ray's workers set it to their CPUs), else the
    CPUs this process may run on."""
    return int(os.environ.get("TF_NUM_INTRAOP_THREADS") or 0) or sharing_threads()


@functools.cache
def sharing_threads() -> int:
    """The most threads one circuit's passes may share: the CPUs this process may run on."""
    return len(os.sched_getaffinity(0))


class Inputs(NamedTuple):
    """One circuit as the kernel takes it: its program as it always serializes (`canonical`, looked up once a
    call and kept for the kept state's key), the kernel's module of its plan's path, its plan's circuit, and
    its readouts."""

    program: bytes
    kernel: ModuleType
    circuit: object  # kernel.Circuit
    readouts: object  # kernel.Readouts


def kernel_inputs(program: bytes, names: tuple, pauli_sums: np.ndarray, choice: Choice) -> Inputs:
    """A circuit (canonical) and its readouts as the kernel's `circuit_expectations` / `circuit_gradient` take
    them, planned as `choice` has it."""
    planned = canonical_plan(program, names, choice)
    return Inputs(program, planned.kernel, planned.compiled, planned.readouts(tuple(pauli_sums)))


NO_STATE = np.zeros((2, 0), np.float32)  # what `kernel.circuit_gradient` takes for "simulate the state here"


class FinalStates:
    """The final states of the latest forward passes that a gradient may follow (LRU), as many as
    `memory.kept_states` allows on `threads` threads with `memory` bytes for the states (None: no bound), each
    taken once by the gradient of the same circuit at the same values: in a training step the gradient follows
    its forward, and its sweep then starts from the state instead of simulating the circuit again (one of the
    about 4 forwards' worth of work a circuit's forward + gradient costs). A worker holds the kept states, and
    a state and co-state for each circuit it runs at once (the kept state it took among them). Every
    `BlockAdjoint` of a process (one per layer) keeps its states in the same `process_final_states`, so that
    they hold the process's memory together, each state tagged with the differentiator that kept it; and each
    circuit it runs reserves its 2 states here while it runs (`in_flight`), so that circuits of several
    differentiators at once wait rather than overflow the memory, the oldest kept states giving way to them."""

    def __init__(self, threads: int, memory: int | None = None):
        self.threads, self.memory = threads, memory
        self._states = collections.OrderedDict()
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._in_flight = 0  # bytes the circuits running have reserved

    def keep(self, key: tuple, state: np.ndarray, owner: int | None = None) -> None:
        """Keep a circuit's final state, from within its `in_flight` (whose bytes hold it until it ends)."""
        with self._lock:
            self._states[key] = owner, state
            self._states.move_to_end(key)
            while len(self._states) > kept_states(self.threads, state.nbytes, self.memory) or (
                len(self._states) > 1 and self._over(-state.nbytes)
            ):
                self._states.popitem(last=False)

    @contextlib.contextmanager
    def in_flight(self, nbytes: int):
        """`nbytes` reserved for a circuit while it runs (its state and co-state): waits while other circuits'
        reservations leave no room for it; kept states, oldest first, give way to it."""
        with self._room:
            while self._in_flight and self.memory is not None and self._in_flight + nbytes > self.memory:
                self._room.wait()
            self._in_flight += nbytes
            while self._states and self._over(0):
                self._states.popitem(last=False)
        try:
            yield
        finally:
            with self._room:
                self._in_flight -= nbytes
                self._room.notify_all()

    def _over(self, extra: int) -> bool:
        """Whether the reservations, the kept states and `extra` bytes take more than the memory."""
        kept = sum(state.nbytes for _, state in self._states.values())
        return self.memory is not None and self._in_flight + kept + extra > self.memory

    def take(self, key: tuple) -> np.ndarray:
        """The state kept for `key`, no longer kept; else NO_STATE."""
        with self._lock:
            return self._states.pop(key, (None, NO_STATE))[1]

    def clear(self, owner: int | None = None) -> None:
        """No more states kept by `owner` (None: by any)."""
        with self._lock:
            for key in [key for key, (kept_by, _) in self._states.items() if owner in (None, kept_by)]:
                del self._states[key]


@functools.cache
def process_final_states(threads: int, memory: int) -> FinalStates:
    """The final states every `BlockAdjoint` of this process on `threads` threads with `memory` bytes keeps."""
    return FinalStates(threads, memory)


class BlockAdjoint(tfq.differentiators.Differentiator):
    """Expectations and their adjoint gradients over fused two-qubit blocks, on `threads` threads
    (default: `default_threads()`), with the state vectors in `memory` bytes (default: `memory.state_memory`,
    the threads' share of the machine's), each circuit planned as `choice` says (default: as this process's
    `planner` measures it fastest for the circuit's shape)."""

    def __init__(self, threads: int | None = None, memory: int | None = None, choice: Choice | None = None):
        self.threads = threads or default_threads()
        self.memory = memory or state_memory(self.threads)
        self.choice = choice
        self._lanes = []
        self._states = process_final_states(self.threads, self.memory)

    def generate_differentiable_op(self, *, sampled_op=None, analytic_op=None):
        """The expectation op made differentiable; the forward is this class's own, not `analytic_op`."""
        if sampled_op is not None:
            raise ValueError("BlockAdjoint differentiates analytic expectations only")
        return super().generate_differentiable_op(analytic_op=self.expectation_op_of_blocks)

    def expectation_op_of_blocks(self, programs, symbol_names, symbol_values, pauli_sums):
        """The forward op; it keeps its final states only where a gradient tape watches `symbol_values` (a
        training step's, not inference's or validation's), decided when the op is traced."""
        symbol_values = tf.convert_to_tensor(symbol_values)  # a variable's value (the tape API takes tensors)
        keep_states = record.should_record_backprop([symbol_values])
        expectations = tf.numpy_function(
            functools.partial(self.expectations, keep_states=keep_states),
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

    def expectations(self, programs, symbol_names, symbol_values, pauli_sums, keep_states=True) -> np.ndarray:
        """<psi|O|psi> of each circuit's readouts, as numpy arrays (batch-major); `keep_states` for the gradient
        (a new state not kept also lands in the buffer the last one left, still in cache)."""
        values = symbol_values.astype(np.float64)
        out = np.zeros(pauli_sums.shape, np.float64)

        def one(row, inputs, parts) -> None:
            state = inputs.kernel.circuit_expectations(inputs.circuit, values[row], inputs.readouts, out[row], parts)
            if keep_states:
                self._states.keep(self._key(inputs.program, symbol_names, values[row]), state, id(self))

        self._each(one, programs, symbol_names, pauli_sums)
        return out.astype(np.float32)

    def gradient(self, programs, symbol_names, symbol_values, pauli_sums, upstream) -> np.ndarray:
        """d/d symbol_values of sum(upstream * expectations), as numpy arrays (batch-major)."""
        values, upstream = symbol_values.astype(np.float64), upstream.astype(np.float64)
        out = np.zeros(values.shape, np.float64)

        def one(row, inputs, parts) -> None:
            state = self._states.take(self._key(inputs.program, symbol_names, values[row]))
            inputs.kernel.circuit_gradient(
                inputs.circuit, values[row], inputs.readouts, upstream[row], out[row], parts, state
            )

        self._each(one, programs, symbol_names, pauli_sums)
        self._states.clear(id(self))  # its states no gradient asked for (another batch's, a validation pass's) go too
        return out.astype(np.float32)

    @staticmethod
    def _key(program: bytes, symbol_names, values: np.ndarray) -> tuple:
        """What determines a circuit's final state: its program (`canonical`, serialized the same way every time,
        so that a circuit simulated again replaces its kept state), and the value of each of its symbols."""
        return program, tuple(symbol_names), values.tobytes()

    def _each(self, run, programs, symbol_names, pauli_sums) -> None:
        """run(row, inputs, parts) for each circuit of the batch, as many side by side as `slots` gives
        threads to (`_in_lanes`), each circuit of SHARED_FROM_QUBITS or more cut into its slot's parts."""
        names = self._names(symbol_names)
        same = [canonical(program) for program in programs]
        if not same:
            return
        qubits = [planner.size(program, names)[0] for program in same]
        lanes = self.slots(len(same), max(qubits))
        if len(lanes) > 1 and max(qubits) >= SHARED_FROM_QUBITS and self._spread(same[0], names, pauli_sums[0]):
            lanes = [self.threads]  # one circuit at a time on every thread: faster here than side by side
        parts = {(row, lane): shared_parts(qubits[row], lane) for row in range(len(same)) for lane in set(lanes)}
        inputs = {
            (row, lane): kernel_inputs(
                same[row], names, pauli_sums[row], self._choice(same[row], names, pauli_sums[row], n)
            )
            for (row, lane), n in parts.items()
        }

        def one(row: int, lane: int) -> None:
            with self._states.in_flight(IN_FLIGHT_STATES * AMPLITUDE_BYTES * 2 ** qubits[row]):
                run(row, inputs[row, lane], parts[row, lane])

        self._in_lanes(one, len(same), lanes)

    def _spread(self, program: bytes, names: tuple, pauli_sums: np.ndarray) -> bool:
        """Whether the planner has a batch like this one run one circuit at a time on every thread (where the
        memory holds several at once); never with a fixed choice."""
        return not self.choice and planner.planner().spread(program, names, pauli_sums, self.threads) == "shared"

    def _choice(self, program: bytes, names: tuple, pauli_sums: np.ndarray, parts: int) -> Choice:
        """This differentiator's choice, or the one the planner has for the circuit's shape on `parts` threads."""
        return self.choice or planner.planner().choice(program, names, pauli_sums, parts)

    def slots(self, circuits: int, qubits: int) -> list[int]:
        """The threads of each circuit a batch of `circuits` circuits of up to `qubits` qubits runs at once:
        as many circuits as `memory.circuits_at_once` fits in the memory (one per thread while they fit), no more
        than the batch has, the threads shared between them as evenly as they divide."""
        at_once = min(circuits, circuits_at_once(AMPLITUDE_BYTES * 2**qubits, self.threads, self.memory))
        share, more = divmod(self.threads, at_once)
        return [share + (slot < more) for slot in range(at_once)]

    @staticmethod
    def _names(symbol_names) -> tuple:
        return tuple(name.decode() for name in symbol_names)

    def _in_lanes(self, fn, rows: int, lanes: list[int]) -> None:
        """fn(row, lane) for rows 0..rows-1, taken in turn by one thread per lane, all lanes at once; lane i
        runs on the same thread of this differentiator on every call (`lane_thread`), so that a circuit shared
        between threads always has the same OpenMP team: handed to whichever thread was free (TensorFlow calls
        the op from threads of its own pool), it ran a team per thread, idle teams spinning beside the next.
        On one thread, in the calling thread (no hand-over: 0.26 ms a 20-qubit circuit)."""
        left = queue.SimpleQueue()
        for row in range(rows):
            left.put(row)

        def drain(lane: int) -> None:
            while True:
                try:
                    row = left.get_nowait()
                except queue.Empty:
                    return
                fn(row, lane)

        if self.threads == 1:
            return drain(lanes[0]) if lanes else None
        running = [self.lane_thread(i).submit(drain, lane) for i, lane in enumerate(lanes)]
        concurrent.futures.wait(running)  # every lane done before a failure is raised: none outlives the call
        for done in running:
            done.result()

    def lane_thread(self, lane: int) -> concurrent.futures.ThreadPoolExecutor:
        """The thread of lane `lane` (one of `threads`), made when first asked for."""
        with LANES_MADE:
            while len(self._lanes) <= lane:
                self._lanes.append(concurrent.futures.ThreadPoolExecutor(1, f"block-adjoint-{len(self._lanes)}"))
            return self._lanes[lane]
