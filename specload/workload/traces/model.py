"""A production request trace as specload replays it: arrival seconds, lengths, prefix blocks.

Every reader (``mooncake``, ``azure``, ``burstgpt``, ``generic``) turns its file into a ``Trace`` whose
times are seconds since the file's first request, whatever unit the file wrote them in. The unit
is the reader's (Mooncake: milliseconds; BurstGPT: seconds; Azure: date-times) or, for a generic
file, the user's declaration; it is never guessed from the numbers. The numbers are checked
against it instead (``check_span``): a Mooncake file read as seconds spans 41 days, and a replay
that quietly took that long, or one that compressed a day into 86 seconds, is refused before any
load is sent, saying which unit would fit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

# Time units a generic file may declare, in seconds.
UNITS: dict[str, float] = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
# Spans and rates no trace of production traffic has: a file whose times in the declared unit give
# these has its unit wrong. The published ones (Mooncake, Azure 2023/2024, BurstGPT) span one hour
# to four months, at a few to a few hundred requests per second.
MAX_SPAN_S = 8 * 86400.0  # the readers' default; BurstGPT (two months per file) sets its own
MAX_RATE = 20_000.0  # requests/s, over a file of at least MIN_FOR_RATE requests
MIN_FOR_RATE = 100


class TraceError(ValueError):
    """The trace file cannot be read as declared; the message names the file, the row and why."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace.

    ``index``: its 0-based row in the file (data rows, the header not counted), counted before any
    window: the key that pairs the same request across two replays (records' ``trace_index``).
    ``arrival_s``: seconds since the file's first request. ``hash_ids``: its prefix blocks in order,
    each ``Trace.block_size`` tokens (the last one may be partial); equal ids mean equal blocks, so
    two requests share the prefix their leading equal ids cover.
    """

    index: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Trace:
    """A whole trace file, read: its requests in arrival order and what its numbers mean."""

    format: str  # mooncake | azure | burstgpt | jsonl | csv
    source: str  # the file as given
    time_unit: str  # the file's unit of time, as the reader fixed it (or "datetime")
    block_size: int | None  # tokens per hash_id block; None: the trace has no prefix blocks
    requests: tuple[TraceRequest, ...]
    rows: int  # data rows in the file
    skipped: dict[str, int] = field(default_factory=dict)  # rows left out, per reason

    @property
    def span_s(self) -> float:
        """Seconds from the first request to the last."""
        if not self.requests:
            return 0.0
        return self.requests[-1].arrival_s - self.requests[0].arrival_s

    @property
    def input_tokens(self) -> int:
        return sum(r.input_tokens for r in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)


def _human(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.0f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} hours"
    if seconds >= 120:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds:.3g} s"


def _big(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.1f} million"
    return f"{x:,.0f}"


def _fitting(raw_span: float, n: int, unit_s: float, max_span_s: float) -> str:
    """The other units the file's numbers would fit, with the span each gives ("" when none)."""
    fits = [
        f"{u} would make it {_human(raw_span * s)}"
        for u, s in UNITS.items()
        if s != unit_s
        and raw_span * s <= max_span_s
        and not (n >= MIN_FOR_RATE and raw_span > 0 and (n - 1) / (raw_span * s) > MAX_RATE)
    ]
    return f" ({'; '.join(fits)})" if fits else ""


def check_span(
    source: str,
    unit: str,
    raw_span: float,
    seconds_per_unit: float,
    n: int,
    max_span_s: float = MAX_SPAN_S,
) -> None:
    """Refuse a file whose timestamps do not fit ``unit``: a span longer than ``max_span_s``, or more
    than MAX_RATE requests/s on average. ``raw_span``: last minus first timestamp in the file's unit."""
    span_s = raw_span * seconds_per_unit
    if span_s > max_span_s:
        raise TraceError(
            f"{source}: timestamps span {_big(raw_span)} {unit!r} units = {_human(span_s)}, longer than any "
            f"trace this format holds ({_human(max_span_s)}): the time unit does not fit this file"
            + _fitting(raw_span, n, seconds_per_unit, max_span_s)
        )
    if n >= MIN_FOR_RATE and span_s > 0 and (n - 1) / span_s > MAX_RATE:
        raise TraceError(
            f"{source}: {n} requests in {raw_span:g} {unit!r} units = {_human(span_s)}, "
            f"{(n - 1) / span_s:,.0f} requests/s on average: the time unit does not fit this file"
            + _fitting(raw_span, n, seconds_per_unit, max_span_s)
        )
    if n >= 2 and span_s == 0:
        raise TraceError(f"{source}: all {n} requests have the same timestamp: no schedule to replay")


def in_order(requests: list[TraceRequest]) -> tuple[TraceRequest, ...]:
    """Requests in arrival order (a stable sort: rows with equal times keep the file's order), times
    made relative to the first arrival."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    if not ordered:
        return ()
    t0 = ordered[0].arrival_s
    if t0 == 0.0:
        return tuple(ordered)
    return tuple(
        TraceRequest(r.index, r.arrival_s - t0, r.input_tokens, r.output_tokens, r.hash_ids) for r in ordered
    )


def length(source: str, row: int, name: str, value: object) -> int:
    """A token count from a row: a non-negative integer (a float with no fraction is accepted)."""
    if isinstance(value, bool):
        raise TraceError(f"{source}: row {row}: {name} is {value!r}, not a token count")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise TraceError(f"{source}: row {row}: {name} is {value!r}, not a token count") from None
    if not isinstance(value, int) or value < 0:
        raise TraceError(f"{source}: row {row}: {name} is {value!r}, not a token count")
    return value


def number(source: str, row: int, name: str, value: object) -> float:
    """A timestamp from a row, in the file's own unit."""
    if isinstance(value, bool):
        raise TraceError(f"{source}: row {row}: {name} is {value!r}, not a number")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise TraceError(f"{source}: row {row}: {name} is {value!r}, not a number") from None
    if not isinstance(value, int | float) or value != value or value in (float("inf"), float("-inf")):
        raise TraceError(f"{source}: row {row}: {name} is {value!r}, not a number")
    return float(value)


def read_rows(
    fmt: str,
    source: str,
    unit: str,
    seconds_per_unit: float,
    block_size: int | None,
    rows: Iterable[tuple[int, dict[str, Any]]],
    request: Callable[[int, dict[str, Any]], TraceRequest],
    max_span_s: float = MAX_SPAN_S,
) -> Trace:
    """The Trace of a file's ``(row, fields)``, each made a request by ``request``, timestamps in
    ``unit``: checked against the unit, in seconds. A request with no prompt or no output cannot be
    sent as it was (BurstGPT logs failed requests with 0 response tokens): it is counted out."""
    raw: list[TraceRequest] = []
    skipped: dict[str, int] = {}
    n = 0
    for row, d in rows:
        n += 1
        req = request(row, d)
        if req.input_tokens < 1:
            skipped["no input tokens"] = skipped.get("no input tokens", 0) + 1
        elif req.output_tokens < 1:
            skipped["no output tokens"] = skipped.get("no output tokens", 0) + 1
        else:
            raw.append(req)
    if not raw:
        why = f" ({', '.join(f'{c} {k}' for k, c in skipped.items())})" if skipped else ""
        raise TraceError(f"{source}: no request to replay in {n} rows{why}")
    times = [r.arrival_s for r in raw]
    check_span(source, unit, max(times) - min(times), seconds_per_unit, len(raw), max_span_s)
    if seconds_per_unit != 1.0:
        raw = [
            TraceRequest(r.index, r.arrival_s * seconds_per_unit, r.input_tokens, r.output_tokens, r.hash_ids)
            for r in raw
        ]
    return Trace(fmt, source, unit, block_size, in_order(raw), n, skipped)
