"""The per-level report of one run directory: ``specload report RUN_DIR``.

Reads only the run directory (run.json, records.jsonl, server_samples.jsonl when the server's
/metrics were sampled, Locust's locust.json / locust_stats.csv),
so a report can be re-made at any time, on any machine, from what a run left behind. Figures come
from the records (specload.metrics); Locust's counts are only cross-checked.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson
from tabulate import tabulate, tabulate_formats

from specload.metrics import LevelStats, ServerSample, group_repeats, summarize_run
from specload.records import RequestRecord, level_label, read_records

RUN_JSON = "run.json"
RECORDS = "records.jsonl"
SERVER_SAMPLES = "server_samples.jsonl"
LOCUST_JSON = "locust.json"
LOCUST_CSV = "locust_stats.csv"
REPORT_MD = "report.md"

COLUMNS = (
    "C",
    "Agg tok/s",
    "Per-req tok/s",
    "Tokens",
    "Wall(s)",
    "Ok",
    "Fail",
    "Short",
    "TTFT p50 (ms)",
    "TTFT p99 (ms)",
    "TPOT p50 (ms)",
    "TPOT p99 (ms)",
    "E2E p50 (s)",
    "Steady tok/s",
    "Mean conc",
)
# Shown after COLUMNS only when some level has a value: (column, LevelStats field, decimals).
OPTIONAL_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("429", "rate_limited", 0),
    ("Accept len", "accept_length", 2),
    ("Srv run max", "server_running_max", 0),
    ("Srv run mean", "server_running_mean", 1),
    ("Srv queue max", "server_queued_max", 0),
    ("Srv queue mean", "server_queued_mean", 1),
)
MISSING = "-"
REASON_WIDTH = 120
EXTRA_FORMATS = ("csv", "json")


@dataclass
class Run:
    run_dir: Path
    meta: dict[str, Any]  # run.json ({} when absent)
    records: list[RequestRecord]
    levels: list[LevelStats]
    crosscheck: list[str] = field(default_factory=list)  # record counts vs Locust's counts
    notices: list[str] = field(default_factory=list)  # what was missing or unreadable in run_dir
    samples: list[ServerSample] = field(default_factory=list)  # server_samples.jsonl ([] when absent)


class NotARunDir(Exception):
    """The directory holds neither run.json nor records.jsonl: nothing to report."""


# ---------------------------------------------------------------- loading


def _read_meta(run_dir: Path, notices: list[str]) -> dict[str, Any]:
    path = run_dir / RUN_JSON
    if not path.exists():
        notices.append(f"no {RUN_JSON}: figures come from {RECORDS} alone (no level plan, no run header)")
        return {}
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        notices.append(f"{RUN_JSON} unreadable ({e}); figures come from {RECORDS} alone")
        return {}
    return meta if isinstance(meta, dict) else {}


def _read_records(run_dir: Path, notices: list[str]) -> list[RequestRecord]:
    path = run_dir / RECORDS
    if not path.exists():
        notices.append(f"no {RECORDS}: every level shows zero requests")
        return []
    return read_records(str(path))


def read_server_samples(path: str | Path) -> list[ServerSample]:
    """server_samples.jsonl in time order; [] when absent. Torn or malformed lines are skipped."""
    out: list[ServerSample] = []
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; missing file is not an error
    except OSError:
        return out
    with f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                sample = ServerSample.from_dict(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue
            if sample is not None:
                out.append(sample)
    out.sort(key=lambda x: x.t)
    return out


def load_run(run_dir: str | Path) -> Run:
    """Everything the report needs from one run directory; raises NotARunDir when there is nothing."""
    d = Path(run_dir)
    if not (d / RUN_JSON).exists() and not (d / RECORDS).exists():
        raise NotARunDir(f"{d}: neither {RUN_JSON} nor {RECORDS} found; not a specload run directory")
    notices: list[str] = []
    meta = _read_meta(d, notices)
    records = _read_records(d, notices)
    samples = read_server_samples(d / SERVER_SAMPLES)
    levels = summarize_run(records, meta.get("levels") or [], samples)
    return Run(d, meta, records, levels, crosscheck(d, levels), notices, samples)


# ---------------------------------------------------------------- server configuration (run.json "server")


def _int_cap(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def max_running_requests(meta: dict[str, Any]) -> int | None:
    """The server's cap on requests decoded at once, from run.json ``server``; None when unknown.

    The effective value (SGLang lowers it for speculative decoding, e.g. to 48) wins over the
    configured one.
    """
    server = meta.get("server")
    if not isinstance(server, dict):
        return None
    effective = _int_cap(server.get("max_running_requests_effective"))
    return effective or _int_cap(server.get("max_running_requests"))


def server_summary(meta: dict[str, Any]) -> str | None:
    """The server's configuration in one line, from run.json ``server``; None if it says nothing.

    E.g. ``engine sglang, speculative_algorithm NEXTN, max_running_requests 48 (configured 64)``.
    """
    server = meta.get("server")
    if not isinstance(server, dict):
        return None
    parts: list[str] = []
    if "engine" in server:
        parts.append(f"engine {server['engine']}")
    if "speculative_algorithm" in server:
        parts.append(f"speculative_algorithm {server['speculative_algorithm'] or 'none'}")
    cap = max_running_requests(meta)
    if cap is not None:
        configured = _int_cap(server.get("max_running_requests"))
        parts.append(
            f"max_running_requests {cap}" + (f" (configured {configured})" if configured not in (None, cap) else "")
        )
    return ", ".join(parts) or None


def max_running_notes(meta: dict[str, Any], levels: Sequence[LevelStats]) -> list[str]:
    """One note per concurrency above the server's max_running_requests."""
    cap = max_running_requests(meta)
    if cap is None:
        return []
    over = sorted({s.concurrency for s in levels if s.concurrency > cap})
    return [f"C={c} exceeds the server's max_running_requests ({cap}): the excess requests queue" for c in over]


