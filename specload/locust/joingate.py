"""A master takes a worker in (users, tickets, run config) only once it has proved the master token.

Locust's master makes a worker of any process that sends ``client_ready`` to its port: it hands
it users at once (a joined attacker took two of a level's four users, review ab9c161), counts its
claimed users towards the level's ramp, and broadcasts it every state message. So a master holds a
``client_ready`` back until the same process sends ``MSG_JOIN`` with the proof of the token for its
id and a nonce the master gave it for this join (``MSG_JOIN_ASK`` -> ``MSG_NONCE``, then
``channel.proof(token, id, FOR_JOIN, nonce)``), which a specload worker does as its Locust init
runs; only then does Locust see the ``client_ready``. Every later proof of that worker's (tickets,
records, returns) is bound to the same nonce (``nonce_of``), so proofs captured in one run, or one
join, fail in any other (review 3a7af2e, M18). A proof that fails is said on the master and
answered with ``MSG_JOIN_REFUSED``, so the worker says why it gets nothing. Meanwhile the process gets the ``ack`` it waits for
(its init goes on, so it can send the proof) and nothing else: every other Locust message from it
is dropped (heartbeats, claimed users, statistics), and, not being a worker of the master's,
its specload messages are refused and counted (``SweepOwner._admitted``).
"""

from __future__ import annotations

import logging
from typing import Any

from locust.rpc import Message

from specload.locust.channel import FOR_JOIN, master_token, new_nonce, proven
from specload.locust.protocol import (
    MSG_JOIN,
    MSG_JOIN_ASK,
    MSG_JOIN_REFUSED,
    MSG_NONCE,
    JoinMsg,
    NonceMsg,
    WireError,
)

logger = logging.getLogger("specload")

# Locust messages a process that has not proved the token may still send: the join itself (held
# back), and the request for the locustfile (``-f -``), which is no secret and comes before the join.
_BEFORE_JOIN = ("locustfile",)
# Nonces offered to one worker id and not yet used: a few, so that asks under its id from someone
# else cannot push out the one the real worker is about to prove.
_OFFERED = 8
# A worker proves the token within milliseconds of asking to join; one that has not by then is said.
_PROOF_DUE_S = 1.0


class JoinGate:
    """Wraps a MasterRunner's ``handle_message``: holds back joins until proved, drops the rest."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.token = master_token()
        self.proved: set[str] = set()
        self.held: dict[str, Message] = {}  # a process's client_ready, until its proof comes
        self.offered: dict[str, list[str]] = {}  # worker id -> nonces given, not yet proved
        self.bound: dict[str, str] = {}  # worker id -> the nonce of its proved join
        self._said: set[tuple[str, str]] = set()
        self._handle = runner.handle_message
        runner.handle_message = self.handle
        runner.register_message(MSG_JOIN, self.on_join)
        runner.register_message(MSG_JOIN_ASK, self.on_ask)
        runner.environment.events.quitting.add_listener(self._say_held)  # (one that came late in the run)

    def _say_held(self, **_: Any) -> None:
        for node in list(self.held):
            self._still_held(node)

    def nonce_of(self, node: str) -> str | None:
        """The nonce every proof of worker ``node`` is bound to; None: it has not joined."""
        return self.bound.get(node)

    def on_ask(self, environment: Any, msg: Any, **_: Any) -> None:
        node = msg.node_id
        nonce = new_nonce()
        offered = self.offered.setdefault(node, [])
        offered.append(nonce)
        del offered[:-_OFFERED]
        self.runner.send_message(MSG_NONCE, NonceMsg(nonce).to_wire(), client_id=node)

    def handle(self, client_id: str, msg: Message) -> None:
        node = msg.node_id
        if node in self.proved or msg.type in _BEFORE_JOIN or msg.type in self.runner.custom_messages:
            # (specload's own messages check their sender themselves: a stranger's are counted
            # and refused there, SweepOwner._admitted, and a join is its proof)
            self._handle(client_id, msg)
        elif msg.type == "client_ready":
            self.held[node] = msg
            self.runner.send_message(
                "ack", client_id=client_id, data={"index": self.runner.get_worker_index(client_id)}
            )
            logger.debug(
                "process %s on the master port asked to join; no users until it proves the token", node
            )
        # else: dropped (heartbeats, spawning reports, stats, our own messages of a stranger)

    def _still_held(self, node: str) -> None:
        if node in self.held and node not in self.proved:
            self._say(
                node,
                "asked to join and sent no proof; it gets no users and no tickets until it proves the master token",
            )

    def on_join(self, environment: Any, msg: Any, **_: Any) -> None:
        node = msg.node_id
        try:
            auth = JoinMsg.from_wire(msg.data).auth
        except WireError as e:
            self._say(node, f"sent a join this master cannot read ({e}): it is not taken in")
            return
        nonce = next(
            (n for n in self.offered.get(node, []) if proven(self.token, node, FOR_JOIN, auth, n)), None
        )
        if nonce is None:
            self._say(
                node,
                "sent no valid proof of the master token for a nonce of this master's (a wrong "
                "SPECLOAD_MASTER_TOKEN, or a replay): it is not taken in",
            )
            self.runner.send_message(MSG_JOIN_REFUSED, {}, client_id=node)
            return
        self.offered.pop(node, None)
        self.bound[node] = nonce
        first = node not in self.proved
        self.proved.add(node)
        held = self.held.pop(node, None)
        if held is not None:
            self._handle(node, held)  # Locust's own client_ready: the worker joins now
        elif first:
            logger.debug("%s proved the master token before joining", node)

    def _say(self, node: str, what: str) -> None:
        """Each different refusal of a process once (a wrong token is said even after a bad read)."""
        if (node, what) not in self._said:
            self._said.add((node, what))
            logger.warning("process %s on the master port %s", node, what)
