"""The fast analysis path gives exactly what the plain one gave: block reading, ITL counts, the
two-process read and summary, and the rewritten loops of the tok/s series and the steady window.

Each fast piece is checked against its plain definition, copied here as it was before the fast one
replaced it (one record at a time, one dict merge at a time, the generator with min/max): the
same values bit for bit, the same key orders, the same notes, on files holding every oddity the
reader tolerates (torn and blank lines, wrong types, nulls, floats where counts are ints, bools,
levels interleaved inside a block, malformed ITL pairs, old records without the ITL fields).
"""

from __future__ import annotations

import math
import os
import random
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import orjson
import pytest

from specload.analysis import columns, forked, metrics, run
from specload.analysis.columns import (
    _ALL_FIELDS,
    _NOT_NULL,
    _NUM_TYPES,
    _USED,
    GroupKey,
    LevelColumns,
    Timeline,
    _attrs_used,
    _get_not_null,
    _get_numbers,
    _get_used,
    read_columns,
)
from specload.core import histogram
from specload.core.records import (
    _NUMBERS,
    OK,
    PHASE_MEASURE,
    SRC_CHUNKS,
    SRC_META,
    RequestRecord,
    _checked,
    make_record,
    read_notes,
)
from specload.core.rundir import RECORDS, LevelMeta, RunMeta, ServerInfo, read_jsonl, write_run_meta
from specload.core.slo import Slo, SloTally, parse_slo

T0 = 1_764_475_200.0


# ---------------------------------------------------------------- the plain definitions


def plain_read(path: str, notes: list[str]) -> dict[Any, tuple[LevelColumns, list[Any]]]:
    """records.jsonl read one record at a time (the reader before the block one): each group's
    columns from ``LevelColumns.add``, and the ``itl`` of its OK measured records with pairs."""
    groups: dict[Any, tuple[LevelColumns, list[Any]]] = {}
    torn: list[int] = []
    bad_records = 0
    first_bad: str | None = None
    bad_fields: dict[str, int] = {}
    for d in read_jsonl(path, torn):
        if (
            type(d) is dict
            and d.keys() >= _ALL_FIELDS
            and _NUM_TYPES.issuperset(map(type, _get_numbers(d)))
            and None not in _get_not_null(d)
            and (d["itl"] is None or type(d["itl"]) is list)
        ):
            vals = _get_used(d)
        else:
            rec = _checked(d, bad_fields)
            if rec is None or any(getattr(rec, name) is None for name in _NOT_NULL):
                bad_records += 1
                if first_bad is None:
                    first_bad = str(d)[:80]
                continue
            vals = _attrs_used(rec)
        key = vals[:3]
        if key not in groups:
            groups[key] = (LevelColumns(), [])
        cols, itls = groups[key]
        cols.add(*vals[3:])
        phase, status, itl = vals[3], vals[4], vals[_USED.index("itl")]
        if phase == "measure" and status == OK and itl:
            itls.append(itl)
    read_notes(notes, len(torn), torn, bad_records, first_bad, bad_fields)
    return groups


# The SLO's tallies one record at a time (the second pass report made before the reading pass
# took them): the definition the one-pass tallies are compared with.
_SLO_FIELDS = frozenset(RequestRecord.__dataclass_fields__)
_SLO_NUMERIC = tuple(_NUMBERS)
_SLO_NOT_NULL = ("level", "concurrency", "repeat", "t_send", "t_end", "e2e_s", "output_tokens")
_SLO_NUM_TYPES = (int, float, type(None))


def read_slo_tallies(path: str | Path, slo: Slo) -> dict[GroupKey, SloTally]:
    """records.jsonl's measured requests judged against ``slo``, per (level, concurrency, repeat).

    A pass over the file record by record: the definition. ``load_run`` gets the same tallies from
    its one block-reading pass (columns.read_columns_and_tallies, ``SloTally.add_block``); this
    one is what tests compare that with. The same records count as in the columns
    (columns.read_columns' acceptance rule).
    """
    tallies: dict[GroupKey, SloTally] = {}
    for d in read_jsonl(path):
        if not (
            type(d) is dict
            and d.keys() >= _SLO_FIELDS
            and all(type(d[k]) in _SLO_NUM_TYPES for k in _SLO_NUMERIC)
            and all(d[k] is not None for k in _SLO_NOT_NULL)
            and (d["itl"] is None or type(d["itl"]) is list)
        ):
            rec = _checked(d, {})  # the slow path: read_records' checks, then the columns'
            if rec is None or any(getattr(rec, k) is None for k in _SLO_NOT_NULL):
                continue
            d = {k: getattr(rec, k) for k in _SLO_FIELDS}
        if d["phase"] != PHASE_MEASURE:
            continue
        key = (d["level"], d["concurrency"], d["repeat"])
        tally = tallies.get(key)
        if tally is None:
            tally = tallies[key] = SloTally(slo)
        ok = d["status"] == OK
        tally.add(
            d["status"],
            d["t_send"],
            d["t_end"],
            d["output_tokens"],
            d["ttft_s"],
            d["tpot_s"],
            d["e2e_s"],
            d["itl"] if ok else None,
        )
    return tallies


