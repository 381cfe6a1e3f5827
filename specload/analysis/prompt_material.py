"""Whether a run's acceptance rests on random prompts, and the caveat its report and verdict then carry.

The acceptance of speculative decoding depends on the text: on random token ids (or random words)
the target accepts drafts at another rate than on real text, and the speedup measured on them is
overstated (SPEED-Bench, arXiv 2604.09557). The prompts' material is run.json ``prompts.material``
(``specload.workload.prompts.material_of``). docs/metrics.md, "Prompts that flatter speculation".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specload.analysis.metrics import LevelStats
from specload.analysis.run import Run
from specload.workload.prompts import RANDOM_IDS, RANDOM_WORDS, material_of

RANDOM_MATERIALS = (RANDOM_IDS, RANDOM_WORDS)


def random_caveat(prompts: dict[str, Any]) -> str | None:
    """'random token ids: not representative ...' for random prompts; None for a dataset or unknown."""
    m = material_of(prompts)
    if m not in RANDOM_MATERIALS:
        return None
    factor = " (the reference method, --prompts random: 2x real text's accept length on a real model)"
    return f"{m}{factor if m == RANDOM_IDS else ''}: not representative of real text; the speedup is likely overstated"


def speculative(levels: Sequence[LevelStats], speculative_algorithm: str | None) -> bool:
    """The run measured speculative decoding: some level has an acceptance length, or the server
    named its speculative algorithm."""
    return bool(speculative_algorithm) or any(
        s.acceptance and s.acceptance.length is not None for s in levels
    )


def acceptance_caveat(run: Run) -> str | None:
    """The caveat of a run that measured speculation on random prompts; else None."""
    if not speculative(run.levels, run.info.server.speculative_algorithm):
        return None
    return random_caveat(run.info.prompts)
