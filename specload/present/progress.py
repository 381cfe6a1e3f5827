"""The running level's progress as one line of a terminal, redrawn in place.

A sweep level runs for seconds to minutes with nothing to see between its "started" and "done" log
lines. On a terminal (and only there: CI logs and files keep the plain lines, unchanged) the sweep's
owner redraws one line under the log, as ``vllm bench serve`` and GuideLLM users are used to::

    level 3/6 c016 [#########...........] 14/32 req, 16 in flight, 1752.0 tok/s [00:04<00:05]

``snapshot`` (the controller's level -> figures) and ``render`` (figures -> one line) are pure;
``TerminalLine`` is the only part that writes, to a stream it is given, with nothing but ``\\r`` and
spaces (no escape codes, no dependency). The owner's greenlet that drives it is in
specload/locust/progressbar.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from specload.core.records import Phase, level_label
from specload.sweep.levels import LevelProgress

BAR_MAX = 30  # characters of the bar itself, at most
BAR_MIN = 8  # narrower than this, the bar is left out (the counts stay)


@dataclass(frozen=True)
class LevelSnapshot:
    """The figures of the running level the progress line shows (all from the owner's controller)."""

    index: int  # 0-based
    levels: int  # levels in the sweep
    label: str  # c016, c016.r1, rate2 (records.level_label, as the log lines name it)
    concurrency: int
    phase: str  # a levels.Phase value
    done: int  # measured requests back (ok, short or failed)
    budget: int | None  # None: time-boxed
    duration_s: float | None  # a time-boxed level's measured time
    warmup_done: int
    warmup: int
    in_flight: int
    failed: int
    tokens: int  # output tokens of the measured requests back
    elapsed_s: float  # since the level began (its users ramping)
    measure_s: float | None  # since its measured requests opened
    # the level's Agg tok/s so far (sweep.levels.LevelProgress.agg_tok_s: at the level's end, the
    # report's figure); it moves only as requests come back, so it does not sag between them
    agg_tok_s: float | None
    back_ago_s: float | None  # since the last measured request ended


def snapshot(lv: LevelProgress, levels: int, now: float) -> LevelSnapshot:
    """The controller's running level ``lv`` at wall-clock time ``now`` (the controller's clock)."""
    p = lv.plan

    def since(t: float | None) -> float | None:
        return None if t is None else max(0.0, now - t)

    return LevelSnapshot(
        index=p.index,
        levels=levels,
        label=level_label(p.concurrency, p.repeat, p.rate),
        concurrency=p.concurrency,
        phase=lv.phase.value,
        done=lv.received,
        budget=p.budget,
        duration_s=p.duration_s,
        warmup_done=lv.received_warmup,
        warmup=p.warmup,
        in_flight=lv.in_flight,
        failed=lv.failed,
        tokens=lv.tokens,
        elapsed_s=since(lv.t_start) or 0.0,
        measure_s=since(lv.t_measure_start),
        agg_tok_s=lv.agg_tok_s(),
        back_ago_s=since(lv.last_end),
    )


def fraction(s: LevelSnapshot) -> float | None:
    """How far the measured part is: requests back over the budget, or time over the duration."""
    if s.budget:
        return min(1.0, s.done / s.budget)
    if s.duration_s and s.measure_s is not None:
        return min(1.0, s.measure_s / s.duration_s)
    return None


def time_left_s(s: LevelSnapshot) -> float | None:
    """Seconds until the level ends, estimated: the requests still due at the pace they came back
    so far (a closed loop returns them at a steady pace once the first wave is in), counted down
    from the last one's end; a time-boxed level's remaining time. None while there is nothing to go by."""
    if s.phase not in (Phase.MEASURE.value, Phase.DRAINING.value) or s.measure_s is None:
        return None
    if s.budget is not None:
        if s.done == 0 or s.back_ago_s is None:
            return None
        pace = (s.measure_s - s.back_ago_s) / s.done  # seconds per request back, measure start -> last end
        return max(0.0, (s.budget - s.done) * pace - s.back_ago_s)
    if s.duration_s is not None:
        return max(0.0, s.duration_s - s.measure_s)
    return None


def clock(seconds: float | None) -> str:
    """00:04, 12:05, 1:02:03; ``?`` when unknown."""
    if seconds is None:
        return "?"
    t = int(seconds + 0.5)
    h, rest = divmod(t, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60:02d}:{rest % 60:02d}"


def bar(frac: float, width: int) -> str:
    filled = int(frac * width + 1e-9)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def render(s: LevelSnapshot, width: int) -> str:
    """One line, at most ``width - 1`` characters (a line that reaches a terminal's last column
    wraps on some terminals, and ``\r`` would then redraw only its second half). Where it is
    narrow, the in-flight count goes first, then the bar, then the rate; then the line is cut."""
    head = f"level {s.index + 1}/{s.levels} {s.label}"
    active = s.phase in (Phase.MEASURE.value, Phase.DRAINING.value)
    if s.phase == Phase.RAMPING.value:
        counts = [f"starting {s.concurrency} user{'s' if s.concurrency > 1 else ''}"]
    elif s.phase == Phase.WARMUP.value:
        counts = [f"warmup {s.warmup_done}/{s.warmup}"]
    elif s.budget is not None:
        counts = [f"{s.done}/{s.budget} req"]
    else:
        counts = [f"{s.done} req", f"{clock(s.measure_s)}/{clock(s.duration_s)}"]
    rate = s.agg_tok_s
    in_flight = [f"{s.in_flight} in flight"] if active else []
    tok_s = [f"{rate:.1f} tok/s" if rate is not None else "- tok/s"] if active else []
    failed = [f"{s.failed} failed"] if s.failed else []
    times = f" [{clock(s.elapsed_s)}<{clock(time_left_s(s))}]"
    limit = max(1, width - 1)
    frac = fraction(s) if active else None
    for optional in ((*in_flight, *tok_s), tok_s, ()):
        tail = ", ".join([*counts, *(p for p in (*in_flight, *tok_s) if p in optional), *failed]) + times
        room = limit - len(head) - len(tail) - 2 - 2  # the spaces around the bar, its brackets
        if frac is not None and room >= BAR_MIN:
            return f"{head} {bar(frac, min(BAR_MAX, room))} {tail}"
        if len(head) + 1 + len(tail) <= limit:
            return f"{head} {tail}"
    return f"{head} {tail}"[:limit]


class TerminalLine:
    """One line at the bottom of a terminal: ``show`` redraws it in place, ``clear`` blanks it.

    Other output must not land on the same line: ``stream_for`` gives what log handlers should
    write to instead of the terminal, which clears the line, writes, and draws it again below,
    as ``current`` says it is now (None: nothing to show; default: the last text shown).
    """

    def __init__(self, stream: TextIO, current: Callable[[], str | None] | None = None) -> None:
        self.stream = stream
        self.text = ""  # what is shown now ("" when nothing)
        self._current = current

    def show(self, text: str | None) -> None:
        if not text:
            self.clear()
            return
        pad = " " * max(0, len(self.text) - len(text))  # what is left of a longer line before
        self._write("\r" + text + pad)
        self.text = text

    def clear(self) -> None:
        if self.text:
            self._write("\r" + " " * len(self.text) + "\r")
            self.text = ""

    def write_above(self, s: str) -> None:
        """Other output: on its own lines, the progress line drawn again below it."""
        shown = self.text
        self.clear()
        self._write(s)
        if s.endswith("\n"):
            self.show(self._current() if self._current is not None else shown)

    def _write(self, s: str) -> None:
        try:
            self.stream.write(s)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: the sweep goes on without it
            pass

    def stream_for(self) -> _AroundLine:
        return _AroundLine(self)


class _AroundLine:
    """A text stream for log handlers: each write lands above the progress line, which follows it."""

    def __init__(self, line: TerminalLine) -> None:
        self.line = line

    def write(self, s: str) -> int:
        self.line.write_above(s)
        return len(s)

    def flush(self) -> None:
        self.line._write("")  # _write flushes

    def isatty(self) -> bool:
        return True


class PlainFormatter(logging.Formatter):
    """specload's own log lines on a terminal without Locust's ``[time] host/LEVEL/logger:`` prefix
    (44 characters of every line); a warning or error keeps its level as a word. Lines of other
    loggers (Locust's) are formatted as before, by ``inner``. Used only while the progress line
    holds the terminal: files, pipes and CI logs keep the prefix."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        if record.name != "specload" and not record.name.startswith("specload."):
            return self.inner.format(record)
        text = record.getMessage()
        if record.levelno >= logging.WARNING:
            text = f"{record.levelname.lower()}: {text}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def terminal_handlers(stream: TextIO) -> list[logging.StreamHandler[Any]]:
    """The logging handlers that write to ``stream`` (the terminal), in every logger."""
    loggers: list[Any] = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    found: list[logging.StreamHandler[Any]] = []
    for lg in loggers:
        for h in getattr(lg, "handlers", ()):
            if type(h) is logging.StreamHandler and h.stream is stream and h not in found:
                found.append(h)
    return found
