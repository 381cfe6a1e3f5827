"""The per-level report of one run directory: ``specload report RUN_DIR``.

The run is read by specload.analysis.run (``load_run``), from the run directory alone, so a report can be
re-made at any time, on any machine, from what a run left behind. This module lays it out: the
per-level table in any --format, the header and the notes, report.md, and the command line. Code
that wants a report without argv calls ``render_report``, ``print_report`` or ``write_report_md``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from specload.analysis import figures
from specload.analysis.capacity import describe as describe_capacity
from specload.analysis.capacity import fmt_x, limit_reason
from specload.analysis.clientcheck import client_notes
from specload.analysis.figures import ALWAYS, Figure
from specload.analysis.metrics import PERCENTILES, GroupStats, LevelStats, MixStats, group_repeats, level_json
from specload.analysis.mixstats import LENGTHS
from specload.analysis.predict import PREDICTION_JSON, read_prediction
from specload.analysis.prompt_material import acceptance_caveat
from specload.analysis.run import REREAD_HELP, RUN_SLO, NotARunDir, Run, default_processes, load_run
from specload.analysis.tracereplay import TraceReplay, run_trace_replay, run_trace_replays
from specload.core.clocks import describe, is_off
from specload.core.records import level_label
from specload.core.rundir import REPORT_MD, RUN_COMPLETED, RUN_JSON
from specload.core.slo import LevelSlo, SloError, TargetResult, fmt_duration, parse_slo
from specload.core.text import MISSING, fmt_count, fmt_num, shorten
from specload.present.acceptview import (
    REASONING_COLUMNS,
    acceptance_notes,
    along_cell,
    histogram_cell,
    positions_cell,
    render_acceptance,
)
from specload.present.colour import for_stream, is_terminal
from specload.present.output import (
    fit_text,
    format_help,
    is_document,
    is_known_format,
    is_page,
    render_table,
    render_view,
)
from specload.present.predictview import render as render_prediction
from specload.present.tableview import WHOLE, TableView, columns_help, view_for
from specload.present.traceview import trace_json, trace_lines
from specload.workload.prompts import method_label
from specload.workload.recorded import recorded_scenario

REASON_WIDTH = 120
SERIES_PNG = "tok_s_over_time.png"


def _c_cell(s: LevelStats) -> str:
    if s.rate is not None:  # a rate level: its user pool caps what is in flight
        return f"<={s.concurrency}" if s.repeat == 0 else f"<={s.concurrency} r{s.repeat}"
    return str(s.concurrency) if s.repeat == 0 else f"{s.concurrency} r{s.repeat}"


def slo_met_cell(r: LevelSlo | None) -> str:
    """yes / no (the level met every target), ``~`` when that verdict is inside the noise."""
    if r is None or r.met is None:
        return MISSING
    return ("yes" if r.met else "no") + (" ~" if r.inside_noise else "")


def _x_header(levels: Sequence[LevelStats]) -> str:
    return "Rate (req/s)" if any(s.rate is not None for s in levels) else "C"


def _x_cell(s: LevelStats) -> str:
    """The level as the side tables name it: its rate for a rate level, else its concurrency."""
    return _rate_cell(s) if s.rate is not None else _c_cell(s)


def _rate_cell(s: LevelStats) -> str:
    if s.rate is None:
        return ""
    return f"{s.rate:g}" if s.repeat == 0 else f"{s.rate:g} r{s.repeat}"


def run_queue_cell(running: float | None, queued: float | None) -> str:
    """The server's running / queued gauges (their maxima) in one cell."""
    if running is None and queued is None:
        return MISSING
    return f"{fmt_count(running)} / {fmt_count(queued)}"


def _pct_cell(rate: float | None) -> str:
    return fmt_num(None if rate is None else rate * 100.0, 1)


# The cells that are not the figure's number rounded (analysis.figures: the value is an object).
_CELLS: dict[str, Callable[[LevelStats], str]] = {
    "rate": _rate_cell,
    "c": _c_cell,
    "accept_pos": positions_cell,
    "accept_hist": histogram_cell,
    "accept_along": along_cell,
    "slo_met": lambda s: slo_met_cell(s.slo),
    "srv_run_queue": lambda s: run_queue_cell(s.server_running_max, s.server_queued_max),
}


