"""Where the simulated model would emit its end-of-sequence token (``specload sim --eos-length``).

A real model ends most answers itself, at a length that depends on the prompt; a client that does not
ask for ``ignore_eos`` gets those lengths, with ``finish_reason`` "stop". The simulator has no model:
each request that may stop gets a length drawn uniformly from ``[lo, hi]`` by one seeded RNG, in
arrival order (as the faults are picked, specload.sim.faults), so that a test knows the exact lengths
a run got (``eos_lengths``). A request that sets ``ignore_eos`` draws nothing and runs to its
``max_tokens``; ``min_tokens`` holds the end back, as vLLM does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class EosLength:
    """The EOS position of each stoppable request, drawn in arrival order."""

    lo: int
    hi: int
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 1 <= self.lo <= self.hi:
            raise ValueError(f"--eos-length MIN:MAX needs 1 <= MIN <= MAX, got {self.lo}:{self.hi}")
        self._rng = random.Random(self.seed)

    def end(self, max_tokens: int, may_stop: bool, min_tokens: int) -> tuple[int, str]:
        """(tokens to generate, finish_reason) of the next request: "stop" at its drawn EOS when that
        comes before the cap (and not before ``min_tokens``), else "length" at ``max_tokens``."""
        if not may_stop:
            return max_tokens, "length"
        at = max(self._rng.randint(self.lo, self.hi), min_tokens)
        return (at, "stop") if at < max_tokens else (max_tokens, "length")


def eos_lengths(lo: int, hi: int, seed: int, n: int) -> list[int]:
    """The EOS positions the first ``n`` stoppable requests of a server started with these get (before
    their caps): what ``EosLength`` draws."""
    eos = EosLength(lo, hi, seed)
    return [eos.end(hi + 1, True, 0)[0] for _ in range(n)]


def parse_eos_length(text: str) -> tuple[int, int]:
    """``MIN:MAX`` (or one number N for N:N) as a pair of ints; ValueError otherwise."""
    parts = text.split(":")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, -1)
    except ValueError:
        raise ValueError(f"--eos-length: expected MIN:MAX (integers), got {text!r}") from None
    if not 1 <= lo <= hi:
        raise ValueError(f"--eos-length: expected MIN:MAX with 1 <= MIN <= MAX, got {text!r}")
    return lo, hi
