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

import contextlib
import ctypes
import dataclasses
import functools
import gc
import math
import os
import pickle
import typing
from collections.abc import Iterable, Sequence
from itertools import chain
from operator import attrgetter
from typing import IO, Any

import msgspec
import numpy as np
import numpy.typing as npt
import orjson

from specload.analysis import forked
from specload.analysis.spectally import SpecTally
from specload.analysis.validity import FINISH, RULE_FIELDS, Validity, broken_columns
from specload.core import histogram, safeopen
from specload.core.records import (
    NULLABLE,
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
Floats2 = npt.NDArray[np.float64]  # a block's NUMBERS, one row per record
Codes = npt.NDArray[np.int32]
# (level, concurrency, repeat): the records of one run.json level.
GroupKey = tuple[Any, Any, Any]


_NULL = msgspec.Raw(b"null")


def _typed(record: type[RequestRecord]) -> type[msgspec.Struct]:
    """``Rec``: RequestRecord's fields with their types and defaults, as a msgspec Struct, so the
    schema is written once (core.records). A field that may be null defaults to None (a line leaves
    it out when it is: schema version 4). Two fields differ on purpose: ``itl`` stays JSON text
    (its pairs are summed from it in bulk, no list per pair), and ``v`` defaults to 1, the version
    of records written without it."""
    hints = typing.get_type_hints(record)
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for f in dataclasses.fields(record):
        if f.name == "itl":
            fields.append(("itl", msgspec.Raw, _NULL))
        elif f.name == "v":
            fields.append(("v", int, 1))
        elif f.default is not dataclasses.MISSING:
            fields.append((f.name, hints[f.name], f.default))
        elif f.default_factory is not dataclasses.MISSING:
            fields.append((f.name, hints[f.name], msgspec.field(default_factory=f.default_factory)))
        elif f.name in NULLABLE:
            fields.append((f.name, hints[f.name], None))
        else:
            fields.append((f.name, hints[f.name]))
    return msgspec.defstruct("Rec", fields, kw_only=True)


Rec = _typed(RequestRecord)  # one line of records.jsonl, typed


assert SCHEMA_VERSION >= 1
_DECODER: msgspec.json.Decoder[Any] = msgspec.json.Decoder(Rec)

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
    "per_req": "per_request_tok_s",
    "tokens": "output_tokens",
    "prompt": "prompt_tokens",
    "req_out": "requested_output_tokens",
    "req_prompt": "requested_prompt_tokens",
    "verify": "spec_verify_ct",
    "first_event": "first_event_tokens",
    "t_sched": "t_sched",
    "cached": "cached_tokens",
    "drafted": "spec_drafted",
    "accepted": "spec_accepted",
    "t_answer": "t_first_answer",
    "reasoning": "reasoning_tokens",
}
# The values it counts, as codes into a list of the values in first-seen order.
LABELS = {
    "status": "status",
    "source": "output_tokens_source",
    "http": "http_status",
    "request_class": "request_class",
    "turn": "turn",
    "spec_source": "spec_source",
    "category": "category",
    "reasoning_source": "reasoning_tokens_source",
}


def _code_type(values: list[Any]) -> type[np.signedinteger[Any]]:
    """int16 codes while a column has fewer than 32767 values (a reason can name a count), else int32."""
    return np.int16 if len(values) < 32767 else np.int32


# A record whose key or one of these is null has no place on the time line: skipped as one
# without a usable required field.
_NOT_NULL = ("level", "concurrency", "repeat", "t_send", "t_end", "e2e_s", "output_tokens")
_KEY = attrgetter("level", "concurrency", "repeat")
_TAKE_NUMBERS = attrgetter(*NUMBERS.values())
_PHASE, _STATUS, _REASON, _ITL, _UNIT = (
    attrgetter(f) for f in ("phase", "status", "reason", "itl", "itl_unit")
)
_OPEN, _N = ord("["), ord("n")
_SPEC_LISTS = attrgetter("spec_hist", "spec_along")
_N_NUM = len(NUMBERS)
_COL = {name: j for j, name in enumerate(NUMBERS)}
# validity.broken_columns' number arguments, as the NUMBERS columns of their record fields
_RULE_COLUMNS = {arg: _COL[name] for arg, f in RULE_FIELDS.items() for name, g in NUMBERS.items() if g == f}
assert len(_RULE_COLUMNS) == len(RULE_FIELDS)
_SOURCE = attrgetter("output_tokens_source")