def figure_cell(f: Figure, s: LevelStats) -> str:
    """A figure's cell at a level: its number scaled and rounded to the table's digits."""
    cell = _CELLS.get(f.key)
    if cell is not None:
        return cell(s)
    v = f.number(s)
    return fmt_num(None if v is None else v * f.scale, f.digits)


def level_columns() -> list[Figure]:
    """The per-level table, in order: the figure table's report columns (docs/metrics.md defines each)."""
    return [f for f in figures.FIGURES if f.report]


COLUMNS = tuple(f.header for f in level_columns() if f.show == ALWAYS)  # the columns every table has


# ---------------------------------------------------------------- table


def _shown(levels: Sequence[LevelStats]) -> list[Figure]:
    return [f for f in level_columns() if f.shown(levels)]


def columns(levels: Sequence[LevelStats]) -> list[str]:
    """COLUMNS, then the optional columns some level has a value for."""
    return [f.header for f in _shown(levels)]


def render_levels(
    levels: Sequence[LevelStats],
    fmt: str = "github",
    view: TableView = WHOLE,
    replays: Callable[[], Mapping[int, TraceReplay]] = dict,
) -> str:
    """The per-level table; csv/json are for machines (json carries every LevelStats field unrounded,
    and a trace replay's level its ``trace``: ``replays``, called only for json, by level index).

    ``view``: the columns a terminal shows (default: all of them, as report.md has them); when it
    hides some, a line below the table names them."""
    cols = _shown(levels)
    rows = [[figure_cell(f, s) for f in cols] for s in levels]
    return render_view(
        [f.header for f in cols],
        [f.key for f in cols],
        rows,
        fmt,
        view,
        REPORT_MD,
        json_data=lambda: _levels_json(levels, replays()),
    )


def _levels_json(levels: Sequence[LevelStats], replays: Mapping[int, TraceReplay]) -> list[dict[str, Any]]:
    return [level_json(s) | trace_json(replays, s.index) for s in levels]


DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
_DIST_NAMES = (
    ("ttft", "TTFT"),
    ("tpot", "TPOT"),
    ("itl", "ITL"),
    ("e2e", "E2E"),
    ("ttft_sched", "TTFT from schedule"),
    ("e2e_sched", "E2E from schedule"),  # rate levels
)


def parse_percentiles(text: str) -> tuple[float, ...]:
    """``50,90,99.9`` -> (50.0, 90.0, 99.9); ValueError naming what is wrong (each must be one
    specload keeps: metrics.PERCENTILES)."""
    try:
        qs = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--percentiles: expected numbers like 50,90,99, got {text!r}") from None
    unknown = [q for q in qs if q not in PERCENTILES]
    if not qs or unknown:
        raise ValueError(
            f"--percentiles: each must be one of {', '.join(f'{q:g}' for q in PERCENTILES)}; got {text!r}"
        )
    return qs


def _few(n: int, q: float) -> bool:
    """Fewer than one value lies above the q-th percentile: it is (about) the maximum."""
    return n * (100.0 - q) / 100.0 < 1.0


def _dist_name(key: str, label: str, s: LevelStats) -> str:
    if key == "itl" and s.itl_unit:
        return f"ITL (per {s.itl_unit})" if s.itl_unit != "mixed" else "ITL (mixed units)"
    return label


def render_distributions(
    levels: Sequence[LevelStats], fmt: str = "github", percentiles: Sequence[float] = DEFAULT_PERCENTILES
) -> str | None:
    """Every latency's distribution per level (ms): n, mean, sd and the chosen percentiles. A
    percentile with less than one value above it is marked ``*`` (it is about the maximum)."""
    headers = [_x_header(levels), "Latency", "n", "Mean", "Sd", *(f"p{q:g}" for q in percentiles)]
    rows: list[list[str]] = []
    for s in levels:
        for key, label in _DIST_NAMES:
            d = s.dists.get(key)
            if d is None or d.n == 0:
                continue
            cells = [fmt_num(None if v is None else v * 1e3, 1) for v in (d.mean, d.std)]
            pcts = [fmt_num(d.p.get(q, 0.0) * 1e3, 1) + ("*" if _few(d.n, q) else "") for q in percentiles]
            rows.append([_x_cell(s), _dist_name(key, label, s), str(d.n), *cells, *pcts])
    if not rows:
        return None
    return render_table(headers, rows, fmt, align_right=False)


