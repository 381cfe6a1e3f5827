"""The Locust user: ask for a ticket, send one streaming generation request, ship its record.

Users know nothing of levels beyond what the sweep's owner broadcasts (``MSG_STATE``): they block
until tickets are available, then each ticket is one request. This is the same code in every
process: local, ``--processes N`` children, and workers on other machines.
"""

from __future__ import annotations

import gc
import logging
import random
import time
from typing import Any

import gevent
import orjson
from gevent.event import AsyncResult, Event
from locust import User, constant, task
from locust.runners import WorkerRunner
from locust.user.users import LOCUST_STATE_STOPPING

from specload.client.backends import Backend, get_backend
from specload.client.http import base_headers, endpoint, make_client, warm_up
from specload.client.stream import Interrupted, RequestSpec, stream_request
from specload.clock.hrtimer import clock, sleep_until
from specload.core.records import RequestRecord, now
from specload.locust.channel import FOR_TICKETS, master_token, proof
from specload.locust.events import fire_record
from specload.locust.protocol import (
    LOCAL_NODE,
    MSG_RECORD,
    MSG_STATE,
    MSG_TICKET,
    MSG_TICKET_REQ,
    MSG_TICKET_RETURN,
    RecordMsg,
    RunConfig,
    StateMsg,
    TicketReply,
    TicketRequest,
    TicketReturn,
    WireError,
    decode,
)
from specload.sweep.levels import SweepState
from specload.workload.config import NATURAL
from specload.workload.prompts import IDS, prime
from specload.workload.request import Conversation, RequestMaker
from specload.workload.vocab import ServerTokenizer

logger = logging.getLogger("specload")

_WAIT_OPEN_S = 0.5  # how long an idle user waits for tickets before yielding back to Locust
_STAGGER_STEP_S = 0.1  # a staggered user looks this often whether the sweep stopped
_TICKET_REPLY_S = 30.0
_ATTR = "specload_users"  # the UserSide's attribute on the Locust Environment


