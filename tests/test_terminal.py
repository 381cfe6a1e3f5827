"""`specload sweep` on a terminal and off it: a real short sweep against the simulator, under a
pseudo-terminal (python's ``pty``, 80 and 200 columns) and with pipes, as in CI.

On the terminal: a progress line per level, redrawn in place with ``\\r``, the log lines kept whole
above it without Locust's log prefix, the verdict words in colour (not with NO_COLOR), and every
line of the final report (each table, each verdict) within the terminal's width. Off it: the plain
log lines of before, prefix and all, not one ``\\r`` nor a colour code, and the table fitted to
the default width (120).
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest

from specload.present.tableview import DEFAULT_WIDTH
from tests.conftest import REPO, specload_cmd

SIM_ARGS = ("--ttft-ms", "100", "--itl-ms", "20", "--max-running", "64", "--model", "m")
LEVELS = (2, 4)  # budgets 4 and 8: two waves of ~0.9 s each
COLS = (80, 200)
BAR = re.compile(
    r"\r(level (\d)/2 (c\d{3}) \[[#.]+\] (\d+)/(\d+) req, \d+ in flight, (?:-|\d+\.\d) tok/s \[\d\d:\d\d<(?:\?|\d\d:\d\d)\])"
)
LOG_LINE = re.compile(r"^\[[^\]]+\] [^ ]+/(INFO|WARNING)/specload: level (\d)/2 (c\d{3}) (started|done): ")
TTY_LINE = re.compile(r"^()level (\d)/2 (c\d{3}) (started|done): ")  # on a terminal: no log prefix
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("COLUMNS", "LINES", "SPECLOAD_API_KEY", "OPENAI_API_KEY")
    }
    return {
        **env,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
    }


def _sweep_cmd(url: str, out: Path) -> list[str]:
    return specload_cmd(
        "sweep",
        "--host",
        url,
        "--levels",
        ",".join(map(str, LEVELS)),
        "--input-tokens",
        "32",
        "--output-tokens",
        "40",
        "--out",
        str(out),
        "--slo",
        "ttft_p99=30s",
    )


def _run_in_pty(
    cmd: list[str], cols: int, timeout: float = 120.0, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Run ``cmd`` with a pseudo-terminal of ``cols`` columns as its stdin, stdout and stderr; its exit
    code and everything it wrote. The process group is interrupted, then killed, if it outlives ``timeout``."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, cols, 0, 0))
    proc = subprocess.Popen(
        cmd, stdin=slave, stdout=slave, stderr=slave, env=env or _env(), cwd=str(REPO), start_new_session=True
    )
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None and not select.select([master], [], [], 0.5)[0]:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not data:
                break
            out += data
        else:
            raise AssertionError(f"the sweep outlived {timeout:g} s: {out[-3000:].decode(errors='replace')}")
        return proc.wait(timeout=30), out.decode("utf-8", "replace")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        os.close(master)


def _table_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("|")]


def _check_table(text: str, width: int) -> None:
    lines = _table_lines(text)
    assert lines and "| Agg tok/s |" in lines[0], text[-3000:]
    assert max(len(ln) for ln in lines) <= width, lines[0]
    (note,) = [ln for ln in text.splitlines() if " with --columns all (or in report.md): " in ln]
    assert len(note) <= width


@pytest.mark.parametrize("cols", COLS)
def test_progress_bar_and_fitted_table_on_a_terminal(sim, tmp_path: Path, cols: int) -> None:  # type: ignore[no-untyped-def]
    server = sim(*SIM_ARGS)
    code, raw = _run_in_pty(_sweep_cmd(server.url, tmp_path / "out"), cols)
    assert code == 0, raw[-3000:]
    text = raw.replace("\r\n", "\n")  # the terminal's own newline translation; every other \r is ours
    # The bar of each level, redrawn in place: several different states, each after a \r.
    bars = BAR.findall(text)
    for n, label in ((1, "c002"), (2, "c004")):
        mine = [b for b in bars if b[1] == str(n) and b[2] == label]
        assert len({b[0] for b in mine}) >= 3, (label, bars)
        assert {int(b[4]) for b in mine} == {LEVELS[n - 1] * 2}  # done/budget against the level's budget
        done = [int(b[3]) for b in mine]
        assert done == sorted(done) and done[-1] >= LEVELS[n - 1], done  # counts up: one wave at least
        assert any(re.search(r"\d+\.\d tok/s \[\d\d:\d\d<\d\d:\d\d\]", b[0]) for b in mine), (
            mine
        )  # rate, time left
    assert all(len(b[0]) <= cols - 1 for b in bars)
    # The log lines stay whole, each on its own line: the bar is blanked before one is written.
    logged = []
    for line in text.split("\n"):
        assert not LOG_LINE.match(line.rsplit("\r", 1)[-1]), line  # specload's lines: no Locust prefix
        m = TTY_LINE.match(line.rsplit("\r", 1)[-1])
        if m:
            logged.append((m.group(3), m.group(4)))
            drawn = line.split("\r")[
                :-1
            ]  # what was drawn on this line before the log text: bars, then a blank
            if drawn:
                blank = drawn[-1]
                assert blank.strip() == "" and len(blank) >= max(map(len, drawn[:-1]), default=0), repr(line)
    assert logged == [("c002", "started"), ("c002", "done"), ("c004", "started"), ("c004", "done")]
    assert not re.search(r"tok/s \[[^\]\n]*\]\[", text)  # no bar glued to a log line
    # The final report, printed after the bar is gone, fits the terminal: every table (the notes say
    # what is hidden) and every verdict line, wrapped at word boundaries; its verdict words in colour.
    table = text[text.index("# specload report") :]
    assert "\r" not in table
    assert re.search(r"\x1b\[32mmeets?\x1b\[0m", table), table
    plain = ANSI.sub("", table)
    _check_table(plain, cols)
    assert "## SLO" in plain and "## Throughput" in plain and "## Latency distributions" in plain
    # (a path longer than the width cannot be wrapped: the one word it is stays whole)
    over = [ln for ln in plain.splitlines() if len(ln) > cols and max(map(len, ln.split())) < cols - 8]
    assert not over, over
    # every line of words ends at a word: no word is cut in two
    assert not [ln for ln in plain.splitlines() if not ln.startswith("|") and re.search(r"\w-$", ln)]


def test_no_colour_with_no_color(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = sim(*SIM_ARGS)
    code, raw = _run_in_pty(_sweep_cmd(server.url, tmp_path / "out"), 120, env={**_env(), "NO_COLOR": "1"})
    assert code == 0, raw[-3000:]
    assert "\x1b[" not in raw[raw.index("# specload report") :]
    assert re.search(r"\bmeets?\b", raw[raw.index("# specload report") :])


def test_plain_lines_and_default_width_without_a_terminal(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = sim(*SIM_ARGS)
    out = subprocess.run(
        _sweep_cmd(server.url, tmp_path / "out"),
        capture_output=True,
        text=True,
        timeout=180,
        env=_env(),
        cwd=str(REPO),
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "\r" not in out.stdout + out.stderr  # no bar, no redraw: lines only, as in CI logs
    assert "\x1b[" not in out.stdout + out.stderr  # no colour off a terminal
    logged = [(m.group(3), m.group(4)) for ln in out.stderr.splitlines() if (m := LOG_LINE.match(ln))]
    assert logged == [("c002", "started"), ("c002", "done"), ("c004", "started"), ("c004", "done")]
    assert re.search(r"/INFO/specload: level 1/2 c002 started: C=2, 4 requests\n", out.stderr)
    assert re.search(
        r"/specload: level 2/2 c004 done: 8/8 requests, ok 8, failed 0, short 0, 320 tokens, "
        r"agg \d+\.\d tok/s over \d+\.\d s; client [^\r\n]+\n",
        out.stderr,
    )
    _check_table(out.stdout, DEFAULT_WIDTH)
