"""Whether the load generator itself distorted a level's figures: the verdict and its thresholds.

A client that cannot keep up measures itself, not the server: a Locust process at full CPU reads
tokens late (TTFT and TPOT grow by the client's own delay), and users waiting for the event loop
send their next request late (fewer requests in flight than the level's C, so the server sees less
load than the table claims). Nothing in the figures says so; these three measurements do:

- CPU per process: CPU seconds per wall second of each Locust process while the level ran
  (1.0 = one core; gevent runs a process on one core, so 1.0 is its ceiling), plus the time it
  was ready to run but waited for a CPU (a process starved by other work wanted that too);
- event-loop lag: how late a greenlet that asked to wake at t actually woke (every token a user
  reads waits that long for its turn, and is timestamped that late);
- mean in flight: the time-weighted number of requests in flight while the level handed out
  tickets (from the first measured send to the last), against the C it was meant to hold.

Pure (no Locust, no gevent): the per-process probe (``specload.locust.clientload``) and the owner
feed it; run.json keeps the figures (``LevelMeta.client``); report, web UI and compare read the
verdict back through ``level_flags``/``client_flags``. docs/metrics.md, "The client's own load",
justifies the thresholds.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from specload.core.records import Phase, level_label
from specload.core.rundir import LevelMeta

if TYPE_CHECKING:
    from specload.analysis.run import Run

# A process busier than this (CPU seconds per wall second) had no slack left: its users waited
# for the event loop. 90 %, not 100 %: the level's ramp-down and the loop's own idle moments keep a
# saturated process's average a little under one core.
CPU_SATURATED = 0.90
# Waiting for a CPU this much (per wall second) is worth saying: the machine starved the client.
STARVED = 0.10
# A lagging loop: the p99 wake-up later than LAG_P99_MS (1 % of wake-ups came this late, and every
# token read then was timestamped that late) while the median one is later than LAG_P50_MS too (the
# loop itself is busy: every user waits its turn). Both, because a client with nothing to do, on a
# machine whose cores other processes keep busy, has one-off late wake-ups of 10-25 ms (once
# 158 ms) but a median of 1-3.4 ms (measured on a 2-vCPU box with three busy loops); a saturated
# client's loop shows a median of 30-225 ms and a p99 of 200-1000 ms. 20 ms is also below most
# servers' inter-token latency.
LAG_P99_MS = 20.0
LAG_P50_MS = 5.0
# One stall longer than this (the largest wake-up lag) is said whatever the percentiles: a process
# frozen for seconds (SIGSTOP, a VM pause, swap, a blocking call on the loop) is one late wake-up
# among thousands, so neither the p99 nor the median moves, yet every stream it held was read that
# late and every user sent its next request that late (a 6 s freeze cost a level 28 % of its Agg
# tok/s). An idle client's worst one-off wake-up on a busy 2-core box was 158 ms: 1 s is far above
# that and far below a stall that moves a level's figures.
STALL_MS = 1000.0
# Fewer requests in flight than C by more than this share: the server saw a lower load than the
# level's name says. The share covers each user's own gap between two requests (ticket round trip,
# building the next prompt: well under 1 % of a request of 0.1 s or more).
IN_FLIGHT_SHORT = 0.10
# More requests in flight than the level's C: each user holds at most one ticket, so this happens
# only when a worker written off as lost came back with its users while the others had taken
# theirs over (or a run made before the owner capped a level's tickets at C). The server then saw
# a higher load than the level's name says. Judged on the peak (any excess at all) and, for runs
# that only kept the mean, on a mean above C by more than a rounding share.
IN_FLIGHT_OVER = 0.01
# Shorter windows say nothing about a steady concurrency (a level of one wave has none).
MIN_WINDOW_S = 0.2
# More failed requests than this share: fast failures shorten requests and empty the in-flight
# count, which is the server's doing, so the gap is not judged.
MAX_FAILED_SHARE = 0.05

FIX = "add processes (`--processes N`) or worker machines"
MASTER_FIX = (
    "give the master a core of its own (it hands out every ticket and writes every record): "
    "fewer --processes on its machine, or workers on other machines"
)
MASTER = "master"  # the process name under which the master reports its own load
# The phases a level's load is measured in: handing out tickets, or draining (not ramp or pause).
ACTIVE_PHASES = (Phase.WARMUP, Phase.MEASURE, Phase.DRAINING)


# ---------------------------------------------------------------- loop lag


@dataclass
class LagHistogram:
    """Wake-up lags in log-spaced buckets (each 10 % wider than the last), so a process keeps a
    fixed few hundred bytes per level however long it runs, and a percentile costs one pass over
    ~130 buckets, not a sort. A percentile is its bucket's upper bound (at most 10 % high); the
    maximum is exact."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(_BOUNDS_MS) + 1))
    n: int = 0
    max_ms: float = 0.0

    def add(self, lag_ms: float) -> None:
        lag_ms = max(0.0, lag_ms)
        self.counts[bisect.bisect_left(_BOUNDS_MS, lag_ms)] += 1
        self.n += 1
        self.max_ms = max(self.max_ms, lag_ms)

    def percentile(self, q: float) -> float | None:
        """The lag that a share ``q`` (0..1) of the wake-ups did not exceed; None without samples."""
        if self.n == 0:
            return None
        rank = max(1, math.ceil(q * self.n))  # nearest rank
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                return min(_BOUNDS_MS[i], self.max_ms) if i < len(_BOUNDS_MS) else self.max_ms
        return self.max_ms


