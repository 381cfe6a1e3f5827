"""records.jsonl read as typed records, and each level's measured requests held as numpy columns.

A run at 1,000 requests/s for an hour holds 3.6M records; as ``RequestRecord`` objects (with their
``itl`` lists) that is over 1 KB each. The report needs a few numbers per request: each level keeps
them as float64 arrays (a missing value is nan; a count is exact in a double up to 2**53), the
strings it counts (status, token source, ...) as small integer codes, and the ITL histograms merged
as they come. ``metrics`` computes every figure from these arrays, once.

Lines are decoded by msgspec into ``Rec`` (every field of ``RequestRecord``, typed), a block at a
time; a line msgspec refuses (a wrong type, a missing field, a torn line) is read the way
``records.read_records`` reads it, with the same notes. ``LevelColumns`` is appendable: the file
reader and the live web view (specload.analysis.live) feed it through the same ``extend``.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import orjson

from specload.core import histogram
from specload.core.records import (
    OK,
    PHASE_MEASURE,
    PHASE_WARMUP,
    SCHEMA_VERSION,
    RequestRecord,
    _checked,
    read_notes,
)
from specload.core.slo import Slo, SloTally, request_value

Floats = npt.NDArray[np.float64]
Codes = npt.NDArray[np.int32]
# (level, concurrency, repeat): the records of one run.json level.
GroupKey = tuple[Any, Any, Any]


class Rec(msgspec.Struct):
    """One line of records.jsonl, typed: ``RequestRecord``'s fields (a record written before a field
    existed takes its default; ``v`` is the schema version, 1 for records written without it)."""

    level: int
    concurrency: int
    phase: str
    seq: int
    backend: str
    status: str
    reason: str | None
    http_status: int | None
    t_send: float
    t_first: float | None
    t_last: float | None
    t_end: float
    ttft_s: float | None
    e2e_s: float
    output_tokens: int
    output_tokens_source: str
    prompt_tokens: int | None
    requested_output_tokens: int
    requested_prompt_tokens: int
    chunks: int
    tpot_s: float | None
    itl_max_s: float | None
    per_request_tok_s: float | None
    decode_tok_s: float | None
    spec_verify_ct: int | None
    worker: str
    repeat: int = 0
    itl: list[Any] | None = None
    itl_unit: str | None = None
    first_event_tokens: int | None = None
    t_sched: float | None = None
    rate: float | None = None
    request_class: str | None = None
    turn: int | None = None
    conversation: str | None = None
    prefix_group: int | None = None
    cached_tokens: int | None = None
    v: int = 1


assert set(Rec.__struct_fields__) == {f for f in RequestRecord.__dataclass_fields__}, (
    "Rec mirrors RequestRecord"
)
assert SCHEMA_VERSION >= 1
_DECODER = msgspec.json.Decoder(Rec)

# The numbers a level keeps of each measured request: column name -> record field.
NUMBERS = {
    "t_send": "t_send",
    "t_first": "t_first",
    "t_last": "t_last",
    "t_end": "t_end",
    "ttft": "ttft_s",
    "e2e": "e2e_s",
    "tpot": "tpot_s",
    "decode": "decode_tok_s",
    "tokens": "output_tokens",
    "prompt": "prompt_tokens",
    "req_out": "requested_output_tokens",
    "req_prompt": "requested_prompt_tokens",
    "verify": "spec_verify_ct",
    "first_event": "first_event_tokens",
    "t_sched": "t_sched",
    "cached": "cached_tokens",
}
# The values it counts, as codes into a list of the values in first-seen order.
LABELS = {
    "status": "status",
    "source": "output_tokens_source",
    "http": "http_status",
    "request_class": "request_class",
    "turn": "turn",
}
# Codes of the columns with few values are int16; the others' (a reason can name a count) int32.
_NARROW = frozenset({"status", "source", "http"})
# A record whose key or one of these is null has no place on the time line: skipped as one
# without a usable required field.
_NOT_NULL = ("level", "concurrency", "repeat", "t_send", "t_end", "e2e_s", "output_tokens")
_KEY = attrgetter("level", "concurrency", "repeat")
_FIELDS = (*NUMBERS.values(), *LABELS.values(), "reason", "itl", "itl_unit")
_TAKE = attrgetter(*_FIELDS)
_N_NUM, _N_LAB = len(NUMBERS), len(LABELS)
_CHUNK_BYTES = 1 << 20  # lines read (and decoded) at a time


class LevelColumns:
    """One level's measured requests as columns (file order), and what is only counted.

    ``warmup``: warmup requests (only counted). ``col(name)``: a NUMBERS column; ``codes(name)``
    and ``labels[name]``: a LABELS column's codes and its values. ``reasons``: each request's
    "status: reason" (None when OK), coded the same way. ``itl``: the OK requests' ITL histograms
    merged; ``itl_units``: their units. ``itl_values``: with an SLO on ITL, each request's own ITL
    statistic per target (nan without gaps), and ``itl_gaps`` whether it had any.
    """

    def __init__(self, itl_qs: Sequence[float | None] = ()) -> None:
        self.warmup = 0
        self.itl_qs = tuple(itl_qs)
        self._chunks: dict[str, list[npt.NDArray[Any]]] = {
            name: [] for name in (*NUMBERS, *LABELS, "reason", "itl_gaps")
        }
        self._chunks.update({f"itl_{i}": [] for i in range(len(self.itl_qs))})
        self.labels: dict[str, list[Any]] = {name: [] for name in (*LABELS, "reason")}
        self._index: dict[str, dict[Any, int]] = {name: {} for name in (*LABELS, "reason")}
        self.itl_counts = histogram.Counts()
        self.itl_units: dict[Any, None] = {}
        self._pending: list[Any] = []
        self._n = 0

    # ------------------------------------------------------------ feeding

    def add(self, rec: Any) -> None:
        """One record (a RequestRecord or a Rec), kept until the columns are next read."""
        self._pending.append(rec)

    add_record = add

    def extend(self, recs: Sequence[Any]) -> None:
        """Records of this level in file order (RequestRecord or Rec: the same attributes)."""
        self._flush()
        self._extend(recs)

    def _flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            self._extend(pending)

    def _extend(self, recs: Sequence[Any]) -> None:
        phases = [r.phase for r in recs]
        m = len(phases)
        measured = phases.count(PHASE_MEASURE)
        if measured != m:
            self.warmup += phases.count(PHASE_WARMUP)
            recs = [r for r, p in zip(recs, phases, strict=True) if p == PHASE_MEASURE]
            m = measured
        if not m:
            return
        cols = list(zip(*map(_TAKE, recs), strict=True))
        for name, col in zip(NUMBERS, cols, strict=False):
            # a field no request of the block has (a rate level's due time, ...): its length alone
            none = col[0] is None and col.count(None) == m
            self._chunks[name].append(m if none else np.array(col, dtype=np.float64))  # type: ignore[arg-type]
        status = cols[_N_NUM]
        for name, col in zip(LABELS, cols[_N_NUM : _N_NUM + _N_LAB], strict=True):
            self._chunks[name].append(self._code(name, col))
        reason = cols[_N_NUM + _N_LAB]
        self._chunks["reason"].append(
            self._code(
                "reason",
                [
                    None if s == OK else f"{s}: {r or 'no reason given'}"
                    for s, r in zip(status, reason, strict=True)
                ],
            )
        )
        itl, units = cols[-2], cols[-1]
        with_itl = [i for i, (s, x) in enumerate(zip(status, itl, strict=True)) if x and s == OK]
        if with_itl:
            self.itl_counts.add([itl[i] for i in with_itl])
            self.itl_units.update(dict.fromkeys(units[i] for i in with_itl))
        if self.itl_qs:
            self._itl_values(m, with_itl, itl)
        self._n += m

    def _code(self, name: str, col: Sequence[Any]) -> Codes:
        index, values = self._index[name], self.labels[name]
        first = col[0]
        if col.count(first) == len(col):  # one value the whole block through (the usual case)
            code = index.get(first)
            if code is None:
                code = index[first] = len(values)
                values.append(first)
            return np.full(len(col), code, dtype=np.int16 if name in _NARROW else np.int32)
        out = np.empty(len(col), dtype=np.int16 if name in _NARROW else np.int32)
        for i, x in enumerate(col):
            code = index.get(x)
            if code is None:
                code = index[x] = len(values)
                values.append(x)
            out[i] = code
        return out

    def _itl_values(self, m: int, with_itl: list[int], itl: Sequence[Any]) -> None:
        """Each request's own ITL statistic for each ITL target of the SLO (slo.request_value)."""
        vals = np.full((len(self.itl_qs), m), np.nan)
        gaps = np.zeros(m, dtype=np.int32)
        for i in with_itl:
            hist = histogram.merge([itl[i]])
            if not hist:
                continue
            gaps[i] = 1
            for j, q in enumerate(self.itl_qs):
                v = request_value("itl", q, None, None, None, hist)
                vals[j, i] = np.nan if v is None else v
        self._chunks["itl_gaps"].append(gaps)
        for j in range(len(self.itl_qs)):
            self._chunks[f"itl_{j}"].append(vals[j])

    # ------------------------------------------------------------ reading

    @property
    def sent(self) -> int:
        """Measured requests."""
        self._flush()
        return self._n

    def _column(self, name: str, dtype: Any) -> npt.NDArray[Any]:
        self._flush()
        chunks: list[Any] = self._chunks[name]
        if all(type(c) is int for c in chunks):  # no request had a value: made when asked, not kept
            return np.full(sum(chunks), np.nan, dtype=dtype) if chunks else np.empty(0, dtype=dtype)
        if len(chunks) != 1:
            parts = [np.full(c, np.nan) if type(c) is int else c for c in chunks]
            chunks[:] = [np.concatenate(parts)]
        return chunks[0]

    def col(self, name: str) -> Floats:
        """A NUMBERS column (nan where the record had no value)."""
        return self._column(name, np.float64)

    def codes(self, name: str) -> Codes:
        """A LABELS column's codes (``labels[name][code]`` is the value), or ``reason``'s."""
        return self._column(name, np.int32)

    def present(self, name: str, mask: npt.NDArray[np.bool_]) -> Floats:
        """A NUMBERS column's values where ``mask`` holds and the record had one."""
        xs = self.col(name)
        return xs[mask & ~np.isnan(xs)]

    def is_label(self, name: str, value: Any) -> npt.NDArray[np.bool_]:
        """Which requests have ``value`` in LABELS column ``name``."""
        code = self._index[name].get(value)
        codes = self.codes(name)
        return codes == code if code is not None else np.zeros(len(codes), dtype=bool)

    def itl_value(self, j: int) -> Floats:
        return self._column(f"itl_{j}", np.float64)

    def itl_gaps(self) -> Codes:
        return self._column("itl_gaps", np.int32)

    @property
    def itl(self) -> histogram.Hist:
        """The merged ITL histogram (``histogram.merge`` of the OK requests' ``itl``)."""
        return self.itl_counts.hist()

    def nbytes(self) -> int:
        """Bytes held in columns (what grows with the number of requests)."""
        self._flush()
        return sum(c.nbytes for chunks in self._chunks.values() for c in chunks if type(c) is not int)

    # ------------------------------------------------------------ parts and wholes

    def subset(self, mask: npt.NDArray[np.bool_]) -> LevelColumns:
        """The requests where ``mask`` holds, as columns of their own (a class's, a turn's); the
        ITL histogram is the level's alone (a part has none)."""
        out = LevelColumns(self.itl_qs)
        out._n = int(mask.sum())
        for name, chunks in self._chunks.items():
            if chunks or name in NUMBERS or name in LABELS:
                dtype = np.float64 if name in NUMBERS or name.startswith("itl_") else np.int32
                out._chunks[name] = [self._column(name, dtype)[mask]]
        for name in NUMBERS:
            if np.isnan(out._chunks[name][0]).all():
                out._chunks[name] = [out._n]
        out.labels = {k: list(v) for k, v in self.labels.items()}
        out._index = {k: dict(v) for k, v in self._index.items()}
        return out

    @classmethod
    def concat(cls, parts: Sequence[LevelColumns]) -> LevelColumns:
        """Several groups as one level (run.json levels without an index), one after the other."""
        out = cls(parts[0].itl_qs if parts else ())
        for p in parts:
            p._flush()
            out.warmup += p.warmup
            out._n += p._n
            for name, chunks in p._chunks.items():
                if name in LABELS or name == "reason":  # recoded into this one's first-seen order
                    recode = np.array(
                        [out._code(name, [v])[0] for v in p.labels[name]] or [0], dtype=np.int32
                    )
                    out._chunks[name] += [recode[c] for c in chunks]
                else:
                    out._chunks[name] += chunks
            out.itl_counts.merge(p.itl_counts)
            out.itl_units.update(p.itl_units)
        return out

    @classmethod
    def of(cls, records: Iterable[RequestRecord]) -> LevelColumns:
        cols = cls()
        cols.extend(list(records))
        return cols


