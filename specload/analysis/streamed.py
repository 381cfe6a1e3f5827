"""The tokens the client's streams read, sampled over the run: streamed.jsonl, and tok/s over time from it.

A record exists once its request has ended and carries its inter-token gaps as a histogram (no
order), so the records cannot say when inside a stream its tokens came: spread evenly from the
first token to the last, a level's tok/s over time averages a prefill stall (every stream paused
for a second) into its neighbours. Each Locust process therefore reports the tokens its streams
have read in the level so far (``ClientLoadMsg.streamed``, four times a second); the sweep's owner
sums them and samples the sum at its tick (about once a second). Those samples are the live
page's tok/s over time, and the owner writes each to streamed.jsonl, so that the report, its plot,
the HTML and the page after the level draw the same series from the same samples with the same
function (``metrics.streamed_tok_s``; docs/metrics.md "tok/s over time").

Lines of streamed.jsonl: ``{"level": 0, "t": 1700000000.25, "tokens": 1234, "v": 1}`` (wall clock,
the running total of the level: warmup, measure and drain).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from specload.analysis.metrics import SERIES_STREAMED, LevelStats, streamed_tok_s
from specload.core.rundir import read_jsonl

STREAMED = "streamed.jsonl"
STREAMED_VERSION = 1


@dataclass(frozen=True, slots=True)
class StreamSample:
    """The tokens level ``level``'s streams had read by wall-clock time ``t``, all processes summed."""

    level: int
    t: float
    tokens: int
    v: int = STREAMED_VERSION

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def from_dict(cls, d: object) -> StreamSample | None:
        """The sample of one line; None for a line that is no sample (a torn or foreign one)."""
        try:
            return msgspec.convert(d, cls)
        except msgspec.ValidationError:
            return None


@dataclass
class StreamTally:
    """Per level, each process's latest count and the samples of their sum (the owner's bookkeeping)."""

    latest: dict[int, dict[str, int]] = field(default_factory=dict)
    noted_at: dict[int, float] = field(default_factory=dict)  # per level: when a count last grew
    samples: dict[int, list[StreamSample]] = field(default_factory=dict)

    def note(self, level: int, process: str, tokens: int, t: float) -> None:
        """A process's count of the tokens it read in ``level`` so far (it only grows), at ``t``."""
        per = self.latest.setdefault(level, {})
        if tokens > per.get(process, 0):
            self.noted_at[level] = t
        if tokens >= per.get(process, 0):
            per[process] = tokens

    def sample(self, level: int | None, t: float) -> list[StreamSample]:
        """The samples at ``t``: of ``level`` (the one streaming now; None: none), and of every
        other level whose count grew since its last sample (a process's last word on a level that
        has ended reaches the owner after it). A sample is timed when its count last grew (a
        process reports four times a second, so the owner's tick sees a count up to that old),
        else at ``t``."""
        out = []
        for lv, per in self.latest.items():
            total = sum(per.values())
            got = self.samples.get(lv)
            if lv == level or (got and total > got[-1].tokens):
                before = got[-1] if got else None
                grew = total > (before.tokens if before else 0)
                # (no new count: the total still held at t)
                at = max(min(t, self.noted_at.get(lv, t)), before.t if before else t - 1.0) if grew else t
                s = StreamSample(lv, at, total)
                self.samples.setdefault(lv, []).append(s)
                out.append(s)
        if level is not None and level not in self.latest:
            s = StreamSample(level, t, 0)
            self.samples.setdefault(level, []).append(s)
            out.append(s)
        return out


def by_level(samples: Iterable[StreamSample]) -> dict[int, list[StreamSample]]:
    out: dict[int, list[StreamSample]] = {}
    for s in samples:
        out.setdefault(s.level, []).append(s)
    for v in out.values():
        v.sort(key=lambda s: s.t)
    return out


def read_streamed(run_dir: str | Path) -> dict[int, list[StreamSample]]:
    """streamed.jsonl of a run directory, per level in time order; {} when absent (an older run)."""
    path = Path(run_dir) / STREAMED
    if not path.exists():
        return {}
    try:
        rows = list(read_jsonl(path))
    except OSError:
        return {}
    return by_level(s for s in map(StreamSample.from_dict, rows) if s is not None)


def series_over(samples: list[StreamSample], span: tuple[float, float]) -> list[float]:
    """tok/s per SERIES_BUCKET_S over ``span`` from a level's samples (metrics.streamed_tok_s)."""
    return streamed_tok_s([s.t for s in samples], [s.tokens for s in samples], span)


def apply_streamed(levels: Iterable[LevelStats], samples: dict[int, list[StreamSample]]) -> None:
    """Each level's tok_s_series from its streamed samples over its measured span (first send to
    last end, where the records' series starts too), where it has two samples or more."""
    for s in levels:
        got = samples.get(s.index) if s.index is not None else None
        if not got or len(got) < 2 or s.series_t0 is None or not s.wall_s:
            continue
        s.tok_s_series = series_over(got, (s.series_t0, s.series_t0 + s.wall_s))
        s.tok_s_series_source = SERIES_STREAMED