def _bounds() -> list[float]:
    out, b = [], 0.1
    while b < 60_000.0:
        out.append(round(b, 4))
        b *= 1.1
    return out


_BOUNDS_MS: list[float] = _bounds()  # 0.1 ms .. 60 s


# ---------------------------------------------------------------- one process, one level


@dataclass(frozen=True)
class ProcessLoad:
    """What one Locust process measured of itself over one level (while it handed out tickets)."""

    cpu: float  # CPU seconds per wall second (1.0: one core busy all the time)
    lag_p99_ms: float | None
    lag_max_ms: float | None
    samples: int  # wake-ups measured
    wall_s: float  # seconds measured
    # Seconds per wall second the process was ready to run but waited for a CPU (Linux schedstat;
    # None elsewhere): a client starved by other work on its machine is as saturated as a busy one.
    cpu_wait: float | None = None
    lag_p50_ms: float | None = None  # the typical wake-up: late only when the loop itself is busy

    @property
    def demand(self) -> float:
        """The CPU the process wanted: what it got plus what it waited for."""
        return self.cpu + (self.cpu_wait or 0.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "cpu": round(self.cpu, 3),
            "cpu_wait": _r(self.cpu_wait, 3),
            "lag_p99_ms": _r(self.lag_p99_ms),
            "lag_max_ms": _r(self.lag_max_ms),
            "lag_p50_ms": _r(self.lag_p50_ms),
            "samples": self.samples,
            "wall_s": round(self.wall_s, 3),
        }

    @classmethod
    def from_json(cls, d: Any) -> ProcessLoad | None:
        if not isinstance(d, Mapping):
            return None
        cpu, wall = _num(d.get("cpu")), _num(d.get("wall_s"))
        if cpu is None or wall is None:
            return None
        samples = d.get("samples")
        n = samples if isinstance(samples, int) and not isinstance(samples, bool) else 0
        return cls(
            cpu,
            _num(d.get("lag_p99_ms")),
            _num(d.get("lag_max_ms")),
            n,
            wall,
            _num(d.get("cpu_wait")),
            _num(d.get("lag_p50_ms")),
        )

    @classmethod
    def measured(
        cls, cpu_s: float, wall_s: float, lags: LagHistogram, wait_s: float | None = None
    ) -> ProcessLoad:
        per = (lambda x: x / wall_s) if wall_s > 0 else (lambda x: 0.0)
        return cls(
            per(cpu_s),
            lags.percentile(0.99),
            lags.max_ms if lags.n else None,
            lags.n,
            wall_s,
            None if wait_s is None else per(wait_s),
            lags.percentile(0.5),
        )


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _r(v: float | None, digits: int = 2) -> float | None:
    return None if v is None else round(v, digits)


# ---------------------------------------------------------------- requests in flight


