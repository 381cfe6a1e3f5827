"""The columnar reading of a run (specload.analysis.columns) gives the figures the records give.

A generated run of ~50k records (several levels, warmup, failed/short requests, 429s, ITL
histograms, accept lengths, requests without content, a torn last line and a wrongly typed field)
is reported through ``load_run`` (columns read in one pass) and through ``summary_rows`` and ``summarize_rows`` over the
``RequestRecord`` objects; the two must agree exactly, and the counts and percentiles must agree with
sums and sorts done here over the records.
"""

from __future__ import annotations

import math
import random
import statistics
import weakref
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from specload.analysis import figures
from specload.analysis.columns import LevelColumns, _Reading, read_columns
from specload.analysis.metrics import (
    LevelStats,
    Timeline,
    summarize_rows,
    summary_rows,
    tok_s_series,
)
from specload.analysis.run import Run, load_run
from specload.core import histogram
from specload.core.records import (
    FAILED,
    OK,
    PHASE_MEASURE,
    PHASE_WARMUP,
    SHORT,
    SRC_META,
    RequestRecord,
    make_record,
    read_records,
)
from specload.core.rundir import RECORDS, LevelMeta, RunMeta, ServerInfo, read_run_meta, write_run_meta
from specload.core.stats import percentile
from tests.fixtures.by_records import levels_of_records

T0 = 1_764_475_200.0
N_PER_LEVEL = 12_500
LEVELS = (16, 64, 256, 200)  # the last is the same concurrency as no other, with repeat 1


