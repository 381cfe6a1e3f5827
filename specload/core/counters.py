"""The server's cumulative counters (sampled from /metrics) over one level's measured window.

A counter's change over a window needs a sample on each side of it: the last one at or before the
window's start (else the first inside it, when sampling began late) and the last one at or before
its end. The accept length (spec_decode drafts and accepted tokens) and the prefix cache hit rate
(queries and hits) are both ratios of such changes, so they share this one rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

S = TypeVar("S", bound=Any)


def window_ends(usable: Sequence[S], start: float, end: float) -> tuple[S, S] | None:
    """The samples (in time order, each with a ``t``) bounding [start, end]; None without two."""
    before = [s for s in usable if s.t <= start]
    first = before[-1] if before else next((s for s in usable if start <= s.t <= end), None)
    upto = [s for s in usable if s.t <= end]
    last = upto[-1] if upto else None
    if first is None or last is None or last.t <= first.t:
        return None
    return first, last
