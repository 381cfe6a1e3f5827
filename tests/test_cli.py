"""specload's command line: its scenario flags are the field table's, the same as Locust's options."""

from __future__ import annotations

import pytest

from specload.cli import build_parser, settings
from specload.launch import scenario_locust_flags
from specload.locust.options import explicit_from, scenario_from_options
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
        "prompts": "real",
        "output_mode": "natural",
        "rates": "0.5,2",
        "arrival": "gamma",
        "slo": "ttft_p99=2s",
        "input_dist": "uniform:200:300",
        "output_dist": "lognormal:mean=300,sigma=0.5,min=16",
        "trace_format": "azure",
        "trace_time_unit": "ms",
    }
    needs = {  # a field that only makes sense with another one
        "prefix_groups": ("--shared-prefix", "10"),
        "trace": ("--trace-format", "mooncake"),
    }
    value = special.get(spec.name, samples[spec.option_type])
    s = settings(sweep_args(spec.flag, value, *needs.get(spec.name, ())))
    argv = scenario_locust_flags(s)
    opts = locust_parser().parse_args(argv)
    via_locust = scenario_from_options(opts, explicit_from(opts))
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


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from specload import __version__
    from specload.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"specload {__version__}"


def test_help_names_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    from specload.cli import main

    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Prompt length in tokens (default: 1000)" in out
    assert "(default: 1,4,16,32,64,128)" in out and "(default: openai)" in out
    assert "(default: results)" in out and "(default: None)" not in out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["sweep", "--host", "http://127.0.0.1:1", "--output-tokens", "lots"], "invalid int value: 'lots'"),
        (["sweep", "--scenario", "smoke"], "the following arguments are required: --host"),
        (["sweep", "--host", "http://127.0.0.1:1", "--level", "1,2"], "ambiguous option: --level"),
        (["demo", "--colums", "x"], "unrecognized arguments: --colums"),
    ],
)
def test_argparse_errors_are_one_line_naming_the_help(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from specload.cli import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert f"(see specload {argv[0]} --help)" in err or "(see specload --help)" in err, err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--levels", "1", "4", "16"], "'4 16': a list takes commas, no spaces: --levels 1,4,16"),
        (["--rates", "1", "2"], "--rates 1,2"),
        (["--scenario", "smoke", "8"], "'8': every value belongs to a flag"),
    ],
)
def test_stray_words_are_refused_before_anything_starts(tmp_path, flags: list[str], says: str) -> None:  # type: ignore[no-untyped-def]
    """Words no flag took used to reach Locust as user class names ("Unknown User(s): 4, 16", exit 1)."""
    from specload.cli import main

    out = tmp_path / "o"
    code, err = _main_err(main, ["sweep", "--host", "http://127.0.0.1:1", "--out", str(out), *flags])
    assert code == 2 and says in err and "extra Locust options go after --" in err, err
    assert err.count("\n") == 1 and not out.exists()


def test_words_after_the_double_dash_are_locusts() -> None:
    from specload.cli import _split_locust_args

    head, tail = _split_locust_args(["sweep", "--host", "h", "--", "--loglevel", "DEBUG", "--", "x"])
    assert head == ["sweep", "--host", "h"] and tail == ["--loglevel", "DEBUG", "--", "x"]


@pytest.mark.parametrize(
    ("host", "root"),
    [
        ("http://server:8000/v1", "http://server:8000"),
        ("http://server:8000/v1/", "http://server:8000"),
        ("https://proxy/llm/v1", "https://proxy/llm"),
    ],
)
def test_a_host_ending_in_v1_is_taken_as_its_root(
    host: str, root: str, capsys: pytest.CaptureFixture[str]
) -> None:
    s = settings(sweep_args_host(host))
    assert s.host == root
    err = capsys.readouterr().err
    assert f"--host {host} ends in /v1: using {root}" in err


def test_other_hosts_are_kept_as_typed(capsys: pytest.CaptureFixture[str]) -> None:
    for host in ("http://server:8000", "http://proxy/llm", "http://server/v10"):
        assert settings(sweep_args_host(host)).host == host
    assert capsys.readouterr().err == ""


def sweep_args_host(host: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["sweep", "--host", host])


def test_ctrl_c_while_waiting_for_a_refusing_server_is_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import signal
    import socket
    import subprocess
    import time

    from tests.conftest import specload_cmd

    with socket.socket() as s:  # a port nothing listens on: every connect is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        specload_cmd("sweep", "--host", f"http://127.0.0.1:{port}", "--out", str(tmp_path)),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # the first "retrying" line: it is waiting now
        assert "retrying in" in first, first
        time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in rest, rest
    assert rest.strip().splitlines()[-1] == (
        f"specload: interrupted while waiting for http://127.0.0.1:{port} to answer: no run was started"
    ), rest
    assert not any(tmp_path.iterdir())  # no run directory was made


def test_a_folder_named_specload_in_the_current_folder_does_not_shadow_the_package(
    tmp_path, procs, sim
) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    if sys.version_info < (3, 11):
        pytest.skip("PYTHONSAFEPATH needs Python 3.11")
    from pathlib import Path

    script = Path(sys.executable).parent / "specload"  # the console script: its own folder leads the path
    server = sim("--ttft-ms", "1", "--itl-ms", "1", "--model", "m")
    (tmp_path / "specload").mkdir()  # as in the parent folder of a clone
    (tmp_path / "specload" / "__init__.py").write_text("raise ImportError('the wrong specload')\n")
    out = subprocess.run(
        [str(script), "sweep", "--host", server.url, "--scenario", "smoke", "--out", str(tmp_path / "out")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "the wrong specload" not in out.stderr


@pytest.mark.parametrize(
    ("web_host", "warned"), [("127.0.0.1", False), ("localhost", False), ("::1", False), ("0.0.0.0", True)]
)
def test_a_web_ui_off_the_loopback_warns_that_its_login_is_plain_http(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], web_host: str, warned: bool
) -> None:
    import specload.launch as launch

    monkeypatch.setattr(launch, "run_locust", lambda cmd, env=None: 0)  # the command, not the UI
    args = build_parser().parse_args(["ui", "--host", "http://127.0.0.1:1", "--web-host", web_host])
    assert launch.run_ui(settings(args), web_host, 8089) == 0
    err = capsys.readouterr().err
    assert ("is plain HTTP: the password and the session travel unencrypted" in err) is warned, err
    assert launch.is_loopback("127.0.0.2") and not launch.is_loopback("gpu-box.local")
