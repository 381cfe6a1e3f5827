"""One run directory read back: ``load_run(path) -> Run``, the one reader report and compare share.

Reads only the run directory (run.json, records.jsonl, server_samples.jsonl when the server's
/metrics were sampled, Locust's locust.json / locust_stats.csv), so a run can be re-read at any
time, on any machine, from what it left behind. Figures come from the records (specload.analysis.metrics);
Locust's counts are only cross-checked. Whatever is missing or unreadable becomes a notice, not an
error: an interrupted or crashed sweep must stay reportable.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specload.analysis import forked, savedfigures
from specload.analysis.cap import RunningCap, running_cap, sparse_sampling_notes
from specload.analysis.capacity import (
    CAPACITY_JSON,
    KIND_CONCURRENCY,
    KIND_RATE,
    Capacity,
    CapacityRecord,
    ServerLimits,
    capacity_of,
)
from specload.analysis.columns import GroupKey, LevelColumns, read_columns
from specload.analysis.metrics import LevelStats, ServerSample, summarize_rows, summary_rows
from specload.analysis.reconcile import reconcile
from specload.analysis.streamed import apply_streamed, read_streamed
from specload.core import safeopen
from specload.core.records import RequestRecord, level_label, read_records
from specload.core.rundir import (
    LOCUST_CSV,
    LOCUST_JSON,
    RECORDS,
    RUN_JSON,
    SERVER_SAMPLES,
    LevelMeta,
    RunMeta,
    read_jsonl,
)
from specload.core.slo import Slo, SloError, parse_slo
from specload.workload.recorded import recorded_scenario


class NotARunDir(Exception):
    """The directory holds neither run.json nor records.jsonl: nothing to report."""


@dataclass
class Run:
    """Everything a run directory says, with the per-level figures computed from its records."""

    run_dir: Path
    meta: dict[str, Any]  # run.json as read ({} when absent); typed code reads ``info``
    levels: list[LevelStats]
    crosscheck: list[str] = field(default_factory=list)  # record counts vs Locust's counts
    notices: list[str] = field(default_factory=list)  # what was missing or unreadable in run_dir
    samples: list[ServerSample] = field(default_factory=list)  # server_samples.jsonl ([] when absent)
    info: RunMeta = field(default_factory=RunMeta)  # run.json, typed (RunMeta() when absent)
    slo: Slo | None = None  # the SLO each level was judged against (LevelStats.slo); None: none
    capacity_record: CapacityRecord | None = None  # capacity.json of a capacity search (specload capacity)
    _records: list[RequestRecord] | None = field(default=None, repr=False, compare=False)

    @property
    def records(self) -> list[RequestRecord]:
        """Every record as an object, read from records.jsonl on first use ([] when absent).

        The figures never need it (they come from columns, see specload.analysis.columns): at ~1 KB a
        record it is for small runs, tests and tools that want to look at single requests.
        """
        if self._records is None:
            path = self.run_dir / RECORDS
            self._records = read_records(str(path)) if path.exists() else []
        return self._records

    @property
    def label(self) -> str:
        """run.json's label, else the directory's name (what a run is called in headers)."""
        return self.info.label or self.run_dir.resolve().name

    @property
    def cap(self) -> RunningCap | None:
        """The server's cap on running requests, declared or inferred from its gauges (specload.analysis.cap)."""
        return running_cap(self.info.server, self.samples)

    def max_running_notes(self) -> list[str]:
        """One note per concurrency above the server's max_running_requests (declared or inferred)."""
        cap = self.cap
        if cap is None:
            return []
        over = sorted({s.concurrency for s in self.levels if s.rate is None and s.concurrency > cap.value})
        return [
            f"C={c} exceeds the server's max_running_requests ({cap.value}{cap.how}): the excess requests queue"
            for c in over
        ]

    def sampling_notes(self) -> list[str]:
        """Levels whose server gauges were read less than half as often as asked (cap.sparse_sampling_notes)."""
        interval = sc.metrics_interval_s if (sc := recorded_scenario(self.info)) else None
        if self.info.server_metrics != "sampled" or not isinstance(interval, int | float):
            return []
        return sparse_sampling_notes(self.levels, float(interval))

    def capacity(self) -> Capacity | None:
        """The highest level that met the SLO, bracketed (specload.analysis.capacity.capacity_of); None without an SLO."""
        if self.slo is None:
            return None
        kind = KIND_RATE if any(s.rate is not None for s in self.levels) else KIND_CONCURRENCY
        return capacity_of([(s.x, s.slo) for s in self.levels], kind)

    def limits_at(self, x: float | None) -> ServerLimits:
        """What the server said about its limits (run.json ``server``), with its sampled queue and
        running gauges at the level ``x`` (a concurrency or a rate; the max over repeats): what
        explains a capacity."""
        srv = self.info.server
        at = [s for s in self.levels if x is not None and s.x == x]
        queued = [s.server_queued_max for s in at if s.server_queued_max is not None]
        running = [s.server_running_max for s in at if s.server_running_max is not None]
        kv = srv.get("max_total_num_tokens")
        return ServerLimits(
            max_running=srv.max_running,
            configured_max_running=srv.max_running_requests,
            speculative_algorithm=srv.speculative_algorithm,
            kv_tokens=kv if isinstance(kv, int) else None,
            queued_max=max(queued) if queued else None,
            running_max=max(running) if running else None,
        )


