"""specload's command line: its scenario flags are the field table's, the same as Locust's options."""

from __future__ import annotations

import pytest

from specload.cli import build_parser, settings
from specload.launch import scenario_locust_flags
from specload.locust.options import explicit_options, scenario_from_options
from specload.workload.config import FIELDS, FLAG_FIELDS, ScenarioError
from tests.test_locust_options import parser as locust_parser


def sweep_args(*flags: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["sweep", "--host", "http://127.0.0.1:1", *flags])


def test_cli_and_locust_know_the_same_scenario_flags() -> None:
    cli = {
        a.option_strings[0]
        for a in build_parser()._subparsers._group_actions[0].choices["sweep"]._actions  # type: ignore[union-attr]
        if a.dest.startswith("sc_")
    }
    assert cli == {s.flag for s in FLAG_FIELDS}
    assert {"--warmup-output-tokens", "--temperature", "--connect-timeout"} <= cli


def test_warmup_output_tokens_flag_works() -> None:
    s = settings(sweep_args("--warmup-output-tokens", "8", "--warmup-requests", "1"))
    assert s.scenario().warmup_tokens == 8


@pytest.mark.parametrize("spec", FLAG_FIELDS, ids=lambda s: s.name)
def test_every_flag_reaches_its_field_through_locust(spec) -> None:  # type: ignore[no-untyped-def]
    # A value different from the default, typed on `specload sweep`, arrives in the same field of
    # the Scenario that the Locust child resolves from the flags it is given.
    samples = {int: "7", float: "2.5", str: "m1"}
    special = {
        "backend": "chat",
        "levels": "3,5",
        "token_id_range": "5:500",
        "dataset_lengths": "fixed",
        "rates": "0.5,2",
        "arrival": "gamma",
        "slo": "ttft_p99=2s",
        "input_dist": "uniform:200:300",
        "output_dist": "lognormal:mean=300,sigma=0.5,min=16",
    }
    needs = {"prefix_groups": ("--shared-prefix", "10")}  # a field that only makes sense with another one
    value = special.get(spec.name, samples[spec.option_type])
    s = settings(sweep_args(spec.flag, value, *needs.get(spec.name, ())))
    argv = scenario_locust_flags(s)
    via_locust = scenario_from_options(locust_parser().parse_args(argv), explicit_options(argv))
    assert getattr(via_locust, spec.name) == getattr(s.scenario(), spec.name) != FIELDS[spec.name].default


def test_cli_values_are_literal_and_named_in_errors() -> None:
    with pytest.raises(ScenarioError, match="flag --requests-per-level: field 'requests'"):
        settings(sweep_args("--requests-per-level", "0")).scenario()


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--label=-rm",), "--label"),
        (("--label", "x" * 300), "--label"),
        (("--requests-per-user", "inf"), "field 'requests_per_user': expected a finite number"),
        (("--level-pause", "inf"), "field 'pause_s': expected a finite number"),
        (("--stagger", "nan"), "field 'stagger_s'"),
        (("--format", "nope"), "--format: unknown table format"),
        (("--columns", "nope"), "--columns: unknown column or set 'nope'"),
    ],
)
def test_bad_values_exit_2_naming_the_flag(tmp_path, flags: tuple[str, ...], named: str) -> None:  # type: ignore[no-untyped-def]
    from specload.cli import main

    code, err = _main_err(
        main, ["sweep", "--host", "http://127.0.0.1:1", "--out", str(tmp_path / "o"), *flags]
    )
    assert code == 2 and named in err, err
    assert not (tmp_path / "o").exists()


def test_bad_host_port_and_out(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from specload.cli import main

    code, err = _main_err(main, ["sweep", "--host", "http://127.0.0.1:99999"])
    assert code == 2 and "port must be a number within 1..65535" in err, err
    afile = tmp_path / "f"
    afile.write_text("x")
    code, err = _main_err(main, ["sweep", "--host", "http://127.0.0.1:1", "--out", str(afile / "runs")])
    assert code == 2 and "is a file, not a directory" in err, err


def _main_err(main, argv: list[str]) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


@pytest.mark.parametrize(
    "command", ["sweep", "capacity", "ui", "worker", "report", "sim", "compare", "demo", "locustfile"]
)
def test_every_command_prints_its_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """argparse formats help texts with %: one stray % (a column named "Good %") broke --help of five
    commands. Each command's --help must print and exit 0."""
    from specload.cli import main

    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    assert "usage:" in capsys.readouterr().out
