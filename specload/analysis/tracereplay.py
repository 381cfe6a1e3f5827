"""A trace replay's own figures: how late each request was sent against the trace's schedule, the
trace's arrival rate next to the rate the sends had, its lengths next to the server's counts, and
the server's prefix-cache hit rate next to the trace's ideal one (docs/metrics.md, "Trace replay").

Read from the records (``t_sched``, ``t_send``, the lengths, ``trace_index``) and run.json's
``trace`` (the window, the ideal hit rate, the text that filled the lengths); pure otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from specload.core import stats
from specload.core.records import FAILED, PHASE_MEASURE, RequestRecord

if TYPE_CHECKING:
    from specload.analysis.run import Run

# A replay keeps the trace's schedule when its p99 send lateness is at most this (the goal:
# every request within its due time + 5 ms at p99, on a quiet machine).
KEPT_P99_MS = 5.0
# The arrival-rate series: about this many bins over the replay's span, none shorter than MIN_BIN_S.
RATE_BINS = 40
MIN_BIN_S = 0.1
LENGTH_QS = (50.0, 90.0, 99.0)
# A server's hit rate this far above the trace's ideal had the prompts cached before the replay.
OVER_IDEAL = 0.02


@dataclass(frozen=True)
class Lengths:
    """One length distribution (tokens): n, mean, p50/p90/p99, max."""

    n: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of(cls, xs: Sequence[float]) -> Lengths:
        a = np.asarray(xs, dtype=float)
        if not len(a):
            return cls(0, None, None, None, None, None)
        p50, p90, p99 = stats.percentiles(a, LENGTH_QS)
        return cls(len(a), float(a.mean()), p50, p90, p99, float(a.max()))


@dataclass
class TraceReplay:
    """A replay's figures (``trace_replay`` of a run that replayed a trace)."""

    meta: dict[str, Any]  # run.json ``trace``
    window: int  # the window's requests (what was to be sent)
    sent: int  # measured records of the window's requests (each once)
    failed: int
    late_p50_ms: float | None = None
    late_p99_ms: float | None = None
    late_max_ms: float | None = None
    late_over_ms: int = 0  # requests sent more than KEPT_P99_MS after they were due
    kept_schedule: bool | None = None  # p99 lateness within KEPT_P99_MS (None: nothing sent)
    ideal_hit_rate: float | None = None
    server_hit_rate: float | None = None
    server_hit_source: str | None = None
    # Arrival rate over the replay (requests/s per bin, bins of bin_s from the first due time): due
    # (the trace's, sped up) and sent.
    bin_s: float = 0.0
    due_per_s: list[float] = field(default_factory=list)
    sent_per_s: list[float] = field(default_factory=list)
    lengths: dict[str, Lengths] = field(default_factory=dict)  # trace input/output vs the server's counts
    # Each request's due time (seconds from the first) and its send lateness (ms), in due order.
    due_s: list[float] = field(default_factory=list)
    late_ms: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Every field unrounded (``meta``: run.json's ``trace``, the description), and the
        threshold ``kept_schedule`` was judged by."""
        return {**asdict(self), "kept_p99_threshold_ms": KEPT_P99_MS}


def rate_series(t0: float, times: np.ndarray, span: float) -> tuple[float, list[float]]:
    """(bin seconds, requests/s per bin) of ``times`` from ``t0`` over ``span`` seconds."""
    bin_s = max(MIN_BIN_S, span / RATE_BINS) if span > 0 else 1.0
    n = max(1, int(np.ceil(span / bin_s - 1e-9)))
    idx = np.clip(((times - t0) / bin_s).astype(int), 0, n - 1)
    counts = np.bincount(idx, minlength=n)[:n]
    return bin_s, [float(c) / bin_s for c in counts]


def trace_replay_of(
    records: Sequence[RequestRecord],
    meta: Mapping[str, Any],
    hit_rate: float | None = None,
    hit_source: str | None = None,
    behind_note: str | None = None,
) -> TraceReplay | None:
    """The replay's figures from its measured records; None when run.json holds no trace.
    ``hit_rate``/``hit_source``: the level's server prefix-cache hit rate (LevelStats);
    ``behind_note``: why the level's requests went late, when its figures say (LevelStats.late_note)."""
    if not meta:
        return None
    recs = [r for r in records if r.phase == PHASE_MEASURE and r.trace_index is not None]
    window = int(meta.get("requests") or 0)
    out = TraceReplay(
        dict(meta),
        window,
        len({r.trace_index for r in recs}),
        sum(1 for r in recs if r.status == FAILED),
        ideal_hit_rate=meta.get("ideal_hit_rate"),
        server_hit_rate=hit_rate,
        server_hit_source=hit_source,
    )
    timed = [r for r in recs if r.t_sched is not None]
    if timed:
        sched = np.array([r.t_sched for r in timed], dtype=float)
        send = np.array([r.t_send for r in timed], dtype=float)
        lag_ms = (send - sched) * 1e3
        p50, p99 = stats.percentiles(lag_ms, (50.0, 99.0))
        out.late_p50_ms, out.late_p99_ms, out.late_max_ms = p50, p99, float(lag_ms.max())
        out.late_over_ms = int((lag_ms > KEPT_P99_MS).sum())
        out.kept_schedule = p99 is not None and p99 <= KEPT_P99_MS
        t0 = float(sched.min())
        span = float(max(sched.max(), send.max()) - t0)
        out.bin_s, out.due_per_s = rate_series(t0, sched, span)
        _, out.sent_per_s = rate_series(t0, send, span)
        order = np.argsort(sched, kind="stable")
        out.due_s = [float(x) for x in sched[order] - t0]
        out.late_ms = [float(x) for x in lag_ms[order]]
    out.lengths = {
        "input (trace)": Lengths.of([r.requested_prompt_tokens for r in recs]),
        "input (server count)": Lengths.of([r.prompt_tokens for r in recs if r.prompt_tokens is not None]),
        "output (trace)": Lengths.of([r.requested_output_tokens for r in recs]),
        "output (received)": Lengths.of([r.output_tokens for r in recs if r.status != FAILED]),
    }
    out.notes = _notes(out, recs, behind_note)
    return out


def _notes(t: TraceReplay, recs: Sequence[RequestRecord], behind: str | None) -> list[str]:
    notes: list[str] = []
    if t.sent < t.window:
        notes.append(
            f"{t.window - t.sent} of the window's {t.window} requests have no record (the run stopped early)"
        )
    if t.kept_schedule is False:
        why = behind or "the client or the in-flight cap held them back"
        notes.append(
            f"the replay did not keep the trace's schedule: p99 send lateness {t.late_p99_ms:.1f} ms "
            f"(over {KEPT_P99_MS:g} ms), {t.late_over_ms} of {t.sent} requests more than {KEPT_P99_MS:g} ms "
            f"late; {why}"
        )
    wrong = [
        r
        for r in recs
        if r.status != FAILED and r.prompt_tokens is not None and r.prompt_tokens != r.requested_prompt_tokens
    ]
    if wrong:
        notes.append(
            f"{len(wrong)} request(s) were counted by the server at another prompt length than the trace's "
            f"(e.g. row {wrong[0].trace_index}: {wrong[0].prompt_tokens} for {wrong[0].requested_prompt_tokens})"
        )
    ideal = t.ideal_hit_rate or 0.0
    if t.server_hit_rate is not None and t.server_hit_rate > ideal + OVER_IDEAL:
        notes.append(
            f"the server's prefix cache served {t.server_hit_rate:.1%} of the prompt tokens, more than the "
            f"trace's ideal {ideal:.1%}: it held these prompts from before (the same window replayed against "
            "this server earlier); restart the server for a replay that starts cold"
        )
    if t.ideal_hit_rate is not None and t.server_hit_rate is None:
        notes.append("the server reported no prefix-cache figure to hold against the trace's ideal hit rate")
    return notes


def run_trace_replays(run: Run) -> dict[int, TraceReplay]:
    """``trace_replay_of`` each level of a loaded run that replayed a trace (a replay is one level per
    repeat), by its run.json level index; {} when it replayed none. The report's text shows the first
    (``run_trace_replay``), its JSON every one (``trace`` on each level)."""
    meta = run.info.trace
    if not meta:
        return {}
    by_level: dict[int, list[RequestRecord]] = {}
    for r in run.records:
        by_level.setdefault(r.level, []).append(r)
    out: dict[int, TraceReplay] = {}
    for lv in run.levels:
        if lv.index is None:
            continue
        replay = trace_replay_of(
            by_level.get(lv.index, []),
            meta,
            lv.extra.get("prefix_cache_hit_rate"),
            lv.sources.get("prefix_cache_hit_rate"),
            lv.late_note,
        )
        if replay is not None:
            out[lv.index] = replay
    return out


def run_trace_replay(run: Run) -> TraceReplay | None:
    """The first replay of a loaded run (with --repeat, the first repeat's); a run that replayed a
    trace but has no level yet gets the window's figures with nothing sent."""
    replays = run_trace_replays(run)
    if replays:
        return replays[min(replays)]
    return trace_replay_of(run.records, run.info.trace)
