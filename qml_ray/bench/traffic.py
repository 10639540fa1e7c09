"""The block kernel's memory traffic per circuit: the bytes its passes move, counted from its plans, the rate
it reaches in the measured times, and the share of a state-sized in-place pass's rate that is."""

import numpy as np

from qml_ray.bench.measure import pass_bandwidth
from qml_ray.choices import Choice
from qml_ray.gradients.plan import plan


def forward_bytes(whole: dict, choice: Choice | None = None) -> float:
    """Bytes the block kernel's forward moves per circuit (mean over the batch): each pass over the state (the
    start's, a segment's: one block, or several applied tile by tile; or a relabelling) reads and writes it
    once (complex64, padded to the kernel's least qubits); a masked block's, the cache lines (of 16 amplitudes
    per plane) holding its matching amplitudes: half for each control bit above the lowest 4. Planned as
    `choice` has it (default: the default choice)."""
    moved = []
    for program in whole["programs"]:
        circuit = plan(program, tuple(s.decode() for s in whole["names"]), choice).circuit
        masks = circuit.block_mask[circuit.segments[:-1]]  # a masked block is a segment of its own
        segments = sum(0.5 ** bin(int(mask) >> 4).count("1") for mask in masks)
        passes = 1 + segments + relabelling_passes(circuit)  # the start's, segments', relabellings'
        moved.append(2 * 8 * 2**circuit.qubits * passes)
    return float(np.mean(moved))


def relabelling_passes(circuit) -> int:
    """The relabellings that take a pass of their own: all but those a segment does tile by tile (it starts
    with them, and they leave its window's bits alone)."""
    in_tiles = 0
    for s, window in enumerate(circuit.windows):
        row = circuit.relabel[circuit.segments[s]]
        bits = [bit for bit in range(circuit.qubits) if (int(window) >> bit) & 1]
        in_tiles += bool(row >= 0 and window and all(circuit.bit_maps[row][bit] == bit for bit in bits))
    return int(np.count_nonzero(circuit.relabel >= 0)) - in_tiles


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
