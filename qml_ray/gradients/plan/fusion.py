"""The plan's third stage: the factors after the start fused into blocks on qubit pairs, one-qubit factors
folded into a neighbouring block, as qsim fuses its forward pass.

Fusion is greedy, in time order. A non-diagonal two-qubit factor joins the block its qubits last met in if
that block is on the same pair, else opens a block, taking with it the factors waiting on its qubits. Other
factors wait: one-qubit ones for their qubit's next block; diagonal two-qubit ones (CZ, ZZ) commute with
each other, so each waits for the next block on its own pair, and opens a block of its own only when a
factor that does not commute with it must come first. A masked factor first settles the factors waiting on
its pair and controls, then opens a block of its own (or joins the previous factor's of the same gate).
What still waits at the end opens or joins blocks the same way.
"""

from dataclasses import dataclass

from qml_ray.gradients.plan.gates import Factor


@dataclass
class Block:
    """Fused factors on a qubit pair (pair[0] the more significant in their basis); a masked block (of one
    masked gate) acts only where its controls hold their values."""

    pair: tuple[int, int]
    factors: list[Factor]
    controls: tuple = ()  # ((qubit, value), ...)

    @property
    def qubits(self) -> tuple[int, ...]:
        return (*self.pair, *(q for q, _ in self.controls))


def fuse(factors: list[Factor], qubits: int) -> list[Block]:
    """The factors, in time order, fused into blocks."""
    fusion = Fusion(qubits)
    for time, factor in enumerate(factors):
        fusion.add(time, factor)
    return fusion.finish(len(factors))


class Fusion:
    """The blocks fused so far, the block each qubit last met in, and per qubit the factors waiting for a
    block (time -> factor)."""

    def __init__(self, qubits: int):
        self.qubits = qubits
        self.blocks: list[Block] = []
        self.last: dict[int, int] = {}
        self.waiting: dict[int, dict[int, Factor]] = {q: {} for q in range(qubits)}

    def add(self, time: int, factor: Factor) -> None:
        """The next factor: a masked one opens (or joins) a block of its own, a non-diagonal two-qubit one is
        placed, any other waits on its qubits."""
        if factor.controls:
            self.settle((*factor.qubits, *(q for q, _ in factor.controls)), time)
            self.join(factor.qubits, factor.controls, [factor])
        elif len(factor.qubits) == 2 and not factor.diagonal:
            self.place(time, factor)
        else:
            for q in factor.qubits:
                self.waiting[q][time] = factor

    def finish(self, end: int) -> list[Block]:
        """The blocks, once what still waits has been placed: the two-qubit factors in time order, then the rest."""
        pairs = {t: f for q in self.waiting for t, f in self.waiting[q].items() if len(f.qubits) == 2}
        for time, factor in sorted(pairs.items()):
            if time in self.waiting[factor.qubits[0]]:
                self.place(time, factor)
        self.settle(tuple(range(self.qubits)), end)
        return self.blocks

    def join(self, pair: tuple[int, int], controls: tuple, members: list[Factor]) -> None:
        """Adds the factors to the block their qubits last met in if it is on the same pair with the same
        controls, else to a new block."""
        block = Block(pair, [], controls)
        target = self.last.get(pair[0])
        if not self._continues(target, block):
            self.blocks.append(block)
            target = len(self.blocks) - 1
        self.blocks[target].factors.extend(members)
        for q in block.qubits:
            self.last[q] = target

    def _continues(self, target: int | None, block: Block) -> bool:
        """Whether `block`'s factors can join block `target`: all its qubits last met there, on its pair, with
        its controls."""
        return (
            target is not None
            and all(self.last.get(q) == target for q in block.qubits)
            and set(self.blocks[target].pair) == set(block.pair)
            and self.blocks[target].controls == block.controls
        )

    def place(self, time: int, factor: Factor) -> None:
        """Puts a two-qubit factor into a block with the factors waiting before it on its qubits (one-qubit ones,
        and two-qubit ones on the same pair), after placing those on other pairs that must come first."""
        pair = factor.qubits
        for q in pair:
            self.waiting[q].pop(time, None)
        self._place_first(time, factor)
        members = self._take_members(time, pair)
        self.join(pair, (), [*members, factor])

    def _place_first(self, time: int, factor: Factor) -> None:
        """Places the factors waiting before `time` on `factor`'s qubits but on another pair, which must
        precede it: all of them if it is not diagonal, else those before the last non-diagonal one waiting."""
        earlier = {t: f for q in factor.qubits for t, f in self.waiting[q].items() if t < time}
        must_precede = (
            time if not factor.diagonal else max((t for t, f in earlier.items() if not f.diagonal), default=-1)
        )
        for t in sorted(earlier):
            other = earlier[t]
            other_pair = len(other.qubits) == 2 and set(other.qubits) != set(factor.qubits)
            if other_pair and t < must_precede and t in self.waiting[other.qubits[0]]:
                self.place(t, other)

    def _take_members(self, time: int, pair: tuple[int, int]) -> list[Factor]:
        """The factors waiting before `time` on the pair's qubits that join its block (one-qubit ones and those
        on the same pair), in time order, no longer waiting."""
        members = {
            t: f
            for q in pair
            for t, f in self.waiting[q].items()
            if t < time and (len(f.qubits) == 1 or set(f.qubits) == set(pair))
        }
        for t, f in members.items():
            for q in f.qubits:
                self.waiting[q].pop(t)
        return [members[t] for t in sorted(members)]

    def settle(self, on: tuple, before: int) -> None:
        """Places the factors waiting on the qubits `on` from before time `before`: the two-qubit ones, then
        each qubit's one-qubit ones into the block it last met in, or if there is none or it is masked, into
        new blocks, two qubits' to a block."""
        for q in on:
            for t in sorted(t for t, f in self.waiting[q].items() if t < before and len(f.qubits) == 2):
                if t in self.waiting[q]:
                    self.place(t, self.waiting[q][t])
        homeless = self._fold_into_last_blocks(on, before)
        self._pair_up(homeless)

    def _fold_into_last_blocks(self, on: tuple, before: int) -> list[tuple[int, list[Factor]]]:
        """Moves each qubit's factors waiting from before `before` into the unmasked block it last met in; the
        qubits with none such, and their factors."""
        homeless = []
        for q in on:
            rest = [self.waiting[q].pop(t) for t in sorted(t for t in self.waiting[q] if t < before)]
            if rest and q in self.last and not self.blocks[self.last[q]].controls:
                self.blocks[self.last[q]].factors.extend(rest)
            elif rest:
                homeless.append((q, rest))
        return homeless

    def _pair_up(self, homeless: list[tuple[int, list[Factor]]]) -> None:
        """New blocks for the qubits' factors, two qubits to a block (a qubit left alone with the next qubit)."""
        for k in range(0, len(homeless), 2):
            both = homeless[k : k + 2]
            pair = (both[0][0], both[1][0] if len(both) == 2 else (both[0][0] + 1) % self.qubits)
            self.blocks.append(Block(pair, [f for _, rest in both for f in rest]))
            for q, _ in both:
                self.last[q] = len(self.blocks) - 1