def _pick(
    idx: list[int], recs: Sequence[Any], numbers: Floats2, phases: list[Any], status: list[Any]
) -> tuple[list[Any], Floats2, list[Any], list[Any]]:
    """Records ``idx`` of a block, with their rows of what was taken of them."""
    return [recs[i] for i in idx], numbers[idx], [phases[i] for i in idx], [status[i] for i in idx]


def _numbers(recs: Sequence[Any]) -> Floats2:
    """The NUMBERS of each record, a row a record (None: nan). Made from one flat list: numpy takes
    it in 2/3 of the time of a list of tuples, whose shape it must find out first."""
    flat = list(chain.from_iterable(map(_TAKE_NUMBERS, recs)))
    return np.array(flat, dtype=np.float64).reshape(len(recs), _N_NUM)


_DIGITS = b"0123456789"
_BAR_TO_COMMA = bytes.maketrans(b"|", b",")
_RAW_ONLY = {msgspec.Raw}


@functools.cache
def _skeleton(k: int) -> bytes:
    """A well-formed ``[[bin, count], ...]`` of k pairs once its digits are taken out (4k + 1 bytes)."""
    return b"[[," + b"],[," * (k - 1) + b"]]"


# The usual skeletons at hand (a histogram has a few dozen bins); a table of every k up to the
# 4095 bins a histogram may have would cost each process that imports this 33 MB and 70 ms.
_SKELETONS = {_skeleton(k): k for k in range(1, 65)}


def _pairs(skeleton: bytes) -> int | None:
    """The pairs of a well-formed skeleton (1 to 4095), else None."""
    k = _SKELETONS.get(skeleton)
    if k is not None:
        return k
    k, rest = divmod(len(skeleton) - 1, 4)
    return k if rest == 0 and 1 <= k < 4096 and skeleton == _skeleton(k) else None


def _raw(itl: Any) -> bytes:
    """A record's ``itl`` as its JSON text (a Rec keeps it undecoded: no list per pair)."""
    if type(itl) is msgspec.Raw:
        return bytes(itl)
    return b"null" if itl is None else orjson.dumps(itl)


def _lists_or_null(itl: list[Any]) -> bool:
    """Whether every record's ``itl`` text is a list or null (the rest go through the checks)."""
    lens = np.fromiter(map(len, itl), np.int64, len(itl))
    if not lens.all():
        return False
    first = np.frombuffer(b"".join(itl), np.uint8)[np.cumsum(lens) - lens]
    return bool(((first == _OPEN) | (first == _N)).all())


def _add_flat(counts: histogram.Counts, gaps: list[Any]) -> bool:
    """Many requests' ``[[bin, count], ...]`` (JSON text) added to ``counts`` at once, when every one
    is well-formed (ints, counts above zero, bins below Counts.SPAN); False, nothing added, else."""
    joined = b"|".join(gaps)
    ks = list(map(_pairs, joined.translate(None, _DIGITS).split(b"|")))
    if None in ks:
        return False
    pairs = sum(ks)  # type: ignore[arg-type]
    try:
        flat = np.fromstring(joined.translate(_BAR_TO_COMMA, b"[]"), dtype=np.int64, sep=",")
    except ValueError:
        return False
    if len(flat) != 2 * pairs:
        return False
    bins, n = flat[0::2], flat[1::2]
    if not len(bins) or n.min() <= 0 or bins.max() >= histogram.Counts.SPAN:
        return False
    counts.add_flat(bins, n)
    return True