class UserSide:
    """Per-process state shared by all users of one Locust process."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.worker = runner.client_id if isinstance(runner, WorkerRunner) else "local"
        self.state = SweepState()
        self.config: RunConfig | None = None
        self.config_id: str | None = None
        self.open = Event()
        self.pending: dict[str, AsyncResult] = {}
        self.due: dict[str, float] = {}  # a rate grant's due time on this clock, set when its reply came
        self._backend: Backend | None = None
        self._maker: RequestMaker | None = None
        self._wire: tuple[str, dict[str, str]] | None = None
        # The sweep's owner when it runs in this very process (a local run): asked and told
        # directly, the same calls its message handlers make, without encoding and decoding each
        # ticket and record (~10 % of the client's CPU per request). None: messages (workers).
        self.local_owner: Any = None
        self._refused: set[str] = set()  # the kinds of the owner's messages refused (said once each)
        self._token = master_token()  # proves to the master that this worker is one of the run's
        self.nonce = ""  # the master's nonce for this worker's join: every proof is bound to it
        self.stopping = False  # this process was told to stop: no more tickets asked for
        self.in_flight = 0  # this process's users holding a ticket (their records not shipped yet)

    def _auth(self, what: str) -> str:
        return "" if self._token is None else proof(self._token, self.worker, what, self.nonce)

    # message handlers -------------------------------------------------------------------------
    def _refuse(self, what: str, e: WireError) -> None:
        """A message from the owner this process cannot read: said once per kind (they repeat every second)."""
        if what not in self._refused:
            self._refused.add(what)
            logger.error("%s: refused the owner's %s: %s", self.worker, what, e)

    def on_state(self, environment: Any, msg: Any, **_: Any) -> None:
        try:
            m = decode(StateMsg.from_wire, msg.data)
        except WireError as e:
            self._refuse("state message", e)
            return
        self.state = m.state
        if m.config is not None and m.config_id != self.config_id:
            try:
                config = decode(RunConfig.from_wire, m.config)
            except WireError as e:
                self._refuse(f"run config {m.config_id}", e)
                self.open.clear()  # no request of this run goes out under an unreadable config
                return
            self.config, self.config_id = config, m.config_id
            self._backend = self._maker = self._wire = None
            if self.config.scenario.dataset is None:
                # Now, before this run's first stream: drawn by the first prompt, it would hold up
                # the streams already in flight for tens of ms.
                prime(self.config.prompts, self.config.scenario.seed)
            # What the process holds for the run (modules, Locust, the tape of prompt ids: ~10^6
            # objects) is exempt from the collector from now on: a full collection walked it for
            # ~35 ms of CPU, and when one fell on a trace's burst every request after it was late.
            # (Collected first, so that an earlier run's cyclic garbage is not kept for good.)
            gc.collect()
            gc.freeze()
        if m.state.open:
            self.open.set()
        else:
            self.open.clear()

    def on_ticket(self, environment: Any, msg: Any, **_: Any) -> None:
        try:
            reply = decode(TicketReply.from_wire, msg.data)
        except WireError as e:
            self._refuse("ticket reply", e)
            return
        self.take_reply(reply)

    def take_reply(self, reply: TicketReply) -> None:
        """The owner's answer to one of this process's users (from a message, or from the owner
        itself in a local run)."""
        waiter = self.pending.pop(reply.uid, None)
        if waiter is not None:
            if reply.grant is not None and reply.grant.delay_s is not None:
                # Due in delay_s from now, the reply's arrival: the user greenlet resumes only when
                # the hub gets to it (after the owner's greenlet, in a local run), a few ms late at times.
                self.due[reply.uid] = now() + reply.grant.delay_s
            waiter.set(reply if reply.grant is not None else None)
        elif reply.grant is not None:
            self.give_back(reply)

    def give_back(self, reply: TicketReply) -> None:
        """A grant that will not be used: the level may hand it out again."""
        assert reply.grant is not None
        g = reply.grant
        self.runner.send_message(
            MSG_TICKET_RETURN,
            TicketReturn(g.level, g.phase, g.seq, reply.ticket, self._auth(reply.ticket)).to_wire(),
        )

    # user API ---------------------------------------------------------------------------------
    def backend(self) -> Backend:
        if self._backend is None:
            assert self.config is not None
            self._backend = get_backend(self.config.scenario.backend)
        return self._backend

    def wire(self) -> tuple[str, dict[str, str]]:
        """The run's request path and headers, made once per run (the API key read from the
        environment then, not per request)."""
        if self._wire is None:
            cfg = self.config
            assert cfg is not None
            self._wire = (endpoint(cfg.host, self.backend().path), base_headers(True, cfg.send_key))
        return self._wire

    def maker(self) -> RequestMaker:
        """The run's request maker (specload.workload.request): what each ticket sends."""
        if self._maker is None:
            cfg = self.config
            assert cfg is not None
            sc = cfg.scenario
            tokenize = None
            # A token-id conversation resends its answers as the server tokenizes them.
            if cfg.prompts.kind == IDS:
                tokenize = ServerTokenizer(
                    cfg.host, cfg.model, sc.connect_timeout_s, cfg.insecure, cfg.send_key
                ).encode
            self._maker = RequestMaker(sc, cfg.prompts, tokenize)
        return self._maker

    def ticket(self, uid: str) -> TicketReply | None:
        if self.stopping or not self.open.wait(_WAIT_OPEN_S) or self.config is None:
            return None
        waiter: AsyncResult = AsyncResult()
        self.pending[uid] = waiter
        owner = self.local_owner
        if owner is not None:
            owner.ticket_request(LOCAL_NODE, uid)
        else:
            self.runner.send_message(MSG_TICKET_REQ, TicketRequest(uid, self._auth(FOR_TICKETS)).to_wire())
        try:
            reply = waiter.get(timeout=_TICKET_REPLY_S)
        except gevent.Timeout:
            self.pending.pop(uid, None)
            return None
        if reply is None:
            gevent.sleep(0.05)  # the level just closed; the state broadcast is on its way
        return reply

    def ship(self, record: RequestRecord, ticket: str) -> None:
        owner = self.local_owner
        if owner is not None:
            owner.take_record(LOCAL_NODE, record, ticket, record)
        else:
            self.runner.send_message(MSG_RECORD, RecordMsg.of(record, ticket, self._auth(ticket)).to_wire())


def current_user_side(environment: Any) -> UserSide | None:
    """The process's UserSide if it has one (never makes one)."""
    return getattr(environment, _ATTR, None)


def user_side(environment: Any) -> UserSide:
    side: UserSide | None = getattr(environment, _ATTR, None)
    if side is None or side.runner is not environment.runner:
        side = UserSide(environment.runner)
        setattr(environment, _ATTR, side)
    return side


def register_user_side(environment: Any) -> UserSide:
    side = user_side(environment)
    runner = environment.runner
    runner.register_message(MSG_STATE, side.on_state)
    runner.register_message(MSG_TICKET, side.on_ticket)
    return side


