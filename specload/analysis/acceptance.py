"""Every acceptance figure of one level, from the responses' own counts and from the server's counters.

Pure: a level's columns (``columns.LevelColumns``, with its ``spec`` tally of the per-request lists)
and its server samples in, an ``Acceptance`` out. docs/metrics.md, "Acceptance", defines each figure
beside what ``vllm bench serve``, SGLang's ``bench_serving`` and AIPerf call it. The per-request
sources come first (they are this client's requests only); the counters fill what the responses do
not say, and where both say it they are reconciled: a gap beyond ``TOLERANCE`` is a note.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specload.analysis.columns import LevelColumns
from specload.core.counters import window_ends
from specload.core.records import OK, SPEC_ALONG_BUCKET, SPEC_BOUNDS, SPEC_LLAMACPP, spec_broken

# Where a figure came from, when not from one of the records' spec_source values (records.SPEC_*).
FROM_COUNTERS = "server_counters"  # the server's /metrics counters, as a delta over the level's window
FROM_OLD_RECORDS = "meta_info"  # records written before spec_source (SGLang meta_info, llama.cpp timings)
# The per-request and the counter acceptance lengths may differ by this share before it is a note: the
# counters' window edges take in part of a request before or after the level (a few steps of the
# requests in flight at its start and end, a small share of a level of dozens of requests).
TOLERANCE = 0.05


@dataclass
class Acceptance:
    """A level's acceptance figures (None / empty: not measurable from any source the run has).

    ``sources``: figure name (length, tokens_per_pass, rate, per_position, histogram, along) -> its source
    (a records.SPEC_* value, FROM_OLD_RECORDS or FROM_COUNTERS)."""

    length: float | None = None  # 1 + accepted / drafting steps (steps that verified a draft)
    tokens_per_pass: float | None = None  # output tokens / target passes, every pass counted
    rate: float | None = None  # accepted / drafted draft tokens
    per_position: list[float] = field(default_factory=list)  # k = 1..K: share of steps accepting >= k
    histogram: list[int] = field(default_factory=list)  # j: verify steps that accepted exactly j
    along: list[float | None] = field(default_factory=list)  # length per SPEC_ALONG_BUCKET positions
    along_steps: list[int] = field(default_factory=list)  # the verify steps behind each bucket
    along_bucket: int = SPEC_ALONG_BUCKET
    sources: dict[str, str] = field(default_factory=dict)
    requests: int = 0  # OK requests whose response carried verify steps
    steps: float | None = None  # verify steps, per request summed (else the counters' delta)
    drafted: float | None = None
    accepted: float | None = None
    counter_length: float | None = None  # the counters' length, when per-request data gave the figure
    counter_rate: float | None = None
    counter_per_position: list[float] = field(
        default_factory=list
    )  # the counters' >=k, beside per-request ones
    note: str | None = None  # the per-request and counter figures disagree beyond TOLERANCE


def _sum(x: np.ndarray[Any, Any]) -> float:
    return float(x.sum())


def _source(c: LevelColumns, rows: np.ndarray[Any, Any]) -> str:
    """The records' spec_source values of ``rows``, joined (FROM_OLD_RECORDS for records without one)."""
    codes, names = c.codes("spec_source"), c.labels["spec_source"]
    used = sorted({str(names[i]) for i in np.unique(codes[rows])} - {"None"})
    return " + ".join(used) or FROM_OLD_RECORDS


def _from_records(a: Acceptance, c: LevelColumns) -> None:
    ok = c.is_label("status", OK)
    verify, accepted, drafted, tokens = c.col("verify"), c.col("accepted"), c.col("drafted"), c.col("tokens")
    # llama.cpp's timings say no drafting steps. Records written before this rule carry its target
    # passes (output tokens - accepted) as steps: a per-pass figure, not the length.
    with_steps = ok & (verify > 0) & ~c.is_label("spec_source", SPEC_LLAMACPP)  # (nan > 0 is False)
    if with_steps.any():
        source = _source(c, with_steps)
        a.requests = int(with_steps.sum())
        counted = with_steps & ~np.isnan(accepted)
        if counted.any():  # 1 + accepted / steps: vLLM's mean_acceptance_length, summed over requests
            a.steps, a.accepted = _sum(verify[counted]), _sum(accepted[counted])
            a.length = 1.0 + a.accepted / a.steps
        else:  # only the steps: output tokens / steps (SGLang's spec_accept_length)
            a.steps = _sum(verify[with_steps])
            a.length = _sum(tokens[with_steps]) / a.steps
        a.sources["length"] = source
    rated = ok & (drafted > 0) & ~np.isnan(accepted)
    if rated.any():
        a.drafted = _sum(drafted[rated])
        a.rate = _sum(accepted[rated]) / a.drafted
        a.sources["rate"] = _source(c, rated)
    counted = ok & ~np.isnan(accepted)
    if counted.any():
        # Every target pass yields one token of its own. A request of the same server that counts no
        # accepted drafts drafted none (llama.cpp leaves draft_n out then): all its tokens are passes.
        t, acc = _sum(tokens[ok]), _sum(accepted[counted])
        if t > acc:
            a.tokens_per_pass = t / (t - acc)
            a.sources["tokens_per_pass"] = _source(c, counted)
    source = a.sources.get("length") or a.sources.get("rate") or FROM_OLD_RECORDS
    hist = c.spec.hist
    if len(hist) and hist.sum() > 0:
        a.histogram = hist.tolist()
        a.per_position = at_least(hist)
        a.sources["histogram"] = a.sources["per_position"] = source
    along = c.spec.along
    if len(along) and along[:, 0].sum() > 0:
        steps = along[:, 0]
        with np.errstate(divide="ignore", invalid="ignore"):
            lengths = 1.0 + along[:, 1] / steps
        a.along = [float(v) if n else None for v, n in zip(lengths.tolist(), steps.tolist(), strict=True)]
        a.along_steps = steps.tolist()
        a.sources["along"] = source


