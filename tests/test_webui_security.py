"""The web UI is safe to leave open in a browser: a login with a per-run token, no orders from another
site's page, and the API key only for the host the run was started with (or one the user confirmed).

Real processes: two simulators that demand the same API key (the one `specload ui` was started for,
and another one a form could name), and `specload ui` itself, driven over HTTP as a browser (or a
web page the operator happens to visit) would. The fast checks of the pieces come first.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from argparse import Namespace
from collections.abc import Iterator
from dataclasses import dataclass
from http.cookiejar import CookieJar
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from specload.client.http import base_headers, key_may_go_to
from specload.locust.protocol import RunConfig
from specload.locust.websafety import allowed_sites, foreign_origin
from specload.sim.process import SimProcess, start_sim
from specload.workload.config import Scenario
from specload.workload.prompts import PromptSource
from tests.conftest import REPO, Procs, free_port, launch_ui, wait_until

FAST = ("--ttft-ms", "20", "--itl-ms", "5", "--model", "m")
SWEEP = ("--levels", "1", "--requests-per-level", "2", "--input-tokens", "16", "--output-tokens", "16")
EVIL = "http://evil.example"

# pieces ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "foreign"),
    [
        (None, None),  # no browser: the login alone decides
        ("http://127.0.0.1:8089", None),
        ("http://127.0.0.1:8089/some/page?x=1", None),  # a Referer
        ("https://127.0.0.1:8089", None),  # the scheme is not compared (a TLS proxy in front)
        ("http://evil.example", "http://evil.example"),
        ("http://127.0.0.1:8090", "http://127.0.0.1:8090"),  # same machine, another port: another site
        ("http://localhost:8089", "http://localhost:8089"),  # another name for it: not the page's own
        ("null", "null"),  # a sandboxed frame or a file:// page
    ],
)
def test_foreign_origin(source: str | None, foreign: str | None) -> None:
    assert foreign_origin(source, "127.0.0.1:8089") == foreign


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("127.0.0.1:8089", True),
        ("[::1]:8089", True),
        ("localhost:8089", True),
        ("10.0.0.5", True),
        ("evil.example:8089", False),
        ("127.0.0.1.evil.example:8089", False),
        ("ui.corp.example", True),  # allowed
    ],
)
def test_the_host_must_name_the_web_ui(host: str, ok: bool) -> None:
    from specload.locust.websafety import allowed_sites, host_allowed

    assert host_allowed(host, allowed_sites("https://ui.corp.example")) is ok


def test_default_ports_and_allowed_origins() -> None:
    assert foreign_origin("https://ui.example", "ui.example:443") is None
    assert foreign_origin("http://UI.example", "ui.example") is None
    sites = allowed_sites(" https://proxy.example , other.example:8443,")
    assert sites == {"proxy.example", "other.example:8443"}
    assert foreign_origin("https://proxy.example", "127.0.0.1:8089", sites) is None
    assert foreign_origin("https://proxy.example:444", "127.0.0.1:8089", sites) == "https://proxy.example:444"


def test_the_key_goes_only_to_the_launch_host_unless_confirmed() -> None:
    launched = "http://gpu-box:30000"
    assert key_may_go_to("http://gpu-box:30000/", launched, False)
    assert key_may_go_to("http://user:pw@GPU-box:30000/v1-proxy", launched, False)  # same server
    assert not key_may_go_to("http://gpu-box:30001", launched, False)
    assert not key_may_go_to("https://gpu-box:30000", launched, False)
    assert not key_may_go_to("http://evil.example:30000", launched, False)
    assert not key_may_go_to("http://gpu-box:30000", None, False)  # launched without a host
    assert key_may_go_to("http://evil.example:30000", launched, True)
    assert key_may_go_to("http://gpu-box", "http://gpu-box:80", False)


def test_headers_leave_the_key_out_when_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECLOAD_API_KEY", "sk-x")
    assert base_headers(stream=True)["Authorization"] == "Bearer sk-x"
    assert "Authorization" not in base_headers(stream=True, send_key=False)


def test_the_decision_travels_in_the_run_config_and_the_key_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECLOAD_API_KEY", "sk-secret")
    cfg = RunConfig(Scenario(), "m", "http://h:1", PromptSource("text", "test"), False, send_key=False)
    wire = cfg.to_wire()
    assert RunConfig.from_wire(wire).send_key is False
    assert RunConfig.from_wire({**wire, "send_key": True}).send_key is True
    assert "sk-secret" not in repr(wire)
    del wire["send_key"]
    assert RunConfig.from_wire(wire).send_key is False  # an owner that said nothing: no key


def test_owner_decides_and_says_so() -> None:
    # The owner imports Locust, which monkey-patches the whole process: checked in a child Python.
    code = "from tests.test_webui_security import owner_check; owner_check(); print('ok')"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


def owner_check() -> None:
    """The owner's decision, and what it logs (in a child Python, by the test above)."""
    import io

    from specload.locust.owner import SweepOwner

    os.environ["SPECLOAD_API_KEY"] = "sk-secret"
    log = io.StringIO()
    logging.getLogger("specload").addHandler(logging.StreamHandler(log))
    opts = Namespace(host="http://launch:1", send_key_to_new_host=False)
    owner = SweepOwner(SimpleNamespace(parsed_options=opts, runner=None, host=opts.host))
    opts.host = "http://other:2"  # what the web form's /swarm does to parsed_options
    assert owner._send_key("http://launch:1/") is True
    assert not log.getvalue()
    assert owner._send_key("http://u:pw@other:2") is False
    text = log.getvalue()
    assert "NOT sent to http://other:2" in text and "started for http://launch:1" in text, text
    assert "pw" not in text and "sk-secret" not in text
    opts.send_key_to_new_host = True
    assert owner._send_key("http://other:2") is True
    assert "goes to http://other:2, as confirmed" in log.getvalue()


