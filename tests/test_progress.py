"""specload.present.progress: the running level's progress line, from a real controller driven by a fake clock."""

from __future__ import annotations

import io
import logging
import re

import pytest

from specload.present.progress import (
    LevelSnapshot,
    TerminalLine,
    clock,
    render,
    snapshot,
    terminal_handlers,
    time_left_s,
)
from specload.sweep.levels import SweepController, plan_levels
from specload.workload.config import Scenario
from tests.test_levels import Clock, grants, rec

T = 1000.0


def controller(sc: Scenario) -> tuple[SweepController, Clock]:
    clk = Clock(T)
    return SweepController(plan_levels(sc), sc.pause_s, sc.level_timeout_s, clock=clk), clk


def measuring(levels: list[int], **fields: object) -> tuple[SweepController, Clock]:
    """A controller whose first level has its users and is handing out measured tickets."""
    c, clk = controller(Scenario(levels=levels, **fields))  # type: ignore[arg-type]
    c.tick(0)  # ramping
    clk.t += 0.5
    c.tick(levels[0])  # users there: measure (no warmup)
    return c, clk


def snap(c: SweepController, clk: Clock) -> LevelSnapshot:
    assert c.current is not None
    return snapshot(c.current, len(c.levels), clk())


def test_a_budget_level_as_requests_come_back() -> None:
    c, clk = measuring([4, 16], output_tokens=50)  # budget 8: two waves of 4
    gs = grants(c)
    assert len(gs) == 8
    clk.t += 1.0
    s = snap(c, clk)
    assert (s.label, s.phase, s.done, s.budget, s.in_flight) == ("c004", "draining", 0, 8, 8)
    assert s.agg_tok_s is None and time_left_s(s) is None  # nothing back yet: nothing to go by
    assert (
        render(s, 100)
        == "level 1/2 c004 [..............................] 0/8 req, 8 in flight, - tok/s [00:02<?]"
    )
    # The first wave: 4 requests sent at T+0.5, back at T+2.5 (2 s each, 50 tokens).
    clk.t = T + 2.5
    for g in gs[:4]:
        c.receive(rec(g, tokens=50, t_send=T + 0.5, t_end=T + 2.5))
    s = snap(c, clk)
    assert s.done == 4 and s.in_flight == 4
    assert s.agg_tok_s == pytest.approx(200 / 2.0)  # the level's Agg tok/s so far: 200 tokens in 2 s
    assert time_left_s(s) == pytest.approx(2.0)  # 4 more at 0.5 s each (4 back in 2 s of measuring)
    clk.t += 0.75
    assert time_left_s(snap(c, clk)) == pytest.approx(1.25)  # counts down between arrivals
    assert snap(c, clk).agg_tok_s == pytest.approx(100.0)  # and the rate does not sag meanwhile
    line = render(snap(c, clk), 100)
    assert (
        line
        == "level 1/2 c004 [###############...............] 4/8 req, 4 in flight, 100.0 tok/s [00:03<00:01]"
    )
    clk.t += 10
    assert time_left_s(snap(c, clk)) == 0.0  # late, never negative


def test_failures_are_counted_on_the_line() -> None:
    c, clk = measuring([2], output_tokens=10)
    g1, g2, *_ = grants(c)
    clk.t = T + 1.5
    c.receive(rec(g1, tokens=10, t_send=T + 0.5, t_end=T + 1.5))
    c.receive(rec(g2, status="failed", tokens=0, t_send=T + 0.5, t_end=T + 1.0))
    line = render(snap(c, clk), 120)
    assert "2/4 req" in line and line.endswith("10.0 tok/s, 1 failed [00:02<00:01]"), line


def test_ramping_and_warmup() -> None:
    c, clk = controller(Scenario(levels=[8, 16], warmup_requests=1))
    c.tick(0)
    clk.t += 3
    assert render(snap(c, clk), 100) == "level 1/2 c008 starting 8 users [00:03<?]"
    c.tick(8)
    assert render(snap(c, clk), 100) == "level 1/2 c008 warmup 0/1 [00:03<?]"
    c2, clk2 = controller(Scenario(levels=[1], warmup_requests=0))
    c2.tick(0)
    assert render(snap(c2, clk2), 100) == "level 1/1 c001 starting 1 user [00:00<?]"


def test_a_time_boxed_level_counts_its_time() -> None:
    c, clk = measuring([4], duration_s=30.0)
    g = c.grant()  # a time-boxed level grants while it runs: take one
    assert g is not None
    clk.t += 12
    c.receive(rec(g, tokens=40, t_send=T + 0.5, t_end=T + 4.5))
    s = snap(c, clk)
    assert s.budget is None and time_left_s(s) == pytest.approx(18.0)
    line = render(s, 120)
    assert line.startswith("level 1/1 c004 [############") and "1 req, 00:12/00:30, " in line, line
    assert line.endswith("10.0 tok/s [00:13<00:18]"), line


