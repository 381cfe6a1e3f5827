"""records.jsonl read as columns: one pass, one level at a time, no object per request.

A run at 1,000 requests/s for an hour holds 3.6M records; as ``RequestRecord`` objects (with their
``itl`` lists) that is over 1 KB each. The report needs far less: per level, a few numbers per
request in typed arrays (``array('d')``: 8 bytes a value), counts and counters for what is only ever
counted (outcomes, reasons, token sources, requested lengths), and the ITL histograms merged as they
are read. ``read_columns`` reads the file with the same tolerance and the same notes as
``records.read_records``; ``metrics.level_stats`` computes a level's figures from its columns, with
the same results as from the records (``metrics.summarize_level`` builds columns from records).

Values are kept in file order, so sums come out bit for bit as a sum over the records would.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable
from dataclasses import fields
from operator import attrgetter, itemgetter
from typing import Any

from specload import histogram
from specload.records import (
    _NUMBERS,
    FAILED,
    OK,
    PHASE_MEASURE,
    PHASE_WARMUP,
    SHORT,
    SRC_CHUNKS,
    RequestRecord,
    _checked,
    read_notes,
)
from specload.rundir import read_jsonl

# (level, concurrency, repeat): the records of one run.json level.
GroupKey = tuple[Any, Any, Any]

# The fields a level's figures use, in the order LevelColumns.add takes them (after the key).
_KEY = ("level", "concurrency", "repeat")
_USED = _KEY + (
    "phase", "status", "reason", "http_status", "t_send", "t_first", "t_last", "t_end", "ttft_s", "e2e_s",
    "tpot_s", "decode_tok_s", "output_tokens", "output_tokens_source", "prompt_tokens", "requested_output_tokens",
    "requested_prompt_tokens", "spec_verify_ct", "itl", "itl_unit", "first_event_tokens", "t_sched",
    "request_class", "turn", "cached_tokens",
)  # fmt: skip
# Numbers the figures do arithmetic with: a record where one is null has no place on the time line
# (the object path crashed on it), so it is skipped like a record without a required field.
_NOT_NULL = _KEY + ("t_send", "t_end", "e2e_s", "output_tokens")

_ALL_FIELDS = frozenset(f.name for f in fields(RequestRecord))
_NUMBER_NAMES = tuple(_NUMBERS)
_NUM_TYPES = frozenset({int, float, type(None)})
_get_used = itemgetter(*_USED)
_get_numbers = itemgetter(*_NUMBER_NAMES)
_get_not_null = itemgetter(*_NOT_NULL)
_attrs_used = attrgetter(*_USED)


class Timeline:
    """What the time-based figures (wall, in flight, steady window, tok/s series) need of each
    measured request, one array per field, in file order.

    ``t0``/``t1``: when the first and last tokens came (``t_first``/``t_last``; a request without
    content has both at ``t_end``), ``tokens`` its output count, ``k`` what its first event carried
    (``min(n, max(1, first_event_tokens))``), ``has_first`` 1 when it had a first token."""

    __slots__ = ("t_send", "t_end", "t0", "t1", "e2e", "tokens", "k", "has_first")

    def __init__(self) -> None:
        self.t_send = array("d")
        self.t_end = array("d")
        self.t0 = array("d")
        self.t1 = array("d")
        self.e2e = array("d")
        self.tokens = array("d")  # doubles hold any count exactly; the arithmetic is the records'
        self.k = array("d")
        self.has_first = array("b")

    def __len__(self) -> int:
        return len(self.t_send)

    def add(self, t_send: float, t_first: float | None, t_last: float | None, t_end: float, e2e: float, n: float,
            first_event_tokens: float | None) -> None:  # fmt: skip
        t0 = t_first if t_first is not None else t_end
        self.t_send.append(t_send)
        self.t_end.append(t_end)
        self.t0.append(t0)
        self.t1.append(t_last if t_last is not None else t0)
        self.e2e.append(e2e)
        self.tokens.append(n)
        self.k.append(min(n, max(1, first_event_tokens or 1)))
        self.has_first.append(t_first is not None)

    def extend(self, other: Timeline) -> None:
        for name in self.__slots__:
            getattr(self, name).extend(getattr(other, name))

    @classmethod
    def of(cls, records: Iterable[RequestRecord]) -> Timeline:
        tl = cls()
        for r in records:
            tl.add(r.t_send, r.t_first, r.t_last, r.t_end, r.e2e_s, r.output_tokens, r.first_event_tokens)
        return tl

    def nbytes(self) -> int:
        return sum(getattr(self, name).buffer_info()[1] * getattr(self, name).itemsize for name in self.__slots__)


class LevelColumns:
    """One level's records as columns: what every LevelStats figure is computed from.

    Warmup requests are only counted. For measured ones: the Timeline; running counts and counters
    for outcomes, mismatches, token sources, requested lengths and reasons (insertion order = file
    order, as a Counter over the records would have); the OK requests' latencies (each array holds
    the values that exist, in file order); the merged ITL histogram and its units; the sums the
    accept length is made of.
    """

    __slots__ = (
        "warmup", "timeline", "ok", "short", "failed", "rate_limited", "output_tokens", "token_sources",
        "output_mismatch", "prompt_mismatch", "requested_output", "requested_prompt", "reasons", "input_tokens",
        "ttft", "tpot", "e2e_ok", "decode", "per_req", "prompt_sum", "prompt_n", "chunk_fallback_ok", "itl",
        "itl_units", "verify_n", "verify_sum", "verify_tokens", "lag", "ttft_sched", "e2e_sched",
        "prompt_counted", "output_got", "cached_n", "cached_sum", "cached_prompt", "groups",
    )  # fmt: skip

    def __init__(self) -> None:
        self.warmup = 0
        self.timeline = Timeline()
        self.ok = self.short = self.failed = self.rate_limited = 0
        self.output_tokens: Any = 0
        self.token_sources: dict[Any, int] = {}
        self.output_mismatch = self.prompt_mismatch = 0
        self.requested_output: Counter[Any] = Counter()
        self.requested_prompt: Counter[Any] = Counter()
        self.reasons: dict[str, int] = {}
        self.input_tokens: Any = 0  # prompt tokens of all measured requests (server count, else requested)
        self.ttft = array("d")
        self.tpot = array("d")
        self.e2e_ok = array("d")
        self.decode = array("d")
        self.per_req = array("d")  # output_tokens / e2e of OK requests with e2e > 0
        self.prompt_sum: Any = 0
        self.prompt_n = 0
        self.chunk_fallback_ok = 0
        self.itl: histogram.Hist = {}
        self.itl_units: set[Any] = set()
        self.verify_n = 0
        self.verify_sum: Any = 0
        self.verify_tokens: Any = 0
        # Rate levels: t_send - t_sched of each measured request that had a due time (how late it
        # went), and the OK requests' TTFT and E2E counted from the due time instead of the send.
        self.lag = array("d")
        self.ttft_sched = array("d")
        self.e2e_sched = array("d")
        # The workload (specload.mixstats): lengths the server counted and returned (not-failed
        # requests), the prefix cache's share of the prompts of those that said, and the same
        # columns per request class and per conversation turn (keys ("class", name), ("turn", k)).
        self.prompt_counted: Counter[Any] = Counter()
        self.output_got: Counter[Any] = Counter()
        self.cached_n = 0
        self.cached_sum: Any = 0
        self.cached_prompt: Any = 0
        self.groups: dict[tuple[str, Any], LevelColumns] = {}

    @property
    def sent(self) -> int:
        return len(self.timeline)

    def add(self, phase: Any, status: Any, reason: Any, http_status: Any, t_send: float, t_first: float | None,
            t_last: float | None, t_end: float, ttft: float | None, e2e: float, tpot: float | None,
            decode: float | None, n: Any, source: Any, prompt: Any, req_out: Any, req_prompt: Any, verify: Any,
            itl: Any, itl_unit: Any, first_event_tokens: Any, t_sched: float | None = None, request_class: Any = None,
            turn: Any = None, cached: Any = None) -> None:  # fmt: skip
        """One record (its fields in ``_USED`` order, after the level key)."""
        if phase != PHASE_MEASURE:
            if phase == PHASE_WARMUP:
                self.warmup += 1
            return
        if request_class is not None or turn is not None:
            args = (phase, status, reason, http_status, t_send, t_first, t_last, t_end, ttft, e2e, tpot, decode, n,
                    source, prompt, req_out, req_prompt, verify, itl, itl_unit, first_event_tokens, t_sched, None, None,
                    cached)
            for key in (("class", request_class), ("turn", turn)):
                if key[1] is not None:
                    group = self.groups.get(key)
                    if group is None:
                        group = self.groups[key] = LevelColumns()
                    group.add(*args)
        if status != FAILED:
            self.output_got[n] += 1
            if prompt is not None:
                self.prompt_counted[prompt] += 1
                if cached is not None:
                    self.cached_n += 1
                    self.cached_sum += cached
                    self.cached_prompt += prompt
        self.timeline.add(t_send, t_first, t_last, t_end, e2e, n, first_event_tokens)
        self.output_tokens += max(n, 0)
        self.token_sources[source] = self.token_sources.get(source, 0) + 1
        if status != FAILED and n != req_out:
            self.output_mismatch += 1
        if prompt is not None and prompt != req_prompt:
            self.prompt_mismatch += 1
        self.requested_output[req_out] += 1
        self.requested_prompt[req_prompt] += 1
        self.input_tokens += prompt if prompt is not None else req_prompt
        lag = None if t_sched is None else t_send - t_sched
        if lag is not None:
            self.lag.append(lag)
        if status != OK:
            key = f"{status}: {reason or 'no reason given'}"
            self.reasons[key] = self.reasons.get(key, 0) + 1
            if status == SHORT:
                self.short += 1
            elif status == FAILED:
                self.failed += 1
                if http_status == 429:
                    self.rate_limited += 1
            return
        self.ok += 1
        if ttft is not None:
            self.ttft.append(ttft)
        if tpot is not None:
            self.tpot.append(tpot)
        self.e2e_ok.append(e2e)
        if lag is not None:
            if ttft is not None:
                self.ttft_sched.append(ttft + lag)
            self.e2e_sched.append(e2e + lag)
        if decode is not None:
            self.decode.append(decode)
        if e2e > 0:
            self.per_req.append(n / e2e)
        if prompt is not None:
            self.prompt_sum += prompt
            self.prompt_n += 1
        if source == SRC_CHUNKS:
            self.chunk_fallback_ok += 1
        if itl:
            histogram.merge_into(self.itl, itl)
            self.itl_units.add(itl_unit)
        if verify is not None and verify > 0:
            self.verify_n += 1
            self.verify_sum += verify
            self.verify_tokens += n

    def add_record(self, r: RequestRecord) -> None:
        self.add(*_attrs_used(r)[len(_KEY):])

    @classmethod
    def of(cls, records: Iterable[RequestRecord]) -> LevelColumns:
        cols = cls()
        for r in records:
            cols.add_record(r)
        return cols

    @classmethod
    def concat(cls, parts: list[LevelColumns]) -> LevelColumns:
        """Several groups as one level (run.json levels without an index), one group after the other."""
        out = cls()
        for p in parts:
            out.warmup += p.warmup
            out.timeline.extend(p.timeline)
            for name in ("ok", "short", "failed", "rate_limited", "output_tokens", "output_mismatch",
                         "prompt_mismatch", "input_tokens", "prompt_sum", "prompt_n", "chunk_fallback_ok",
                         "verify_n", "verify_sum", "verify_tokens", "cached_n", "cached_sum", "cached_prompt"):  # fmt: skip
                setattr(out, name, getattr(out, name) + getattr(p, name))
            out.prompt_counted.update(p.prompt_counted)
            out.output_got.update(p.output_got)
            for key, group in p.groups.items():
                mine = out.groups.get(key)
                out.groups[key] = group if mine is None else cls.concat([mine, group])
            for name in ("token_sources", "reasons"):
                mine = getattr(out, name)
                for key, n in getattr(p, name).items():
                    mine[key] = mine.get(key, 0) + n
            out.requested_output.update(p.requested_output)
            out.requested_prompt.update(p.requested_prompt)
            for name in ("ttft", "tpot", "e2e_ok", "decode", "per_req", "lag", "ttft_sched", "e2e_sched"):
                getattr(out, name).extend(getattr(p, name))
            for b, n in p.itl.items():
                out.itl[b] = out.itl.get(b, 0) + n
            out.itl_units |= p.itl_units
        return out

    def nbytes(self) -> int:
        """Bytes held in arrays (what grows with the number of requests)."""
        arrays = (self.ttft, self.tpot, self.e2e_ok, self.decode, self.per_req, self.lag, self.ttft_sched,
                  self.e2e_sched)  # fmt: skip
        return self.timeline.nbytes() + sum(a.buffer_info()[1] * a.itemsize for a in arrays)


def group_records(records: Iterable[RequestRecord]) -> dict[GroupKey, LevelColumns]:
    """Records as columns per (level, concurrency, repeat), in first-seen order."""
    groups: dict[GroupKey, LevelColumns] = {}
    for r in records:
        key = (r.level, r.concurrency, r.repeat)
        cols = groups.get(key)
        if cols is None:
            cols = groups[key] = LevelColumns()
        cols.add_record(r)
    return groups


def read_columns(path: str, notes: list[str] | None = None) -> dict[GroupKey, LevelColumns]:
    """records.jsonl as columns per (level, concurrency, repeat), in one streaming pass.

    The same reading as ``records.read_records``, with the same notes: a torn line is skipped, a
    field of the wrong type is dropped (an optional one) or drops its record (a required one). A
    record whose level, concurrency, repeat, t_send, t_end, e2e_s or output_tokens is null is
    skipped as one without a usable required field. Nothing per record is kept but its columns.
    """
    groups: dict[GroupKey, LevelColumns] = {}
    torn: list[int] = []
    bad_records = 0
    first_bad: str | None = None
    bad_fields: dict[str, int] = {}
    num_types = _NUM_TYPES
    all_fields = _ALL_FIELDS
    get_used, get_numbers, get_not_null = _get_used, _get_numbers, _get_not_null
    for d in read_jsonl(path, torn):
        if (
            type(d) is dict
            and d.keys() >= all_fields
            and num_types.issuperset(map(type, get_numbers(d)))
            and None not in get_not_null(d)
            and (d["itl"] is None or type(d["itl"]) is list)
        ):
            vals = get_used(d)
        else:  # the slow path: exactly read_records' checks, then ours
            rec = _checked(d, bad_fields)
            if rec is None or any(getattr(rec, name) is None for name in _NOT_NULL):
                bad_records += 1
                if first_bad is None:
                    first_bad = str(d)[:80]
                continue
            vals = _attrs_used(rec)
        key = vals[:3]
        cols = groups.get(key)
        if cols is None:
            cols = groups[key] = LevelColumns()
        cols.add(*vals[3:])
    if notes is not None:
        read_notes(notes, len(torn), torn, bad_records, first_bad, bad_fields)
    return groups