def at_least(hist: np.ndarray[Any, Any]) -> list[float]:
    """k = 1..K: the share of steps that accepted at least k draft tokens (hist[j]: exactly j)."""
    total = float(hist.sum())
    tail = np.cumsum(hist[::-1])[::-1]  # tail[k]: steps that accepted >= k
    return (tail[1:] / total).tolist() if total else []


def counter_delta(samples: Sequence[Any], start: float, end: float, get: Callable[[Any], Any]) -> Any | None:
    """last - first of ``get(sample)`` over [start, end] (core.counters.window_ends); None when not measurable."""
    usable = sorted((s for s in samples if get(s) is not None), key=lambda s: s.t)
    ends = window_ends(usable, start, end)
    if ends is None:
        return None
    first, last = ends
    return np.asarray(get(last), dtype=np.float64) - np.asarray(get(first), dtype=np.float64)


@dataclass
class _Counters:
    length: float | None = None
    rate: float | None = None
    per_position: list[float] = field(default_factory=list)
    steps: float | None = None
    drafted: float | None = None
    accepted: float | None = None
    tokens_per_pass: float | None = None
    generated: float | None = None  # output tokens over the window (vLLM's and SGLang's counter)
    k: int = 0  # draft positions the per-position counter has (0: none)


def _nan(v: float | None) -> float:
    return math.nan if v is None else v


def counters_broken(ctr: _Counters) -> str | None:
    """Why the counters' deltas cannot be true, by the bounds a record's counts are held to
    (core.records.spec_broken: accepted above drafted, above output tokens, more than K per step,
    negative, not finite), with the numbers; None when they can be."""
    if ctr.steps is None:
        return None
    values = (ctr.generated, ctr.steps, ctr.drafted, ctr.accepted, ctr.length, ctr.rate)
    if any(v is not None and not math.isfinite(v) for v in values):
        return "a count that is not finite"
    # K: the per-position counter's length, else the draft tokens per step (a fixed K drafts K a step)
    k = float(ctr.k) if ctr.k else (ctr.drafted / ctr.steps if ctr.drafted is not None else math.nan)
    i = int(spec_broken(_nan(ctr.generated), ctr.steps, _nan(ctr.drafted), _nan(ctr.accepted), k)[0])
    if i < 0:
        return None
    said = ", ".join(
        f"{name} {v:g}"
        for name, v in (
            ("verify steps", ctr.steps),
            ("drafted", ctr.drafted),
            ("accepted", ctr.accepted),
            ("output tokens", ctr.generated),
        )
        if v is not None
    )
    return f"{SPEC_BOUNDS[i]} ({said})"


def _from_counters(samples: Sequence[Any], start: float, end: float) -> _Counters:
    """vLLM's spec_decode counters (and llama.cpp's of the same names), else SGLang's verify calls."""
    out = _Counters()
    drafts = counter_delta(samples, start, end, lambda s: s.spec_num_drafts)
    accepted = counter_delta(samples, start, end, lambda s: s.spec_num_accepted_tokens)
    if drafts is not None and accepted is not None and drafts > 0:
        out.steps, out.accepted = float(drafts), float(accepted)
        out.length = 1.0 + out.accepted / out.steps
        generated = counter_delta(samples, start, end, lambda s: s.generation_tokens)
        out.generated = None if generated is None else float(generated)
        if generated is not None and generated > out.accepted:
            out.tokens_per_pass = float(generated) / (float(generated) - out.accepted)
        tokens = counter_delta(samples, start, end, lambda s: s.spec_num_draft_tokens)
        if tokens is not None and tokens > 0:
            out.drafted = float(tokens)
            out.rate = out.accepted / out.drafted
        k = out.k = max((len(s.spec_accepted_per_pos or ()) for s in samples), default=0)
        if k:
            pos = counter_delta(
                samples,
                start,
                end,
                lambda s: s.spec_accepted_per_pos if len(s.spec_accepted_per_pos or ()) == k else None,
            )
            if pos is not None:
                out.per_position = (pos / out.steps).tolist()
        return out
    calls = counter_delta(samples, start, end, lambda s: s.spec_verify_calls)
    generated = counter_delta(samples, start, end, lambda s: s.generation_tokens)
    if calls is not None and generated is not None and calls > 0:
        out.steps, out.generated = float(calls), float(generated)
        out.length = float(generated) / out.steps
    return out


