"""specload in Locust's web UI: a page of its own, checks on the start form, and a tab in Locust's page.

- **specload's page** (``/specload/``, the page a login lands on): a start form with specload's
  options in a sensible order (no users or ramp-up fields: the levels decide), the sweep live (the
  current level, its progress and time left, the requests in flight, every level's report figures
  so far, the streamed tok/s, the server's queue and the client's own verdict), charts against
  concurrency and over time, the runs of the results folder with their reports (rendered, and
  downloadable as markdown, CSV and JSON) and ``specload compare`` of any two or more. One small
  hand-written HTML/JS/CSS page shipped in the package (``webpage/``), no build step, no CDN: the
  machines that drive GPU servers are often offline. It reads the JSON routes below.
- **The start form's checks**: a ``before_request`` on Locust's ``/swarm`` (``start_refusal``).
- **Locust's own page**: a "specload levels" tab (Locust's extended-tab mechanism: template args
  plus an ``extended_stats`` entry on its ``/stats/requests`` poll), a CSV of it and a link to
  specload's page under Download Data; ``/stats/requests`` reports cleanup/stopping as running, so
  that page keeps polling until the run has stopped.

Every route is behind the web UI's login (``auth_required_if_enabled``) and its same-origin guard
(``websafety``). Documented Locust extension points only: routes on ``web_ui.app``, template args,
``before_request``/``after_request`` hooks.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gevent
import gevent.lock
from locust.runners import MasterRunner

import specload
from specload.analysis.clientcheck import ACTIVE_PHASES, cell
from specload.analysis.metrics import SERIES_BUCKET_S, SERIES_RECORDS, SERIES_STREAMED, LevelStats
from specload.analysis.streamed import apply_streamed, series_over
from specload.core.openfiles import open_files_problem
from specload.core.records import level_label
from specload.core.rundir import RECORDS, RUN_JSON, SERVER_SAMPLES, safe_name
from specload.core.text import MISSING, fmt_num
from specload.locust.offhub import off_hub
from specload.locust.options import (
    FORM_SOURCE,
    LABEL_DEST,
    RUN_OPTIONS,
    SEND_KEY_DEST,
    SEND_KEY_FLAG,
    check_form,
    form_order,
)
from specload.locust.owner import SweepOwner
from specload.locust.websafety import PAGE
from specload.present.acceptview import live_figures
from specload.present.charts import RunLines, acceptance_over_time, server_chart
from specload.present.liverow import live_charts, live_columns, live_row
from specload.present.webview import NoSuchRun, list_runs, run_path
from specload.sweep.levels import LevelStatus
from specload.workload.config import FIELDS, ScenarioError, parse_levels
from specload.workload.recorded import recorded_scenario

logger = logging.getLogger("specload")

_ASSETS = Path(__file__).resolve().parent / "webpage"
_KEY = "specload-levels"
# Locust's "specload levels" tab: the level and its progress, the figure table's live columns, the client.
_PROGRESS = [
    ("level", "Level"),
    ("concurrency", "C"),
    ("phase", "Phase"),
    ("requests", "Requests"),
    ("ok", "Ok"),
    ("failed", "Fail"),
    ("short", "Short"),
    ("tokens", "Tokens"),
]


def _columns() -> list[tuple[str, str]]:
    return [*_PROGRESS, *((c["field"], c["header"]) for c in live_columns()), ("client", "Client")]


# specload's page shows the runner's state in four words: the run can be started, is running, is
# winding down (in-flight requests get their grace period), or has stopped.
_PAGE_STATE = {
    "ready": "ready",
    "init": "running",
    "spawning": "running",
    "running": "running",
    "cleanup": "stopping",
    "stopping": "stopping",
    "stopped": "stopped",
    "missing": "stopped",
}
_DOWNLOADS = {"md": "text/markdown", "csv": "text/csv", "json": "application/json", "html": "text/html"}


def level_rows(owner: SweepOwner) -> list[dict[str, Any]]:
    """Locust's tab: per level its progress (the controller's counts) and its live figures as the
    web page shows them (``_level_live``: the report's own, over the records so far), as text."""
    ctrl = owner.ctrl
    if ctrl is None:
        return []
    now = time.time()
    rows = []
    for lv in ctrl.levels:
        budget = lv.plan.budget if lv.plan.budget is not None else "-"
        live = _level_live(owner, lv.plan.index, now)
        phase = lv.phase if lv.status in (LevelStatus.RUNNING, LevelStatus.PENDING) else lv.status
        row: dict[str, Any] = {
            "level": live["label"],
            "concurrency": lv.plan.concurrency,
            "phase": phase.value,
            "requests": f"{lv.received}/{budget}",
            **{k: live[k] for k in ("ok", "failed", "short", "tokens", "client")},
        }
        for c in live_columns():
            v = live.get(c["field"])
            row[c["field"]] = (
                (v or MISSING) if c["text"] else fmt_num(None if v is None else v * c["scale"], c["digits"])
            )
        rows.append(row)
    return rows


# Locust's page polls /stats/requests only while the state is "spawning" or "running": a poll that
# sees "cleanup" (a local runner stopping its users: in-flight requests get their grace period) or
# "stopping" (a master waiting for its workers) was its last, and the page stayed on CLEANUP until
# reloaded. Those states are shown as "running", so the page keeps polling until "stopped".
_STILL_RUNNING = {"cleanup": "running", "stopping": "running"}


def polled_state(state: Any) -> Any:
    """The runner state as Locust's page should see it (it must keep polling until "stopped")."""
    return _STILL_RUNNING.get(state, state)


# ---------------------------------------------------------------- the start form


def start_refusal(environment: Any, owner: SweepOwner, form: Mapping[str, str]) -> str | None:
    """Why a start form submission (``POST /swarm``) must not start a run, or None. Checked before
    Locust applies the form, so a bad value starts nothing and the form shows the message."""
    if owner.active:
        return f"a sweep is running ({owner.run_dir}): stop it before starting another"
    busy = _workers_busy(environment)
    if busy:
        return busy
    return check_form(form, environment.parsed_options, owner.explicit, owner.launch) or _files_refusal(
        environment, form
    )


def _files_refusal(environment: Any, form: Mapping[str, str]) -> str | None:
    """The command line's open-files check (specload.core.openfiles) for the form's levels: users in
    this process may raise its soft limit up to the hard one, as the CLI does; local worker
    processes already run with the soft limit they were started with."""
    raw = form.get("levels") or getattr(environment.parsed_options, "levels", None)
    if not raw or (form.get("rates") or "").strip():
        return None
    try:
        levels = parse_levels(FORM_SOURCE, raw, "Levels")
    except ScenarioError:
        return None  # check_form says what is wrong with it
    runner = environment.runner
    master = isinstance(runner, MasterRunner)
    why = open_files_problem(max(levels), max(1, runner.worker_count) if master else 1, raise_soft=not master)
    return None if why is None else f"{FORM_SOURCE}: field 'Levels': {why}"


def _workers_busy(environment: Any) -> str | None:
    runner = environment.runner
    if isinstance(runner, MasterRunner) and runner.worker_count == 0:
        return (
            "no Locust worker is ready: after a run, workers rest for the stop timeout "
            f"({environment.stop_timeout:g} s) before they take another; try again in a moment"
        )
    return None


def install_form_check(environment: Any, owner: SweepOwner) -> None:
    """Validate the start form before Locust's ``/swarm`` applies it: a refusal is Locust's own
    ``{"success": false, "message": ...}`` answer, which its form (and specload's) shows; nothing
    starts and ``parsed_options`` keep their values."""
    from flask import jsonify, request
    from flask_login import current_user

    web_ui = environment.web_ui

    @web_ui.app.before_request
    def _check_start_form() -> Any:
        if request.method != "POST" or request.endpoint != "locust.swarm":
            return None
        if web_ui.web_login and not current_user.is_authenticated:
            return None  # the view itself sends the caller to the login page
        message = start_refusal(environment, owner, request.form)
        if message is None:
            return None
        logger.info("start refused: %s", message)
        return jsonify({"success": False, "message": message, "host": environment.host})


def form_fields(environment: Any) -> list[dict[str, Any]]:
    """specload's start form: the host, then every option in ``form_order`` with its current value
    (the launch values, then the last run's), then the confirmation for the API key."""
    opts = environment.parsed_options
    run_help = {o[0]: o[3] for o in RUN_OPTIONS}
    specs = {s.dest: s for s in FIELDS.values() if s.flag}
    fields: list[dict[str, Any]] = [
        {
            "name": "host",
            "label": "Host",
            "kind": "text",
            "value": environment.host or "",
            "group": "main",
            "help": "The server's URL, e.g. http://gpu-box:30000",
        }
    ]
    for i, dest in enumerate(form_order()):
        value = getattr(opts, dest, None)
        group = "main" if i < form_order().index(LABEL_DEST) + 1 else "more"
        if dest == LABEL_DEST:
            fields.append(
                {
                    "name": dest,
                    "label": "Label",
                    "kind": "text",
                    "value": value or "",
                    "help": run_help[LABEL_DEST],
                    "group": group,
                }
            )
            continue
        spec = specs[dest]
        kind = "choice" if spec.choices else ("number" if spec.option_type in (int, float) else "text")
        fields.append(
            {
                "name": dest,
                "label": spec.label,
                "kind": kind,
                "help": spec.help,
                "group": group,
                "value": "" if value is None else value,
                "choices": list(spec.choices or []),
            }
        )
    fields.append(
        {
            "name": SEND_KEY_DEST,
            "label": "Send key to new host",
            "kind": "checkbox",
            "value": False,
            "group": "more",
            "help": f"Send the API key to a Host other than the one specload was started for ({SEND_KEY_FLAG}); "
            "counts for this run only",
        }
    )
    return fields


# ---------------------------------------------------------------- the sweep, live


def _r(v: float | None, digits: int = 1) -> float | None:
    return None if v is None else round(v, digits)


def _level_live(owner: SweepOwner, index: int, now: float) -> dict[str, Any]:
    assert owner.ctrl is not None
    lv = owner.ctrl.levels[index]
    p = lv.plan
    running = lv.status == LevelStatus.RUNNING
    final = lv.status in (LevelStatus.COMPLETED, LevelStatus.INCOMPLETE) or not owner.active
    s: LevelStats | None = None
    streamed = None
    if owner.live is not None:
        s = owner.live.stats(index, p.concurrency, p.repeat, lv.status.value, final, now, p.rate)
        if running and lv.phase in ACTIVE_PHASES:
            streamed = owner.live.streamed_rate(index)
    fig = owner.client_figures(index)
    flag = fig.flag() if fig is not None else None
    return {
        **live_row(
            s
        ),  # every figure of the table, as the report has it (the counts below are the controller's)
        "index": index,
        "label": level_label(p.concurrency, p.repeat, p.rate),
        "concurrency": p.concurrency,
        "rate": p.rate,
        "repeat": p.repeat,
        "status": lv.status.value,
        "phase": lv.phase.value if running else lv.status.value,
        "done": lv.received,
        "budget": p.budget,
        "granted": lv.granted,
        "in_flight": lv.in_flight if running else 0,
        "ok": lv.ok,
        "failed": lv.failed,
        "short": lv.short,
        "tokens": lv.tokens,
        "live_tok_s": _r(streamed),
        "client": cell(fig),
        "client_flag": flag,
        "final": final,
        # why requests failed
        "reasons": sorted(s.reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:3] if s is not None else [],
        # acceptance, reasoning, categories (present.acceptview; drawn by webpage/accept.js)
        **live_figures(s),
        # before the first record: the controller's own count over the level's time so far
        **({"agg_tok_s": _r(lv.agg_tok_s())} if s is None else {}),
    }


def _progress(owner: SweepOwner, now: float) -> dict[str, Any] | None:
    """The current level: where it is, how far, and about how long it has left."""
    ctrl = owner.ctrl
    lv = ctrl.current if ctrl is not None and owner.active else None
    if ctrl is None or lv is None:
        return None
    p = lv.plan
    started = lv.t_measure_start
    elapsed = now - started if started is not None else None
    left = None
    if elapsed is not None and p.duration_s is not None:
        left = max(0.0, p.duration_s - elapsed)
    elif elapsed is not None and p.budget is not None and lv.received > 0 and elapsed > 0:
        left = (p.budget - lv.received) / (lv.received / elapsed)
    return {
        "index": p.index,
        "levels": len(ctrl.levels),
        "label": level_label(p.concurrency, p.repeat, p.rate),
        "rate": p.rate,
        "concurrency": p.concurrency,
        "phase": lv.phase.value,
        "done": lv.received,
        "budget": p.budget,
        "duration_s": p.duration_s,
        "elapsed_s": _r(elapsed),
        "left_s": _r(left),
        "in_flight": lv.in_flight,
        "warmup": p.warmup,
        "warmup_done": lv.received_warmup,
    }


def _series(owner: SweepOwner, levels: list[dict[str, Any]], now: float) -> dict[str, Any] | None:
    """tok/s over time of the current level, else of the last level with records: both from the
    streamed-token samples the owner keeps and writes to streamed.jsonl, by the function the report
    uses (specload.analysis.streamed), so the chart keeps its resolution and its prefill stalls
    once the level ends and equals ``report --plot``. A running level's series spans its samples so
    far; an ended one's spans its measured requests (first send to last end), as the report's.
    From the records (each request's tokens spread evenly) only for a level without samples."""
    ctrl, live = owner.ctrl, owner.live
    if ctrl is None or live is None:
        return None
    streams = owner.recorder.streams.samples
    cur = ctrl.current if owner.active else None
    if cur is not None and cur.phase in ACTIVE_PHASES:
        got = streams.get(cur.plan.index, [])
        values = series_over(got, (got[0].t, got[-1].t)) if len(got) >= 2 else []
        return _series_row(
            cur.plan,
            level_label(cur.plan.concurrency, cur.plan.repeat, cur.plan.rate),
            values,
            SERIES_STREAMED,
            True,
        )
    for row in reversed(levels):
        lv = ctrl.levels[row["index"]]
        s = live.stats(
            row["index"], lv.plan.concurrency, lv.plan.repeat, lv.status.value, True, now, lv.plan.rate
        )
        if s is None:
            continue
        apply_streamed([s], streams)
        if s.tok_s_series:
            return _series_row(lv.plan, row["label"], s.tok_s_series, s.tok_s_series_source or SERIES_RECORDS)
    return None


def _series_row(
    plan: Any, label: str, values: list[float], source: str, running: bool = False
) -> dict[str, Any]:
    return {
        "label": label,
        "running": running,
        "concurrency": plan.concurrency,
        "rate": plan.rate,
        "source": source,
        "points": [[round((i + 0.5) * SERIES_BUCKET_S, 2), round(v, 1)] for i, v in enumerate(values)],
    }


def live_payload(environment: Any, owner: SweepOwner) -> dict[str, Any]:
    now = time.time()
    runner = environment.runner
    raw = getattr(runner, "state", "missing")
    state = _PAGE_STATE.get(raw, raw)
    master = isinstance(runner, MasterRunner)
    out: dict[str, Any] = {
        "state": state,
        "locust_state": raw,
        "active": owner.active,
        "failure": owner.failure,
        "mode": "master" if master else "local",
        "workers": runner.worker_count if master else None,
        "start_blocked": (
            f"a sweep is running ({owner.run_dir})" if owner.active else _workers_busy(environment)
        ),
        "run": None,
        "current": None,
        "levels": [],
        "server_now": None,
        "series": None,
        "columns": live_columns(),
        "charts": live_charts(),
    }
    if owner.run_dir is None or owner.ctrl is None:
        return out
    m = owner.meta
    sc = recorded_scenario(m)
    out["run"] = {
        "run_dir": owner.run_dir,
        "name": os.path.basename(owner.run_dir),
        "label": m.label,
        "status": m.status,
        "reason": m.reason,
        "host": m.host,
        "backend": m.backend,
        "model": m.model,
        "scenario": sc.name if sc else None,
        "scenario_file": m.scenario_file,
        "input_tokens": sc.input_tokens if sc else None,
        "output_tokens": sc.output_tokens if sc else None,
        "levels": sc.levels if sc else None,
        "rates": sc.rates if sc else None,
        "started_at": m.started_at,
        "ended_at": m.ended_at,
        "simulated": m.simulated,
        "server_metrics": m.server_metrics,
        "report": owner.complete,
    }
    levels = [_level_live(owner, lv.plan.index, now) for lv in owner.ctrl.levels]
    out["levels"] = levels
    out["current"] = _progress(owner, now)
    latest = owner.live.latest_sample if owner.live is not None else None
    if latest is not None and owner.active:
        out["server_now"] = {"running": latest.running, "queued": latest.queued, "age_s": _r(now - latest.t)}
    out["series"] = _series(owner, levels, now)
    out["server_series"] = _server_series(owner)
    return out


SERVER_POINTS = 600  # the server charts' points at most (every n-th sample of a long run)


def _server_series(owner: SweepOwner) -> dict[str, Any] | None:
    """The server's running and queued requests and the acceptance length over the run, from its
    /metrics samples: the HTML report's charts (specload.present.charts), the same points."""
    live = owner.live
    if live is None or len(live.samples) < 2:
        return None
    step = max(1, len(live.samples) // SERVER_POINTS)
    samples = live.samples[::step]
    lines = RunLines("", [], samples)
    out: dict[str, Any] = {}
    for chart in (server_chart([lines]), acceptance_over_time([lines])):
        out[chart.key] = {
            s.name: [
                [round(x, 1), None if y is None else round(y, 3)] for x, y in zip(s.xs, s.ys, strict=True)
            ]
            for s in chart.series
        }
    return out


# ---------------------------------------------------------------- reports and comparisons

# The runs list's answer, at the latest: a results folder on a hung file system costs the page its
# list, never the sweep.
RUNS_DEADLINE_S = 10.0


class Bundles:
    """Reports and comparisons made by ``python -m specload.present.webview`` in a child process (reading a
    big run takes seconds of CPU: not the Locust process's, which may be driving a sweep), kept
    while the run directories are unchanged."""

    MAX = 16

    def __init__(self) -> None:
        self._cache: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._locks: dict[tuple[Any, ...], gevent.lock.Semaphore] = {}

    @staticmethod
    def _stamp(run_dir: Path) -> tuple[Any, ...]:
        out: list[Any] = [str(run_dir)]
        for name in (RUN_JSON, RECORDS, SERVER_SAMPLES):
            try:
                st = (run_dir / name).stat()
                out += [st.st_mtime_ns, st.st_size]
            except OSError:
                out += [None, None]
        return tuple(out)

    def get(self, kind: str, run_dirs: list[Path]) -> dict[str, Any]:
        key = (kind, *(self._stamp(d) for d in run_dirs))
        lock = self._locks.setdefault(key, gevent.lock.Semaphore())
        with lock:  # one child per bundle, however many tabs ask at once
            if key not in self._cache:
                self._cache[key] = self._make(kind, run_dirs)
                while len(self._cache) > self.MAX:
                    del self._cache[next(iter(self._cache))]
        self._locks.pop(key, None)
        return self._cache[key]

    @staticmethod
    def _make(kind: str, run_dirs: list[Path]) -> dict[str, Any]:
        pkg_root = str(Path(specload.__file__).resolve().parent.parent)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (pkg_root, os.environ.get("PYTHONPATH")) if p),
        }
        cmd = [sys.executable, "-m", "specload.present.webview", kind, *map(str, run_dirs)]
        try:
            done = subprocess.run(cmd, capture_output=True, timeout=600, env=env)
            out = json.loads(done.stdout or b"{}")
        except (OSError, ValueError, subprocess.TimeoutExpired) as e:
            return {"error": f"could not make the {kind}: {e}"}
        if done.returncode != 0 and "error" not in out:
            out = {"error": (done.stderr.decode("utf-8", "replace")[-500:] or f"exit code {done.returncode}")}
        return out