# The throughput table's columns (LevelStats fields): header, field, digits.
_THROUGHPUT = (
    ("Req/s", "req_s", 2),
    ("Output tok/s", "agg_tok_s", 1),
    ("Input tok/s", "input_tok_s", 1),
    ("Total tok/s", "total_tok_s", 1),
    ("Peak in flight", "peak_in_flight", 0),
    ("Mean conc", "mean_concurrency", 1),
)


def render_throughput(levels: Sequence[LevelStats], fmt: str = "github") -> str | None:
    headers = [_x_header(levels), *(h for h, _, _ in _THROUGHPUT)]
    rows = [
        [_x_cell(s), *(fmt_num(getattr(s, name), d) for _, name, d in _THROUGHPUT)] for s in levels if s.sent
    ]
    return render_table(headers, rows, fmt, align_right=False) if rows else None


def target_cell(r: TargetResult) -> str:
    """A target's statistic at a level: ``1.62 s``, ``6.37 s ✗`` over the threshold, ``~`` inside the noise."""
    if r.value_s is None:
        return MISSING
    text = "∞ (failures)" if r.value_s == float("inf") else fmt_duration(r.value_s)
    return text + ("" if r.met else " ✗") + (" ~" if r.inside_noise else "")


def render_slo(levels: Sequence[LevelStats], fmt: str = "github") -> str | None:
    """Per level: each target's statistic against its threshold, the verdict and the goodput."""
    judged = [s for s in levels if s.slo is not None]
    if not judged:
        return None
    slo = judged[0].slo.slo  # type: ignore[union-attr]
    headers = [
        _x_header(judged),
        *(f"{t.label} (<= {t.threshold_text})" for t in slo.targets),
        "Met",
        "Good",
        "Good %",
        "Goodput req/s",
        "Goodput tok/s",
    ]
    rows = []
    for s in judged:
        r = s.slo
        assert r is not None
        share = None if r.good_share is None else r.good_share * 100
        rows.append(
            [
                _x_cell(s),
                *(target_cell(t) for t in r.targets),
                slo_met_cell(r),
                f"{r.good}/{r.sent}",
                fmt_num(share, 1),
                fmt_num(r.goodput_req_s, 2),
                fmt_num(r.goodput_tok_s, 1),
            ]
        )
    return render_table(headers, rows, fmt, align_right=False)


def _slo_notes(levels: Sequence[LevelStats]) -> list[str]:
    notes: list[str] = []
    for s in levels:
        for t in s.slo.targets if s.slo is not None else ():
            if t.missing:
                notes.append(
                    f"{s.label}: {t.missing} OK request(s) had no {t.target.label.split()[0]} value; "
                    f"they count as over {t.target.text} (not good)"
                )
    return notes


def capacity_lines(run: Run) -> list[str]:
    """The capacity under the run's SLO (specload.analysis.capacity): the bracket, the noise, why it fails
    where it does, and the search that found it (capacity.json) when there was one."""
    cap = run.capacity()
    if cap is None:
        return []
    lines = [f"- {run.label} {describe_capacity(cap)}"]
    why = limit_reason(cap, run.limits_at(cap.hi))
    if why:
        lines.append(f"- {run.label} {why}")
    rec = run.capacity_record
    if rec is not None and rec.space is not None:
        sp = rec.space
        order = ", ".join(
            f"{fmt_x(sp.kind, p.get('x'))} {'met' if p.get('met') else 'failed'}" for p in rec.probes
        )
        lines.append(
            f"- search ({rec.status}): from {fmt_x(sp.kind, sp.start)} within {sp.minimum:g}..{sp.maximum:g}, "
            f"{len(rec.probes)} of at most {sp.max_probes} probes: {order}"
        )
    return lines


def _mixed(levels: Sequence[LevelStats]) -> list[tuple[LevelStats, MixStats]]:
    """The levels that have workload figures, each with them."""
    return [(s, s.mix) for s in levels if s.mix is not None]


