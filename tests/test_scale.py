"""The analysis at scale: the typed block reader reads what the record-by-record reader reads,
and the vectorised figures (tok/s series, in flight, steady window, SLO tallies) are what their
definitions give, computed here by hand one request at a time.

The file holds every oddity the reader tolerates (torn and blank lines, wrong types, nulls, floats
where counts are ints, bools, levels interleaved inside a block, malformed ITL pairs, old records
without the newer fields).
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from specload.analysis import columns
from specload.analysis.columns import LevelColumns, itl_qs, read_columns, slo_tally
from specload.analysis.metrics import Timeline, peak_in_flight, steady_window, tok_s_series
from specload.analysis.run import load_run
from specload.analysis.validity import Validity
from specload.core import histogram
from specload.core.records import (
    NULLABLE,
    OK,
    PHASE_MEASURE,
    SCHEMA_VERSION,
    SRC_CHUNKS,
    SRC_META,
    RequestRecord,
    make_record,
    read_records,
    record_line,
)
from specload.core.rundir import RECORDS, LevelMeta, RunMeta, ServerInfo, write_run_meta
from specload.core.slo import SloTally, parse_slo
from tests.fixtures.by_records import levels_of_records

T0 = 1_764_475_200.0


# ---------------------------------------------------------------- a file with every oddity


def odd_records(rng: random.Random, n_per_level: int = 700) -> list[dict[str, Any]]:
    names = [f.name for f in fields(RequestRecord)]
    recs: list[dict[str, Any]] = []
    t = T0
    more = random.Random(
        7
    )  # the rate/mix fields' own draws: ``rng``'s sequence (which records are spoiled) stays
    for li, c, rep in ((0, 4, 0), (1, 16, 0), (2, 16, 1), (3, 32, 0), (4, 8, 0), (5, 32, 0)):
        users = [t + rng.uniform(0, 0.05) for _ in range(c)]
        for i in range(n_per_level):
            u = rng.randrange(c)
            t_send = users[u]
            phase = (
                "warmup" if i < 4 or rng.random() < 0.01 else ("other" if rng.random() < 0.003 else "measure")
            )
            x = rng.random()
            n, status, reason, http = 100, OK, None, 200
            if x < 0.03:
                status, n, http = "failed", 0, (429 if x < 0.01 else 500)
                reason = None if x < 0.005 else f"HTTP {http}"
            elif x < 0.06:
                status, reason, n = "short", "stream ended without terminator", rng.randrange(0, 100)
            elif x < 0.065:
                status, reason = "weird", "odd"
            tpot = rng.uniform(0.01, 0.03)
            nocontent = n == 0 or x > 0.995
            t_first = None if nocontent else t_send + rng.lognormvariate(-2.5, 0.5)
            t_last = None if nocontent or 0.99 < x <= 0.995 else t_first + tpot * max(n - 1, 0)  # type: ignore[operator]
            t_end = (t_last or t_first or t_send + 0.01) + 0.001
            itl = None
            if n >= 2 and t_first is not None:
                b0 = histogram.bin_of(tpot)
                itl = sorted(
                    [b0 + rng.randrange(-3, 4), rng.randrange(1, 30)] for _ in range(rng.randrange(1, 6))
                )
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
                output_tokens_source=SRC_CHUNKS if rng.random() < 0.03 else SRC_META,
                prompt_tokens=None if x < 0.07 else 100 + (x < 0.1),
                requested_output_tokens=100,
                requested_prompt_tokens=100 if x < 0.9 else 120,
                chunks=n,
                itl_max_s=None,
                spec_verify_ct=rng.choice((None, 0, n // 2 or None)),
                worker=f"w{u % 3}",
                repeat=rep,
                itl=itl,
                itl_unit=("token" if li != 3 or x < 0.5 else "event") if itl else None,
                first_event_tokens=rng.choice((1, 1, 1, 3, 0, None)) if n else None,
                # levels 4 and 5 are rate levels (due times, a few missing) with classes, turns and a prefix cache
                t_sched=t_send - more.uniform(0, 0.02) if li >= 4 and more.random() < 0.95 else None,
                request_class=more.choice(("chat", "code", None)) if li >= 4 else None,
                turn=more.choice((0, 1, 2, None)) if li == 5 else None,
                cached_tokens=more.choice((None, 0, 64, 96)) if li >= 4 else None,
            )
            recs.append({k: getattr(rec, k) for k in names})
            users[u] = t_end + rng.uniform(0, 0.003)
        t = max(users) - 0.5  # the next level starts before this one's last records: interleaved
    recs.sort(key=lambda d: d["t_end"])
    return recs


def spoil(recs: list[dict[str, Any]], rng: random.Random, floats: bool) -> None:
    """Odd values in a few records of each kind the reader knows (``floats``: counts as floats too)."""
    measured_ok = [d for d in recs if d["phase"] == "measure" and d["status"] == OK and d["itl"]]
    picks = iter(rng.sample(measured_ok, 40))

    def pick(level: int | None = None) -> dict[str, Any]:
        d = next(picks)
        while level is not None and d["level"] != level:
            d = next(picks)
        return d

    if floats:
        pick()["output_tokens"] = 100.0
        pick()["prompt_tokens"] = 100.5
        pick()["spec_verify_ct"] = 7.5
    pick()["requested_output_tokens"] = 100.0
    d = pick()
    d["level"] = float(d["level"])  # a float level index: the same group as the int
    pick()["e2e_s"] = 0
    pick()["output_tokens"] = -1
    pick()["tpot_s"] = True  # a bool: not a number (optional: dropped)
    pick()["t_first"] = "soon"  # optional, dropped
    pick()["chunks"] = "many"  # required: the record is skipped
    pick()["output_tokens"] = False  # required: skipped
    pick()["t_end"] = None  # not null: skipped
    pick()["itl"] = "not a list"  # dropped
    pick()["itl"] = [[1, 2, 3], [5, 4]]  # a malformed pair, skipped
    pick()["itl"] = [["a", 1], [400, 2]]
    pick()["itl"] = [[5, 0], [6, -2], [7, 3]]
    pick()["itl"] = [[True, 2], [-3, 4], [5000, 1], [1, True]]
    pick()["itl"] = [[5, 2.0], [8, 1]]
    pick()["itl"] = [[4500, 3]]  # beyond the list of counts (a bin past ~1e32 s would crash centre())
    pick()["itl"] = []
    del pick()["worker"]  # a missing field: skipped
    d = pick()
    for name in ("itl", "itl_unit", "first_event_tokens"):  # an older record: those take their defaults
        del d[name]
    pick()["extra"] = 1
    pick(5)["t_sched"] = "due"  # optional, dropped


def write_odd_run(d: Path, seed: int, floats: bool = True) -> Path:
    rng = random.Random(seed)
    recs = odd_records(rng)
    spoil(recs, rng, floats)
    lines = [orjson.dumps(r) for r in recs]
    for at, line in (
        (50, b""),
        (80, b"   "),
        (120, lines[120] + b"\r"),
        (130, lines[130] + b"\x0c"),
        (140, b"[1, 2]"),
        (141, b"5"),
        (142, b'"x"'),
        (143, b"null"),
        (2000, lines[2000][:100]),
        (2500, b"{not json"),
        (3000, b'{"a":1},{"b":2}'),
        (3500, b'{"level": true}'),
    ):
        lines.insert(at, line)
    d.mkdir(parents=True, exist_ok=True)
    (d / RECORDS).write_bytes(b"\n".join(lines) + b"\n" + lines[-1][:40])  # and a torn last line
    levels = [
        LevelMeta(index=0, concurrency=4, status="completed"),
        LevelMeta(index=None, concurrency=16, status="completed"),
        LevelMeta(index=2, concurrency=16, repeat=1, status="completed"),
        LevelMeta(index=None, concurrency=32, status="completed"),
        LevelMeta(index=7, concurrency=64, status="pending"),
    ]
    write_run_meta(d, RunMeta(label="odd", levels=levels, server=ServerInfo({"max_running_requests": 24})))
    return d


@pytest.fixture(scope="module")
def odd_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_odd_run(tmp_path_factory.mktemp("odd"), 5)


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_odd_run(tmp_path_factory.mktemp("plain"), 6, floats=False)


def _same(a: Any, b: Any) -> None:
    """Equal, floats to the last bits (a sum in another order), ints and strings exactly."""
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-12, abs=1e-15)
    else:
        assert type(a) is type(b) and a == b


@pytest.mark.parametrize("which", ["odd", "plain"])
def test_the_typed_reader_reads_what_read_records_reads(which: str, odd_run: Path, plain_run: Path) -> None:
    """load_run (msgspec, a block at a time) gives the figures and notes of the report's own code over
    records.read_records (one dict at a time, every check): the same records were read."""
    d = odd_run if which == "odd" else plain_run
    notes: list[str] = []
    records = read_records(str(d / RECORDS), notes)
    usable = [r for r in records if None not in (r.level, r.t_send, r.t_end, r.e2e_s, r.output_tokens)]
    nulls = len(records) - len(usable)
    valid = Validity()  # the client's own rules, as load_run applies them (specload.analysis.validity)
    usable = valid.keep(usable)
    if (invalid := valid.note()) is not None:
        notes.append(invalid)
    run = load_run(d, slo=None)
    assert [n for n in run.notices if "without a usable" not in n] == [
        n for n in notes if "without a usable" not in n
    ]
    skipped = [n for n in run.notices if "without a usable" in n]
    assert (
        skipped
        and int(skipped[0].split(": ")[1].split()[0]) == int(notes[1].split(": ")[1].split()[0]) + nulls
    )
    # run.json levels without an index take their groups one after the other; the levels with an
    # index are compared figure for figure, the others by their counts
    want = levels_of_records(usable, run.info.levels, cap=24)
    for got, exp in zip(run.levels, want, strict=True):
        if got.index is not None:
            _same(asdict(got), asdict(exp))
        else:
            assert (got.sent, got.ok, got.output_tokens, got.reasons) == (
                exp.sent,
                exp.ok,
                exp.output_tokens,
                exp.reasons,
            )


def test_the_odd_file_has_what_it_should(odd_run: Path) -> None:
    notes: list[str] = []
    groups = read_columns(str(odd_run / RECORDS), notes)
    assert len(notes) >= 3 and any("unreadable line" in n for n in notes)
    assert any(c.is_label("status", "weird").any() for c in groups.values())
    assert any(c.labels["request_class"] != [None] for c in groups.values())


@pytest.mark.parametrize("chunk", [97, 4096])
def test_the_buffer_size_changes_nothing(odd_run: Path, monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    """Read through a reused buffer shorter than a line (it grows) or a few lines long: the same
    columns, the same notes, the same torn lines by number, as in megabyte chunks."""
    path = str(odd_run / RECORDS)
    want_notes: list[str] = []
    want = read_columns(path, want_notes)
    monkeypatch.setattr(columns, "_CHUNK_BYTES", chunk)
    reading = columns._Reading()
    assert reading.read(path) == len((odd_run / RECORDS).read_bytes().splitlines())
    notes: list[str] = []
    got = read_columns(path, notes)
    assert notes == want_notes and reading.torn and list(got) == list(want)
    for key, cols in got.items():
        for name in ("t_send", "t_end", "tokens", "prompt"):
            np.testing.assert_array_equal(cols.col(name), want[key].col(name))
        assert cols.labels == want[key].labels and cols.itl == want[key].itl


def test_records_written_without_their_nulls_read_as_with_them(tmp_path: Path) -> None:
    """A line leaves its null fields out (schema 4): the typed decoder, the record-by-record reading
    and the figures take each missing one as null, as from a line that wrote it (schema 3)."""
    recs = [r for r in odd_records(random.Random(12), 200) if r["level"] < 4]
    assert any(r[name] is None for r in recs for name in NULLABLE)
    full, slim = tmp_path / "full", tmp_path / "slim"
    for d, line in ((full, orjson.dumps), (slim, record_line)):
        d.mkdir()
        (d / RECORDS).write_bytes(b"\n".join(map(line, recs)) + b"\n")
    text = (slim / RECORDS).read_bytes()
    assert b"null" not in text and len(text) < 0.8 * (full / RECORDS).stat().st_size
    for r in recs:
        assert columns._DECODER.decode(record_line(r)) == columns._DECODER.decode(orjson.dumps(r))
        assert RequestRecord.from_dict(orjson.loads(record_line(r))) == RequestRecord.from_dict(r)
    notes_full: list[str] = []
    notes_slim: list[str] = []
    assert read_records(str(slim / RECORDS), notes_slim) == read_records(str(full / RECORDS), notes_full)
    assert notes_full == notes_slim == []
    a, b = load_run(full, slo=None), load_run(slim, slo=None)
    assert a.notices == b.notices
    for x, y in zip(a.levels, b.levels, strict=True):
        assert asdict(x) == asdict(y)


def test_records_without_the_newer_fields_read_as_version_1(tmp_path: Path) -> None:
    """Records written before the rate, workload and version fields existed take their defaults
    through the typed decoder (no record by record checks) and give the same figures."""
    newer = ("t_sched", "rate", "request_class", "turn", "conversation", "prefix_group", "cached_tokens", "v")
    newer += ("spec_drafted", "spec_accepted", "spec_hist", "spec_along", "spec_source")  # (schema 3)
    recs = [r for r in odd_records(random.Random(11), 200) if r["level"] < 4]
    now = tmp_path / "now"
    now.mkdir()
    (now / RECORDS).write_bytes(b"\n".join(map(orjson.dumps, recs)) + b"\n")
    assert all(r["v"] == SCHEMA_VERSION for r in recs)
    for r in recs:
        for name in newer:
            del r[name]
    old = tmp_path / "old"
    old.mkdir()
    (old / RECORDS).write_bytes(b"\n".join(map(orjson.dumps, recs)) + b"\n")
    decoded = columns._DECODER.decode(orjson.dumps(recs[0]))
    assert decoded.v == 1 and decoded.t_sched is None and bytes(decoded.itl)[:2] == b"[["
    assert RequestRecord.from_dict(recs[0]).v == 1
    a, b = load_run(now, slo=None), load_run(old, slo=None)
    assert a.notices == b.notices
    for x, y in zip(a.levels, b.levels, strict=True):
        assert asdict(x) == asdict(y)


def test_the_sample_run_reads_with_its_figures() -> None:
    run = load_run(Path(__file__).parent / "fixtures" / "sample_run")
    assert run.levels and all(s.sent for s in run.levels if s.status == "completed")


# ---------------------------------------------------------------- the SLO, one pass


def per_record_tallies(path: Path, slo_text: str) -> dict[Any, SloTally]:
    """The owner's way: every measured record, as parsed, added to its level's columns one at a time."""
    slo = parse_slo(slo_text)
    levels: dict[Any, LevelColumns] = {}
    usable = [
        r
        for r in read_records(str(path))
        if r.phase == PHASE_MEASURE and None not in (r.level, r.t_send, r.t_end, r.e2e_s, r.output_tokens)
    ]
    for r in Validity().keep(usable):  # the client's own rules, as the reading pass applies them
        levels.setdefault((r.level, r.concurrency, r.repeat), LevelColumns(itl_qs(slo))).add(r)
    return {k: slo_tally(c, slo) for k, c in levels.items()}


@pytest.mark.parametrize(
    "slo_text", ["ttft_p99=2s,tpot_p50=50ms", "itl_p90=20ms,e2e_mean=3s", "itl_mean=15ms"]
)
def test_slo_tallies_of_the_reading_pass_are_the_records_one_by_one(plain_run: Path, slo_text: str) -> None:
    slo = parse_slo(slo_text)
    groups = read_columns(str(plain_run / RECORDS), None, slo, 1)
    one_pass = {k: slo_tally(c, slo) for k, c in groups.items() if c.sent}
    by_record = per_record_tallies(plain_run / RECORDS, slo_text)
    assert list(one_pass) == list(by_record)
    for k, t in one_pass.items():
        assert t.values == by_record[k].values
        _same(asdict(t.result()), asdict(by_record[k].result()))


# ---------------------------------------------------------------- the vectorised figures by hand


def odd_timeline(rng: random.Random, n: int) -> Timeline:
    """Requests with every shape: no tokens, one event, zero spans, t0 on bucket edges, outside."""
    t_send, t_end, t0, t1, tokens, k = [], [], [], [], [], []
    for _ in range(n):
        s = T0 + rng.choice((rng.uniform(0, 20), float(rng.randrange(0, 20))))
        a = s + rng.choice((0.0, rng.uniform(0, 2), 1.0))
        b = a + rng.choice((0.0, rng.uniform(0, 5)))
        m = float(rng.choice((0, 1, 3, 50, rng.randrange(0, 200))))
        t_send.append(s)
        t0.append(a)
        t1.append(b)
        t_end.append(b + rng.choice((0.0, 0.01)))
        tokens.append(m)
        k.append(min(m, float(rng.choice((1, 1, 3)))))
    arr = lambda xs: np.array(xs, dtype=np.float64)  # noqa: E731
    return Timeline(arr(t_send), arr(t_end), arr(t0), arr(t1), arr(tokens), arr(k), np.ones(n, dtype=bool))


def hand_tokens(tl: Timeline, a: float, b: float) -> float:
    """Tokens inside [a, b]: the first event's at t0, the rest evenly over (t0, t1]."""
    total = 0.0
    for t0, t1, n, k in zip(tl.t0, tl.t1, tl.tokens, tl.k, strict=True):
        if n <= 0:
            continue
        inside = a <= t0 <= b
        if t1 - t0 <= 0 or n == k:
            total += n * inside
            continue
        total += k * inside + (n - k) * max(0.0, min(b, t1) - max(a, t0)) / (t1 - t0)
    return total