def _read_meta(run_dir: Path, notices: list[str]) -> dict[str, Any]:
    path = run_dir / RUN_JSON
    if not path.exists():
        notices.append(f"no {RUN_JSON}: figures come from {RECORDS} alone (no level plan, no run header)")
        return {}
    try:
        meta = json.loads(safeopen.read_bytes(path))
    except (OSError, ValueError) as e:
        notices.append(f"{RUN_JSON} unreadable ({e}); figures come from {RECORDS} alone")
        return {}
    return meta if isinstance(meta, dict) else {}


def _read_columns(
    run_dir: Path, notices: list[str], slo: Slo | None, processes: int
) -> dict[GroupKey, LevelColumns]:
    path = run_dir / RECORDS
    if not path.exists():
        notices.append(f"no {RECORDS}: every level shows zero requests")
        return {}
    try:
        return read_columns(str(path), notices, slo, processes)
    except safeopen.UnsafeFile as e:
        notices.append(f"{e}: every level shows zero requests")
        return {}


def default_processes() -> int:
    """2 where this process may run on two cores or more (and can fork), else 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return 2 if cores >= 2 and forked.available() else 1


def missed_sample_notes(missed: Sequence[dict[str, Any]], levels: Sequence[LevelMeta]) -> list[str]:
    """One note per level whose /metrics sampler missed samples (locust.sampler: a page too big or
    too slow), with how many and the first reason: its server figures rest on fewer samples."""
    by_level: dict[Any, list[str]] = {}
    for m in missed:
        by_level.setdefault(m.get("level"), []).append(str(m.get("missed")))
    names = {lm.index: level_label(lm.concurrency, lm.repeat, lm.rate) for lm in levels}
    return [
        f"{names.get(level, 'before the first level' if level is None else f'level {level}')}: the /metrics "
        f"sampler could not keep up: {len(whys)} sample(s) missed ({whys[0]}); the server figures of "
        "this level come from the samples it did take"
        for level, whys in by_level.items()
    ]


def read_server_samples(
    path: str | Path, notices: list[str] | None = None, missed: list[dict[str, Any]] | None = None
) -> list[ServerSample]:
    """server_samples.jsonl in time order; [] when absent or not a regular file (said in ``notices``).
    Torn or malformed lines are skipped; the sampler's ``missed`` lines (a sample not taken) go to
    ``missed``, not into the samples."""
    try:
        rows = list(read_jsonl(path))
    except safeopen.UnsafeFile as e:
        if notices is not None:
            notices.append(f"{e}: no server samples")
        return []
    except OSError:
        return []
    gaps = [r for r in rows if isinstance(r, dict) and "missed" in r]
    if missed is not None:
        missed += gaps
    if gaps:
        rows = [r for r in rows if not (isinstance(r, dict) and "missed" in r)]
    samples = [s for s in map(ServerSample.from_dict, rows) if s is not None]
    samples.sort(key=lambda x: x.t)
    return samples


REREAD_HELP = (
    f"decode records.jsonl even where {savedfigures.FIGURES_FILE} holds figures for it "
    "(they are used only while the run, the SLO and specload are unchanged)"
)


class _RunSlo:
    """load_run's default SLO: the one the run was made with (run.json ``scenario.slo``)."""


