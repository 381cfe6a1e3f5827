"""The specload command: sweep, capacity, ui, worker, report, compare, sim, demo, experiment, predict.

``sweep``, ``capacity`` (a sweep whose levels a search picks, specload.analysis.capacity) and ``ui`` check everything they can before any traffic (scenario fields, host URL,
server reachable), then run Locust itself as a child process with the resolved options (see
``specload.launch``). The scenario flags are made from the field table in ``specload.workload.config``, the
same table that makes Locust's options and the web UI's form.

Exit codes: 0 sweep completed; 1 sweep ran but did not complete (interrupted, failed, level
incomplete); 2 bad input (scenario, flags, host URL); 3 server unreachable before the sweep.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from specload import __version__
from specload.core.resources import builtin_scenarios, locustfile_path
from specload.launch import (
    DEFAULT_LOCUSTFILE,
    EXIT_USAGE,
    PROCESSES_AUTO,
    LaunchError,
    SweepSettings,
    run_capacity,
    run_sweep,
    run_ui,
    run_worker,
)
from specload.present.tableview import TableView, columns_help, view_for
from specload.sweep.capacity import search_space
from specload.workload.config import FLAG_FIELDS, ScenarioError


def _die(code: int, message: str) -> int:
    print(f"specload: {message}", file=sys.stderr)
    return code


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line that says where the help is.

    argparse's own error prints the whole usage (30 lines for ``sweep``) before the one line that
    matters; a user who typed one flag wrong needs that line and the way to the rest.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _DefaultsFormatter(argparse.HelpFormatter):
    """Help that names each option's default, when it has one worth naming."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if (
            "default" in text
            or d is None
            or d is False
            or d is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return f"{text} (default: {d})" if text else f"default: {d}"


def _field_default(spec: object) -> str:
    """A scenario field's default as its flag would write it; "" when the field is unset by default."""
    default = getattr(spec, "default", None)
    if default is None or default == "" or default == []:
        return ""
    text = spec.to_option(default)  # type: ignore[attr-defined]
    return f" (default: {text})"


def root_host(host: str) -> tuple[str, str | None]:
    """``--host`` without a trailing ``/v1``, and the line that says so (None when unchanged).

    The OpenAI SDK and ``vllm bench serve --base-url`` take ``http://server/v1``; specload adds
    ``/v1/...`` (or SGLang's ``/generate``) itself and keeps any other path as a proxy prefix, so a
    ``/v1`` typed out of habit would give ``/v1/v1/models``.
    """
    if not host:
        return host, None
    parts = urlsplit(host)
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        return host, None
    root = urlunsplit((parts.scheme, parts.netloc, path[: -len("/v1")], parts.query, parts.fragment))
    return root, f"--host {host} ends in /v1: using {root} (specload adds the /v1/... paths itself)"


def _add_scenario_flags(p: argparse.ArgumentParser, experiment: bool = False) -> None:
    """The scenario's flags; an experiment takes its scenario from its file, and its --repeat is its own."""
    if not experiment:
        p.add_argument(
            "--scenario",
            default=None,
            help="scenario TOML file, or a built-in scenario's name "
            f"({', '.join(builtin_scenarios())}); default: the reference sweep's settings",
        )
    for spec in FLAG_FIELDS:
        if experiment and spec.name == "repeat":
            continue
        assert spec.flag is not None  # FLAG_FIELDS holds the fields that have one
        # No argparse `choices`: the field's own check gives the message that names the field.
        p.add_argument(
            spec.flag,
            dest=f"sc_{spec.name}",
            type=spec.option_type,
            default=None,
            help=spec.help.replace("%", "%%") + _field_default(spec),
            metavar=spec.dest.upper(),
        )


def settings(args: argparse.Namespace) -> SweepSettings:
    """The sweep the command line asks for; only the flags that were given override the scenario.

    A value typed here is the field's value as it is (``--requests-per-level 0`` is an error, not
    "unset"): the web form's 0-means-unset convention exists only because a form cannot be empty.
    """
    overrides = {
        spec.name: value for spec in FLAG_FIELDS if (value := getattr(args, f"sc_{spec.name}")) is not None
    }
    host, said = root_host(args.host)
    if said:
        print(f"specload: {said}", file=sys.stderr)
    return SweepSettings(
        host=host,
        scenario_file=args.scenario,
        overrides=overrides,
        label=args.label,
        out=args.out,
        insecure=getattr(args, "insecure", False),
        processes=args.processes,
        workers=args.workers,
        master_bind_host=args.master_bind_host,
        master_bind_port=args.master_bind_port,
        locust_args=args.locust_args,
        locustfile=args.locustfile,
    )


