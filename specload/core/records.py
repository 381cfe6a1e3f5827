"""The per-request measurement record: the one unit of truth that every figure is built from.

A record is made once per request by the streaming client, shipped (as a plain dict) to the
process that owns the run directory, and appended as one JSON line to ``records.jsonl``.
The report reads nothing else for its figures; Locust's own statistics are only a cross-check,
because Locust buckets response times to about two significant digits.

Times are seconds. ``t_*`` fields are wall-clock epoch seconds, taken as a fixed wall-clock anchor
plus a monotonic (``perf_counter``) offset, so they are monotonic within a process and comparable
across processes (given NTP-synced client machines). Durations (``ttft_s``, ``e2e_s``) are exact
monotonic differences.
"""

from __future__ import annotations

import time
from dataclasses import MISSING, dataclass, fields
from enum import Enum
from operator import attrgetter
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from specload.core.rundir import read_jsonl

# Outcome of a request. Only "ok" counts in the report's Ok column.
OK = "ok"  # stream ended with its terminator and the server counted exactly the tokens asked for
# (natural output length: or fewer, the model having stopped itself, STOPPED)
SHORT = "short"  # stream ended (cleanly or not) with fewer tokens than asked, or without its terminator
FAILED = "failed"  # HTTP error, connection error, timeout, malformed stream

# The finish reasons of a model that ended its answer itself (its end-of-sequence token or a stop
# string): "stop" (OpenAI, vLLM, SGLang, llama.cpp), "eos_token" and "stop_sequence" (TGI). With
# --output-mode natural such a record is ok below the tokens asked for.
STOPPED = frozenset({"stop", "eos_token", "stop_sequence"})

# Where ``output_tokens`` came from.
SRC_USAGE = "usage"  # OpenAI ``usage.completion_tokens``
SRC_META = "meta_info"  # SGLang ``meta_info.completion_tokens``
SRC_CHUNKS = "chunks"  # fallback: number of content chunks (labelled, never silent)

# What one entry of a record's ``itl`` histogram is a gap between.
ITL_PER_TOKEN = "token"  # the backend knows each event's token count (SGLang /generate meta_info)
ITL_PER_EVENT = "event"  # it does not (OpenAI-style streams): a gap between events, one token assumed each


class Phase(str, Enum):
    """Where a level is in its life (a ``str`` so that it travels in messages and run.json as is)."""

    PENDING = "pending"
    RAMPING = "ramping"
    WARMUP = "warmup"
    MEASURE = "measure"
    DRAINING = "draining"
    DONE = "done"


# Version 2 added ``v`` itself; version 1 is every record written before (they read the same way).
# Version 3 added the per-request acceptance fields (spec_drafted ... spec_source), the category and
# the reasoning fields; older records read with them None. Version 4 leaves a null field out of its
# line (nulls would be a third of a typical line); in every version a missing field reads as null.
SCHEMA_VERSION = 4

# Where a record's acceptance fields came from (``spec_source``): the response itself.
SPEC_VLLM = "vllm_metrics"  # vLLM metrics.speculative_decoding (--per-request-spec-decode-metrics)
SPEC_SGLANG_META = "meta_info"  # SGLang /generate meta_info.spec_*
SPEC_SGLEXT = "sglext"  # SGLang OpenAI endpoints' sglext.spec_tokens_details (return_spec_tokens_details)
SPEC_LLAMACPP = "timings"  # llama.cpp timings.draft_n / draft_n_accepted
# Output positions per bucket of ``spec_along`` (acceptance along the output).
SPEC_ALONG_BUCKET = 100

# Speculative counts that cannot be true, each named (``spec_broken`` gives the index of the first one a
# record breaks). Each verify step yields at least one output token of its own, and accepts at most the
# draft tokens it drafted, at most K (the histogram's last index, where the response gave one).
SPEC_BOUNDS = (
    "a negative or infinite count",
    "more draft tokens accepted than drafted",
    "more verify steps than output tokens",
    # (an engine may accept a last step's drafts past max_tokens and drop them: up to K more)
    "more draft tokens accepted than output tokens plus one step's K",
    "more draft tokens accepted per verify step than its histogram's K (an acceptance length above K + 1)",
)


