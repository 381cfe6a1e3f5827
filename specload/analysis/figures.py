"""The figure table: one entry per per-level figure, and everything every surface needs to show it.

A level's figures are computed once, by one function (``metrics.summarize`` over its columns and
a mask: the level, a part of it (a class, a turn, a category), or the live view's level so far); this table says, per figure, what it is called,
in which unit and with how many digits, in which ``--columns`` sets and at which rank a narrow
terminal keeps it, how its repeats combine (mean, max or sum), when a table shows it and on which
surfaces it appears. The report's tables, its CSV and JSON, the HTML page and its charts,
``specload compare`` (its table and JSON), the web page's live table, Locust's levels tab and
``--columns`` are all generated from it, so a figure added here (and defined in docs/metrics.md)
is shown everywhere: CONTRIBUTING.md, "Add a figure".
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as _field
from typing import TYPE_CHECKING, Any, NamedTuple

from specload.analysis.mixstats import (
    CACHE_FROM_COUNTERS,
    CACHE_FROM_GAUGE,
    CACHE_FROM_RECORDS,
    prefix_cache_rate,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from specload.analysis.columns import LevelColumns

    Mask = npt.NDArray[np.bool_]

# A level's figures and a server sample (metrics.LevelStats and ServerSample, read by attribute; not
# imported: metrics imports this table).
LevelStats = Any
ServerSample = Any

# How a figure's repeats (--repeat) combine into the one value a comparison shows.
MEAN = "mean"  # the mean of the repeats that have a value
MAX = "max"  # the largest (a server gauge: how far the queue went, not how far on average)
SUM = "sum"  # the total (a count)

# When a table shows a figure's column.
ALWAYS = "always"
IF_VALUE = "if_value"  # some level has a value (None elsewhere)
IF_COUNTED = "if_counted"  # some level counted one (0 elsewhere)

# The named column sets of ``--columns`` (specload.present.tableview), in the order the help lists them.
SEED = "seed"
FAILURES = "failures"
LATENCY = "latency"
THROUGHPUT = "throughput"
SERVER = "server"
SLO = "slo"
ACCEPTANCE = "acceptance"
REASONING = "reasoning"
SETS: tuple[str, ...] = (SEED, FAILURES, LATENCY, THROUGHPUT, SERVER, SLO, ACCEPTANCE, REASONING)
_EVERY_SET = (SEED, FAILURES, LATENCY, THROUGHPUT, SERVER, SLO)


@dataclass(frozen=True)
class Server:
    """What a level holds from the server beside its records, for a figure computed from it: the
    run's /metrics samples in time order (() for a part of a level, a class or a turn: the server's
    counters and gauges cover the whole level) and the level's window, [start, end], whose counter
    deltas end at ``counters_end`` (metrics.counter_window_end: the sample taken as the level closed)."""

    samples: Sequence[ServerSample] = ()  # metrics.ServerSample (not imported: metrics imports this table)
    start: float = 0.0
    end: float = 0.0
    counters_end: float = 0.0

    def within(self) -> list[ServerSample]:
        """The samples taken inside the level's window (a gauge's readings over the level)."""
        return [x for x in self.samples if self.start <= x.t <= self.end]


class Sourced(NamedTuple):
    """A computed figure and where it came from (a key of its Figure.sources): the report's note
    names the source, LevelStats.sources keeps it by the figure's JSON field."""

    value: float | None
    source: str | None


# A figure's computation: over a level's columns, a mask of its requests and what it holds from the server.
Compute = Callable[["LevelColumns", "Mask", Server], "float | Sourced | None"]


