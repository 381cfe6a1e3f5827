"""specload's settings as Locust command-line options, and their resolution into a Scenario.

Registering them on Locust's own parser is what makes a plain ``locust -f locustfiles/...`` run
take them, shows them in the web UI's start form (file paths excluded), and forwards them to
workers. The scenario's options are made from the field table in ``specload.workload.config``; only the
run's own options (files, label, TLS, where the API key may go, which pages may drive the web UI)
are declared here. Resolution rule: start from
``--scenario`` (or the built-in defaults); every option whose value differs from its default, or
was given on the command line, or was edited in the web UI, overrides the matching field.
"""

from __future__ import annotations

import argparse
from argparse import Namespace
from collections.abc import Mapping, Sequence
from typing import Any

from specload.client.http import check_host
from specload.core.rundir import MAX_LABEL
from specload.workload.config import (
    FLAG_FIELDS,
    FieldSpec,
    Scenario,
    ScenarioError,
    apply_overrides,
    load_scenario,
)

# The run's own options: (dest, flag, default, help, in web UI).
RUN_OPTIONS: list[tuple[str, str, Any, str, bool]] = [
    ("scenario", "--scenario", "", "Scenario TOML file (see scenarios/); flags override its fields", False),
    (
        "run_dir",
        "--run-dir",
        "",
        "Exact run directory to write (default: <results-dir>/<label>-<UTC time>)",
        False,
    ),
    ("results_dir", "--results-dir", "results", "Where new run directories are made", False),
    (
        "label",
        "--label",
        "",
        "Run label, first part of the run directory name (default: scenario name)",
        True,
    ),
    (
        "capacity_search",
        "--capacity-search",
        "",
        "Search the highest load meeting --slo instead of sweeping "
        "--levels (KIND:START:MIN:MAX:TOLERANCE:PROBES, as `specload capacity` passes it)",
        False,
    ),
]

SEND_KEY_FLAG, SEND_KEY_DEST = "--send-key-to-new-host", "send_key_to_new_host"
LAUNCH_HOST = "host"  # launch_values' key for the host given at launch (the API key's own host)

_BY_DEST: dict[str, FieldSpec] = {s.dest: s for s in FLAG_FIELDS}


# The start forms' order (Locust's lists its options in the order they were registered, once the page
# keeps that order): what the sweep is first (levels, prompt and output length, request rates instead of
# levels, how much per level), then the run's label, then the rest as the field table has them.
FORM_FIRST = (
    "levels",
    "input_tokens",
    "output_tokens",
    "rates",
    "requests_per_level",
    "level_duration",
    "warmup_requests",
    "repeat",
    "backend",
    "model",
)
LABEL_DEST = "label"


# Where the parse leaves the dests of the options it was given (``explicit_from``): a list, so that
# Locust can ship the parsed options to its workers as it does (msgpack).
EXPLICIT_DEST = "specload_explicit"