def plain_tok_s_series(tl: Timeline, bucket_s: float = 1.0) -> list[float]:
    """metrics.tok_s_series as it was written first (min/max calls, a bucket function)."""
    if not len(tl):
        return []
    t_lo, t_hi = min(tl.t_send), max(tl.t_end)
    edges: list[float] = []
    ends_: list[float] = []
    for i in range(max(1, math.ceil((t_hi - t_lo) / bucket_s))):
        a, b = t_lo + i * bucket_s, min(t_hi, t_lo + (i + 1) * bucket_s)
        if b <= a:
            break
        edges.append(a)
        ends_.append(b)
    nb = len(edges)
    if not nb:
        return []
    last = nb - 1
    tokens = [0.0] * nb
    rate_diff = [0.0] * (nb + 1)

    def bucket(t: float) -> int:
        i = int((t - t_lo) // bucket_s)
        return 0 if i < 0 else (last if i > last else i)

    for t0, t1, n, k in zip(tl.t0, tl.t1, tl.tokens, tl.k, strict=True):
        if n <= 0:
            continue
        span = t1 - t0
        mass = n if span <= 0 or n == k else k
        if t_lo <= t0 <= t_hi:
            i = bucket(t0)
            tokens[i] += mass
            if i and t0 == edges[i]:
                tokens[i - 1] += mass
        if mass == n:
            continue
        rate = (n - k) / span
        u, v = max(t0, t_lo), min(t1, t_hi)
        if v <= u:
            continue
        iu, iv = bucket(u), bucket(v)
        if iu == iv:
            tokens[iu] += rate * (v - u)
            continue
        tokens[iu] += rate * (ends_[iu] - u)
        tokens[iv] += rate * (v - edges[iv])
        rate_diff[iu + 1] += rate
        rate_diff[iv] -= rate
    out = []
    running = 0.0
    for i in range(nb):
        running += rate_diff[i]
        width = ends_[i] - edges[i]
        out.append((tokens[i] + running * width) / width)
    return out


def plain_window_tokens(tl: Timeline, a: float, b: float) -> Iterator[float]:
    for t0, t1, n, k in zip(tl.t0, tl.t1, tl.tokens, tl.k, strict=True):
        if n <= 0:
            yield 0.0
            continue
        inside = a <= t0 <= b
        span = t1 - t0
        if span <= 0 or n == k:
            yield n * (1.0 if inside else 0.0)
            continue
        overlap = max(0.0, min(b, t1) - max(a, t0))
        yield (float(k) if inside else 0.0) + (n - k) * overlap / span


# ---------------------------------------------------------------- comparing columns exactly


def exact(v: Any) -> Any:
    """A value with its type and every bit: arrays as bytes, floats as hex, dicts as ordered items."""
    if isinstance(v, array):
        return ("array", v.typecode, v.tobytes())
    if isinstance(v, dict):
        return ("dict", [(exact(k), exact(x)) for k, x in v.items()])
    if isinstance(v, set):
        return ("set", sorted(map(repr, v)))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [exact(x) for x in v])
    if isinstance(v, float):
        return ("float", v.hex())
    return (type(v).__name__, repr(v))


def snapshot(cols: LevelColumns) -> dict[str, Any]:
    out = {
        name: exact(getattr(cols, name))
        for name in LevelColumns.__slots__
        if name not in ("timeline", "itl_counts", "groups")
    }
    # a class's and a turn's columns (their order carries nothing: mixstats sorts them)
    out["groups"] = sorted((exact(key), snapshot(group)) for key, group in cols.groups.items())
    out["itl"] = exact(cols.itl)
    out.update({f"timeline.{name}": exact(getattr(cols.timeline, name)) for name in Timeline.__slots__})
    return out


def assert_same_reading(path: Path, **kwargs: Any) -> dict[Any, LevelColumns]:
    want_notes: list[str] = []
    want = plain_read(str(path), want_notes)
    notes: list[str] = []
    got = read_columns(str(path), notes, **kwargs)
    assert notes == want_notes
    assert [exact(k) for k in got] == [exact(k) for k in want]
    for key, (cols, itls) in want.items():
        mine = snapshot(got[key])
        theirs = snapshot(cols)
        theirs["itl"] = exact(histogram.merge(itls))  # the definition: one dict merge per request
        assert mine == theirs, key
    return got


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
    """The same odd lines, but no count is a float: the two-process read merges its halves."""
    return write_odd_run(tmp_path_factory.mktemp("plain"), 6, floats=False)