@dataclass(frozen=True)
class Figure:
    """One per-level figure and where it is shown.

    ``value`` reads it from a level's figures (a number, or for a figure that is not a number, the
    object its cell is made from); ``field`` is its name in JSON (the report's and compare's, the
    web page's live rows). ``rank``: its place in the order a narrow terminal drops columns (lower
    is kept longer; None: never in a ranked table)."""

    key: str  # its name for --columns
    field: str
    header: str
    unit: str
    digits: int
    value: Callable[[LevelStats], Any]
    sets: tuple[str, ...] = ()
    # A figure computed here rather than a LevelStats field: over a level's columns, a mask of its
    # requests (every measured one for the level) and its Server; metrics.summarize keeps it in
    # LevelStats.extra (and a Sourced value's source in LevelStats.sources).
    compute: Compute | None = None
    rank: int | None = None
    combine: str = MEAN
    show: str = ALWAYS
    scale: float = 1.0  # what a cell multiplies the value by (100: a share shown in %)
    numeric: bool = True  # False: ``value`` is an object a surface formats itself
    report: bool = True  # a column of the report's per-level table
    compare: bool = False  # a column per run of compare's table (compare's JSON has every numeric one)
    live: bool = False  # a column of the web page's live table
    part: bool = False  # a column of the tables of a level's request classes and conversation turns
    category: bool = False  # a column of the tables of a level's prompt categories
    # A percentile of a latency distribution: (LevelStats.dists name, percentile, scale of the value
    # to seconds' multiple); ``value`` reads it from there (and another tool's figure is put there).
    dist: tuple[str, float, float] | None = None
    # compare's table: the header of each treatment's change column after this figure's ("" none)
    delta: str = ""
    # a computed figure's sources (Sourced.source): what the report's note calls each
    sources: Mapping[str, str] = _field(default_factory=dict)

    @classmethod
    def of(cls, key: str, field: str, header: str, unit: str, digits: int, **kw: Any) -> Figure:
        """A figure computed over a level's columns (``compute``), kept in LevelStats.extra."""
        return cls(key, field, header, unit, digits, lambda s: s.extra.get(field), **kw)

    @property
    def title(self) -> str:
        """The header without its time unit: what --columns' help names it by."""
        return re.sub(r" \((ms|s)\)$", "", self.header)

    def number(self, s: LevelStats) -> float | None:
        """The figure at a level as a finite number, unscaled (None: it has none)."""
        v = self.value(s) if self.numeric else None
        if v is None or isinstance(v, bool) or not isinstance(v, int | float):
            return None
        return v if math.isfinite(v) else None  # (a count stays an int)

    def shown(self, levels: Iterable[LevelStats]) -> bool:
        """Whether a table of these levels has the column (``show``)."""
        if self.show == ALWAYS:
            return True
        values = [self.value(s) for s in levels]
        return any(values) if self.show == IF_COUNTED else any(v is not None for v in values)


def _attr(name: str) -> Callable[[LevelStats], Any]:
    return lambda s: getattr(s, name)


# The figures that are a percentile of a latency distribution (Figure.dist).
_DISTS: dict[str, tuple[str, float, float]] = {
    f"{name}_p{q:g}": (name, q, scale)
    for name, scale in (("ttft", 1e3), ("tpot", 1e3), ("itl", 1e3), ("e2e", 1.0))
    for q in (50.0, 99.0)
}


def _accept(name: str) -> Callable[[LevelStats], Any]:
    return lambda s: getattr(s.acceptance, name) if s.acceptance is not None else None


def _reasoning(name: str) -> Callable[[LevelStats], Any]:
    return lambda s: getattr(s.reasoning, name) if s.reasoning is not None else None


def _slo(name: str) -> Callable[[LevelStats], Any]:
    return lambda s: getattr(s.slo, name) if s.slo is not None else None


def _fail_pct(s: LevelStats) -> float | None:
    return 100.0 * (s.failed + s.short) / s.sent if s.sent else None


def _has_list(name: str) -> Callable[[LevelStats], Any]:
    """The acceptance object when its ``name`` list has something (else None, for IF_VALUE)."""
    return lambda s: s.acceptance if s.acceptance is not None and getattr(s.acceptance, name) else None


# How each figure is read from a level where it is not simply its JSON field of LevelStats.
_VALUES: dict[str, Callable[[LevelStats], Any]] = {
    "accept": _accept("length"),
    "accept_rate": _accept("rate"),
    "tok_pass": _accept("tokens_per_pass"),
    "accept_pos": _has_list("per_position"),
    "accept_hist": lambda s: (
        s.acceptance if s.acceptance is not None and any(s.acceptance.histogram) else None
    ),
    "accept_along": _has_list("along"),
    "first_answer": _reasoning("answer_ttft_p50_ms"),
    "reasoning_tokens": _reasoning("reasoning_tokens_mean"),
    "answer_tok_s": _reasoning("answer_tok_s_mean"),
    "agg_answer": _reasoning("agg_answer_tok_s"),
    "srv_run_queue": _attr("server_running_max"),
    "slo_met": _attr("slo"),
    "good_pct": _slo("good_share"),
    "goodput_req_s": _slo("goodput_req_s"),
    "goodput_tok_s": _slo("goodput_tok_s"),
    "fail_pct": _fail_pct,
    "tokens_share": lambda s: s.extra.get("output_token_share"),
}

