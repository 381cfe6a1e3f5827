"""specload.locust.options: Locust command-line options and their resolution into a Scenario."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from specload.locust.options import (
    EXPLICIT_DEST,
    add_arguments,
    check_form,
    explicit_from,
    launch_values,
    option_flags,
    scenario_flags,
    scenario_from_options,
)
from specload.workload.config import Scenario, ScenarioError, apply_overrides, load_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
SMOKE = str(SCENARIOS / "smoke.toml")


class LocustLikeParser(argparse.ArgumentParser):
    """Takes Locust's extra ``include_in_web_ui`` keyword, and records it."""

    def __init__(self) -> None:
        self.in_ui: dict[str, bool] = {}
        super().__init__(prog="locust", exit_on_error=False)

    def add_argument(self, *args: Any, **kwargs: Any) -> Any:
        in_ui = kwargs.pop("include_in_web_ui", True)
        action = super().add_argument(*args, **kwargs)
        self.in_ui[action.dest] = in_ui
        return action


def parser() -> LocustLikeParser:
    p = LocustLikeParser()
    add_arguments(p)
    return p


def resolve(argv: list[str]) -> Scenario:
    opts = parser().parse_args(argv)
    return scenario_from_options(opts, explicit_from(opts))


def test_no_flags_gives_builtin_defaults() -> None:
    assert resolve([]) == Scenario()


def test_option_defaults_match_scenario_defaults() -> None:
    # A default-valued option must mean "the scenario's own default", or no flags != no scenario.
    opts = parser().parse_args([])
    sc = Scenario()
    assert opts.levels == ",".join(map(str, sc.levels))
    assert opts.backend == sc.backend
    assert opts.input_tokens == sc.input_tokens and opts.output_tokens == sc.output_tokens
    assert opts.read_timeout == sc.read_timeout_s and opts.level_timeout == sc.level_timeout_s
    assert opts.repeat == sc.repeat and opts.seed == sc.seed
    assert opts.level_pause == sc.pause_s and opts.stagger == sc.stagger_s
    assert opts.insecure is False


def test_option_types_and_web_ui_flags() -> None:
    p = parser()
    opts = p.parse_args(["--input-tokens", "64", "--read-timeout", "5", "--level-duration", "2.5"])
    assert opts.input_tokens == 64 and isinstance(opts.input_tokens, int)
    assert opts.read_timeout == 5.0 and isinstance(opts.read_timeout, float)
    assert opts.level_duration == 2.5
    # File paths stay out of the web UI's start form; the sweep's knobs are in it.
    assert p.in_ui["scenario"] is False and p.in_ui["run_dir"] is False and p.in_ui["results_dir"] is False
    assert p.in_ui["insecure"] is False and p.in_ui["web_allowed_origins"] is False
    # The confirmation that the API key may go to a host typed in the form: a checkbox, off.
    assert p.in_ui["send_key_to_new_host"] is True and opts.send_key_to_new_host is False
    assert p.in_ui["levels"] is True and p.in_ui["input_tokens"] is True and p.in_ui["backend"] is True


def test_backend_choices_enforced() -> None:
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parser().parse_args(["--backend", "foo"])
    assert resolve(["--backend", "chat"]).backend == "chat"


def test_flags_override_scenario_file() -> None:
    sc = resolve(
        ["--scenario", SMOKE, "--input-tokens", "64", "--levels", "1,8", "--seed", "3", "--backend", "sglang"]
    )
    assert sc.input_tokens == 64
    assert sc.levels == [1, 8]
    assert sc.seed == 3
    assert sc.backend == "sglang"
    # Untouched fields come from the file.
    assert sc.name == "smoke"
    assert sc.output_tokens == 16
    assert sc.read_timeout_s == 30.0


def test_file_alone_is_loaded_as_is() -> None:
    assert resolve(["--scenario", SMOKE]) == load_scenario(SMOKE)


def test_explicit_default_valued_flags_override_the_file() -> None:
    # A flag given on the command line counts even at its default value.
    sc = resolve(["--scenario", SMOKE, "--read-timeout", "600", "--requests-per-level", "0"])
    assert sc.read_timeout_s == 600.0
    assert sc.requests is None