# ---------------------------------------------------------------- wiring


def json_errors(view: Callable[..., Any]) -> Callable[..., Any]:
    """``view``, whose refusals (``abort``) and failures answer as JSON ``{"error": ...}`` with their
    status: never as HTML, and never through Locust's handler, which echoes a message unescaped."""
    from flask import jsonify
    from werkzeug.exceptions import HTTPException

    @functools.wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return view(*args, **kwargs)
        except HTTPException as e:
            return jsonify({"error": e.description or e.name}), e.code or 500
        except Exception as e:
            logger.exception("specload web UI: %s failed", getattr(view, "__name__", "a view"))
            return jsonify({"error": f"internal error ({type(e).__name__}); see the log"}), 500

    return wrapper


def extend_web_ui(environment: Any, owner: SweepOwner) -> None:
    from flask import Response, abort, jsonify, request, send_from_directory

    install_form_check(environment, owner)
    web_ui = environment.web_ui
    app = web_ui.app
    # Locust's start form lists its options in the order of the page's template args (Jinja's tojson
    # sorts keys by default): keep the order they were registered in (options.form_order).
    app.jinja_env.policies["json.dumps_kwargs"] = {"sort_keys": False}
    app.json.sort_keys = False  # (and our JSON in the order it is built)
    web_ui.template_args["extended_tabs"] = [{"title": "specload levels", "key": _KEY}]
    web_ui.template_args["extended_tables"] = [
        {"key": _KEY, "structure": [{"key": k, "title": t} for k, t in _columns()]}
    ]
    web_ui.template_args["extended_csv_files"] = [
        {"href": "./specload/levels.csv", "title": "specload levels (CSV)"},
        {"href": "./specload/", "title": "specload's view: live charts, reports, compare"},
    ]

    def auth(view: Callable[..., Any]) -> Callable[..., Any]:
        """Locust's login check around ``view``, whose errors leave as JSON: the check turns any
        exception that reaches it into an HTML page with the message unescaped (a reflected script)."""
        return web_ui.auth_required_if_enabled(json_errors(view))

    bundles = Bundles()

    def results_dir() -> str:
        return getattr(environment.parsed_options, "results_dir", None) or "results"

    def run_dir_of(name: str) -> Path:
        try:
            path = run_path(results_dir(), name)
        except NoSuchRun as e:
            abort(404, str(e))
        return path

    def download(text: str, fmt: str, filename: str) -> Any:
        filename = safe_name(filename)
        return Response(
            text,
            mimetype=_DOWNLOADS[fmt],
            headers={"Content-Disposition": f'attachment; filename="{filename}"'},
        )

    @app.after_request
    def _add_levels(response: Any) -> Any:
        if request.path == "/stats/requests" and response.is_json:
            data = response.get_json()
            data["extended_stats"] = [{"key": _KEY, "data": level_rows(owner)}]
            data["state"] = polled_state(data.get("state"))
            response.set_data(json.dumps(data))
        return response

    @app.route(PAGE)
    @auth
    def _page() -> Any:
        response = send_from_directory(_ASSETS, "index.html")
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.route("/specload/static/<path:name>")
    @auth
    def _asset(name: str) -> Any:
        return send_from_directory(_ASSETS, name)

    @app.route("/specload/form")
    @auth
    def _form() -> Any:
        opts = environment.parsed_options
        return jsonify(
            {
                "fields": form_fields(environment),
                "scenario_file": getattr(opts, "scenario", "") or None,
                "results_dir": results_dir(),
            }
        )

    @app.route("/specload/live")
    @auth
    def _live() -> Any:
        return jsonify(live_payload(environment, owner))

    @app.route("/specload/levels.csv")
    @auth
    def _levels_csv() -> Any:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=[k for k, _ in _columns()])
        writer.writeheader()
        writer.writerows(level_rows(owner))
        return Response(buf.getvalue(), mimetype="text/csv")

    @app.route("/specload/run")
    @auth
    def _run() -> Any:
        return {
            "run_dir": owner.run_dir,
            "active": owner.active,
            "status": owner.meta.status,
            "levels": level_rows(owner),
        }

    @app.route("/specload/runs")
    @auth
    def _runs() -> Any:
        active = os.path.basename(owner.run_dir) if owner.active and owner.run_dir else None
        try:
            runs = off_hub(list_runs, results_dir(), timeout=RUNS_DEADLINE_S)
        except gevent.Timeout:
            return jsonify({"error": f"the results folder was not listed within {RUNS_DEADLINE_S:g} s"}), 503
        return jsonify({"results_dir": results_dir(), "active": active, "runs": runs})

    @app.route("/specload/runs/<name>/report")
    @auth
    def _report(name: str) -> Any:
        path = run_dir_of(name)
        if owner.active and owner.run_dir and path == Path(owner.run_dir).resolve():
            return jsonify({"error": "this run is still going: its report is made when it ends"}), 409
        bundle = bundles.get("report", [path])
        return jsonify({k: v for k, v in bundle.items() if k not in ("json", "csv", "html")}), (
            500 if "error" in bundle else 200
        )

    @app.route("/specload/runs/<name>/report.<fmt>")
    @auth
    def _report_file(name: str, fmt: str) -> Any:
        if fmt not in _DOWNLOADS:
            abort(404)
        path = run_dir_of(name)
        bundle = bundles.get("report", [path])
        if "error" in bundle:
            return jsonify(bundle), 500
        return download(bundle["markdown" if fmt == "md" else fmt], fmt, f"{name}-report.{fmt}")

    def compared() -> tuple[list[str], dict[str, Any]]:
        names = request.args.getlist("run")
        if len(names) < 2:
            abort(400, "choose at least two runs (the first is the baseline)")
        return names, bundles.get("compare", [run_dir_of(n) for n in names])

    @app.route("/specload/compare")
    @auth
    def _compare() -> Any:
        _names, bundle = compared()
        return jsonify(
            {k: v for k, v in bundle.items() if k not in ("json", "csv", "png", "html")}
            | {"plot": bundle.get("png") is not None}
        ), (500 if "error" in bundle else 200)

    @app.route("/specload/compare.<fmt>")
    @auth
    def _compare_file(fmt: str) -> Any:
        names, bundle = compared()
        if "error" in bundle:
            return jsonify(bundle), 500
        stem = "compare-" + "-vs-".join(names)
        if fmt == "png":
            if not bundle.get("png"):
                abort(404, bundle.get("plot_note") or "no plot")
            import base64

            return Response(base64.b64decode(bundle["png"]), mimetype="image/png")
        if fmt not in _DOWNLOADS:
            abort(404)
        return download(bundle["markdown" if fmt == "md" else fmt], fmt, f"{stem}.{fmt}")
