"""The per-level report of one run directory: ``specload report RUN_DIR``.

The run is read by specload.run (``load_run``), from the run directory alone, so a report can be
re-made at any time, on any machine, from what a run left behind. This module lays it out: the
per-level table in any --format, the header and the notes, report.md, and the command line. Code
that wants a report without argv calls ``render_report``, ``print_report`` or ``write_report``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from specload.clientcheck import client_notes
from specload.clocks import describe, is_off
from specload.metrics import PERCENTILES, LevelStats, group_repeats, level_json
from specload.output import EXTRA_FORMATS, fmt_num, is_known_format, render_table
from specload.records import level_label
from specload.run import NotARunDir, Run, default_processes, load_run
from specload.rundir import REPORT_MD, RUN_COMPLETED, RUN_JSON
from specload.text import shorten

REASON_WIDTH = 120
SERIES_PNG = "tok_s_over_time.png"

# When a column is shown.
ALWAYS = "always"
IF_VALUE = "if_value"  # some level has a value (None elsewhere)
IF_COUNTED = "if_counted"  # some level counted one (0 elsewhere)


def _c_cell(s: LevelStats) -> str:
    return str(s.concurrency) if s.repeat == 0 else f"{s.concurrency} r{s.repeat}"


@dataclass(frozen=True)
class Column:
    """One column of the per-level table: the LevelStats field it shows, rounded to ``digits``."""

    name: str
    attr: str
    digits: int = 0
    show: str = ALWAYS  # ALWAYS | IF_VALUE | IF_COUNTED
    cell_of: Callable[[LevelStats], str] | None = None  # a cell that is not just the rounded field

    def cell(self, s: LevelStats) -> str:
        if self.cell_of is not None:
            return self.cell_of(s)
        return fmt_num(getattr(s, self.attr), self.digits)

    def shown(self, levels: Sequence[LevelStats]) -> bool:
        if self.show == ALWAYS:
            return True
        values = [getattr(s, self.attr) for s in levels]
        return any(values) if self.show == IF_COUNTED else any(v is not None for v in values)


# The table, in order; docs/metrics.md defines every column.
LEVEL_COLUMNS: tuple[Column, ...] = (
    Column("C", "concurrency", cell_of=_c_cell),
    Column("Agg tok/s", "agg_tok_s", 1),
    Column("Per-req tok/s", "per_req_tok_s", 1),
    Column("Tokens", "output_tokens"),
    Column("Wall(s)", "wall_s", 1),
    Column("Ok", "ok"),
    Column("Fail", "failed"),
    Column("Short", "short"),
    Column("TTFT p50 (ms)", "ttft_p50_ms", 1),
    Column("TTFT p99 (ms)", "ttft_p99_ms", 1),
    Column("TPOT p50 (ms)", "tpot_p50_ms", 1),
    Column("TPOT p99 (ms)", "tpot_p99_ms", 1),
    Column("E2E p50 (s)", "e2e_p50_s", 2),
    Column("Steady tok/s", "steady_tok_s", 1),
    Column("Mean conc", "mean_concurrency", 1),
    Column("Req/s", "req_s", 2),
    Column("429", "rate_limited", 0, IF_COUNTED),
    Column("Accept len", "accept_length", 2, IF_VALUE),
    Column("Srv run max", "server_running_max", 0, IF_VALUE),
    Column("Srv run mean", "server_running_mean", 1, IF_VALUE),
    Column("Srv queue max", "server_queued_max", 0, IF_VALUE),
    Column("Srv queue mean", "server_queued_mean", 1, IF_VALUE),
)
COLUMNS = tuple(c.name for c in LEVEL_COLUMNS if c.show == ALWAYS)  # the columns every table has


# ---------------------------------------------------------------- table


def _shown(levels: Sequence[LevelStats]) -> list[Column]:
    return [c for c in LEVEL_COLUMNS if c.shown(levels)]


def columns(levels: Sequence[LevelStats]) -> list[str]:
    """COLUMNS, then the optional columns some level has a value for."""
    return [c.name for c in _shown(levels)]


def render_levels(levels: Sequence[LevelStats], fmt: str = "github") -> str:
    """The per-level table; csv/json are for machines (json carries every LevelStats field unrounded)."""
    cols = _shown(levels)
    rows = [[c.cell(s) for c in cols] for s in levels]
    return render_table([c.name for c in cols], rows, fmt, json_data=lambda: [level_json(s) for s in levels])


DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
_DIST_NAMES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"))


def parse_percentiles(text: str) -> tuple[float, ...]:
    """``50,90,99.9`` -> (50.0, 90.0, 99.9); ValueError naming what is wrong (each must be one
    specload keeps: metrics.PERCENTILES)."""
    try:
        qs = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--percentiles: expected numbers like 50,90,99, got {text!r}") from None
    unknown = [q for q in qs if q not in PERCENTILES]
    if not qs or unknown:
        raise ValueError(f"--percentiles: each must be one of {', '.join(f'{q:g}' for q in PERCENTILES)}; "
                         f"got {text!r}")  # fmt: skip
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
    headers = ["C", "Latency", "n", "Mean", "Sd", *(f"p{q:g}" for q in percentiles)]
    rows: list[list[str]] = []
    for s in levels:
        for key, label in _DIST_NAMES:
            d = s.dists.get(key)
            if d is None or d.n == 0:
                continue
            cells = [fmt_num(None if v is None else v * 1e3, 1) for v in (d.mean, d.std)]
            pcts = [fmt_num(d.p.get(q, 0.0) * 1e3, 1) + ("*" if _few(d.n, q) else "") for q in percentiles]
            rows.append([_c_cell(s), _dist_name(key, label, s), str(d.n), *cells, *pcts])
    if not rows:
        return None
    return render_table(headers, rows, fmt, align_right=False)


def render_throughput(levels: Sequence[LevelStats], fmt: str = "github") -> str | None:
    headers = ["C", "Req/s", "Output tok/s", "Input tok/s", "Total tok/s", "Peak in flight", "Mean conc"]
    rows = [
        [_c_cell(s), fmt_num(s.req_s, 2), fmt_num(s.agg_tok_s, 1), fmt_num(s.input_tok_s, 1),
         fmt_num(s.total_tok_s, 1), fmt_num(s.peak_in_flight, 0), fmt_num(s.mean_concurrency, 1)]
        for s in levels if s.sent
    ]  # fmt: skip
    return render_table(headers, rows, fmt, align_right=False) if rows else None


def render_repeats(levels: Sequence[LevelStats], fmt: str = "github") -> str | None:
    """Mean and spread per concurrency when some level ran more than once (--repeat); else None."""
    groups = [g for g in group_repeats(levels) if len(g.repeats) > 1]
    if not groups:
        return None
    headers = ["C", "Repeats", "Agg tok/s mean", "Agg tok/s sd", "Per-req tok/s mean", "Per-req tok/s sd"]
    rows = [
        [g.concurrency, g.n, fmt_num(g.agg_tok_s_mean, 1), fmt_num(g.agg_tok_s_std, 1),
         fmt_num(g.per_req_tok_s_mean, 1), fmt_num(g.per_req_tok_s_std, 1)]
        for g in groups
    ]  # fmt: skip
    return render_table(headers, rows, fmt, align_right=False)


# ---------------------------------------------------------------- header and notes


def _utc(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _scenario_name(run: Run) -> str | None:
    name = run.info.scenario.get("name")
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
    if s.output_mismatch:
        notes.append(
            f"{s.label}: {s.output_mismatch} of {s.sent} requests got an output token count different "
            f"from the {s.requested_output_tokens} requested"
        )
    if s.prompt_mismatch:
        mean = fmt_num(s.prompt_tokens_mean, 1)
        notes.append(
            f"{s.label}: {s.prompt_mismatch} of {s.sent} requests had a server-counted prompt length "
            f"different from the {s.requested_prompt_tokens} requested (mean counted {mean})"
        )
    if not s.planned:
        notes.append(f"{s.label}: records found for a level {RUN_JSON} does not list")
    return notes


def _level_meta_notes(run: Run) -> list[str]:
    """Levels run.json does not mark completed, with their budget vs what came back."""
    notes: list[str] = []
    for lv in run.info.levels:
        label = level_label(lv.concurrency, lv.repeat)
        if lv.lost:
            why = f" ({lv.note})" if lv.note else ""
            notes.append(f"{label}: {lv.lost} request(s) lost with a worker, no record can exist for them{why}")
        if lv.refused or lv.outage_s:
            notes.append(f"{label}: the server was away (connection refused) for {lv.outage_s:.2f} s; "
                         f"{lv.refused} measured request(s) refused, counted as failed, and the level "
                         f"waited for it: repeat the level for figures without the outage")  # fmt: skip
        if lv.status in (None, "completed"):
            continue
        known = (("budget", lv.budget), ("granted", lv.granted), ("received", lv.received))
        counts = ", ".join(f"{k} {v}" for k, v in known if v is not None)
        notes.append(f"{label}: level marked {lv.status} in {RUN_JSON}" + (f" ({counts})" if counts else ""))
    return notes


def _client_notes(run: Run) -> list[str]:
    """Levels whose figures the load generator distorted (run.json ``levels[i].client``), with the fix."""
    return client_notes(run.info.levels)


def _accept_note(levels: Sequence[LevelStats]) -> list[str]:
    sources = sorted({s.accept_length_source for s in levels if s.accept_length_source})
    names = {
        "meta_info": "SGLang's per-request meta_info (output tokens / spec_verify_ct)",
        "server_counters": "the server's spec_decode counters (1 + accepted / drafts over the level's window)",
    }
    return [f"Accept len from {' and '.join(names.get(x, x) for x in sources)}"] if sources else []


def _warmup_note(levels: Sequence[LevelStats]) -> list[str]:
    parts = [f"{s.label} {s.warmup}" for s in levels if s.warmup]
    return [f"warmup requests excluded from all figures: {', '.join(parts)}"] if parts else []


def failure_summary(levels: Sequence[LevelStats]) -> list[str]:
    """Count per (shortened) reason over the run, with the first level it appeared in."""
    totals: dict[str, int] = {}
    first: dict[str, str] = {}
    for s in levels:
        for reason, n in s.reasons.items():
            key = shorten(reason, REASON_WIDTH)
            totals[key] = totals.get(key, 0) + n
            first.setdefault(key, s.label)
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    return [f"{n} x {reason} (first at {first[reason]})" for reason, n in ranked]


def _notes(run: Run) -> list[str]:
    notes: list[str] = []
    if run.info.status not in (None, RUN_COMPLETED):
        notes.append(f"run status is {run.info.status}: the last levels may be partial")
    for s in run.levels:
        notes += _level_notes(s)
    notes += _level_meta_notes(run)
    notes += _client_notes(run)
    notes += run.max_running_notes()
    notes += _accept_note(run.levels)
    notes += run.crosscheck
    notes += _warmup_note(run.levels)
    notes += [f"{describe(c)}: its records' times are off by that much against the other workers'; "
              f"sync the clocks (chrony/NTP)" for c in run.info.clients if is_off(c)]  # fmt: skip
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


def render_report(run: Run, fmt: str = "github", percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> str:
    """Header, table(s) and notes as one text (markdown when fmt is github).

    For csv and json only the per-level data, so that the output parses; the words are in
    ``side_text``.
    """
    if fmt in EXTRA_FORMATS:
        return render_levels(run.levels, fmt)
    lines = _header_lines(run) + ["", render_levels(run.levels, fmt)]
    repeats = render_repeats(run.levels, fmt)
    if repeats is not None:
        lines += ["", "## Repeats combined (sd: sample standard deviation across repeats)", "", repeats]
    dists = render_distributions(run.levels, fmt, percentiles)
    if dists is not None:
        lines += ["", "## Latency distributions (ms, OK requests; * less than one value above: about the maximum)",
                  "", dists]  # fmt: skip
    throughput = render_throughput(run.levels, fmt)
    if throughput is not None:
        lines += ["", "## Throughput (per second of the level's wall time)", "", throughput]
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


def write_report(run_dir: str | Path) -> Path:
    """Read a run directory and write its report.md; raises NotARunDir when there is no run."""
    return write_report_md(load_run(run_dir))


def print_report(
    run: Run,
    fmt: str = "github",
    *,
    write_md: bool = True,
    out: TextIO | None = None,
    err: TextIO | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> Path | None:
    """Print the report as ``specload report`` does and (``write_md``) write report.md; returns its path.

    csv/json print only the data on ``out`` (so it parses) and the header and notes on ``err``.
    Raises ValueError for an unknown format.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    if not is_known_format(fmt):
        raise ValueError(f"unknown format {fmt!r}")
    out.write(render_report(run, fmt, percentiles))
    if fmt in EXTRA_FORMATS:
        print(side_text(run), file=err)
    if not write_md:
        return None
    path = write_report_md(run)
    print(f"wrote {path}", file=err)
    return path


