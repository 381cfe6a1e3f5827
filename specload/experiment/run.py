"""The experiment loop: for each repeat, each arm in turn: start its server, wait for health, smoke-check
it, sweep it, stop it; then compare the arms.

Arms are interleaved (A, B, A, B, ...) so that drift of the machine or the servers lands in every arm's
confidence interval instead of in the difference between arms measured hours apart. Each start is its own
run directory; the comparison pools an arm's runs as repeats of its levels, the way a run's own
``--repeat`` is pooled (``specload.analysis.metrics.repeats_at``), and is made and laid out by
specload's comparison code. The first failure stops the experiment: its server is stopped, the runs
already made stay as they are (``specload report`` reads each), and experiment.json says what happened.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

from specload.analysis.comparison import Comparison
from specload.analysis.draftlen import draft_length_table, render_draft_length
from specload.client.http import redact_host
from specload.client.introspect import server_config
from specload.client.probe import ServerUnreachable
from specload.core.rundir import RUN_INTERRUPTED, new_run_dir, safe_name
from specload.experiment.cap import declare_command_cap
from specload.experiment.draft import draft_family
from specload.experiment.plan import Arm, ExperimentError, Plan, load_plan, scenario_toml
from specload.experiment.pooled import ArmRuns, pooled_comparison
from specload.experiment.record import (
    COMPLETED,
    INCOMPLETE,
    INTERRUPTED,
    NOT_READY,
    REFUSED,
    SERVER_DIED,
    STARTING,
    SWEEP_TOML,
    SWEEPING,
    UNREACHABLE,
    Experiment,
    RunEntry,
    hide,
    known_secrets,
    scrub,
    scrub_argv,
)
from specload.experiment.servers import Server, ServerError, start_server, wait_healthy
from specload.experiment.smoke import smoke_check, speculation_problem, speculation_warning
from specload.launch import (
    DEFAULT_LOCUSTFILE,
    EXIT_INCOMPLETE,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    LaunchError,
    SweepSettings,
    check_settings,
    free_port,
    run_sweep,
)
from specload.present.compare import (
    ComparisonResult,
    print_result,
    write_comparison,
)
from specload.present.output import is_document, is_known_format
from specload.present.pairedview import paired_json
from specload.present.tableview import WHOLE, TableView

DRAFT_LENGTH_MD = "draft-length.md"  # the draft-length table, when arms differ only in draft length
EXIT_REFUSED = 4  # a speculative arm's server showed no accepted draft token
DEATH_POLL_S = 0.2


@dataclass
class ExperimentSettings:
    """``specload experiment`` as the user asked for it."""

    plan_path: str
    repeat: int = 1
    out: str = "results"
    overrides: dict[str, Any] = field(default_factory=dict)  # scenario field -> value, from the flags
    report_format: str = "github"
    view: TableView = WHOLE
    insecure: bool = False
    processes: int | None = None
    plot: bool = True
    locust_args: Sequence[str] = ()
    locustfile: Path = DEFAULT_LOCUSTFILE
    # --predict: the baseline ladder, speculative probes, then only the deciding levels
    # (specload.experiment.predicted); repeat_auto: --repeat auto, within budget_s seconds
    predict: bool = False
    repeat_auto: bool = False
    budget_s: float | None = None


class _Guard:
    """SIGINT and SIGTERM while the experiment runs: each becomes a KeyboardInterrupt in the main thread
    (the server is then stopped on the way out), except while a server is being stopped, when it is
    only noted. During a sweep, ``launch.run_locust`` passes them on to Locust instead, which ends the
    sweep as interrupted. ``own``: the next SIGINT is the death watch's, not the user's."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.armed = True
        self.own = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.own and signum == signal.SIGINT:
            self.own = False
        elif self.received is None:
            self.received = signum
        if self.armed:
            raise KeyboardInterrupt

    def install(self) -> None:
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        armed, self.armed = self.armed, False
        try:
            yield
        finally:
            self.armed = armed


class _DeathWatch:
    """Notices the server exiting during the sweep and ends the sweep the way Ctrl-C does (a SIGINT to
    ourselves, which run_locust passes on to Locust): the run is kept, marked interrupted."""

    def __init__(self, server: Server, guard: _Guard) -> None:
        self.server, self.guard = server, guard
        self.code: int | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="server-death-watch", daemon=True)

    def _watch(self) -> None:
        while not self._done.wait(DEATH_POLL_S):
            code = self.server.exit_code()
            if code is not None:
                self.code = code
                self.guard.own = True
                os.kill(os.getpid(), signal.SIGINT)
                return

    def __enter__(self) -> _DeathWatch:
        if self.server.proc is not None:
            self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()


