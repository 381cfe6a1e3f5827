"""The experiment file: its arms and the sweep they share, checked before any server starts.

Every mistake is an ``ExperimentError`` that names the file, the arm and the key, so ``specload
experiment`` can exit 2 with one line instead of a traceback. The sweep is checked by the scenario
field table itself (``specload.workload.config``), and written back as a plain scenario file, so the
Locust child of each arm resolves exactly the scenario that was checked here.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

from specload.client.http import check_host
from specload.core.resources import builtin_experiment
from specload.core.rundir import MAX_LABEL
from specload.workload.config import REAL, Scenario, ScenarioError, apply_overrides, load_scenario

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_HEALTH = "/health"
DEFAULT_READY_TIMEOUT_S = 300.0  # a real server loads its weights and captures CUDA graphs first
DEFAULT_URL_READY_TIMEOUT_S = 10.0  # a server someone else started is up already, or it is not
DEFAULT_STOP_GRACE_S = 15.0
HOST = "127.0.0.1"  # where the servers specload starts listen, and where it looks for them

ARM_KEYS = {
    "label": "the arm's name: its run directories' label and its column in the comparison",
    "speculative": "true: the server must show accepted draft tokens before it is swept",
    "command": "the server command line (a list, or a string split like a shell does)",
    "env": "extra environment variables of the server (a table of strings)",
    "health": f"path that answers HTTP 200 once the server is ready (default {DEFAULT_HEALTH})",
    "ready_timeout_s": f"seconds to wait for health (default {DEFAULT_READY_TIMEOUT_S:g}; "
    f"{DEFAULT_URL_READY_TIMEOUT_S:g} with url)",
    "stop_grace_s": f"seconds between SIGTERM and SIGKILL at the stop (default {DEFAULT_STOP_GRACE_S:g})",
    "url": "a server already running (specload neither starts nor stops it), instead of command",
}
TOP_KEYS = {"name", "description", "sweep", "arms"}


class ExperimentError(ValueError):
    """The experiment file is malformed; the message names the file and the key."""


@dataclass(frozen=True)
class Arm:
    label: str
    speculative: bool = False
    command: tuple[str, ...] | None = None  # with the {port}, {host} and {python} placeholders
    env: dict[str, str] = field(default_factory=dict)
    health: str = DEFAULT_HEALTH
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    url: str | None = None

    def argv(self, port: int) -> list[str]:
        """The command line with its placeholders filled in."""
        assert self.command is not None
        return [fill(a, port) for a in self.command]

    def environment(self, port: int) -> dict[str, str]:
        return {k: fill(v, port) for k, v in self.env.items()}

    def base_url(self, port: int | None) -> str:
        return self.url if self.url is not None else f"http://{HOST}:{port}"


def fill(text: str, port: int) -> str:
    return text.replace("{port}", str(port)).replace("{host}", HOST).replace("{python}", sys.executable)


@dataclass(frozen=True)
class Plan:
    path: str
    name: str
    description: str
    arms: tuple[Arm, ...]
    scenario: Scenario  # the shared sweep, checked


def load_plan(path: str) -> Plan:
    """An experiment file, or a built-in one by name (``specload experiment experiment-sim``)."""
    if not os.path.isfile(path) and (builtin := builtin_experiment(path)) is not None:
        path = str(builtin)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ExperimentError(f"{path}: experiment file not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ExperimentError(f"{path}: not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ExperimentError(f"{path}: cannot read the experiment file: {e}") from None
    return plan_from_dict(data, path)


def plan_from_dict(data: dict[str, Any], path: str) -> Plan:
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise ExperimentError(
            f"{path}: unknown key '{unknown[0]}'; an experiment file has {', '.join(sorted(TOP_KEYS))}"
        )
    name = _string(path, "name", data.get("name", os.path.splitext(os.path.basename(path))[0]))
    description = _string(path, "description", data.get("description", ""))
    arms_data = data.get("arms")
    if not isinstance(arms_data, list) or len(arms_data) < 2:
        raise ExperimentError(
            f"{path}: 'arms': expected at least two [[arms]] tables (the first is the baseline), "
            f"got {_count(arms_data)}"
        )
    arms = tuple(_arm(path, i, a) for i, a in enumerate(arms_data))
    seen: set[str] = set()
    for i, arm in enumerate(arms):
        if arm.label in seen:
            raise ExperimentError(f"{path}: arms[{i}]: label {arm.label!r} is used by an earlier arm")
        seen.add(arm.label)
    return Plan(path, name, description, arms, _sweep(path, data.get("sweep", {})))


def _count(value: Any) -> str:
    if isinstance(value, list):
        return f"{len(value)}"
    return "none" if value is None else f"a {type(value).__name__}"


def _string(where: str, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ExperimentError(f"{where}: key '{key}': expected a string, got {value!r}")
    return value


def _arm(path: str, i: int, a: Any) -> Arm:
    where = f"{path}: arms[{i}]"
    if not isinstance(a, dict):
        raise ExperimentError(f"{where}: expected a table, got {a!r}")
    if isinstance(a.get("label"), str):
        where += f" ({a['label']!r})"
    unknown = sorted(set(a) - set(ARM_KEYS))
    if unknown:
        raise ExperimentError(
            f"{where}: unknown key '{unknown[0]}'; an arm has {', '.join(sorted(ARM_KEYS))}"
        )
    if "label" not in a:
        raise ExperimentError(f"{where}: key 'label' is missing")
    label = _string(where, "label", a["label"])
    if not label or label.startswith("-") or len(label) > MAX_LABEL:
        raise ExperimentError(
            f"{where}: key 'label': expected 1..{MAX_LABEL} characters not starting with '-', got {label!r}"
        )
    speculative = a.get("speculative", False)
    if not isinstance(speculative, bool):
        raise ExperimentError(f"{where}: key 'speculative': expected true or false, got {speculative!r}")
    has_command, has_url = "command" in a, "url" in a
    if has_command == has_url:
        raise ExperimentError(
            f"{where}: give either 'command' (a server specload starts) or 'url' (one already running)"
            + (", not both" if has_command else "")
        )
    url = command = None
    if has_url:
        for key in ("env", "stop_grace_s"):
            if key in a:
                raise ExperimentError(
                    f"{where}: key '{key}': only with 'command' (specload does not start a url)"
                )
        try:
            url = check_host(_string(where, "url", a["url"]))
        except ValueError as e:
            raise ExperimentError(f"{where}: key 'url': {e}") from None
    else:
        command = _command(where, a["command"])
    env = a.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ExperimentError(f"{where}: key 'env': expected a table of strings, got {env!r}")
    health = _string(where, "health", a.get("health", DEFAULT_HEALTH))
    if not health.startswith("/"):
        raise ExperimentError(f"{where}: key 'health': expected a path starting with '/', got {health!r}")
    default_ready = DEFAULT_URL_READY_TIMEOUT_S if has_url else DEFAULT_READY_TIMEOUT_S
    return Arm(
        label=label,
        speculative=speculative,
        command=command,
        env=dict(env),
        health=health,
        ready_timeout_s=_seconds(where, "ready_timeout_s", a.get("ready_timeout_s", default_ready)),
        stop_grace_s=_seconds(where, "stop_grace_s", a.get("stop_grace_s", DEFAULT_STOP_GRACE_S)),
        url=url,
    )


def _command(where: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError as e:
            raise ExperimentError(f"{where}: key 'command': cannot split {value!r}: {e}") from None
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        argv = list(value)
    else:
        raise ExperimentError(
            f"{where}: key 'command': expected a list of strings or a string, got {value!r}"
        )
    if not argv or not argv[0]:
        raise ExperimentError(f"{where}: key 'command': the command line is empty")
    if not any("{port}" in v for v in argv):
        raise ExperimentError(
            f"{where}: key 'command': no {{port}} in the command line; specload picks a free port "
            "for each start and needs to tell the server (e.g. --port {port})"
        )
    return tuple(argv)


def _seconds(where: str, key: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ExperimentError(f"{where}: key '{key}': expected a number of seconds > 0, got {value!r}")
    return float(value)


def _sweep(path: str, data: Any) -> Scenario:
    """The [sweep] table: scenario fields, over the file ``scenario`` names (relative to the experiment
    file, or a built-in scenario's name) when it names one."""
    where = f"{path} [sweep]"
    if not isinstance(data, dict):
        raise ExperimentError(f"{path}: key 'sweep': expected a table, got {data!r}")
    fields = dict(data)
    base = Scenario()
    if "scenario" in fields:
        ref = _string(where, "scenario", fields.pop("scenario"))
        near = os.path.join(os.path.dirname(path), ref)
        try:
            base = load_scenario(near if os.path.isfile(near) else ref)
        except ScenarioError as e:
            raise ExperimentError(f"{where}: key 'scenario': {e}") from None
    try:
        sc = apply_overrides(base, fields, source=where)
    except ScenarioError as e:
        raise ExperimentError(str(e)) from None
    return real_text_default(sc)


def real_text_default(sc: Scenario) -> Scenario:
    """An experiment measures speculation, so its prompts are real text unless the file says
    otherwise (``prompts = "random"``, a dataset, or traffic real text cannot size: classes, turns,
    shared prefixes, drawn input lengths). docs/guide.md, "Which prompts"."""
    if sc.prompts is not None or sc.dataset:
        return sc
    try:
        return apply_overrides(sc, {"prompts": REAL}, source="the experiment's default prompts")
    except ScenarioError:
        return sc


def scenario_toml(sc: Scenario) -> str:
    """The scenario as a scenario file (``load_scenario`` reads back the same scenario).

    No TOML writer is among specload's dependencies, and a scenario holds only strings, numbers,
    booleans, lists and tables, which TOML writes inline; a JSON string is a TOML basic string."""
    lines = [f"{key} = {_value(value)}" for key, value in sc.to_dict().items() if value is not None]
    return "\n".join(lines) + "\n"


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return (
            "{"
            + ", ".join(f"{json.dumps(str(k))} = {_value(x)}" for k, x in v.items() if x is not None)
            + "}"
        )
    raise TypeError(f"a scenario value of type {type(v).__name__} cannot be written as TOML")
