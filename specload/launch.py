"""Start a sweep or the web UI: the one place that turns specload's settings into a Locust run.

``specload sweep``, ``specload ui``, ``specload worker`` and the demo all come here. Locust runs as a
child process with the resolved options, so a run is exactly what a plain
``locust -f locustfiles/specload_sweep.py ...`` would do; the caller gets back a typed outcome (the
exit code and the run directory), not a string to parse or a folder to search.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specload.analysis.capacity import KIND_CONCURRENCY, SearchSpace
from specload.client.http import check_host, redact_host
from specload.core.openfiles import open_files_problem
from specload.core.resources import locustfile_path
from specload.core.rundir import LOCUST_PREFIX, MAX_LABEL, RUN_COMPLETED, RUN_JSON, new_run_dir, read_run_meta
from specload.locust.channel import MASTER_TOKEN_ENV, master_token, new_master_token, token_problem
from specload.present.output import is_document, is_known_format
from specload.present.tableview import WHOLE, TableView
from specload.workload.config import FIELDS, Scenario, ScenarioError, apply_overrides, load_scenario
from specload.workload.procplan import describe as describe_processes
from specload.workload.procplan import plan_processes

EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # Ctrl-C before any run existed (128 + SIGINT, as a shell reports it)
PROCESSES_AUTO = -2  # --processes auto: chosen from the cores and the largest level (specload.procplan)

DEFAULT_LOCUSTFILE = locustfile_path()


class LaunchError(Exception):
    """The run cannot start; ``code`` is the exit code that says why (usage or unreachable)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class SweepSettings:
    """A sweep as the user asked for it: the scenario file, field overrides, and where it runs."""

    host: str
    scenario_file: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)  # scenario field -> value
    label: str | None = None
    out: str = "results"
    insecure: bool = False
    processes: int | None = None  # Locust worker processes on this machine (-1: one per core; PROCESSES_AUTO)
    workers: int | None = None  # be a master and wait for this many workers
    master_bind_host: str = "0.0.0.0"
    master_bind_port: int = 5557
    locust_args: Sequence[str] = ()
    locustfile: Path = DEFAULT_LOCUSTFILE

    def scenario(self) -> Scenario:
        """The file (or the defaults) with each override applied; an error names the flag or field."""
        sc = load_scenario(self.scenario_file) if self.scenario_file else Scenario()
        for name, value in self.overrides.items():
            flag = FIELDS[name].flag
            sc = apply_overrides(sc, {name: value}, source=f"flag {flag}" if flag else "command line")
        return sc


@dataclass(frozen=True)
class SweepOutcome:
    exit_code: int
    run_dir: str | None  # None when the sweep never started
    status: str | None = None  # run.json's status: completed, interrupted, failed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_settings(s: SweepSettings) -> tuple[Scenario, str]:
    """The resolved scenario and host, or LaunchError(EXIT_USAGE) naming what is wrong."""
    try:
        sc = s.scenario()
        host = check_host(s.host)
    except (ScenarioError, ValueError) as e:
        raise LaunchError(EXIT_USAGE, str(e)) from None
    if s.processes is not None and s.workers is not None:
        raise LaunchError(EXIT_USAGE, "--processes and --workers are exclusive (one machine vs several)")
    if s.processes is not None and s.processes not in (-1, PROCESSES_AUTO) and s.processes < 1:
        raise LaunchError(
            EXIT_USAGE, f"--processes: expected -1 (one per core) or a count >= 1, got {s.processes}"
        )
    if s.workers is not None and s.workers < 1:
        raise LaunchError(EXIT_USAGE, f"--workers: expected a count >= 1, got {s.workers}")
    if s.label is not None and (not s.label or s.label.startswith("-") or len(s.label) > MAX_LABEL):
        raise LaunchError(
            EXIT_USAGE,
            f"--label: expected 1..{MAX_LABEL} characters not starting with '-', "
            f"got {s.label[:40]!r}{'...' if len(s.label) > 40 else ''}",
        )
    if s.workers is not None and (why := token_problem(master_token())):
        raise LaunchError(EXIT_USAGE, f"--workers: {why}")
    _check_out(s.out)
    _ensure_open_files(max(sc.levels), s.processes)
    return sc, host