def render_lengths(levels: Sequence[LevelStats], fmt: str = "github") -> str | None:
    """Each level's request lengths as sent and as the server counted them (mixstats.LENGTHS), shown
    when lengths asked for or answered varied or the run has classes or turns; None otherwise (a
    fixed-length run)."""
    shown = _mixed(levels)
    if not any(m.varied or m.answers_varied or m.classes or m.turns for _, m in shown):
        return None
    headers = [_x_header(levels), "Length", "n", "Mean", "p50", "p90", "Max"]
    rows = []
    for s, m in shown:
        for key, label in LENGTHS:
            d = m.lengths.get(key)
            if d is None or not d.n:
                continue
            stats = (fmt_num(d.mean, 1), fmt_num(d.p50, 1), fmt_num(d.p90, 1), fmt_num(d.max, 0))
            rows.append([_x_cell(s), label, str(d.n), *stats])
    return render_table(headers, rows, fmt, align_right=False) if rows else None


# The tables of a level's parts: (MixStats list, the part's column header, with an "all" row: the level).
PARTS = {
    "classes": ("Class", True),
    "turns": ("Turn", False),
    "categories": ("Category", True),
}


def _length_mean(s: LevelStats, key: str) -> str:
    d = s.mix.lengths.get(key) if s.mix is not None else None
    return fmt_num(d.mean if d is not None else None, 1)


def render_parts(levels: Sequence[LevelStats], kind: str, fmt: str = "github") -> str | None:
    """Per level, each of its parts of ``kind`` (PARTS: its classes, turns or prompt categories), then
    (classes, categories) the level itself as "all": the figure table's part columns, each part
    summarized as a level is (metrics.summarize); None when no level has such parts."""
    name, total = PARTS[kind]
    rows_of: list[tuple[LevelStats, str, float | None, LevelStats]] = []
    for s, m in _mixed(levels):
        parts: list[GroupStats] = getattr(m, kind)
        rows_of += [(s, str(g.key), g.share, g.stats) for g in parts]
        if total and parts:
            rows_of.append((s, "all", 1.0, s))
    if not rows_of:
        return None
    kept = (lambda f: f.category) if kind == "categories" else (lambda f: f.part)
    cols = [f for f in figures.FIGURES if kept(f) and f.shown([st for *_, st in rows_of])]
    headers = [_x_header(levels), name, "Share", "Input mean", "Output mean", *(f.header for f in cols)]
    rows = [
        [
            _x_cell(s),
            key,
            _pct_cell(share),
            _length_mean(st, "input_sent"),
            _length_mean(st, "output_received"),
            *(figure_cell(f, st) for f in cols),
        ]
        for s, key, share, st in rows_of
    ]
    return render_table(headers, rows, fmt, align_right=False)


def render_reasoning(levels: Sequence[LevelStats], fmt: str = "github") -> str | None:
    """Per level, its reasoning streams (analysis.reasoning); None when no level had any."""
    rows = [
        [
            _x_cell(s),
            str(r.requests),
            *(
                fmt_num(None if (v := getattr(r, name)) is None else v * scale, digits)
                for _, name, digits, scale in REASONING_COLUMNS
            ),
            "+".join(r.sources) or MISSING,
        ]
        for s in levels
        if (r := s.reasoning) is not None
    ]
    headers = [_x_header(levels), "Reasoning reqs", *(h for h, *_ in REASONING_COLUMNS), "Counted from"]
    return render_table(headers, rows, fmt, align_right=False) if rows else None


def render_repeats(levels: Sequence[LevelStats], fmt: str = "github") -> str | None:
    """Mean and spread per concurrency when some level ran more than once (--repeat); else None."""
    groups = [g for g in group_repeats(levels) if len(g.repeats) > 1]
    if not groups:
        return None
    headers = [
        _x_header(levels),
        "Repeats",
        "Agg tok/s mean",
        "Agg tok/s sd",
        "Per-req tok/s mean",
        "Per-req tok/s sd",
    ]
    rows = [
        [
            f"{g.x:g}",
            g.n,
            *(fmt_num(x, 1) for name in ("agg_tok_s", "per_req_tok_s") for x in (g.of(name), g.std(name))),
        ]
        for g in groups
    ]
    return render_table(headers, rows, fmt, align_right=False)


# ---------------------------------------------------------------- header and notes