def spec_broken(
    tokens: npt.ArrayLike,
    steps: npt.ArrayLike,
    drafted: npt.ArrayLike,
    accepted: npt.ArrayLike,
    k: npt.ArrayLike,
) -> npt.NDArray[np.int8]:
    """Per record, the index in SPEC_BOUNDS of the first bound its speculative counts break, or -1.

    Arrays (or numbers) of output tokens (the server's count: events counted may carry several),
    verify steps, draft tokens drafted and accepted, and K; nan where the record has no such count (a
    bound on a count it lacks holds). The one rule for both the
    client, which refuses a response breaking it (specload.client.stream), and a record read back
    (specload.analysis.validity)."""
    t, s, d, a, most = np.broadcast_arrays(
        *(np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in (tokens, steps, drafted, accepted, k))
    )
    with np.errstate(invalid="ignore"):  # nan compares false: an absent count breaks nothing
        broken = (
            (s < 0) | (d < 0) | (a < 0) | np.isinf(s) | np.isinf(d) | np.isinf(a),
            a > d,
            s > t,
            a > t + most,
            a > most * s,
        )
    verdict = np.full(t.shape, -1, dtype=np.int8)
    for i in range(len(broken) - 1, -1, -1):  # the first bound broken wins
        verdict[broken[i]] = i
    return verdict


PHASE_WARMUP = "warmup"
PHASE_MEASURE = "measure"

_PERF0 = time.perf_counter()
_WALL0 = time.time()


def now() -> float:
    """Wall-clock seconds that never go backwards within this process."""
    return _WALL0 + (time.perf_counter() - _PERF0)