class _Refused(Exception):
    """The arm's server answers, but cannot be swept as the arm says (no acceptance, a failed smoke request)."""


def _died(server: Server) -> str:
    return f"the server of {server.label} exited (code {server.exit_code()}) during its run; its log: {server.log_path}"


def _sweep_settings(s: ExperimentSettings, sweep_file: str, host: str, label: str, out: str) -> SweepSettings:
    return SweepSettings(
        host=host,
        scenario_file=sweep_file,
        overrides=dict(s.overrides),
        label=label,
        out=out,
        insecure=s.insecure,
        processes=s.processes,
        locust_args=s.locust_args,
        locustfile=s.locustfile,
    )


def _run_entry(
    ex: Experiment,
    s: ExperimentSettings,
    arm: Arm,
    e: RunEntry,
    guard: _Guard,
    levels: Callable[[dict[str, Any], Sequence[str]], list[int]] | None = None,
    then: Callable[[RunEntry], tuple[RunEntry, list[int]] | None] | None = None,
) -> None:
    """One start of ``arm``: sets e.status (and e.message when it did not complete); the server is stopped
    whatever happens, KeyboardInterrupt included (which is passed on). ``levels``: the levels to sweep,
    chosen from the server's configuration and command line once it is up (--predict's probes).
    ``then``: after a completed sweep, the next entry (already in ``ex.entries``) and its levels to
    sweep on the same server, or None to stop it (--predict's deciding levels)."""
    secrets = known_secrets(arm)
    sweep_file = str(ex.directory / SWEEP_TOML)
    server: Server | None = None
    watch: _DeathWatch | None = None
    e.status, e.started_at = STARTING, time.time()
    try:
        if arm.command is not None:
            e.port = free_port()
            log = ex.directory / f"{e.order:02d}-{safe_name(arm.label)}.server.log"
            server = start_server(arm, e.port, log, secrets)
            e.pid, e.server_log, e.command = server.pid, str(log), scrub_argv(server.argv or [], secrets)
        else:
            server = Server(arm.label, _url_of(arm))
        e.url = server.url
        ex.save()
        print(
            f"specload: {arm.label} (run {e.order}/{len(ex.entries)}): waiting for {server.url}{arm.health}",
            flush=True,
        )
        sc = _sweep_settings(s, sweep_file, server.url, arm.label, str(ex.directory)).scenario()
        e.health_s = wait_healthy(server, arm, s.insecure, sc.loading_timeout_s)
        e.server_config = scrub(server_config(server.url, insecure=s.insecure), secrets)
        if levels is not None:
            s = replace(s, overrides={**s.overrides, "levels": levels(e.server_config, server.argv or ())})
        try:
            smoke = smoke_check(server.url, sc, s.insecure, server.argv or ())
        except ServerUnreachable as err:
            if server.exit_code() is not None:
                raise ServerError(_died(server)) from None
            raise ServerError(f"the smoke request to {arm.label} got no answer: {err}") from None
        e.smoke = scrub(smoke.to_json(), secrets)
        problem = speculation_problem(arm.label, smoke) if arm.speculative else None
        if problem is None and not smoke.ok:
            problem = f"the smoke request to {arm.label} failed: {smoke.reason}"
        if problem is not None:
            raise _Refused(problem)
        warning = speculation_warning(arm.label, smoke) if arm.speculative else None
        if warning is not None:
            print(f"specload: warning: {warning}", file=sys.stderr)
        if smoke.active and not arm.speculative:
            print(
                f"specload: warning: {arm.label} is not marked speculative, yet its server accepts draft "
                f"tokens ({smoke.seen()})",
                file=sys.stderr,
            )
        elif smoke.active:
            print(
                f"specload: {arm.label}: speculation active ({smoke.seen()})",
                flush=True,
            )
        # With csv or json, stdout holds the comparison's data alone: the arms' reports are not printed.
        report = None if is_document(s.report_format) else s.report_format
        while True:
            e.status, e.sweep_started_at = SWEEPING, time.time()
            ex.save()
            with _DeathWatch(server, guard) as watch:
                outcome = run_sweep(
                    _sweep_settings(s, sweep_file, server.url, arm.label, str(ex.directory)), report, s.view
                )
            e.run_dir, e.sweep_exit = outcome.run_dir, outcome.exit_code
            if e.run_dir is not None and server.argv:
                declare_command_cap(e.run_dir, server.argv)
            if watch.code is not None or server.exit_code() is not None:
                e.status, e.message = SERVER_DIED, _died(server)
            elif outcome.exit_code == EXIT_OK:
                e.status = COMPLETED
            elif outcome.status == RUN_INTERRUPTED:
                e.status, e.message = INTERRUPTED, "interrupted"
            else:
                e.status = INCOMPLETE
                e.message = f"the sweep of {arm.label} did not complete (status {outcome.status}, exit {outcome.exit_code})"
            follow = (
                then(e) if then is not None and e.status == COMPLETED and guard.received is None else None
            )
            if follow is None:
                break
            # another sweep of the same server (--predict: the deciding levels after the probes), its own
            # entry and run directory, without a restart
            e.ended_at = time.time()
            nxt, more = follow
            nxt.started_at, nxt.port, nxt.pid, nxt.url, nxt.command = (
                time.time(),
                e.port,
                e.pid,
                e.url,
                e.command,
            )
            nxt.server_config, nxt.server_log, nxt.health_s = e.server_config, e.server_log, 0.0
            e = nxt
            s = replace(s, overrides={**s.overrides, "levels": list(more)})
    except KeyboardInterrupt:
        if watch is not None and watch.code is not None and server is not None:
            e.status, e.message = SERVER_DIED, _died(server)
        else:
            e.status, e.message = INTERRUPTED, "interrupted"
    except _Refused as err:
        e.status, e.message = REFUSED, str(err)
    except ServerError as err:
        died = server is not None and server.exit_code() is not None and e.health_s is not None
        e.status, e.message = (SERVER_DIED if died else NOT_READY), str(err)
    except LaunchError as err:
        e.status = UNREACHABLE if err.code == EXIT_UNREACHABLE else INCOMPLETE
        if server is not None and server.exit_code() is not None:
            e.status, e.message = SERVER_DIED, _died(server)
        else:
            e.message = str(err)
    finally:
        with guard.deferred():
            if server is not None:
                server.stop(arm.stop_grace_s)
                if e.run_dir is not None:
                    before, was = e.server_log, str(server.log_path)
                    server.move_log(e.run_dir)
                    for x in ex.entries:  # every sweep of this server (--predict's follow-ups) names its log
                        if x is e or (x.pid == e.pid and x.server_log == before):
                            x.server_log = str(server.log_path)
                            if x.message is not None:  # (a message that named the log names where it is now)
                                x.message = x.message.replace(was, x.server_log)
            if e.message is not None:  # it may quote the server (its log, an error it sent)
                e.message = hide(e.message, secrets)
            e.ended_at = time.time()
            ex.save()