@pytest.mark.parametrize("seed", range(3))
def test_tok_s_series_is_the_tokens_of_each_bucket(seed: int) -> None:
    tl = odd_timeline(random.Random(seed), 400)
    series = tok_s_series(tl)
    t_lo, t_hi = float(tl.t_send.min()), float(tl.t_end.max())
    assert len(series) == math.ceil(t_hi - t_lo)
    for i, got in enumerate(series):
        a, b = t_lo + i, min(t_hi, t_lo + i + 1)
        assert got == pytest.approx(hand_tokens(tl, a, b) / (b - a), rel=1e-9, abs=1e-9)


def hand_peak(sends: list[float], ends: list[float]) -> int:
    """Walk every instant: ends at an instant before its sends (a hand-off is no overlap)."""
    events = sorted([(t, 0, -1) for t in ends] + [(t, 1, 1) for t in sends])
    n = peak = 0
    for _, _, d in events:
        n += d
        peak = max(peak, n)
    return peak


@pytest.mark.parametrize("seed", range(3))
def test_peak_in_flight_is_the_walk_over_every_instant(seed: int) -> None:
    tl = odd_timeline(random.Random(seed), 300)
    assert peak_in_flight(tl) == hand_peak(tl.t_send.tolist(), tl.t_end.tolist())
    two = Timeline(
        *(np.array(x, dtype=np.float64) for x in ([0, 1], [1, 2], [0, 1], [1, 2], [1, 1], [1, 1])),
        np.ones(2, dtype=bool),
    )
    assert peak_in_flight(two) == 1  # one ends as the next is sent


