"""experiment.json: which arm ran when, where its run went, and what its server was, secrets scrubbed.

It is rewritten (atomically) at every step, so an experiment stopped anywhere, even by SIGKILL, leaves
a document that says how far it got and which run directories it kept.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specload.client.http import api_key, redact_host
from specload.client.introspect import REDACTED, scrub_secrets
from specload.core.rundir import write_json_atomic
from specload.experiment.plan import Arm, Plan

EXPERIMENT_JSON = "experiment.json"
SWEEP_TOML = "sweep.toml"

# What became of one start of an arm (RunEntry.status).
PENDING, STARTING, SWEEPING, COMPLETED = "pending", "starting", "sweeping", "completed"
INCOMPLETE, INTERRUPTED, SERVER_DIED, NOT_READY, REFUSED, UNREACHABLE = (
    "incomplete",
    "interrupted",
    "server-died",
    "not-ready",
    "refused",
    "unreachable",
)


@dataclass
class RunEntry:
    """One start of one arm: its server, its smoke check and its sweep."""

    order: int  # 1, 2, ... in the order the runs were made
    arm: str
    repeat: int  # 1..N
    status: str = PENDING
    message: str | None = None  # why it did not complete
    run_dir: str | None = None
    server_log: str | None = None
    url: str | None = None
    port: int | None = None
    pid: int | None = None  # the server's (its process group's) id
    command: list[str] | None = None  # as started, placeholders filled in, secrets scrubbed
    started_at: float | None = None  # wall clock, the server's start
    sweep_started_at: float | None = None
    ended_at: float | None = None
    health_s: float | None = None  # seconds until the health path answered
    smoke: dict[str, Any] | None = None  # smoke.SmokeResult.to_json()
    server_config: dict[str, Any] | None = None  # introspect.server_config, scrubbed
    sweep_exit: int | None = None


def known_secrets(arm: Arm) -> list[str]:
    """Values never to be written: the API key in use, the arm's secret-looking environment values and
    the values of its command's secret flags (``--api-key K``: a server may print its arguments)."""
    named = scrub_secrets(arm.env)
    values = [v for k, v in arm.env.items() if named.get(k) == REDACTED and v]
    if arm.command is not None:
        shown = scrub_argv(arm.command)
        values += [
            a.partition("=")[2] if "=" in s else a for a, s in zip(arm.command, shown, strict=True) if a != s
        ]
    key = api_key()
    return [v for v in dict.fromkeys([*values, *([key] if key else [])]) if v]


def hide(text: str, secrets: Iterable[str]) -> str:
    """``text`` without any of ``secrets``, nor the API key in use."""
    key = api_key()
    for s in [*secrets, *([key] if key else [])]:
        text = scrub_secrets(text, s)
    return text


def scrub(value: Any, secrets: Iterable[str] = ()) -> Any:
    """``value`` (a server's config) with its secret-looking fields, ``secrets`` and the API key in use
    replaced, at any depth."""
    key = api_key()
    value = scrub_secrets(value, key)
    for s in secrets:
        value = scrub_secrets(value, s)
    return value


def _secret_flag(name: str) -> bool:
    """--api-key, --admin-token, ...: a flag whose value is a secret (by introspect's rule for names)."""
    key = name.lstrip("-").replace("-", "_")
    return bool(key) and scrub_secrets({key: "x"})[key] == REDACTED


def scrub_argv(argv: Sequence[str], secrets: Iterable[str] = ()) -> list[str]:
    """The command line as it may be written: the value of a secret flag (``--api-key K``,
    ``--api-key=K``) and every known secret value replaced."""
    secrets = list(secrets)
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-"):
            name, eq, _value = arg.partition("=")
            if _secret_flag(name):
                if eq:
                    arg = f"{name}={REDACTED}"
                else:
                    hide_next = True
        out.append(hide(arg, secrets))
    return out


def scrub_env(env: dict[str, str], secrets: Iterable[str] = ()) -> dict[str, str]:
    secrets = list(secrets)
    named = scrub_secrets(env)
    return {k: v if v == REDACTED else hide(v, secrets) for k, v in named.items()}


def arm_json(arm: Arm, entries: Sequence[RunEntry]) -> dict[str, Any]:
    secrets = known_secrets(arm)
    mine = [e for e in entries if e.arm == arm.label]
    configs = [e.server_config for e in mine if e.server_config is not None]
    return {
        "label": arm.label,
        "speculative": arm.speculative,
        "command": None if arm.command is None else scrub_argv(arm.command, secrets),
        "env": scrub_env(arm.env, secrets),
        "url": None if arm.url is None else redact_host(arm.url),
        "health": arm.health,
        "ready_timeout_s": arm.ready_timeout_s,
        "stop_grace_s": arm.stop_grace_s,
        "runs": [e.run_dir for e in mine if e.run_dir is not None],
        "orders": [e.order for e in mine],
        "server_config": configs[-1] if configs else None,
    }


@dataclass
class Experiment:
    """The whole document, kept in memory and written after every change."""

    plan: Plan
    directory: Path
    repeat: int
    overrides: dict[str, Any]
    entries: list[RunEntry] = field(default_factory=list)
    status: str = "running"  # running | completed | failed | interrupted
    message: str | None = None
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    comparison: dict[str, Any] | None = None

    @property
    def path(self) -> Path:
        return self.directory / EXPERIMENT_JSON

    def to_json(self) -> dict[str, Any]:
        return {
            "experiment_file": str(Path(self.plan.path).resolve()),
            "name": self.plan.name,
            "description": self.plan.description,
            "directory": str(self.directory),
            "sweep_scenario": str(self.directory / SWEEP_TOML),
            "sweep_overrides": self.overrides,
            "repeat": self.repeat,
            "status": self.status,
            "message": self.message,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "baseline": self.plan.arms[0].label,
            "arms": [arm_json(a, self.entries) for a in self.plan.arms],
            "order": [f"{e.arm}#{e.repeat}" for e in self.entries],
            "runs": [asdict(e) for e in self.entries],
            "comparison": self.comparison,
        }

    def save(self) -> None:
        """experiment.json as it stands. A disk that cannot take it (full, read-only) is said once on
        stderr, and the experiment goes on: its servers are still stopped, its runs kept, and the
        next save tries again (review 3a7af2e, L6: ENOSPC escaped as tracebacks)."""
        try:
            write_json_atomic(str(self.path), self.to_json())
        except OSError as e:
            if not getattr(self, "_unsaved", False):
                self._unsaved = True
                print(
                    f"specload: cannot write {self.path} ({e.strerror or e}); the experiment goes on",
                    file=sys.stderr,
                )
            return
        self._unsaved = False
