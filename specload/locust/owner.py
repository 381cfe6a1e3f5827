"""The sweep's owner: runs in the one process that owns the run directory (Locust master, or the
only process when local). It coordinates a run's roles, each in a module of its own:

- ``resolve.RunResolver``: the scenario, host, model, prompts and dataset, before the run exists;
- ``tickets.TicketDesk``: grants tickets, redeems their records, parks and writes them off;
- ``levelcontrol.LevelControl``: the sweep's controller, the SLO tallies, the capacity search;
- ``recorder.RunRecorder``: the run directory: records.jsonl, run.json, capacity.json, locust.json;
- ``clientwatch.ClientWatch``: the workers' clocks, the client's own load, the server's outages;
- ``reportjob.ReportJob``: report.md, written by a child process once the run has ended.

The rest of the glue (plugin, shape, web UI, users) talks to this class alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import gevent
from locust.runners import STATE_MISSING, MasterRunner

from specload.analysis.clientcheck import ACTIVE_PHASES, MASTER, ClientFigures
from specload.analysis.live import LiveRun
from specload.client.http import redact_host
from specload.core.records import RequestRecord
from specload.core.rundir import RUN_COMPLETED, RUN_FAILED, RUN_INTERRUPTED, ClientClock, RunMeta
from specload.locust.channel import FOR_TICKETS, master_token, proven, token_problem
from specload.locust.clientwatch import ClientWatch
from specload.locust.levelcontrol import LevelControl
from specload.locust.progressbar import ProgressBar, start_progress
from specload.locust.protocol import (
    MSG_CLIENT_LOAD,
    MSG_CUT,
    MSG_RECORD,
    MSG_STATE,
    MSG_TICKET_REQ,
    MSG_TICKET_RETURN,
    ClientLoadMsg,
    OtherVersion,
    RecordMsg,
    RunConfig,
    StateMsg,
    TicketRequest,
    TicketReturn,
    WireError,
    decode,
)
from specload.locust.recorder import RunRecorder
from specload.locust.reportjob import ReportJob
from specload.locust.resolve import CannotStart, ResolvedRun, RunResolver
from specload.locust.tickets import TicketDesk
from specload.locust.user import UserSide
from specload.sweep.levels import Change, LevelStatus, Outcome, SweepController
from specload.workload.vocab import invalid_prompt_hint

__all__ = ["CannotStart", "ResolvedRun", "SweepOwner", "sweep_owner"]

logger = logging.getLogger("specload")

_ATTR = "specload_owner"
_CUT_WAIT_S = 5.0  # after the workers were told to cut their requests: time for the last records


class SweepOwner:
    """One Locust process's sweeps, one run at a time: its lifecycle (start, tick, finish, close)
    and its message handlers, each handing the work to the role it belongs to."""

    def __init__(self, environment: Any) -> None:
        self.env = environment
        self.active = False
        self.closed = True  # this run's directory is complete but for report.md (final run.json, locust.json)
        self.failure: str | None = None
        self.config: RunConfig | None = None
        self._config_wire: dict[str, Any] | None = None  # self.config as broadcast, made once per run
        self.live: LiveRun | None = None  # what the web UI shows of this run (specload.analysis.live)
        self.progress: ProgressBar | None = None  # the live line on a terminal (specload.present.progress)
        self.report_job: ReportJob | None = None  # the child writing this run's report.md
        self.resolver = RunResolver(environment)
        self.levels = LevelControl()
        self.recorder = RunRecorder(environment, self._stop_on_write_error)
        self.desk = TicketDesk(environment, self._running, self.broadcast)
        self.watch = ClientWatch(environment, self._on_clock, lambda: self.levels.ctrl, self._report)
        self.token = master_token()  # what a master's workers prove they know (specload.locust.channel)
        # A worker's join nonce, which its every proof is bound to (a master's JoinGate.nonce_of)
        self.nonce_of: Callable[[str], str | None] = lambda node: None
        self.stopping = False  # a master told to stop: drain() runs, then Locust quits
        self.cut_now = False  # a second stop signal: the workers cut their requests now

    # what the rest of the glue reads -------------------------------------------------------------
    @property
    def ctrl(self) -> SweepController | None:
        return self.levels.ctrl

    @property
    def run_dir(self) -> str | None:
        return self.recorder.run_dir

    @property
    def meta(self) -> RunMeta:
        return self.recorder.meta

    @property
    def explicit(self) -> set[str]:
        return self.resolver.explicit

    @property
    def launch(self) -> dict[str, Any] | None:
        return self.resolver.launch

    @property
    def rejected(self) -> int:
        return self.desk.rejected

    @property
    def local_side(self) -> UserSide | None:
        return self.desk.local_side

    @local_side.setter
    def local_side(self, side: UserSide | None) -> None:
        self.desk.local_side = side

    @property
    def complete(self) -> bool:
        """This run's directory is complete: closed, and its report child done (written or not)."""
        return self.closed and (self.report_job is None or self.report_job.done)

    def _running(self) -> SweepController | None:
        return self.levels.ctrl if self.active else None

    def _send_key(self, host: str) -> bool:
        return self.resolver.send_key(host)

    # lifecycle --------------------------------------------------------------------------------
    def register(self) -> None:
        runner = self.env.runner
        runner.register_message(MSG_TICKET_REQ, self.on_ticket_req)
        runner.register_message(MSG_RECORD, self.on_record)
        runner.register_message(MSG_TICKET_RETURN, self.on_ticket_return)
        runner.register_message(MSG_CLIENT_LOAD, self.on_client_load)
        self.watch.register(runner)

    def start(self) -> bool:
        """Resolve, check and open a new run. False (with the reason logged) when it cannot start."""
        self.close_run()  # the previous run (web UI), should a new start come before its test_stop did
        self.failure = None
        try:
            if isinstance(self.env.runner, MasterRunner) and (why := token_problem(self.token)):
                raise CannotStart(why)
            run = self.resolver.resolve()
            run_dir = self.recorder.open(run.label)
        except CannotStart as e:
            return self._fail(str(e))
        self.config, self._config_wire = run.config, run.config.to_wire()
        self.desk.new_run(run.items, run.replay.requests if run.replay is not None else (), run.trace_prompt)
        self.watch.new_run()
        sc = run.scenario
        ctrl = self.levels.new_run(sc, run.capacity)
        meta = self.recorder.new_meta(run, ctrl.levels_meta())
        # Only a web UI shows the run live (a headless run keeps no second copy of its records).
        ui = getattr(self.env, "web_ui", None) is not None
        self.live = LiveRun(len(ctrl.levels), meta.server, self.levels.slo) if ui else None
        meta.server_metrics = self.recorder.start_sampler(run, self.levels.level_index, self.live)
        clocks = self.watch.clocks_for_run()
        if clocks is not None:
            meta.clients = clocks
        self.write_meta()
        self.active, self.closed = True, False
        self.progress = self.progress or start_progress(lambda: self.levels.ctrl if self.active else None)
        self.levels.log_run_start(run.label, redact_host(run.config.host), sc, run.config.model, run_dir)
        return True

    def _fail(self, reason: str) -> bool:
        self.failure = reason
        logger.error("%s", reason)
        self.env.process_exit_code = 2
        return False

    def _stop_on_write_error(self, reason: str) -> None:
        if self.levels.ctrl is not None:
            self.levels.ctrl.abort(reason)

    def write_meta(self) -> None:
        """run.json as the run stands: the controller's levels, each with the client's own figures."""
        if self.recorder.run_dir is None:
            return
        ctrl = self.levels.ctrl
        levels = None
        if ctrl is not None:
            levels = ctrl.levels_meta()
            for lv in levels:
                fig = self.client_figures(lv.index) if lv.index is not None else None
                lv.client = fig.to_json() if fig is not None else None
        self.recorder.write_meta(levels)

    def finish(self, status: str | None = None) -> None:
        """Close the run (idempotent). Late records still reach records.jsonl afterwards."""
        ctrl = self.levels.ctrl
        if not self.active or ctrl is None:
            return
        self.active = False
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        self.recorder.stop_sampler()
        if status is None:
            status = {Outcome.COMPLETED: RUN_COMPLETED, Outcome.ABORTED: RUN_FAILED}.get(
                ctrl.outcome, RUN_INTERRUPTED
            )
        if status == RUN_INTERRUPTED:
            ctrl.abort("interrupted")
        if (ignored := self.desk.ignored_summary()) is not None:
            logger.warning("%s", ignored)
        meta = self.recorder.meta
        meta.status = status
        meta.reason = ctrl.abort_reason if status != RUN_COMPLETED else None
        meta.ended_at = time.time()
        if self.levels.capacity is not None:
            self.levels.capacity.search.stop()  # an unfinished search ends with the bracket it has
            self.recorder.write_capacity(self.levels.capacity)
        self.write_meta()
        self.recorder.release_reserve()
        whole = all(lv.status != LevelStatus.INCOMPLETE for lv in ctrl.levels)  # (most of a budget lost)
        self.env.process_exit_code = 0 if status == RUN_COMPLETED and whole else 1
        logger.info(
            "sweep %s%s; results in %s",
            status,
            f" ({meta.reason})" if meta.reason else "",
            self.recorder.run_dir,
        )

    def interrupt(self) -> None:
        """A master's first stop signal: no more tickets (run.json says interrupted), the users
        told so at once; the shape then waits in ``drain`` for the tickets already out."""
        self.stopping = True
        self.finish(RUN_INTERRUPTED)
        self.broadcast()

    def drain(self, grace: float | None = None) -> None:
        """Wait until every ticket out is back as a record or written off with its lost worker:
        the requests in flight get the grace period, then the users (a master: its workers') cut
        them (each cut request still ships its record, as interrupted), with a few seconds more
        to ship them. Before the run directory is closed, so run.json and report.md count them."""
        grace = grace if grace is not None else float(self.env.stop_timeout or 0.0)
        t_end = time.monotonic() + grace
        cut = False
        while (left := self.desk.held()) > 0:
            self._check_workers()
            if not cut and (self.cut_now or time.monotonic() >= t_end):
                if isinstance(self.env.runner, MasterRunner):
                    self.env.runner.send_message(MSG_CUT)
                else:
                    self.env.runner.user_greenlets.kill(block=False)
                cut, t_end = True, time.monotonic() + _CUT_WAIT_S
            elif cut and time.monotonic() >= t_end:
                logger.error("%d request(s) in flight sent no record after the grace period", left)
                break
            gevent.sleep(0.1)

    def close_run(self, print_report: bool = False, report: bool = True) -> ReportJob | None:
        """Complete this run's directory once it has ended (idempotent): run.json with the final
        counts (records that arrived during the grace period included) and Locust's own counts
        (locust.json) now, report.md by a child process started here (``print_report``: which also
        prints the report on stdout; ``report=False``: none, the caller writes it). Every run of a web
        UI session gets this at its test_stop; a headless run at quitting. Returns the report's
        child (None: nothing to do)."""
        run_dir = self.recorder.run_dir
        if self.closed or self.active or run_dir is None:
            return None
        self.closed = True
        self.write_meta()
        self.recorder.sample_streamed(None, time.time())  # the last level's last streamed counts
        self.recorder.write_locust_stats()
        if not report:
            return None
        ui = getattr(self.env, "web_ui", None) is not None
        self.report_job = ReportJob(
            run_dir, print_report, on_done=lambda ok: self._report_done(run_dir, ok, ui)
        )
        return self.report_job

    @staticmethod
    def _report_done(run_dir: str, ok: bool, ui: bool) -> None:
        if ok and ui:  # (a headless run's last words are its report's)
            logger.info("run directory complete: %s (report.md, locust.json)", run_dir)

    def wait_report(self) -> None:
        """Wait for the last run's report child, if it still runs (the process is about to quit).
        Ctrl-C meanwhile stops the wait, not the child: Locust's shutdown goes on (its own files,
        the exit code) and the child still writes report.md."""
        job = self.report_job
        if job is None or job.done:
            return
        try:
            job.wait()
        except KeyboardInterrupt:
            logger.warning(
                "not waiting for report.md of %s: its child (pid %s) writes it", job.run_dir, job.pid
            )

    # shape hook -------------------------------------------------------------------------------
    def tick(self, user_count: int) -> int | None:
        """Desired user count, or None when the sweep is over."""
        ctrl = self.levels.ctrl
        assert ctrl is not None
        self._check_workers()
        changes = ctrl.tick(user_count)
        self.watch.refresh_clocks()
        lv = ctrl.current
        now = time.time()
        active = lv is not None and lv.phase in ACTIVE_PHASES
        self.recorder.sample_streamed(lv.plan.index if lv is not None and active else None, now)
        if self.live is not None and lv is not None and active:
            self.live.sample_streamed(lv.plan.index, now)
        self._report(changes)
        if not changes:
            self.write_meta()  # keep run.json's live counts at most a second old
            self.broadcast()  # and let a worker that joined late learn the current level
        if ctrl.finished:
            return None
        return ctrl.desired_users()

    def spawn_rate(self) -> float:
        return self.levels.spawn_rate()

    def _check_workers(self) -> None:
        """Write off the tickets of workers the master lost (missing heartbeats, or gone)."""
        runner = self.env.runner
        ctrl = self.levels.ctrl
        if not isinstance(runner, MasterRunner) or ctrl is None:
            return
        lost = self.desk.lost({c.id for c in runner.clients.all if c.state != STATE_MISSING})
        for node in lost:
            for (level, phase), n in self.desk.write_off(node).items():
                why = f"lost a worker ({node}): {n} request(s) in flight never reported"
                self._report(ctrl.write_off(level, phase, n, why))
        if lost:
            self.levels.respread_users(runner)

    # messages ---------------------------------------------------------------------------------
    def broadcast(self) -> None:
        ctrl = self.levels.ctrl
        if ctrl is None:
            return
        msg = StateMsg(ctrl.state(), self.recorder.run_dir, self._config_wire)
        self.env.runner.send_message(MSG_STATE, msg.to_wire())

    def _unreadable(self, node: str, kind: str, e: WireError) -> None:
        if isinstance(e, OtherVersion):
            self.desk.unreadable(node, kind, str(e))
        else:
            self.desk.ignore(node, f"a malformed {kind} message ({e})")

    def _admitted(self, node: str, what: str, auth: str, kind: str) -> bool:
        """A master takes a ticket request, a record or a return only from a worker that joined
        (and is not missing) and shows the master token's proof for it: anyone can reach the
        master port and claim any worker id. (A local run's messages come from itself.)"""
        runner = self.env.runner
        if not isinstance(runner, MasterRunner):
            return True
        worker = runner.clients.get(node)
        if worker is None or worker.state == STATE_MISSING:
            self.desk.ignore(node, f"a {kind} from a process that is not a worker of this master")
            return False
        nonce = self.nonce_of(node)
        if nonce is None or not proven(self.token, node, what, auth, nonce):
            self.desk.ignore(node, f"a {kind} without a valid proof of the master token")
            return False
        return True

    def on_ticket_req(self, environment: Any, msg: Any, **_: Any) -> None:
        try:
            req = decode(TicketRequest.from_wire, msg.data)
        except WireError as e:
            self._unreadable(msg.node_id, "ticket request", e)
            return
        if self._admitted(msg.node_id, FOR_TICKETS, req.auth, "ticket request"):
            self.desk.request(msg.node_id, req.uid)

    def ticket_request(self, node: str, uid: str) -> None:
        """User ``uid`` of process ``node`` asks for a ticket (a message, or a call in a local run)."""
        self.desk.request(node, uid)

    def on_ticket_return(self, environment: Any, msg: Any, **_: Any) -> None:
        try:
            back = decode(TicketReturn.from_wire, msg.data)
        except WireError as e:
            self._unreadable(msg.node_id, "ticket return", e)
            return
        if not self._admitted(msg.node_id, back.ticket, back.auth, "ticket return"):
            return
        if not self.desk.redeem(msg.node_id, (back.level, back.phase, back.seq), back.ticket):
            self.desk.ignore(
                msg.node_id,
                f"a ticket return for a request it was not granted (level {back.level}, "
                f"{back.phase} #{back.seq})",
            )
            return
        if self.levels.ctrl is not None:
            self.levels.ctrl.give_back(back.level, back.phase)
            self.broadcast()

    def on_record(self, environment: Any, msg: Any, **_: Any) -> None:
        try:
            m = decode(RecordMsg.from_wire, msg.data)
            rec = decode(RecordMsg.parsed, m)
        except WireError as e:
            self._unreadable(msg.node_id, "record", e)
            return
        if self._admitted(msg.node_id, m.ticket, m.auth, "record"):
            self.take_record(msg.node_id, rec, m.ticket, m.record)

    def take_record(
        self, node: str, rec: RequestRecord, ticket: str, line: RequestRecord | dict[str, Any]
    ) -> None:
        """A finished request's record from process ``node`` (a message, or a call in a local run);
        ``line`` is what records.jsonl gets (records.record_line): the record's dict as shipped, or
        the record itself."""
        if not self.desk.redeem(node, (rec.level, rec.phase, rec.seq), ticket):
            # Only a ticket this owner granted to that process, and only once: a forged or repeated
            # record (or one for a ticket already written off) never reaches the counts.
            self.desk.ignore(
                node, f"a record for a request it was not granted (level {rec.level}, {rec.phase} #{rec.seq})"
            )
            return
        self.watch.add_record(rec)
        self.levels.judge(rec)
        if self.live is not None:
            self.live.add_record(rec)
        self.recorder.write_record(line)
        ctrl = self.levels.ctrl
        if ctrl is not None:
            changes = ctrl.receive(rec)  # counted even after the run closed (grace-period records)
            if self.active:
                self._report(changes)

    # the client's own load ---------------------------------------------------------------------
    def on_client_load(self, environment: Any, msg: Any, **_: Any) -> None:
        runner = self.env.runner
        if isinstance(runner, MasterRunner) and msg.node_id not in runner.clients:
            return  # not a worker of ours: its word on its own load counts for nothing
        try:
            m = decode(ClientLoadMsg.from_wire, msg.data)
        except WireError as e:
            self._unreadable(msg.node_id, "client load", e)
            return
        self.take_load(msg.node_id, m)

    def take_load(self, process: str, m: ClientLoadMsg) -> None:
        """A process's load in a level so far (its latest report replaces the one before)."""
        ctrl = self.levels.ctrl
        if m.run is None or m.run != self.recorder.run_dir or ctrl is None:
            return
        if self.watch.take_load(process, m, len(ctrl.levels)):
            self.recorder.streams.note(m.level, process, m.streamed, time.time())
            if self.live is not None:
                self.live.set_streamed(m.level, process, m.streamed)

    def where(self) -> tuple[str | None, int] | None:
        """The master's own probe: the level handing out tickets or draining now, if any."""
        ctrl = self.levels.ctrl
        lv = ctrl.current if self.active and ctrl is not None else None
        return None if lv is None or lv.phase not in ACTIVE_PHASES else (self.recorder.run_dir, lv.plan.index)

    def take_own_load(self, m: ClientLoadMsg) -> None:
        self.take_load(MASTER, m)

    def client_figures(self, index: int) -> ClientFigures | None:
        """The client's own load in level ``index`` so far; None before anything was measured."""
        ctrl = self.levels.ctrl
        if ctrl is None:
            return None
        stagger = self.config.scenario.stagger_s if self.config is not None else 0.0
        return self.watch.figures(index, ctrl, stagger)

    def _on_clock(self, clock: ClientClock) -> None:
        if self.active:
            meta = self.recorder.meta
            meta.clients = [c for c in meta.clients if c.worker != clock.worker] + [clock]
            self.write_meta()

    # progress ---------------------------------------------------------------------------------
    def _report(self, changes: list[Change]) -> None:
        """Log the level transitions, then bring run.json and the users up to date."""
        ctrl = self.levels.ctrl
        if not changes or ctrl is None:
            return
        for change in changes:
            if change == Change.START:
                self.levels.log_level_start()
                self.watch.clocks_for_level()
            elif change == Change.DONE:
                self.recorder.sample_level_close(self.levels.done_index())
                self.levels.log_level_done(self.client_figures)
                if self.levels.capacity_step(self.client_figures):
                    self.recorder.write_capacity(self.levels.capacity)
            elif change == Change.OUTAGE:
                assert self.config is not None
                self.watch.watch_outage(ctrl, self.config)
            elif change == Change.RESUMED:
                self.levels.log_resumed()
            elif change in (Change.ABORT, Change.TIMEOUT):
                if hint := invalid_prompt_hint(ctrl.abort_reason):
                    ctrl.abort_reason = f"{ctrl.abort_reason}; {hint}"
                logger.error("stopping the sweep: %s", ctrl.abort_reason)
        self.write_meta()
        self.broadcast()


def sweep_owner(environment: Any) -> SweepOwner:
    """The owner of this Locust environment's sweep (made on first use, kept on the environment)."""
    owner: SweepOwner | None = getattr(environment, _ATTR, None)
    if owner is None or owner.env is not environment:
        owner = SweepOwner(environment)
        setattr(environment, _ATTR, owner)
    return owner