class _Given(argparse._StoreAction):
    """Stores the value like argparse's own "store", and notes that the option was given: an option
    set to its default value must still override the scenario file's value for it."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        super().__call__(parser, namespace, values, option_string)
        given: list[str] = list(getattr(namespace, EXPLICIT_DEST, None) or [])
        if self.dest not in given:
            setattr(namespace, EXPLICIT_DEST, [*given, self.dest])


def explicit_from(opts: Namespace | None) -> set[str]:
    """The option dests the parse of ``opts`` was given (on the command line, or in a Locust config
    file or LOCUST_* variable, which Locust's parser reads as command-line words)."""
    return set(getattr(opts, EXPLICIT_DEST, None) or ()) if opts is not None else set()


def form_order() -> list[str]:
    """Every option dest the start form shows, in order (the run's label among them)."""
    rest = [s.dest for s in FLAG_FIELDS if s.web and s.dest not in FORM_FIRST]
    return [*FORM_FIRST, LABEL_DEST, *rest]


def add_arguments(parser: Any) -> None:
    """Register the options on Locust's parser (init_command_line_parser event), the web form's in
    its order."""
    for dest, flag, default, help_text, in_ui in RUN_OPTIONS:
        if dest != LABEL_DEST:
            parser.add_argument(
                flag, dest=dest, default=default, help=help_text, include_in_web_ui=in_ui, action=_Given
            )
    by_dest = {o[0]: o for o in RUN_OPTIONS}
    for dest in form_order():
        if dest == LABEL_DEST:
            _dest, flag, default, help_text, in_ui = by_dest[LABEL_DEST]
            parser.add_argument(
                flag, dest=dest, default=default, help=help_text, include_in_web_ui=in_ui, action=_Given
            )
        else:
            _add_field(parser, _BY_DEST[dest])
    for spec in FLAG_FIELDS:
        if not spec.web:
            _add_field(parser, spec)
    _add_run_flags(parser)


def _add_field(parser: Any, spec: FieldSpec) -> None:
    kwargs: dict[str, Any] = {
        "action": _Given,
        "dest": spec.dest,
        "default": spec.option_default,
        "help": spec.help,
        "include_in_web_ui": spec.web,
    }
    if spec.choices:
        kwargs["choices"] = list(spec.choices)
    elif spec.option_type is not str:
        kwargs["type"] = spec.option_type
    parser.add_argument(spec.flag, **kwargs)


def _add_run_flags(parser: Any) -> None:
    parser.add_argument(
        "--insecure",
        dest="insecure",
        action="store_true",
        default=False,
        help="Do not verify the server's TLS certificate (https:// hosts)",
        include_in_web_ui=False,
    )
    # A checkbox in the web UI's start form (Locust shows a boolean option so): the user's own
    # confirmation, per run, that the host typed in the form may receive the API key.
    parser.add_argument(
        SEND_KEY_FLAG,
        dest=SEND_KEY_DEST,
        action="store_true",
        default=False,
        include_in_web_ui=True,
        help="Send the API key (SPECLOAD_API_KEY / OPENAI_API_KEY) even to a host other than the one given "
        "at launch (--host). Off: a run against another host goes without the key",
    )
    parser.add_argument(
        "--web-allowed-origins",
        dest="web_allowed_origins",
        default="",
        include_in_web_ui=False,
        help="Comma-separated origins (https://name[:port]) besides the web UI's own address whose pages "
        "may start or stop runs, e.g. a reverse proxy's public address",
    )


def scenario_from_options(
    opts: Namespace,
    explicit: set[str] | frozenset[str] = frozenset(),
    launch: dict[str, Any] | None = None,
    source: str = "command line",
) -> Scenario:
    """The Scenario a Locust run uses: the file (if any), overridden by each option that was set.

    An option counts as set when it was given on the command line (``explicit``, even at its
    default value), differs from its default (config files, environment), or was edited in the
    web UI since launch (differs from ``launch``).
    """
    sc = load_scenario(opts.scenario) if getattr(opts, "scenario", "") else Scenario()
    overrides: dict[str, Any] = {}
    for spec in FLAG_FIELDS:
        default = spec.option_default
        value = getattr(opts, spec.dest, default)
        if value is None:
            continue
        edited = launch is not None and value != launch.get(spec.dest, default)
        if spec.dest in explicit or value != default or edited:
            overrides[spec.name] = spec.from_option(value) if value != default else spec.default
    return apply_overrides(sc, overrides, source) if overrides else sc


def launch_values(opts: Namespace) -> dict[str, Any]:
    """Every scenario option's value at launch, to tell a later web-UI edit from an untouched field,
    and the host (``LAUNCH_HOST``): the web form may change the host, not where the key may go."""
    values: dict[str, Any] = {s.dest: getattr(opts, s.dest, s.option_default) for s in FLAG_FIELDS}
    values[LAUNCH_HOST] = getattr(opts, "host", None) or None
    return values


def option_flags(values: dict[str, Any]) -> list[str]:
    """Locust command-line flags for the given option dests (used by `specload ui`)."""
    out: list[str] = []
    for dest, value in values.items():
        flag = _BY_DEST[dest].flag
        assert flag is not None
        out += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return out


def scenario_flags(sc: Scenario) -> dict[str, Any]:
    """Option values that reproduce a fully resolved Scenario on a Locust command line."""
    return {s.dest: s.to_option(getattr(sc, s.name)) for s in FLAG_FIELDS}


# ---------------------------------------------------------------- the web UI's start form

FORM_SOURCE = "start form"  # how an error names where a value came from
_TYPE_WORDS = {int: "an integer", float: "a number"}


def _form_value(current: Any, raw: str) -> Any:
    """The value Locust's ``/swarm`` writes into ``parsed_options`` for a form field: the type of the
    option's current value (bool: "true"), as its own code does. ValueError when that fails (Locust
    would answer with an HTTP 500 and a traceback in its log)."""
    if isinstance(current, bool):
        return raw == "true"
    if current is None or isinstance(current, str):
        return raw
    return type(current)(raw)


def _relabel(message: str) -> str:
    """A scenario field's name in a message, as the start form calls it."""
    for spec in FLAG_FIELDS:
        message = message.replace(f"field '{spec.name}'", f"field '{spec.label}'")
    return message


def check_form(
    form: Mapping[str, str],
    opts: Namespace,
    explicit: set[str] | frozenset[str] = frozenset(),
    launch: dict[str, Any] | None = None,
) -> str | None:
    """What is wrong with a start form submission (Locust's ``/swarm`` fields), naming the form
    field and what it expects; None when a run can start with it. Nothing is changed.

    The checks are the scenario field table's own (``config.FieldSpec``), applied to the values
    Locust would write into ``parsed_options``, then the whole scenario as the run would resolve it
    (``scenario_from_options``), so the form refuses exactly what the run would fail on.
    """
    host = form.get("host")
    if host is not None:
        if not host.strip():
            return f"{FORM_SOURCE}: field 'Host': enter the server's URL, e.g. http://gpu-box:30000"
        try:
            check_host(host)  # as Locust will use it: unstripped
        except ValueError as e:
            return f"{FORM_SOURCE}: field 'Host': {e}"
    label = form.get("label")
    if label is not None and len(label) > MAX_LABEL:
        return f"{FORM_SOURCE}: field 'Label': expected at most {MAX_LABEL} characters, got {len(label)}"
    values = Namespace(**vars(opts))
    for spec in FLAG_FIELDS:
        raw = form.get(spec.dest)
        if raw is None:
            continue
        current = getattr(opts, spec.dest, spec.option_default)
        try:
            value = _form_value(current, raw)
        except ValueError:
            expected = _TYPE_WORDS.get(type(current), "a value")
            return f"{FORM_SOURCE}: field '{spec.label}': expected {expected}, got {raw!r}"
        try:
            field_value = spec.from_option(value) if value != spec.option_default else spec.default
            spec.check(FORM_SOURCE, spec.label, field_value)
        except ScenarioError as e:
            return str(e)
        setattr(values, spec.dest, value)
    try:
        scenario_from_options(values, explicit, launch, FORM_SOURCE)
    except ScenarioError as e:
        return _relabel(str(e))
    return None