def _utc(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _scenario_name(run: Run) -> str | None:
    name = sc.name if (sc := recorded_scenario(run.info)) else None
    if name:
        return str(name)
    path = run.info.scenario_file
    return Path(path).stem if path else None


def prompts_line(p: dict[str, Any]) -> str | None:
    """What prompts were made of (acceptance lengths depend on it), from run.json ``prompts``."""
    if not p:
        return None
    kind = "token ids" if p.get("kind") == "ids" else "text"
    size = f", {p['distinct_ids']} distinct ids" if p.get("distinct_ids") else ""
    added = f"; the server adds {p['overhead_tokens']} token(s) to each" if p.get("overhead_tokens") else ""
    exact = "" if p.get("exact", True) else " (lengths approximate: no tokenizer could be asked)"
    return f"{kind} from {p.get('origin')}{size}{added}{exact}"


def _header_lines(run: Run) -> list[str]:
    m = run.info
    lines = [f"# specload report: {run.label}", ""]
    if m.simulated:
        lines.append(
            "- **SIMULATED SERVER**: these figures measure the built-in simulator, not an inference server"
        )
    fields_ = [
        ("host", m.host),
        ("backend", m.backend),
        ("model", m.model),
        ("scenario", _scenario_name(run)),
        ("prompts", prompts_line(m.prompts)),
        ("method", method_label(m.prompts, m.scenario)),
        ("status", m.status),
        ("server", m.server.summary()),
        ("started", _utc(m.started_at)),
        ("run dir", str(run.run_dir)),
    ]
    lines += [f"- {k}: {v}" for k, v in fields_ if v]
    lines += [f"- NOTICE: {n}" for n in run.notices]
    return lines


def _level_notes(s: LevelStats) -> list[str]:
    notes: list[str] = []
    if s.token_note:
        notes.append(f"{s.label}: {s.token_note}")
    varied = s.mix is not None and s.mix.varied  # lengths from a distribution: no one length was requested
    if s.output_mismatch:
        asked = "the count each asked for" if varied else f"the {s.requested_output_tokens} requested"
        notes.append(
            f"{s.label}: {s.output_mismatch} of {s.sent} requests got an output token count different "
            f"from {asked}"
        )
    if s.prompt_mismatch:
        mean = fmt_num(s.prompt_tokens_mean, 1)
        asked = "the length each asked for" if varied else f"the {s.requested_prompt_tokens} requested"
        notes.append(
            f"{s.label}: {s.prompt_mismatch} of {s.sent} requests had a server-counted prompt length "
            f"different from {asked} (mean counted {mean})"
        )
    if not s.planned:
        notes.append(f"{s.label}: records found for a level {RUN_JSON} does not list")
    if s.late_note:
        notes.append(f"{s.label}: {s.late_note}")
    if s.drift is not None and s.drift.flagged:
        notes.append(
            f"{s.label}: the throughput drifted within the level, {s.drift.describe()}; its figures "
            "average two speeds"
        )
    return notes


def _level_meta_notes(run: Run) -> list[str]:
    """Levels run.json does not mark completed, with their budget vs what came back."""
    notes: list[str] = []
    for lv in run.info.levels:
        label = level_label(lv.concurrency, lv.repeat, lv.rate)
        if lv.lost:
            why = f" ({lv.note})" if lv.note else ""
            notes.append(
                f"{label}: {lv.lost} request(s) lost with a worker, no record can exist for them{why}"
            )
        if lv.refused or lv.outage_s:
            notes.append(
                f"{label}: the server was away (connection refused) for {lv.outage_s:.2f} s; "
                f"{lv.refused} measured request(s) refused, counted as failed, and the level "
                f"waited for it: repeat the level for figures without the outage"
            )
        if lv.status in (None, "completed"):
            continue
        known = (("budget", lv.budget), ("granted", lv.granted), ("received", lv.received))
        counts = ", ".join(f"{k} {v}" for k, v in known if v is not None)
        notes.append(f"{label}: level marked {lv.status} in {RUN_JSON}" + (f" ({counts})" if counts else ""))
    return notes


def asks_shared_prefix(scenario: Mapping[str, Any]) -> bool:
    """The scenario (run.json ``scenario``) makes prompts share a prefix: a shared prefix or a
    conversation (each turn repeats the ones before it), for the run or one of its classes."""
    parts = [scenario, *(c for c in scenario.get("classes") or () if isinstance(c, Mapping))]
    return any((p.get("shared_prefix_tokens") or 0) > 0 or (p.get("turns") or 1) > 1 for p in parts)


def unasked_prefix_notes(run: Run) -> list[str]:
    """Levels whose prompts the server's prefix cache served though the scenario shared no prefix:
    their prompts repeated (across levels, or within one), so their TTFT is a cached prefill's."""
    if asks_shared_prefix(run.info.scenario) or run.info.trace.get("block_size"):
        return []  # (a trace's hash_id blocks are shared prefixes: specload.present.traceview)
    hit = figures.BY_KEY["prefix_hit"]
    return [
        f"{s.label}: the server's prefix cache served {rate:.1%} of its prompt tokens "
        "though the scenario asked for no shared prefix: some prompts repeated, so its TTFT (and the "
        "throughput) is partly a cached prefill's, not a fresh one's"
        for s in run.levels
        if (rate := hit.number(s))
    ]


def _warmup_note(levels: Sequence[LevelStats]) -> list[str]:
    parts = [f"{s.label} {s.warmup}" for s in levels if s.warmup]
    return [f"warmup requests excluded from all figures: {', '.join(parts)}"] if parts else []


_NUMBER = re.compile(r"\d+")
MAX_REASONS = 20  # lines of the failure summary; the rest are counted in one line


def _shape(reason: str) -> str:
    return _NUMBER.sub("#", reason)


def _merged(variants: list[str]) -> str:
    """Reasons that differ only in their numbers, as one: a number they share is kept, one that
    differs is N, with its range ("after N of 1000 tokens (N 2-997)")."""
    if len(variants) == 1:
        return variants[0]
    numbers = [[int(x) for x in _NUMBER.findall(v)] for v in variants]
    parts = _NUMBER.split(variants[0])
    out, ranges = [parts[0]], list[str]()
    for i, rest in enumerate(parts[1:]):
        column = [ns[i] for ns in numbers]
        if min(column) == max(column):
            out.append(str(column[0]))
        else:
            name = "N" if not ranges else f"N{len(ranges) + 1}"
            out.append(name)
            ranges.append(f"{name} {min(column)}-{max(column)}")
        out.append(rest)
    return "".join(out) + f" ({', '.join(ranges)})"


def failure_summary(levels: Sequence[LevelStats]) -> list[str]:
    """Count per reason over the run, with the first level it appeared in. Reasons that differ only
    in a number (the tokens a cut stream had) are one line, and at most MAX_REASONS lines are
    shown: a run with thousands of cut streams must not bury the report."""
    totals: dict[str, int] = {}
    first: dict[str, str] = {}
    variants: dict[str, dict[str, None]] = {}
    for s in levels:
        for reason, n in s.reasons.items():
            key = _shape(reason)
            totals[key] = totals.get(key, 0) + n
            first.setdefault(key, s.label)
            variants.setdefault(key, {})[reason] = None
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    lines = [
        f"{n} x {shorten(_merged(list(variants[key])), REASON_WIDTH)} (first at {first[key]})"
        for key, n in ranked[:MAX_REASONS]
    ]
    if len(ranked) > MAX_REASONS:
        rest = ranked[MAX_REASONS:]
        lines.append(f"{sum(n for _, n in rest)} x {len(rest)} other reasons (records.jsonl has each)")
    return lines


def _notes(run: Run) -> list[str]:
    notes: list[str] = []
    if run.info.status not in (None, RUN_COMPLETED):
        notes.append(f"run status is {run.info.status}: the last levels may be partial")
    for s in run.levels:
        notes += _level_notes(s)
    notes += unasked_prefix_notes(run)  # (beside the TTFT they lower)
    notes += _level_meta_notes(run)
    notes += client_notes(run.info.levels)  # levels the load generator distorted, with the fix
    notes += run.max_running_notes()
    notes += run.sampling_notes()
    notes += _slo_notes(run.levels)
    notes += acceptance_notes(run.levels)  # each acceptance figure's source, and mismatches
    caveat = acceptance_caveat(run)  # beside the acceptance: random prompts overstate it
    notes += (
        [f"Accept len and speedup measured on {caveat} (SPEED-Bench); --prompts real sends real text"]
        if caveat
        else []
    )
    notes += figures.source_notes(run.levels)
    notes += run.crosscheck
    notes += _warmup_note(run.levels)
    notes += [
        f"{describe(c)}: its records' times are off by that much against the other workers'; "
        f"sync the clocks (chrony/NTP)"
        for c in run.info.clients
        if is_off(c)
    ]
    return notes


def _notes_block(run: Run) -> list[str]:
    lines: list[str] = []
    notes = _notes(run)
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    failures = failure_summary(run.levels)
    if failures:
        lines += ["", "## Failed and short requests", ""] + [f"- {f}" for f in failures]
    return lines


# ---------------------------------------------------------------- the report


def render_report(
    run: Run, fmt: str = "github", percentiles: Sequence[float] = DEFAULT_PERCENTILES, view: TableView = WHOLE
) -> str:
    """Header, table(s) and notes as one text (markdown when fmt is github).

    For csv and json only the per-level data, so that the output parses; the words are in
    ``side_text``. ``view``: the per-level table's columns, for a terminal (report.md has them all).
    """
    if is_document(fmt):
        return render_levels(run.levels, fmt, replays=lambda: run_trace_replays(run))
    lines = _header_lines(run) + ["", render_levels(run.levels, fmt, view)]
    lvs = run.levels
    sections: list[tuple[str, str | None]] = [  # (title, table or None: the section is left out)
        ("Repeats combined (sd: sample standard deviation across repeats)", render_repeats(lvs, fmt)),
        (
            "Latency distributions (ms, OK requests; * less than one value above: about the maximum)",
            render_distributions(lvs, fmt, percentiles),
        ),
        ("Throughput (per second of the level's wall time)", render_throughput(lvs, fmt)),
        (
            "Request lengths (tokens; sent: asked for, counted/received: the server's count)",
            render_lengths(lvs, fmt),
        ),
        (
            "Request classes (throughput over the level's wall time; all: the level)",
            render_parts(lvs, "classes", fmt),
        ),
        (
            "Acceptance (share of verify steps by draft tokens accepted; docs/metrics.md)",
            render_acceptance(lvs, fmt),
        ),
        ("Conversation turns (0: a conversation's first request)", render_parts(lvs, "turns", fmt)),
        (
            "Reasoning streams (OK requests that streamed reasoning; docs/metrics.md)",
            render_reasoning(lvs, fmt),
        ),
        (
            "Prompt categories (Tokens %: of the level's output tokens; all: the level)",
            render_parts(lvs, "categories", fmt),
        ),
    ]
    for title, table in sections:
        if table is not None:
            lines += ["", f"## {title}", "", table]
    if (replay := run_trace_replay(run)) is not None:  # (specload.present.traceview)
        lines += ["", "## Trace replay (the trace's own shape next to what was sent; docs/metrics.md)", ""]
        lines += trace_lines(replay, fmt)
    slo = render_slo(run.levels, fmt)
    if slo is not None and run.slo is not None:
        lines += [
            "",
            f"## SLO {run.slo.text} (Good: requests within every threshold; ✗ over it; ~ inside the "
            "noise; docs/metrics.md)",
            "",
            slo,
        ]
        lines += ["", "## Capacity under the SLO", "", *capacity_lines(run)]
    prediction = read_prediction(run.run_dir / PREDICTION_JSON)  # written by specload predict
    if prediction is not None:
        lines += ["", render_prediction(prediction, fmt).rstrip()]
    lines += _notes_block(run)
    return "\n".join(lines) + "\n"


def side_text(run: Run) -> str:
    """The header and notes, which csv/json reports print on stderr."""
    return "\n".join(_header_lines(run) + _notes_block(run))


def write_report_md(run: Run) -> Path:
    """Write the report (markdown) into the run directory as report.md; returns its path."""
    path = run.run_dir / REPORT_MD
    path.write_text(render_report(run, "github"))
    return path


def print_report(
    run: Run,
    fmt: str = "github",
    *,
    write_md: bool = True,
    out: TextIO | None = None,
    err: TextIO | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    view: TableView = WHOLE,
) -> Path | None:
    """Print the report as ``specload report`` does and (``write_md``) write report.md; returns its path.

    csv/json print only the data on ``out`` (so it parses) and the header and notes on ``err``.
    ``view``: the per-level table's columns on ``out``; report.md always has every column.
    Raises ValueError for an unknown format.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    if not is_known_format(fmt):
        raise ValueError(f"unknown format {fmt!r}")
    if is_page(fmt):  # the page file, then the usual text on the terminal
        from specload.present.htmlpage import write_report_page

        try:
            page = write_report_page(run, render_report(run, "github", percentiles))
            print(f"wrote {page}", file=err)
        except OSError as e:  # a read-only or full run directory (review 3a7af2e, L12), as for report.md
            print(
                f"specload report: could not write {run.run_dir / 'report.html'} ({e.strerror or e}); "
                "the report below is complete",
                file=err,
            )
        fmt = "github"
    text = render_report(run, fmt, percentiles, view)
    if fmt == "github" and view.width is not None and is_terminal(out):  # every table and line fitted to it
        text = fit_text(text, view.width, REPORT_MD)
    out.write(for_stream(text, out))
    if is_document(fmt):
        print(side_text(run), file=err)
    if not write_md:
        return None
    try:
        path = write_report_md(run)
    except OSError as e:  # a read-only or full run directory: the table above is the report
        print(
            f"specload report: could not write {run.run_dir / REPORT_MD} ({e.strerror or e}); "
            "the report above is complete (--no-write skips the file)",
            file=err,
        )
        return None
    print(f"wrote {path}", file=err)
    return path


# ---------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specload report", description="Per-level table of one run directory.")
    p.add_argument("run_dir", help="results/<label>-<timestamp>/ directory of a run")
    p.add_argument(
        "--format",
        default="github",
        help=format_help(),
    )
    p.add_argument(
        "--no-write",
        action="store_true",
        help=f"do not write {REPORT_MD} into the run directory",
    )
    p.add_argument(
        "--slo",
        default=None,
        help="judge the levels against this SLO (e.g. ttft_p99=2s,tpot_p50=50ms) "
        "instead of the one the run was made with; 'none' for none",
    )
    p.add_argument(
        "--plot",
        nargs="?",
        const="",
        default=None,
        metavar="PNG",
        help="also draw output tok/s over time per level (default: RUN_DIR/tok_s_over_time.png) and, "
        "beside it, every chart of the HTML report in charts.png",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=default_processes(),
        metavar="N",
        help="processes reading the run (1 or 2; default: 2 on a machine with 2 cores or more)",
    )
    p.add_argument(
        "--percentiles",
        default=",".join(f"{q:g}" for q in DEFAULT_PERCENTILES),
        help=f"percentiles shown for each latency, any of {','.join(f'{q:g}' for q in PERCENTILES)} "
        "(json always has them all)",
    )
    p.add_argument("--columns", default=None, metavar="SETS", help=columns_help())
    p.add_argument("--reread", action="store_true", help=REREAD_HELP)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Print the report; csv/json print only the data (so it parses), the notes go to stderr."""
    args = _parser().parse_args(argv)
    if not is_known_format(args.format):
        print(f"specload report: unknown format {args.format!r}", file=sys.stderr)
        return 2
    try:
        percentiles = parse_percentiles(args.percentiles)
        view = view_for(args.columns)
        slo = RUN_SLO if args.slo is None else (None if args.slo.lower() == "none" else parse_slo(args.slo))
        run = load_run(args.run_dir, slo, args.processes, args.reread, keep=not args.no_write)
    except SloError as e:
        print(f"specload report: --slo: {e}", file=sys.stderr)
        return 2
    except (NotARunDir, ValueError) as e:
        print(f"specload report: {e}", file=sys.stderr)
        return 2
    print_report(run, args.format, write_md=not args.no_write, percentiles=percentiles, view=view)
    if args.plot is not None:
        from specload.present.chartpng import CHARTS_PNG, plot_charts, plot_series
        from specload.present.htmlpage import report_charts

        target = args.plot or str(run.run_dir / SERIES_PNG)
        drawn = plot_series(
            run.levels,
            target,
            title=f"specload: {run.info.label or run.run_dir.name}, output tok/s over time",
            simulated=run.info.simulated,
        )
        if drawn is not None:
            print(f"wrote {drawn}", file=sys.stderr)

        grid = Path(target).with_name(CHARTS_PNG)  # every chart of the HTML report, one panel each
        keys = plot_charts(report_charts(run), grid, title=f"specload: {run.label}")
        if keys:
            print(f"wrote {grid} ({', '.join(keys)})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