@pytest.mark.parametrize(
    ("argv", "given"),
    [
        ([], set()),
        (["--levels", "1,2"], {"levels"}),
        (
            ["--input-tokens=512", "--label", "x", "--levels", "1", "--levels", "2"],
            {"input_tokens", "label", "levels"},
        ),
        (
            ["--insecure", "--scenario", SMOKE, "--read-timeout", "600", "--backend", "chat"],
            {"scenario", "read_timeout", "backend"},  # --insecure is no scenario field: not noted
        ),
    ],
)
def test_the_parse_notes_the_options_it_was_given(argv: list[str], given: set[str]) -> None:
    """What a Locust process resolves its runs with: the options its parse was given (not
    sys.argv), noted as a list, which Locust can ship to its workers with the parsed options."""
    opts = parser().parse_args(argv)
    assert explicit_from(opts) == given
    assert isinstance(getattr(opts, EXPLICIT_DEST, []), list)
    assert explicit_from(None) == set()


def test_untouched_defaults_do_not_override_the_file() -> None:
    opts = parser().parse_args(["--scenario", SMOKE])
    assert scenario_from_options(opts, frozenset(), launch_values(opts)) == load_scenario(SMOKE)


def test_web_ui_edit_back_to_the_default_overrides_the_file() -> None:
    # Launched with the file's value shown in the form, then edited in the UI to the option default.
    opts = parser().parse_args(["--scenario", SMOKE, "--input-tokens", "32"])
    launch = launch_values(opts)
    opts.input_tokens = 1000  # what the UI's /swarm writes into parsed_options
    sc = scenario_from_options(opts, frozenset(), launch)
    assert sc.input_tokens == 1000


def test_requests_per_level_zero_means_reference_rule() -> None:
    sc = resolve(["--requests-per-level", "0"])
    assert sc.requests is None
    assert [sc.budget(c) for c in (1, 4, 64)] == [4, 8, 128]
    sc = resolve(["--requests-per-level", "7"])
    assert sc.requests == 7 and sc.budget(64) == 7


def test_level_duration_and_warmup_options() -> None:
    sc = resolve(["--level-duration", "30", "--warmup-requests", "2", "--warmup-output-tokens", "16"])
    assert sc.duration_s == 30.0 and sc.budget(4) is None
    assert sc.warmup_requests == 2 and sc.warmup_tokens == 16
    assert resolve(["--warmup-output-tokens", "0", "--output-tokens", "99"]).warmup_tokens == 99


def test_remaining_options_reach_their_fields() -> None:
    sc = resolve(
        [
            "--model",
            "m1",
            "--output-tokens",
            "50",
            "--level-pause",
            "2",
            "--stagger",
            "0.5",
            "--repeat",
            "3",
            "--shared-prefix",
            "100",
            "--read-timeout",
            "9",
            "--level-timeout",
            "99",
        ]
    )
    assert sc.model == "m1"
    assert sc.output_tokens == 50
    assert (sc.pause_s, sc.stagger_s, sc.repeat) == (2.0, 0.5, 3)
    assert sc.shared_prefix_tokens == 100
    assert (sc.read_timeout_s, sc.level_timeout_s) == (9.0, 99.0)


def test_invalid_flag_value_names_command_line_and_field() -> None:
    with pytest.raises(ScenarioError, match=r"^command line: field 'levels'"):
        resolve(["--levels", "0,4"])
    with pytest.raises(ScenarioError, match=r"^command line: field 'shared_prefix_tokens'"):
        resolve(["--input-tokens", "10", "--shared-prefix", "10"])
    with pytest.raises(ScenarioError, match=r"^command line: field 'input_tokens'"):
        resolve(["--input-tokens", "-3"])


def test_missing_scenario_file_is_a_scenario_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(ScenarioError, match="not found"):
        resolve(["--scenario", missing])


def test_option_flags() -> None:
    assert option_flags({"levels": [1, 4], "input_tokens": 64, "model": "m"}) == [
        "--levels",
        "1,4",
        "--input-tokens",
        "64",
        "--model",
        "m",
    ]
    with pytest.raises(KeyError):
        option_flags({"no_such_option": 1})


def test_scenario_flags_values() -> None:
    flags = scenario_flags(Scenario(levels=[2, 3], requests=None, duration_s=None, model=None))
    assert flags["levels"] == "2,3"
    assert flags["requests_per_level"] == 0
    assert flags["level_duration"] == 0.0
    assert flags["model"] == ""
    assert flags["warmup_output_tokens"] == 0
    assert flags["shared_prefix"] == 0