def _view(args: argparse.Namespace) -> TableView:
    """``--columns`` as a table view for this terminal; LaunchError(EXIT_USAGE) for an unknown name."""
    try:
        return view_for(args.columns)
    except ValueError as e:
        raise LaunchError(EXIT_USAGE, str(e)) from None


def cmd_sweep(args: argparse.Namespace) -> int:
    try:
        return run_sweep(settings(args), args.format, _view(args)).exit_code
    except LaunchError as e:
        return _die(e.code, str(e))


def cmd_capacity(args: argparse.Namespace) -> int:
    s = settings(args)
    try:
        sc = s.scenario()
        space = search_space(sc, args.start, args.min, args.max, args.tolerance, args.max_probes)
    except ScenarioError as e:
        return _die(EXIT_USAGE, str(e))
    except ValueError as e:
        return _die(EXIT_USAGE, f"capacity search: {e}")
    try:
        return run_capacity(s, space, args.format, _view(args)).exit_code
    except LaunchError as e:
        return _die(e.code, str(e))


def cmd_ui(args: argparse.Namespace) -> int:
    try:
        return run_ui(settings(args), args.web_host, args.web_port, web_auth=not args.no_web_auth)
    except LaunchError as e:
        return _die(e.code, str(e))


def cmd_worker(args: argparse.Namespace) -> int:
    return run_worker(args.master_host, args.master_port, args.processes, args.locust_args, args.locustfile)


def cmd_experiment(args: argparse.Namespace) -> int:
    from specload.experiment.predicted import run_predicted
    from specload.experiment.run import ExperimentSettings, run_experiment

    try:
        view = _view(args)
    except LaunchError as e:
        return _die(e.code, str(e))
    overrides = {
        spec.name: value
        for spec in FLAG_FIELDS
        if spec.name != "repeat" and (value := getattr(args, f"sc_{spec.name}")) is not None
    }
    if args.repeat == "auto" and not args.predict:
        return _die(EXIT_USAGE, "--repeat auto: only with --predict")
    run = run_predicted if args.predict else run_experiment
    return run(
        ExperimentSettings(
            plan_path=args.experiment,
            repeat=1 if args.repeat == "auto" else args.repeat,
            predict=args.predict,
            repeat_auto=args.repeat == "auto",
            budget_s=args.budget,
            out=args.out,
            overrides=overrides,
            report_format=args.format,
            view=view,
            insecure=args.insecure,
            processes=args.processes,
            plot=not args.no_plot,
            locust_args=args.locust_args,
            locustfile=args.locustfile,
        )
    )


def cmd_predict(args: argparse.Namespace) -> int:
    from specload.experiment.predict import PredictSettings, run_predict

    return run_predict(
        PredictSettings(
            baseline=args.baseline,
            probes=args.probe or (),
            host=args.host,
            levels=args.levels or (),
            spec_cap=args.spec_cap,
            draft_tokens=args.draft_tokens,
            what_cap=args.what_if_cap,
            what_draft=args.what_if_draft,
            what_output=args.what_if_output,
            out_dir=args.out_dir,
            label=args.label,
            out=args.out,
            insecure=args.insecure,
            processes=args.processes,
            locust_args=args.locust_args,
        )
    )


def _repeat(value: str) -> int | str:
    """``--repeat``: a count, or ``auto`` (with --predict)."""
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count or auto, got {value!r}") from None


def _int_list(value: str) -> list[int]:
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated counts, got {value!r}") from None


def cmd_demo(args: argparse.Namespace) -> int:
    from specload.demo import run_demo

    try:
        view = _view(args)
    except LaunchError as e:
        return _die(e.code, str(e))
    return run_demo(args.scenario, args.out, view)


def _processes(value: str) -> int:
    """``--processes``: a count, -1 (one per core) or ``auto`` (launch.PROCESSES_AUTO)."""
    if value == "auto":
        return PROCESSES_AUTO
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count, -1 or auto, got {value!r}") from None