def hand_steady(tl: Timeline, d: int, max_dip_s: float) -> tuple[float, float] | None:
    """docs/metrics.md's steady window, one event at a time (send, first token, end at equal times)."""
    events = sorted(
        [(t, 0, 1, 0) for t in tl.t_send]
        + [(t, 1, 0, 1) for t, f in zip(tl.t0, tl.has_first, strict=True) if f]
        + [(t, 2, -1, -1 if f else 0) for t, f in zip(tl.t_end, tl.has_first, strict=True)]
    )
    flight = decoding = 0
    start = below = None
    for t, _, df, dd in events:
        flight += df
        decoding += dd
        if start is None:
            if decoding >= d:
                start = t
            continue
        if flight < d:
            below = t if below is None else below
        elif below is not None:
            if t - below > max_dip_s:
                return start, below
            below = None
    if start is None or below is None or below <= start:
        return None
    return start, below


@pytest.mark.parametrize("seed", range(4))
def test_steady_window_is_the_event_walk(seed: int) -> None:
    rng = random.Random(seed)
    found = 0
    for c in (1, 4, 16):
        t = T0
        users = [t + rng.uniform(0, 0.05) for _ in range(c)]
        sends, ends, firsts = [], [], []
        for _ in range(60 * c):
            u = rng.randrange(c)
            s = users[u]
            f = s + rng.uniform(0.01, 0.3)
            e = f + rng.uniform(0.1, 2.0)
            sends.append(s)
            firsts.append(f)
            ends.append(e)
            users[u] = e + rng.choice((0.0, 0.001, 0.8))
        arr = lambda xs: np.array(xs, dtype=np.float64)  # noqa: E731
        has = np.array([rng.random() > 0.05 for _ in sends])
        tl = Timeline(
            arr(sends),
            arr(ends),
            np.where(has, arr(firsts), arr(ends)),
            arr(ends),
            np.full(len(sends), 10.0),
            np.ones(len(sends)),
            has,
        )
        for d in (c, max(1, c // 2)):
            got = steady_window(tl, c, cap=d)
            assert got == hand_steady(tl, min(c, d), 0.5)
            found += got is not None
    assert found >= 3


# ---------------------------------------------------------------- ITL counts


def random_pairs(rng: random.Random) -> list[Any]:
    """A request's pairs: mostly well-formed, sometimes not in every way merge_into skips (as JSON
    gives them: a pair that is an object has string keys, and merge_into fails on it either way)."""
    pairs: list[Any] = [[rng.randrange(300, 340), rng.randrange(1, 50)] for _ in range(rng.randrange(1, 8))]
    if rng.random() < 0.1:
        pairs.append(
            rng.choice(
                [
                    [1, 2, 3],
                    [4],
                    ["a", 3],
                    [5, "b"],
                    [6, 0],
                    [7, -1],
                    [8, 2.5],
                    [9.0, 1],
                    [True, 3],
                    [2, True],
                    [-4, 2],
                    [5000, 1],
                    [70000, 2],
                    "ab",
                ]
            )
        )
    return pairs


@pytest.mark.parametrize("seed", range(4))
def test_counts_are_the_dict_merge(seed: int) -> None:
    rng = random.Random(seed)
    requests = [random_pairs(rng) for _ in range(3000)]
    counts = histogram.Counts()
    for i in range(0, len(requests), 37):  # batches, some with a malformed pair, some without
        counts.add(requests[i : i + 37])
    want = histogram.merge(requests)
    assert list(counts.hist().items()) == list(want.items())  # the same counts, the same key order
    assert [type(k) for k in counts.hist()] == [type(k) for k in want]  # True stays True, as in the dict
    one = histogram.Counts()
    for pairs in requests:
        one.add([pairs])
    assert list(one.hist().items()) == list(want.items())
    merged = histogram.Counts()
    merged.merge(counts)
    merged.merge(one)
    twice = histogram.merge(requests + requests)
    assert list(merged.hist().items()) == list(twice.items())


def test_counts_with_bool_and_float_counts_are_the_dict_merge() -> None:
    """A bin's first count is kept as it came (Counts.add): a lone True, a True then an int, a float."""
    for requests in (
        [[[2, True]], [[2, 3]], [[5, True]]],
        [[[2, True]]],
        [[[3, 2.5]], [[3, 1]]],
        [[[4, 1]], [[4, 0.5]]],
    ):
        counts = histogram.Counts()
        counts.add(requests)
        want = histogram.merge(requests)
        assert list(counts.hist().items()) == list(want.items())
        assert [type(c) for c in counts.hist().values()] == [type(c) for c in want.values()]


# ---------------------------------------------------------------- two processes


@pytest.mark.parametrize("dies", [False, True])
def test_two_processes_read_what_one_reads(
    odd_run: Path, monkeypatch: pytest.MonkeyPatch, dies: bool
) -> None:
    """A forked child reads the second half (the torn lines numbered across the split); one that
    dies costs time, not figures: its half is read here."""
    one = load_run(odd_run, slo=parse_slo("itl_p90=20ms,ttft_p99=1s"))
    monkeypatch.setattr(columns, "SPLIT_BYTES", 1000)
    assert columns._middle(str(odd_run / RECORDS)) is not None
    if dies:
        monkeypatch.setattr(columns, "_second_half", lambda *a: os._exit(3))
    two = load_run(odd_run, slo=parse_slo("itl_p90=20ms,ttft_p99=1s"), processes=2)
    assert two.notices == one.notices
    for a, b in zip(one.levels, two.levels, strict=True):
        _same(asdict(a), asdict(b))