# ---------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specload report", description="Per-level table of one run directory.")
    p.add_argument("run_dir", help="results/<label>-<timestamp>/ directory of a run")
    p.add_argument(
        "--format",
        default="github",
        help="github (default), plain, any other tabulate format, csv or json",
    )
    p.add_argument("--no-write", action="store_true", help=f"do not write {REPORT_MD} into the run directory")
    p.add_argument("--plot", nargs="?", const="", default=None, metavar="PNG",
                   help="also draw output tok/s over time per level (default: RUN_DIR/tok_s_over_time.png)")
    p.add_argument("--processes", type=int, default=default_processes(), metavar="N",
                   help="processes reading the run (1 or 2; default: 2 on a machine with 2 cores or more)")  # fmt: skip
    p.add_argument("--percentiles", default=",".join(f"{q:g}" for q in DEFAULT_PERCENTILES),
                   help=f"percentiles shown for each latency, any of {','.join(f'{q:g}' for q in PERCENTILES)} "
                        "(json always has them all)")  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Print the report; csv/json print only the data (so it parses), the notes go to stderr."""
    args = _parser().parse_args(argv)
    if not is_known_format(args.format):
        print(f"specload report: unknown format {args.format!r}", file=sys.stderr)
        return 2
    try:
        percentiles = parse_percentiles(args.percentiles)
        run = load_run(args.run_dir, args.processes)
    except (NotARunDir, ValueError) as e:
        print(f"specload report: {e}", file=sys.stderr)
        return 2
    print_report(run, args.format, write_md=not args.no_write, percentiles=percentiles)
    if args.plot is not None:
        from specload.plot import plot_series

        target = args.plot or str(run.run_dir / SERIES_PNG)
        drawn = plot_series(run.levels, target, title=f"specload: {run.info.label or run.run_dir.name}, output tok/s "
                            "over time", simulated=run.info.simulated)  # fmt: skip
        if drawn is not None:
            print(f"wrote {drawn}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