# The figures each treatment's change follows in compare's table (analysis.comparison computes every
# one, Comparison.changes), by the header of the change's column.
_DELTAS: dict[str, str] = {
    "agg": "Δ agg",
    "per_req": "Δ per-req",
    "tpot_p50": "Δ TPOT",
    "first_answer": "Δ first answer",
    "answer_tok_s": "Δ answer tok/s",
}


def _prefix_hit(c: LevelColumns, mask: Mask, server: Server) -> Sourced:
    """docs/metrics.md, "Prefix cache hit rate": the records' counts, else the server's counters, else its gauge."""
    return Sourced(
        *prefix_cache_rate(c.subset(mask), server.samples, server.start, server.end, server.counters_end)
    )


# The figures computed here, over a level's columns, a mask of its requests and what it holds from
# the server (the rest are the fields metrics.summarize fills), and what their report notes call
# their sources.
_COMPUTE: dict[str, Compute] = {"prefix_hit": _prefix_hit}
_SOURCES: dict[str, dict[str, str]] = {
    "prefix_hit": {
        CACHE_FROM_RECORDS: "the server's per-request count of cached prompt tokens",
        CACHE_FROM_COUNTERS: "the server's prefix cache counters (hits / queries over the level's window)",
        CACHE_FROM_GAUGE: "the server's cache_hit_rate gauge (mean over the level's samples)",
    }
}

