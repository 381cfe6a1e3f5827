"""The messages between the sweep's owner (local runner or master) and the users of every process.

They travel through Locust's custom messages, which carry plain msgpack data, so each message is
a typed dataclass here with ``to_wire``/``from_wire``: the shape of what crosses a process (or a
machine) boundary is written down in one place, and a renamed field breaks a test, not a sweep.

Each message carries the schema version it was written in (``WIRE_VERSION``): a master and its
workers may run different specload versions (one upgraded, the others not yet), and a message
whose fields this process cannot read must be refused with a word about why, not misread or
turned into a traceback in Locust's message loop. A message without a version is from a
specload before versions, whose messages are version 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from operator import attrgetter
from typing import Any, TypeVar

from specload import __version__
from specload.analysis.clientcheck import ProcessLoad
from specload.client.http import redact_host
from specload.core.records import Phase, RequestRecord
from specload.sweep.levels import Grant, SweepState
from specload.workload.config import Scenario, ScenarioError, scenario_from_dict
from specload.workload.datasets import Item
from specload.workload.prompts import PromptSource

MSG_STATE = "specload_state"  # owner -> users: current level, whether tickets are available, run config
MSG_TICKET_REQ = "specload_ticket_req"  # user -> owner
MSG_TICKET = "specload_ticket"  # owner -> the asking process
MSG_TICKET_RETURN = "specload_ticket_return"  # user -> owner: a late ticket nobody waited for
MSG_RECORD = "specload_record"  # user -> owner: one finished request
MSG_CUT = "specload_cut"  # master -> workers: stop the requests in flight now (each is still recorded)
MSG_JOIN = "specload_join"  # worker -> master: {"auth": the proof of the master token for its id}
LOCAL_NODE = "local"  # the node id of a local run's only process (Locust's LocalRunner messages say so)

# Raised by one with each change to a message's fields that an older reader would misread.
WIRE_VERSION = 1
_V = "v"  # the version's key in every message


class WireError(ValueError):
    """A message this process cannot read: malformed, or written by a newer specload."""


class NewerVersion(WireError):
    """A message in a schema version newer than this specload reads."""

    def __init__(self, version: int) -> None:
        super().__init__(
            f"wire version {version}, newer than this specload ({__version__}) reads ({WIRE_VERSION}); "
            "run the same specload version on the master and every worker"
        )
        self.version = version


def wire_version(d: Any) -> int:
    """The message's schema version (1 when it has none); NewerVersion when it is newer than ours."""
    v = d.get(_V, 1)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise WireError(f"not a wire version: {v!r}")
    if v > WIRE_VERSION:
        raise NewerVersion(v)
    return v


T = TypeVar("T")


def decode(from_wire: Callable[[Any], T], data: Any) -> T:
    """``from_wire(data)``, any failure to read it a WireError (a message from another process,
    maybe another machine, maybe anyone who reached the master port: never trusted to parse)."""
    try:
        return from_wire(data)
    except WireError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise WireError(str(e)) from e


