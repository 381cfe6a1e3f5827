"""The ``specload`` command: sweep, ui, worker, report, sim, demo.

``sweep`` and ``ui`` check everything they can before any traffic (scenario fields, host URL,
server reachable), then run Locust itself as a child process with the resolved options, so the
run is exactly what a plain ``locust -f locustfiles/specload_sweep.py ...`` would do.

Exit codes: 0 sweep completed; 1 sweep ran but did not complete (interrupted, failed, level
incomplete); 2 bad input (scenario, flags, host URL); 3 server unreachable before the sweep.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from specload.config import BACKENDS, Scenario, ScenarioError, apply_overrides, load_scenario
from specload.rundir import LOCUST_PREFIX, RUN_JSON, new_run_dir, read_json

EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LOCUSTFILE = REPO_ROOT / "locustfiles" / "specload_sweep.py"

# CLI flag -> (scenario field, type, help). These mirror the Locust options of specload.options.
_SCENARIO_FLAGS: list[tuple[str, str, Any, str]] = [
    ("--backend", "backend", str, f"server API: {', '.join(BACKENDS)}"),
    ("--model", "model", str, "model name (default: discovered from /v1/models)"),
    ("--levels", "levels", str, "concurrency levels, e.g. 1,4,16"),
    ("--requests-per-level", "requests", int, "measured requests per level (default: max(4, 2*C))"),
    ("--level-duration", "duration_s", float, "seconds per level instead of a request budget"),
    ("--warmup-requests", "warmup_requests", int, "warmup requests per level"),
    ("--input-tokens", "input_tokens", int, "prompt length in tokens"),
    ("--output-tokens", "output_tokens", int, "output tokens per request"),
    ("--level-pause", "pause_s", float, "idle seconds between levels"),
    ("--stagger", "stagger_s", float, "spread each level's first requests over this many seconds"),
    ("--repeat", "repeat", int, "run every level this many times"),
    ("--seed", "seed", int, "prompt seed"),
    ("--shared-prefix", "shared_prefix_tokens", int, "tokens shared by all prompts"),
    ("--read-timeout", "read_timeout_s", float, "seconds of silence before a request fails"),
    ("--level-timeout", "level_timeout_s", float, "seconds before an unfinished level is marked incomplete"),
    ("--metrics-interval", "metrics_interval_s", float, "seconds between samples of the server's /metrics (0: off)"),
]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die(code: int, message: str) -> int:
    print(f"specload: {message}", file=sys.stderr)
    return code


def _add_scenario_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", default=None, help="scenario TOML file (default: built-in reference sweep)")
    for flag, field, typ, help_text in _SCENARIO_FLAGS:
        p.add_argument(flag, dest=f"sc_{field}", type=typ, default=None, help=help_text)


def resolve_scenario(args: argparse.Namespace) -> Scenario:
    """The scenario file (or defaults) with each given flag applied; an error names the flag typed."""
    sc = load_scenario(args.scenario) if args.scenario else Scenario()
    for flag, field, _t, _h in _SCENARIO_FLAGS:
        value = getattr(args, f"sc_{field}")
        if value is not None:
            sc = apply_overrides(sc, {field: value}, source=f"flag {flag}")
    return sc


def _scenario_locust_flags(args: argparse.Namespace) -> list[str]:
    """Pass the file and the explicit overrides through to Locust, which resolves them the same way."""
    out = ["--scenario", args.scenario] if args.scenario else []
    for flag, field, _t, _h in _SCENARIO_FLAGS:
        value = getattr(args, f"sc_{field}")
        if value is not None:
            out += [flag, str(value)]
    return out


def preflight(host: str, sc: Scenario, insecure: bool) -> str | None:
    """None when the server answers; else the reason, naming the URL."""
    from specload.probe import ServerUnreachable, get_json

    try:
        status, body = get_json(host, "/v1/models", timeout=sc.connect_timeout_s, insecure=insecure)
    except ServerUnreachable as e:
        return f"cannot reach the server before the sweep: {e}"
    if status in (401, 403) and not sc.model:
        # Without a model name the sweep cannot even start; with one, the rejections are recorded.
        return f"{host}/v1/models answered HTTP {status}: {body}; set SPECLOAD_API_KEY (or OPENAI_API_KEY) to the server's key"
    return None


def _run_locust(cmd: list[str]) -> int:
    """Run Locust in the foreground; Ctrl-C reaches it (same process group) and it winds down."""
    proc = subprocess.Popen(cmd)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        # Locust got the same SIGINT: give it its grace period to flush records and run.json.
        try:
            return proc.wait(timeout=60)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.send_signal(signal.SIGTERM)
            return proc.wait()


def cmd_sweep(args: argparse.Namespace) -> int:
    from specload.http import check_host

    try:
        sc = resolve_scenario(args)
        host = check_host(args.host)
    except (ScenarioError, ValueError) as e:
        return _die(EXIT_USAGE, str(e))
    if args.processes is not None and args.workers is not None:
        return _die(EXIT_USAGE, "--processes and --workers are exclusive (one machine vs several)")
    if args.processes is not None and args.processes != -1 and args.processes < 1:
        return _die(EXIT_USAGE, f"--processes: expected -1 (one per core) or a count >= 1, got {args.processes}")
    if args.workers is not None and args.workers < 1:
        return _die(EXIT_USAGE, f"--workers: expected a count >= 1, got {args.workers}")
    if (reason := preflight(host, sc, args.insecure)) is not None:
        return _die(EXIT_UNREACHABLE if reason.startswith("cannot reach") else EXIT_USAGE, reason)
    run_dir = new_run_dir(args.out, args.label or sc.name)
    prefix = os.path.join(run_dir, LOCUST_PREFIX)
    cmd = [
        sys.executable, "-m", "locust", "-f", str(args.locustfile), "--headless", "--host", host,
        "--run-dir", run_dir, "--csv", prefix, "--json-file", prefix, "--only-summary", "--quiet-report",
        *_scenario_locust_flags(args),
    ]  # fmt: skip
    if args.label:
        cmd += ["--label", args.label]
    if args.insecure:
        cmd.append("--insecure")
    if args.processes is not None:
        # A private port: a stray worker of another run on the default 5557 must never join this one.
        port = str(_free_port())
        cmd += ["--processes", str(args.processes), "--master-bind-port", port, "--master-port", port]
    if args.workers is not None:
        cmd += ["--master", "--expect-workers", str(args.workers), "--master-bind-host", args.master_bind_host,
                "--master-bind-port", str(args.master_bind_port)]  # fmt: skip
    cmd += args.locust_args
    print(f"specload: run directory {run_dir}", flush=True)
    code = _run_locust(cmd)
    return _finish_report(run_dir, code, args.format)


def _finish_report(run_dir: str, locust_code: int, fmt: str = "github") -> int:
    from specload import report

    if not os.path.exists(os.path.join(run_dir, RUN_JSON)):
        # The sweep never started (Locust refused an option, or the server vanished): nothing to report.
        return locust_code or EXIT_INCOMPLETE
    report.main([run_dir, "--format", fmt])
    status = read_json(os.path.join(run_dir, RUN_JSON)).get("status")
    if status == "completed" and locust_code == 0:
        return EXIT_OK
    print(f"specload: sweep {status}; partial results in {run_dir} (`specload report {run_dir}`)", file=sys.stderr)
    return EXIT_INCOMPLETE


def cmd_ui(args: argparse.Namespace) -> int:
    from specload.http import check_host
    from specload.options import option_flags, scenario_flags

    try:
        sc = resolve_scenario(args)
        host = check_host(args.host)
    except (ScenarioError, ValueError) as e:
        return _die(EXIT_USAGE, str(e))
    # Every resolved value goes on the command line, so the start form shows the scenario's values.
    flags = option_flags(scenario_flags(sc))
    cmd = [
        sys.executable, "-m", "locust", "-f", str(args.locustfile), "--host", host,
        "--web-host", args.web_host, "--web-port", str(args.web_port), "--results-dir", args.out,
        *(["--scenario", args.scenario] if args.scenario else []), *flags,
    ]  # fmt: skip
    if args.label:
        cmd += ["--label", args.label]
    if args.processes is not None:
        port = str(_free_port())
        cmd += ["--processes", str(args.processes), "--master-bind-port", port, "--master-port", port]
    if args.workers is not None:
        cmd += ["--master", "--master-bind-host", args.master_bind_host, "--master-bind-port", str(args.master_bind_port)]
    cmd += args.locust_args
    print(f"specload: web UI on http://{args.web_host}:{args.web_port} ; each run goes to {args.out}/<label>-<time>/")
    return _run_locust(cmd)


def cmd_worker(args: argparse.Namespace) -> int:
    cmd = [
        sys.executable, "-m", "locust", "-f", str(args.locustfile), "--worker",
        "--master-host", args.master_host, "--master-port", str(args.master_port),
    ]  # fmt: skip
    if args.processes is not None:
        cmd += ["--processes", str(args.processes)]
    return _run_locust(cmd + args.locust_args)


def cmd_report(args: argparse.Namespace) -> int:
    from specload import report

    argv = [args.run_dir, "--format", args.format]
    if args.no_write:
        argv.append("--no-write")
    return report.main(argv)


def cmd_sim(argv: list[str]) -> int:
    from specload.sim.server import main as sim_main

    return sim_main(argv)


def cmd_demo(args: argparse.Namespace) -> int:
    from specload.demo import run_demo

    return run_demo(args)


def _add_locust_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--locustfile", type=Path, default=DEFAULT_LOCUSTFILE, help=argparse.SUPPRESS)
    p.add_argument("--processes", type=int, default=None, help="Locust worker processes on this machine (-1: one per core)")
    p.add_argument("locust_args", nargs="*", help="extra Locust options after --, e.g. -- --loglevel DEBUG")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specload", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("sweep", help="run a headless sweep and print the per-level table")
    p.add_argument("--host", required=True, help="server URL, e.g. http://gpu-box:30000")
    p.add_argument("--label", default=None, help="run label (default: scenario name)")
    p.add_argument("--out", default="results", help="parent directory of run directories")
    p.add_argument("--insecure", action="store_true", help="skip TLS certificate verification")
    p.add_argument("--format", default="github", help="table format of the final report")
    p.add_argument("--workers", type=int, default=None, help="be a Locust master and wait for N workers")
    p.add_argument("--master-bind-host", default="0.0.0.0", help="master: interface for workers")
    p.add_argument("--master-bind-port", type=int, default=5557, help="master: port for workers")
    _add_scenario_flags(p)
    _add_locust_common(p)

    p = sub.add_parser("ui", help="start Locust's web UI with specload's options in its start form")
    p.add_argument("--host", required=True)
    p.add_argument("--label", default=None)
    p.add_argument("--out", default="results")
    p.add_argument("--web-host", default="127.0.0.1")
    p.add_argument("--web-port", type=int, default=8089)
    p.add_argument("--workers", type=int, default=None, help="run as a master for workers on other machines")
    p.add_argument("--master-bind-host", default="0.0.0.0")
    p.add_argument("--master-bind-port", type=int, default=5557)
    _add_scenario_flags(p)
    _add_locust_common(p)

    p = sub.add_parser("worker", help="send load for a master on another machine")
    p.add_argument("--master-host", required=True)
    p.add_argument("--master-port", type=int, default=5557)
    _add_locust_common(p)

    p = sub.add_parser("report", help="print (and write report.md for) a run directory")
    p.add_argument("run_dir")
    p.add_argument("--format", default="github", help="any tabulate format, csv or json")
    p.add_argument("--no-write", action="store_true", help="do not (re)write report.md")

    sub.add_parser("sim", help="run the built-in simulated server (see `specload sim --help`)", add_help=False)
    sub.add_parser("compare", help="baseline vs other runs, per level (see `specload compare --help`)", add_help=False)

    p = sub.add_parser("demo", help="sweep the built-in simulated server and print the table")
    p.add_argument("--out", default="results")
    p.add_argument("--scenario", default=str(REPO_ROOT / "scenarios" / "demo.toml"))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sim":
        return cmd_sim(argv[1:])
    if argv and argv[0] == "compare":
        from specload.compare import main as compare_main

        return compare_main(argv[1:])
    args = build_parser().parse_args(argv)
    handler = {"sweep": cmd_sweep, "ui": cmd_ui, "worker": cmd_worker, "report": cmd_report, "demo": cmd_demo}
    return handler[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
