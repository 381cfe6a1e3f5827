"""Wires specload into Locust's event hooks: options, message handlers, run bookkeeping, web UI.

Every Locust process imports the locustfile, which imports this module and so installs these
listeners; each listener
checks which kind of process it is in (local, master, worker) and does only that process's job.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from typing import Any

import gevent
import locust.runners
from gevent.event import Event
from locust import events
from locust.runners import LocalRunner, MasterRunner, WorkerRunner

from specload.locust import masterwait, spawnargs
from specload.locust.channel import (
    FOR_JOIN,
    MASTER_TOKEN_ENV,
    master_token,
    new_master_token,
    proof,
    token_problem,
)
from specload.locust.clientload import LoadProbe, user_side_where
from specload.locust.clockprobe import register_clock_answer
from specload.locust.joingate import JoinGate
from specload.locust.options import add_arguments
from specload.locust.owner import sweep_owner
from specload.locust.protocol import (
    MSG_CLIENT_LOAD,
    MSG_CUT,
    MSG_JOIN,
    MSG_JOIN_ASK,
    MSG_JOIN_REFUSED,
    MSG_NONCE,
    JoinAsk,
    JoinMsg,
    NonceMsg,
    WireError,
)
from specload.locust.user import register_user_side, user_side

logger = logging.getLogger("specload")

# Seconds in-flight requests get to finish when a test is stopped (Ctrl-C, SIGTERM, UI stop);
# what they measured is recorded either way. Locust's own --stop-timeout overrides it.
DEFAULT_GRACE_S = 10.0

# The process that started this one: with --report-by-parent it writes report.md, unless it is gone
# (killed: this process is then re-parented, and got SIGTERM from its parent-death signal).
_PARENT = os.getppid()


def _parent_is_forker() -> None:
    """In a child forked from this process (Locust's --processes workers): its parent is the forker."""
    global _PARENT  # noqa: PLW0603 - one value per process, reset where the process begins
    _PARENT = os.getppid()


os.register_at_fork(after_in_child=_parent_is_forker)


def _parent_dead() -> bool:
    """Whether the process that started this one has exited (reaped, or a zombie)."""
    if os.getppid() != _PARENT:
        return True
    try:
        with open(f"/proc/{_PARENT}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return not os.path.isdir("/proc/self")  # no /proc: only the re-parenting above tells
    return state in ("Z", "X")


def _repeated_death(sig: signal.Signals, seen: list[int]) -> bool:
    """Whether ``sig`` is the parent's death signalled again, not a second stop signal.

    A parent that dies sends its parent-death signal (specload.launch.child_setup) once for each of
    its threads as they exit: Linux hands the child to the next live thread and signals it again. A
    killed `specload sweep` gave its Locust two SIGTERMs 16 ms apart, and the second cut the
    requests in flight. So once the parent is dead, a SIGTERM after the first is that death again;
    SIGINT still cuts."""
    if sig == signal.SIGTERM and seen and _parent_dead():
        logger.info(
            "SIGTERM again with the parent gone (its exit signals once per thread): the same stop; SIGINT cuts"
        )
        return True
    return False


def _owns_sweep(environment: Any) -> bool:
    return isinstance(environment.runner, LocalRunner | MasterRunner)


def on_parser(parser: Any, **_: Any) -> None:
    add_arguments(parser)
    parser.add_argument(
        "--report-by-parent",
        dest="report_by_parent",
        action="store_true",
        default=False,
        help="Leave report.md to the command that started Locust (specload sweep reads the run and "
        "writes it): no report child, nothing printed when the sweep ends",
        include_in_web_ui=False,
    )


def _ask_to_join(environment: Any, token: str) -> None:
    """A worker's join: a nonce asked of the master, then the proof of the token for it
    (specload.locust.joingate); every later proof of this process is bound to the same nonce."""
    runner = environment.runner
    side = user_side(environment)

    def on_nonce(environment: Any, msg: Any, **_: Any) -> None:
        try:
            nonce = NonceMsg.from_wire(msg.data).nonce
        except WireError as e:
            logger.error("this worker cannot read its master's join nonce (%s): it gets no users", e)
            return
        side.nonce = nonce
        runner.send_message(MSG_JOIN, JoinMsg(proof(token, runner.client_id, FOR_JOIN, nonce)).to_wire())

    def on_refused(environment: Any, msg: Any, **_: Any) -> None:
        logger.error(
            "the master refused this worker's proof of the master token: %s differs from the master's; "
            "this worker gets no users and no tickets",
            MASTER_TOKEN_ENV,
        )

    runner.register_message(MSG_NONCE, on_nonce)
    runner.register_message(MSG_JOIN_REFUSED, on_refused)
    runner.send_message(MSG_JOIN_ASK, JoinAsk().to_wire())


def on_init(environment: Any, **_: Any) -> None:
    runner = environment.runner
    if runner is None:
        return
    # Faster worker -> master statistics, so Locust's live rows lag the records by ~1 s, not 3.
    locust.runners.WORKER_REPORT_INTERVAL = 1.0
    gate = None
    if isinstance(runner, MasterRunner):
        gate = JoinGate(runner)  # no users, tickets or run config for a process that has not proved the token
    else:
        register_user_side(environment)
    _start_load_probe(environment)
    if isinstance(runner, WorkerRunner):
        register_clock_answer(runner)
        _install_worker_stop_signals(environment)
        token = master_token()
        if why := token_problem(token):
            logger.error("this worker is refused by its master (no users, no tickets): %s", why)
        if token is not None:  # (connected already: Locust's init waits for the master's ack)
            _ask_to_join(environment, token)
    if _owns_sweep(environment):
        if gate is not None:
            sweep_owner(environment).nonce_of = gate.nonce_of
        sweep_owner(environment).register()
        if isinstance(runner, LocalRunner):
            # One process: tickets and records go between the users and the owner as objects,
            # not as messages encoded for a wire there is none of (specload.locust.user.UserSide).
            side = user_side(environment)
            side.local_owner = sweep_owner(environment)
            sweep_owner(environment).local_side = side
        if not environment.stop_timeout:
            environment.stop_timeout = DEFAULT_GRACE_S
        opts = environment.parsed_options
        _install_stop_signals(environment)  # (the web UI too: no traceback, no SIG_IGN inherited)
        if opts is not None and opts.headless and str(getattr(opts, "loglevel", "INFO")).upper() == "INFO":
            # specload's own lines say what a sweep does; Locust's ramp messages repeat it per level.
            logging.getLogger("locust.runners").setLevel(logging.WARNING)
        if environment.web_ui is not None:
            from specload.locust.websafety import protect_web_ui
            from specload.locust.webui import extend_web_ui

            protect_web_ui(environment)  # before any route of ours exists
            extend_web_ui(environment, sweep_owner(environment))


def _start_load_probe(environment: Any) -> None:
    """Every process measures its own load per level for the owner (specload.analysis.clientcheck): user
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

    A master grants no more tickets and waits for the ones out (``SweepOwner.drain``) before it
    quits: left to Locust, it would tell its workers to quit at once, and the records of every
    request in flight would be lost with them.
    """
    signals_seen: list[int] = []
    owner = sweep_owner(environment)

    def on_signal(sig: signal.Signals) -> None:
        if _repeated_death(sig, signals_seen):
            return
        signals_seen.append(sig)
        master = isinstance(environment.runner, MasterRunner)
        if len(signals_seen) == 1:
            logger.warning(
                "%s: stopping; in-flight requests get up to %g s (again to cut them now)",
                sig.name,
                environment.stop_timeout,
            )
            opts = environment.parsed_options
            headless = opts is not None and opts.headless
            if master and owner.active and headless:
                owner.interrupt()  # the shape drains the workers' tickets, then Locust quits
            elif master and headless and not owner.active and owner.recorder.run_dir is None:
                # Still waiting for its workers (Locust's start_automatic_run): no run to drain, and a
                # KeyboardInterrupt there escapes Locust as a traceback (review 3a7af2e, L3).
                logger.warning("%s: stopped while waiting for workers; no request was sent", sig.name)
                environment.runner.quit()
                gevent.get_hub().parent.throw(SystemExit(1))
            elif sig == signal.SIGTERM and not headless:
                pass  # a web UI: Locust's own SIGTERM handler shuts down (on_quitting drains first)
            else:
                # Raise Ctrl-C's KeyboardInterrupt in the main greenlet, where Locust handles it.
                gevent.get_hub().parent.throw(KeyboardInterrupt)
        elif environment.runner is not None:
            logger.warning(
                "%s again: in-flight requests are stopped now and recorded as interrupted", sig.name
            )
            if master:
                owner.cut_now = True
            environment.runner.user_greenlets.kill(block=False)

    for sig in (signal.SIGINT, signal.SIGTERM):
        gevent.signal_handler(sig, on_signal, sig)


def _install_worker_stop_signals(environment: Any) -> None:
    """A worker told to stop (SIGTERM, Ctrl-C, or its master's quit) asks for no more tickets, lets
    its requests in flight finish within the grace period (or cuts them, each still recorded as
    interrupted), and ships their records before it tells the master it quits. A second signal
    cuts them now; so does the master's MSG_CUT (its own second signal, or its grace ended).

    The wait runs in a quitting listener registered after the runner's own: Locust fires them in
    reverse, so it runs before the worker's "quit" goes to the master (a record after that would
    be refused, its worker gone), whichever way the shutdown began (Locust's own SIGTERM handler
    starts it at once)."""
    signals_seen: list[int] = []
    runner = environment.runner
    wound_down = Event()
    started: list[bool] = []

    def cut(*_: Any, **__: Any) -> None:
        runner.user_greenlets.kill(block=False)

    runner.register_message(MSG_CUT, cut)

    def wind_down(**_: Any) -> None:
        if started:
            wound_down.wait(float(environment.stop_timeout or DEFAULT_GRACE_S) + 5.0)
            return
        started.append(True)
        side = user_side(environment)
        side.stopping = True
        t_end = time.monotonic() + float(environment.stop_timeout or DEFAULT_GRACE_S)
        while side.in_flight > 0 and time.monotonic() < t_end:
            gevent.sleep(0.1)
        if side.in_flight > 0:
            cut()
            t_cut = time.monotonic() + 2.0
            while side.in_flight > 0 and time.monotonic() < t_cut:
                gevent.sleep(0.05)
        wound_down.set()

    environment.events.quitting.add_listener(wind_down)

    def on_signal(sig: signal.Signals) -> None:
        if _repeated_death(sig, signals_seen):
            return
        signals_seen.append(sig)
        side = user_side(environment)
        if len(signals_seen) == 1:
            logger.warning(
                "%s: stopping this worker; its %d request(s) in flight get up to %g s, their records "
                "go to the master first (again to cut them now)",
                sig.name,
                side.in_flight,
                float(environment.stop_timeout or DEFAULT_GRACE_S),
            )
            side.stopping = True
            if sig == signal.SIGINT:  # (SIGTERM: Locust's own handler starts the shutdown)
                gevent.get_hub().parent.throw(KeyboardInterrupt)
        else:
            cut()

    for sig in (signal.SIGINT, signal.SIGTERM):
        gevent.signal_handler(sig, on_signal, sig)


def on_test_stop(environment: Any, **_: Any) -> None:
    if not _owns_sweep(environment):
        return
    owner = sweep_owner(environment)
    stopped_mid_run = owner.active  # else the shape ended it (and a master's shape waited already)
    owner.finish()
    opts = environment.parsed_options
    if opts is not None and opts.headless:
        return  # the process quits next: on_quitting completes the run directory
    # Web UI: each run's directory is completed as the run ends (a natural end, Stop, or an abort),
    # not when Locust quits. A master first lets its workers' last Locust statistics arrive.
    if stopped_mid_run and isinstance(environment.runner, MasterRunner):
        gevent.sleep(locust.runners.WORKER_REPORT_INTERVAL + 0.5)
    owner.close_run()  # report.md by a child: this process keeps answering (heartbeats, the web UI)


def on_quitting(environment: Any, **_: Any) -> None:
    if not _owns_sweep(environment):
        return
    owner = sweep_owner(environment)
    owner.stopping = True  # the shape starts no new run while this process quits
    owner.finish()
    if owner.run_dir is not None and not owner.closed:
        owner.drain()  # the requests in flight (a web UI stopped by a signal): counted before closing
    if owner.run_dir is None:
        if owner.failure is not None:
            environment.process_exit_code = 2
        return
    opts = environment.parsed_options
    # A headless run's report is printed here (by the child that writes report.md), unless the
    # command that started Locust reads the run after it anyway (specload sweep: --report-by-parent):
    # a second reading of the run in a second process would only repeat it.
    headless = opts is not None and opts.headless
    by_parent = headless and getattr(opts, "report_by_parent", False) and os.getppid() == _PARENT
    # nothing to do when a web UI run was completed already
    owner.close_run(print_report=headless and not by_parent, report=not by_parent)
    owner.wait_report()  # before quitting: whoever reads the run next finds report.md


def _token_for_own_processes() -> None:
    """Plain ``locust -f ... --processes N`` (not through ``specload sweep``, which makes one): a
    master token for this run, in the environment its forked worker processes inherit. Locust
    imports the locustfile before it forks them, so this is early enough."""
    if master_token() is None and any(a == "--processes" or a.startswith("--processes=") for a in sys.argv):
        os.environ[MASTER_TOKEN_ENV] = new_master_token()


def _locust_sigterm_once() -> None:
    """Locust's own SIGTERM handler (its ``shutdown``: the quitting event, the stats, ``sys.exit``)
    runs on the first SIGTERM only. A second one would run a second shutdown beside the first:
    the quitting listeners twice, and a ``SystemExit`` raised in a greenlet while the interpreter
    exits (a traceback, `specload ui` given SIGTERM twice). Our own handler still hears the second
    signal, and cuts the requests in flight (``_install_stop_signals``). Locust registers the
    handler in its ``main`` after importing the locustfile, so wrapping the registration here is
    in time."""
    register = gevent.signal_handler

    def once(signum: int, handler: Any, *args: Any, **kwargs: Any) -> Any:
        if signum != signal.SIGTERM or getattr(handler, "__module__", None) != "locust.main":
            return register(signum, handler, *args, **kwargs)
        fired: list[bool] = []

        def first_only(*a: Any, **kw: Any) -> Any:
            if fired:
                return None
            fired.append(True)
            return handler(*a, **kw)

        return register(signum, first_only, *args, **kwargs)

    gevent.signal_handler = once


_token_for_own_processes()
_locust_sigterm_once()
masterwait.install()
spawnargs.install()  # a worker's spawn messages read in ms, not seconds (heartbeats kept)

# Registered once, when the locustfile first imports this module (Python imports a module once).
events.init_command_line_parser.add_listener(on_parser)
events.init.add_listener(on_init)
events.test_stop.add_listener(on_test_stop)
events.quitting.add_listener(on_quitting)
