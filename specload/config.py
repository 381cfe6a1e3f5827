"""Sweep definitions: the Scenario dataclass, TOML loading and validation, flag overrides.

A scenario is the whole description of a sweep. It comes from a TOML file in ``scenarios/``
(read with the standard library), and command-line flags override single fields. Every field is
checked here, before any traffic is sent, with an error naming the file, the field and the
expected form: a typo in a 20-minute sweep must fail in the first second, not the last.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, field, fields
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

BACKENDS = ("openai", "sglang", "chat")
REFERENCE_LEVELS = [1, 4, 16, 32, 64, 128]


class ScenarioError(ValueError):
    """A scenario field (from a file or a flag) is unusable; the message says where and why."""


@dataclass
class Scenario:
    name: str = "default"
    description: str = ""
    backend: str = "openai"
    model: str | None = None  # None: discovered from /v1/models
    input_tokens: int = 1000
    output_tokens: int = 1000
    levels: list[int] = field(default_factory=lambda: list(REFERENCE_LEVELS))
    # Per-level request budget: `requests` fixed, else max(min_requests, ceil(requests_per_user * C)).
    # The defaults give the reference rule: 4 at C=1, otherwise 2 per concurrent slot.
    requests: int | None = None
    requests_per_user: float = 2.0
    min_requests: int = 4
    duration_s: float | None = None  # time-boxed levels instead of request budgets
    warmup_requests: int = 0  # per level, run before the measured requests, excluded from the table
    warmup_output_tokens: int | None = None  # None: same as output_tokens
    pause_s: float = 0.0  # idle time between levels
    stagger_s: float = 0.0  # 0: a level's users start together (as in the reference); >0: spread over this
    repeat: int = 1  # run every level this many times
    seed: int = 0
    token_id_min: int = 1000
    token_id_max: int = 30000  # exclusive
    shared_prefix_tokens: int = 0  # 0: every prompt is distinct, so no prefix cache can serve it
    temperature: float = 0.0
    read_timeout_s: float = 600.0  # per socket read: longest silence tolerated (TTFT under queueing)
    connect_timeout_s: float = 10.0
    level_timeout_s: float = 3600.0  # a level still unfinished after this is marked incomplete
    metrics_interval_s: float = 1.0  # sampling period of the server's /metrics (0: do not sample)
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into every request body

    def budget(self, concurrency: int) -> int | None:
        """Measured requests for a level; None for time-boxed levels."""
        if self.duration_s is not None:
            return None
        if self.requests is not None:
            return self.requests
        return max(self.min_requests, math.ceil(self.requests_per_user * concurrency))

    @property
    def warmup_tokens(self) -> int:
        return self.output_tokens if self.warmup_output_tokens is None else self.warmup_output_tokens

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_FIELD_TYPES: dict[str, str] = {f.name: str(f.type) for f in fields(Scenario)}


def _expect(source: str, name: str, expected: str, value: Any) -> ScenarioError:
    return ScenarioError(f"{source}: field '{name}': expected {expected}, got {value!r}")


def _positive_int(source: str, name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _expect(source, name, f"an integer >= {minimum}", value)
    return value


def _number(source: str, name: str, value: Any, minimum: float = 0.0, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise _expect(source, name, "a number", value)
    if value < minimum or (strict and value == minimum):
        raise _expect(source, name, f"a number {'>' if strict else '>='} {minimum}", value)
    return float(value)


def parse_levels(source: str, value: Any) -> list[int]:
    """Levels from a TOML list or a flag string "1,4,16"."""
    items = value
    if isinstance(value, str):
        try:
            items = [int(x) for x in value.replace(" ", "").split(",") if x]
        except ValueError:
            raise _expect(source, "levels", "a comma-separated list of positive integers", value) from None
    if not isinstance(items, list) or not items:
        raise _expect(source, "levels", "a non-empty list of positive integers", value)
    for x in items:
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise _expect(source, "levels", "a non-empty list of positive integers", value)
    return list(items)


def _check_field(source: str, name: str, value: Any) -> Any:
    """Validate one field's value and return it in canonical form."""
    if name == "levels":
        return parse_levels(source, value)
    if name == "backend":
        if value not in BACKENDS:
            raise _expect(source, name, f"one of {', '.join(BACKENDS)}", value)
        return value
    if name in ("name", "description"):
        if not isinstance(value, str):
            raise _expect(source, name, "a string", value)
        return value
    if name == "model":
        if value is not None and (not isinstance(value, str) or not value):
            raise _expect(source, name, "a non-empty string", value)
        return value
    if name in ("input_tokens", "output_tokens", "repeat", "min_requests", "token_id_max"):
        return _positive_int(source, name, value)
    if name in ("requests", "warmup_output_tokens"):
        return None if value is None else _positive_int(source, name, value)
    if name in ("warmup_requests", "seed", "token_id_min", "shared_prefix_tokens"):
        return _positive_int(source, name, value, minimum=0)
    if name in ("requests_per_user",):
        return _number(source, name, value, strict=True)
    if name in ("read_timeout_s", "connect_timeout_s", "level_timeout_s"):
        return _number(source, name, value, strict=True)
    if name == "duration_s":
        return None if value is None else _number(source, name, value, strict=True)
    if name in ("pause_s", "stagger_s", "temperature", "metrics_interval_s"):
        return _number(source, name, value)
    if name == "extra_body":
        if not isinstance(value, dict):
            raise _expect(source, name, "a table of request-body fields", value)
        return value
    raise ScenarioError(f"{source}: unknown field '{name}'; known fields: {', '.join(sorted(_FIELD_TYPES))}")


def _check_whole(source: str, sc: Scenario) -> Scenario:
    if sc.token_id_min >= sc.token_id_max:
        raise ScenarioError(
            f"{source}: fields 'token_id_min'/'token_id_max': expected min < max, "
            f"got {sc.token_id_min} >= {sc.token_id_max}"
        )
    if sc.shared_prefix_tokens >= sc.input_tokens:
        raise ScenarioError(
            f"{source}: field 'shared_prefix_tokens': expected fewer than input_tokens "
            f"({sc.input_tokens}), got {sc.shared_prefix_tokens}"
        )
    return sc


def scenario_from_dict(data: dict[str, Any], source: str = "<scenario>") -> Scenario:
    sc = Scenario()
    for name, value in data.items():
        setattr(sc, name, _check_field(source, name, value))
    return _check_whole(source, sc)


def load_scenario(path: str) -> Scenario:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ScenarioError(f"{path}: scenario file not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{path}: not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError(f"{path}: cannot read scenario file: {e}") from None
    # A [scenario] table is accepted as well as top-level keys.
    if set(data) == {"scenario"} and isinstance(data["scenario"], dict):
        data = data["scenario"]
    return scenario_from_dict(data, source=path)


def apply_overrides(sc: Scenario, overrides: dict[str, Any], source: str = "command line") -> Scenario:
    """Return a copy of ``sc`` with the given fields replaced (already-typed values or flag strings)."""
    data = sc.to_dict()
    for name, value in overrides.items():
        data[name] = _check_field(source, name, value)
    out = Scenario(**data)
    return _check_whole(source, out)