RUN_SLO = _RunSlo()


def run_slo(info: RunMeta, notices: list[str] | None = None) -> Slo | None:
    """The SLO in run.json's scenario (``--slo``), or None; an unreadable one is a notice."""
    text = sc.slo if (sc := recorded_scenario(info)) else None
    if not text:
        return None
    try:
        return parse_slo(str(text))
    except SloError as e:
        if notices is not None:
            notices.append(f"{RUN_JSON}: scenario.slo unreadable ({e}); no SLO figures")
        return None


def load_run(
    run_dir: str | Path,
    slo: Slo | _RunSlo | None = RUN_SLO,
    processes: int = 1,
    reread: bool = False,
    keep: bool = True,
) -> Run:
    """Everything report and compare need from one run directory; raises NotARunDir when there is nothing.

    ``slo``: judge every level against it (LevelStats.slo); by default the run's own (run.json), None: none.
    ``processes=2``: a forked child reads the second half of a big records.jsonl meanwhile (the same
    figures either way); only from a single-threaded process without an event loop (the report and
    compare commands), see specload.analysis.forked. A big ended run's figures are kept in
    figures.msgpack and used while their inputs are unchanged (specload.analysis.savedfigures);
    ``reread`` decodes the records anyway; ``keep=False`` writes nothing into the run directory.
    """
    d = Path(run_dir)
    if not (d / RUN_JSON).exists() and not (d / RECORDS).exists():
        raise NotARunDir(f"{d}: neither {RUN_JSON} nor {RECORDS} found; not a specload run directory")
    notices: list[str] = []
    meta = _read_meta(d, notices)
    info = RunMeta.from_json(meta)
    slo_notes: list[str] = []  # after the records' notes, where they always came
    chosen = run_slo(info, slo_notes) if isinstance(slo, _RunSlo) else slo
    missed: list[dict[str, Any]] = []
    samples = read_server_samples(d / SERVER_SAMPLES, notices, missed)
    key = savedfigures.key_of(d, chosen)
    saved = None if reread else savedfigures.load(d, key)
    if saved is not None:
        levels, read_notes = saved.levels, saved.notices
    else:
        read_notes = []
        rows = summary_rows(_read_columns(d, read_notes, chosen, processes), info.levels)
        cap = running_cap(info.server, samples)  # Run.cap: the steady window's D = min(C, cap)
        levels = summarize_rows(rows, samples, cap.value if cap else None, chosen)  # (takes the rows)
        if keep and savedfigures.worth_saving(d, info.status):
            savedfigures.save(d, key, levels, read_notes)
    apply_streamed(levels, read_streamed(d))  # tok/s over time from the streamed samples, where kept
    notices += read_notes
    notices += missed_sample_notes(missed, info.levels)
    notices += slo_notes
    notices += reconcile(info.levels, levels)
    return Run(
        d, meta, levels, crosscheck(d, levels), notices, samples, info, chosen, _read_capacity(d, notices)
    )


def _read_capacity(run_dir: Path, notices: list[str]) -> CapacityRecord | None:
    path = run_dir / CAPACITY_JSON
    if not path.exists():
        return None
    try:
        return CapacityRecord.from_json(json.loads(safeopen.read_bytes(path)))
    except (OSError, ValueError) as e:
        notices.append(f"{CAPACITY_JSON} unreadable ({e}); the capacity comes from the levels alone")
        return None


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
    for e in json.loads(safeopen.read_bytes(path)):
        _add_count(counts, str(e.get("method", "")), str(e.get("name", "")), int(e.get("num_requests", 0)))
    return counts


def _locust_csv_counts(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in csv.DictReader(io.StringIO(safeopen.read_text(path), newline="")):
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