def count_of(total: Any) -> int | float:
    """A sum of counts (or a count) as the int it is; a float only when some count was not whole."""
    x = float(total)
    return int(x) if x.is_integer() else x


def slo_tally(c: LevelColumns, slo: Slo) -> SloTally:
    """A level's measured requests as the SLO judges them (specload.core.slo.SloTally)."""
    tally = SloTally(slo)
    if not c.sent:
        return tally
    itl_values = {i: c.itl_value(c.itl_qs.index(t.q)) for i, t in enumerate(slo.targets) if t.metric == "itl"}
    tally.extend(
        ok=c.is_label("status", OK),
        t_send=c.col("t_send"),
        t_end=c.col("t_end"),
        tokens=c.col("tokens"),
        ttft=c.col("ttft"),
        tpot=c.col("tpot"),
        e2e=c.col("e2e"),
        itl_values=itl_values,
        itl=c.itl if c.itl_qs else {},
        itl_requests=int(c.itl_gaps().sum()) if c.itl_qs else 0,
    )
    return tally


def itl_qs(slo: Slo | None) -> tuple[float | None, ...]:
    """The statistics an SLO's ITL targets read of each request's own gaps (in target order)."""
    return tuple(dict.fromkeys(t.q for t in slo.targets if t.metric == "itl")) if slo is not None else ()


