"""Records read back are held to the rules the client wrote them by: a record breaking them was
not written by this client as it stands (a hand edit, a forger, a bug), and is counted as invalid
with a note, never used in a figure (review ab9c161, M11: a record claiming 10^12 tokens made Agg
tok/s 1.4e12).

The rules, each the client's own (specload.client.stream ``_record``):

- ``ok`` with the server's count means exactly the tokens asked for (more is failed, fewer short;
  a count of chunks, which approximates, may differ), or fewer when the model ended the answer itself
  (a ``finish_reason`` in STOPPED: --output-mode natural);
- no record carries more tokens than the client cuts a stream at (``overrun_cap`` of the tokens
  asked for), nor a negative count, and the tokens asked for are at least 1;
- times in order: ``t_send <= t_first <= t_last <= t_end`` (those present), all finite, and
  ``e2e_s`` is ``t_end - t_send`` (it is computed so, from the same clock);
- speculative counts within ``records.SPEC_BOUNDS`` (the client refuses a response breaking them;
  the histogram's K is not read back, so that one bound is the client's alone).

Measured records only: a warmup record enters no figure (the report counts warmup requests, and
that is all). Checked a block of records at a time with numpy: the common block breaks no rule and costs a few
array operations; only a block with a broken record is filtered. (A status the client never
writes is no such rule: the report counts it under its own name.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from operator import attrgetter, eq
from typing import Any

import numpy as np
import numpy.typing as npt

from specload.core.records import OK, PHASE_MEASURE, SRC_CHUNKS, STOPPED, spec_broken
from specload.core.tokencap import overrun_cap

# Times are wall-clock seconds (~1.8e9) offset by monotonic durations: exact to well under a
# microsecond in a double. A record out of order by more than this was not made by the client.
_TIME_SLACK_S = 1e-6

# The rules' names, as the note says them (their order is the order they are checked in).
OK_COUNT = "ok with a server count other than the tokens asked for (fewer only where the model stopped)"
TOKENS = "a token count out of bounds (negative, or more than the client accepts)"
TIMES = "times out of order (t_send <= t_first <= t_last <= t_end) or not finite"
E2E = "e2e_s other than t_end - t_send"
SPEC = "speculative counts that cannot be true (records.SPEC_BOUNDS)"
RULES = (OK_COUNT, TOKENS, TIMES, E2E, SPEC)

_STATUS, _SOURCE, _PHASE = attrgetter("status"), attrgetter("output_tokens_source"), attrgetter("phase")
FINISH = attrgetter("finish_reason")
Floats = npt.NDArray[np.float64]


def _floats(recs: Sequence[Any], name: str) -> Floats:
    """A field of every record as floats (None: nan)."""
    return np.array(list(map(attrgetter(name), recs)), dtype=np.float64)


def equal_to(values: Sequence[Any], v: Any) -> npt.NDArray[np.bool_]:
    """Which of ``values`` equal ``v`` (a block is usually all one value: counted, not compared)."""
    n = values.count(v)
    if n in (0, len(values)):
        return np.full(len(values), n > 0, dtype=bool)
    return np.fromiter(map(partial(eq, v), values), dtype=bool, count=len(values))


def broken(recs: Sequence[Any]) -> npt.NDArray[np.int8]:
    """Per record (Rec or RequestRecord), the index in RULES of the first rule it breaks, or -1 (a
    warmup record: -1)."""
    return broken_columns(
        status=list(map(_STATUS, recs)),
        source=list(map(_SOURCE, recs)),
        phase=list(map(_PHASE, recs)),
        finish=list(map(FINISH, recs)),
        **{name: _floats(recs, field) for name, field in RULE_FIELDS.items()},
    )


# broken_columns' number arguments, and the record field each is
RULE_FIELDS = {
    "tokens": "output_tokens",
    "asked": "requested_output_tokens",
    "t_send": "t_send",
    "t_first": "t_first",
    "t_last": "t_last",
    "t_end": "t_end",
    "e2e": "e2e_s",
    "steps": "spec_verify_ct",
    "drafted": "spec_drafted",
    "accepted": "spec_accepted",
}


def broken_columns(
    *,
    status: Sequence[Any],
    source: Sequence[Any],
    phase: Sequence[Any],
    finish: Sequence[Any],
    tokens: Floats,
    asked: Floats,
    t_send: Floats,
    t_first: Floats,
    t_last: Floats,
    t_end: Floats,
    e2e: Floats,
    steps: Floats,
    drafted: Floats,
    accepted: Floats,
) -> npt.NDArray[np.int8]:
    """``broken`` of a block of records given as columns (a missing number: nan), as the reader of
    records.jsonl holds them already (specload.analysis.columns): the rules are written once."""
    counted = ~equal_to(source, SRC_CHUNKS)
    ok = equal_to(status, OK)
    with np.errstate(invalid="ignore"):
        cap = asked + np.maximum(16.0, np.floor(asked / 4))  # overrun_cap, vectorised
        tokens_ok = (tokens >= 0) & (asked >= 1) & (tokens <= cap)
        s = _TIME_SLACK_S
        first = np.isnan(t_first) | ((t_send <= t_first + s) & (t_first <= t_end + s))
        last = np.isnan(t_last) | ((t_last <= t_end + s) & (np.isnan(t_first) | (t_first <= t_last + s)))
        times_ok = np.isfinite(t_send) & np.isfinite(t_end) & (t_send <= t_end + s) & first & last
        e2e_ok = np.abs(e2e - (t_end - t_send)) <= 1e-3  # (rounded to the ms by older writers)
        count_ok = ~(ok & counted) | (tokens == asked)
        fewer = np.flatnonzero(~count_ok & (tokens < asked)).tolist()  # (natural lengths only, usually none)
    if fewer:
        count_ok[[i for i in fewer if str(finish[i]) in STOPPED]] = True
    spec_ok = spec_broken(np.where(counted, tokens, np.nan), steps, drafted, accepted, np.nan) < 0
    checks = (count_ok, tokens_ok, times_ok, e2e_ok, spec_ok)
    measured = equal_to(phase, PHASE_MEASURE)
    verdict = np.full(len(status), -1, dtype=np.int8)
    for i in range(len(checks) - 1, -1, -1):  # the first rule broken wins
        verdict[~checks[i] & measured] = i
    return verdict


def describe(rec: Any, rule: str) -> str:
    """One broken record, in a few words, for the note."""
    asked = rec.requested_output_tokens
    return (
        f"level {rec.level} {rec.phase} #{rec.seq}: {rule}: status {rec.status!s:.20}, "
        f"{rec.output_tokens} tokens of {asked} asked"
        + (f" (the client accepts at most {overrun_cap(asked)})" if rule == TOKENS and asked else "")
        + (
            f", {rec.spec_accepted} accepted of {rec.spec_drafted} drafted in {rec.spec_verify_ct} steps"
            if rule == SPEC
            else ""
        )
    )


@dataclass
class Validity:
    """The invalid records of one reading of records.jsonl: counted per rule, the first described."""

    by_rule: dict[str, int] = field(default_factory=dict)
    first: str | None = None

    def keep(self, recs: list[Any]) -> list[Any]:
        """``recs`` without the records that break a rule (the same list when none does)."""
        if not recs:
            return recs
        mask = self.judge(recs, broken(recs))
        return recs if mask is None else [r for r, k in zip(recs, mask.tolist(), strict=True) if k]

    def judge(self, recs: Sequence[Any], verdict: npt.NDArray[np.int8]) -> npt.NDArray[np.bool_] | None:
        """Count the records ``verdict`` (``broken``'s) finds broken; which to keep, or None: all."""
        bad = verdict >= 0
        if not bad.any():
            return None
        for i in np.flatnonzero(bad).tolist():
            rule = RULES[verdict[i]]
            self.by_rule[rule] = self.by_rule.get(rule, 0) + 1
            if self.first is None:
                self.first = describe(recs[i], rule)
        return ~bad

    @property
    def invalid(self) -> int:
        return sum(self.by_rule.values())

    def merge(self, later: Validity) -> None:
        for rule, n in later.by_rule.items():
            self.by_rule[rule] = self.by_rule.get(rule, 0) + n
        self.first = self.first if self.first is not None else later.first

    def note(self) -> str | None:
        """The report's note, or None when every record keeps the rules."""
        if not self.by_rule:
            return None
        each = ", ".join(f"{n} {rule}" for rule in RULES if (n := self.by_rule.get(rule)))
        return (
            f"{self.invalid} record(s) break the client's own rules and are left out of every figure "
            f"({each}); the first: {self.first}"
        )
