"""A master takes a worker in (users, tickets, run config) only once it has proved the master token.

Locust's master makes a worker of any process that sends ``client_ready`` to its port: it hands
it users at once (a joined attacker took two of a level's four users, review ab9c161), counts its
claimed users towards the level's ramp, and broadcasts it every state message. So a master holds a
``client_ready`` back until the same process sends ``MSG_JOIN`` with the proof of the token for its
id (``channel.proof(token, id, FOR_JOIN)``), which a specload worker does as its Locust init runs;
only then does Locust see the ``client_ready``. Meanwhile the process gets the ``ack`` it waits for
(its init goes on, so it can send the proof) and nothing else: every other Locust message from it
is dropped (heartbeats, claimed users, statistics), and, not being a worker of the master's,
its specload messages are refused and counted (``SweepOwner._admitted``).
"""

from __future__ import annotations

import logging
from typing import Any

from locust.rpc import Message

from specload.locust.channel import FOR_JOIN, master_token, proven
from specload.locust.protocol import MSG_JOIN, JoinMsg, WireError

logger = logging.getLogger("specload")

# Locust messages a process that has not proved the token may still send: the join itself (held
# back), and the request for the locustfile (``-f -``), which is no secret and comes before the join.
_BEFORE_JOIN = ("locustfile",)


class JoinGate:
    """Wraps a MasterRunner's ``handle_message``: holds back joins until proved, drops the rest."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.token = master_token()
        self.proved: set[str] = set()
        self.held: dict[str, Message] = {}  # a process's client_ready, until its proof comes
        self._said: set[str] = set()
        self._handle = runner.handle_message
        runner.handle_message = self.handle
        runner.register_message(MSG_JOIN, self.on_join)

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
            self._say(node, "asked to join; it gets no users and no tickets until it proves the master token")
        # else: dropped (heartbeats, spawning reports, stats, our own messages of a stranger)

    def on_join(self, environment: Any, msg: Any, **_: Any) -> None:
        node = msg.node_id
        try:
            auth = JoinMsg.from_wire(msg.data).auth
        except WireError as e:
            self._say(node, f"sent a join this master cannot read ({e}): it is not taken in")
            return
        if not proven(self.token, node, FOR_JOIN, auth):
            self._say(node, "sent no valid proof of the master token: it is not taken in")
            return
        first = node not in self.proved
        self.proved.add(node)
        held = self.held.pop(node, None)
        if held is not None:
            self._handle(node, held)  # Locust's own client_ready: the worker joins now
        elif first:
            logger.debug("%s proved the master token before joining", node)

    def _say(self, node: str, what: str) -> None:
        if node not in self._said:
            self._said.add(node)
            logger.warning("process %s on the master port %s", node, what)