@dataclass
class LevelTraffic:
    """One level's requests as the owner receives their records: enough to say how many were in
    flight while the level handed out tickets."""

    spans: list[tuple[float, float]] = field(default_factory=list)  # (t_send, t_end), warmup included
    first_send: float | None = None  # measured requests only
    last_send: float | None = None
    received: int = 0
    failed: int = 0

    def add(self, t_send: float, t_end: float, measured: bool, failed: bool) -> None:
        self.spans.append((t_send, t_end))
        if not measured:
            return
        self.received += 1
        self.failed += int(failed)
        self.first_send = t_send if self.first_send is None else min(self.first_send, t_send)
        self.last_send = t_send if self.last_send is None else max(self.last_send, t_send)

    def mean_in_flight(self, skip_s: float = 0.0) -> float | None:
        """Time-weighted requests in flight from the first measured send (+ ``skip_s``: a stagger)
        to the last one; None when that window is too short to hold a steady concurrency."""
        if self.first_send is None or self.last_send is None:
            return None
        return mean_in_flight(self.spans, self.first_send + skip_s, self.last_send)

    @property
    def failed_share(self) -> float:
        return self.failed / self.received if self.received else 0.0


# While a level runs, its in-flight figure (a sum over all of its records so far) is made again only
# once the records have grown by this factor: redone on every run.json update (each second), a level
# of 3.6M requests would cost the owner, which may share its process with the users, a sum over
# millions of spans a second. This way it costs O(records) over the whole level; at the level's end
# it is made from every record.
IN_FLIGHT_REGROW = 1.05


def in_flight_due(done_at: int | None, records: int, final: bool) -> bool:
    """Whether to make the in-flight figure again (``done_at``: the records it was last made from)."""
    if done_at is None:
        return True
    return records != done_at and (final or records >= done_at * IN_FLIGHT_REGROW)


def mean_in_flight(spans: Iterable[tuple[float, float]], start: float, end: float) -> float | None:
    """Σ (time each request spent in flight within [start, end]) / (end - start), which is the
    time-weighted mean of the in-flight count; None for a window shorter than MIN_WINDOW_S."""
    if end - start < MIN_WINDOW_S:
        return None
    inside = sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)
    return inside / (end - start)


def peak_in_flight(spans: Sequence[tuple[float, float]]) -> int | None:
    """The most requests in flight at once over a level's spans (warmup included), an end before a
    send at the same instant (a user's hand-off is no overlap); None without spans. The count
    ``specload.analysis.metrics.peak_in_flight`` makes of the measured records, over every record
    the owner took: after the j-th send (sorted), j + 1 - (ends at or before it) are in flight."""
    if not spans:
        return None
    arr = np.asarray(spans, dtype=np.float64)
    sends, ends = np.sort(arr[:, 0]), np.sort(arr[:, 1])
    after = np.arange(1, len(sends) + 1) - np.searchsorted(ends, sends, side="right")
    return max(0, int(after.max()))


# ---------------------------------------------------------------- one level's figures and verdict


