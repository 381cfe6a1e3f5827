"""The sweep owner's progress line on a terminal: a greenlet that redraws it four times a second.

Started by the owner with each run, only when the process's stderr (where its log lines go) is a
terminal: the Locust child of ``specload sweep`` inherits the user's terminal, so that is the
case there, and never in CI, under a pipe or into a file, where the log lines stay exactly as they
were. What the line says is specload.present.progress; this module only schedules it and keeps the log
lines above it (the terminal's log handlers write through ``TerminalLine.stream_for``).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any, TextIO

import gevent

from specload.core.records import Phase
from specload.present.progress import PlainFormatter, TerminalLine, render, snapshot, terminal_handlers
from specload.sweep.levels import SweepController

logger = logging.getLogger("specload")

REDRAW_S = 0.25
FALLBACK_WIDTH = 80
_SHOWN = (Phase.RAMPING, Phase.WARMUP, Phase.MEASURE, Phase.DRAINING)


def _width(stream: TextIO) -> int:
    """The terminal's width now (asked at every redraw: the window may be resized)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or FALLBACK_WIDTH
    except (OSError, ValueError):
        return FALLBACK_WIDTH


def wants_bar(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class ProgressBar:
    """The running level's line on ``stream``, redrawn until ``stop``."""

    def __init__(self, ctrl_of: Callable[[], SweepController | None], stream: TextIO) -> None:
        self.ctrl_of = ctrl_of
        self.stream = stream
        self.line = TerminalLine(stream, self.text)
        # and each one's own stream and formatter
        self._handlers: list[tuple[logging.StreamHandler[Any], Any, logging.Formatter | None]] = []
        self._greenlet: Any = None

    def start(self) -> ProgressBar:
        around = self.line.stream_for()
        for h in terminal_handlers(self.stream):
            self._handlers.append((h, h.setStream(around), h.formatter))
            h.setFormatter(PlainFormatter(h.formatter))  # specload's lines without Locust's prefix
        self._greenlet = gevent.spawn(self._run)
        return self

    def text(self) -> str | None:
        """The line for the level running now; None between levels and after the last."""
        ctrl = self.ctrl_of()
        lv = ctrl.current if ctrl is not None else None
        if ctrl is None or lv is None or lv.phase not in _SHOWN:
            return None
        return render(snapshot(lv, len(ctrl.levels), ctrl.clock()), _width(self.stream))

    def _run(self) -> None:
        while True:
            try:
                self.line.show(self.text())
            except Exception as e:  # noqa: BLE001 - a progress line must never stop a sweep
                self._greenlet = None
                self._release()
                logger.warning("progress line stopped: %r (the log lines go on)", e)
                return
            gevent.sleep(REDRAW_S)

    def stop(self) -> None:
        """Clear the line and give the log handlers their terminal back (idempotent)."""
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
            self._greenlet = None
        self._release()

    def _release(self) -> None:
        self.line.clear()
        for h, original, formatter in self._handlers:
            h.setStream(original)
            h.setFormatter(formatter)
        self._handlers = []


def start_progress(
    ctrl_of: Callable[[], SweepController | None], stream: TextIO | None = None
) -> ProgressBar | None:
    """A progress line when ``stream`` (default: stderr) is a terminal, else None: plain log lines."""
    stream = stream if stream is not None else sys.stderr
    return ProgressBar(ctrl_of, stream).start() if wants_bar(stream) else None
