"""The ticket desk: the one place requests are granted, and the one place a record is accepted.

Every request a user sends is a ticket the desk granted to that user's process, with a secret;
its record (or its return, when it was never used) must come back from the same process with the
same secret, once. The master port takes messages from anyone who reaches it, under any worker
id they claim: a ticket's (level, phase, seq) can be guessed, its secret cannot. So a forged or
repeated record never reaches records.jsonl or the counts, and a dead worker's tickets can be
written off, each exactly once.

At a rate level the desk also parks the ticket requests of idle users and answers them in turn
as the level's requests fall due.

On a master, a level never has more than its C tickets out: each user holds at most one, so the
cap is reached only when there are more users than C, i.e. when a worker written off as lost comes
back with its users while the others have taken theirs over (review ab9c161, M2: 6 in flight at
C=4). A request over the cap waits until a ticket comes back (or is written off). (One process has
no worker to lose: its users are the level's.)
"""

from __future__ import annotations

import hmac
import logging
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import gevent
from gevent.event import Event
from locust.runners import MasterRunner

from specload.core.records import PHASE_MEASURE
from specload.locust.protocol import LOCAL_NODE, MSG_TICKET, TicketReply
from specload.locust.user import UserSide, current_user_side
from specload.sweep.levels import SweepController
from specload.workload.datasets import Item
from specload.workload.traces import TraceRequest

logger = logging.getLogger("specload")

TicketKey = tuple[int, str, int]  # (level, phase, seq)


