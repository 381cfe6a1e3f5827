"""The sweep's owner: runs in the one process that owns the run directory (Locust master, or the
only process when local). It resolves the scenario, checks the server, hands out tickets,
writes records and run.json as they come, and logs one progress line per level boundary.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import locust
from locust.runners import STATE_MISSING, MasterRunner

from specload import __version__
from specload.config import Scenario, ScenarioError
from specload.http import check_host
from specload.introspect import MetricsSampler, max_running, server_config
from specload.levels import SweepController, plan_levels
from specload.options import explicit_options, launch_values, scenario_from_options
from specload.probe import ServerUnreachable, discover_model
from specload.records import level_label
from specload.rundir import RUN_JSON, RecordWriter, claim_run_dir, new_run_dir, write_json_atomic
from specload.user import MSG_RECORD, MSG_STATE, MSG_TICKET, MSG_TICKET_REQ, MSG_TICKET_RETURN

logger = logging.getLogger("specload")


def redact_host(host: str) -> str:
    """The host URL without any user:password part, for files and logs."""
    parts = urlsplit(host)
    if parts.username or parts.password:
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return host


class Coordinator:
    def __init__(self, environment: Any) -> None:
        self.env = environment
        self.active = False
        self.ctrl: SweepController | None = None
        self.writer: RecordWriter | None = None
        self.run_dir: str | None = None
        self.meta: dict[str, Any] = {}
        self.config: dict[str, Any] = {}
        self.scenario: Scenario | None = None
        self.failure: str | None = None
        self.sampler: MetricsSampler | None = None
        # Tickets granted and not yet back as records, per Locust process, to write off a dead worker's.
        self.outstanding: dict[str, dict[tuple[int, str, int], float]] = {}
        self._run_dir_used = False
        # What the command line set, to tell a web-UI edit or an explicit flag from an untouched default.
        self._explicit = explicit_options(sys.argv[1:])
        self._launch = launch_values(environment.parsed_options) if environment.parsed_options else None

    # lifecycle --------------------------------------------------------------------------------
    def register(self) -> None:
        runner = self.env.runner
        runner.register_message(MSG_TICKET_REQ, self.on_ticket_req)
        runner.register_message(MSG_RECORD, self.on_record)
        runner.register_message(MSG_TICKET_RETURN, self.on_ticket_return)

    def start(self) -> bool:
        """Resolve, check and open a new run. False (with the reason logged) when it cannot start."""
        opts = self.env.parsed_options
        self.failure = None
        try:
            sc = scenario_from_options(opts, self._explicit, self._launch)
            host = check_host(self.env.host)
        except (ScenarioError, ValueError) as e:
            return self._fail(str(e))
        insecure = bool(getattr(opts, "insecure", False))
        if insecure and host.startswith("https://"):
            logger.warning("--insecure: the server's TLS certificate is NOT verified")
        model, how = sc.model, "scenario/flag"
        if not model:
            try:
                model, how = discover_model(host, sc.connect_timeout_s, insecure)
            except ServerUnreachable as e:
                return self._fail(f"cannot reach the server before the sweep: {e}")
            if model is None and sc.backend != "sglang":
                return self._fail(f"no model name: {how}; pass --model NAME")
        self.scenario = sc
        server = server_config(host, sc.connect_timeout_s, insecure)
        cap = max_running(server)
        if cap is not None and max(sc.levels) > cap:
            logger.warning(
                "the server runs at most %d requests at once (max_running_requests); "
                "levels above C=%d will queue the excess", cap, cap,
            )  # fmt: skip
        label = opts.label or sc.name
        try:
            if opts.run_dir and not self._run_dir_used:
                self.run_dir = claim_run_dir(opts.run_dir)
                self._run_dir_used = True
            else:
                self.run_dir = new_run_dir(opts.results_dir or "results", label)
        except OSError as e:
            return self._fail(f"cannot create the run directory: {e}")
        self.writer = RecordWriter(self.run_dir)
        self.outstanding = {}
        self.ctrl = SweepController(plan_levels(sc), sc.pause_s, sc.level_timeout_s)
        self.config = {"scenario": sc.to_dict(), "model": model, "host": host, "insecure": insecure}
        self.meta = {
            "specload_version": __version__,
            "locust_version": locust.__version__,
            "label": label,
            "host": redact_host(host),
            "backend": sc.backend,
            "model": model,
            "model_source": how,
            "scenario_file": getattr(opts, "scenario", "") or None,
            "scenario": sc.to_dict(),
            "started_at": time.time(),
            "ended_at": None,
            "status": "running",
            "reason": None,
            "mode": type(self.env.runner).__name__.replace("Runner", "").lower(),
            "levels": self.ctrl.levels_meta(),
            "server": server,
            "simulated": bool(server.get("simulated", False)),
            "server_metrics": "off",
        }
        if sc.metrics_interval_s > 0:
            self.sampler = MetricsSampler(host, self.run_dir, self._level_index, sc.metrics_interval_s, insecure)
            self.meta["server_metrics"] = "sampled" if self.sampler.start() else "unavailable"
        self.write_meta()
        self.active = True
        n = len(self.ctrl.levels)
        logger.info(
            "sweep %r against %s (%s, model %s): %d level(s) %s; run directory %s",
            label, redact_host(host), sc.backend, model, n, ",".join(map(str, sc.levels)), self.run_dir,
        )  # fmt: skip
        return True

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
            self.meta["levels"] = self.ctrl.levels_meta()
        write_json_atomic(os.path.join(self.run_dir, RUN_JSON), self.meta)

    def finish(self, status: str | None = None) -> None:
        """Close the run (idempotent). Late records still reach records.jsonl afterwards."""
        if not self.active or self.ctrl is None:
            return
        self.active = False
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        if status is None:
            status = {"completed": "completed", "aborted": "failed"}.get(self.ctrl.outcome, "interrupted")
        if status == "interrupted":
            self.ctrl.abort("interrupted")
        self.meta["status"] = status
        self.meta["reason"] = self.ctrl.abort_reason if status != "completed" else None
        self.meta["ended_at"] = time.time()
        self.write_meta()
        self.env.process_exit_code = 0 if status == "completed" else 1
        logger.info("sweep %s%s; results in %s", status,
                    f" ({self.meta['reason']})" if self.meta["reason"] else "", self.run_dir)  # fmt: skip

    # shape hook -------------------------------------------------------------------------------
    def tick(self, user_count: int) -> int | None:
        """Desired user count, or None when the sweep is over."""
        assert self.ctrl is not None
        self._check_workers()
        changes = self.ctrl.tick(user_count)
        self._after(changes)
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
        state = self.ctrl.state()
        state["config"] = self.config
        self.env.runner.send_message(MSG_STATE, state)

    def on_ticket_req(self, environment: Any, msg: Any, **_: Any) -> None:
        grant = None
        changes: list[str] = []
        if self.active and self.ctrl is not None:
            g = self.ctrl.grant()
            if g is not None:
                grant = {k: getattr(g, k) for k in ("level", "concurrency", "repeat", "phase", "seq", "max_tokens")}
                self.outstanding.setdefault(msg.node_id, {})[(g.level, g.phase, g.seq)] = time.time()
                if not self.ctrl.is_open:
                    changes.append("closed")
        if changes:
            self.broadcast()  # before the reply: users must see "closed" before a refusal
        self.env.runner.send_message(MSG_TICKET, {"uid": msg.data["uid"], "grant": grant}, client_id=msg.node_id)

    def on_ticket_return(self, environment: Any, msg: Any, **_: Any) -> None:
        self.outstanding.get(msg.node_id, {}).pop((msg.data["level"], msg.data["phase"], msg.data["seq"]), None)
        if self.ctrl is not None:
            self.ctrl.give_back(msg.data["level"], msg.data["phase"])
            self.broadcast()

    def on_record(self, environment: Any, msg: Any, **_: Any) -> None:
        rec = msg.data
        self.outstanding.get(msg.node_id, {}).pop((rec.get("level"), rec.get("phase"), rec.get("seq")), None)
        if self.writer is not None:
            self.writer.write(rec)
        if self.ctrl is not None:
            changes = self.ctrl.receive(rec)  # counted even after the run closed (grace-period records)
            if self.active:
                self._after(changes)

    def _check_workers(self) -> None:
        """Write off the tickets of workers the master lost (missing heartbeats, or gone)."""
        runner = self.env.runner
        if not isinstance(runner, MasterRunner) or self.ctrl is None:
            return
        alive = {c.id for c in runner.clients.all if c.state != STATE_MISSING}
        for node, tickets in list(self.outstanding.items()):
            if node in alive or not tickets:
                continue
            logger.error("worker %s was lost with %d request(s) in flight; they are written off",
                         node, len(tickets))  # fmt: skip
            by_kind: dict[tuple[int, str], int] = {}
            for level, phase, _seq in tickets:
                by_kind[(level, phase)] = by_kind.get((level, phase), 0) + 1
            tickets.clear()
            for (level, phase), n in by_kind.items():
                why = f"lost a worker ({node}): {n} request(s) in flight never reported"
                self._after(self.ctrl.write_off(level, phase, n, why))

    # progress ---------------------------------------------------------------------------------
    def _after(self, changes: list[str]) -> None:
        if not changes or self.ctrl is None:
            return
        n = len(self.ctrl.levels)
        for change in changes:
            if change == "start":
                lv = self.ctrl.current
                assert lv is not None
                what = f"{lv.plan.budget} requests" if lv.plan.budget is not None else f"{lv.plan.duration_s:g} s"
                warm = f" after {lv.plan.warmup} warmup" if lv.plan.warmup else ""
                logger.info("level %d/%d %s started: C=%d, %s%s",
                            lv.plan.index + 1, n, level_label(lv.plan.concurrency, lv.plan.repeat),
                            lv.plan.concurrency, what, warm)  # fmt: skip
            elif change == "done":
                lv = next(x for x in reversed(self.ctrl.levels) if x.status == "completed")
                agg = lv.agg_tok_s()
                wall = (lv.last_end - lv.first_send) if lv.first_send and lv.last_end else 0.0
                budget = lv.plan.budget if lv.plan.budget is not None else lv.granted
                logger.info("level %d/%d %s done: %d/%d requests, ok %d, failed %d, short %d, "
                            "%d tokens, agg %s tok/s over %.1f s",
                            lv.plan.index + 1, n, level_label(lv.plan.concurrency, lv.plan.repeat), lv.received,
                            budget, lv.ok, lv.failed, lv.short, lv.tokens,
                            f"{agg:.1f}" if agg is not None else "-", wall)  # fmt: skip
            elif change in ("abort", "timeout"):
                logger.error("stopping the sweep: %s", self.ctrl.abort_reason)
        self.write_meta()
        self.broadcast()
