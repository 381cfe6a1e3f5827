"""report.md of a run that ended, written by a child Python, never by the Locust process.

Reading a big run back is CPU-bound for minutes (about 120 s at 5 million records): in the Locust
process it would hold up the gevent loop, so the master's heartbeats would stop and its workers
give up on it after 60 s, and a web UI would stop answering. The child (``python -m
specload.locust.reportjob RUN_DIR [--print]``) reads the run and writes report.md; with ``--print`` it also prints
the report on its stdout (the Locust process's), as a plain headless ``locust`` run shows it. The
Locust process waits for it without blocking its loop (gevent's subprocess), for at most
``REPORT_TIMEOUT_S``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gevent
from gevent import subprocess
from gevent.event import Event

import specload

logger = logging.getLogger("specload")

REPORT_TIMEOUT_S = 600.0  # a 5M-record run takes ~120 s; past this the child is stopped
_PRINT = "--print"


def _child_env() -> dict[str, str]:
    """Our environment, with this specload first on the child's path (a checkout run in place)."""
    pkg_root = str(Path(specload.__file__).resolve().parent.parent)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (pkg_root, os.environ.get("PYTHONPATH")) if p),
    }


class ReportJob:
    """One report child: started at once, watched by a greenlet that logs how it ended.

    ``print_table``: the child prints the report on the Locust process's stdout as well.
    ``on_done``: called with True (report.md written) or False once the child has ended.
    """

    def __init__(
        self,
        run_dir: str,
        print_table: bool = False,
        timeout_s: float = REPORT_TIMEOUT_S,
        on_done: Callable[[bool], None] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.timeout_s = timeout_s
        self.ok: bool | None = None  # None while the child runs
        self._done = Event()
        self._on_done = on_done
        cmd = [
            sys.executable,
            "-m",
            "specload.locust.reportjob",
            os.path.abspath(run_dir),
            *([_PRINT] if print_table else []),
        ]
        try:
            self._proc: Any = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=None if print_table else subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=_child_env(),
                # ``python -m`` puts its current folder first on the path: the folder that holds this
                # very package, so that a folder named specload where the user stands cannot shadow it
                cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
            )
        except OSError as e:
            self._proc = None
            self._end(False, f"could not start it ({e.strerror or e})")
            return
        logger.info("report.md of %s: being written by a child process (pid %d)", run_dir, self._proc.pid)
        self._greenlet = gevent.spawn(self._watch)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else int(self._proc.pid)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def _watch(self) -> None:
        try:
            _, err = self._proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.communicate()
            self._end(False, f"not done within {self.timeout_s:g} s (stopped)")
            return
        if self._proc.returncode == 0:
            self._end(True, None)
            return
        lines = (err or b"").decode("utf-8", "replace").strip().splitlines()
        self._end(False, lines[-1] if lines else f"exit code {self._proc.returncode}")

    def _end(self, ok: bool, why: str | None) -> None:
        self.ok = ok
        if not ok:
            logger.warning("could not write report.md (%s); run `specload report %s`", why, self.run_dir)
        self._done.set()
        if self._on_done is not None:
            self._on_done(ok)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait (letting other greenlets run) until the child has ended; whether report.md was written."""
        self._done.wait(timeout_s)
        return bool(self.ok)


def main(argv: Sequence[str] | None = None) -> int:
    """``RUN_DIR [--print]``: write the run's report.md (and print the report with ``--print``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    show = _PRINT in args
    rest = [a for a in args if a != _PRINT]
    if len(rest) != 1:
        print(f"usage: python -m specload.locust.reportjob RUN_DIR [{_PRINT}]", file=sys.stderr)
        return 2
    # A web UI may start its next sweep while this runs: the sweep's client comes first. A Ctrl-C in
    # the terminal is for Locust (which stops waiting for us); report.md is still written.
    with contextlib.suppress(OSError):
        os.nice(10)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from specload.analysis.run import load_run
    from specload.present.report import render_report, write_report_md

    try:
        run = load_run(rest[0])
        write_report_md(run)
    except Exception as e:  # noqa: BLE001 - said in one line; the raw files are on disk whatever happens
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if show:
        print(render_report(run, "github"), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