class TicketDesk:
    """Grants, redeems, parks and writes off the tickets of one Locust process's runs.

    ``running``: the sweep's controller while a run is under way, else None (no grant then);
    ``broadcast``: tells every process the sweep's state (a level that just closed must be known
    closed before its last refusal arrives).
    """

    _IGNORED_LOGGED = 3  # per process: a flood of forged messages must not become a flood of log lines

    def __init__(
        self,
        environment: Any,
        running: Callable[[], SweepController | None],
        broadcast: Callable[[], None],
    ) -> None:
        self.env = environment
        self.running = running
        self.broadcast = broadcast
        # Tickets granted and not yet back as records, per Locust process: to write off a dead worker's,
        # and to accept each record once, from the process it was granted to.
        self.outstanding: dict[str, dict[TicketKey, str]] = {}  # -> the ticket's secret
        self.rejected = 0  # records for tickets never granted (or already back)
        self.ignored_from: dict[str, int] = {}  # messages ignored per claimed sender
        self._lost: set[str] = set()  # workers already written off
        self._unreadable: set[str] = set()  # senders of messages in a newer schema (said once each)
        # Rate levels: ticket requests of idle users, answered in turn as requests fall due.
        self.parked: deque[tuple[str, str]] = deque()  # (node id, user id)
        self._parked_event = Event()
        self._dispatcher: Any = None
        # Requests over a level's cap of C tickets out, answered as tickets come back.
        self.waiting: deque[tuple[str, str]] = deque()
        self._releaser: Any = None
        self.items: list[Item] = []  # the run's dataset prompts, one per grant in turn
        self._next_item = 0
        self.trace: tuple[
            TraceRequest, ...
        ] = ()  # a trace replay's requests: measured ticket seq k sends the k-th
        self.local_side: UserSide | None = (
            None  # a local run's users (specload.locust.user.UserSide): answered directly
        )

    def new_run(
        self,
        items: list[Item],
        trace: tuple[TraceRequest, ...] = (),
        trace_prompt: Callable[[TraceRequest, int], list[int]] | None = None,
    ) -> None:
        self.items, self._next_item = items, 0
        self.trace, self.trace_prompt = trace, trace_prompt
        self.outstanding, self._lost = {}, set()
        self.waiting.clear()

    # granting ---------------------------------------------------------------------------------
    def request(self, node: str, uid: str) -> None:
        """User ``uid`` of process ``node`` asks for a ticket (a message, or a call in a local run)."""
        ctrl = self.running()
        if ctrl is not None and (self.parked or (ctrl.wait_s() or 0.0) > 0):
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
        while self.parked or self.running() is not None:
            ctrl = self.running()
            if not self.parked:
                self._parked_event.clear()
                self._parked_event.wait(1.0)
                continue
            wait = ctrl.wait_s() if ctrl is not None else None
            if wait is None or wait <= 0:
                node, uid = self.parked.popleft()
                self._answer(node, uid)
            else:
                gevent.sleep(min(wait, 0.1))
            if self.running() is None and not self.parked:
                return

    @staticmethod
    def _full(ctrl: SweepController) -> bool:
        """The current level has its C tickets out (and could grant more were it not capped)."""
        lv = ctrl.current
        return lv is not None and ctrl.is_open and lv.in_flight >= lv.plan.concurrency

    def _release(self) -> None:
        """Answer the requests that waited for a ticket to come back, while the cap allows."""
        while self.waiting:
            ctrl = self.running()
            if ctrl is not None and self._full(ctrl):
                return
            node, uid = self.waiting.popleft()
            self.request(node, uid)

    def _came_back(self) -> None:
        """A ticket came back (a record, a return, a write-off): a waiting request may go now.
        Run after the caller's bookkeeping (the controller counts the record after ``redeem``)."""
        if self.waiting and (self._releaser is None or self._releaser.dead):
            self._releaser = gevent.spawn(self._release)

    def _answer(self, node: str, uid: str) -> None:
        """Grant the next ticket to user ``uid`` of process ``node``, or refuse (None) when closed."""
        grant = item = None
        treq: TraceRequest | None = None
        tprompt: list[int] | None = None
        closed = False
        ticket = ""
        ctrl = self.running()
        if ctrl is not None and isinstance(self.env.runner, MasterRunner) and self._full(ctrl):
            self.waiting.append((node, uid))
            return
        if ctrl is not None:
            grant = ctrl.grant()
            if grant is not None:
                ticket = secrets.token_hex(8)
                self.outstanding.setdefault(node, {})[(grant.level, grant.phase, grant.seq)] = ticket
                closed = not ctrl.is_open
                if self.items:
                    item = self.items[self._next_item % len(self.items)]
                    self._next_item += 1
                    if grant.phase == PHASE_MEASURE:
                        grant = replace(grant, max_tokens=item.output_tokens)
                if self.trace and grant.phase == PHASE_MEASURE and grant.seq < len(self.trace):
                    treq = self.trace[grant.seq]
                    grant = replace(grant, max_tokens=treq.output_tokens)
                    if self.trace_prompt is not None:
                        tprompt = self.trace_prompt(treq, grant.level)
        if closed:
            self.broadcast()  # before the reply: users must see "closed" before a refusal
        reply = TicketReply(uid, grant, item, ticket, treq, tprompt)
        side = self.local_side
        if side is not None and node == LOCAL_NODE and current_user_side(self.env) is side:
            side.take_reply(reply)  # (a UserSide made anew since the link asks by message, and hears so)
        else:
            self.env.runner.send_message(MSG_TICKET, reply.to_wire(), client_id=node)

    # taking back ------------------------------------------------------------------------------
    def redeem(self, node: str, key: TicketKey, ticket: str) -> bool:
        """True once for a ticket granted to ``node`` and shown with its secret; then it is spent."""
        held = self.outstanding.get(node, {})
        secret = held.get(key)
        if secret is None or not hmac.compare_digest(secret, ticket):
            return False
        del held[key]
        self._came_back()
        return True

    def held(self) -> int:
        """Tickets granted and not back (nor written off): requests whose records may still come."""
        return sum(len(t) for t in self.outstanding.values())

    def ignore(self, node: str, what: str) -> None:
        """A message from ``node`` that counts for nothing: counted, and logged the first few times."""
        self.rejected += 1
        seen = self.ignored_from[node] = self.ignored_from.get(node, 0) + 1
        if seen <= self._IGNORED_LOGGED:
            more = "; more from it are counted, not logged" if seen == self._IGNORED_LOGGED else ""
            logger.warning("ignored %s from %s%s", what, node, more)

    def unreadable(self, node: str, kind: str, why: str) -> None:
        """A message in a schema this specload cannot read (a newer one): refused, said once per sender."""
        if node not in self._unreadable:
            self._unreadable.add(node)
            logger.error("refused a %s message from %s: %s", kind, node, why)

    def ignored_summary(self) -> str | None:
        """The run's end line about ignored messages, if any were."""
        if not self.rejected:
            return None
        return (
            f"ignored {self.rejected} message(s) in all from {', '.join(sorted(self.ignored_from))}: records "
            "or returns for requests they were not granted (see docs/deploy.md, protecting the master port)"
        )

    # lost workers -----------------------------------------------------------------------------
    def lost(self, alive: set[str]) -> list[str]:
        """The processes holding tickets that are no longer alive, not written off before."""
        for node in sorted(self._lost & alive):
            # Its late records are refused (their tickets are gone); new tickets it may take, up to
            # the level's cap, and should it be lost again they are written off again.
            logger.warning(
                "worker %s answers again after its requests were written off: its late records are "
                "ignored, and the level still has at most C requests in flight",
                node,
            )
            self._lost.discard(node)
        gone = [node for node in self.outstanding if node not in alive and node not in self._lost]
        self._lost.update(gone)
        return gone

    def write_off(self, node: str) -> dict[tuple[int, str], int]:
        """Forget a lost worker's tickets: how many there were per (level, phase)."""
        tickets = self.outstanding[node]
        if tickets:
            logger.error(
                "worker %s was lost with %d request(s) in flight; they are written off", node, len(tickets)
            )
        else:  # (its records all in: a worker that was stopped, or died between two requests)
            logger.warning("worker %s left with no request in flight", node)
        by_kind: dict[tuple[int, str], int] = {}
        for level, phase, _seq in tickets:
            by_kind[(level, phase)] = by_kind.get((level, phase), 0) + 1
        tickets.clear()
        self._came_back()
        return by_kind