def acceptance(c: LevelColumns, samples: Sequence[Any], start: float, end: float) -> Acceptance | None:
    """The level's acceptance figures; None when no source has any (a server without speculation)."""
    a = Acceptance()
    if c.sent:
        _from_records(a, c)
    ctr = _from_counters(samples, start, end) if samples else _Counters()
    refused = counters_broken(ctr)
    if refused is not None:  # as a record breaking these bounds loses its spec fields
        ctr = _Counters()
    if a.length is None and ctr.length is not None:
        a.length, a.steps, a.accepted = ctr.length, ctr.steps, ctr.accepted
        a.sources["length"] = FROM_COUNTERS
    elif ctr.length is not None:
        a.counter_length = ctr.length
    if a.rate is None and ctr.rate is not None:
        a.rate, a.drafted = ctr.rate, ctr.drafted
        a.sources["rate"] = FROM_COUNTERS
    elif ctr.rate is not None:
        a.counter_rate = ctr.rate
    if a.tokens_per_pass is None and ctr.tokens_per_pass is not None:
        a.tokens_per_pass = ctr.tokens_per_pass
        a.sources["tokens_per_pass"] = FROM_COUNTERS
    if not a.per_position and ctr.per_position:
        a.per_position = ctr.per_position
        a.sources["per_position"] = FROM_COUNTERS
    elif ctr.per_position:
        a.counter_per_position = ctr.per_position
    a.note = mismatch_note(a.length, a.counter_length, a.rate, a.counter_rate)
    positions = position_gaps(a.per_position, a.counter_per_position)
    if positions is not None:
        a.note = (a.note + "; " if a.note else "") + positions
    if refused is not None:
        said = f"the server's /metrics counters were refused: {refused}; no acceptance figure from them"
        a.note = (a.note + "; " if a.note else "") + said
        return a  # (figures from the responses, or none: the refusal is said either way)
    return a if a.length is not None or a.rate is not None else None


def mismatch_note(
    length: float | None, counter_length: float | None, rate: float | None, counter_rate: float | None
) -> str | None:
    """A sentence when the responses' and the counters' figures differ by more than TOLERANCE."""
    gaps = []
    if (
        length is not None
        and counter_length is not None
        and abs(counter_length - length) > TOLERANCE * length
    ):
        gaps.append(
            f"acceptance length {length:.2f} from the responses, {counter_length:.2f} from the counters"
        )
    if (
        rate is not None
        and counter_rate is not None
        and abs(counter_rate - rate) > TOLERANCE * max(rate, 0.05)
    ):
        gaps.append(f"acceptance rate {rate:.1%} from the responses, {counter_rate:.1%} from the counters")
    if not gaps:
        return None
    return (
        "; ".join(gaps)
        + f" (beyond the {TOLERANCE:.0%} tolerance): the server's counters include traffic other than this "
        "level's requests (another client, warm-up at the window's edge), or some responses lack the fields"
    )


def _share_gap(v: float, counter: float) -> bool:
    """A share and the counters' beyond TOLERANCE of it (of 5 % at least: near 0 a few steps are all of it)."""
    return abs(counter - v) > TOLERANCE * max(v, 0.05)


def position_gaps(per_position: Sequence[float], counter_per_position: Sequence[float]) -> str | None:
    """A sentence naming each draft position k whose share of steps accepting >= k differs between the
    responses (their histograms) and vLLM's ``..._num_accepted_tokens_per_pos_total{position=k-1}``
    delta / the drafts' delta beyond the tolerance of the totals; a different K is a gap too."""
    if not per_position or not counter_per_position:
        return None
    if len(per_position) != len(counter_per_position):
        return (
            f"acceptance per position: {len(per_position)} draft positions in the responses, "
            f"{len(counter_per_position)} in the counters (another model's or draft length's traffic)"
        )
    gaps = [
        f"k={k} {v:.1%} from the responses, {c:.1%} from the counters"
        for k, (v, c) in enumerate(zip(per_position, counter_per_position, strict=True), start=1)
        if _share_gap(v, c)
    ]
    if not gaps:
        return None
    return (
        f"acceptance per position ({', '.join(gaps)}) beyond the {TOLERANCE:.0%} tolerance: the server's "
        "counters include traffic other than this level's requests, or some responses lack the histogram"
    )
