"""How the benchmarks measure: seconds per call, a process's peak resident memory, and the rate of an in-place
pass over a state-sized array. numpy only: no TensorFlow."""

import os
import threading
import time

import numpy as np


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


def pass_bandwidth(state_bytes: int, min_seconds: float = 0.5) -> float:
    """Bytes per second of an in-place pass over a state-sized array, each value read and written once as in
    every pass of the kernel, counted as read + write (2 bytes moved per byte). A copy into a second array
    is no measure of that: it also reads the target's lines before it writes them."""
    values = np.ones(state_bytes // 4, np.float32)
    return 2 * state_bytes / seconds_per_call(lambda: np.multiply(values, np.float32(1), out=values), min_seconds)