_CHUNK_BYTES = 1 << 20  # lines read (and decoded) at a time
_NEWLINE = ord("\n")
_WHOLE_EVERY = 128  # blocks after which a level's columns are made whole


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
        self._chunks: dict[str, list[Any]] = {  # arrays; (n, value): n requests with that value
            name: [] for name in (*NUMBERS, *LABELS, "reason", "itl_gaps")
        }
        self._chunks.update({f"itl_{i}": [] for i in range(len(self.itl_qs))})
        self.labels: dict[str, list[Any]] = {name: [] for name in (*LABELS, "reason")}
        self._index: dict[str, dict[Any, int]] = {name: {} for name in (*LABELS, "reason")}
        self.itl_counts = histogram.Counts()
        self.itl_units: dict[Any, None] = {}
        self.spec = SpecTally()  # the OK requests' acceptance histograms and series, summed
        self._pending: list[Any] = []
        self._n = 0
        self._blocks = 0

    # ------------------------------------------------------------ feeding

    def add(self, rec: Any) -> None:
        """One record (a RequestRecord or a Rec), kept until the columns are next read."""
        self._pending.append(rec)

    def extend(self, recs: Sequence[Any]) -> None:
        """Records of this level in file order (RequestRecord or Rec: the same attributes)."""
        self._flush()
        self._extend(recs)

    def _flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            self._extend(pending)

    def _extend(
        self,
        recs: Sequence[Any],
        numbers: Floats2 | None = None,
        phases: list[Any] | None = None,
        status: list[Any] | None = None,
    ) -> None:
        """``recs``, with what the file reader took of them already (``_numbers``, their phases and
        statuses, in the same order), so that no field is read twice."""
        if phases is None:
            phases = list(map(_PHASE, recs))
        m = len(phases)
        measured = phases.count(PHASE_MEASURE)
        if measured != m:
            self.warmup += phases.count(PHASE_WARMUP)
            idx = [i for i, p in enumerate(phases) if p == PHASE_MEASURE]
            recs = [recs[i] for i in idx]
            numbers = numbers[idx] if numbers is not None else None
            status = [status[i] for i in idx] if status is not None else None
            m = measured
        if not m:
            return
        if numbers is None:
            numbers = _numbers(recs)
        if status is None:
            status = list(map(_STATUS, recs))
        for j, name in enumerate(NUMBERS):
            col = np.ascontiguousarray(numbers[:, j])
            # one value the block through (a requested length; nan: a field no request has, a rate
            # level's due time, ...): kept as (requests, value), made into an array when asked
            if np.isnan(col).all():
                self._chunks[name].append((m, math.nan))
            elif (col == col[0]).all():
                self._chunks[name].append((m, float(col[0])))
            else:
                self._chunks[name].append(col)
        del numbers
        status_codes = self._code("status", status)
        self._chunks["status"].append(status_codes)
        for name, field in LABELS.items():
            if name != "status":
                self._chunks[name].append(self._code(name, list(map(attrgetter(field), recs))))
        n_ok = status.count(OK)
        reasons: list[Any] = [None] * m
        if n_ok != m:
            for i, (st, r) in enumerate(zip(status, map(_REASON, recs), strict=True)):
                if st != OK:
                    reasons[i] = f"{st}: {r or 'no reason given'}"
        self._chunks["reason"].append(self._code("reason", reasons))
        itl = list(map(_ITL, recs))
        if set(map(type, itl)) != _RAW_ONLY:  # records not read by the decoder (the owner's, odd lines)
            itl = list(map(_raw, itl))
        ok = status_codes == self._index["status"][OK] if n_ok else np.zeros(m, dtype=bool)
        # a list of pairs is at least ``[[0,1]]``: longer than ``null`` and ``[]`` (block() and
        # _raw() leave nothing but lists and null)
        with_itl = np.flatnonzero(ok & (np.fromiter(map(len, itl), np.int64, m) > 4)).tolist()
        if with_itl:
            gaps = list(map(itl.__getitem__, with_itl))
            if not _add_flat(self.itl_counts, gaps):  # some pair is odd: merge_into's checks, pair by pair
                self.itl_counts.add([orjson.loads(bytes(x)) for x in gaps])
            self.itl_units.update(dict.fromkeys(map(_UNIT, map(recs.__getitem__, with_itl))))
        if self.itl_qs:
            self._itl_values(m, with_itl, itl)
        if any(map(any, map(_SPEC_LISTS, recs))):
            self.spec.add(recs, ok.tolist())
        self._n += m
        self._blocks += 1
        if self._blocks % _WHOLE_EVERY == 0:  # the small arrays freed make room for the next ones
            self.consolidate()

    def _code(self, name: str, col: Sequence[Any]) -> Codes:
        """The codes of a block's values of LABELS column ``name`` (a new value gets the next code)."""
        index, values = self._index[name], self.labels[name]
        first = col[0]
        if col.count(first) == len(col):  # one value the whole block through (the usual case)
            if first not in index:
                index[first] = len(values)
                values.append(first)
            return np.full(len(col), index[first], dtype=_code_type(values))
        for x in dict.fromkeys(col):  # first-seen order
            if x not in index:
                index[x] = len(values)
                values.append(x)
        return np.array(list(map(index.__getitem__, col)), dtype=_code_type(values))

    def _itl_values(self, m: int, with_itl: list[int], itl: Sequence[Any]) -> None:
        """Each request's own ITL statistic for each ITL target of the SLO (slo.request_value)."""
        vals = np.full((len(self.itl_qs), m), np.nan)
        gaps = np.zeros(m, dtype=np.int32)
        for i in with_itl:
            hist = histogram.merge([orjson.loads(bytes(itl[i]))])
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
        if not chunks:
            return np.empty(0, dtype=dtype)
        if all(type(c) is tuple for c in chunks):
            v = chunks[0][1]
            if all(c[1] == v or (math.isnan(c[1]) and math.isnan(v)) for c in chunks):
                n = sum(c[0] for c in chunks)
                chunks[:] = [(n, v)]
                return np.full(n, v, dtype=dtype)  # one value for every request: made, not kept
        if len(chunks) != 1:
            parts = [np.full(c[0], c[1]) if type(c) is tuple else c for c in chunks]
            chunks[:] = [np.concatenate(parts)]
        return chunks[0]

    def consolidate(self) -> None:
        """Every column as one array (what reading a column does for that one)."""
        for name in self._chunks:
            if self._chunks[name]:
                self._column(name, np.float64)

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
        return sum(c.nbytes for chunks in self._chunks.values() for c in chunks if type(c) is not tuple)

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
                out._chunks[name] = [(out._n, math.nan)]
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
            out.spec.merge(p.spec)
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
        self.validity = Validity()  # records breaking the client's own rules: counted, left out

    def block(self, buf: bytes | memoryview, first_no: int) -> None:
        """Whole lines of the file, the first being line ``first_no``: decoded at once, or, when some
        line is odd (torn, wrongly typed, an ``itl`` that is no list), each on its own. ``buf`` may be
        a view of the reader's buffer: the records' ``itl`` texts point into it (no copy made), so
        nothing may keep one past this call."""
        try:
            recs: list[Any] = _DECODER.decode_lines(buf)
            if recs and not _lists_or_null(list(map(_ITL, recs))):
                raise msgspec.DecodeError  # an ``itl`` that is no list (Rec keeps it as text): the checks
        except msgspec.DecodeError:
            recs = []
            for no, line in enumerate(bytes(buf).split(b"\n"), first_no):
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
            rec = _DECODER.decode(line)
            if bytes(rec.itl)[:1] in b"[n":
                return rec
        except msgspec.DecodeError:
            pass
        try:
            d = orjson.loads(line)
        except orjson.JSONDecodeError:
            self.torn.append(no)
            return None
        checked = _checked(d, self.bad_fields)
        if checked is None or any(getattr(checked, name) is None for name in _NOT_NULL):
            self.bad_records += 1
            if self.first_bad is None:
                self.first_bad = str(d)[:80]
            return None
        return checked

    def _add(self, recs: list[Any]) -> None:
        """A block of records: each number and label read once, held to the client's rules
        (validity), then appended to its level's columns."""
        numbers = _numbers(recs)
        phases, status = list(map(_PHASE, recs)), list(map(_STATUS, recs))
        verdict = broken_columns(
            status=status,
            source=list(map(_SOURCE, recs)),
            phase=phases,
            finish=list(map(FINISH, recs)),
            **{arg: numbers[:, j] for arg, j in _RULE_COLUMNS.items()},
        )
        keep = self.validity.judge(recs, verdict)
        if keep is not None:
            idx = np.flatnonzero(keep).tolist()
            if not idx:
                return
            recs, numbers, phases, status = _pick(idx, recs, numbers, phases, status)
        keys = list(map(_KEY, recs))
        if keys.count(keys[0]) == len(keys):  # a block is usually all one level
            self._group(keys[0])._extend(recs, numbers, phases, status)
            return
        for key in dict.fromkeys(keys):  # first-seen order, and a group's first key, as a dict has them
            idx = [i for i, k in enumerate(keys) if k == key]
            self._group(key)._extend(*_pick(idx, recs, numbers, phases, status))

    def _group(self, key: GroupKey) -> LevelColumns:
        cols = self.groups.get(key)
        if cols is None:
            cols = self.groups[key] = LevelColumns(self.qs)
        return cols

    def read(self, path: str, start: int = 0, stop: int | None = None) -> int:
        """The file from byte ``start`` to ``stop`` (both a line's start; None: the end) in chunks
        of whole lines, numbered from 1 at ``start``; returns the number of lines read.

        The bytes go into one buffer, read into and reused: a new megabyte for each read (and a
        second one to join it to the line left over) cost more CPU than reading it (1.4 s against
        0.1 s a GB). Nothing decoded keeps a view of it past ``block``."""
        no, have = 1, 0  # ``have``: bytes at the start of ``buf`` left over, the start of a line
        buf = bytearray(_CHUNK_BYTES)
        with safeopen.open_regular(path, None) as f:  # any size: read in chunks (readinto skips its buffer)
            f.seek(start)
            left = None if stop is None else stop - start
            while left is None or left > 0:
                if have == len(buf):  # a line longer than the buffer
                    bigger = bytearray(2 * len(buf))
                    bigger[:have] = buf
                    buf = bigger
                room = len(buf) - have if left is None else min(len(buf) - have, left)
                got = f.readinto(memoryview(buf)[have : have + room])
                if not got:
                    break
                if left is not None:
                    left -= got
                end = have + got
                cut = buf.rfind(b"\n", 0, end) + 1
                if cut:
                    whole = memoryview(buf)[:cut]
                    self.block(whole, no)
                    no += int(np.count_nonzero(np.frombuffer(whole, np.uint8) == _NEWLINE))
                    del whole
                    buf[: end - cut] = buf[cut:end]
                    have = end - cut
                else:
                    have = end
        if have:
            self.block(bytes(buf[:have]), no)
            no += 1
        return no - 1

    def merge(self, later: _Reading, lines: int) -> None:
        """The reading of the lines after this one's ``lines`` lines, as if this one had read on."""
        groups, later.groups = later.groups, {}  # held here alone: each part is let go of once joined
        for key, theirs in groups.items():
            mine = self.groups.get(key)
            self.groups[key] = theirs if mine is None else LevelColumns.concat([mine, theirs])
        self.torn += [lines + no for no in later.torn]
        self.bad_records += later.bad_records
        self.first_bad = self.first_bad if self.first_bad is not None else later.first_bad
        for name, n in later.bad_fields.items():
            self.bad_fields[name] = self.bad_fields.get(name, 0) + n
        self.validity.merge(later.validity)

    def notes(self, notes: list[str]) -> None:
        read_notes(notes, len(self.torn), self.torn, self.bad_records, self.first_bad, self.bad_fields)
        if (invalid := self.validity.note()) is not None:
            notes.append(invalid)