# The table, in the report's column order; docs/metrics.md defines every figure. ``on``: r the
# report's table, c a column per run of compare's table (compare's JSON has every numeric figure),
# l the web page's live table, p the tables of a level's request classes and turns, k those of its
# prompt categories (where a part's Agg tok/s, over the level's wall time, is the level's times its
# share of the tokens: its token share instead; docs/metrics.md, "Prompt categories"),
# o not a number (its surfaces format the object ``value`` gives), - none of these.
# ``rank``: - for never in a ranked table. ``sets``: + between sets, * for every set but the last two.
_TABLE = """
key              | field                  | header                 | unit        | digits | rank | combine | show       | scale | on   | sets
rate             | rate                   | Rate (req/s)           | req/s       | 0      | 0    | mean    | if_value   | 1     | ro   | *
c                | concurrency            | C                      | users       | 0      | 1    | mean    | always     | 1     | ro   | *
agg              | agg_tok_s              | Agg tok/s              | tok/s       | 1      | 2    | mean    | always     | 1     | rclp | seed
tokens_share     | output_token_share     | Tokens %               | %           | 0      | -    | mean    | if_value   | 100   | k    | seed
per_req          | per_req_tok_s          | Per-req tok/s          | tok/s       | 1      | 3    | mean    | always     | 1     | rclpk| seed
tokens           | output_tokens          | Tokens                 | tokens      | 0      | 4    | sum     | always     | 1     | r    | seed
wall             | wall_s                 | Wall(s)                | s           | 1      | 5    | mean    | always     | 1     | r    | seed
ok               | ok                     | Ok                     | requests    | 0      | 6    | sum     | always     | 1     | rpk  | seed+failures
fail             | failed                 | Fail                   | requests    | 0      | 8    | sum     | always     | 1     | rpk  | failures
short            | short                  | Short                  | requests    | 0      | 9    | sum     | always     | 1     | rpk  | failures
ttft_p50         | ttft_p50_ms            | TTFT p50 (ms)          | ms          | 1      | 12   | mean    | always     | 1     | rclpk| latency
ttft_p99         | ttft_p99_ms            | TTFT p99 (ms)          | ms          | 1      | 20   | mean    | always     | 1     | rclpk| latency
tpot_p50         | tpot_p50_ms            | TPOT p50 (ms)          | ms          | 1      | 13   | mean    | always     | 1     | rclpk| latency
tpot_p99         | tpot_p99_ms            | TPOT p99 (ms)          | ms          | 1      | 21   | mean    | always     | 1     | rl   | latency
itl_p99          | itl_p99_ms             | ITL p99 (ms)           | ms          | 1      | 22   | mean    | if_value   | 1     | c    | latency
e2e_p50          | e2e_p50_s              | E2E p50 (s)            | s           | 2      | 23   | mean    | always     | 1     | rpk  | latency
steady           | steady_tok_s           | Steady tok/s           | tok/s       | 1      | 27   | mean    | always     | 1     | r    | throughput
mean_conc        | mean_concurrency       | Mean conc              | requests    | 1      | 29   | mean    | always     | 1     | r    | throughput
req_s            | req_s                  | Req/s                  | req/s       | 2      | 28   | mean    | always     | 1     | r    | throughput
late             | late                   | Late                   | requests    | 0      | 11   | sum     | if_counted | 1     | r    | failures
429              | rate_limited           | 429                    | requests    | 0      | 10   | sum     | if_counted | 1     | r    | failures
accept           | accept_length          | Accept len             | tokens/step | 2      | 7    | mean    | if_value   | 1     | rclpk| server+acceptance
accept_rate      | accept_rate            | Accept rate %          | %           | 1      | 18   | mean    | if_value   | 100   | rc   | server+acceptance
tok_pass         | tokens_per_pass        | Tok/pass               | tokens/pass | 2      | 38   | mean    | if_value   | 1     | rcpk | acceptance
accept_pos       | accept_per_position    | Accept >=k %           | %           | 0      | 32   | mean    | if_value   | 100   | ro   | server+acceptance
accept_hist      | accept_histogram       | Accept hist %          | %           | 0      | 33   | mean    | if_value   | 100   | ro   | acceptance
accept_along     | accept_along           | Accept len per 100 tok | tokens/step | 2      | 34   | mean    | if_value   | 1     | ro   | acceptance
first_answer     | answer_ttft_p50_ms     | First answer p50 (ms)  | ms          | 1      | 35   | mean    | if_value   | 1     | rc   | reasoning
reasoning_tokens | reasoning_tokens_mean  | Reasoning tokens       | tokens      | 1      | 37   | mean    | if_value   | 1     | rc   | reasoning
answer_tok_s     | answer_tok_s_mean      | Answer tok/s           | tok/s       | 1      | 36   | mean    | if_value   | 1     | rc   | reasoning
prefix_hit       | prefix_cache_hit_rate  | Prefix hit %           | %           | 1      | 19   | mean    | if_counted | 100   | rclpk| server
srv_run_max      | server_running_max     | Srv run max            | requests    | 0      | 24   | max     | if_value   | 1     | r    | server
srv_run_mean     | server_running_mean    | Srv run mean           | requests    | 1      | 31   | mean    | if_value   | 1     | r    | server
srv_queue_max    | server_queued_max      | Srv queue max          | requests    | 0      | 14   | max     | if_value   | 1     | r    | server
srv_queue_mean   | server_queued_mean     | Srv queue mean         | requests    | 1      | 30   | mean    | if_value   | 1     | r    | server
srv_run_queue    | server_run_queue       | Srv run/queue          | requests    | 0      | 17   | max     | if_value   | 1     | col  | server
slo_met          | slo_met                | SLO met                |             | 0      | 15   | mean    | if_value   | 1     | rcol | slo
good_pct         | slo_good_share         | Good %                 | %           | 0      | 16   | mean    | if_value   | 100   | rcl  | slo
goodput_req_s    | goodput_req_s          | Goodput req/s          | req/s       | 2      | 26   | mean    | if_value   | 1     | r    | slo
goodput_tok_s    | goodput_tok_s          | Goodput tok/s          | tok/s       | 1      | 25   | mean    | if_value   | 1     | rc   | slo
itl_p50          | itl_p50_ms             | ITL p50 (ms)           | ms          | 1      | -    | mean    | if_value   | 1     | -    | latency
e2e_p99          | e2e_p99_s              | E2E p99 (s)            | s           | 2      | -    | mean    | always     | 1     | -    | latency
fail_pct         | fail_pct               | Fail+short %           | %           | 1      | -    | mean    | if_value   | 1     | -    | failures
agg_answer       | agg_answer_tok_s       | Agg answer tok/s       | tok/s       | 1      | -    | mean    | if_value   | 1     | -    | reasoning
"""