@dataclass(frozen=True)
class ClientFigures:
    """run.json ``levels[i].client``: the client's own load during one level, per process, and
    the requests it kept in flight. ``mean_in_flight`` None: not judged (see ``in_flight_note``)."""

    concurrency: int
    processes: Mapping[str, ProcessLoad] = field(default_factory=dict)
    mean_in_flight: float | None = None
    in_flight_note: str | None = None  # why the gap was not judged
    peak_in_flight: int | None = None  # the most in flight at once (None: not measured)

    @property
    def busiest(self) -> tuple[str, ProcessLoad] | None:
        """The process that wanted the most CPU, with its name."""
        return max(self.processes.items(), key=lambda kv: kv[1].demand, default=None)

    @property
    def lag_p99_ms(self) -> float | None:
        return max((p.lag_p99_ms for p in self.processes.values() if p.lag_p99_ms is not None), default=None)

    @property
    def lag_max_ms(self) -> float | None:
        return max((p.lag_max_ms for p in self.processes.values() if p.lag_max_ms is not None), default=None)

    def reasons(self) -> list[str]:
        """What crossed a threshold, in words; [] when the client kept up."""
        out: list[str] = []
        busiest = self.busiest
        if busiest is not None and busiest[1].demand >= CPU_SATURATED:
            who, p = "the master" if busiest[0] == MASTER else "a Locust process", busiest[1]
            starved = (p.cpu_wait or 0.0) >= STARVED
            waited = f" and {p.cpu_wait:.0%} waiting for one (other work on its machine)" if starved else ""
            out.append(f"{who} at {p.cpu:.0%} CPU{waited}")
        lagging = [p for p in self.processes.values() if _lagging(p)]
        if lagging:
            worst = max(lagging, key=lambda p: p.lag_p99_ms or 0.0)
            median = f" (median {worst.lag_p50_ms:.0f} ms)" if worst.lag_p50_ms is not None else ""
            out.append(f"loop lag p99 {worst.lag_p99_ms:.0f} ms{median}")
        mif = self.mean_in_flight
        if mif is not None and mif < (1 - IN_FLIGHT_SHORT) * self.concurrency:
            out.append(f"mean in flight {mif:.0f} of {self.concurrency}")
        if (stall := self.stall_ms) is not None:
            out.append(f"one stall of {stall / 1e3:.1f} s")
        return out

    @property
    def stall_ms(self) -> float | None:
        """The largest wake-up lag, when it is over STALL_MS; else None."""
        worst = self.lag_max_ms
        return worst if worst is not None and worst > STALL_MS else None

    def over(self) -> list[str]:
        """More in flight than C, in words; [] when the level never exceeded its C."""
        out: list[str] = []
        c, peak, mif = self.concurrency, self.peak_in_flight, self.mean_in_flight
        if peak is not None and peak > c:
            out.append(f"peak {peak} in flight")
        if mif is not None and mif > (1 + IN_FLIGHT_OVER) * c:
            out.append(f"mean in flight {mif:.1f}")
        return out

    def flag(self) -> str | None:
        """The verdict with its fix, or None when the client kept up and held C."""
        reasons = self.reasons()
        over = self.over()
        if over:
            said = (
                f"more than C={self.concurrency} requests in flight ({', '.join(over)}): the server saw a "
                "higher load than the level's name says (a worker written off as lost came back with "
                "its users); run the level again"
            )
            return said if not reasons else f"{said}; and {self._bottleneck(reasons)}"
        if not reasons:
            return None
        return self._bottleneck(reasons)

    def _bottleneck(self, reasons: list[str]) -> str:
        if self.stall_ms is not None and len(reasons) == 1:  # a freeze alone: no lack of capacity
            return (
                f"the client stalled at C={self.concurrency} ({reasons[0]}, over the {STALL_MS / 1e3:g} s "
                "bound: the Locust process did not run, as when it is paused, swapped out or blocked): "
                "the level's figures include the stall; run the level again"
            )
        busiest = self.busiest
        master_only = busiest is not None and busiest[0] == MASTER and busiest[1].demand >= CPU_SATURATED
        fix = MASTER_FIX if master_only else FIX
        if busiest is not None and (busiest[1].cpu_wait or 0.0) >= STARVED:
            fix += "; keep other work off the client's cores"
        return f"the client was the bottleneck at C={self.concurrency} ({', '.join(reasons)}): {fix}"

    def as_stored(self) -> ClientFigures:
        """These figures as run.json keeps them (rounded), so that the verdict shown live, the one
        stored and the one every reader judges anew come from the same numbers (a mean in flight
        of 60.51 said 61 live and in run.json, and 60 in the report, from the stored 60.5)."""
        stored = ClientFigures.from_json(self.concurrency, self.to_json())
        assert stored is not None  # (a dict always reads back)
        return stored

    def to_json(self) -> dict[str, Any]:
        return {
            "cpu_max": _r(max((p.cpu for p in self.processes.values()), default=None), 3),
            "cpu_wait_max": _r(
                max((p.cpu_wait for p in self.processes.values() if p.cpu_wait is not None), default=None), 3
            ),
            "loop_lag_p99_ms": _r(self.lag_p99_ms),
            "loop_lag_max_ms": _r(self.lag_max_ms),
            "processes": len(self.processes),
            "mean_in_flight": _r(self.mean_in_flight, 1),
            "peak_in_flight": self.peak_in_flight,
            "in_flight_note": self.in_flight_note,
            "flag": self.flag(),
            "per_process": {name: p.to_json() for name, p in sorted(self.processes.items())},
        }

    @classmethod
    def from_json(cls, concurrency: int, d: Any) -> ClientFigures | None:
        if not isinstance(d, Mapping):
            return None
        per = d.get("per_process")
        procs = {
            str(k): p
            for k, v in (per.items() if isinstance(per, Mapping) else [])
            if (p := ProcessLoad.from_json(v)) is not None
        }
        note = d.get("in_flight_note")
        peak = d.get("peak_in_flight")
        return cls(
            concurrency,
            procs,
            _num(d.get("mean_in_flight")),
            None if note is None else str(note),
            peak if isinstance(peak, int) and not isinstance(peak, bool) else None,
        )