# ---------------------------------------------------------------- the reader


@pytest.mark.parametrize("block", [1, 7, 128])
def test_block_reading_is_the_record_by_record_reading(
    odd_run: Path, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(columns, "BLOCK_LINES", block)  # blocks that end anywhere, mid-level included
    got = assert_same_reading(odd_run / RECORDS)
    assert len(got) == 6


def test_the_odd_file_has_what_it_should(odd_run: Path) -> None:
    notes: list[str] = []
    groups = read_columns(str(odd_run / RECORDS), notes)
    assert any("unreadable line(s) skipped" in n for n in notes)
    assert any("without a usable required field" in n for n in notes)
    assert any("field 'tpot_s' not a number" in n for n in notes)
    assert any(type(c.output_tokens) is float for c in groups.values())  # a float count: float sums
    assert any(c.rate_limited for c in groups.values()) and any(
        c.itl_units == {"token", "event"} for c in groups.values()
    )
    assert any(type(k) is bool for c in groups.values() for k in c.itl)  # merge_into keeps a True bin as True


def one_level_run(d: Path, float_at: int | None) -> Path:
    """One level's 600 records (a float output count at ``float_at``): both halves hold it."""
    recs = [r for r in odd_records(random.Random(9), 700) if r["level"] == 3][:600]
    if float_at is not None:
        ok = [r for r in recs if r["status"] == OK and r["phase"] == "measure"]
        ok[float_at]["output_tokens"] = float(ok[float_at]["output_tokens"])
    d.mkdir(parents=True, exist_ok=True)
    (d / RECORDS).write_bytes(b"\n".join(map(orjson.dumps, recs)) + b"\n")
    return d


def split_and_watch(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Any file read by two processes; what each merge of the child's half said (True: merged)."""
    monkeypatch.setattr(columns, "SPLIT_BYTES", 1000)
    merged: list[bool] = []
    real_receive = columns._Reading.receive

    def receive(self: columns._Reading, *args: Any) -> bool:
        merged.append(real_receive(self, *args))
        return merged[-1]

    monkeypatch.setattr(columns._Reading, "receive", receive)
    return merged


@pytest.mark.parametrize("which", ["odd", "plain", "float in the first half", "float in the second half"])
def test_two_processes_read_what_one_reads(
    which: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forked child reads the second half: its columns follow the first half's exactly. A level
    with a float count on either side cannot be added that way (a float sum depends on where its
    additions start): then this process reads the second half itself."""
    if which in ("odd", "plain"):
        path: Path = request.getfixturevalue(f"{which}_run") / RECORDS
    else:
        path = one_level_run(tmp_path, 20 if "first" in which else -20) / RECORDS
    merged = split_and_watch(monkeypatch)
    assert_same_reading(path, processes=2)
    assert len(merged) == 1 and merged[0] == (which in ("odd", "plain"))


def test_a_child_that_dies_mid_stream_costs_time_not_figures(
    plain_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Half its arrays sent, the child dies: this process reads the whole file itself, from scratch."""
    real_send = columns._send

    def send(reading: columns._Reading, f: Any) -> None:
        class Half:
            def __init__(self) -> None:
                self.left = 3

            def write(self, data: Any) -> None:
                if self.left == 0:
                    f.flush()
                    os._exit(3)
                self.left -= 1
                f.write(data)

        real_send(reading, Half())  # type: ignore[arg-type]

    monkeypatch.setattr(columns, "_send", send)
    monkeypatch.setattr(columns, "SPLIT_BYTES", 1000)
    assert_same_reading(plain_run / RECORDS, processes=2)


def test_torn_lines_are_numbered_across_the_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    lines = [orjson.dumps(r) for r in odd_records(rng, 300)]
    for at in (5, len(lines) // 2 + 3, len(lines) - 10):
        lines[at] = lines[at][:50]
    (tmp_path / RECORDS).write_bytes(b"\n".join(lines) + b"\n")
    monkeypatch.setattr(columns, "SPLIT_BYTES", 1000)
    notes: list[str] = []
    read_columns(str(tmp_path / RECORDS), notes, processes=2)
    n = len(lines)
    assert notes[0].startswith(f"records.jsonl: 3 unreadable line(s) skipped (line 6, {n // 2 + 4}, {n - 9};")


def test_load_run_with_two_processes_gives_the_same_figures(
    odd_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = run.load_run(odd_run, processes=1)
    monkeypatch.setattr(columns, "SPLIT_BYTES", 1000)
    monkeypatch.setattr(run, "FORK_FROM", 1)  # the summary's other half in a child as well
    two = run.load_run(odd_run, processes=2)
    assert [exact(asdict(s)) for s in two.levels] == [exact(asdict(s)) for s in one.levels]
    assert two.notices == one.notices and two.crosscheck == one.crosscheck
    assert any(s.tok_s_series for s in two.levels) and any(s.dists["ttft"].n for s in two.levels)
    # the rate levels' schedule figures and the mix's prefix cache, which need two parts together
    assert any(s.lag_p99_ms is not None and "ttft_sched" in s.dists for s in two.levels)
    assert any(s.prefix_cache_hit_rate is not None for s in two.levels)


def test_compare_reads_each_big_run_in_a_child(
    odd_run: Path, plain_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specload.present import compare

    one = compare.run_compare([odd_run, plain_run], out=tmp_path / "one", plot=False, fmt="json", processes=1)
    monkeypatch.setattr(compare, "SPLIT_BYTES", 1000)  # both runs are "big": each is read in a child
    monkeypatch.setattr(columns, "SPLIT_BYTES", 1000)
    monkeypatch.setattr(run, "FORK_FROM", 1)
    children = []
    real = forked.Child.__init__

    def init(self: forked.Child[Any], *args: Any, **kwargs: Any) -> None:
        children.append(os.getpid())
        real(self, *args, **kwargs)

    monkeypatch.setattr(forked.Child, "__init__", init)
    two = compare.run_compare([odd_run, plain_run], out=tmp_path / "two", plot=False, fmt="json", processes=2)
    assert (
        two.text == one.text
        and (tmp_path / "two" / "comparison.md").read_text()
        == (tmp_path / "one" / "comparison.md").read_text()
    )
    assert children.count(os.getpid()) == 2  # one child per run from here (theirs forked further)
    with pytest.raises(compare.CompareError, match="not a specload run directory"):
        compare.run_compare([odd_run, tmp_path], out=tmp_path / "three", plot=False, processes=2)


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


# ---------------------------------------------------------------- the rewritten loops


def odd_timeline(rng: random.Random, n: int) -> Timeline:
    """Requests of every shape: no tokens, one event, all on an edge, spans beyond the level."""
    tl = Timeline()
    for _ in range(n):
        t_send = T0 + rng.choice([rng.uniform(0, 30), float(rng.randrange(0, 30))])
        kind = rng.random()
        t_first = (
            None if kind < 0.05 else t_send + rng.choice([0.0, rng.uniform(0, 2), float(rng.randrange(0, 3))])
        )
        t_last = None if t_first is None or kind < 0.1 else t_first + rng.choice([0.0, rng.uniform(0, 5)])
        t_end = (t_last or t_first or t_send) + rng.choice([0.0, 0.001, 3.0])
        n_tok = rng.choice([0, 1, 2, 5, 100, -1]) if kind < 0.3 else 100
        tl.add(t_send, t_first, t_last, t_end, t_end - t_send, n_tok, rng.choice([None, 0, 1, 1, 1, 3, 200]))
    return tl


@pytest.mark.parametrize("seed", range(6))
def test_tok_s_series_and_window_tokens_are_the_plain_loops(seed: int) -> None:
    rng = random.Random(seed)
    tl = odd_timeline(rng, 2000)
    for bucket in (1.0, 0.25, 7.0, 1000.0):
        assert [x.hex() for x in metrics.tok_s_series(tl, bucket)] == [
            x.hex() for x in plain_tok_s_series(tl, bucket)
        ]
    lo, hi = min(tl.t_send), max(tl.t_end)
    for a, b in (
        (lo, hi),
        (lo + 3.0, hi - 5.0),
        (lo + 10.5, lo + 10.5),
        (hi + 1, hi + 2),
        (float(int(lo) + 4), lo + 9),
    ):
        got = metrics._window_tokens(tl, a, b)
        want = list(plain_window_tokens(tl, a, b))
        assert [x.hex() for x in got] == [x.hex() for x in want]


def plain_peak(sends: list[float], ends: list[float]) -> int:
    """The most requests in flight, walking every send and end in time order (an end first at a tie)."""
    n = top = 0
    for _, step in sorted([(t, 1) for t in sends] + [(t, -1) for t in ends]):  # (t, -1) before (t, 1)
        n += step
        top = max(top, n)
    return top


@pytest.mark.parametrize("seed", range(6))
def test_flight_counts_are_the_bisections_and_the_peak_the_event_walk(seed: int) -> None:
    """Flight's one merge gives what a bisection per send and per end gives, and its peak what a
    walk over the events gives, ties included (times on a coarse grid make many)."""
    rng = random.Random(seed)
    for grid in (0.5, 0.01, 0.0):  # 0.0: no grid, (almost) no ties
        sends, ends = [], []
        for _ in range(rng.choice([1, 2, 50, 3000])):
            t = rng.uniform(0, 100)
            t = round(t / grid) * grid if grid else t
            sends.append(t)
            ends.append(t + (round(rng.uniform(0, 5) / grid) * grid if grid else rng.uniform(0, 5)))
        sends.sort()
        ends.sort()
        fl = metrics.Flight(sends, ends)
        assert list(fl.after_send()) == [j + 1 - bisect_left(ends, s) for j, s in enumerate(sends)]
        assert list(fl.after_end()) == [bisect_right(sends, e) - (i + 1) for i, e in enumerate(ends)]
        assert fl.peak() == plain_peak(sends, ends)
    assert metrics.Flight([], []).peak() == 0


def plain_dist(xs: Sequence[float], ordered: list[float]) -> metrics.Dist:
    """A Dist from the full sort: the mean summed in the values' own order, percentiles of the sorted list."""
    return metrics.Dist(
        len(xs),
        sum(xs) / len(xs),
        metrics.stdev(xs) if len(xs) > 1 else None,
        {q: metrics.percentile_sorted(ordered, q) or 0.0 for q in metrics.PERCENTILES},
    )


def _shapes(rng: random.Random, n: int) -> dict[str, list[float]]:
    """Values of several shapes a latency column takes (and some it should not)."""
    return {
        "lognormal": [rng.lognormvariate(-3, 1) for _ in range(n)],
        "sorted": sorted(rng.random() for _ in range(n)),
        "reversed": sorted((rng.random() for _ in range(n)), reverse=True),
        "few values": [rng.choice([0.05, 0.06, 0.5]) for _ in range(n)],
        "one value": [0.25] * n,
        "bimodal": [rng.gauss(0.02, 0.001) if rng.random() < 0.99 else rng.gauss(3.0, 0.5) for _ in range(n)],
        "signed, zeros": [rng.choice([0.0, -0.0, rng.uniform(-1, 1)]) for _ in range(n)],
        "grid": [round(rng.expovariate(20), 3) for _ in range(n)],
    }


@pytest.mark.parametrize("seed", range(3))
def test_ranked_places_are_the_sorted_ones(seed: int) -> None:
    """``ranked`` gives the sorted list's values at the places the percentiles read, or None; the
    Dist made from it is the one made from the full sort, bit for bit."""
    rng = random.Random(seed)
    qs = (*metrics.PERCENTILES, 50.0, 99.0)
    found = 0
    for n in (1, 2, 7, 5000, 60_000):
        for shape, xs in _shapes(rng, n).items():
            ordered = sorted(xs)
            got = metrics.ranked(xs, qs)
            if got is not None:
                found += n >= 60_000  # (fewer values than the sample are all sorted)
                for q in qs:
                    assert metrics.percentile_sorted(got, q) == metrics.percentile_sorted(ordered, q), (
                        n,
                        shape,
                        q,
                    )
            col = array("d", xs)
            dist, _ = metrics._sorted_dist(col)
            want = plain_dist(col, ordered) if n else metrics.Dist()
            assert repr(dist) == repr(want), (n, shape)
    assert found >= 6  # most shapes of many values are placed without a full sort (of 8)


@pytest.mark.parametrize(
    "xs",
    [
        [1.0, 2.0, 4.0],
        [0.0, 0.0, 3.0],
        [-2.0, -0.0, 0.0, 5e-7, 3.0],
        [2.0, 2.0],
        [random.Random(1).lognormvariate(0, 2) for _ in range(5000)],
        [-x for x in (random.Random(2).random() for _ in range(300))],
    ],
)
def test_stdev_from_sorted_values_is_the_stdev(xs: list[float]) -> None:
    assert metrics.stdev(xs, sorted(xs)) == metrics.stdev(xs)


# ---------------------------------------------------------------- the child process


def test_child_sends_its_result_and_is_reaped() -> None:
    big = array("d", range(300_000))
    with forked.Child(lambda: sum(big)) as child:  # the child has the parent's memory: nothing sent in
        pid = child.pid
        assert child.result() == sum(big)
    assert pid is not None and not os.path.exists(f"/proc/{pid}")  # no zombie left


def test_a_failing_child_says_so_and_a_running_one_is_stopped(capfd: pytest.CaptureFixture[str]) -> None:
    def boom() -> None:
        raise ValueError("no")

    with forked.Child(boom) as child, pytest.raises(forked.ChildFailed):
        child.result()
    assert "ValueError: no" in capfd.readouterr().err
    with forked.Child(lambda: time.sleep(60)) as slow:
        pid = slow.pid
    assert pid is not None and not os.path.exists(f"/proc/{pid}")
    with pytest.raises(KeyError), forked.Child(lambda: time.sleep(60)) as slow:
        pid = slow.pid
        raise KeyError("the caller failed")
    assert not os.path.exists(f"/proc/{pid}")


# ---------------------------------------------------------------- records of an older specload


def test_records_without_the_newer_fields_are_read_a_block_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records written before the rate and workload fields existed (every record the same keys,
    fewer than RecordWriter writes now; some with a key the reader does not know) take the block
    path with those fields' defaults: what the record-by-record reading gives, without its checks."""
    newer = ("t_sched", "rate", "request_class", "turn", "conversation", "prefix_group", "cached_tokens")
    recs = [r for r in odd_records(random.Random(11), 200) if r["level"] < 4]
    for r in recs:
        for name in newer:
            del r[name]
    for r in recs[2 * columns.BLOCK_LINES : 3 * columns.BLOCK_LINES]:
        r["future"] = 1  # an unknown key, in a block of its own (a block of mixed keys goes one by one)
    path = tmp_path / RECORDS
    path.write_bytes(b"\n".join(map(orjson.dumps, recs)) + b"\n")
    checked = []
    real_checked = columns._checked
    monkeypatch.setattr(columns, "_checked", lambda *a: checked.append(1) or real_checked(*a))
    assert_same_reading(path)
    assert not checked
    for r in recs:
        del r["worker"]  # a field without a default: every record is dropped, as one by one
    path.write_bytes(b"\n".join(map(orjson.dumps, recs)) + b"\n")
    assert assert_same_reading(path) == {}


def test_layouts_of_keys() -> None:
    order = tuple(f.name for f in fields(RequestRecord))
    assert columns._layout(order) == tuple(order.index(name) for name in columns._ORDER)
    old = tuple(name for name in order if name not in ("turn", "cached_tokens"))
    layout = columns._layout(old)
    assert layout is not None and layout[columns._ORDER.index("turn")] == -1
    assert columns._layout(tuple(name for name in order if name != "t_end")) is None


# ---------------------------------------------------------------- the SLO in the reading pass

SLOS = [
    "ttft_p99=0.2s,tpot_p50=20ms",
    "e2e_mean=2s",
    "tpot_p90=15ms,e2e_p50=3s,ttft_mean=0.1s",
    "itl_p90=20ms,ttft_p50=0.1s",
    "itl_mean=25ms",
]


def tally_snapshot(tallies: dict[Any, Any]) -> list[Any]:
    return [
        (
            exact(key),
            exact(
                {
                    name: getattr(t, name)
                    for name in (
                        "sent",
                        "good",
                        "good_tokens",
                        "bad",
                        "first_send",
                        "last_end",
                        "values",
                        "missing",
                        "itl",
                        "itl_requests",
                    )
                }
            ),
            exact(asdict(t.result())),
        )
        for key, t in tallies.items()
    ]


@pytest.mark.parametrize("slo_text", SLOS)
@pytest.mark.parametrize("block", [1, 7, 128])
def test_slo_tallies_of_the_reading_pass_are_the_second_pass(
    odd_run: Path, slo_text: str, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tallies made while the columns are read (a block at a time, levels interleaved inside
    a block, warmups among the measured, every oddity of the file) are those of the pass over the
    records one by one that the report made before: the same values, counts, sums and key order."""
    slo = parse_slo(slo_text)
    monkeypatch.setattr(columns, "BLOCK_LINES", block)
    want = read_slo_tallies(odd_run / RECORDS, slo)
    notes: list[str] = []
    groups, got = columns.read_columns_and_tallies(str(odd_run / RECORDS), notes, 1, slo)
    assert tally_snapshot(got) == tally_snapshot(want)
    assert len(got) == 6 and any(t.good_tokens != t.good for t in got.values())
    plain: list[str] = []
    assert [exact(k) for k in groups] == [exact(k) for k in read_columns(str(odd_run / RECORDS), plain)]
    assert notes == plain


@pytest.mark.parametrize("slo_text", SLOS[:1] + SLOS[3:4])
@pytest.mark.parametrize("which", ["odd", "plain", "float in the first half", "float in the second half"])
def test_slo_tallies_from_two_processes(
    slo_text: str, which: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's tallies come back with its columns (their values as raw bytes) and are merged
    after this process's: the one-pass tallies. A float count on both sides: read here again."""
    if which in ("odd", "plain"):
        path: Path = request.getfixturevalue(f"{which}_run") / RECORDS
    else:
        path = one_level_run(tmp_path, 20 if "first" in which else -20) / RECORDS
    slo = parse_slo(slo_text)
    want = read_slo_tallies(path, slo)
    merged = split_and_watch(monkeypatch)
    _, got = columns.read_columns_and_tallies(str(path), None, 2, slo)
    assert tally_snapshot(got) == tally_snapshot(want)
    assert len(merged) == 1 and merged[0] == (which in ("odd", "plain"))


def test_slo_tallies_when_the_child_dies(plain_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its stream spoilt, the child dies: this process reads the whole file, tallies included."""
    slo = parse_slo(SLOS[0])

    def send(reading: columns._Reading, f: Any) -> None:
        f.write(b"garbage")
        f.flush()
        os._exit(3)

    monkeypatch.setattr(columns, "_send", send)
    monkeypatch.setattr(columns, "SPLIT_BYTES", 1000)
    _, got = columns.read_columns_and_tallies(str(plain_run / RECORDS), None, 2, slo)
    assert tally_snapshot(got) == tally_snapshot(read_slo_tallies(plain_run / RECORDS, slo))


@pytest.mark.parametrize("slo_text", SLOS)
def test_load_run_judges_as_the_second_pass_did(
    odd_run: Path, slo_text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """load_run's verdicts (one pass) are those of judge_levels over the second pass's tallies."""
    slo = parse_slo(slo_text)
    one = run.load_run(odd_run, slo, processes=1)
    monkeypatch.setattr(columns, "SPLIT_BYTES", 1000)
    two = run.load_run(odd_run, slo, processes=2)
    plain = run.load_run(odd_run, None, processes=1)
    run.judge_levels(plain.levels, read_slo_tallies(odd_run / RECORDS, slo), slo)
    want = [exact(asdict(s)) for s in plain.levels]
    assert [exact(asdict(s)) for s in one.levels] == want
    assert [exact(asdict(s)) for s in two.levels] == want
    assert any(s.slo is not None and s.slo.sent for s in one.levels)


def test_a_block_of_slo_requests_is_the_requests_one_by_one() -> None:
    """SloTally.add_block against add, on columns with every case: not OK, missing values, ints,
    floats, values on the threshold, negative and float counts, and no target at all."""
    rng = random.Random(4)
    for text in ("ttft_p99=0.5s,tpot_p50=20ms,e2e_mean=2s", "tpot_p90=0.02s", "itl_p50=20ms"):
        slo = parse_slo(text)
        rows = []
        for _ in range(300):
            status = rng.choice((OK, OK, OK, "short", "failed"))
            rows.append(
                (
                    status,
                    T0 + rng.random(),
                    T0 + 5 + rng.random(),
                    rng.choice((100, 3, -1, 50.0, 0)),
                    rng.choice((None, 0.5, 0.2, 1, 0.7)),
                    rng.choice((None, 0.02, 0.01, 0.03)),
                    rng.choice((2, 1.5, 2.5)),
                    rng.choice((None, [[300, 5], [320, 2]], [[400, 1]])),
                )
            )
        one, block = SloTally(slo), SloTally(slo)
        for row in rows:
            one.add(*row[:7], row[7] if row[0] == OK else None)
        for at in range(0, len(rows), 37):
            cols = [list(col) for col in zip(*rows[at : at + 37], strict=True)]
            cols[7] = [itl if s == OK else None for s, itl in zip(cols[0], cols[7], strict=True)]
            block.add_block(*cols)
        assert tally_snapshot({0: block}) == tally_snapshot({0: one})
        all_ok = [r for r in rows if r[0] == OK and r[4] is not None and r[5] is not None][:50]
        one, block = SloTally(slo), SloTally(slo)
        for row in all_ok:
            one.add(*row)
        block.add_block(*(list(col) for col in zip(*all_ok, strict=True)))
        assert tally_snapshot({0: block}) == tally_snapshot({0: one})


@pytest.mark.parametrize("slo_text", SLOS)
def test_slo_tallies_of_the_sample_run(slo_text: str) -> None:
    """tests/fixtures/sample_run (records as RecordWriter writes them): one pass, the second pass's tallies."""
    path = Path(__file__).parent / "fixtures" / "sample_run" / RECORDS
    slo = parse_slo(slo_text)
    _, got = columns.read_columns_and_tallies(str(path), None, 1, slo)
    assert tally_snapshot(got) == tally_snapshot(read_slo_tallies(path, slo)) and got


@pytest.mark.parametrize("seed", range(3))
def test_stdev_is_the_library_stdev_on_odd_values(seed: int) -> None:
    """metrics.stdev (exact integer sums, scaled by a product or by ldexp) against statistics.stdev
    (correctly rounded from Python 3.11 on): wide ranges, subnormals, zeros of both signs, integers."""
    import statistics
    import sys

    if sys.version_info < (3, 11):
        pytest.skip("statistics.stdev is correctly rounded from 3.11 on")
    rng = random.Random(seed)
    draws = [
        lambda: rng.lognormvariate(-3, 1),
        lambda: rng.uniform(-1e-300, 1e-300),
        lambda: rng.choice([0.0, -0.0, 5e-324, 1e300, -2.5, 3.0]),
        lambda: rng.uniform(-1e10, 1e10) * 2.0 ** rng.randrange(-60, 60),
        lambda: float(rng.randrange(-1000, 1000)),
        lambda: rng.gauss(0, 1) * 1e-310,
    ]
    for i in range(600):
        xs = [draws[i % len(draws)]() for _ in range(rng.randrange(2, 40))]
        want = repr(statistics.stdev(xs))
        assert repr(metrics.stdev(xs, sorted(xs))) == want == repr(metrics.stdev(array("d", xs))), xs


@pytest.mark.parametrize("seed", range(4))
def test_request_hists_are_each_requests_merge(seed: int) -> None:
    """An ITL target's per-request histograms, made a block at a time, are histogram.merge of each
    OK request's pairs (bins, counts, key order and key types), {} for the others."""
    from specload.core.slo import _request_hists

    rng = random.Random(seed)
    for distinct in (False, True):
        for _ in range(200):
            itls = []
            for _ in range(rng.randrange(1, 40)):
                pairs = random_pairs(rng)
                if distinct:
                    pairs = list({p[0]: p for p in pairs if isinstance(p, list) and p}.values())
                itls.append(rng.choice((pairs, pairs, pairs, None, [])))
            status = [rng.choice((OK, OK, "short", "failed")) for _ in itls]
            got = _request_hists(status, itls)
            want = [histogram.merge([x]) if s == OK and x else {} for s, x in zip(status, itls, strict=True)]
            assert [exact(h) for h in got] == [exact(h) for h in want]


def test_a_tally_is_keyed_as_its_first_measured_request(tmp_path: Path) -> None:
    """A level index written 1 by a warmup and 1.0 by the measured requests: one group, whose tally
    has the measured request's key (as the record-by-record pass makes it)."""
    recs = [r for r in odd_records(random.Random(2), 60) if r["level"] == 1][:50]
    for i, r in enumerate(recs):
        r["phase"] = "warmup" if i == 0 else "measure"
        r["level"] = 1 if i == 0 else 1.0
    (tmp_path / RECORDS).write_bytes(b"\n".join(map(orjson.dumps, recs)) + b"\n")
    slo = parse_slo(SLOS[0])
    _, got = columns.read_columns_and_tallies(str(tmp_path / RECORDS), None, 1, slo)
    assert tally_snapshot(got) == tally_snapshot(read_slo_tallies(tmp_path / RECORDS, slo))
    assert [type(k[0]) for k in got] == [float]


# ---------------------------------------------------------------- the block path's fallbacks (columns._columns)


def fallback_blocks() -> list[list[Any]]:
    """Blocks of 8 rate-level records (every field, numbers as numbers, a due time each), each
    with one oddity the block path must leave to the record-by-record checks, or read the same."""
    recs = [r for r in odd_records(random.Random(5), 300) if r["level"] == 4 and r["t_sched"] is not None]
    recs = [r for r in recs if columns._plain(r) and r["phase"] == "measure"]
    blocks: list[list[Any]] = []

    def block(i: int) -> list[Any]:
        b = [dict(r) for r in recs[8 * i : 8 * i + 8]]
        blocks.append(b)
        return b

    block(0)  # plain
    b = block(1)
    b[3] = dict(reversed(list(b[3].items())))  # the same keys in another order: still one block
    b = block(2)
    b[0] = {k: v for k, v in b[0].items() if k != "t_sched"}  # the first without a due time, the rest with
    b = block(3)
    b[5].pop("t_sched")
    b[5]["future"] = 1  # as many keys as the others, one of them unknown and one missing
    b = block(4)
    b[2]["output_tokens"] = True  # a bool is no number
    b = block(5)
    b[6]["seq"] = False
    b = block(6)
    b[4]["t_first"] = "1.5"
    b = block(7)
    b[7]["future"] = 2  # one more key than the first
    for i, odd in enumerate(([], 7, "x", [1, 2], None)):
        block(8 + i)[1 + i] = odd  # a line that is JSON but no record
    return blocks


def test_a_block_with_an_oddity_is_read_as_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each block alone, and all of them in one file: the block reading is the plain reading."""
    monkeypatch.setattr(columns, "BLOCK_LINES", 8)
    blocks = fallback_blocks()
    assert len(blocks) == 13 and all(len(b) == 8 for b in blocks)
    path = tmp_path / RECORDS
    for lines in [*blocks, [r for b in blocks for r in b]]:
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lines))
        got = assert_same_reading(path)
        if lines is blocks[0] or lines is blocks[1]:
            assert sum(cols.sent for cols in got.values()) == 8


def test_the_block_path_takes_keys_in_any_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records with the same keys in different orders are read as one block, not one by one."""
    monkeypatch.setattr(columns, "BLOCK_LINES", 8)
    path = tmp_path / RECORDS
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in fallback_blocks()[1]))
    checked = []
    real_checked = columns._checked
    monkeypatch.setattr(columns, "_checked", lambda *a: checked.append(1) or real_checked(*a))
    assert_same_reading(path)
    assert not checked


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
