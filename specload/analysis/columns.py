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

import gc
import os
import pickle
import struct
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import MISSING, fields
from functools import reduce
from itertools import chain, compress, count, repeat
from operator import add, attrgetter, eq, gt, is_, is_not, itemgetter, ne, truediv
from typing import IO, Any

import orjson

from specload.analysis import forked
from specload.core import histogram
from specload.core.records import (
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
from specload.core.slo import Slo, SloTally

# (level, concurrency, repeat): the records of one run.json level.
GroupKey = tuple[Any, Any, Any]
Col = Sequence[Any]  # one field of many records, in file order (a list or a tuple)

# The fields a level's figures use, in the order LevelColumns.add takes them (after the key).
_KEY = ("level", "concurrency", "repeat")
_USED = _KEY + (
    "phase",
    "status",
    "reason",
    "http_status",
    "t_send",
    "t_first",
    "t_last",
    "t_end",
    "ttft_s",
    "e2e_s",
    "tpot_s",
    "decode_tok_s",
    "output_tokens",
    "output_tokens_source",
    "prompt_tokens",
    "requested_output_tokens",
    "requested_prompt_tokens",
    "spec_verify_ct",
    "itl",
    "itl_unit",
    "first_event_tokens",
    "t_sched",
    "request_class",
    "turn",
    "cached_tokens",
)
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

# A block of records is taken apart by one itemgetter over every field (the used ones first) and
# turned into columns by one zip; the checks of ``_plain`` then run column by column. A block whose
# records all have the same keys in the same order (as RecordWriter writes them, or an older
# specload did, without the fields added since) is taken apart faster still: one zip over their
# values, a missing field's default as its column (``_layout``).
_ORDER = _USED + tuple(sorted(_ALL_FIELDS - set(_USED)))
_get_ordered = itemgetter(*_ORDER)
# Fields a record may lack (written by an older specload): what ``RequestRecord.from_dict`` gives them.
_DEFAULTS = {f.name: f.default for f in fields(RequestRecord) if f.default is not MISSING}
_LAYOUTS: dict[tuple[Any, ...], tuple[int, ...] | None] = {}
_GETTERS: dict[tuple[Any, ...], Any] = {}
_NUMBER_AT = tuple(_ORDER.index(name) for name in _NUMBER_NAMES)
_NOT_NULL_AT = frozenset(_ORDER.index(name) for name in _NOT_NULL)
_ITL_COL = _ORDER.index("itl")
_ITL_TYPES = frozenset({list, type(None)})
# What an SLO tally takes of a record (SloTally.add_block's arguments), as places in _USED after the key.
_TALLY_AT = tuple(
    _USED.index(name) - len(_KEY)
    for name in ("status", "t_send", "t_end", "output_tokens", "ttft_s", "tpot_s", "e2e_s", "itl")
)
# Lines parsed and added at a time: enough for each column pass to pay for itself, few enough for
# the block's parsed records to stay in the CPU cache.
BLOCK_LINES = 128
_CHUNK_BYTES = 1 << 20
# A file at least this big is read by two processes (``processes=2``), each half of it.
SPLIT_BYTES = 32 << 20


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

    def add(
        self,
        t_send: float,
        t_first: float | None,
        t_last: float | None,
        t_end: float,
        e2e: float,
        n: float,
        first_event_tokens: float | None,
    ) -> None:
        t0 = t_first if t_first is not None else t_end
        self.t_send.append(t_send)
        self.t_end.append(t_end)
        self.t0.append(t0)
        self.t1.append(t_last if t_last is not None else t0)
        self.e2e.append(e2e)
        self.tokens.append(n)
        self.k.append(min(n, max(1, first_event_tokens or 1)))
        self.has_first.append(t_first is not None)

    def add_block(
        self,
        t_send: Col,
        t_first: Col,
        t_last: Col,
        t_end: Col,
        e2e: Col,
        n: Col,
        first_event_tokens: Col,
        n_min: Any,
    ) -> None:
        """``add`` for many requests at once (columns of equal length, in file order; ``n_min``: min(n))."""
        m = len(t_send)
        _doubles(self.t_send, t_send)
        _doubles(self.t_end, t_end)
        holes = _holes(t_first)
        t0 = _filled(t_first, holes, t_end)
        _doubles(self.t0, t0)
        _doubles(self.t1, _filled(t_last, _holes(t_last), t0))
        _doubles(self.e2e, e2e)
        _doubles(self.tokens, n)
        # k = min(n, max(1, first_event_tokens or 1)); the max is 1 unless some first event carried more
        fe = first_event_tokens
        if fe.count(1) == m or max(filter(None, fe), default=1) <= 1:
            if n_min >= 1:
                self.k.frombytes(_ONE * m)
            else:
                _doubles(self.k, list(map(min, n, repeat(1))))
        else:  # ``or 1`` only changes None (max(1, 0) is 1 anyway)
            fe = _filled(fe, _holes(fe), [1] * m)
            _doubles(self.k, list(map(min, n, map(max, repeat(1), fe))))
        flags = bytearray(b"\x01") * m  # has_first
        for i in holes:
            flags[i] = 0
        self.has_first.frombytes(flags)

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
        return sum(
            getattr(self, name).buffer_info()[1] * getattr(self, name).itemsize for name in self.__slots__
        )


class LevelColumns:
    """One level's records as columns: what every LevelStats figure is computed from.

    Warmup requests are only counted. For measured ones: the Timeline; running counts and counters
    for outcomes, mismatches, token sources, requested lengths and reasons (insertion order = file
    order, as a Counter over the records would have); the OK requests' latencies (each array holds
    the values that exist, in file order); the merged ITL histogram and its units; the sums the
    accept length is made of.
    """

    __slots__ = (
        "warmup",
        "timeline",
        "ok",
        "short",
        "failed",
        "rate_limited",
        "output_tokens",
        "token_sources",
        "output_mismatch",
        "prompt_mismatch",
        "requested_output",
        "requested_prompt",
        "reasons",
        "input_tokens",
        "ttft",
        "tpot",
        "e2e_ok",
        "decode",
        "per_req",
        "prompt_sum",
        "prompt_n",
        "chunk_fallback_ok",
        "itl_counts",
        "itl_units",
        "verify_n",
        "verify_sum",
        "verify_tokens",
        "lag",
        "ttft_sched",
        "e2e_sched",
        "prompt_counted",
        "output_got",
        "cached_n",
        "cached_sum",
        "cached_prompt",
        "groups",
    )

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
        self.itl_counts = histogram.Counts()  # the requests' ITL histograms, summed
        self.itl_units: set[Any] = set()
        self.verify_n = 0
        self.verify_sum: Any = 0
        self.verify_tokens: Any = 0
        # Rate levels: t_send - t_sched of each measured request that had a due time (how late it
        # went), and the OK requests' TTFT and E2E counted from the due time instead of the send.
        self.lag = array("d")
        self.ttft_sched = array("d")
        self.e2e_sched = array("d")
        # The workload (specload.analysis.mixstats): lengths the server counted and returned (not-failed
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

    @property
    def itl(self) -> histogram.Hist:
        """The merged ITL histogram (``histogram.merge`` of the OK requests' ``itl``)."""
        return self.itl_counts.hist()

    def add(
        self,
        phase: Any,
        status: Any,
        reason: Any,
        http_status: Any,
        t_send: float,
        t_first: float | None,
        t_last: float | None,
        t_end: float,
        ttft: float | None,
        e2e: float,
        tpot: float | None,
        decode: float | None,
        n: Any,
        source: Any,
        prompt: Any,
        req_out: Any,
        req_prompt: Any,
        verify: Any,
        itl: Any,
        itl_unit: Any,
        first_event_tokens: Any,
        t_sched: float | None = None,
        request_class: Any = None,
        turn: Any = None,
        cached: Any = None,
    ) -> None:
        """One record (its fields in ``_USED`` order, after the level key)."""
        if phase != PHASE_MEASURE:
            if phase == PHASE_WARMUP:
                self.warmup += 1
            return
        if request_class is not None or turn is not None:
            args = (
                phase,
                status,
                reason,
                http_status,
                t_send,
                t_first,
                t_last,
                t_end,
                ttft,
                e2e,
                tpot,
                decode,
                n,
                source,
                prompt,
                req_out,
                req_prompt,
                verify,
                itl,
                itl_unit,
                first_event_tokens,
                t_sched,
                None,
                None,
                cached,
            )
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
            self._outcome(status, reason, http_status)
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
            self.itl_counts.add([itl])
            self.itl_units.add(itl_unit)
        if verify is not None and verify > 0:
            self.verify_n += 1
            self.verify_sum += verify
            self.verify_tokens += n

    def add_record(self, r: RequestRecord) -> None:
        self.add(*_attrs_used(r)[len(_KEY) :])

    def add_block(
        self,
        phase: Col,
        status: Col,
        reason: Col,
        http_status: Col,
        t_send: Col,
        t_first: Col,
        t_last: Col,
        t_end: Col,
        ttft: Col,
        e2e: Col,
        tpot: Col,
        decode: Col,
        n: Col,
        source: Col,
        prompt: Col,
        req_out: Col,
        req_prompt: Col,
        verify: Col,
        itl: Col,
        itl_unit: Col,
        first_event_tokens: Col,
        t_sched: Col,
        request_class: Col,
        turn: Col,
        cached: Col,
    ) -> None:
        """``add`` for many records at once: one column per argument (of equal length, in file order),
        numbers already checked (ints, floats or None; not None where ``_NOT_NULL`` says so).

        Every figure comes out as ``add`` makes it, with a pass over a column instead of a step per
        record: arrays are extended in file order, a sum is the same additions in the same order
        (``_sum``), counters are updated in file order (so their first-seen order is ``add``'s); the
        non-OK records, a few, go through ``add``'s own steps.
        """
        m = len(phase)
        measured = phase.count(PHASE_MEASURE)
        if measured != m:
            self.warmup += phase.count(PHASE_WARMUP)
            if not measured:
                return
            keep = list(map(eq, phase, repeat(PHASE_MEASURE)))
            (
                phase,
                status,
                reason,
                http_status,
                t_send,
                t_first,
                t_last,
                t_end,
                ttft,
                e2e,
                tpot,
                decode,
                n,
                source,
                prompt,
                req_out,
                req_prompt,
                verify,
                itl,
                itl_unit,
                first_event_tokens,
                t_sched,
                request_class,
                turn,
                cached,
            ) = [
                list(compress(col, keep))
                for col in (
                    phase,
                    status,
                    reason,
                    http_status,
                    t_send,
                    t_first,
                    t_last,
                    t_end,
                    ttft,
                    e2e,
                    tpot,
                    decode,
                    n,
                    source,
                    prompt,
                    req_out,
                    req_prompt,
                    verify,
                    itl,
                    itl_unit,
                    first_event_tokens,
                    t_sched,
                    request_class,
                    turn,
                    cached,
                )
            ]
            m = measured
        if request_class.count(None) != m or turn.count(None) != m:
            cols = (
                phase,
                status,
                reason,
                http_status,
                t_send,
                t_first,
                t_last,
                t_end,
                ttft,
                e2e,
                tpot,
                decode,
                n,
                source,
                prompt,
                req_out,
                req_prompt,
                verify,
                itl,
                itl_unit,
                first_event_tokens,
                t_sched,
            )
            nones = [None] * m
            for kind, names in (("class", request_class), ("turn", turn)):
                for name in dict.fromkeys(names):  # first-seen order, as add makes the groups
                    if name is None:
                        continue
                    mine = list(map(eq, names, repeat(name)))
                    k = sum(mine)
                    group = self.groups.get((kind, name))
                    if group is None:
                        group = self.groups[(kind, name)] = LevelColumns()
                    group.add_block(
                        *(list(compress(col, mine)) for col in cols),
                        nones[:k],
                        nones[:k],
                        list(compress(cached, mine)),
                    )
        self._workload(status, n, prompt, cached)
        n_min = min(n)
        self.timeline.add_block(t_send, t_first, t_last, t_end, e2e, n, first_event_tokens, n_min)
        self.output_tokens = _sum(n if n_min >= 0 else list(map(max, n, repeat(0))), self.output_tokens)
        _count_into(self.token_sources, source)
        _count_into(self.requested_output, req_out)
        _count_into(self.requested_prompt, req_prompt)
        self.input_tokens = _sum(_filled(prompt, _holes(prompt), req_prompt), self.input_tokens)
        scheduled = t_sched.count(None) != m  # some request had a due time (a rate level)
        if scheduled:
            lag_of = [None if due is None else sent - due for sent, due in zip(t_send, t_sched, strict=True)]
            _doubles(self.lag, _present(lag_of))
        if status.count(OK) != m:
            not_ok = list(compress(count(), map(ne, status, repeat(OK))))
            for i in not_ok:
                self._not_ok(status[i], reason[i], http_status[i], n[i], prompt[i], req_out[i], req_prompt[i])
            # the OK records: the stretches between the others
            runs = [slice(a + 1, b) for a, b in zip([-1, *not_ok], [*not_ok, m], strict=True) if b > a + 1]
            if not runs:
                return
            take = itemgetter(*runs)
            lags = lag_of if scheduled else t_sched
            if len(runs) == 1:
                (
                    ttft,
                    e2e,
                    tpot,
                    decode,
                    n,
                    source,
                    prompt,
                    req_out,
                    req_prompt,
                    verify,
                    itl,
                    itl_unit,
                    lags,
                ) = (
                    take(col)
                    for col in (
                        ttft,
                        e2e,
                        tpot,
                        decode,
                        n,
                        source,
                        prompt,
                        req_out,
                        req_prompt,
                        verify,
                        itl,
                        itl_unit,
                        lags,
                    )
                )
            else:
                (
                    ttft,
                    e2e,
                    tpot,
                    decode,
                    n,
                    source,
                    prompt,
                    req_out,
                    req_prompt,
                    verify,
                    itl,
                    itl_unit,
                    lags,
                ) = (
                    list(chain.from_iterable(take(col)))
                    for col in (
                        ttft,
                        e2e,
                        tpot,
                        decode,
                        n,
                        source,
                        prompt,
                        req_out,
                        req_prompt,
                        verify,
                        itl,
                        itl_unit,
                        lags,
                    )
                )
            if scheduled:
                lag_of = lags
            m = len(e2e)
        self.ok += m
        if n != req_out:  # the usual case, every count as asked, costs one list comparison
            self.output_mismatch += sum(map(ne, n, req_out))
        if prompt != req_prompt:  # prompt is not None and prompt != req_prompt
            differs = list(compress(prompt, map(ne, prompt, req_prompt)))
            self.prompt_mismatch += len(differs) - differs.count(None)
        _doubles(self.ttft, _present(ttft))
        _doubles(self.tpot, _present(tpot))
        _doubles(self.e2e_ok, e2e)
        if scheduled:
            _doubles(
                self.ttft_sched,
                [a + b for a, b in zip(ttft, lag_of, strict=True) if a is not None and b is not None],
            )
            _doubles(self.e2e_sched, [a + b for a, b in zip(e2e, lag_of, strict=True) if b is not None])
        _doubles(self.decode, _present(decode))
        if min(e2e) > 0:
            _doubles(self.per_req, list(map(truediv, n, e2e)))
        else:
            positive = list(map(gt, e2e, repeat(0)))
            _doubles(self.per_req, list(map(truediv, compress(n, positive), compress(e2e, positive))))
        prompts = _present(prompt)
        self.prompt_sum = _sum(prompts, self.prompt_sum)
        self.prompt_n += len(prompts)
        self.chunk_fallback_ok += source.count(SRC_CHUNKS)
        with_itl = list(compress(itl, itl))  # the requests with at least one pair
        if with_itl:
            self.itl_counts.add(with_itl)
            self.itl_units.update(compress(itl_unit, itl))
        if verify.count(None) != m:  # verify is not None and verify > 0
            used = list(map(gt, _filled(verify, _holes(verify), [0] * m), repeat(0)))
            self.verify_n += sum(used)
            self.verify_sum = _sum(list(compress(verify, used)), self.verify_sum)
            self.verify_tokens = _sum(list(compress(n, used)), self.verify_tokens)

    def _workload(self, status: Col, n: Col, prompt: Col, cached: Col) -> None:
        """``add``'s counts of the lengths the server counted and of the prefix cache, for a block."""
        if status.count(FAILED):
            got = list(map(ne, status, repeat(FAILED)))
            n, prompt, cached = (
                list(compress(n, got)),
                list(compress(prompt, got)),
                list(compress(cached, got)),
            )
            if not n:
                return
        _count_into(self.output_got, n)
        if prompt.count(None) == len(prompt):
            return
        counted = list(map(is_not, prompt, repeat(None)))
        prompt, cached = list(compress(prompt, counted)), list(compress(cached, counted))
        _count_into(self.prompt_counted, prompt)
        if cached.count(None) != len(cached):
            said = list(map(is_not, cached, repeat(None)))
            cached, prompt = list(compress(cached, said)), list(compress(prompt, said))
            self.cached_n += len(cached)
            self.cached_sum = _sum(cached, self.cached_sum)
            self.cached_prompt = _sum(prompt, self.cached_prompt)

    def _not_ok(
        self, status: Any, reason: Any, http_status: Any, n: Any, prompt: Any, req_out: Any, req_prompt: Any
    ) -> None:
        """What ``add`` counts of a record that is not OK (its mismatches, reason and outcome)."""
        if status != FAILED and n != req_out:
            self.output_mismatch += 1
        if prompt is not None and prompt != req_prompt:
            self.prompt_mismatch += 1
        self._outcome(status, reason, http_status)

    def _outcome(self, status: Any, reason: Any, http_status: Any) -> None:
        """A record that is not OK: its reason and its kind (short, failed, rate-limited) counted."""
        key = f"{status}: {reason or 'no reason given'}"
        self.reasons[key] = self.reasons.get(key, 0) + 1
        if status == SHORT:
            self.short += 1
        elif status == FAILED:
            self.failed += 1
            if http_status == 429:
                self.rate_limited += 1

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
            out.take(p)
        return out

    _SUMS = (
        "output_tokens",
        "input_tokens",
        "prompt_sum",
        "verify_sum",
        "verify_tokens",
        "cached_sum",
        "cached_prompt",
    )

    def sums_are_ints(self) -> bool:
        """Every sum an int: adding another part's sums to these is then what adding its values one
        at a time would give (a float sum depends on where its additions start)."""
        return all(type(getattr(self, name)) is int for name in self._SUMS) and all(
            g.sums_are_ints() for g in self.groups.values()
        )

    def take(self, p: LevelColumns) -> None:
        """Append the records of ``p`` (which come after these) to these columns."""
        for owner, name in self.arrays():
            getattr(owner, name).extend(getattr(p.timeline if owner is self.timeline else p, name))
        self.take_counts(p)

    def take_counts(self, p: LevelColumns) -> None:
        """``take`` but for the arrays."""
        self.warmup += p.warmup
        for name in (
            "ok",
            "short",
            "failed",
            "rate_limited",
            "output_tokens",
            "output_mismatch",
            "prompt_mismatch",
            "input_tokens",
            "prompt_sum",
            "prompt_n",
            "chunk_fallback_ok",
            "verify_n",
            "verify_sum",
            "verify_tokens",
            "cached_n",
            "cached_sum",
            "cached_prompt",
        ):
            setattr(self, name, getattr(self, name) + getattr(p, name))
        self.prompt_counted.update(p.prompt_counted)
        self.output_got.update(p.output_got)
        for key, group in p.groups.items():  # whole, arrays too (they travel pickled, not as arrays())
            mine = self.groups.get(key)
            if mine is None:
                self.groups[key] = group
            else:
                mine.take(group)
        for name in ("token_sources", "reasons"):
            mine = getattr(self, name)
            for key, n in getattr(p, name).items():
                mine[key] = mine.get(key, 0) + n
        self.requested_output.update(p.requested_output)
        self.requested_prompt.update(p.requested_prompt)
        self.itl_counts.merge(p.itl_counts)
        self.itl_units |= p.itl_units

    def arrays(self) -> list[tuple[Any, str]]:
        """Every array of these columns, as (owner, attribute name)."""
        return [(self.timeline, name) for name in Timeline.__slots__] + [
            (self, name)
            for name in ("ttft", "tpot", "e2e_ok", "decode", "per_req", "lag", "ttft_sched", "e2e_sched")
        ]

    def nbytes(self) -> int:
        """Bytes held in arrays (what grows with the number of requests)."""
        arrays = (
            self.ttft,
            self.tpot,
            self.e2e_ok,
            self.decode,
            self.per_req,
            self.lag,
            self.ttft_sched,
            self.e2e_sched,
        )
        return self.timeline.nbytes() + sum(a.buffer_info()[1] * a.itemsize for a in arrays)


_ONE = array("d", [1.0]).tobytes()
_PACKERS: dict[int, struct.Struct] = {}


def _doubles(arr: array, xs: Sequence[Any]) -> None:
    """``arr.extend(xs)`` for an ``array('d')`` and numbers (array's own extend converts each value
    through PyArg_Parse, several times slower than struct's packing; both are PyFloat_AsDouble)."""
    n = len(xs)
    if n:
        packer = _PACKERS.get(n)
        if packer is None:
            if len(_PACKERS) > 4096:
                _PACKERS.clear()
            packer = _PACKERS[n] = struct.Struct(f"{n}d")
        arr.frombytes(packer.pack(*xs))


def _no_none(xs: Sequence[Any]) -> bool:
    """True when ``xs``, numbers or None, holds no None (one sum: a tenth of a scan comparing to None)."""
    try:
        sum(xs)
    except (TypeError, OverflowError):  # OverflowError: a huge int and a float; look closer
        return None not in xs
    return True


def _holes(xs: Sequence[Any]) -> list[int]:
    """Where ``xs`` (numbers or None) holds None."""
    return [] if _no_none(xs) else list(compress(count(), map(is_, xs, repeat(None))))


def _filled(xs: Sequence[Any], holes: list[int], others: Sequence[Any]) -> Sequence[Any]:
    """``xs`` with the None at ``holes`` replaced by the value of ``others`` at the same place."""
    if not holes:
        return xs
    out = list(xs)
    for i in holes:
        out[i] = others[i]
    return out


def _present(xs: Sequence[Any]) -> Sequence[Any]:
    """The values of ``xs`` (numbers or None) that are not None, in order."""
    return xs if _no_none(xs) else list(compress(xs, map(is_not, xs, repeat(None))))


def _sum(xs: Sequence[Any], total: Any) -> Any:
    """``total + x`` for each x in turn: a float sum depends on the order of its additions (and
    ``sum()`` compensates from Python 3.12 on), an int sum does not, so ints are summed at once."""
    s = sum(xs)
    if type(s) is int and type(total) is int:  # every x an int (sum() of a float is a float)
        return total + s
    return reduce(add, xs, total)


def _count_into(counts: dict[Any, int], xs: Sequence[Any]) -> None:
    """``counts[x] += 1`` for each x in turn (a dict's first-seen order is kept)."""
    first = xs[0]
    if xs.count(first) == len(xs):  # one value (the usual case)
        counts[first] = counts.get(first, 0) + len(xs)
        return
    for key, n in Counter(xs).items():
        counts[key] = counts.get(key, 0) + n


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


def _layout(keys: tuple[Any, ...]) -> tuple[int, ...] | None:
    """Where each of ``_ORDER`` is among a record's ``keys`` (-1: absent, its default taken), or
    None when a field without a default is absent (the record-by-record checks drop such a record).
    Unknown keys are skipped, as ``RequestRecord.from_dict`` skips them."""
    layout = _LAYOUTS.get(keys, False)
    if layout is False:
        at = {k: i for i, k in enumerate(keys)}
        found = tuple(at.get(name, -1) for name in _ORDER)
        ok = all(i >= 0 or name in _DEFAULTS for i, name in zip(found, _ORDER, strict=True))
        layout = found if ok and len(at) == len(keys) else None
        if len(_LAYOUTS) > 64:
            _LAYOUTS.clear()
        _LAYOUTS[keys] = layout
    return layout  # type: ignore[return-value]


def _getter(first: dict[Any, Any]) -> Any:
    """An itemgetter of the record's keys (the same key objects), made once per layout."""
    keys = tuple(first)
    getter = _GETTERS.get(keys)
    if getter is None:
        if len(_GETTERS) > 64:
            _GETTERS.clear()
        getter = _GETTERS[keys] = itemgetter(*keys) if len(keys) > 1 else lambda d: (d[keys[0]],)
    return getter


def _numbers(col: Sequence[Any]) -> bool:
    """Every value of ``col`` an int, a float or None (a bool is not: a JSON true is no number).
    One value's type the whole column through (the usual case) is one count of its types; a column
    of None (a field RecordWriter writes but the run did not use) one count of the column."""
    if col[0] is None and col.count(None) == len(col):
        return True
    types = list(map(type, col))
    kind = types[0]
    return (types.count(kind) == len(types) and kind in _NUM_TYPES) or _NUM_TYPES.issuperset(types)


def _plain(d: Any) -> bool:
    """A record that needs no repair: a dict with every field, numbers as numbers, the required ones not
    null, ``itl`` a list or null. Anything else goes through ``records._checked``."""
    return (
        type(d) is dict
        and d.keys() >= _ALL_FIELDS
        and _NUM_TYPES.issuperset(map(type, _get_numbers(d)))
        and None not in _get_not_null(d)
        and (d["itl"] is None or type(d["itl"]) is list)
    )


class _Reading:
    """One pass over records.jsonl (or a stretch of it): the groups, and what the notes will say;
    with an SLO, each group's measured requests judged against it as well (``tallies``)."""

    def __init__(self, slo: Slo | None = None) -> None:
        self.groups: dict[GroupKey, LevelColumns] = {}
        self.slo = slo
        self.tallies: dict[GroupKey, SloTally] = {}  # created at a group's first measured request
        self.torn: list[int] = []  # numbers of the unreadable lines
        self.bad_records = 0
        self.first_bad: str | None = None
        self.bad_fields: dict[str, int] = {}

    def lines(self, lines: list[bytes], first_no: int) -> None:
        """A block of lines, the first being line ``first_no`` of the file."""
        try:
            values = list(map(orjson.loads, lines))
        except orjson.JSONDecodeError:  # a blank, torn or malformed line in the block: read_jsonl's way
            values = []
            for no, line in enumerate(lines, first_no):
                line = line.strip()
                if not line:
                    continue
                try:
                    values.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    self.torn.append(no)
        if values:
            self.values(values)

    def values(self, values: list[Any]) -> None:
        """Parsed lines in file order: checked a column at a time when all are plain records (the
        usual case), else one at a time exactly as ``records.read_records`` checks them."""
        cols = self._columns(values)
        if cols is None:
            rows = []
            for d in values:
                if _plain(d):
                    rows.append(_get_used(d))
                    continue
                rec = _checked(d, self.bad_fields)
                if rec is None or any(getattr(rec, name) is None for name in _NOT_NULL):
                    self.bad_records += 1
                    if self.first_bad is None:
                        self.first_bad = str(d)[:80]
                    continue
                rows.append(_attrs_used(rec))
            if not rows:
                return
            cols = [list(col) for col in zip(*rows, strict=True)]
        self._add(cols)

    def _columns(self, values: list[Any]) -> list[Sequence[Any]] | None:
        """The block's columns (``_ORDER``) when every record is plain, else None."""
        first = values[0]
        layout = _layout(tuple(first)) if type(first) is dict else None
        rows = None
        if layout is not None:
            # every record a dict holding the first one's keys (a list, string or number makes the
            # getter raise TypeError) and as many keys: the same keys, so its values taken by key are
            # one row, whatever their order. The getter asks for the first record's own key objects
            # (orjson gives every record the same ones): a lookup by another equal string is slower.
            try:
                rows = list(map(_getter(first), values))
            except (KeyError, TypeError):
                rows = None
            if rows is not None and list(map(len, values)).count(len(first)) != len(values):
                rows = None
        if rows is not None:
            written = list(zip(*rows, strict=True))
            m = len(values)
            cols = [
                written[i] if i >= 0 else (_DEFAULTS[name],) * m
                for i, name in zip(layout, _ORDER, strict=True)
            ]  # type: ignore[arg-type]
            numbers = [cols[i] for i in _NUMBER_AT if layout[i] >= 0]  # type: ignore[index]  # a default is a number
        else:
            if set(map(type, values)) != {dict}:
                return None
            try:
                cols = [list(col) for col in zip(*map(_get_ordered, values), strict=True)]
            except KeyError:
                return None
            numbers = [cols[i] for i in _NUMBER_AT]
        if (
            all(map(_numbers, numbers))
            and all(_no_none(cols[i]) for i in _NOT_NULL_AT)
            and _ITL_TYPES.issuperset(map(type, cols[_ITL_COL]))
        ):
            return cols
        return None

    def _add(self, cols: Sequence[Sequence[Any]]) -> None:
        """Columns of records (``_ORDER``) to their groups; a block is usually all one level."""
        level, concurrency, repeat_ = cols[0], cols[1], cols[2]
        used = cols[len(_KEY) : len(_USED)]
        m = len(level)
        if all(col.count(col[0]) == m for col in (level, concurrency, repeat_)):
            key = (level[0], concurrency[0], repeat_[0])
            self._group(key).add_block(*used)
            if self.slo is not None:
                if (
                    key not in self.tallies and PHASE_MEASURE in used[0]
                ):  # keyed as its first measured request
                    i = used[0].index(PHASE_MEASURE)
                    key = (level[i], concurrency[i], repeat_[i])
                self._tally(key, used)
            return
        keys = list(zip(level, concurrency, repeat_, strict=True))
        for key in dict.fromkeys(keys):  # first-seen order, and a group's first key, as a dict has them
            mine = list(map(eq, keys, repeat(key)))
            self._group(key).add_block(*(list(compress(col, mine)) for col in used))
        if self.slo is not None:  # a tally is made at its group's first measured request
            for key in dict.fromkeys(compress(keys, map(eq, used[0], repeat(PHASE_MEASURE)))):
                mine = list(map(eq, keys, repeat(key)))
                self._tally(key, [list(compress(col, mine)) for col in used])

    def _tally(self, key: GroupKey, used: Sequence[Col]) -> None:
        """A group's requests (columns of ``_USED`` after the key) to its SLO tally: the measured ones,
        as the record-by-record definition adds them (tests/test_scale.py ``read_slo_tallies``; an ITL
        histogram only for an OK request)."""
        phase = used[0]
        measured = phase.count(PHASE_MEASURE)
        if not measured:
            return
        cols = [used[i] for i in _TALLY_AT]
        if measured != len(phase):
            keep = list(map(eq, phase, repeat(PHASE_MEASURE)))
            cols = [list(compress(col, keep)) for col in cols]
        tally = self.tallies.get(key)
        if tally is None:
            tally = self.tallies[key] = SloTally(self.slo)  # type: ignore[arg-type]
        tally.add_block(*cols)

    def _group(self, key: GroupKey) -> LevelColumns:
        cols = self.groups.get(key)
        if cols is None:
            cols = self.groups[key] = LevelColumns()
        return cols

    def read(self, path: str, start: int = 0, stop: int | None = None, line0: int = 0) -> int:
        """The lines of the file from byte ``start`` (a line's start) to ``stop`` (one's start, or the
        end), in blocks; ``line0`` lines come before ``start`` (line numbers count as
        ``rundir.read_jsonl`` counts them). Returns the number of lines read."""
        no = line0 + 1
        with open(path, "rb") as f:
            f.seek(start)
            while lines := f.readlines(_CHUNK_BYTES):
                if stop is not None and (over := f.tell() - stop) >= 0:
                    while over > 0:  # lines read past ``stop``: the next stretch's
                        over -= len(lines.pop())
                for i in range(0, len(lines), BLOCK_LINES):
                    self.lines(lines[i : i + BLOCK_LINES], no + i)
                no += len(lines)
                if stop is not None and f.tell() >= stop:
                    break
        return no - 1 - line0

    def merge(self, later: _Reading, lines: int) -> bool:
        """Add the reading of the lines after this one's ``lines`` lines, as if this one had read on.
        False, with nothing changed, when a sum would come out differently that way (a float count)."""
        return self.receive(later, [], lines)

    def receive(self, later: _Reading, sizes: list[int], lines: int, f: IO[bytes] | None = None) -> bool:
        """``merge``, the arrays of ``later`` coming from ``f`` (``sizes``: their bytes, in the
        order of ``_send``) and appended to these as they come, or from ``later`` itself (no ``f``)."""
        for key, cols in later.groups.items():
            mine = self.groups.get(key)
            if mine is not None and not (mine.sums_are_ints() and cols.sums_are_ints()):
                return False
        for key, tally in later.tallies.items():
            theirs = self.tallies.get(key)
            if theirs is not None and not (
                type(theirs.good_tokens) is int and type(tally.good_tokens) is int
            ):
                return False
        size = iter(sizes)
        for key, cols in later.groups.items():
            mine = self.groups.get(key)
            if mine is None:
                self.groups[key] = mine = LevelColumns()
            for (owner, name), (their_owner, _) in zip(mine.arrays(), cols.arrays(), strict=True):
                arr = getattr(owner, name)
                if f is None:
                    arr.extend(getattr(their_owner, name))
                    continue
                _read_into(arr, f, next(size))
            mine.take_counts(cols)
        for key, tally in later.tallies.items():
            mine_t = self.tallies.get(key)
            if mine_t is None:
                self.tallies[key] = mine_t = tally
            elif f is None:
                mine_t.merge(tally)
                continue
            if f is not None:  # its values come from the stream (``tally`` has none left)
                for arr in mine_t.values:
                    _read_into(arr, f, next(size))
                if mine_t is not tally:
                    mine_t.merge(tally)
        self.torn += [lines + no for no in later.torn]
        self.bad_records += later.bad_records
        self.first_bad = self.first_bad if self.first_bad is not None else later.first_bad
        for name, n in later.bad_fields.items():
            self.bad_fields[name] = self.bad_fields.get(name, 0) + n
        return True

    def notes(self, notes: list[str]) -> None:
        read_notes(notes, len(self.torn), self.torn, self.bad_records, self.first_bad, self.bad_fields)


def _read_into(arr: array, f: IO[bytes], left: int) -> None:
    """Append ``left`` bytes of ``f`` to ``arr``."""
    while left:
        chunk = f.read(min(left, 1 << 24))
        if not chunk:
            raise EOFError("the stream ended before its arrays did")
        arr.frombytes(chunk)
        left -= len(chunk)


def _middle(path: str) -> int | None:
    """Where the line after the middle of the file starts (None for a small file)."""
    size = os.path.getsize(path)
    if size < SPLIT_BYTES:
        return None
    with open(path, "rb") as f:
        f.seek(size // 2)
        f.readline()
        mid = f.tell()
    return mid if mid < size else None


def _read_from(path: str, start: int, slo: Slo | None) -> _Reading:
    reading = _Reading(slo)
    reading.read(path, start)
    return reading


def _send(reading: _Reading, f: IO[bytes]) -> None:
    """A stretch's reading into a pipe: pickled without its arrays, then the arrays' bytes as they
    are in memory (nothing is copied on the way: pickling them would hold a copy of each)."""
    arrays = []
    for cols in reading.groups.values():
        for owner, name in cols.arrays():
            arrays.append(getattr(owner, name))
            setattr(owner, name, array(arrays[-1].typecode))
    for tally in reading.tallies.values():
        arrays += tally.values
        tally.values = [array("d") for _ in tally.values]
    pickle.dump((reading, [len(a) * a.itemsize for a in arrays]), f, protocol=pickle.HIGHEST_PROTOCOL)
    for a in arrays:
        f.write(memoryview(a).cast("B"))


def read_columns(
    path: str, notes: list[str] | None = None, processes: int = 1
) -> dict[GroupKey, LevelColumns]:
    """records.jsonl as columns per (level, concurrency, repeat), in one streaming pass
    (``read_columns_and_tallies`` without an SLO)."""
    return read_columns_and_tallies(path, notes, processes)[0]


def read_columns_and_tallies(
    path: str, notes: list[str] | None = None, processes: int = 1, slo: Slo | None = None
) -> tuple[dict[GroupKey, LevelColumns], dict[GroupKey, SloTally]]:
    """records.jsonl as columns per (level, concurrency, repeat), in one streaming pass, and with
    ``slo`` each group's measured requests judged against it (what the record-by-record
    ``read_slo_tallies`` of tests/test_scale.py gives, in the same pass: {} without one).

    The same reading as ``records.read_records``, with the same notes: a torn line is skipped, a
    field of the wrong type is dropped (an optional one) or drops its record (a required one). A
    record whose level, concurrency, repeat, t_send, t_end, e2e_s or output_tokens is null is
    skipped as one without a usable required field. Nothing per record is kept but its columns.

    Lines are parsed a block at a time and the block's records are added column by column
    (``LevelColumns.add_block``): the same figures as adding them one at a time, for a fraction
    of the interpreter's work per record. ``processes=2`` (only from a single-threaded process:
    specload.analysis.forked) reads the second half of a big file in a forked child at the same time and
    appends its columns after the first half's: the same columns, unless a count was a float (then
    this process reads the second half itself, the way it would have).
    """
    reading = _Reading(slo)
    collecting = gc.isenabled()
    gc.disable()  # nothing read makes a reference cycle; the collector would walk each block's objects
    try:
        mid = _middle(path) if processes > 1 and forked.available() else None
        if mid is None:
            reading.read(path)
        else:
            lines = 0

            def receive(f: IO[bytes]) -> bool:
                later, sizes = pickle.load(f)
                return reading.receive(later, sizes, lines, f)

            merged: bool | None = None
            with forked.Child(lambda: _read_from(path, mid, slo), _send, receive) as child:
                lines = reading.read(path, 0, mid)
                try:
                    merged = child.result()
                except (forked.ChildFailed, EOFError, OSError):
                    merged = None  # it failed, maybe half-way through adding: read it all here
            if merged is None:
                reading = _Reading(slo)
                reading.read(path)
            elif not merged:
                reading.read(path, mid, None, lines)
    finally:
        if collecting:
            gc.enable()
    if notes is not None:
        reading.notes(notes)
    return reading.groups, reading.tallies