# ---------------------------------------------------------------- Locust cross-check


def _parse_row_name(name: str) -> tuple[str, bool] | None:
    """(level label, is_warmup) of a request row named per DESIGN-CONTRACTS, else None."""
    parts = name.split()
    if len(parts) == 2:
        return parts[0], False
    if len(parts) == 3 and parts[1] == "warmup":
        return parts[0], True
    return None


def _add_count(counts: dict[str, int], method: str, name: str, n: int) -> None:
    parsed = _parse_row_name(name) if method == "POST" else None
    if parsed is not None and not parsed[1]:
        counts[parsed[0]] = counts.get(parsed[0], 0) + n


def _locust_json_counts(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in json.loads(path.read_text()):
        _add_count(counts, str(e.get("method", "")), str(e.get("name", "")), int(e.get("num_requests", 0)))
    return counts


def _locust_csv_counts(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            _add_count(counts, row.get("Type", ""), row.get("Name", ""), int(row.get("Request Count") or 0))
    return counts


def _locust_counts(run_dir: Path, notes: list[str]) -> tuple[dict[str, int], str] | None:
    """Measured-request counts per level label from Locust's own files, preferring locust.json.

    locust.json is written once at shutdown from the final stats; locust_stats.csv is a periodic
    snapshot and may lag, so it is only the fallback.
    """
    for fname, reader in ((LOCUST_JSON, _locust_json_counts), (LOCUST_CSV, _locust_csv_counts)):
        path = run_dir / fname
        if not path.exists():
            continue
        try:
            return reader(path), fname
        except (OSError, ValueError, TypeError, AttributeError, KeyError) as e:
            notes.append(f"could not read {fname} ({e})")
    return None


def crosscheck(run_dir: Path, levels: Sequence[LevelStats]) -> list[str]:
    """Notes where records and Locust disagree on how many measured requests each level sent."""
    notes: list[str] = []
    found = _locust_counts(run_dir, notes)
    if found is None:
        notes.append(f"Locust cross-check skipped: no readable {LOCUST_JSON} or {LOCUST_CSV}")
        return notes
    counts, fname = found
    why = (
        "Locust's _stats.csv can miss the last second; records are authoritative"
        if fname == LOCUST_CSV
        else "records are authoritative"
    )
    labels = {s.label for s in levels}
    for s in levels:
        theirs = counts.get(s.label, 0)
        if theirs != s.sent:
            notes.append(f"{s.label}: records {s.sent} requests, Locust counted {theirs} ({why})")
    for label in sorted(set(counts) - labels):
        notes.append(f"{label}: Locust counted {counts[label]} requests, records have no such level ({why})")
    return notes


# ---------------------------------------------------------------- table


def _fmt(v: float | int | None, digits: int) -> str:
    return MISSING if v is None else f"{v:.{digits}f}"


def _c_cell(s: LevelStats) -> str:
    return str(s.concurrency) if s.repeat == 0 else f"{s.concurrency} r{s.repeat}"


def _optional(levels: Sequence[LevelStats]) -> list[tuple[str, str, int]]:
    return [col for col in OPTIONAL_COLUMNS if _shown(col[1], levels)]


def _shown(attr: str, levels: Sequence[LevelStats]) -> bool:
    """A count column appears when something was counted; a figure column when some level has one."""
    values = [getattr(s, attr) for s in levels]
    return any(values) if attr in _COUNT_COLUMNS else any(v is not None for v in values)


_COUNT_COLUMNS = frozenset({"rate_limited"})


def columns(levels: Sequence[LevelStats]) -> list[str]:
    """COLUMNS, then the optional columns some level has a value for."""
    return list(COLUMNS) + [name for name, _, _ in _optional(levels)]


def _row(s: LevelStats, optional: Sequence[tuple[str, str, int]] = ()) -> list[str]:
    return [
        _c_cell(s),
        _fmt(s.agg_tok_s, 1),
        _fmt(s.per_req_tok_s, 1),
        str(s.output_tokens),
        _fmt(s.wall_s, 1),
        str(s.ok),
        str(s.failed),
        str(s.short),
        _fmt(s.ttft_p50_ms, 1),
        _fmt(s.ttft_p99_ms, 1),
        _fmt(s.tpot_p50_ms, 1),
        _fmt(s.tpot_p99_ms, 1),
        _fmt(s.e2e_p50_s, 2),
        _fmt(s.steady_tok_s, 1),
        _fmt(s.mean_concurrency, 1),
    ] + [_fmt(getattr(s, attr), digits) for _, attr, digits in optional]


def _render_csv(levels: Sequence[LevelStats]) -> str:
    """CSV with the table's columns and rounding; missing values are empty cells, as CSV readers expect."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns(levels))
    optional = _optional(levels)
    for s in levels:
        w.writerow(["" if c == MISSING else c for c in _row(s, optional)])
    return buf.getvalue()


def _render_json(levels: Sequence[LevelStats]) -> str:
    return json.dumps([asdict(s) for s in levels], indent=2) + "\n"


def is_known_format(fmt: str) -> bool:
    return fmt in EXTRA_FORMATS or fmt in tabulate_formats


def render_levels(levels: Sequence[LevelStats], fmt: str = "github") -> str:
    """The per-level table; csv/json are for machines (json carries every LevelStats field unrounded)."""
    if fmt == "csv":
        return _render_csv(levels)
    if fmt == "json":
        return _render_json(levels)
    if fmt not in tabulate_formats:
        raise ValueError(f"unknown format {fmt!r}; use csv, json or one of: {', '.join(tabulate_formats)}")
    # Cells are pre-formatted strings so the rounding above is exactly what is printed.
    optional = _optional(levels)
    headers = columns(levels)
    return tabulate(
        [_row(s, optional) for s in levels],
        headers=headers,
        tablefmt=fmt,
        disable_numparse=True,
        colalign=["right"] * len(headers),
    )


# ---------------------------------------------------------------- header and notes


def _utc(ts: Any) -> str | None:
    if not isinstance(ts, (int, float)):
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _scenario_name(meta: dict[str, Any]) -> str | None:
    sc = meta.get("scenario")
    name = sc.get("name") if isinstance(sc, dict) else None
    if name:
        return str(name)
    path = meta.get("scenario_file")
    return Path(path).stem if path else None


def _header_lines(run: Run) -> list[str]:
    m = run.meta
    label = m.get("label") or run.run_dir.name
    lines = [f"# specload report: {label}", ""]
    if m.get("simulated"):
        lines.append(
            "- **SIMULATED SERVER**: these figures measure the built-in simulator, not an inference server"
        )
    fields_ = [
        ("host", m.get("host")),
        ("backend", m.get("backend")),
        ("model", m.get("model")),
        ("scenario", _scenario_name(m)),
        ("status", m.get("status")),
        ("server", server_summary(m)),
        ("started", _utc(m.get("started_at"))),
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
        mean = "-" if s.prompt_tokens_mean is None else f"{s.prompt_tokens_mean:.1f}"
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
    for m in run.meta.get("levels") or []:
        if "concurrency" not in m:
            continue
        label = level_label(int(m["concurrency"]), int(m.get("repeat", 0) or 0))
        if m.get("lost"):
            why = f" ({m['note']})" if m.get("note") else ""
            notes.append(f"{label}: {m['lost']} request(s) lost with a worker, no record can exist for them{why}")
        status = m.get("status")
        if status in (None, "completed"):
            continue
        counts = ", ".join(f"{k} {m[k]}" for k in ("budget", "granted", "received") if k in m)
        notes.append(f"{label}: level marked {status} in {RUN_JSON}" + (f" ({counts})" if counts else ""))
    return notes


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


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= REASON_WIDTH else text[: REASON_WIDTH - 3] + "..."


def failure_summary(levels: Sequence[LevelStats]) -> list[str]:
    """Count per (shortened) reason over the run, with the first level it appeared in."""
    totals: dict[str, int] = {}
    first: dict[str, str] = {}
    for s in levels:
        for reason, n in s.reasons.items():
            key = _shorten(reason)
            totals[key] = totals.get(key, 0) + n
            first.setdefault(key, s.label)
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    return [f"{n} x {reason} (first at {first[reason]})" for reason, n in ranked]


def _notes(run: Run) -> list[str]:
    notes: list[str] = []
    if run.meta.get("status") not in (None, "completed"):
        notes.append(f"run status is {run.meta.get('status')}: the last levels may be partial")
    for s in run.levels:
        notes += _level_notes(s)
    notes += _level_meta_notes(run)
    notes += max_running_notes(run.meta, run.levels)
    notes += _accept_note(run.levels)
    notes += run.crosscheck
    notes += _warmup_note(run.levels)
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


def render_repeats(levels: Sequence[LevelStats], fmt: str = "github") -> str | None:
    """Mean and spread per concurrency when some level ran more than once (--repeat); else None."""
    groups = [g for g in group_repeats(levels) if len(g.repeats) > 1]
    if not groups:
        return None
    headers = ["C", "Repeats", "Agg tok/s mean", "Agg tok/s sd", "Per-req tok/s mean", "Per-req tok/s sd"]
    rows = [
        [g.concurrency, g.n, _fmt(g.agg_tok_s_mean, 1), _fmt(g.agg_tok_s_std, 1),
         _fmt(g.per_req_tok_s_mean, 1), _fmt(g.per_req_tok_s_std, 1)]
        for g in groups
    ]  # fmt: skip
    return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)


def render_report(run: Run, fmt: str = "github") -> str:
    """Header, table(s) and notes as one text (markdown when fmt is github)."""
    lines = _header_lines(run) + ["", render_levels(run.levels, fmt)]
    repeats = render_repeats(run.levels, fmt)
    if repeats is not None:
        lines += ["", "## Repeats combined (sd: sample standard deviation across repeats)", "", repeats]
    lines += _notes_block(run)
    return "\n".join(lines) + "\n"


def write_report_md(run: Run) -> Path:
    path = run.run_dir / REPORT_MD
    path.write_text(render_report(run, "github"))
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
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Print the report; csv/json print only the data (so it parses), the notes go to stderr."""
    args = _parser().parse_args(argv)
    if not is_known_format(args.format):
        print(f"specload report: unknown format {args.format!r}", file=sys.stderr)
        return 2
    try:
        run = load_run(args.run_dir)
    except NotARunDir as e:
        print(f"specload report: {e}", file=sys.stderr)
        return 2
    if args.format in EXTRA_FORMATS:
        sys.stdout.write(render_levels(run.levels, args.format))
        side = _header_lines(run) + _notes_block(run)
        print("\n".join(side), file=sys.stderr)
    else:
        sys.stdout.write(render_report(run, args.format))
    if not args.no_write:
        print(f"wrote {write_report_md(run)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