class _Reading:
    """One pass over records.jsonl: the groups, and what the notes will say."""

    def __init__(self, qs: tuple[float | None, ...] = ()) -> None:
        self.groups: dict[GroupKey, LevelColumns] = {}
        self.qs = qs
        self.torn: list[int] = []  # numbers of the unreadable lines
        self.bad_records = 0
        self.first_bad: str | None = None
        self.bad_fields: dict[str, int] = {}

    def lines(self, lines: list[bytes], first_no: int) -> None:
        """A block of lines, the first being line ``first_no`` of the file."""
        try:
            recs: list[Any] = _DECODER.decode_lines(b"".join(lines))
        except msgspec.DecodeError:  # some line is odd: each read on its own
            recs = []
            for no, line in enumerate(lines, first_no):
                rec = self._one(line, no)
                if rec is not None:
                    recs.append(rec)
        if recs:
            self._add(recs)

    def _one(self, line: bytes, no: int) -> Any:
        """One line as ``records.read_records`` reads it: a Rec, a RequestRecord, or None."""
        line = line.strip()
        if not line:
            return None
        try:
            return _DECODER.decode(line)
        except msgspec.DecodeError:
            pass
        try:
            d = orjson.loads(line)
        except orjson.JSONDecodeError:
            self.torn.append(no)
            return None
        rec = _checked(d, self.bad_fields)
        if rec is None or any(getattr(rec, name) is None for name in _NOT_NULL):
            self.bad_records += 1
            if self.first_bad is None:
                self.first_bad = str(d)[:80]
            return None
        return rec

    def _add(self, recs: list[Any]) -> None:
        keys = list(map(_KEY, recs))
        if keys.count(keys[0]) == len(keys):  # a block is usually all one level
            self._group(keys[0]).extend(recs)
            return
        for key in dict.fromkeys(keys):  # first-seen order, and a group's first key, as a dict has them
            self._group(key).extend([r for r, k in zip(recs, keys, strict=True) if k == key])

    def _group(self, key: GroupKey) -> LevelColumns:
        cols = self.groups.get(key)
        if cols is None:
            cols = self.groups[key] = LevelColumns(self.qs)
        return cols

    def read(self, path: str) -> None:
        no = 1
        with open(path, "rb") as f:
            while lines := f.readlines(_CHUNK_BYTES):
                self.lines(lines, no)
                no += len(lines)

    def notes(self, notes: list[str]) -> None:
        read_notes(notes, len(self.torn), self.torn, self.bad_records, self.first_bad, self.bad_fields)


