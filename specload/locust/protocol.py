"""The messages between the sweep's owner (local runner or master) and the users of every process.

They travel through Locust's custom messages, which carry plain msgpack data, so each message is a
msgspec Struct here: ``to_wire`` gives its builtins, ``from_wire`` converts them back and validates
every field against its type (dataclasses inside, such as ``Grant`` or ``Scenario``, included). The
shape of what crosses a process (or a machine) boundary is written down in one place, and a message
that does not fit it is a ``WireError`` naming the message and the field, not a crash in Locust's
message loop or a misread deeper in.

Each message carries the schema version it was written in (``WIRE_VERSION``). The master and its
workers must run the same specload version: a message of another version is refused with a word
about why. A message without a version is from a specload before versions, whose messages are
version 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import msgspec

from specload import __version__
from specload.analysis.clientcheck import ProcessLoad
from specload.client.http import redact_host
from specload.core.records import RequestRecord
from specload.sweep.levels import Grant, SweepState
from specload.workload.config import Scenario, ScenarioError, scenario_from_dict
from specload.workload.datasets import Item
from specload.workload.prompts import PromptSource
from specload.workload.traces import TraceRequest

MSG_STATE = "specload_state"  # owner -> users: current level, whether tickets are available, run config
MSG_TICKET_REQ = "specload_ticket_req"  # user -> owner
MSG_TICKET = "specload_ticket"  # owner -> the asking process
MSG_TICKET_RETURN = "specload_ticket_return"  # user -> owner: a late ticket nobody waited for
MSG_RECORD = "specload_record"  # user -> owner: one finished request
MSG_CUT = "specload_cut"  # master -> workers: stop the requests in flight now (each is still recorded)
MSG_JOIN = "specload_join"  # worker -> master: JoinMsg
MSG_JOIN_ASK = "specload_join_ask"  # worker -> master: a nonce for my join, please (JoinAsk)
MSG_NONCE = "specload_nonce"  # master -> the asking worker: NonceMsg, what its proofs are bound to
MSG_JOIN_REFUSED = "specload_join_refused"  # master -> a worker whose join proof failed
LOCAL_NODE = "local"  # the node id of a local run's only process (Locust's LocalRunner messages say so)

# Raised by one with each change to a message's fields that an older reader would misread (2: the
# messages became Structs, and the prompt pool travels as {"ranges": ...}; 3: proofs are bound to
# the master's nonce for the join).
WIRE_VERSION = 3
_V = "v"  # the version's key in every message


class WireError(ValueError):
    """A message this process cannot read: malformed, or written by another specload version."""


class OtherVersion(WireError):
    """A message in a schema version this specload does not read."""

    def __init__(self, version: int) -> None:
        super().__init__(
            f"wire version {version}, but this specload ({__version__}) reads version {WIRE_VERSION}; "
            "run the same specload version on the master and every worker"
        )
        self.version = version


def wire_version(d: Any) -> int:
    """The message's schema version (1 when it has none); OtherVersion unless it is ours."""
    v = d.get(_V, 1)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise WireError(f"not a wire version: {v!r}")
    if v != WIRE_VERSION:
        raise OtherVersion(v)
    return v


T = TypeVar("T")
M = TypeVar("M", bound="Message")


def decode(from_wire: Callable[[Any], T], data: Any) -> T:
    """``from_wire(data)``, any failure to read it a WireError (a message from another process,
    maybe another machine, maybe anyone who reached the master port: never trusted to parse)."""
    try:
        return from_wire(data)
    except WireError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise WireError(str(e)) from e


def _convert(cls: type[T], data: Any) -> T:
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as e:
        raise WireError(f"{cls.__name__}: {e}") from None


class Message(msgspec.Struct, frozen=True):
    """A message with its schema version: ``to_wire`` for ``send_message``, ``from_wire`` on receipt."""

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.to_builtins(self)
        out[_V] = WIRE_VERSION
        return out

    @classmethod
    def from_wire(cls: type[M], data: Any) -> M:
        if not isinstance(data, dict):
            raise WireError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
        wire_version(data)
        return _convert(cls, data)