@pytest.mark.parametrize(
    ("width", "expected"),
    [
        (
            250,
            "level 1/1 c128 [..............................] 0/256 req, 256 in flight, - tok/s [1:02:06<?]",
        ),
        (80, "level 1/1 c128 [................] 0/256 req, 256 in flight, - tok/s [1:02:06<?]"),
        (
            60,
            "level 1/1 c128 [...........] 0/256 req, - tok/s [1:02:06<?]",
        ),  # the in-flight count goes first,
        (50, "level 1/1 c128 0/256 req, - tok/s [1:02:06<?]"),  # then the bar,
        (40, "level 1/1 c128 0/256 req [1:02:06<?]"),  # then the rate,
        (30, "level 1/1 c128 0/256 req [1:0"),  # then it is cut
    ],
)
def test_the_line_fits_the_width(width: int, expected: str) -> None:
    c, clk = measuring([128], output_tokens=10)
    grants(c)
    clk.t += 3725
    line = render(snap(c, clk), width)
    assert line == expected
    assert len(line) <= width - 1  # never the last column: some terminals wrap there


def test_a_rate_level_is_named_as_its_log_lines_name_it() -> None:
    c, clk = controller(Scenario(rates=[2.5], requests=10))
    c.tick(0)
    assert render(snap(c, clk), 100).startswith("level 1/1 rate2.5 starting ")


def test_clock() -> None:
    assert [clock(None), clock(0), clock(4.4), clock(59.6), clock(754), clock(3723)] == [
        "?",
        "00:00",
        "00:04",
        "01:00",
        "12:34",
        "1:02:03",
    ]


def test_terminal_line_redraws_in_place_and_keeps_log_lines_above() -> None:
    out = io.StringIO()
    now: list[str | None] = ["bar 2"]
    line = TerminalLine(out, lambda: now[0])
    line.show("bar one")
    line.show("bar 2")  # shorter: the rest of the longer one is blanked
    assert out.getvalue() == "\rbar one" + "\rbar 2  "
    out.truncate(0), out.seek(0)
    stream = line.stream_for()
    stream.write("a log line\n")  # what a log handler writes: above the bar, then the bar again
    assert out.getvalue() == "\r" + " " * 5 + "\r" + "a log line\n" + "\rbar 2"
    out.truncate(0), out.seek(0)
    now[0] = None  # the level ended: after the next log line, nothing is drawn
    stream.write("done\n")
    assert out.getvalue() == "\r" + " " * 5 + "\r" + "done\n"
    line.clear()  # nothing shown: nothing written
    assert out.getvalue() == "\r" + " " * 5 + "\r" + "done\n"


def test_terminal_handlers_are_the_stream_handlers_of_that_stream(tmp_path) -> None:  # type: ignore[no-untyped-def]
    term, other = io.StringIO(), io.StringIO()
    on_term, on_other = logging.StreamHandler(term), logging.StreamHandler(other)
    to_file = logging.FileHandler(tmp_path / "log")
    lg = logging.getLogger("specload.test_progress")
    for h in (on_term, on_other, to_file):
        lg.addHandler(h)
    try:
        assert terminal_handlers(term) == [on_term]
    finally:
        for h in (on_term, on_other, to_file):
            lg.removeHandler(h)
        to_file.close()


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_owners_bar_redraws_under_the_log_lines_and_gives_the_handlers_back() -> None:
    import gevent

    from specload.locust.progressbar import start_progress

    assert start_progress(lambda: None, io.StringIO()) is None  # not a terminal: no bar, handlers untouched
    c, clk = measuring([4], output_tokens=50)
    term = _Tty()
    handler = logging.StreamHandler(term)
    lg = logging.getLogger("specload.test_progress_bar")
    lg.addHandler(handler)
    lg.propagate = False
    try:
        bar = start_progress(lambda: c, term)
        assert bar is not None and handler.stream is not term  # the handler now writes around the line
        gevent.sleep(0.3)  # one redraw at least
        lg.warning("a log line")
        drawn = term.getvalue()
        bar.stop()
        assert handler.stream is term and handler.formatter is None  # and its own formatter again
        line = render(snap(c, clk), 80)  # a StringIO has no size: 80 columns (the clock stands still)
        assert line.startswith("level 1/1 c004 [......")
        blank = "\r" + " " * len(line) + "\r"
        assert re.fullmatch(
            f"(\\r{re.escape(line)})+{re.escape(blank)}warning: a log line\n\\r{re.escape(line)}", drawn
        ), drawn
        # (on the terminal, specload's lines lose Locust's log prefix; a warning keeps its level)
        assert term.getvalue() == drawn + blank  # stopped: the line is blanked, nothing drawn after
        lg.warning("after")
        assert (
            term.getvalue() == drawn + blank + "after\n"
        )  # the handler writes straight to the terminal again
    finally:
        lg.removeHandler(handler)
        lg.propagate = True