@dataclass(slots=True)
class RequestRecord:
    level: int  # index of the level in the sweep (0-based)
    concurrency: int  # target concurrency C of that level
    phase: str  # PHASE_WARMUP or PHASE_MEASURE
    seq: int  # ticket number within (level, phase), 0-based; unique per level and phase
    backend: str  # "openai" | "sglang" | "chat"
    status: str  # OK | SHORT | FAILED
    reason: str | None  # why it is not OK (None when OK)
    http_status: int | None  # HTTP status code, None when no response arrived
    t_send: float  # wall clock just before the request was written
    t_first: float | None  # wall clock of the first content-bearing event (None if none arrived)
    t_last: float | None  # wall clock of the last content-bearing event
    t_end: float  # wall clock when the stream ended (terminator, EOF or error)
    ttft_s: float | None  # t_first - t_send
    e2e_s: float  # t_end - t_send
    output_tokens: int  # as counted by the server when it said so; see output_tokens_source
    output_tokens_source: str  # SRC_USAGE | SRC_META | SRC_CHUNKS
    prompt_tokens: int | None  # as counted by the server (None when the server did not say)
    requested_output_tokens: int  # max_tokens asked for
    requested_prompt_tokens: int  # prompt length sent (token ids) or aimed for (chat text)
    chunks: int  # content-bearing stream events received
    tpot_s: float | None  # (t_last - t_first) / (output_tokens - 1); None when output_tokens < 2
    itl_max_s: float | None  # largest gap between content events, divided by the tokens that event carried
    per_request_tok_s: float | None  # output_tokens / e2e (reference "Per-req tok/s")
    decode_tok_s: float | None  # (output_tokens - 1) / (t_last - t_first)
    spec_verify_ct: int | None  # SGLang meta_info.spec_verify_ct (speculative servers only)
    worker: str  # which Locust process sent it ("local", or the worker's client id)
    repeat: int = 0  # repetition index of the level (for --repeat)
    # Every gap after the first event, as [[bin, tokens], ...] of specload.core.histogram (an event of
    # k tokens after a gap g counts k gaps of g/k); None for fewer than two events.
    itl: list[list[int]] | None = None
    itl_unit: str | None = None  # ITL_PER_TOKEN | ITL_PER_EVENT
    first_event_tokens: int | None = None  # tokens the first content event carried (TPOT leaves them out)
    # Rate levels: when the request was due (wall clock of the process that sent it). t_send later
    # than this means it waited for a free user; latencies "from schedule" count that wait.
    t_sched: float | None = None
    rate: float | None = None  # the level's requests/s for a rate level (None: a concurrency level)
    # The workload (specload.workload.request): the request's class ([[classes]]; None without classes), its
    # turn in a conversation (0-based) and the conversation's id (None when single-turn), its shared
    # prefix's group (None without a shared prefix), and the prompt tokens the server's prefix cache
    # served (SGLang meta_info.cached_tokens, OpenAI usage.prompt_tokens_details.cached_tokens; None
    # when the server did not say).
    request_class: str | None = None
    turn: int | None = None
    conversation: str | None = None
    prefix_group: int | None = None
    cached_tokens: int | None = None
    # Speculative decoding as the response reported it (None: it did not; spec_verify_ct is the verify
    # steps): draft tokens proposed and accepted, accepted tokens per step as a histogram (index j: the
    # steps that accepted exactly j draft tokens, the bonus token left out, as vLLM's
    # acceptance_histogram), and, where the server gave each step, [[bucket, steps, accepted], ...] per
    # SPEC_ALONG_BUCKET output positions of the step's first token. spec_source: SPEC_*.
    spec_drafted: int | None = None
    spec_accepted: int | None = None
    spec_hist: list[int] | None = None
    spec_along: list[list[int]] | None = None
    spec_source: str | None = None
    # A categorised dataset's row category (specload.workload.datasets; SPEED-Bench's ``category``),
    # None for any other prompt.
    category: str | None = None
    # Reasoning streams (chat deltas with ``reasoning`` / ``reasoning_content``; None for a stream
    # without reasoning): the wall clock of the first answer (non-reasoning) content event, the
    # reasoning tokens (the server's usage.completion_tokens_details.reasoning_tokens, else the
    # reasoning events counted) and where that count came from (SRC_USAGE | SRC_CHUNKS).
    t_first_answer: float | None = None
    reasoning_tokens: int | None = None
    reasoning_tokens_source: str | None = None
    # How the server said the answer ended (finish_reason; SGLang's finish_reason.type): "length" at
    # the cap, STOPPED when the model ended it; None when it did not say (and in records written before it).
    finish_reason: str | None = None
    # Trace replay: the request's row in the trace file (0-based, counted before any window), the key
    # that pairs the same request across two arms' runs; None when the workload is not a trace.
    trace_index: int | None = None
    # The record schema's version (SCHEMA_VERSION when written); a record written without it is version 1.
    v: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """Every field by name, in order: what ``dataclasses.asdict`` gives, without its recursive
        deep copy (once per request on the client). ``itl`` is the record's own list, not a copy."""
        return dict(zip(_FIELD_NAMES, _get_fields(self), strict=True))

    def to_json(self) -> bytes:
        """The record's line of records.jsonl (record_line)."""
        return record_line(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        known = _FIELD_SET  # not fields(cls) per call: the owner parses every record it is shipped
        rec = cls(**{**_NULLS, **{k: v for k, v in d.items() if k in known}})
        if "v" not in d:
            rec.v = 1  # written before records carried their version
        return rec


_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))
_get_fields = attrgetter(*_FIELD_NAMES)
_FIELD_SET = frozenset(_FIELD_NAMES)
# The fields without a default that may be null: a line leaves them out when they are (version 4).
NULLABLE: frozenset[str] = frozenset(
    f.name for f in fields(RequestRecord) if f.default is MISSING and "None" in str(f.type)
)
_NULLS = dict.fromkeys(NULLABLE)


def record_line(rec: RequestRecord | dict[str, Any]) -> bytes:
    """A record's line of records.jsonl (without its newline): its fields in order, the null ones
    left out (schema version 4: smaller, and quicker to read; a reader takes a missing field as null)."""
    d = rec.to_dict() if isinstance(rec, RequestRecord) else rec
    return orjson.dumps({k: v for k, v in d.items() if v is not None})


def derived(
    t_send: float,
    t_first: float | None,
    t_last: float | None,
    t_end: float,
    output_tokens: int,
    first_event_tokens: int | None = None,
    counted: bool = True,
) -> tuple[float | None, float, float | None, float | None, float | None]:
    """Per-request figures from the timestamps and the server's token count.

    Returns (ttft_s, e2e_s, tpot_s, per_request_tok_s, decode_tok_s). Kept pure so the report
    and the tests use the same arithmetic as the client. TPOT spreads the time after the first
    event over the tokens that came after it: N minus what the first event carried (1 unless the
    backend said more). ``counted=False`` (the output count is a chunk count, not the server's)
    leaves out every per-token figure: a chunk may carry several tokens, so they would be wrong.
    """
    e2e = t_end - t_send
    ttft = None if t_first is None else t_first - t_send
    if not counted:
        return ttft, e2e, None, None, None
    per_req = output_tokens / e2e if e2e > 0 and output_tokens > 0 else None
    tpot = decode = None
    after_first = output_tokens - max(1, first_event_tokens or 1)
    if t_first is not None and t_last is not None and after_first >= 1:
        span = t_last - t_first
        if span > 0:
            tpot = span / after_first
            decode = after_first / span
    return ttft, e2e, tpot, per_req, decode