# A file at least this big is read by two processes (``processes=2``), each half of it.
SPLIT_BYTES = 32 << 20


def _middle(path: str) -> int | None:
    """Where the line after the middle of the file starts (None for a small file)."""
    size = os.path.getsize(path)
    if size < SPLIT_BYTES:
        return None
    with safeopen.open_regular(path, None) as f:
        f.seek(size // 2)
        f.readline()
        mid = f.tell()
    return mid if mid < size else None


def _second_half(path: str, mid: int, qs: tuple[float | None, ...]) -> _Reading:
    reading = _Reading(qs)
    reading.read(path, mid)
    return reading


def _send(reading: _Reading, f: IO[bytes]) -> None:
    """A reading into the pipe: pickled without its columns, then each column on its own, let go
    of as soon as it is written (the two processes never hold both copies of more than one)."""
    layout: list[tuple[int, str]] = []
    arrays: list[npt.NDArray[Any]] = []
    for i, cols in enumerate(reading.groups.values()):
        cols.consolidate()
        for name, chunks in cols._chunks.items():
            if chunks and type(chunks[0]) is not tuple:
                layout.append((i, name))
                arrays.append(chunks.pop())
    pickle.dump((reading, layout), f, protocol=pickle.HIGHEST_PROTOCOL)
    arrays.reverse()
    while arrays:
        pickle.dump(arrays.pop(), f, protocol=pickle.HIGHEST_PROTOCOL)
        _trim()  # (its pages back to the system now: freed on the heap, they would stay the child's)


def _receive(f: IO[bytes]) -> _Reading:
    reading, layout = pickle.load(f)
    groups = list(reading.groups.values())
    for i, name in layout:
        groups[i]._chunks[name] = [pickle.load(f)]
    return reading


def _trim() -> None:
    """Give the memory freed on the heap back to the system (the many small arrays of a read are
    freed once its columns are whole; glibc keeps them otherwise: the peak RSS would be twice)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def read_columns(
    path: str, notes: list[str] | None = None, slo: Slo | None = None, processes: int = 1
) -> dict[GroupKey, LevelColumns]:
    """records.jsonl as columns per (level, concurrency, repeat), in one streaming pass.

    The same reading as ``records.read_records``, with the same notes: a torn line is skipped, a
    field of the wrong type is dropped (an optional one) or drops its record (a required one). A
    record whose level, concurrency, repeat, t_send, t_end, e2e_s or output_tokens is null is
    skipped as one without a usable required field. ``slo``: its ITL targets need each request's
    own gaps, read as the line is (LevelColumns.itl_values). ``processes=2`` (only from a
    single-threaded process: specload.analysis.forked) reads the second half of a big file in a
    forked child meanwhile: the same columns, appended after the first half's.
    """
    qs = itl_qs(slo)
    reading = _Reading(qs)
    collecting = gc.isenabled()
    gc.disable()  # nothing read makes a reference cycle; the collector would walk each block's objects
    try:
        mid = _middle(path) if processes > 1 and forked.available() else None
        if mid is None:
            reading.read(path)
        else:
            _trim()  # (a page of free heap at the fork would be copied once either process wrote to it)
            with forked.Child[_Reading](lambda: _second_half(path, mid, qs), _send, _receive) as child:
                lines = reading.read(path, 0, mid)
                try:
                    later = child.result()
                except forked.ChildFailed:  # it failed (or sent no whole result): read its half here
                    later = _Reading(qs)
                    later.read(path, mid)
            reading.merge(later, lines)
        for cols in reading.groups.values():
            cols.consolidate()
        _trim()
    finally:
        if collecting:
            gc.enable()
    if notes is not None:
        reading.notes(notes)
    return reading.groups