def read_columns(
    path: str, notes: list[str] | None = None, slo: Slo | None = None
) -> dict[GroupKey, LevelColumns]:
    """records.jsonl as columns per (level, concurrency, repeat), in one streaming pass.

    The same reading as ``records.read_records``, with the same notes: a torn line is skipped, a
    field of the wrong type is dropped (an optional one) or drops its record (a required one). A
    record whose level, concurrency, repeat, t_send, t_end, e2e_s or output_tokens is null is
    skipped as one without a usable required field. ``slo``: its ITL targets need each request's
    own gaps, read as the line is (LevelColumns.itl_values).
    """
    reading = _Reading(itl_qs(slo))
    collecting = gc.isenabled()
    gc.disable()  # nothing read makes a reference cycle; the collector would walk each block's objects
    try:
        reading.read(path)
    finally:
        if collecting:
            gc.enable()
    if notes is not None:
        reading.notes(notes)
    return reading.groups


def read_columns_and_tallies(
    path: str, notes: list[str] | None = None, processes: int = 1, slo: Slo | None = None
) -> tuple[dict[GroupKey, LevelColumns], dict[GroupKey, SloTally]]:
    """``read_columns``, and with ``slo`` each group's measured requests judged against it ({}
    without one; a group without measured requests has no tally). ``processes`` is ignored."""
    groups = read_columns(path, notes, slo)
    tallies = {} if slo is None else {k: slo_tally(c, slo) for k, c in groups.items() if c.sent}
    return groups, tallies