def make_record(
    *,
    t_send: float,
    t_first: float | None,
    t_last: float | None,
    t_end: float,
    output_tokens: int,
    **fields: Any,
) -> RequestRecord:
    """A record whose per-request figures come from ``derived``, the one place they are computed."""
    ttft, e2e, tpot, per_req, decode = derived(
        t_send,
        t_first,
        t_last,
        t_end,
        output_tokens,
        fields.get("first_event_tokens"),
        fields.get("output_tokens_source") != SRC_CHUNKS,
    )
    return RequestRecord(
        t_send=t_send,
        t_first=t_first,
        t_last=t_last,
        t_end=t_end,
        output_tokens=output_tokens,
        ttft_s=ttft,
        e2e_s=e2e,
        tpot_s=tpot,
        per_request_tok_s=per_req,
        decode_tok_s=decode,
        **fields,
    )


def read_records(path: str, notes: list[str] | None = None) -> list[RequestRecord]:
    """Read records.jsonl, whatever is in it: a torn line (crash mid-write) is skipped, a field of
    the wrong type is dropped (an optional one) or drops its record (a required one), and each
    kind of problem becomes one line in ``notes`` instead of a crash of the report."""
    out: list[RequestRecord] = []
    torn: list[int] = []
    bad_records: list[str] = []
    bad_fields: dict[str, int] = {}
    for d in read_jsonl(path, torn, None):  # any size: records are streamed, not held as text
        rec = _checked(d, bad_fields)
        if rec is None:
            bad_records.append(str(d)[:80])
        else:
            out.append(rec)
    if notes is not None:
        read_notes(
            notes, len(torn), torn, len(bad_records), bad_records[0] if bad_records else None, bad_fields
        )
    return out


def read_notes(
    notes: list[str],
    n_torn: int,
    torn: list[int],
    n_bad: int,
    first_bad: str | None,
    bad_fields: dict[str, int],
) -> None:
    """The notes of a read of records.jsonl (``torn``: the first torn lines' numbers, at least 6 if
    there are that many), shared by ``read_records`` and ``columns.read_columns``."""
    if n_torn:
        notes.append(
            f"records.jsonl: {n_torn} unreadable line(s) skipped (line {', '.join(map(str, torn[:5]))}"
            f"{', ...' if n_torn > 5 else ''}; a torn last line means the writer was stopped mid-line)"
        )
    if n_bad:
        notes.append(
            f"records.jsonl: {n_bad} record(s) without a usable required field skipped (first: {first_bad})"
        )
    for name, n in sorted(bad_fields.items()):
        notes.append(f"records.jsonl: field '{name}' not a number in {n} record(s); left out of the figures")


_NUMBERS = {
    f.name: f.type
    for f in fields(RequestRecord)
    if str(f.type) in ("int", "float", "int | None", "float | None")
}


def _checked(d: Any, bad_fields: dict[str, int]) -> RequestRecord | None:
    """The record, with each wrongly typed optional number set to None; None when a required one is bad."""
    if not isinstance(d, dict):
        return None
    d = dict(d)
    for name, typ in _NUMBERS.items():
        v = d.get(name)
        if v is None or (not isinstance(v, bool) and isinstance(v, int | float)):
            continue
        bad_fields[name] = bad_fields.get(name, 0) + 1
        if "None" not in str(typ):
            return None
        d[name] = None
    for name in ("itl", "spec_hist", "spec_along"):
        if d.get(name) is not None and not isinstance(d[name], list):
            bad_fields[name] = bad_fields.get(name, 0) + 1
            d[name] = None
    try:
        return RequestRecord.from_dict(d)
    except (TypeError, AttributeError):
        return None


def level_label(concurrency: int, repeat: int = 0, rate: float | None = None) -> str:
    """Name of a level in Locust's rows and logs: c016 (or c016.r1 for a repetition), or for a
    rate level its requests/s: rate2, rate0.5 (rate2.r1)."""
    head = f"c{concurrency:03d}" if rate is None else f"rate{rate:g}"
    return head + (f".r{repeat}" if repeat else "")