def _records(rng: random.Random) -> list[dict]:
    out: list[dict] = []
    t = T0
    names = None
    for li, c in enumerate(LEVELS):
        users = [t + rng.uniform(0, 0.05) for _ in range(c)]
        for i in range(N_PER_LEVEL + 5):
            u = min(range(c), key=users.__getitem__) if c <= 16 else rng.randrange(c)
            t_send = users[u]
            phase = PHASE_WARMUP if i < 5 else PHASE_MEASURE
            x = rng.random()
            n = 200
            status, reason, http = OK, None, 200
            if x < 0.01:
                status, n, http = FAILED, 0, (429 if x < 0.004 else 500)
                reason = f"HTTP {http}"
            elif x < 0.02:
                status, reason, n = SHORT, "stream ended without terminator", rng.randrange(1, 200)
            ttft = rng.lognormvariate(-2.5, 0.5)
            tpot = rng.uniform(0.01, 0.03)
            t_first = None if n == 0 else t_send + ttft
            t_last = None if n == 0 else t_first + tpot * (n - 1)  # type: ignore[operator]
            t_end = (t_last or t_send + 0.01) + 0.001
            itl = None
            if n >= 2:
                b0 = histogram.bin_of(tpot)
                itl = [[b0 - 1, (n - 1) // 4], [b0, (n - 1) - (n - 1) // 4]]
                itl = [p for p in itl if p[1] > 0]
            rec = make_record(
                t_send=t_send,
                t_first=t_first,
                t_last=t_last,
                t_end=t_end,
                output_tokens=n,
                level=li,
                concurrency=c,
                phase=phase,
                seq=i,
                backend="sglang",
                status=status,
                reason=reason,
                http_status=http,
                output_tokens_source=SRC_META,
                prompt_tokens=None if x < 0.03 else 100 + (x < 0.05),
                requested_output_tokens=200,
                requested_prompt_tokens=100,
                chunks=n,
                itl_max_s=None,
                spec_verify_ct=n // 2 or None,
                worker=f"w{u % 3}",
                repeat=1 if li == 3 else 0,
                itl=itl,
                itl_unit="token" if itl else None,
                first_event_tokens=rng.choice((1, 1, 1, 3)) if n else None,
            )
            names = names or [f.name for f in fields(rec)]
            out.append({k: getattr(rec, k) for k in names})
            users[u] = t_end + rng.uniform(0, 0.003)
        t = max(users) + 1.0
    out.sort(key=lambda d: d["t_end"])
    return out


@pytest.fixture(scope="module")
def big_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("big")
    recs = _records(random.Random(7))
    recs[100]["chunks"] = "many"  # a required number of the wrong type: that record is skipped
    recs[200]["itl_max_s"] = "x"  # an optional one: the field is dropped
    lines = [orjson.dumps(r) for r in recs]
    (d / RECORDS).write_bytes(b"\n".join(lines) + b"\n" + lines[-1][:40])  # and a torn last line
    levels = [
        LevelMeta(index=i, concurrency=c, repeat=1 if i == 3 else 0, status="completed")
        for i, c in enumerate(LEVELS[:3])
    ]  # level 3 is not in run.json: an unplanned row
    write_run_meta(d, RunMeta(label="big", levels=levels, server=ServerInfo({"max_running_requests": 128})))
    return d


@pytest.fixture(scope="module")
def loaded(big_run: Path) -> tuple[list[RequestRecord], list[str], Run]:
    notes: list[str] = []
    return read_records(str(big_run / RECORDS), notes), notes, load_run(big_run)


def test_columns_equal_records_path(loaded: tuple[list[RequestRecord], list[str], Run]) -> None:
    records, notes, run = loaded
    assert run.notices == notes and len(notes) == 4
    expected = levels_of_records(records, run.info.levels, cap=128)
    assert [s.label for s in run.levels] == ["c016", "c064", "c256", "c200.r1"] and not run.levels[3].planned
    for got, want in zip(run.levels, expected, strict=True):
        assert asdict(got) == asdict(want)
    assert sum(s.sent for s in run.levels) == 4 * N_PER_LEVEL - 1


def _by_hand(records: list, index: int, c: int, repeat: int) -> dict:
    mine = [r for r in records if (r.level, r.concurrency, r.repeat) == (index, c, repeat)]
    measured = [r for r in mine if r.phase == PHASE_MEASURE]
    ok = [r for r in measured if r.status == OK]
    reasons: dict[str, int] = {}
    for r in measured:
        if r.status != OK:
            key = f"{r.status}: {r.reason or 'no reason given'}"
            reasons[key] = reasons.get(key, 0) + 1
    ttft = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    e2e = [r.e2e_s for r in ok]
    return {
        "warmup": sum(r.phase == PHASE_WARMUP for r in mine),
        "sent": len(measured),
        "ok": len(ok),
        "short": sum(r.status == SHORT for r in measured),
        "failed": sum(r.status == FAILED for r in measured),
        "rate_limited": sum(r.status == FAILED and r.http_status == 429 for r in measured),
        "output_tokens": sum(max(r.output_tokens, 0) for r in measured),
        "reasons": reasons,
        "prompt_mismatch": sum(r.prompt_tokens is not None and r.prompt_tokens != 100 for r in measured),
        "ttft_p50_ms": percentile(ttft, 50) * 1000.0,  # type: ignore[operator]
        "ttft_p99": percentile(ttft, 99),
        "tpot_sd": statistics.stdev(tpot),
        "e2e_mean": sum(e2e) / len(e2e),
        "e2e_p99": percentile(e2e, 99),
        "mean_concurrency": sum(r.e2e_s for r in measured),
        "wall": max(r.t_end for r in measured) - min(r.t_send for r in measured),
        "itl": histogram.merge(r.itl for r in ok),
    }


@pytest.mark.parametrize("level", range(4))
def test_exact_counts_and_percentiles(loaded: tuple[list[RequestRecord], list[str], Run], level: int) -> None:
    records, _, run = loaded
    s: LevelStats = run.levels[level]
    want = _by_hand(records, level, LEVELS[level], 1 if level == 3 else 0)
    got = {
        k: getattr(s, k)
        for k in (
            "warmup",
            "sent",
            "ok",
            "short",
            "failed",
            "rate_limited",
            "output_tokens",
            "reasons",
            "prompt_mismatch",
        )
    }
    assert got == {k: want[k] for k in got}
    assert s.failed > 0 and s.short > 0 and s.rate_limited > 0 and s.warmup == 5
    assert s.figure("ttft_p50") == want["ttft_p50_ms"]
    assert s.dists["ttft"].p[99.0] == want["ttft_p99"]
    assert s.dists["tpot"].std == pytest.approx(want["tpot_sd"], rel=1e-12)  # np.std(ddof=1)
    assert (
        s.dists["e2e"].mean == pytest.approx(want["e2e_mean"], rel=1e-12)
        and s.figure("e2e_p99") == want["e2e_p99"]
    )
    assert s.wall_s == want["wall"]
    assert s.mean_concurrency == pytest.approx(want["mean_concurrency"] / want["wall"], rel=1e-12)
    assert s.dists["itl"].n == histogram.count(want["itl"]) and s.dists["itl"].p[99.0] == histogram.quantile(
        want["itl"], 99
    )


def test_tok_s_series_is_the_bucket_sum(big_run: Path) -> None:
    """The series in one pass equals the sum per bucket over the requests (to float rounding)."""
    groups = read_columns(str(big_run / RECORDS))
    cols = next(iter(groups.values()))
    tl = Timeline.of_columns(cols)
    series = tok_s_series(tl)
    t_lo, t_hi = min(tl.t_send), max(tl.t_end)
    assert len(series) == math.ceil((t_hi - t_lo) / 1.0)
    for i in (0, 1, len(series) // 2, len(series) - 1):
        a, b = t_lo + i, min(t_hi, t_lo + i + 1)
        tokens = 0.0
        for t0, t1, n, k in zip(tl.t0, tl.t1, tl.tokens, tl.k, strict=True):
            inside = a <= t0 <= b
            if n <= 0:
                continue
            if t1 - t0 <= 0 or n == k:
                tokens += n * inside
                continue
            tokens += k * inside + (n - k) * max(0.0, min(b, t1) - max(a, t0)) / (t1 - t0)
        assert series[i] == pytest.approx(tokens / (b - a), rel=1e-9)
    assert sum(series[:-1]) + series[-1] * (t_hi - t_lo - (len(series) - 1)) == pytest.approx(
        float(np.maximum(cols.col("tokens"), 0).sum())
    )


def test_columns_are_small(big_run: Path) -> None:
    groups = read_columns(str(big_run / RECORDS))
    per_record = sum(c.nbytes() for c in groups.values()) / sum(c.sent for c in groups.values())
    assert per_record <= 130  # bytes (8 a number, 2 or 4 a label), against ~1 KB as RequestRecord objects
    assert isinstance(next(iter(groups.values())), LevelColumns)


def test_each_level_is_let_go_of_once_its_figures_are_made(
    big_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's peak memory is its reading's: while a level's figures are made, the levels before
    it are freed (they used to be held until the last, biggest level was done: +220 MB at 5M)."""
    rows = summary_rows(read_columns(str(big_run / RECORDS)), read_run_meta(big_run).levels)
    held = [weakref.ref(r.columns) for r in rows]
    seen: list[list[bool]] = []

    def compute(c: Any, mask: Any, server: Any) -> None:
        seen.append([bool(h()) for h in held])

    watch = figures.Figure.of("watch", "watch", "Watch", "", 0, compute=compute)
    monkeypatch.setattr(figures, "FIGURES", (*figures.FIGURES, watch))
    stats = summarize_rows(rows)
    assert [s.concurrency for s in stats] == list(LEVELS) and not rows
    assert seen == [[i >= j for i in range(len(held))] for j in range(len(held))]
    assert not any(h() for h in held)


def test_the_second_half_is_let_go_of_as_it_is_joined(big_run: Path) -> None:
    """The parts a forked reader sends are freed column by column as the halves are joined (they
    used to be held until the whole was made: +160 MB at 5M)."""
    path = str(big_run / RECORDS)
    data = (big_run / RECORDS).read_bytes()
    mid = data.index(b"\n", len(data) * 3 // 8) + 1  # inside level 1
    first, later = _Reading(), _Reading()
    lines = first.read(path, 0, mid)
    later.read(path, mid)
    both = first.groups.keys() & later.groups.keys()
    parts = [
        weakref.ref(chunk)
        for key in both
        for chunk in later.groups[key]._chunks["t_send"]
        if type(chunk) is not tuple
    ]
    first.merge(later, lines)
    whole = read_columns(path)
    for key, cols in first.groups.items():
        np.testing.assert_array_equal(cols.col("t_send"), whole[key].col("t_send"))  # (joined as read)
    assert parts and not any(p() for p in parts)


def test_histograms_of_many_bins_are_summed_in_bulk_too() -> None:
    from specload.analysis import columns as cols
    from specload.core import histogram

    many = b"[" + b",".join(b"[%d,1]" % b for b in range(200)) + b"]"  # past the table of usual sizes
    few = b"[[3,2],[5,1]]"
    counts = histogram.Counts()
    assert cols._add_flat(counts, [few, many])
    assert histogram.count(counts.hist()) == 3 + 200
    for bad in (b"[[3,2],[5]]", b"[[3,2],,[5,1]]", b"[[3,2][5,1]]", b"[" + b"[1,1]," * 5000 + b"[1,1]]"):
        assert not cols._add_flat(histogram.Counts(), [few, bad]), bad