def _add_locust_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--locustfile", type=Path, default=DEFAULT_LOCUSTFILE, help=argparse.SUPPRESS)
    p.add_argument(
        "--processes",
        type=_processes,
        default=None,
        help="Locust worker processes on this machine (-1: one per core; auto: from the cores and "
        "the largest level's expected token rate, said at start)",
    )
    # Only the words after `--` are Locust's (main splits them off); a word argparse leaves here is a
    # stray one, refused before anything starts.
    p.add_argument(
        "locust_args",
        nargs="*",
        metavar="-- LOCUST_OPTION",
        help="extra Locust options after --, e.g. -- --loglevel DEBUG",
    )


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", required=True, help="server URL, e.g. http://gpu-box:30000")
    p.add_argument("--label", default=None, help="run label (default: scenario name)")
    p.add_argument("--out", default="results", help="parent directory of run directories")
    p.add_argument("--master-bind-host", default="0.0.0.0", help="master: interface for workers")
    p.add_argument("--master-bind-port", type=int, default=5557, help="master: port for workers")
    _add_scenario_flags(p)
    _add_locust_common(p)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specload", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"specload {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "sweep",
        help="run a headless sweep (on a terminal: a live progress line per level) and "
        "print the per-level table",
    )
    p.add_argument("--insecure", action="store_true", help="skip TLS certificate verification")
    p.add_argument("--format", default="github", help="table format of the final report")
    # A display option, not a scenario field: it changes what is printed, never what is measured
    # (run.json, report.md and the Locust child do not see it).
    p.add_argument("--columns", default=None, metavar="SETS", help=columns_help())
    p.add_argument("--workers", type=int, default=None, help="be a Locust master and wait for N workers")
    _add_run_flags(p)

    p = sub.add_parser(
        "capacity",
        help="search the highest concurrency (or, with --rates R, request rate) that "
        "meets --slo: one run, levels chosen as it goes: doubling from --start, then bisection",
    )
    p.add_argument(
        "--start",
        type=float,
        default=None,
        help="first level probed (default: C=8; with --rates R, R requests/s)",
    )
    p.add_argument("--min", type=float, default=1, help="lowest level probed (default 1)")
    p.add_argument("--max", type=float, default=512, help="highest level probed (default 512)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="stop when the bracket is within this fraction of its lower end (default: concurrency "
        "one apart; rates 0.05)",
    )
    p.add_argument(
        "--max-probes",
        type=int,
        default=16,
        help="most levels the search runs (default 16: enough for 1..512)",
    )
    p.add_argument("--insecure", action="store_true", help="skip TLS certificate verification")
    p.add_argument("--format", default="github", help="table format of the final report")
    p.add_argument("--columns", default=None, metavar="SETS", help=columns_help())
    p.add_argument("--workers", type=int, default=None, help="be a Locust master and wait for N workers")
    _add_run_flags(p)

    p = sub.add_parser("ui", help="start Locust's web UI with specload's options in its start form")
    p.add_argument("--web-host", default="127.0.0.1")
    p.add_argument("--web-port", type=int, default=8089)
    p.add_argument(
        "--no-web-auth",
        action="store_true",
        help="no login page (for a UI behind your own authenticating proxy); by default the UI "
        "asks for a password made for this run and printed at start",
    )
    p.add_argument("--workers", type=int, default=None, help="run as a master for workers on other machines")
    _add_run_flags(p)

    p = sub.add_parser("worker", help="send load for a master on another machine")
    p.add_argument("--master-host", required=True)
    p.add_argument("--master-port", type=int, default=5557)
    _add_locust_common(p)

    sub.add_parser(
        "report",
        help="print (and write report.md for) a run directory (see `specload report --help`)",
        add_help=False,
    )
    sub.add_parser(
        "sim", help="run the built-in simulated server (see `specload sim --help`)", add_help=False
    )
    sub.add_parser(
        "compare",
        help="baseline vs other runs, or an experiment's arms, per level (see `specload compare --help`)",
        add_help=False,
    )

    p = sub.add_parser(
        "demo",
        help="baseline vs MTP on two built-in simulated servers: sweeps, comparison, capacity (no GPU)",
        description="Sweep two SIMULATED servers (a baseline and its MTP speculative-decoding twin), compare "
        "them, and search each one's capacity under the scenario's SLO. About two minutes; "
        "`specload demo --scenario smoke` is a 20-second check of the same path.",
    )
    p.add_argument("--out", default="results", help="parent directory of the demo's run directories")
    p.add_argument(
        "--scenario",
        default="demo",
        help=f"scenario TOML file or built-in name ({', '.join(builtin_scenarios())})",
    )
    p.add_argument("--columns", default=None, metavar="SETS", help=columns_help())

    p = sub.add_parser(
        "experiment",
        help="baseline vs speculative servers in one command: start each arm's server, check it, sweep it, "
        "stop it, compare (docs/experiment.md)",
    )
    p.add_argument("experiment", metavar="EXPERIMENT.toml", help="the arms and their shared sweep")
    p.add_argument(
        "--repeat",
        type=_repeat,
        default=1,
        metavar="N",
        help="run the arms N times, interleaved (A, B, A, B, ...); each start is its own run. With "
        "--predict, auto: repeat (interleaved) only the deciding levels whose sign is not settled",
    )
    p.add_argument(
        "--predict",
        action="store_true",
        help="baseline ladder + speculative probes, predict, then measure the speculative arm only at the "
        'levels that decide the crossover (docs/experiment.md, "Predict, then verify")',
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="S",
        help="with --repeat auto: stop repeating after S seconds",
    )
    p.add_argument("--out", default="results", help="parent directory of the experiment's directory")
    p.add_argument("--format", default="github", help="table format of the reports and the comparison")
    p.add_argument("--columns", default=None, metavar="SETS", help=columns_help())
    p.add_argument("--insecure", action="store_true", help="skip TLS certificate verification")
    p.add_argument("--no-plot", action="store_true", help="do not draw the comparison's plots")
    _add_scenario_flags(p, experiment=True)
    _add_locust_common(p)

    p = sub.add_parser(
        "predict",
        help="predict the speculative arm at every level of a baseline run from a few speculative probes, "
        'with intervals, the crossover C* and what-ifs (docs/metrics.md, "Predicted speculative curve")',
    )
    p.add_argument(
        "baseline", nargs="+", metavar="BASELINE_RUN", help="the baseline run directory (or its repeats)"
    )
    p.add_argument("--probe", action="append", metavar="RUN", help="a speculative run directory (repeatable)")
    p.add_argument(
        "--host", default=None, help="a running speculative server: specload runs the probes itself"
    )
    p.add_argument(
        "--levels",
        type=_int_list,
        default=None,
        metavar="C,C",
        help="probe levels (default: chosen from the cap)",
    )
    p.add_argument(
        "--spec-cap",
        type=int,
        default=None,
        help="the speculative server's running cap (default: read or inferred)",
    )
    p.add_argument(
        "--draft-tokens", type=int, default=None, metavar="K", help="draft tokens per step (default: read)"
    )
    p.add_argument(
        "--what-if-cap", type=int, default=None, metavar="N", help="what-if: another running cap (default 2x)"
    )
    p.add_argument(
        "--what-if-draft",
        type=int,
        default=None,
        metavar="K",
        help="what-if: another draft length (default K+1)",
    )
    p.add_argument(
        "--what-if-output",
        type=float,
        default=None,
        metavar="N",
        help="what-if: another output length (default 2x)",
    )
    p.add_argument(
        "--out-dir", default=None, help="where prediction.json/.md go (default: the last probe run)"
    )
    p.add_argument("--label", default="probe", help="the probe run's label (with --host)")
    p.add_argument("--out", default="results", help="parent directory of the probe run (with --host)")
    p.add_argument("--insecure", action="store_true", help="skip TLS certificate verification")
    _add_locust_common(p)

    sub.add_parser("locustfile", help="print the locustfile's path, for a plain `locust -f` run")
    return parser


def _split_locust_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """specload's own arguments, and the Locust options after the first ``--``."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def _stray_words(head: list[str], stray: list[str]) -> str:
    """The error for words no flag took: most often a list typed with spaces (``--levels 1 4 16``).

    Such words used to reach Locust, which took them for user class names ("Unknown User(s): 4, 16").
    """
    words = " ".join(stray)
    i = head.index(stray[0]) if stray[0] in head else -1
    flag = next((w for w in reversed(head[:i]) if w.startswith("--")), None) if i > 0 else None
    lists = {spec.flag for spec in FLAG_FIELDS if isinstance(spec.default, list)}
    if flag is not None and flag in lists and head.index(flag) + 2 == i:
        joined = ",".join([head[i - 1], *stray])
        hint = f"a list takes commas, no spaces: {flag} {joined}"
    else:
        hint = "every value belongs to a flag"
    return (
        f"stray word(s) {words!r}: {hint}; extra Locust options go after -- (see specload {head[0]} --help)"
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `sim`, `report` and `compare` own their whole argument lists (their parsers live with them).
    if argv and argv[0] == "sim":
        from specload.sim.cli import main as sim_main

        return sim_main(argv[1:])
    if argv and argv[0] == "report":
        from specload.present.report import main as report_main

        return report_main(argv[1:])
    if argv and argv[0] == "compare":
        from specload.experiment.pooled import compare_main  # an experiment directory, else runs

        return compare_main(argv[1:])
    parser = build_parser()
    head, tail = _split_locust_args(argv)
    args = parser.parse_args(head)
    if getattr(args, "locust_args", None):
        return _die(EXIT_USAGE, _stray_words(head, args.locust_args))
    if hasattr(args, "locust_args"):
        args.locust_args = tail
    if args.command == "locustfile":
        print(locustfile_path())
        return 0
    handler = {
        "sweep": cmd_sweep,
        "capacity": cmd_capacity,
        "ui": cmd_ui,
        "worker": cmd_worker,
        "demo": cmd_demo,
        "experiment": cmd_experiment,
        "predict": cmd_predict,
    }
    return handler[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
