"""specload's settings as Locust command-line options, and their resolution into a Scenario.

Registering them on Locust's own parser is what makes a plain ``locust -f locustfiles/...`` run
take them, shows them in the web UI's start form (file paths excluded), and forwards them to
workers. Resolution rule: start from ``--scenario`` (or the built-in defaults); every option whose
value differs from its default overrides the matching field.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable
from typing import Any

from specload.config import BACKENDS, REFERENCE_LEVELS, Scenario, apply_overrides, load_scenario

# option dest -> (flag, default, scenario field, converter from option value to field value, help, in web UI)
_OPTIONS: list[tuple[str, str, Any, str, Callable[[Any], Any], str, bool]] = [
    ("scenario", "--scenario", "", "", str, "Scenario TOML file (see scenarios/); flags override its fields", False),
    ("run_dir", "--run-dir", "", "", str, "Exact run directory to write (default: <results-dir>/<label>-<UTC time>)", False),
    ("results_dir", "--results-dir", "results", "", str, "Where new run directories are made", False),
    ("label", "--label", "", "", str, "Run label, first part of the run directory name (default: scenario name)", True),
    ("backend", "--backend", "openai", "backend", str, "Server API: openai (/v1/completions), sglang (/generate), chat (/v1/chat/completions)", True),
    ("model", "--model", "", "model", lambda v: v or None, "Model name to send (default: the first one /v1/models lists)", True),
    ("levels", "--levels", ",".join(map(str, REFERENCE_LEVELS)), "levels", str, "Concurrency levels, comma-separated", True),
    ("requests_per_level", "--requests-per-level", 0, "requests", lambda v: v or None, "Measured requests per level (0: reference rule max(4, 2*C))", True),
    ("level_duration", "--level-duration", 0.0, "duration_s", lambda v: v or None, "Seconds per level instead of a request budget (0: use budgets)", True),
    ("warmup_requests", "--warmup-requests", 0, "warmup_requests", int, "Warmup requests per level, run first and left out of the table", True),
    ("warmup_output_tokens", "--warmup-output-tokens", 0, "warmup_output_tokens", lambda v: v or None, "Output tokens of warmup requests (0: same as --output-tokens)", True),
    ("input_tokens", "--input-tokens", 1000, "input_tokens", int, "Prompt length in tokens", True),
    ("output_tokens", "--output-tokens", 1000, "output_tokens", int, "Output tokens asked for (ignore_eos)", True),
    ("level_pause", "--level-pause", 0.0, "pause_s", float, "Idle seconds between levels", True),
    ("stagger", "--stagger", 0.0, "stagger_s", float, "Spread each level's first requests over this many seconds (0: all at once)", True),
    ("repeat", "--repeat", 1, "repeat", int, "Run every level this many times", True),
    ("seed", "--seed", 0, "seed", int, "Prompt seed", True),
    ("shared_prefix", "--shared-prefix", 0, "shared_prefix_tokens", int, "Tokens shared by every prompt's start (0: all distinct)", True),
    ("read_timeout", "--read-timeout", 600.0, "read_timeout_s", float, "Seconds of silence before a request fails (covers TTFT under queueing)", True),
    ("level_timeout", "--level-timeout", 3600.0, "level_timeout_s", float, "Seconds after which an unfinished level is marked incomplete", True),
    ("metrics_interval", "--metrics-interval", 1.0, "metrics_interval_s", float, "Seconds between samples of the server's /metrics (0: off)", True),
]  # fmt: skip


def add_arguments(parser: Any) -> None:
    """Register the options on Locust's parser (init_command_line_parser event)."""
    for dest, flag, default, _field, _conv, help_text, in_ui in _OPTIONS:
        kwargs: dict[str, Any] = {"dest": dest, "default": default, "help": help_text, "include_in_web_ui": in_ui}
        if dest == "backend":
            kwargs["choices"] = list(BACKENDS)
        elif isinstance(default, bool):
            kwargs["action"] = "store_true"
        elif isinstance(default, int | float):
            kwargs["type"] = type(default)
        parser.add_argument(flag, **kwargs)
    parser.add_argument(
        "--insecure", dest="insecure", action="store_true", default=False,
        help="Do not verify the server's TLS certificate (https:// hosts)", include_in_web_ui=False,
    )  # fmt: skip


def explicit_options(argv: list[str]) -> set[str]:
    """Option dests given on a command line, whatever their value (``--flag v`` or ``--flag=v``)."""
    by_flag = {o[1]: o[0] for o in _OPTIONS}
    return {by_flag[tok.split("=", 1)[0]] for tok in argv if tok.split("=", 1)[0] in by_flag}


def scenario_from_options(
    opts: Namespace, explicit: set[str] | frozenset[str] = frozenset(), launch: dict[str, Any] | None = None
) -> Scenario:
    """The Scenario a Locust run uses: the file (if any), overridden by each option that was set.

    An option counts as set when it was given on the command line (``explicit``, even at its
    default value), differs from its default (config files, environment), or was edited in the
    web UI since launch (differs from ``launch``).
    """
    sc = load_scenario(opts.scenario) if getattr(opts, "scenario", "") else Scenario()
    overrides: dict[str, Any] = {}
    for dest, _flag, default, field_name, conv, _help, _ui in _OPTIONS:
        if not field_name:
            continue
        value = getattr(opts, dest, default)
        if value is None:
            continue
        edited = launch is not None and value != launch.get(dest, default)
        if dest in explicit or value != default or edited:
            overrides[field_name] = conv(value) if value != default else _field_default(field_name, value, conv)
    return apply_overrides(sc, overrides) if overrides else sc


def _field_default(field_name: str, value: Any, conv: Callable[[Any], Any]) -> Any:
    """An option at its default value means the Scenario's default for that field."""
    return getattr(Scenario(), field_name) if conv(value) is None else conv(value)


def launch_values(opts: Namespace) -> dict[str, Any]:
    return {o[0]: getattr(opts, o[0], o[2]) for o in _OPTIONS}


def option_flags(overrides: dict[str, Any]) -> list[str]:
    """Locust command-line flags for the given option dests (used by `specload sweep`)."""
    by_dest = {o[0]: o for o in _OPTIONS}
    out: list[str] = []
    for dest, value in overrides.items():
        flag = by_dest[dest][1]
        if isinstance(value, list):
            value = ",".join(map(str, value))
        out += [flag, str(value)]
    return out


def scenario_flags(sc: Scenario) -> dict[str, Any]:
    """Option values that reproduce a fully resolved Scenario on a Locust command line."""
    by_field = {o[3]: o for o in _OPTIONS if o[3]}
    out: dict[str, Any] = {}
    for field_name, (dest, _flag, default, _f, _conv, _help, _ui) in by_field.items():
        value = getattr(sc, field_name)
        if value is None:
            value = default if not isinstance(default, str) else ""
        if isinstance(value, list):
            value = ",".join(map(str, value))
        out[dest] = value
    return out