# real processes ----------------------------------------------------------------------------------


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_args: Any, **_kwargs: Any) -> None:
        return None  # a 302 to the login page is an answer to check, not to follow


@dataclass
class Reply:
    status: int
    headers: Any
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


class Browser:
    """An HTTP client with its own cookies (a session), as one browser tab would be."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(CookieJar()), _NoRedirect
        )

    def call(self, path: str, form: dict[str, str] | None = None, **headers: str) -> Reply:
        data = None if form is None else urllib.parse.urlencode(form).encode()
        req = urllib.request.Request(self.base + path, data=data, headers=headers)
        try:
            with self.opener.open(req, timeout=10) as resp:
                return Reply(resp.status, resp.headers, resp.read())
        except urllib.error.HTTPError as e:
            return Reply(e.code, e.headers, e.read())

    def post(self, path: str, form: dict[str, str], origin: str | None = "own") -> Reply:
        """A POST as the UI's own page sends it (its Origin), or as ``origin``'s page would; None: curl."""
        headers = {} if origin is None else {"Origin": self.base if origin == "own" else origin}
        return self.call(path, form, **headers)

    def login(self, token: str) -> None:
        reply = self.post("/specload/login", {"username": "me", "password": token})
        assert reply.status == 302 and reply.headers["Location"].endswith("/"), reply
        assert self.call("/").status == 200


def _prompt_tokens(server: SimProcess) -> int:
    """The simulator's admitted-prompt-token counter: it moves only when a generation was served."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    m = re.search(r"^sglang:prompt_tokens_total\{[^}]*\} (\d+)", text, re.M)
    assert m, text
    return int(m.group(1))


@dataclass
class UI:
    proc: Any
    procs: Procs
    base: str
    token: str
    key: str
    home: SimProcess  # the host `specload ui` was started for
    other: SimProcess  # another server a form could name (same key demanded)
    out: Path

    def log(self) -> str:
        return self.procs.log(self.proc)

    def form(self, host: str, **extra: str) -> dict[str, str]:
        return {
            "host": host,
            "levels": "1",
            "requests_per_level": "2",
            "user_count": "1",
            "spawn_rate": "1",
            **extra,
        }

    def run_dirs(self) -> list[str]:
        return sorted(os.listdir(self.out)) if self.out.exists() else []

    def wait_stopped(self, b: Browser) -> None:
        wait_until(lambda: b.call("/stats/requests").json()["state"] == "stopped", 30, "Locust to stop")


