"""Which charts a report and a comparison draw, and from which figures (specload.present.svg draws them).

Every value here is a figure the tables already print (LevelStats, docs/metrics.md), put on an
axis: nothing is computed for a chart alone except the failure share, which is the table's
Fail + Short over the level's measured requests. One run is a comparison of one: the same list
of charts, one line per run, so the HTML report and comparison show the same pictures.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from specload.analysis import figures
from specload.analysis.acceptance import acceptance
from specload.analysis.columns import LevelColumns
from specload.analysis.metrics import SERIES_BUCKET_S, SERIES_STREAMED, LevelStats, ServerSample
from specload.present.svg import Chart, Mark, Series, colour_of


@dataclass(frozen=True)
class RunLines:
    """One run as its charts need it: a name, its levels, its server samples, its request cap."""

    label: str
    levels: Sequence[LevelStats]
    samples: Sequence[ServerSample] = ()
    max_running: int | None = None


def _by_x(
    levels: Sequence[LevelStats], value: Callable[[LevelStats], float | None]
) -> tuple[list[float], list[float | None]]:
    """Per distinct x (concurrency or rate), the mean over its repeats that have a value."""
    xs = sorted({s.x for s in levels})
    ys: list[float | None] = []
    for x in xs:
        vals = [v for s in levels if s.x == x and (v := value(s)) is not None and math.isfinite(v)]
        ys.append(sum(vals) / len(vals) if vals else None)
    return [float(x) for x in xs], ys


def _stopped_labels(levels: Sequence[LevelStats], xs: Sequence[float]) -> list[str]:
    """ "stopped" at each x where a level did not run its whole budget (status incomplete): its
    point is drawn as measured, and said to be a part of a level."""
    stopped = {s.x for s in levels if s.status == "incomplete"}
    return ["stopped" if x in stopped else "" for x in xs]


def _is_rate(runs: Sequence[RunLines]) -> bool:
    return any(s.rate is not None for r in runs for s in r.levels)


def _x_label(rate: bool) -> str:
    return "request rate (requests/s)" if rate else "concurrency C (log2)"


def _cap_marks(runs: Sequence[RunLines], rate: bool) -> list[Mark]:
    if rate:
        return []
    return [
        Mark(
            float(r.max_running),
            f"{r.label}: cap {r.max_running}" if len(runs) > 1 else f"cap {r.max_running}",
        )
        for r in runs
        if r.max_running is not None and any(s.concurrency > r.max_running for s in r.levels)
    ]


def _per_level(
    key: str,
    title: str,
    y_label: str,
    runs: Sequence[RunLines],
    lines: Sequence[tuple[str, Callable[[LevelStats], float | None], bool]],
    marks: Sequence[Mark] = (),
) -> Chart:
    """A figure against the level axis: for each run, one line per (suffix, value, dashed)."""
    rate = _is_rate(runs)
    series = []
    for k, r in enumerate(runs):
        for suffix, value, dashed in lines:
            xs, ys = _by_x(r.levels, value)
            name = " ".join(p for p in (r.label if len(runs) > 1 else "", suffix) if p) or r.label
            # one colour per run in every chart; its p50 and p99 told apart by the dash
            series.append(Series(name, xs, ys, dashed, _stopped_labels(r.levels, xs), colour_of(k)))
    return Chart(key, title, _x_label(rate), y_label, series, log2_x=not rate, marks=list(marks))


def level_charts(runs: Sequence[RunLines], marks: Mapping[str, Sequence[Mark]] | None = None) -> list[Chart]:
    """The charts against C (or rate), the Pareto plot and the over-time charts, in page order.

    ``marks``: extra vertical lines on the throughput charts (a comparison's crossovers), by the key of
    the figure they belong to (``agg``, ``per_req``): each chart gets its own figure's, never another's.
    """
    rate = _is_rate(runs)
    caps = _cap_marks(runs, rate)
    one = len(runs) == 1
    charts = []
    for spec in figures.CHARTS:
        lines = [(name, figures.BY_KEY[key].number, i > 0) for i, (key, name) in enumerate(spec.lines)]
        if spec.if_value and not any(v(s) is not None for r in runs for s in r.levels for _, v, _ in lines):
            continue
        own = (marks or {}).get(spec.lines[0][0], ()) if spec.marks else ()
        chart_marks = [*own, *caps] if spec.key != "accept" else []
        charts.append(_per_level(spec.key, spec.title, spec.y_label, runs, lines, chart_marks))
        if spec.key == "e2e":
            charts.append(pareto_chart(runs))
    if any(r.samples for r in runs):
        charts.append(server_chart(runs))
    over = acceptance_over_time(runs)
    if over.has_points():
        charts.append(over)
    if one:
        charts.append(tok_s_over_time(runs[0]))
    return charts


def pareto_chart(runs: Sequence[RunLines]) -> Chart:
    """Per-user against aggregate tok/s, one point per level (labelled), a line per run."""
    rate = _is_rate(runs)
    series = []
    for k, r in enumerate(runs):
        xs, per = _by_x(r.levels, lambda s: s.per_req_tok_s)
        _, agg = _by_x(r.levels, lambda s: s.agg_tok_s)
        pts = [(p, a, x) for p, a, x in zip(per, agg, xs, strict=True) if p is not None and a is not None]
        labels = [f"{x:g}/s" if rate else f"C={x:g}" for _, _, x in pts]
        series.append(
            Series(
                r.label, [p for p, _, _ in pts], [a for _, a, _ in pts], labels=labels, colour=colour_of(k)
            )
        )
    return Chart(
        "pareto",
        "Per-user vs aggregate tok/s (one point per level)",
        "per-request tok/s",
        "aggregate tok/s",
        series,
    )


def server_chart(runs: Sequence[RunLines]) -> Chart:
    """The server's running and queued requests over the run (its /metrics samples)."""
    series = []
    for k, r in enumerate(runs):
        if not r.samples:
            continue
        t0 = r.samples[0].t
        prefix = f"{r.label} " if len(runs) > 1 else ""
        xs = [s.t - t0 for s in r.samples]
        # a run's colour; running solid, queued dashed (one run alone: two colours, as before)
        one = len(runs) == 1
        series.append(Series(f"{prefix}running", xs, [s.running for s in r.samples], colour=colour_of(k)))
        series.append(
            Series(
                f"{prefix}queued", xs, [s.queued for s in r.samples], True, colour=colour_of(1 if one else k)
            )
        )
    return Chart(
        "server",
        "Server: running and queued requests over time",
        "seconds since the first sample",
        "requests",
        series,
    )


def acceptance_over_time(runs: Sequence[RunLines]) -> Chart:
    """The acceptance length between each two of the server's samples: the level's Accept len from
    the server's counters (specload.analysis.acceptance), over that interval alone; a gap where the
    server made no verify step."""
    empty = LevelColumns()
    series = []
    for k, r in enumerate(runs):
        if len(r.samples) < 2:
            continue
        t0 = r.samples[0].t
        xs: list[float] = []
        ys: list[float | None] = []
        for a, b in zip(r.samples, r.samples[1:], strict=False):
            got = acceptance(empty, (a, b), a.t, b.t)
            xs.append(b.t - t0)
            ys.append(got.length if got is not None else None)
        if any(y is not None for y in ys):  # in its run's colour even when the other runs have none
            series.append(Series(r.label, xs, ys, colour=colour_of(k)))
    return Chart(
        "accept_over_time",
        "Acceptance length over time (server counters)",
        "seconds since the first sample",
        "tokens per verify step",
        series,
    )


def tok_s_over_time(run: RunLines) -> Chart:
    """Output tok/s per SERIES_BUCKET_S of each level, from its first send (LevelStats.tok_s_series)."""
    series = []
    for s in run.levels:
        if s.tok_s_series:
            xs = [(i + 0.5) * SERIES_BUCKET_S for i in range(len(s.tok_s_series))]
            series.append(Series(s.label, xs, list(s.tok_s_series)))
    return Chart(
        "tok_s_over_time",
        "Output tok/s over time, per level",
        "seconds since the level's first request",
        "tok/s",
        series,
        note=_series_note(run.levels),
    )


def _series_note(levels: Sequence[LevelStats]) -> str:
    """How tok_s_series was made (LevelStats.tok_s_series_source): the streamed samples, else the records."""
    sources = {s.tok_s_series_source for s in levels if s.tok_s_series}
    if sources <= {SERIES_STREAMED}:
        return (
            "the tokens the client's streams had read, sampled about once a second (docs/metrics.md): "
            "a stall of every stream shows as it was"
        )
    return (
        "from the records (a run without streamed.jsonl): each request's tokens after its first are spread "
        "evenly up to its last token (docs/metrics.md), so a stall inside a request is averaged over it"
    )