def _lagging(p: ProcessLoad) -> bool:
    """A busy loop, not a one-off hiccup (runs recorded without a median are judged on the p99)."""
    late = p.lag_p99_ms is not None and p.lag_p99_ms > LAG_P99_MS
    return late and (p.lag_p50_ms is None or p.lag_p50_ms > LAG_P50_MS)


def judge_in_flight(
    traffic: LevelTraffic | None,
    concurrency: int,
    budget: int | None,
    server_away: bool,
    skip_s: float = 0.0,
    rate: float | None = None,
) -> tuple[float | None, str | None]:
    """(mean in flight, None) when the gap to C says something about the client; else (None, why not).

    Not judged: a level of one wave (budget <= C never holds C steadily), a server outage or many
    failed requests (the server emptied the in-flight count), or too short a window. Requests the
    server queues (at its running cap) are still in flight for the client, so a busy server does
    not lower the figure: a gap is the client's."""
    if traffic is None or traffic.received == 0:
        return None, "no measured request"
    if rate is not None:
        return None, "a rate level: what is in flight follows the arrivals (late sends are judged instead)"
    if budget is not None and budget <= concurrency:
        return None, f"one wave only ({budget} requests for C={concurrency})"
    if server_away:
        return None, "the server was away (connection refused) during the level"
    if traffic.failed_share > MAX_FAILED_SHARE:
        return None, f"{traffic.failed} of {traffic.received} requests failed"
    mif = traffic.mean_in_flight(skip_s)
    return (mif, None) if mif is not None else (None, f"window under {MIN_WINDOW_S:g} s")


# ---------------------------------------------------------------- readers


def figures(lv: LevelMeta) -> ClientFigures | None:
    """A run.json level's client figures (None for runs made before they were recorded)."""
    return ClientFigures.from_json(lv.concurrency, lv.client)


def level_flags(levels: Sequence[LevelMeta]) -> dict[int, str]:
    """Level index -> the verdict, for the levels whose figures the client distorted. Judged anew
    from the recorded figures, so every reader applies this code's thresholds."""
    out: dict[int, str] = {}
    for lv in levels:
        fig = figures(lv)
        flag = fig.flag() if fig is not None else None
        if flag is not None and lv.index is not None:
            out[lv.index] = flag
    return out


def client_flags(run: Run) -> dict[int, str]:
    """``level_flags`` of a loaded run (specload.analysis.run.Run): level index -> verdict with its fix."""
    return level_flags(run.info.levels)


def client_notes(levels: Sequence[LevelMeta]) -> list[str]:
    """The report's note lines: one per level the client distorted, labelled like the table."""
    flags = level_flags(levels)
    return [
        f"{level_label(lv.concurrency, lv.repeat, lv.rate)}: {flags[lv.index]}"
        for lv in levels
        if lv.index is not None and lv.index in flags
    ]


def cell(fig: ClientFigures | None) -> str:
    """A short table cell: '-' (not measured yet), 'ok', or what crossed a threshold."""
    if fig is None or not fig.processes and fig.mean_in_flight is None:
        return "-"
    reasons = fig.reasons()
    over = fig.over()
    if over:
        return "OVER C: " + ", ".join(over + reasons)
    return "BOTTLENECK: " + ", ".join(reasons) if reasons else "ok"