def start_ui(
    procs: Procs, home: SimProcess, out: Path, key: str, *extra: str, sigint: Any = signal.SIG_DFL
) -> tuple[Any, str]:
    """``specload ui`` for ``home`` on a free port, its web UI up; ``sigint``: its SIGINT
    disposition at start (SIG_IGN: as a script's ``&`` starts it). The process and its base URL."""
    return launch_ui(
        procs,
        home.url,
        free_port(),
        out,
        *SWEEP,
        *extra,
        env={"SPECLOAD_API_KEY": key},
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
        login=False,
    )


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UI]:
    key = f"sk-specload-{secrets.token_hex(16)}"
    procs, sims = Procs(), []
    try:
        sims = [start_sim([*FAST, "--api-key", key]) for _ in range(2)]
        out = tmp_path_factory.mktemp("webui") / "results"
        proc, base = start_ui(procs, sims[0], out, key)
        m = re.search(r"password (\S+)", procs.log(proc))
        assert m, procs.log(proc)
        yield UI(proc, procs, base, m.group(1), key, sims[0], sims[1], out)
    finally:
        procs.stop_all()
        for s in sims:
            s.stop()


def test_without_the_token_nothing_is_served_and_nothing_starts(ui: UI) -> None:
    before = _prompt_tokens(ui.home)
    b = Browser(ui.base)
    pages = (
        "/",
        "/specload/run",
        "/stats/requests",
        "/specload/",
        "/specload/static/app.js",
        "/specload/form",
        "/specload/live",
        "/specload/runs",
        "/specload/runs/x/report",
        "/specload/runs/x/report.json",
        "/specload/compare?run=a&run=b",
        "/specload/compare.png?run=a&run=b",
        "/specload/levels.csv",
    )
    for path in pages:
        reply = b.call(path)
        assert reply.status == 302 and "/login" in reply.headers["Location"], (path, reply)
    for origin in ("own", None):  # the UI's own page before logging in, and curl
        reply = b.post("/swarm", ui.form(ui.home.url), origin=origin)
        assert reply.status == 302 and "/login" in reply.headers["Location"], reply
    reply = b.post("/specload/login", {"username": "specload", "password": "not-the-token"})
    assert reply.status == 302 and "/login" in reply.headers["Location"]
    assert b.call("/").status == 302  # still out
    assert b.call("/specload/login?token=nope").status == 302 and b.call("/").status == 302
    time.sleep(1.5)  # a sweep would have asked the server for its model by now
    assert _prompt_tokens(ui.home) == before
    assert ui.run_dirs() == []


def test_with_the_token_a_sweep_runs(ui: UI) -> None:
    b = Browser(ui.base)
    b.login(ui.token)
    by_url = Browser(ui.base)  # the printed one-click URL logs in too
    assert by_url.call(f"/specload/login?token={ui.token}").status == 302 and by_url.call("/").status == 200
    dirs = ui.run_dirs()
    assert b.post("/swarm", ui.form(ui.home.url)).json()["success"]
    run = wait_until(
        lambda: (r := b.call("/specload/run").json())["status"] == "completed" and r, 60, "the sweep"
    )
    assert run["levels"][0]["ok"] == 2
    assert len(ui.run_dirs()) == len(dirs) + 1
    ui.wait_stopped(b)


XSS_NAME = urllib.parse.quote("<img src=x onerror=alert(1)>", safe="")


def test_a_name_echoed_in_an_error_is_json_never_html(ui: UI) -> None:
    b = Browser(ui.base)
    b.login(ui.token)
    for path in (
        f"/specload/runs/{XSS_NAME}/report",
        f"/specload/runs/{XSS_NAME}/report.md",
        f"/specload/compare?run={XSS_NAME}&run=b",
        "/specload/compare?run=only-one",
    ):
        reply = b.call(path)
        assert reply.status in (400, 404), (path, reply)
        assert reply.headers["Content-Type"].startswith("application/json"), (path, reply.headers)
        assert "error" in reply.json(), (path, reply.body)  # the name, if echoed, is a JSON string
        assert reply.headers["X-Content-Type-Options"] == "nosniff"
        assert "default-src 'none'" in reply.headers["Content-Security-Policy"]
        assert "sandbox" in reply.headers["Content-Security-Policy"]