@pytest.mark.parametrize(
    "sc",
    [
        Scenario(),
        Scenario(
            backend="sglang",
            model="m",
            input_tokens=64,
            output_tokens=32,
            levels=[2, 3, 5],
            requests=9,
            warmup_requests=2,
            warmup_output_tokens=4,
            pause_s=1.5,
            stagger_s=0.25,
            repeat=2,
            seed=7,
            shared_prefix_tokens=16,
            read_timeout_s=12.0,
            level_timeout_s=120.0,
        ),
        Scenario(backend="chat", levels=[8], duration_s=45.0, output_tokens=10),
    ],
    ids=["defaults", "everything", "duration"],
)
def test_scenario_flags_round_trip(sc: Scenario) -> None:
    argv = option_flags(scenario_flags(sc))
    assert resolve(argv) == sc


def test_scenario_flags_round_trip_on_top_of_a_file() -> None:
    # What `specload ui` does: resolve file + overrides, then pass the file and every resolved value.
    sc = apply_overrides(load_scenario(SMOKE), {"input_tokens": 1000, "levels": "1,4,16,32,64,128"})
    argv = ["--scenario", SMOKE, *option_flags(scenario_flags(sc))]
    assert resolve(argv) == sc


# ---------------------------------------------------------------- the web UI's start form


def _form_check(form: dict[str, str], *argv: str) -> str | None:
    opts = parser().parse_args(["--scenario", SMOKE, *argv])
    before = vars(opts).copy()
    message = check_form(form, opts, explicit_from(opts), launch_values(opts))
    assert vars(opts) == before  # a check changes nothing: Locust applies the form only if it passes
    return message


GOOD_FORM = {
    "host": "http://gpu-box:30000",
    "levels": "1,2,4",
    "input_tokens": "32",
    "output_tokens": "16",
    "requests_per_level": "0",
    "label": "",
    "user_count": "0",
    "spawn_rate": "0",
}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "levels",
            "1,x",
            "start form: field 'Levels': expected a comma-separated list of positive integers, got '1,x'",
        ),
        (
            "levels",
            "0",
            "start form: field 'Levels': expected a non-empty list of positive integers, got '0'",
        ),
        ("input_tokens", "-5", "start form: field 'Input Tokens': expected an integer >= 1, got -5"),
        ("output_tokens", "many", "start form: field 'Output Tokens': expected an integer, got 'many'"),
        (
            "requests_per_level",
            "-1",
            "start form: field 'Requests Per Level': expected an integer >= 1, got -1",
        ),
        ("read_timeout", "nan", "start form: field 'Read Timeout': expected a finite number, got nan"),
        ("level_pause", "-1", "start form: field 'Level Pause': expected a number >= 0.0, got -1.0"),
        ("backend", "grpc", "start form: field 'Backend': expected one of openai, sglang, chat, got 'grpc'"),
        (
            "token_id_range",
            "9:1",
            "start form: field 'Token Id Range': expected MIN:MAX with integers 0 <= MIN < MAX, got '9:1'",
        ),
        (
            "shared_prefix",
            "40",
            "start form: field 'Shared Prefix': expected fewer than input_tokens (32), got 40",
        ),
        (
            "host",
            "gpu-box:30000",
            "start form: field 'Host': host 'gpu-box:30000' is not an http:// or https:// URL",
        ),
        ("host", "", "start form: field 'Host': enter the server's URL, e.g. http://gpu-box:30000"),
        ("label", "x" * 101, "start form: field 'Label': expected at most 100 characters, got 101"),
    ],
)
def test_start_form_refuses_a_bad_value_naming_the_field(field: str, value: str, message: str) -> None:
    assert _form_check({**GOOD_FORM, field: value}) == message


def test_start_form_accepts_good_values_and_what_it_does_not_send() -> None:
    assert _form_check(GOOD_FORM) is None
    assert _form_check({}) is None  # nothing sent: the launch values stand
    assert (
        _form_check({"levels": " 1, 8 ", "model": "m", "token_id_range": "", "send_key_to_new_host": "true"})
        is None
    )


def test_start_form_checks_the_scenario_the_run_would_use() -> None:
    # Each value is fine alone; together with the launch values they are not.
    assert _form_check({"shared_prefix": "20"}, "--input-tokens", "16") == (
        "start form: field 'Shared Prefix': expected fewer than input_tokens (16), got 20"
    )