def locust_env(s: SweepSettings, host: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The Locust child's environment: ours, with what argv would show to every user of the machine
    (``ps``): the host URL, which may hold a user:password, and, for ``--processes``, a master token
    made for this run that only its own processes inherit (specload.locust.channel)."""
    if redact_host(host) != host:
        # Nothing in specload sends a URL's user:password (no HTTP basic auth), and Locust hands its
        # host to every worker: the password would only travel.
        print(
            "specload: the user:password in --host is not sent to the server and is dropped; "
            "a bearer key goes in SPECLOAD_API_KEY",
            file=sys.stderr,
        )
        host = redact_host(host)
    env = {**os.environ, "LOCUST_HOST": host, **(extra or {})}
    if s.processes is not None:
        env[MASTER_TOKEN_ENV] = new_master_token()
    return env


def auto_processes(s: SweepSettings, sc: Scenario, cores: int | None = None) -> SweepSettings:
    """``--processes auto`` resolved for this machine and scenario (specload.procplan), said once."""
    if s.processes != PROCESSES_AUTO:
        return s
    n, why = plan_processes(sc, cores if cores is not None else (os.cpu_count() or 1))
    print(describe_processes(n, why), file=sys.stderr)
    return replace(s, processes=n)


def _ensure_open_files(max_concurrency: int, processes: int | None) -> None:
    """Each user holds a connection: refuse, naming ``ulimit -n``, a level that cannot fit, instead of
    letting it fail as if the server had refused connections (specload.core.openfiles; the web form
    makes the same check)."""
    n = (os.cpu_count() or 1) if processes in (-1, PROCESSES_AUTO) else (processes or 1)
    if why := open_files_problem(max_concurrency, n):
        raise LaunchError(EXIT_USAGE, why)


def _check_out(out: str) -> None:
    """``--out`` must be a directory we can write in, or one we can make: checked before any load,
    without making it (a run that never starts leaves nothing behind)."""
    path = os.path.abspath(out)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise LaunchError(EXIT_USAGE, f"--out {out!r}: {path} is a file, not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise LaunchError(EXIT_USAGE, f"--out {out!r}: {path} is not writable")


# A server restarting refuses connections for a moment: tried again after these pauses (about 8 s in
# all) before the sweep is given up. Other failures (timeouts, TLS) are not retried.
PREFLIGHT_BACKOFF_S = (0.25, 0.5, 1.0, 2.0, 4.0)


def preflight(host: str, sc: Scenario, insecure: bool) -> None:
    """Raise LaunchError when the server does not answer (or refuses us) before any run exists."""
    try:
        status, body = _first_answer(host, sc, insecure)
    except KeyboardInterrupt:
        raise LaunchError(
            EXIT_INTERRUPTED, f"interrupted while waiting for {host} to answer: no run was started"
        ) from None
    if status in (401, 403) and not sc.model:
        # Without a model name the sweep cannot even start; with one, the rejections are recorded.
        raise LaunchError(
            EXIT_USAGE,
            f"{host}/v1/models answered HTTP {status}: {body}; set SPECLOAD_API_KEY (or OPENAI_API_KEY) to the server's key",
        )


def _first_answer(host: str, sc: Scenario, insecure: bool) -> tuple[int, Any]:
    """/v1/models' status and body, retried while the server refuses connections (restarting)."""
    from specload.client.probe import ServerUnreachable, get_json

    for attempt, pause in enumerate((*PREFLIGHT_BACKOFF_S, None), 1):
        try:
            status, body = get_json(host, "/v1/models", timeout=sc.connect_timeout_s, insecure=insecure)
            break
        except ServerUnreachable as e:
            if pause is None or "connection refused" not in str(e):
                raise LaunchError(
                    EXIT_UNREACHABLE, f"cannot reach the server before the sweep: {e}"
                ) from None
            print(
                f"specload: {e}; retrying in {pause:g} s ({attempt}/{len(PREFLIGHT_BACKOFF_S)})",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(pause)
    return status, body


def scenario_locust_flags(s: SweepSettings) -> list[str]:
    """The file and the explicit overrides, for Locust to resolve the same way."""
    out = ["--scenario", s.scenario_file] if s.scenario_file else []
    for name, value in s.overrides.items():
        spec = FIELDS[name]
        assert spec.flag is not None, f"field {name} has no flag"
        out += [spec.flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return out


def distribution_flags(s: SweepSettings, web: bool = False) -> list[str]:
    if s.processes is not None:
        # A private port: a stray worker of another run on the default 5557 must never join this one.
        # Only this machine's processes may join: the master listens on loopback alone.
        port = str(free_port())
        return [
            "--processes",
            str(s.processes),
            "--master-bind-host",
            "127.0.0.1",
            "--master-bind-port",
            port,
            "--master-host",
            "127.0.0.1",
            "--master-port",
            port,
        ]
    if s.workers is not None:
        expect = [] if web else ["--expect-workers", str(s.workers)]
        return [
            "--master",
            *expect,
            "--master-bind-host",
            s.master_bind_host,
            "--master-bind-port",
            str(s.master_bind_port),
        ]
    return []


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def child_setup(parent: int) -> Callable[[], None]:
    """In the child before exec: its own process group (a terminal's Ctrl-C reaches only us, and we
    pass it on once), and a SIGTERM from the kernel when we die, even by SIGKILL: the load stops
    with the process that started it, as CI runners, systemd and docker expect."""

    def setup() -> None:
        os.setpgid(0, 0)
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != parent:  # we died before the request took effect
                os._exit(1)

    return setup


def run_locust(cmd: list[str], env: dict[str, str] | None = None) -> int:
    """Run Locust as a child that stops when we are told to stop, and dies with us.

    SIGINT and SIGTERM are passed on to it (it winds down with its grace period, records flushed
    and the run marked interrupted); its exit code is ours to return. ``env``: the child's whole
    environment (default: ours), the way to hand it a secret that argv would show to ``ps``.
    """
    proc = subprocess.Popen(cmd, env=env, preexec_fn=child_setup(os.getpid()))

    def forward(signum: int, _frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_sweep(
    s: SweepSettings, report_format: str | None = "github", view: TableView = WHOLE
) -> SweepOutcome:
    """Check, run one headless sweep to its end, print its report; raises LaunchError before any run.

    ``view``: the per-level table's columns as printed (``--columns``; report.md has them all)."""
    sc, host = check_settings(s)
    s = auto_processes(s, sc)
    if report_format is not None and not is_known_format(report_format):
        raise LaunchError(EXIT_USAGE, f"--format: unknown table format {report_format!r}")
    preflight(host, sc, s.insecure)
    run_dir = new_run_dir(s.out, s.label or sc.name)
    prefix = os.path.join(run_dir, LOCUST_PREFIX)
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(s.locustfile),
        "--headless",
        "--run-dir",
        run_dir,
        "--csv",
        prefix,
        "--json-file",
        prefix,
        "--only-summary",
        "--report-by-parent",
        *scenario_locust_flags(s),
        *(["--label", s.label] if s.label else []),
        *(["--insecure"] if s.insecure else []),
        *distribution_flags(s),
        *s.locust_args,
    ]
    # (stderr under csv/json: their stdout is the data alone, so that it parses)
    where = sys.stderr if report_format is not None and is_document(report_format) else sys.stdout
    print(f"specload: run directory {run_dir}", file=where, flush=True)
    return _outcome(run_dir, run_locust(cmd, locust_env(s, host)), report_format, view)


def run_capacity(
    s: SweepSettings, space: SearchSpace, report_format: str | None = "github", view: TableView = WHOLE
) -> SweepOutcome:
    """``specload capacity``: one run whose levels the search picks (specload.analysis.capacity), then its
    report, which ends with the answer. Raises LaunchError before any run (no SLO, bad space)."""
    sc, _ = check_settings(s)
    if not sc.slo:
        raise LaunchError(
            EXIT_USAGE, "a capacity search needs an SLO: --slo ttft_p99=2s,... (or slo in the scenario)"
        )
    if "levels" in s.overrides:
        raise LaunchError(
            EXIT_USAGE,
            "--levels: a capacity search picks its own levels (--start, --min, --max; "
            "--rates R to search a request rate from R)",
        )
    if sc.repeat != 1:
        raise LaunchError(
            EXIT_USAGE, "--repeat: a capacity search probes each level once (run it again to repeat)"
        )
    try:
        space.check()
    except ValueError as e:
        raise LaunchError(EXIT_USAGE, f"capacity search: {e}") from None
    # run.json's scenario: where the search began
    if space.kind == KIND_CONCURRENCY:
        overrides = {**s.overrides, "levels": [int(space.start)]}
        _ensure_open_files(int(space.maximum), s.processes)
    else:
        overrides = {**s.overrides, "rates": [space.start]}
        _ensure_open_files(sc.pool(), s.processes)
    args = [*s.locust_args, "--capacity-search", space.to_option()]
    return run_sweep(replace(s, overrides=overrides, locust_args=args), report_format, view)


def _outcome(
    run_dir: str, locust_code: int, report_format: str | None, view: TableView = WHOLE
) -> SweepOutcome:
    from specload.analysis.run import load_run
    from specload.present.report import print_report, write_report_md

    if not os.path.exists(os.path.join(run_dir, RUN_JSON)):
        # The sweep never started (Locust refused an option or the locustfile, or the server vanished):
        # nothing to report, and no empty run directory left behind to be mistaken for a run.
        shutil.rmtree(run_dir, ignore_errors=True)
        return SweepOutcome(locust_code or EXIT_INCOMPLETE, None)
    # report.md is ours to write (--report-by-parent): the Locust process started no report child.
    try:
        if report_format is not None:
            print_report(load_run(run_dir), report_format, view=view)
        else:
            write_report_md(load_run(run_dir))
    except OSError as e:  # report.md could not be written (a full disk): any table was printed
        print(f"specload: could not write report.md in {run_dir}: {e.strerror or e}", file=sys.stderr)
    status = read_run_meta(run_dir).status
    if status == RUN_COMPLETED and locust_code == 0:
        return SweepOutcome(EXIT_OK, run_dir, status)
    print(
        f"specload: sweep {status}; partial results in {run_dir} (`specload report {run_dir}`)",
        file=sys.stderr,
    )
    return SweepOutcome(EXIT_INCOMPLETE, run_dir, status)


def is_loopback(web_host: str) -> bool:
    """Whether a --web-host is reachable only from this machine (a name other than localhost is not)."""
    if web_host == "localhost":
        return True
    try:
        return ipaddress.ip_address(web_host.strip("[]")).is_loopback
    except ValueError:
        return False


def run_ui(s: SweepSettings, web_host: str, web_port: int, web_auth: bool = True) -> int:
    """Locust's web UI with every resolved scenario value in its start form; returns Locust's exit code.

    ``web_auth``: behind Locust's login page, with a token made for this run as the password (the
    child gets it in its environment; it is printed here once, and written nowhere). Without it,
    any page the operator's browser visits could start sweeps through the UI.
    """
    from specload.locust.options import option_flags, scenario_flags
    from specload.locust.websafety import LOGIN_PATH, PAGE, WEB_TOKEN_ENV, new_token

    sc, host = check_settings(s)
    s = auto_processes(s, sc)
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(s.locustfile),
        "--web-host",
        web_host,
        "--web-port",
        str(web_port),
        "--results-dir",
        s.out,
        *(["--web-login"] if web_auth else []),
        *(["--scenario", s.scenario_file] if s.scenario_file else []),
        *option_flags(scenario_flags(sc)),
        *(["--label", s.label] if s.label else []),
        *distribution_flags(s, web=True),
        *s.locust_args,
    ]
    url = f"http://{web_host}:{web_port}"
    env = locust_env(s, host)
    if web_auth:
        token = new_token()
        env[WEB_TOKEN_ENV] = token
        print(
            f"specload: web UI on {url}{PAGE} (Locust's own pages at {url}/); log in with any user name and "
            f"the password {token}"
        )
        print(f"specload: or open {url}{LOGIN_PATH}?token={token}")
        if not is_loopback(web_host):
            print(
                f"specload: WARNING: the web UI on {web_host} is plain HTTP: the password and the session travel "
                "unencrypted to anyone on the network path; reach it through an SSH tunnel "
                "(ssh -L 8089:127.0.0.1:8089) or a TLS proxy, and keep --web-host 127.0.0.1 (docs/deploy.md)",
                file=sys.stderr,
            )
    else:
        print(
            f"specload: WARNING: --no-web-auth: the web UI on {url} has NO login: anyone who can reach it, and "
            "any page your browser opens, can start sweeps with your API key; keep it behind your own "
            "authenticating proxy",
            file=sys.stderr,
        )
        print(f"specload: web UI on {url}{PAGE} (Locust's own pages at {url}/)")
    print(f"specload: each run goes to {s.out}/<label>-<time>/", flush=True)
    return run_locust(cmd, env)


def run_worker(
    master_host: str,
    master_port: int,
    processes: int | None,
    locust_args: Sequence[str] = (),
    locustfile: Path = DEFAULT_LOCUSTFILE,
) -> int:
    if why := token_problem(master_token()):
        print(f"specload: {why}", file=sys.stderr)
        return EXIT_USAGE
    if processes == PROCESSES_AUTO:  # (its levels are the master's: it cannot size itself)
        print(
            "specload: --processes auto is for the master's command; give a worker a count or -1",
            file=sys.stderr,
        )
        return EXIT_USAGE
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(locustfile),
        "--worker",
        "--master-host",
        master_host,
        "--master-port",
        str(master_port),
        *(["--processes", str(processes)] if processes is not None else []),
        *locust_args,
    ]
    return run_locust(cmd)