def test_every_response_says_nosniff_and_what_may_run(ui: UI) -> None:
    b = Browser(ui.base)
    b.login(ui.token)
    policies = {}
    for path in ("/", "/specload/", "/specload/static/app.js", "/specload/runs", "/specload/levels.csv"):
        reply = b.call(path)
        assert reply.status == 200, (path, reply)
        assert reply.headers["X-Content-Type-Options"] == "nosniff", path
        policies[path] = reply.headers["Content-Security-Policy"]
    assert (
        "script-src 'self';" in policies["/specload/"]
        and "unsafe-inline" not in policies["/specload/"].split("style-src")[0]
    )
    assert "frame-ancestors 'none'" in policies["/"]  # Locust's own page
    for data in ("/specload/static/app.js", "/specload/runs", "/specload/levels.csv"):
        assert policies[data].startswith("default-src 'none'"), (data, policies[data])
    # Not logged in: the redirect to the login page carries them too.
    reply = Browser(ui.base).call("/specload/runs")
    assert reply.status == 302 and reply.headers["X-Content-Type-Options"] == "nosniff"


def test_a_cross_site_post_is_refused_even_logged_in(ui: UI) -> None:
    b = Browser(ui.base)
    b.login(ui.token)
    dirs, before = ui.run_dirs(), _prompt_tokens(ui.home)
    state = b.call("/stats/requests").json()["state"]  # ready, or stopped after another test's run
    reply = b.post("/swarm", ui.form(ui.home.url), origin=EVIL)
    assert reply.status == 403
    assert reply.json() == {"success": False, "message": reply.json()["message"]}
    assert f"refused POST /swarm from {EVIL}" in reply.json()["message"]
    # A browser that sends only a Referer, and the other state-changing routes, are refused alike.
    assert b.call("/swarm", ui.form(ui.home.url), Referer=f"{EVIL}/page.html").status == 403
    assert b.post("/stop", {}, origin=EVIL).status == 403
    assert b.post("/stats/reset", {}, origin="http://127.0.0.1:1").status == 403
    assert b.post("/specload/login", {"password": ui.token}, origin=EVIL).status == 403
    time.sleep(1.5)
    assert ui.run_dirs() == dirs and _prompt_tokens(ui.home) == before
    assert b.call("/stats/requests").json()["state"] == state  # nothing started
    assert ui.log().count(f"from {EVIL}:") == 1  # said once, not once per request


def test_the_key_goes_to_another_host_only_when_confirmed(ui: UI) -> None:
    b = Browser(ui.base)
    b.login(ui.token)
    withheld = "the API key is NOT sent to " + ui.other.url

    # 1) The form names another server: no key, not to the probes nor to anyone; the server says so.
    dirs = ui.run_dirs()
    assert b.post("/swarm", ui.form(ui.other.url)).json()["success"]
    wait_until(lambda: ui.log().count("Missing API key") == 1, 30, "the refused start")
    assert withheld in ui.log() and "Incorrect API key" not in ui.log()
    ui.wait_stopped(b)
    assert _prompt_tokens(ui.other) == 0 and ui.run_dirs() == dirs

    # 2) Confirmed in the form: the key goes there, and the sweep runs.
    assert b.post("/swarm", ui.form(ui.other.url, send_key_to_new_host="true")).json()["success"]
    run = wait_until(
        lambda: (
            (r := b.call("/specload/run").json())["status"] == "completed"
            and r["run_dir"]
            and os.path.basename(r["run_dir"]) not in dirs
            and r
        ),
        60,
        "the sweep",
    )
    assert run["levels"][0]["ok"] == 2 and _prompt_tokens(ui.other) > 0
    assert f"the API key goes to {ui.other.url}, as confirmed" in ui.log()
    ui.wait_stopped(b)

    # 3) That "yes" was for that run only: the next form without it goes without the key again.
    assert b.post("/swarm", ui.form(ui.other.url)).json()["success"]
    wait_until(lambda: ui.log().count("Missing API key") == 2, 30, "the second refused start")
    assert ui.log().count(withheld) == 2
    ui.wait_stopped(b)


