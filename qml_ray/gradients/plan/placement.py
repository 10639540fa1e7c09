"""The plan's fourth stage: the qubits placed on bits, so that blocks run on the kernel's fast high bits.

The qubits needed last wait on the low bits (below the choice's `parked`), and the state is relabelled when a
block needs one of them: the qubits needed last then take the low bits, swapping with the ones leaving them
(Belady's rule: evict what is needed furthest ahead).
"""

from typing import NamedTuple

from qml_ray import kernel
from qml_ray.gradients.plan.fusion import Block


class Placement(NamedTuple):
    """Where the blocks' qubits are, block by block."""

    bits: list[tuple[int, int]]  # per block: the bits of its pair
    masks: list[tuple[int, int]]  # per block: its controls as (mask, value) on their bits
    relabel: list[int]  # per block: the row of bit_maps applied to the state before it, or -1
    bit_maps: list[list[int]]  # per relabelling: bit q of every index moves to bit bit_map[q]
    first: list[int]  # per qubit: its bit at the circuit's start
    final: list[int]  # per qubit: its bit at the circuit's end


def parked_bits(qubits: int, parked: int) -> int:
    """How many low bits a circuit of `qubits` qubits parks when a choice asks for `parked`: at most
    kernel.PARKED_BITS and qubits // 2 - 1, at least one."""
    return max(1, min(parked, kernel.PARKED_BITS, qubits // 2 - 1))


def place(blocks: list[Block], qubits: int, parked: int) -> Placement:
    """The bits of each block's qubits, and the relabellings on the way. The `low` qubits needed last wait on
    the low bits (controls may stay there), `parked_bits` of them; when a block needs one, it is relabelled onto
    a high bit."""
    low = parked_bits(qubits, parked)
    pairs = [block.pair for block in blocks]
    uses = [[b for b, pair in enumerate(pairs) if q in pair] for q in range(qubits)]

    def needed_last(after: int) -> list[int]:
        following = [next((b for b in uses[q] if b >= after), len(pairs)) for q in range(qubits)]
        return sorted(range(qubits), key=lambda q: (-following[q], q))[:low]

    waiting = needed_last(0)
    bit = {q: i for i, q in enumerate(waiting)}
    bit.update({q: low + i for i, q in enumerate(q for q in range(qubits) if q not in bit)})
    first = [bit[q] for q in range(qubits)]
    placed, masks, relabel, bit_maps = [], [], [], []
    for b, (a, c) in enumerate(pairs):
        if min(bit[a], bit[c]) < low:
            relabel.append(len(bit_maps))
            bit_maps.append(_swap_in(bit, set(needed_last(b)), low, qubits))
        else:
            relabel.append(-1)
        placed.append((bit[a], bit[c]))
        controls = blocks[b].controls
        masks.append((sum(1 << bit[q] for q, _ in controls), sum(v << bit[q] for q, v in controls)))
    return Placement(placed, masks, relabel, bit_maps, first, [bit[q] for q in range(qubits)])


def _swap_in(bit: dict[int, int], staying: set[int], low: int, qubits: int) -> list[int]:
    """Gives the low bits to the qubits `staying`, each swapping with a qubit leaving them (`bit` updated); the
    relabelling as a bit map."""
    leaving = [q for q in bit if bit[q] < low and q not in staying]
    entering = [q for q in sorted(staying) if bit[q] >= low]
    bit_map = list(range(qubits))
    for out, into in zip(leaving, entering):
        bit_map[bit[out]], bit_map[bit[into]] = bit[into], bit[out]
        bit[out], bit[into] = bit[into], bit[out]
    return bit_map
