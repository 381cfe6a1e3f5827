"""The run in progress as the web UI shows it: per level, the report's own figures from the records
that have arrived, and the output tokens streamed so far.

The sweep's owner feeds every record into the report's own accumulator (``columns.LevelColumns``)
and every server sample, so ``stats`` is what ``specload report`` computes from the same records:
a finished level shows exactly the report's numbers. Records exist only once a request has ended,
which for long generations at high concurrency is tens of seconds; each Locust process therefore
also reports the tokens its streams have read in the level so far (``ClientLoadMsg.streamed``), and
the owner samples their sum once a second: the live tok/s and the level's tok/s over time.

Locust-free and pure bookkeeping; the caller passes the time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from specload.analysis.cap import running_cap
from specload.analysis.columns import LevelColumns
from specload.analysis.metrics import LevelStats, ServerSample, summarize
from specload.core.records import RequestRecord
from specload.core.rundir import ServerInfo
from specload.core.slo import Slo

# A live level's figures are recomputed at most every this many seconds, or ten times as long as
# the last computation took (a level of 100k requests must not keep the owner's process busy).
MIN_RECOMPUTE_S = 1.0
RATE_WINDOW_S = 5.0  # the live streamed tok/s: over the last this many seconds


@dataclass
class LiveLevel:
    cols: LevelColumns = field(default_factory=LevelColumns)
    streamed: dict[str, int] = field(default_factory=dict)  # per Locust process: tokens read in the level
    series: list[tuple[float, int]] = field(default_factory=list)  # (wall time, tokens streamed), ~1/s
    stats: LevelStats | None = None
    stats_records: int = -1  # records behind ``stats``
    stats_at: float = 0.0
    cost_s: float = 0.0

    @property
    def records(self) -> int:
        return self.cols.sent + self.cols.warmup  # (``sent`` takes the records added since)

    @property
    def streamed_total(self) -> int:
        return sum(self.streamed.values())


class LiveRun:
    """The live figures of one run (a new one per run)."""

    def __init__(self, n_levels: int, server: ServerInfo | None = None, slo: Slo | None = None) -> None:
        self.levels = [LiveLevel() for _ in range(n_levels)]
        self.server = server or ServerInfo()  # run.json ``server``: what the server said of itself
        self.slo = slo  # the run's SLO: each level judged as the report judges it (LevelStats.slo)
        self.samples: list[ServerSample] = []

    def _level(self, index: int) -> LiveLevel | None:
        return self.levels[index] if 0 <= index < len(self.levels) else None

    def add_record(self, rec: RequestRecord) -> None:
        """A record as the owner gets it: kept in the level's columns, the report's own store
        (``LevelColumns.add``; the columns take it at the next ``stats``)."""
        lv = self._level(rec.level)
        if lv is not None:
            lv.cols.add(rec)

    def add_sample(self, sample: ServerSample) -> None:
        self.samples.append(sample)

    @property
    def cap(self) -> int | None:
        """The server's cap on running requests as the report has it (Run.cap): declared, else
        inferred from the gauges sampled so far."""
        cap = running_cap(self.server, self.samples)
        return cap.value if cap is not None else None

    @property
    def latest_sample(self) -> ServerSample | None:
        return self.samples[-1] if self.samples else None

    def set_streamed(self, index: int, process: str, tokens: int) -> None:
        """A process's latest count of the tokens it read in level ``index`` (it only grows)."""
        lv = self._level(index)
        if lv is not None and tokens >= lv.streamed.get(process, 0):
            lv.streamed[process] = tokens

    def sample_streamed(self, index: int, now: float) -> None:
        """Note the level's streamed total at ``now`` (the owner does once a second)."""
        lv = self._level(index)
        if lv is not None:
            lv.series.append((now, lv.streamed_total))

    def streamed_rate(self, index: int, window_s: float = RATE_WINDOW_S) -> float | None:
        """Output tokens per second streamed over the last ``window_s`` seconds of samples."""
        lv = self._level(index)
        if lv is None or len(lv.series) < 2:
            return None
        t1, n1 = lv.series[-1]
        t0, n0 = next(((t, n) for t, n in lv.series if t >= t1 - window_s), lv.series[0])
        if t1 <= t0:
            t0, n0 = lv.series[-2]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None

    def stats(
        self,
        index: int,
        concurrency: int,
        repeat: int,
        status: str | None,
        final: bool,
        now: float,
        rate: float | None = None,
    ) -> LevelStats | None:
        """The level's report figures from the records so far (None before any record). A level
        still running is recomputed at most every MIN_RECOMPUTE_S (or 10x the last cost); a final
        one whenever a record came in since."""
        lv = self._level(index)
        if lv is None or lv.records == 0:
            return None
        stale = lv.stats_records != lv.records
        due = final or now - lv.stats_at >= max(MIN_RECOMPUTE_S, 10 * lv.cost_s)
        if (
            lv.stats is None
            or (stale and due)
            or (lv.stats is not None and lv.stats.status != status and final)
        ):
            t0 = time.perf_counter()
            lv.stats = summarize(
                lv.cols,
                concurrency=concurrency,
                repeat=repeat,
                index=index,
                status=status,
                samples=self.samples,
                cap=self.cap,
                rate=rate,
                slo=self.slo,
            )
            lv.cost_s = time.perf_counter() - t0
            lv.stats_records, lv.stats_at = lv.records, now
        return lv.stats