class SpecloadUser(User):
    """One closed-loop client: one request at a time, the next as soon as the last one ends."""

    wait_time = constant(0)

    def on_start(self) -> None:
        self.uid = f"{id(self):x}"
        self._client: Any = None
        self._client_key: tuple[Any, ...] | None = None
        self._last_level: int | None = None
        self._conv: Conversation | None = None  # the conversation this user is in (--turns)

    def on_stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _http(self, cfg: RunConfig) -> Any:
        sc = cfg.scenario
        key = (cfg.host, sc.read_timeout_s, sc.connect_timeout_s, cfg.insecure)
        if self._client is None or key != self._client_key:
            if self._client is not None:
                self._client.close()
            self._client = make_client(cfg.host, sc.read_timeout_s, sc.connect_timeout_s, cfg.insecure)
            self._client_key = key
            warm_up(self._client)
        return self._client

    @task
    def generate(self) -> None:
        side = user_side(self.environment)
        reply = side.ticket(self.uid)
        if reply is None or reply.grant is None:
            return
        side.in_flight += 1
        try:
            self._send(side, reply)
        finally:
            side.in_flight -= 1

    def _stagger(self, side: UserSide, reply: TicketReply, seconds: float) -> bool:
        """Wait ``seconds`` holding the granted ticket; False as soon as the sweep stops meanwhile
        (this process told to stop, the user stopped, or the run finished), so a stop never waits
        out a stagger longer than its grace. Killed during it, the ticket goes back: a granted
        ticket ends as one record or as a ticket returned, never as neither."""
        end = time.monotonic() + seconds
        try:
            while (left := end - time.monotonic()) > 0:
                if side.stopping or side.state.finished or self._state == LOCUST_STATE_STOPPING:
                    return False
                gevent.sleep(min(left, _STAGGER_STEP_S))
        except gevent.GreenletExit:
            side.give_back(reply)
            raise
        return True

    def _send(self, side: UserSide, reply: TicketReply) -> None:
        """The granted request, and its record shipped (or its ticket given back), whatever happens."""
        grant = reply.grant
        assert grant is not None
        due = side.due.pop(self.uid, None)
        t_sched = None if grant.delay_s is None else (due if due is not None else now() + grant.delay_s)
        cfg = side.config
        assert cfg is not None
        sc = cfg.scenario
        staggered = t_sched is None and sc.stagger_s > 0 and grant.level != self._last_level
        if staggered and not self._stagger(side, reply, random.uniform(0, sc.stagger_s)):
            side.give_back(reply)  # the sweep stopped during the stagger: nothing was sent
            return
        self._last_level = grant.level
        backend = side.backend()
        maker = side.maker()
        req = maker.plan(
            grant.level, grant.phase, grant.seq, grant.max_tokens, reply.item, self._conv, reply.trace
        )
        natural = sc.output_mode == NATURAL
        body = backend.body(req.prompt, req.max_tokens, cfg.model, sc.temperature, sc.extra_body, natural)
        spec = RequestSpec(
            level=grant.level,
            concurrency=grant.concurrency,
            phase=grant.phase,
            seq=grant.seq,
            repeat=grant.repeat,
            requested_output_tokens=req.max_tokens,
            requested_prompt_tokens=req.prompt_tokens,
            t_sched=t_sched,
            rate=grant.rate,
            request_class=req.request_class,
            turn=req.turn,
            conversation=req.conversation,
            prefix_group=req.prefix_group,
            category=req.category,
            natural=natural,
            trace_index=req.trace_index,
        )
        http = self._http(cfg)  # a new user's connection is opened before its due time, not after
        payload: Any = body
        if t_sched is not None:
            # Encoded now, not after the wake-up: a trace's 10k-token prompt takes ~0.5 ms to encode,
            # and the requests due at one instant (a trace's bursts) would each add that to the next's
            # lateness. (stream_request's orjson.dumps passes a Fragment through as it is.)
            payload = orjson.Fragment(orjson.dumps(body))
            # The prompt's list (up to ~100k ids) is let go now and freed at once: kept until the
            # send, the collector's next pass walked it, and that pass falls in the burst of a
            # trace's due instant (0.5-3 ms of CPU each, measured, pushing back every later send).
            del body
            if req.conv is None:  # (a conversation's next turn resends it: maker.after)
                req.prompt = None
            # A rate level: the request is due at t_sched whatever else is in flight. A late one
            # (every user was busy) goes at once, and its record keeps when it was due. A timerfd
            # wakes it on time; gevent's own timers round up to a millisecond, late by 0.4-1.4 ms.
            wait = t_sched - now()
            if wait > 0:
                try:
                    sleep_until(clock() + wait)
                except gevent.GreenletExit:
                    side.give_back(reply)  # stopped before it was due: nothing was sent
                    raise
        path, headers = side.wire()
        text: list[str] | None = [] if req.wants_answer else None
        try:
            rec = stream_request(
                http,
                path,
                payload,
                headers,
                backend,
                spec,
                side.worker,
                sc.read_timeout_s,
                sc.connect_timeout_s,
                text,
            )
        except Interrupted as stop:
            side.ship(stop.record, reply.ticket)
            raise gevent.GreenletExit from None
        fire_record(self.environment.events.request.fire, rec, backend.path)
        side.ship(rec, reply.ticket)
        self._conv = maker.after(req, rec, text)
