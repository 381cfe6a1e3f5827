"""Wires specload into Locust's event hooks: options, message handlers, run bookkeeping, web UI.

Every Locust process imports the locustfile, which imports this module and so installs these
listeners; each listener
checks which kind of process it is in (local, master, worker) and does only that process's job.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

import gevent
import locust.runners
from locust import events
from locust.runners import LocalRunner, MasterRunner, WorkerRunner

from specload.locust.clientload import LoadProbe, user_side_where
from specload.locust.clockprobe import register_clock_answer
from specload.locust.options import add_arguments
from specload.locust.owner import SweepOwner, sweep_owner
from specload.locust.protocol import MSG_CLIENT_LOAD
from specload.locust.user import register_user_side, user_side

logger = logging.getLogger("specload")

# Seconds in-flight requests get to finish when a test is stopped (Ctrl-C, SIGTERM, UI stop);
# what they measured is recorded either way. Locust's own --stop-timeout overrides it.
DEFAULT_GRACE_S = 10.0

def _owns_sweep(environment: Any) -> bool:
    return isinstance(environment.runner, LocalRunner | MasterRunner)


def on_parser(parser: Any, **_: Any) -> None:
    add_arguments(parser)
    parser.add_argument(
        "--quiet-report", dest="quiet_report", action="store_true", default=False,
        help="Do not print the per-level table when the sweep ends", include_in_web_ui=False,
    )  # fmt: skip


def on_init(environment: Any, **_: Any) -> None:
    runner = environment.runner
    if runner is None:
        return
    # Faster worker -> master statistics, so Locust's live rows lag the records by ~1 s, not 3.
    locust.runners.WORKER_REPORT_INTERVAL = 1.0
    if not isinstance(runner, MasterRunner):
        register_user_side(environment)
    _start_load_probe(environment)
    if isinstance(runner, WorkerRunner):
        register_clock_answer(runner)
    if _owns_sweep(environment):
        sweep_owner(environment).register()
        if not environment.stop_timeout:
            environment.stop_timeout = DEFAULT_GRACE_S
        opts = environment.parsed_options
        if opts is not None and opts.headless:
            _install_stop_signals(environment)
            if str(getattr(opts, "loglevel", "INFO")).upper() == "INFO":
                # specload's own lines say what a sweep does; Locust's ramp messages repeat it per level.
                logging.getLogger("locust.runners").setLevel(logging.WARNING)
        if environment.web_ui is not None:
            from specload.locust.websafety import protect_web_ui
            from specload.locust.webui import extend_web_ui

            protect_web_ui(environment)  # before any route of ours exists
            extend_web_ui(environment, sweep_owner(environment))


def _start_load_probe(environment: Any) -> None:
    """Every process measures its own load per level for the owner (specload.clientcheck): user
    processes send it over a message, the master (which runs no users, but hands out every ticket)
    hands its own straight to the owner."""
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        owner = sweep_owner(environment)
        probe = LoadProbe(owner.where, owner.take_own_load)
    else:
        side = user_side(environment)
        probe = LoadProbe(user_side_where(side), lambda m: runner.send_message(MSG_CLIENT_LOAD, m.to_wire()))
    probe.start()


def _install_stop_signals(environment: Any) -> None:
    """SIGTERM stops a sweep like Ctrl-C does: in-flight requests get the grace period, run.json says
    "interrupted". (Locust installs its own SIGTERM handler only after a headless shape run ends.)

    A second SIGINT or SIGTERM cuts the grace period short, never the final write: the requests in
    flight are stopped now and each still leaves its (interrupted) record, and run.json is closed
    as usual. (Left to Locust, a second Ctrl-C escapes its shutdown and nothing is written.)
    """
    signals_seen: list[int] = []

    def on_signal(sig: signal.Signals) -> None:
        signals_seen.append(sig)
        if len(signals_seen) == 1:
            logger.warning("%s: stopping; in-flight requests get up to %g s (again to cut them now)",
                           sig.name, environment.stop_timeout)  # fmt: skip
            # Raise Ctrl-C's KeyboardInterrupt in the main greenlet, where Locust handles it.
            gevent.get_hub().parent.throw(KeyboardInterrupt)
        elif environment.runner is not None:
            logger.warning("%s again: in-flight requests are stopped now and recorded as interrupted", sig.name)
            environment.runner.user_greenlets.kill(block=False)

    for sig in (signal.SIGINT, signal.SIGTERM):
        gevent.signal_handler(sig, on_signal, sig)


def on_test_stop(environment: Any, **_: Any) -> None:
    if _owns_sweep(environment):
        owner = sweep_owner(environment)
        was_active = owner.active
        owner.finish()
        if was_active and owner.run_dir is not None:
            _write_locust_stats(environment, owner)  # web UI: each run keeps its own Locust counts


def on_quitting(environment: Any, **_: Any) -> None:
    if not _owns_sweep(environment):
        return
    owner = sweep_owner(environment)
    owner.finish()
    owner.write_meta()  # counts now include records that arrived during the grace period
    if owner.run_dir is not None:
        _write_locust_stats(environment, owner)
        _write_report(environment, owner)
    elif owner.failure is not None:
        environment.process_exit_code = 2


def _write_locust_stats(environment: Any, owner: SweepOwner) -> None:
    """Locust's per-row counts into the run directory, for the report's cross-check, when the run was
    started without ``--json-file RUN/locust`` (Locust writes that one itself, later, at shutdown)."""
    import json

    opts = environment.parsed_options
    target = os.path.join(owner.run_dir, "locust")
    if opts is None or getattr(opts, "json_file", None) == target or environment.runner is None:
        return
    entries = [e.serialize() for e in environment.runner.stats.entries.values() if e.num_requests or e.num_failures]
    with open(target + ".json", "w") as f:
        json.dump(entries, f)


def _write_report(environment: Any, owner: SweepOwner) -> None:
    from specload.report import load_run, render_report, write_report_md

    try:
        run = load_run(owner.run_dir)
        write_report_md(run)
        opts = environment.parsed_options
        if opts is not None and opts.headless and not getattr(opts, "quiet_report", False):
            print(render_report(run, "github"), flush=True)
    except Exception as e:  # noqa: BLE001 - the raw files are on disk whatever happens here
        logger.warning("could not write report.md (%s); run `specload report %s`", e, owner.run_dir)


# Registered once, when the locustfile first imports this module (Python imports a module once).
events.init_command_line_parser.add_listener(on_parser)
events.init.add_listener(on_init)
events.test_stop.add_listener(on_test_stop)
events.quitting.add_listener(on_quitting)