def test_the_token_and_the_key_are_written_nowhere(ui: UI) -> None:
    secrets_ = (ui.token.encode(), ui.key.encode())
    files = [p for p in ui.out.rglob("*") if p.is_file()]
    assert any(p.name == "run.json" for p in files)
    assert not [str(p) for p in files if any(s in p.read_bytes() for s in secrets_)]
    (child,) = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) == ui.proc.pid]
    for pid in (ui.proc.pid, child):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert not any(s in cmdline for s in secrets_), pid
    assert b"--web-login" in Path(f"/proc/{child}/cmdline").read_bytes()
    assert ui.key not in ui.log()


def _ppid(proc_dir: Path) -> int | None:
    try:
        stat = (proc_dir / "stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def test_no_web_auth_is_loud_and_still_refuses_cross_site_posts(tmp_path: Path) -> None:
    procs = Procs()
    home = start_sim(list(FAST))
    try:
        proc, base = start_ui(procs, home, tmp_path / "results", "sk-x", "--no-web-auth")
        assert "WARNING: --no-web-auth" in procs.log(proc) and "password" not in procs.log(proc)
        b = Browser(base)
        assert b.call("/").status == 200  # no login page
        form = {
            "host": home.url,
            "levels": "1",
            "requests_per_level": "2",
            "user_count": "1",
            "spawn_rate": "1",
        }
        assert b.post("/swarm", form, origin=EVIL).status == 403
        # DNS rebinding: the attacker's name resolves to the UI's address, so its page's Origin and
        # the Host its requests carry agree; only that name gives it away (review ab9c161, M9).
        port = base.rsplit(":", 1)[1]
        rebound = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
        assert b.call("/swarm", {**form, "send_key_to_new_host": "true"}, **rebound).status == 403
        assert b.call("/specload/runs", Host=f"evil.example:{port}").status == 403
        # No cross-origin reads: Locust's CORS headers are gone.
        assert "Access-Control-Allow-Origin" not in b.call("/specload/runs", Origin=EVIL).headers
        time.sleep(1.0)
        assert _prompt_tokens(home) == 0
    finally:
        procs.stop_all()
        home.stop()


def test_credentials_typed_into_the_form_host_are_dropped(ui: UI) -> None:
    """A host typed as http://user:pass@host (review ab9c161, H5 for the web form): dropped before
    Locust hands its host (``environment.host`` and the parsed options, in every spawn message) to
    any worker, and in no log line, page or file afterwards."""
    b = Browser(ui.base)
    b.login(ui.token)
    host = ui.home.url.replace("http://", "http://alice:hunter2pw@")
    assert b.post("/swarm", ui.form(host)).json()["success"]
    wait_until(lambda: b.call("/specload/run").json()["status"] == "completed", 60, "the sweep")
    ui.wait_stopped(b)
    assert "the user:password in the host URL is not sent to the server and is dropped" in ui.log()
    assert "hunter2pw" not in ui.log()
    page = b.call("/")
    assert page.status == 200 and b"hunter2pw" not in page.body and ui.home.url.encode() in page.body
    files = [p for p in ui.out.rglob("*") if p.is_file()]
    assert not [str(p) for p in files if b"hunter2pw" in p.read_bytes()]


def test_the_resolver_drops_the_credentials_from_what_locust_sends_workers() -> None:
    from types import SimpleNamespace

    from specload.locust.resolve import RunResolver

    opts = SimpleNamespace(host="http://alice:hunter2pw@10.0.0.1:8000/v1")
    env = SimpleNamespace(host=opts.host, parsed_options=opts)
    resolver = RunResolver.__new__(RunResolver)
    resolver.env = env
    resolver._drop_credentials()
    assert env.host == opts.host == "http://10.0.0.1:8000/v1"