def _figure(line: str) -> Figure:
    key, field_, header, unit, digits, rank, how, show, scale, on, sets = (c.strip() for c in line.split("|"))
    compute, dist = _COMPUTE.get(key), _DISTS.get(key)
    value = _VALUES.get(key) or ((lambda s: s.extra.get(field_)) if compute else _attr(field_))
    if dist is not None:
        value = _percentile(*dist)
    return Figure(
        key,
        field_,
        header,
        unit,
        int(digits),
        value,
        _EVERY_SET if sets == "*" else tuple(sets.split("+")),
        compute,
        None if rank == "-" else int(rank),
        how,
        show,
        float(scale),
        numeric="o" not in on,
        report="r" in on,
        compare="c" in on,
        live="l" in on,
        part="p" in on,
        category="k" in on,
        dist=dist,
        delta=_DELTAS.get(key, ""),
        sources=_SOURCES.get(key, {}),
    )


def _percentile(name: str, q: float, scale: float) -> Callable[[LevelStats], float | None]:
    return lambda s: s.p(name, q, scale)


FIGURES: tuple[Figure, ...] = tuple(_figure(line) for line in _TABLE.strip().splitlines()[1:])
BY_KEY: dict[str, Figure] = {f.key: f for f in FIGURES}
BY_FIELD: dict[str, Figure] = {f.field: f for f in FIGURES}


@dataclass(frozen=True)
class ChartSpec:
    """A chart of figures of the table against the level axis (specload.present.charts draws it):
    one line per figure (by key; the second and later dashed), per run."""

    key: str
    title: str
    y_label: str
    lines: tuple[tuple[str, str], ...]  # (figure key, line name)
    page_id: str  # the web page's live chart is figure ``chart-<page_id>``
    marks: bool = False  # the throughput charts: a comparison's crossovers are marked on them
    if_value: bool = False  # drawn only when some level has a value


# The charts against C (or the rate), in page order (the Pareto plot follows the E2E chart).
CHARTS = (
    ChartSpec("agg_tok_s", "Aggregate output tok/s", "tok/s", (("agg", ""),), "agg", marks=True),
    ChartSpec(
        "per_req_tok_s", "Per-request tok/s", "tok/s per request", (("per_req", ""),), "perreq", marks=True
    ),
    ChartSpec("ttft", "TTFT p50 and p99", "ms", (("ttft_p50", "p50"), ("ttft_p99", "p99")), "ttft"),
    ChartSpec("tpot", "TPOT p50 and p99", "ms", (("tpot_p50", "p50"), ("tpot_p99", "p99")), "tpot"),
    ChartSpec("itl", "ITL p50 and p99", "ms", (("itl_p50", "p50"), ("itl_p99", "p99")), "itl"),
    ChartSpec("e2e", "E2E latency p50 and p99", "s", (("e2e_p50", "p50"), ("e2e_p99", "p99")), "e2e"),
    ChartSpec("errors", "Failed and short requests", "% of measured requests", (("fail_pct", ""),), "errors"),
    ChartSpec(
        "accept",
        "Acceptance length per level",
        "tokens per verify step",
        (("accept", ""),),
        "accept",
        if_value=True,
    ),
)


def source_notes(levels: Sequence[LevelStats]) -> list[str]:
    """Per computed figure that said where its values came from: the report's note naming the sources."""
    notes = []
    for f in FIGURES:
        said = sorted({x for s in levels if (x := s.sources.get(f.field))})
        if said and any(f.number(s) for s in levels):
            notes.append(f"{f.title} from {' and '.join(f.sources.get(x, x) for x in said)}")
    return notes


def combine(figure: Figure, levels: Sequence[LevelStats]) -> float | None:
    """A figure over a level's repeats, by its rule (MEAN, MAX, SUM) over the repeats that have it."""
    xs = [v for s in levels if (v := figure.number(s)) is not None]
    if not xs:
        return None
    if figure.combine == MAX:
        return max(xs)
    if figure.combine == SUM:
        return sum(xs)
    return sum(xs) / len(xs)


def combined(levels: Sequence[LevelStats]) -> dict[str, float | None]:
    """Every numeric figure of the table over a level's repeats, by JSON field."""
    return {f.field: combine(f, levels) for f in FIGURES if f.numeric}


def figures_json(s: LevelStats) -> dict[str, float | None]:
    """Every numeric figure of a level by JSON field, unrounded."""
    return {f.field: f.number(s) for f in FIGURES if f.numeric}