def _url_of(arm: Arm) -> str:
    """A url arm's URL without its user:password, dropped as ``--host``'s is (``launch.locust_env``):
    nothing in specload sends it, and it would only travel into files and messages."""
    url = arm.url or ""
    if redact_host(url) != url:
        print(
            f"specload: {arm.label}: the user:password in its url is not sent to the server and is dropped; "
            "a bearer key goes in SPECLOAD_API_KEY",
            file=sys.stderr,
        )
    return redact_host(url)


# ---------------------------------------------------------------- the comparison


def compare_arms(ex: Experiment, fmt: str, view: TableView, plot: bool) -> ComparisonResult:
    """The arms side by side (the baseline first), each arm's runs pooled, written in the experiment
    directory (specload.experiment.pooled, which ``specload compare EXPERIMENT_DIR`` uses too)."""
    arms = [
        ArmRuns(
            a.label,
            tuple(
                (e.order, e.run_dir)
                for e in ex.entries
                if e.arm == a.label and e.status == COMPLETED and e.run_dir
            ),
        )
        for a in ex.plan.arms
    ]
    return write_comparison(pooled_comparison(arms), ex.directory, fmt, view, plot)


# ---------------------------------------------------------------- the command


def _check(s: ExperimentSettings) -> tuple[Plan, str]:
    """Everything that can be checked before a server starts: the plan and the sweep file's text, or
    ExperimentError / LaunchError(usage) naming what is wrong."""
    if s.predict and len(load_plan(s.plan_path).arms) != 2:
        raise ExperimentError("--predict: expected two arms (the baseline, then the speculative one)")
    if s.budget_s is not None and not s.repeat_auto:
        raise ExperimentError("--budget: only with --repeat auto")
    if s.repeat < 1:
        raise ExperimentError(f"--repeat: expected a count >= 1, got {s.repeat}")
    if not is_known_format(s.report_format):
        raise ExperimentError(f"--format: unknown table format {s.report_format!r}")
    plan = load_plan(s.plan_path)
    text = scenario_toml(plan.scenario)
    with tempfile.TemporaryDirectory(prefix="specload-experiment-") as tmp:
        path = os.path.join(tmp, SWEEP_TOML)
        Path(path).write_text(text)
        # the flags over the plan's sweep, read back the way each arm's sweep reads it; --processes, --out
        check_settings(_sweep_settings(s, path, "http://127.0.0.1:1", plan.arms[0].label, s.out))
    return plan, text