@dataclass(frozen=True, slots=True)
class RunConfig:
    """What every process needs to send the sweep's requests.

    ``send_key``: whether requests carry the API key (``http.key_may_go_to``). The owner decides,
    every process obeys; the key itself never travels: each process reads its own environment.
    """

    scenario: Scenario
    model: str | None
    host: str
    prompts: PromptSource
    insecure: bool = False
    send_key: bool = True

    def to_wire(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.to_dict(),
            "model": self.model,
            # Without any user:password part: every process that joins hears this (specload never
            # sends URL credentials to the server; the API key goes by each process's environment).
            "host": redact_host(self.host),
            "prompts": self.prompts.to_wire(),
            "insecure": self.insecure,
            "send_key": self.send_key,
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> RunConfig:
        """The run config as the owner sent it, its scenario checked again by the field table's
        own checks (a WireError names the field): what each process sends must be a scenario a
        run could have resolved, whoever wrote the message."""
        try:
            sc = scenario_from_dict(dict(d["scenario"]), "the owner's run config")
        except ScenarioError as e:
            raise WireError(str(e)) from None
        # No word from the owner about the key (an older owner) means no key: the safe reading.
        return cls(
            sc,
            d.get("model"),
            d["host"],
            PromptSource.from_wire(d["prompts"]),
            bool(d.get("insecure", False)),
            bool(d.get("send_key", False)),
        )


@dataclass(frozen=True, slots=True)
class StateMsg:
    """The sweep's state, and the run's config with the id it has for this run.

    The config (prompt material included: up to thousands of id ranges) rides along on every
    broadcast so that a worker joining late learns it, but a receiver parses it only when its id
    is new: once per run, not once a second.
    """

    state: SweepState
    config_id: str | None
    config: dict[str, Any] | None  # RunConfig.to_wire(), made once per run by the owner

    def to_wire(self) -> dict[str, Any]:
        return {
            _V: WIRE_VERSION,
            "state": asdict(self.state),
            "config_id": self.config_id,
            "config": self.config,
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> StateMsg:
        wire_version(d)
        st = dict(d["state"])
        if st.get("phase") is not None:
            st["phase"] = Phase(st["phase"])
        return cls(SweepState(**st), d.get("config_id"), d.get("config"))


@dataclass(frozen=True, slots=True)
class TicketRequest:
    uid: str
    auth: str = ""  # the sender's proof that it knows the master token (specload.locust.channel)

    def to_wire(self) -> dict[str, Any]:
        return {_V: WIRE_VERSION, "uid": self.uid, "auth": self.auth}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> TicketRequest:
        wire_version(d)
        return cls(str(d["uid"]), str(d.get("auth") or ""))


_GRANT_FIELDS = tuple(f.name for f in fields(Grant))
_grant_values = attrgetter(*_GRANT_FIELDS)


def _grant_dict(g: Grant) -> dict[str, Any]:
    """``asdict(grant)`` (its fields are all scalars) without asdict's recursive copy: once per request."""
    return dict(zip(_GRANT_FIELDS, _grant_values(g), strict=True))


@dataclass(frozen=True, slots=True)
class TicketReply:
    """A grant (or a refusal), with the request's dataset prompt when the run uses a dataset: the
    owner holds the dataset, so workers need no copy of it."""

    uid: str
    grant: Grant | None
    item: Item | None = None
    # The grant's secret: its record (or its return) must carry it back. The master port takes
    # messages from anyone who reaches it, under any worker id they claim; a ticket's (level,
    # phase, seq) can be guessed, this cannot.
    ticket: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {
            _V: WIRE_VERSION,
            "uid": self.uid,
            "grant": None if self.grant is None else _grant_dict(self.grant),
            "item": None if self.item is None else self.item.to_wire(),
            "ticket": self.ticket,
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> TicketReply:
        wire_version(d)
        g, item = d.get("grant"), d.get("item")
        return cls(
            str(d["uid"]),
            None if g is None else Grant(**g),
            None if item is None else Item.from_wire(item),
            str(d.get("ticket") or ""),
        )


@dataclass(frozen=True, slots=True)
class TicketReturn:
    """A granted ticket that was never used: the level may hand it out again."""

    level: int
    phase: str
    seq: int
    ticket: str = ""
    auth: str = ""  # proof of the master token for this ticket (specload.locust.channel)

    def to_wire(self) -> dict[str, Any]:
        return {_V: WIRE_VERSION, **asdict(self)}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> TicketReturn:
        wire_version(d)
        return cls(
            int(d["level"]),
            str(d["phase"]),
            int(d["seq"]),
            str(d.get("ticket") or ""),
            str(d.get("auth") or ""),
        )


@dataclass(frozen=True, slots=True)
class RecordMsg:
    """One finished request's record, with the secret of the ticket it was sent under."""

    record: dict[str, Any]  # RequestRecord.to_dict() (= asdict): written to records.jsonl as is
    ticket: str
    auth: str = ""  # proof of the master token for this ticket (specload.locust.channel)

    def to_wire(self) -> dict[str, Any]:
        return {_V: WIRE_VERSION, "record": self.record, "ticket": self.ticket, "auth": self.auth}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> RecordMsg:
        wire_version(d)
        return cls(dict(d["record"]), str(d.get("ticket") or ""), str(d.get("auth") or ""))

    @classmethod
    def of(cls, rec: RequestRecord, ticket: str, auth: str = "") -> RecordMsg:
        return cls(rec.to_dict(), ticket, auth)

    def parsed(self) -> RequestRecord:
        return RequestRecord.from_dict(self.record)


MSG_CLOCK_PING = "specload_clock_ping"  # master -> one worker: its clock, please
MSG_CLOCK_PONG = "specload_clock_pong"  # worker -> master: the ping's send time and the worker's clock


@dataclass(frozen=True, slots=True)
class ClockPing:
    sent: float  # the master's clock

    def to_wire(self) -> dict[str, Any]:
        return {_V: WIRE_VERSION, "sent": self.sent}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> ClockPing:
        wire_version(d)
        return cls(float(d["sent"]))


@dataclass(frozen=True, slots=True)
class ClockPong:
    sent: float  # echoed from the ping
    remote: float  # the worker's clock as it answered

    def to_wire(self) -> dict[str, Any]:
        return {_V: WIRE_VERSION, "sent": self.sent, "remote": self.remote}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> ClockPong:
        wire_version(d)
        return cls(float(d["sent"]), float(d["remote"]))


MSG_CLIENT_LOAD = "specload_client_load"  # every process running users -> owner: its own load in a level


@dataclass(frozen=True, slots=True)
class ClientLoadMsg:
    """One process's own load (CPU, event-loop lag) in one level so far; the latest one counts.

    ``run``: the run's id as the process learnt it (``StateMsg.config_id``), so that a report
    from the last run is never counted in the next one's level of the same index."""

    run: str | None
    level: int
    load: ProcessLoad
    streamed: int = 0  # output tokens the process's streams read in the level so far (the live tok/s)

    def to_wire(self) -> dict[str, Any]:
        return {
            _V: WIRE_VERSION,
            "run": self.run,
            "level": self.level,
            "load": self.load.to_json(),
            "streamed": self.streamed,
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> ClientLoadMsg:
        wire_version(d)
        load = ProcessLoad.from_json(d.get("load"))
        if load is None:
            raise ValueError("no load figures")
        run = d.get("run")
        streamed = d.get("streamed", 0)
        if isinstance(streamed, bool) or not isinstance(streamed, int) or streamed < 0:
            raise ValueError(f"streamed: expected a count, got {streamed!r}")
        return cls(None if run is None else str(run), int(d["level"]), load, streamed)