class RunConfig(msgspec.Struct, frozen=True):
    """What every process needs to send the sweep's requests (it rides in ``StateMsg.config``).

    ``send_key``: whether requests carry the API key (``http.key_may_go_to``). The owner decides,
    every process obeys; the key itself never travels: each process reads its own environment.
    """

    scenario: Scenario
    model: str | None
    host: str
    prompts: PromptSource
    insecure: bool = False
    # No word from the owner about the key means no key: the safe reading.
    send_key: bool = False

    def to_wire(self) -> dict[str, Any]:
        # The host without any user:password part: every process that joins hears this (specload never
        # sends URL credentials to the server; the API key goes by each process's environment).
        out: dict[str, Any] = msgspec.to_builtins(msgspec.structs.replace(self, host=redact_host(self.host)))
        return out

    @classmethod
    def from_wire(cls, d: Any) -> RunConfig:
        """The run config as the owner sent it, its scenario checked again by the field table's
        own checks (a WireError names the field): what each process sends must be a scenario a
        run could have resolved, whoever wrote the message."""
        if not isinstance(d, dict) or not isinstance(d.get("scenario"), dict):
            raise WireError("the owner's run config: expected an object with a scenario object")
        try:
            sc = scenario_from_dict(dict(d["scenario"]), "the owner's run config")
        except ScenarioError as e:
            raise WireError(str(e)) from None
        return msgspec.structs.replace(_convert(cls, {**d, "scenario": {}}), scenario=sc)


class StateMsg(Message, frozen=True):
    """The sweep's state, and the run's config with the id it has for this run.

    The config (prompt material included: up to thousands of id ranges) rides along on every
    broadcast so that a worker joining late learns it, but a receiver parses it only when its id
    is new: once per run, not once a second.
    """

    state: SweepState
    config_id: str | None
    config: dict[str, Any] | None  # RunConfig.to_wire(), made once per run by the owner


class JoinAsk(Message, frozen=True):
    """A worker's request for a join nonce (nothing secret: anyone may ask, only the token answers)."""


class NonceMsg(Message, frozen=True):
    """The master's nonce for one worker's join: its join proof and every later proof are bound to it."""

    nonce: str


class JoinMsg(Message, frozen=True):
    """A worker's proof of the master token for its own id and the master's nonce, sent before it
    is given users."""

    auth: str


class TicketRequest(Message, frozen=True):
    uid: str
    auth: str = ""  # the sender's proof that it knows the master token (specload.locust.channel)


class TicketReply(Message, frozen=True):
    """A grant (or a refusal), with the request's dataset prompt when the run uses a dataset: the
    owner holds the dataset, so workers need no copy of it."""

    uid: str
    grant: Grant | None
    item: Item | None = None
    # The grant's secret: its record (or its return) must carry it back. The master port takes
    # messages from anyone who reaches it, under any worker id they claim; a ticket's (level,
    # phase, seq) can be guessed, this cannot.
    ticket: str = ""
    # A trace replay's request for this ticket (its row, lengths and prefix blocks): the owner holds
    # the trace, so workers need no copy of it.
    trace: TraceRequest | None = None
    trace_prompt: list[int] | None = None  # its real-text prompt, made by the owner (--prompts real)

    def __post_init__(self) -> None:
        if self.item is not None and len(self.item.turns) != len(self.item.turn_tokens):
            raise ValueError("an item's turn_tokens must match its turns")


class TicketReturn(Message, frozen=True):
    """A granted ticket that was never used: the level may hand it out again."""

    level: int
    phase: str
    seq: int
    ticket: str = ""
    auth: str = ""  # proof of the master token for this ticket (specload.locust.channel)


class RecordMsg(Message, frozen=True):
    """One finished request's record, with the secret of the ticket it was sent under.

    The record stays a dict (``RequestRecord.to_dict``, written to records.jsonl as is): records
    have their own versioned format, read by ``parsed``."""

    record: dict[str, Any]
    ticket: str
    auth: str = ""  # proof of the master token for this ticket (specload.locust.channel)

    @classmethod
    def of(cls, rec: RequestRecord, ticket: str, auth: str = "") -> RecordMsg:
        return cls(rec.to_dict(), ticket, auth)

    def parsed(self) -> RequestRecord:
        return RequestRecord.from_dict(self.record)


MSG_CLOCK_PING = "specload_clock_ping"  # master -> one worker: its clock, please
MSG_CLOCK_PONG = "specload_clock_pong"  # worker -> master: the ping's send time and the worker's clock


class ClockPing(Message, frozen=True):
    sent: float  # the master's clock


class ClockPong(Message, frozen=True):
    sent: float  # echoed from the ping
    remote: float  # the worker's clock as it answered


MSG_CLIENT_LOAD = "specload_client_load"  # every process running users -> owner: its own load in a level


class ClientLoadMsg(Message, frozen=True):
    """One process's own load (CPU, event-loop lag) in one level so far; the latest one counts.

    ``run``: the run's id as the process learnt it (``StateMsg.config_id``), so that a report
    from the last run is never counted in the next one's level of the same index."""

    run: str | None
    level: int
    load: ProcessLoad
    # Output tokens the process's streams read in the level so far (the live tok/s).
    streamed: Annotated[int, msgspec.Meta(ge=0)] = 0