def _exit_code(status: str) -> int:
    if status == REFUSED:
        return EXIT_REFUSED
    if status in (NOT_READY, UNREACHABLE):
        return EXIT_UNREACHABLE
    return EXIT_INCOMPLETE


def run_experiment(s: ExperimentSettings) -> int:
    """Run the whole experiment; the exit code (see docs/experiment.md)."""
    try:
        plan, sweep_text = _check(s)
    except (ExperimentError, LaunchError) as err:
        print(f"specload experiment: {err}", file=sys.stderr)
        return EXIT_USAGE
    directory = Path(new_run_dir(s.out, f"experiment-{plan.name}"))
    (directory / SWEEP_TOML).write_text(sweep_text)
    ex = Experiment(plan, directory, s.repeat, dict(s.overrides))
    ex.entries = [
        RunEntry(order=i * len(plan.arms) + j + 1, arm=arm.label, repeat=i + 1)
        for i in range(s.repeat)
        for j, arm in enumerate(plan.arms)
    ]
    arms = {a.label: a for a in plan.arms}
    print(f"specload: experiment {plan.name}: {len(ex.entries)} runs in {directory}", flush=True)
    ex.save()
    guard = _Guard()
    guard.install()
    failed: RunEntry | None = None
    try:
        for e in ex.entries:
            try:
                _run_entry(ex, s, arms[e.arm], e, guard)
            except KeyboardInterrupt:  # between two steps: nothing of this entry is running
                e.status, e.message = INTERRUPTED, "interrupted"
            if e.status != COMPLETED or guard.received is not None:
                if e.status == COMPLETED:  # the signal came after its sweep
                    failed = RunEntry(0, e.arm, e.repeat, INTERRUPTED, "interrupted")
                else:
                    failed = e
                break
    finally:
        with guard.deferred():
            ex.ended_at = time.time()
            if failed is None:
                ex.status = "completed"
            else:
                ex.status = "interrupted" if failed.status == INTERRUPTED else "failed"
                ex.message = failed.message
            ex.save()
        guard.restore()
    if failed is not None:
        return _report_failure(ex, failed)
    try:
        result = compare_arms(ex, s.report_format, s.view, s.plot)
    except ValueError as err:
        print(f"specload experiment: cannot compare the arms: {err}", file=sys.stderr)
        return EXIT_INCOMPLETE
    print("")
    print_result(result)
    comp = result.comparison
    ex.comparison = {
        "markdown": str(result.markdown),
        "plots": [str(p) for p in (result.plot, result.pareto) if p is not None],
        "html": None if result.page is None else str(result.page),
        "sentences": comp.sentences,
        "capacity": comp.slo.sentences,
        "notes": comp.notes,
        "paired": paired_json(comp.paired),
    }
    ex.comparison.update(draft_lengths(ex, comp))
    ex.save()
    print(f"specload: experiment {directory} ({ex.path.name})", flush=True)
    return EXIT_OK


def draft_lengths(ex: Experiment, comp: Comparison) -> dict[str, Any]:
    """When some arms differ only in draft length: the draft-length table, printed and written as
    draft-length.md ({} otherwise); experiment.json ``comparison.draft_length``."""
    family = draft_family([(a.label, a.command) for a in ex.plan.arms if a.command is not None])
    table = draft_length_table(comp, family) if family else None
    if table is None:
        return {}
    text = render_draft_length(table, "Req/s" if comp.axis.rate else "C")
    path = ex.directory / DRAFT_LENGTH_MD
    path.write_text(text)
    print("")
    print(text, end="", flush=True)
    return {"draft_length": table.to_json(), "draft_length_markdown": str(path)}


def _report_failure(ex: Experiment, failed: RunEntry) -> int:
    print(f"specload experiment: {failed.message or failed.status}", file=sys.stderr)
    kept = [e.run_dir for e in ex.entries if e.run_dir]
    if kept:
        print("specload experiment: runs kept (`specload report DIR`):", file=sys.stderr)
        for d in kept:
            print(f"  {d}", file=sys.stderr)
    print(f"specload experiment: {ex.path}", file=sys.stderr)
    return _exit_code(failed.status)
