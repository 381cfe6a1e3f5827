"""The sweep's owner: runs in the one process that owns the run directory (Locust master, or the
only process when local). It resolves the scenario, checks the server, hands out tickets,
writes records and run.json as they come, and logs one progress line per level boundary.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import secrets
import sys
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import gevent
import locust
from gevent.event import Event
from locust.runners import STATE_MISSING, MasterRunner

from specload import __version__
from specload.analysis.capacity import CAPACITY_JSON, SearchSpace, verdict_text
from specload.analysis.clientcheck import (
    ACTIVE_PHASES,
    MASTER,
    ClientFigures,
    LevelTraffic,
    ProcessLoad,
    in_flight_due,
    judge_in_flight,
)
from specload.analysis.live import LiveRun
from specload.analysis.metrics import ServerSample
from specload.analysis.run import Run
from specload.client.backends import get_backend
from specload.client.http import api_key, check_host, key_may_go_to, redact_host
from specload.client.introspect import discover_model, max_running, server_config
from specload.client.probe import ServerUnreachable, server_back
from specload.core.clocks import describe, is_off
from specload.core.records import FAILED, PHASE_MEASURE, RequestRecord, level_label
from specload.core.rundir import (
    LOCUST_PREFIX,
    RUN_COMPLETED,
    RUN_FAILED,
    RUN_INTERRUPTED,
    RUN_RUNNING,
    ClientClock,
    RecordWriter,
    RunMeta,
    ServerInfo,
    claim_run_dir,
    new_run_dir,
    write_json_atomic,
    write_run_meta,
)
from specload.core.slo import Slo, SloTally, parse_slo
from specload.locust.clockprobe import ClockProbe
from specload.locust.options import (
    FORM_SOURCE,
    LAUNCH_HOST,
    SEND_KEY_DEST,
    SEND_KEY_FLAG,
    explicit_options,
    launch_values,
    scenario_from_options,
)
from specload.locust.progressbar import ProgressBar, start_progress
from specload.locust.protocol import (
    LOCAL_NODE,
    MSG_CLIENT_LOAD,
    MSG_RECORD,
    MSG_STATE,
    MSG_TICKET,
    MSG_TICKET_REQ,
    MSG_TICKET_RETURN,
    ClientLoadMsg,
    RecordMsg,
    RunConfig,
    StateMsg,
    TicketReply,
    TicketRequest,
    TicketReturn,
)
from specload.locust.sampler import MetricsSampler
from specload.locust.user import current_user_side
from specload.sweep.capacity import CapacityRun
from specload.sweep.levels import Change, LevelStatus, Outcome, SweepController, plan_levels
from specload.workload.config import Scenario, ScenarioError
from specload.workload.datasets import DatasetError, Item, load_items
from specload.workload.prompt_source import PromptProbeFailed, discover_prompts
from specload.workload.vocab import LocalTokenizer, ServerTokenizer, VocabError, invalid_prompt_hint

logger = logging.getLogger("specload")

# Worker clocks are measured at each level's start and at least this often (a few tiny messages):
# the estimate keeps the tightest round trip, so a worker busy whenever a level starts (spawning
# users) still gets a quiet moment to be measured in.
CLOCK_REFRESH_S = 2.0

_ATTR = "specload_owner"
_TIMEBOXED_ITEMS = 1024  # dataset prompts drawn for a time-boxed level (they are reused in turn)
# Pauses between the checks of a server that refused a connection: a restart of a fraction of a
# second costs about that much, a longer one is checked once a second until --outage-timeout.
_OUTAGE_CHECKS_S = (0.05, 0.1, 0.25, 0.5, 1.0)


class CannotStart(Exception):
    """The run cannot start; the message says why (logged, exit code 2)."""


@dataclass(frozen=True)
class ResolvedRun:
    """Everything decided before the run directory exists."""

    scenario: Scenario
    config: RunConfig
    model_source: str
    label: str
    server: dict[str, Any]
    items: list[Item] = field(default_factory=list)  # dataset prompts, handed out with the grants
    # A capacity search (specload capacity) instead of the scenario's levels.
    capacity: CapacityRun | None = None


class SweepOwner:
    def __init__(self, environment: Any) -> None:
        self.env = environment
        self.active = False
        self.ctrl: SweepController | None = None
        self.writer: RecordWriter | None = None
        self.run_dir: str | None = None
        self.meta = RunMeta()
        self.config: RunConfig | None = None
        self.items: list[Item] = []
        self._next_item = 0
        self._config_wire: dict[str, Any] | None = None  # self.config as broadcast, made once per run
        self.failure: str | None = None
        self.live: LiveRun | None = None  # what the web UI shows of this run (specload.analysis.live)
        self.sampler: MetricsSampler | None = None
        self._outage_watch: Any = None  # the greenlet checking whether the server is back
        # Rate levels: ticket requests of idle users, answered in turn as requests fall due.
        self.parked: deque[tuple[str, str]] = deque()  # (node id, user id)
        self._parked_event = Event()
        self._dispatcher: Any = None
        self.clocks: dict[str, ClientClock] = {}  # each worker's clock against ours (master only)
        self.clock_probe: ClockProbe | None = None
        self._clock_round = 0.0  # when the workers' clocks were last measured
        # Tickets granted and not yet back as records, per Locust process: to write off a dead worker's,
        # and to accept each record once, from the process it was granted to.
        self.outstanding: dict[str, dict[tuple[int, str, int], str]] = {}  # -> the ticket's secret
        self.rejected = 0  # records for tickets never granted (or already back)
        self._lost: set[str] = set()  # workers already written off
        self._ignored_from: dict[str, int] = {}  # messages ignored per claimed sender
        self.write_error: str | None = None  # the first failed write to the run directory
        # The client's own load per level: each process's latest report, and the requests in flight.
        self.client_load: dict[int, dict[str, ProcessLoad]] = {}
        self.traffic: dict[int, LevelTraffic] = {}
        # Per level, by record count.
        self._in_flight: dict[int, tuple[int, tuple[float | None, str | None]]] = {}
        self._run_dir_used = False
        self.slo: Slo | None = None  # the run's SLO: each level is judged as its records come in
        self.slo_tallies: dict[int, SloTally] = {}
        self.capacity: CapacityRun | None = None
        self.progress: ProgressBar | None = None  # the live line on a terminal (specload.present.progress)
        self.closed = True  # this run's directory is complete (final run.json, locust.json, report.md)
        self.local_side: Any = None  # a local run's users (specload.locust.user.UserSide): answered directly
        opts = environment.parsed_options
        # What the command line set, to tell a web-UI edit or an explicit flag from an untouched default.
        self.explicit = explicit_options(sys.argv[1:])
        self.launch = launch_values(opts) if opts else None

    # lifecycle --------------------------------------------------------------------------------
    def register(self) -> None:
        runner = self.env.runner
        runner.register_message(MSG_TICKET_REQ, self.on_ticket_req)
        runner.register_message(MSG_RECORD, self.on_record)
        runner.register_message(MSG_TICKET_RETURN, self.on_ticket_return)
        runner.register_message(MSG_CLIENT_LOAD, self.on_client_load)
        if isinstance(runner, MasterRunner):
            self.clock_probe = ClockProbe(runner, self._on_clock)
            self.clock_probe.register()
            # A worker's init may still be running when it connects: give it a second.
            self.env.events.worker_connect.add_listener(
                lambda client_id, **_: self._measure_clock(client_id, 1.0)
            )

    def start(self) -> bool:
        """Resolve, check and open a new run. False (with the reason logged) when it cannot start."""
        self.close_run()  # the previous run (web UI), should a new start come before its test_stop did
        self.failure = None
        try:
            run = self._resolve()
            self.run_dir = self._open_run_dir(run.label)
        except CannotStart as e:
            return self._fail(str(e))
        self.config, self._config_wire = run.config, run.config.to_wire()
        self.items, self._next_item = run.items, 0
        self.writer = RecordWriter(self.run_dir)
        self.write_error = None
        self._reserve_space()
        self.outstanding, self._lost = {}, set()
        self.client_load, self.traffic, self._in_flight = {}, {}, {}
        sc = run.scenario
        self.slo, self.slo_tallies, self.capacity = parse_slo(sc.slo) if sc.slo else None, {}, run.capacity
        plans = [run.capacity.first_plan()] if run.capacity is not None else plan_levels(sc)
        self.ctrl = SweepController(
            plans,
            sc.pause_s,
            sc.level_timeout_s,
            outage_timeout_s=sc.outage_timeout_s,
            open_ended=run.capacity is not None,
        )
        self.meta = self._run_meta(run)
        # Only a web UI shows the run live (a headless run keeps no second copy of its records).
        ui = getattr(self.env, "web_ui", None) is not None
        self.live = LiveRun(len(self.ctrl.levels), self.meta.server.max_running) if ui else None
        self.meta.server_metrics = self._start_sampler(run)
        self._clocks_for_run()
        self.write_meta()
        self.active, self.closed = True, False
        self.progress = self.progress or start_progress(lambda: self.ctrl if self.active else None)
        logger.info(
            "sweep %r against %s (%s, model %s): %d level(s) %s; run directory %s",
            run.label,
            redact_host(run.config.host),
            sc.backend,
            run.config.model,
            len(self.ctrl.levels),
            f"at {','.join(f'{r:g}' for r in sc.rates)} requests/s"
            if sc.rates
            else ",".join(map(str, sc.levels)),
            self.run_dir,
        )
        if self.capacity is not None:
            sp = self.capacity.space
            logger.info(
                "capacity search under the SLO %s: from %g (min %g, max %g, at most %d probes); each probe "
                "is a level of its own",
                self.capacity.slo,
                sp.start,
                sp.minimum,
                sp.maximum,
                sp.max_probes,
            )
        return True

    def _resolve(self) -> ResolvedRun:
        """The scenario, the host, the model and the server's configuration, or CannotStart."""
        opts = self.env.parsed_options
        try:
            source = FORM_SOURCE if getattr(self.env, "web_ui", None) is not None else "command line"
            sc = scenario_from_options(opts, self.explicit, self.launch, source)
            host = check_host(self.env.host)
        except (ScenarioError, ValueError) as e:
            raise CannotStart(str(e)) from None
        insecure = bool(getattr(opts, "insecure", False))
        if insecure and host.startswith("https://"):
            logger.warning("--insecure: the server's TLS certificate is NOT verified")
        send_key = self._send_key(host)
        model, how = sc.model, "scenario/flag"
        if not model:
            try:
                model, how = discover_model(host, sc.connect_timeout_s, insecure, send_key)
            except ServerUnreachable as e:
                raise CannotStart(f"cannot reach the server before the sweep: {e}") from None
            if model is None and sc.backend != "sglang":
                raise CannotStart(f"no model name: {how}; pass --model NAME")
        server = server_config(host, sc.connect_timeout_s, insecure, send_key)
        cap = max_running(server)
        if cap is not None and max(sc.levels) > cap:
            logger.warning(
                "the server runs at most %d requests at once (max_running_requests); "
                "levels above C=%d will queue the excess",
                cap,
                cap,
            )
        try:
            prompts = discover_prompts(sc, get_backend(sc.backend), host, model, insecure, send_key)
            items = self._dataset(sc, host, model, insecure, prompts.overhead, send_key)
        except (VocabError, PromptProbeFailed, ServerUnreachable, DatasetError) as e:
            raise CannotStart(f"prompts: {e}") from None
        if items:
            prompts = replace(
                prompts, origin=f"dataset {sc.dataset} ({len(items)} prompts by vLLM's sampling rules)"
            )
        config = RunConfig(sc, model, host, prompts, insecure, send_key)
        return ResolvedRun(sc, config, how, opts.label or sc.name, server, items, self._capacity_run(sc))

    def _capacity_run(self, sc: Scenario) -> CapacityRun | None:
        """The capacity search --capacity-search asks for (specload capacity), or None for a sweep."""
        text = getattr(self.env.parsed_options, "capacity_search", "") or ""
        if not text:
            return None
        if not sc.slo:
            raise CannotStart("a capacity search needs an SLO (--slo ttft_p99=2s,...)")
        try:
            return CapacityRun(SearchSpace.from_option(text), parse_slo(sc.slo), sc)
        except ValueError as e:
            raise CannotStart(str(e)) from None

    def _send_key(self, host: str) -> bool:
        """Whether this run's requests (probes included) carry the API key: to the host given at
        launch always, to another (typed in the web form) only when the user ticked the form's box.
        A withheld key is said, so a run that the server then refuses is not a mystery."""
        launched = self.launch.get(LAUNCH_HOST) if self.launch else None
        confirmed = bool(getattr(self.env.parsed_options, SEND_KEY_DEST, False))
        send = key_may_go_to(host, launched, confirmed)
        if api_key() is None:
            return send  # no key in this environment: nothing to send or withhold
        was = f"started for {redact_host(launched)}" if launched else "started without a host"
        if not send:
            logger.warning(
                'the API key is NOT sent to %s: specload was %s; tick "Send key to new host" in the '
                "start form (%s) to send it there",
                redact_host(host),
                was,
                SEND_KEY_FLAG,
            )
        elif not key_may_go_to(host, launched, False):
            logger.warning("the API key goes to %s, as confirmed (specload was %s)", redact_host(host), was)
        return send

    def _dataset(
        self, sc: Scenario, host: str, model: str | None, insecure: bool, overhead: int, send_key: bool
    ) -> list[Item]:
        """The run's dataset prompts, as many as the plan needs (time-boxed levels cycle through them).

        ``overhead``: the tokens the server adds to each prompt, left out of a fixed prompt length."""
        if not sc.dataset:
            return []
        plans = plan_levels(sc)
        n = sum((p.budget or _TIMEBOXED_ITEMS) + p.warmup for p in plans)
        tok = (
            LocalTokenizer(sc.tokenizer)
            if sc.tokenizer
            else ServerTokenizer(host, model, sc.connect_timeout_s, insecure, send_key)
        )
        fixed = sc.dataset_lengths == "fixed"
        items = load_items(
            sc.dataset,
            n,
            sc.seed,
            tok,
            sc.output_tokens if fixed else None,
            sc.input_tokens - overhead if fixed else None,
        )
        logger.info(
            "dataset %s: %d prompts (%d asked for), prompt tokens %d..%d, output tokens %d..%d",
            sc.dataset,
            len(items),
            n,
            min(i.prompt_tokens for i in items),
            max(i.prompt_tokens for i in items),
            min(i.output_tokens for i in items),
            max(i.output_tokens for i in items),
        )
        return items

    def _open_run_dir(self, label: str) -> str:
        """``--run-dir`` for the first run of this process (``specload sweep`` made it), else a new one."""
        opts = self.env.parsed_options
        try:
            if opts.run_dir and not self._run_dir_used:
                self._run_dir_used = True
                return claim_run_dir(opts.run_dir)
            return new_run_dir(opts.results_dir or "results", label)
        except OSError as e:
            raise CannotStart(f"cannot create the run directory: {e}") from None

    def _run_meta(self, run: ResolvedRun) -> RunMeta:
        assert self.ctrl is not None
        sc, opts = run.scenario, self.env.parsed_options
        return RunMeta(
            specload_version=__version__,
            locust_version=locust.__version__,
            label=run.label,
            host=redact_host(run.config.host),
            backend=sc.backend,
            model=run.config.model,
            model_source=run.model_source,
            scenario_file=getattr(opts, "scenario", "") or None,
            scenario=sc.to_dict(),
            prompts=run.config.prompts.describe(),
            started_at=time.time(),
            status=RUN_RUNNING,
            mode=type(self.env.runner).__name__.replace("Runner", "").lower(),
            levels=self.ctrl.levels_meta(),
            server=ServerInfo(run.server),
            simulated=bool(run.server.get("simulated", False)),
            server_metrics="off",
        )

    def _start_sampler(self, run: ResolvedRun) -> str:
        """Sample the server's /metrics through the run; what run.json says about it."""
        sc = run.scenario
        if sc.metrics_interval_s <= 0:
            return "off"
        assert self.run_dir is not None
        live = self.live
        self.sampler = MetricsSampler(
            run.config.host,
            self.run_dir,
            self._level_index,
            sc.metrics_interval_s,
            run.config.insecure,
            run.config.send_key,
            on_sample=None if live is None else lambda d: _add_sample(live, d),
        )
        return "sampled" if self.sampler.start() else "unavailable"

    # worker clocks -----------------------------------------------------------------------------
    def _clocks_for_run(self) -> None:
        """The workers' clocks into the new run.json, and a new measurement of each (refining it)."""
        runner = self.env.runner
        if not isinstance(runner, MasterRunner):
            return
        alive = sorted(c.id for c in runner.clients.all if c.state != STATE_MISSING)
        for worker in alive:
            self._measure_clock(worker)
        self.meta.clients = [self.clocks[w] for w in alive if w in self.clocks]

    def _clocks_for_level(self) -> None:
        self._clock_round = time.time()
        runner = self.env.runner
        if isinstance(runner, MasterRunner):
            for c in runner.clients.all:
                if c.state != STATE_MISSING:
                    self._measure_clock(c.id)

    def _measure_clock(self, worker: str, delay_s: float = 0.0) -> None:
        if self.clock_probe is not None:
            self.clock_probe.measure(worker, delay_s)

    def _on_clock(self, clock: ClientClock) -> None:
        known = self.clocks.get(clock.worker)
        self.clocks[clock.worker] = clock
        if is_off(clock) and (known is None or not is_off(known)):  # said once per worker
            logger.warning(
                "%s: records carry wall-clock times, so its requests sit that far off in every level "
                "window; sync the clocks (chrony/NTP)",
                describe(clock),
            )
        else:
            logger.debug("%s", describe(clock))
        if self.active:
            self.meta.clients = [c for c in self.meta.clients if c.worker != clock.worker] + [clock]
            self.write_meta()

    def _level_index(self) -> int | None:
        lv = self.ctrl.current if self.ctrl is not None else None
        return None if lv is None else lv.plan.index

    def _fail(self, reason: str) -> bool:
        self.failure = reason
        logger.error("%s", reason)
        self.env.process_exit_code = 2
        return False

    def write_meta(self) -> None:
        if self.run_dir is None:
            return
        if self.ctrl is not None:
            self.meta.levels = self.ctrl.levels_meta()
            for lv in self.meta.levels:
                fig = self.client_figures(lv.index) if lv.index is not None else None
                lv.client = fig.to_json() if fig is not None else None
        try:
            write_run_meta(self.run_dir, self.meta)
        except OSError as e:
            self._cannot_write("run.json", e)

    def _cannot_write(self, what: str, e: OSError) -> None:
        """A full disk (or any write error) ends the sweep cleanly, once: what is on disk stays."""
        if self.write_error is not None:
            return
        self.write_error = f"cannot write {what} in {self.run_dir}: {e.strerror or e}"
        logger.error("%s; stopping the sweep (what was written so far is kept)", self.write_error)
        self.release_reserve()  # room for the final run.json, report and Locust's files
        if self.ctrl is not None:
            self.ctrl.abort(self.write_error)

    _RESERVE = ".space-reserve"
    _RESERVE_BYTES = 32 * 1024

    def _reserve_space(self) -> None:
        """Hold a little disk space for the end of the run: a full disk must not also keep run.json
        saying "running" (the final write is the one that matters most)."""
        assert self.run_dir is not None
        try:
            with open(os.path.join(self.run_dir, self._RESERVE), "wb") as f:
                f.write(b"\0" * self._RESERVE_BYTES)
        except OSError:
            pass

    def release_reserve(self) -> None:
        if self.run_dir is not None:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(self.run_dir, self._RESERVE))

    def finish(self, status: str | None = None) -> None:
        """Close the run (idempotent). Late records still reach records.jsonl afterwards."""
        if not self.active or self.ctrl is None:
            return
        self.active = False
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        if status is None:
            status = {Outcome.COMPLETED: RUN_COMPLETED, Outcome.ABORTED: RUN_FAILED}.get(
                self.ctrl.outcome, RUN_INTERRUPTED
            )
        if status == RUN_INTERRUPTED:
            self.ctrl.abort("interrupted")
        if self.rejected:
            logger.warning(
                "ignored %d message(s) in all from %s: records or returns for requests they were not "
                "granted (see docs/deploy.md, protecting the master port)",
                self.rejected,
                ", ".join(sorted(self._ignored_from)),
            )
        self.meta.status = status
        self.meta.reason = self.ctrl.abort_reason if status != RUN_COMPLETED else None
        self.meta.ended_at = time.time()
        if self.capacity is not None:
            self.capacity.search.stop()  # an unfinished search ends with the bracket it has
            self._write_capacity()
        self.write_meta()
        self.release_reserve()
        self.env.process_exit_code = 0 if status == RUN_COMPLETED else 1
        logger.info(
            "sweep %s%s; results in %s",
            status,
            f" ({self.meta.reason})" if self.meta.reason else "",
            self.run_dir,
        )

    def close_run(self) -> Run | None:
        """Complete this run's directory once it has ended (idempotent): run.json with the final
        counts (records that arrived during the grace period included), Locust's own counts
        (locust.json) and report.md. Every run of a web UI session gets this at its test_stop; a
        headless run at quitting. Returns the run as read back for the report (None: nothing to do,
        or the report could not be made; the raw files are on disk whatever happens)."""
        if self.closed or self.active or self.run_dir is None:
            return None
        self.closed = True
        self.write_meta()
        self.write_locust_stats()
        from specload.present.report import load_run, write_report_md

        try:
            run = load_run(self.run_dir, keep=True)  # a big run's figures kept for report and compare
            write_report_md(run)
            return run
        except Exception as e:  # noqa: BLE001 - the raw files are on disk whatever happens here
            logger.warning("could not write report.md (%s); run `specload report %s`", e, self.run_dir)
            return None

    def write_locust_stats(self) -> None:
        """Locust's per-row counts into the run directory (locust.json), for the report's cross-check,
        unless the run was started with ``--json-file RUN/locust`` (Locust writes that one itself,
        later, at shutdown). Locust clears its statistics when the next run starts, so each run's
        are its own."""
        opts, runner = self.env.parsed_options, self.env.runner
        assert self.run_dir is not None
        target = os.path.join(self.run_dir, LOCUST_PREFIX)
        if opts is None or getattr(opts, "json_file", None) == target or runner is None:
            return
        entries = [e.serialize() for e in runner.stats.entries.values() if e.num_requests or e.num_failures]
        try:
            with open(target + ".json.tmp", "w") as f:
                json.dump(entries, f)  # (json: Locust's histograms have integer keys)
            os.replace(target + ".json.tmp", target + ".json")
        except OSError as e:
            logger.warning("could not write %s.json: %s", target, e.strerror or e)

    # shape hook -------------------------------------------------------------------------------
    def tick(self, user_count: int) -> int | None:
        """Desired user count, or None when the sweep is over."""
        assert self.ctrl is not None
        self._check_workers()
        changes = self.ctrl.tick(user_count)
        if time.time() - self._clock_round >= CLOCK_REFRESH_S:
            self._clocks_for_level()  # a worker busy at every level start still gets quiet pings
        lv = self.ctrl.current
        if self.live is not None and lv is not None and lv.phase in ACTIVE_PHASES:
            self.live.sample_streamed(lv.plan.index, time.time())
        self._report(changes)
        if not changes:
            self.write_meta()  # keep run.json's live counts at most a second old
            self.broadcast()  # and let a worker that joined late learn the current level
        if self.ctrl.finished:
            return None
        return self.ctrl.desired_users()

    def spawn_rate(self) -> float:
        """Any rate works: a level opens only once all C users exist, so they start together."""
        return 100.0

    # messages ---------------------------------------------------------------------------------
    def broadcast(self) -> None:
        if self.ctrl is None:
            return
        msg = StateMsg(self.ctrl.state(), self.run_dir, self._config_wire)
        self.env.runner.send_message(MSG_STATE, msg.to_wire())

    def on_ticket_req(self, environment: Any, msg: Any, **_: Any) -> None:
        self.ticket_request(msg.node_id, TicketRequest.from_wire(msg.data).uid)

    def ticket_request(self, node: str, uid: str) -> None:
        """User ``uid`` of process ``node`` asks for a ticket (a message, or a call in a local run)."""
        if self.active and self.ctrl is not None and (self.parked or (self.ctrl.wait_s() or 0.0) > 0):
            # A rate level's next request is not due yet: this user waits its turn (in order).
            self.parked.append((node, uid))
            self._parked_event.set()
            if self._dispatcher is None or self._dispatcher.dead:
                self._dispatcher = gevent.spawn(self._dispatch)
            return
        self._answer(node, uid)

    def _dispatch(self) -> None:
        """Answer parked ticket requests as a rate level's requests fall due; refuse them when the
        level closes (they ask again when tickets open)."""
        while self.parked or self.active:
            ctrl = self.ctrl
            if not self.parked:
                self._parked_event.clear()
                self._parked_event.wait(1.0)
                continue
            wait = ctrl.wait_s() if self.active and ctrl is not None else None
            if wait is None or wait <= 0:
                node, uid = self.parked.popleft()
                self._answer(node, uid)
            else:
                gevent.sleep(min(wait, 0.1))
            if not self.active and not self.parked:
                return

    def _answer(self, node: str, uid: str) -> None:
        """Grant the next ticket to user ``uid`` of process ``node``, or refuse (None) when closed."""
        grant = item = None
        closed = False
        ticket = ""
        if self.active and self.ctrl is not None:
            grant = self.ctrl.grant()
            if grant is not None:
                ticket = secrets.token_hex(8)
                self.outstanding.setdefault(node, {})[(grant.level, grant.phase, grant.seq)] = ticket
                closed = not self.ctrl.is_open
                if self.items:
                    item = self.items[self._next_item % len(self.items)]
                    self._next_item += 1
                    if grant.phase == PHASE_MEASURE:
                        grant = replace(grant, max_tokens=item.output_tokens)
        if closed:
            self.broadcast()  # before the reply: users must see "closed" before a refusal
        reply = TicketReply(uid, grant, item, ticket)
        side = self.local_side
        if side is not None and node == LOCAL_NODE and current_user_side(self.env) is side:
            side.take_reply(reply)  # (a UserSide made anew since the link asks by message, and hears so)
        else:
            self.env.runner.send_message(MSG_TICKET, reply.to_wire(), client_id=node)

    def on_ticket_return(self, environment: Any, msg: Any, **_: Any) -> None:
        back = TicketReturn.from_wire(msg.data)
        if not self._redeem(msg.node_id, (back.level, back.phase, back.seq), back.ticket):
            self._ignore(
                msg.node_id,
                f"a ticket return for a request it was not granted (level {back.level}, "
                f"{back.phase} #{back.seq})",
            )
            return
        if self.ctrl is not None:
            self.ctrl.give_back(back.level, back.phase)
            self.broadcast()

    def on_record(self, environment: Any, msg: Any, **_: Any) -> None:
        try:
            m = RecordMsg.from_wire(msg.data)
            rec = m.parsed()
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            self._ignore(msg.node_id, f"a malformed record message ({e})")
            return
        self.take_record(msg.node_id, rec, m.ticket, m.record)

    def take_record(self, node: str, rec: RequestRecord, ticket: str, line: Any) -> None:
        """A finished request's record from process ``node`` (a message, or a call in a local run);
        ``line`` is what records.jsonl gets: the record's dict, or the record itself (orjson writes
        a dataclass as the same bytes as its ``asdict``)."""
        if not self._redeem(node, (rec.level, rec.phase, rec.seq), ticket):
            # Only a ticket this owner granted to that process, and only once: a forged or repeated
            # record (or one for a ticket already written off) never reaches the counts.
            self._ignore(
                node, f"a record for a request it was not granted (level {rec.level}, {rec.phase} #{rec.seq})"
            )
            return
        if rec.level not in self._in_flight or rec.level in self.traffic:  # not once its figure is final
            self.traffic.setdefault(rec.level, LevelTraffic()).add(
                rec.t_send, rec.t_end, rec.phase == PHASE_MEASURE, rec.status == FAILED
            )
        if self.slo is not None and rec.phase == PHASE_MEASURE:
            self.slo_tallies.setdefault(rec.level, SloTally(self.slo)).add_record(rec)
        if self.live is not None:
            self.live.add_record(rec)
        if self.writer is not None and self.write_error is None:
            try:
                self.writer.write(line)
            except OSError as e:
                self._cannot_write("records.jsonl", e)
        if self.ctrl is not None:
            changes = self.ctrl.receive(rec)  # counted even after the run closed (grace-period records)
            if self.active:
                self._report(changes)

    # the client's own load ---------------------------------------------------------------------
    def on_client_load(self, environment: Any, msg: Any, **_: Any) -> None:
        runner = self.env.runner
        if isinstance(runner, MasterRunner) and msg.node_id not in runner.clients:
            return  # not a worker of ours: its word on its own load counts for nothing
        try:
            m = ClientLoadMsg.from_wire(msg.data)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            self._ignore(msg.node_id, f"a malformed client load message ({e})")
            return
        self.take_load(msg.node_id, m)

    def take_load(self, process: str, m: ClientLoadMsg) -> None:
        """A process's load in a level so far (its latest report replaces the one before)."""
        if (
            m.run is None
            or m.run != self.run_dir
            or self.ctrl is None
            or not 0 <= m.level < len(self.ctrl.levels)
        ):
            return
        self.client_load.setdefault(m.level, {})[process] = m.load
        if self.live is not None:
            self.live.set_streamed(m.level, process, m.streamed)

    def where(self) -> tuple[str | None, int] | None:
        """The master's own probe: the level handing out tickets or draining now, if any."""
        lv = self.ctrl.current if self.active and self.ctrl is not None else None
        return None if lv is None or lv.phase not in ACTIVE_PHASES else (self.run_dir, lv.plan.index)

    def take_own_load(self, m: ClientLoadMsg) -> None:
        self.take_load(MASTER, m)

    def client_figures(self, index: int) -> ClientFigures | None:
        """The client's own load in level ``index`` so far; None before anything was measured."""
        if self.ctrl is None or not 0 <= index < len(self.ctrl.levels):
            return None
        procs, traffic = self.client_load.get(index, {}), self.traffic.get(index)
        cached = self._in_flight.get(index)
        if not procs and traffic is None and cached is None:
            return None
        lv = self.ctrl.levels[index]
        if traffic is not None:
            final = lv.status == LevelStatus.COMPLETED
            if in_flight_due(
                cached[0] if cached is not None else None, len(traffic.spans), final
            ):  # O(records)
                stagger = self.config.scenario.stagger_s if self.config is not None else 0.0
                away = lv.refused > 0 or lv.outage_s > 0
                cached = self._in_flight[index] = (
                    len(traffic.spans),
                    judge_in_flight(
                        traffic, lv.plan.concurrency, lv.plan.budget, away, stagger, lv.plan.rate
                    ),
                )
            if final:
                del self.traffic[index]  # every record is in: the figure is final, the spans can go
        mif, why = cached[1] if cached is not None else (None, "no measured request")
        return ClientFigures(lv.plan.concurrency, dict(procs), mif, why)

    _IGNORED_LOGGED = 3  # per process: a flood of forged messages must not become a flood of log lines

    def _ignore(self, node: str, what: str) -> None:
        self.rejected += 1
        seen = self._ignored_from[node] = self._ignored_from.get(node, 0) + 1
        if seen <= self._IGNORED_LOGGED:
            more = "; more from it are counted, not logged" if seen == self._IGNORED_LOGGED else ""
            logger.warning("ignored %s from %s%s", what, node, more)

    def _redeem(self, node: str, key: tuple[int, str, int], ticket: str) -> bool:
        """True once for a ticket granted to ``node`` and shown with its secret; then it is spent."""
        held = self.outstanding.get(node, {})
        secret = held.get(key)
        if secret is None or not hmac.compare_digest(secret, ticket):
            return False
        del held[key]
        return True

    def _check_workers(self) -> None:
        """Write off the tickets of workers the master lost (missing heartbeats, or gone)."""
        runner = self.env.runner
        if not isinstance(runner, MasterRunner) or self.ctrl is None:
            return
        alive = {c.id for c in runner.clients.all if c.state != STATE_MISSING}
        lost = [node for node in self.outstanding if node not in alive and node not in self._lost]
        for node in lost:
            self._lost.add(node)
            tickets = self.outstanding[node]
            logger.error(
                "worker %s was lost with %d request(s) in flight; they are written off", node, len(tickets)
            )
            by_kind: dict[tuple[int, str], int] = {}
            for level, phase, _seq in tickets:
                by_kind[(level, phase)] = by_kind.get((level, phase), 0) + 1
            tickets.clear()
            for (level, phase), n in by_kind.items():
                why = f"lost a worker ({node}): {n} request(s) in flight never reported"
                self._report(self.ctrl.write_off(level, phase, n, why))
        if lost:
            self._respread_users(runner)

    def _respread_users(self, runner: MasterRunner) -> None:
        """The lost worker's users go to the others now: the level keeps its concurrency. (Locust
        itself would wait for the next level, or for --enable-rebalancing, which also moves users
        around when a worker joins mid-level and cuts their requests.)"""
        assert self.ctrl is not None
        users = self.ctrl.desired_users()
        if self.ctrl.finished or users == 0 or not (runner.clients.ready or runner.clients.running):
            return
        logger.warning(
            "the remaining %d worker(s) take over its users: %d in all",
            len(runner.clients.ready) + len(runner.clients.running),
            users,
        )
        runner.start(users, self.spawn_rate())

    # progress ---------------------------------------------------------------------------------
    def _report(self, changes: list[Change]) -> None:
        """Log the level transitions, then bring run.json and the users up to date."""
        if not changes or self.ctrl is None:
            return
        for change in changes:
            if change == Change.START:
                self._log_level_start()
                self._clocks_for_level()
            elif change == Change.DONE:
                self._log_level_done()
                self._capacity_step()
            elif change == Change.OUTAGE:
                self._watch_outage()
            elif change == Change.RESUMED:
                lv = self.ctrl.current
                logger.warning(
                    "the server answers again; new requests resume%s",
                    f" ({level_label(lv.plan.concurrency, lv.plan.repeat, lv.plan.rate)})" if lv else "",
                )
            elif change in (Change.ABORT, Change.TIMEOUT):
                if hint := invalid_prompt_hint(self.ctrl.abort_reason):
                    self.ctrl.abort_reason = f"{self.ctrl.abort_reason}; {hint}"
                logger.error("stopping the sweep: %s", self.ctrl.abort_reason)
        self.write_meta()
        self.broadcast()

    def _capacity_step(self) -> None:
        """A capacity search: the level just done is judged, and the next one appended (or the search ends)."""
        if self.capacity is None or self.ctrl is None or self.ctrl.finished or not self.ctrl.open_ended:
            return
        lv = next(x for x in reversed(self.ctrl.levels) if x.status == LevelStatus.COMPLETED)
        fig = self.client_figures(lv.plan.index)
        try:
            plan, line = self.capacity.level_done(
                lv.plan.index, self.slo_tallies.get(lv.plan.index), fig.flag() if fig is not None else None
            )
        except (ValueError, NotImplementedError) as e:
            plan, line = None, f"capacity: the search stopped: {e}"
        logger.info("%s", line)
        if plan is not None:
            self.ctrl.append(plan)
        else:
            self.ctrl.close()
        self._write_capacity()

    def _write_capacity(self) -> None:
        if self.capacity is None or self.run_dir is None:
            return
        try:
            write_json_atomic(os.path.join(self.run_dir, CAPACITY_JSON), self.capacity.to_json())
        except OSError as e:
            self._cannot_write(CAPACITY_JSON, e)

    def _watch_outage(self) -> None:
        """A refused connection: hold new requests and check the server with growing pauses; the
        controller stops the sweep if it stays away longer than --outage-timeout."""
        assert self.ctrl is not None and self.config is not None
        logger.warning(
            "the server refused a connection (%s); no new request starts until it answers again "
            "(at most %g s, --outage-timeout)",
            self.ctrl.outage_reason(),
            self.ctrl.outage_timeout_s,
        )
        if self._outage_watch is not None and not self._outage_watch.dead:
            return
        self._outage_watch = gevent.spawn(self._check_until_back, self.ctrl, self.config)

    def _check_until_back(self, ctrl: SweepController, config: RunConfig) -> None:
        timeout = min(config.scenario.connect_timeout_s, 2.0)
        checks = 0
        while self.ctrl is ctrl and not ctrl.finished and ctrl.outage_since is not None:
            gevent.sleep(_OUTAGE_CHECKS_S[min(checks, len(_OUTAGE_CHECKS_S) - 1)])
            checks += 1
            why = server_back(config.host, timeout, config.insecure, config.send_key)
            if why is None:
                self._report(ctrl.resume())
                return
            logger.debug("server not back yet: %s", why)

    def _log_level_start(self) -> None:
        assert self.ctrl is not None
        lv = self.ctrl.current
        assert lv is not None
        p = lv.plan
        what = f"{p.budget} requests" if p.budget is not None else f"{p.duration_s:g} s"
        warm = f" after {p.warmup} warmup" if p.warmup else ""
        load = (
            f"C={p.concurrency}"
            if p.rate is None
            else (f"{p.rate:g} requests/s ({p.arrival}), at most {p.concurrency} in flight")
        )
        logger.info(
            "level %d/%d %s started: %s, %s%s",
            p.index + 1,
            len(self.ctrl.levels),
            level_label(p.concurrency, p.repeat, p.rate),
            load,
            what,
            warm,
        )

    def _log_level_done(self) -> None:
        assert self.ctrl is not None
        lv = next(x for x in reversed(self.ctrl.levels) if x.status == LevelStatus.COMPLETED)
        p, agg = lv.plan, lv.agg_tok_s()
        wall = (lv.last_end - lv.first_send) if lv.first_send and lv.last_end else 0.0
        budget = p.budget if p.budget is not None else lv.granted
        fig = self.client_figures(p.index)
        flag = fig.flag() if fig is not None else None
        client = f"; {flag}" if flag else "; client ok" if fig is not None else ""
        if self.slo is not None and self.capacity is None:  # (a capacity search says it in its own line)
            client += f"; {verdict_text((self.slo_tallies.get(p.index) or SloTally(self.slo)).result())}"
        logger.log(
            logging.WARNING if flag else logging.INFO,
            "level %d/%d %s done: %d/%d requests, ok %d, failed %d, short %d, "
            "%d tokens, agg %s tok/s over %.1f s%s",
            p.index + 1,
            len(self.ctrl.levels),
            level_label(p.concurrency, p.repeat, p.rate),
            lv.received,
            budget,
            lv.ok,
            lv.failed,
            lv.short,
            lv.tokens,
            f"{agg:.1f}" if agg is not None else "-",
            wall,
            client,
        )


def _add_sample(live: LiveRun, line: dict[str, Any]) -> None:
    sample = ServerSample.from_dict(line)
    if sample is not None:
        live.add_sample(sample)


def sweep_owner(environment: Any) -> SweepOwner:
    """The owner of this Locust environment's sweep (made on first use, kept on the environment)."""
    owner: SweepOwner | None = getattr(environment, _ATTR, None)
    if owner is None or owner.env is not environment:
        owner = SweepOwner(environment)
        setattr(environment, _ATTR, owner)
    return owner
