"""A "specload levels" tab in Locust's web UI: each level's live progress, from the sweep owner.

Uses Locust's extended-tab mechanism (template args plus an ``extended_stats`` entry added to the
UI's regular ``/stats/requests`` poll), so no custom JavaScript is needed, and a CSV download.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Mapping
from typing import Any

from locust.runners import MasterRunner

from specload.clientcheck import cell
from specload.levels import LevelStatus
from specload.locust.options import check_form
from specload.locust.owner import SweepOwner
from specload.records import level_label

logger = logging.getLogger("specload")

_KEY = "specload-levels"
_COLUMNS = [
    ("level", "Level"), ("concurrency", "C"), ("phase", "Phase"), ("requests", "Requests"),
    ("ok", "Ok"), ("failed", "Fail"), ("short", "Short"), ("tokens", "Tokens"), ("agg_tok_s", "Agg tok/s"),
    ("client", "Client"),  # the load generator's own verdict (specload.clientcheck)
]  # fmt: skip


# Locust's page polls /stats/requests only while the state is "spawning" or "running": a poll that
# sees "cleanup" (a local runner stopping its users: in-flight requests get their grace period) or
# "stopping" (a master waiting for its workers) was its last, and the page stayed on CLEANUP until
# reloaded. Those states are shown as "running", so the page keeps polling until "stopped".
_STILL_RUNNING = {"cleanup": "running", "stopping": "running"}


def polled_state(state: Any) -> Any:
    """The runner state as Locust's page should see it (it must keep polling until "stopped")."""
    return _STILL_RUNNING.get(state, state)


def level_rows(owner: SweepOwner) -> list[dict[str, Any]]:
    ctrl = owner.ctrl
    if ctrl is None:
        return []
    rows = []
    for lv in ctrl.levels:
        budget = lv.plan.budget if lv.plan.budget is not None else "-"
        agg = lv.agg_tok_s()
        rows.append({
            "level": level_label(lv.plan.concurrency, lv.plan.repeat),
            "concurrency": lv.plan.concurrency,
            "phase": (lv.phase if lv.status in (LevelStatus.RUNNING, LevelStatus.PENDING) else lv.status).value,
            "requests": f"{lv.received}/{budget}",
            "ok": lv.ok, "failed": lv.failed, "short": lv.short, "tokens": lv.tokens,
            "agg_tok_s": "-" if agg is None else round(agg, 1),
            "client": cell(owner.client_figures(lv.plan.index)),
        })  # fmt: skip
    return rows


def start_refusal(environment: Any, owner: SweepOwner, form: Mapping[str, str]) -> str | None:
    """Why a start form submission (``POST /swarm``) must not start a run, or None. Checked before
    Locust applies the form, so a bad value starts nothing and the form shows the message."""
    if owner.active:
        return f"a sweep is running ({owner.run_dir}): stop it before starting another"
    runner = environment.runner
    if isinstance(runner, MasterRunner) and runner.worker_count == 0:
        return ("no Locust worker is ready: after a run, workers rest for the stop timeout "
                f"({environment.stop_timeout:g} s) before they take another; try again in a moment")  # fmt: skip
    return check_form(form, environment.parsed_options, owner.explicit, owner.launch)


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


def extend_web_ui(environment: Any, owner: SweepOwner) -> None:
    from flask import Response, request

    install_form_check(environment, owner)

    web_ui = environment.web_ui
    # Locust's start form lists its options in the order of the page's template args (Jinja's tojson
    # sorts keys by default): keep the order they were registered in (options.form_order).
    web_ui.app.jinja_env.policies["json.dumps_kwargs"] = {"sort_keys": False}
    web_ui.template_args["extended_tabs"] = [{"title": "specload levels", "key": _KEY}]
    web_ui.template_args["extended_tables"] = [
        {"key": _KEY, "structure": [{"key": k, "title": t} for k, t in _COLUMNS]}
    ]
    web_ui.template_args["extended_csv_files"] = [{"href": "./specload/levels.csv", "title": "specload levels (CSV)"}]

    @web_ui.app.after_request
    def _add_levels(response: Any) -> Any:
        if request.path == "/stats/requests" and response.is_json:
            data = response.get_json()
            data["extended_stats"] = [{"key": _KEY, "data": level_rows(owner)}]
            data["state"] = polled_state(data.get("state"))
            response.set_data(json.dumps(data))
        return response

    @web_ui.app.route("/specload/levels.csv")
    @web_ui.auth_required_if_enabled
    def _levels_csv() -> Any:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=[k for k, _ in _COLUMNS])
        writer.writeheader()
        writer.writerows(level_rows(owner))
        return Response(buf.getvalue(), mimetype="text/csv")

    @web_ui.app.route("/specload/run")
    @web_ui.auth_required_if_enabled
    def _run() -> Any:
        return {"run_dir": owner.run_dir, "active": owner.active, "status": owner.meta.status,
                "levels": level_rows(owner)}  # fmt: skip
