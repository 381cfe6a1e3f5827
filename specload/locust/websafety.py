"""The web UI's guards: a login with a per-run token, and no state change from another site's page.

Locust's web UI does what any page in the operator's browser asks: a cross-site form POST needs
no JavaScript and no permission, so without these guards any web site the operator visits could
start a sweep against a host of its choosing, and that host would receive the API key. Each guard
stops what the others cannot:

- **Login** (Locust's own ``--web-login`` page): ``specload ui`` makes a random token per run,
  hands it to the Locust child in its environment (``WEB_TOKEN_ENV``: argv is public through
  ``ps``) and prints it once; the token is the password. Nothing writes it to a file. A plain
  ``locust --web-login`` run without that variable gets a token made here, printed on stderr.
- **Same origin**: a POST/PUT/PATCH/DELETE whose ``Origin`` (else ``Referer``) is not the UI's
  own address is refused with HTTP 403, logged in or not: a logged-in operator's browser would
  otherwise lend its session cookie to the other site's form. A request with neither header
  comes from no browser (curl, scripts) and needs the login alone.
- **The key stays with its host** (``SweepOwner._send_key``): the start form's confirm box
  (``--send-key-to-new-host``) counts for the submission that carries it, never for later ones.
- **No script but the page's own**: every response says ``X-Content-Type-Options: nosniff`` and
  carries a Content-Security-Policy (``install_headers``). Data (JSON, CSV, PNG, errors) may run
  nothing at all, specload's page only its own script file, and Locust's pages their own assets
  (their one inline script holds the template's arguments, so they keep ``'unsafe-inline'``). A
  name echoed into an error (an unknown run) is JSON, never HTML (``specload.locust.webui``): a
  link from another site to ``/specload/runs/<script>/report`` runs nothing in the UI's origin.

Flask and Flask-Login are imported inside the functions, so ``specload ui`` can read the names
below without importing Locust.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import secrets
import sys
from typing import Any
from urllib.parse import urlsplit

from specload.locust.options import SEND_KEY_DEST

logger = logging.getLogger("specload")

WEB_TOKEN_ENV = "SPECLOAD_WEB_TOKEN"  # the login token, from `specload ui` to its Locust child
LOGIN_PATH = "/specload/login"  # POST user/password (the login page's form), or GET ?token=...
PAGE = "/specload/"  # specload's own page (specload.locust.webui): where a login lands
_USER_ID = "specload"
_UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_DEFAULT_PORTS = (":80", ":443")


def new_token() -> str:
    """A login token nobody can guess (192 random bits), fit for a URL."""
    return secrets.token_urlsafe(24)


def _site(netloc: str) -> str:
    """``host[:port]`` lower-cased, a default port dropped: ``Origin`` and ``Host`` spell it so.
    The scheme is not compared: behind a TLS proxy the page is https while Locust serves http."""
    netloc = netloc.rsplit("@", 1)[-1].lower()
    for port in _DEFAULT_PORTS:
        if netloc.endswith(port):
            return netloc[: -len(port)]
    return netloc


def foreign_origin(source: str | None, ui_host: str, allowed: frozenset[str] = frozenset()) -> str | None:
    """The origin of a request that comes from another site's page, else None.

    ``source``: the ``Origin`` header, else the ``Referer`` (None: no browser sent it). ``ui_host``:
    the ``Host`` header, the address the browser used for the UI itself. ``allowed``: more sites
    (``host[:port]``, from ``--web-allowed-origins``), e.g. a reverse proxy's public name.
    """
    if not source:
        return None
    parts = urlsplit(source)
    if not parts.scheme or not parts.netloc:  # "null" (a sandboxed frame, a file:// page) or garbage
        return source[:100]
    site = _site(parts.netloc)
    if site == _site(ui_host) or site in allowed:
        return None
    return f"{parts.scheme}://{parts.netloc}"[:100]


def allowed_sites(option: str | None) -> frozenset[str]:
    """``--web-allowed-origins`` (comma-separated URLs or host[:port]) as comparable sites."""
    out = set()
    for item in (option or "").split(","):
        item = item.strip()
        if item:
            out.add(_site(urlsplit(item).netloc if "://" in item else item))
    return frozenset(out)


def install_origin_check(app: Any, allowed: frozenset[str]) -> None:
    """Refuse (403) every state-changing request from another site's page; log each origin once."""
    from flask import jsonify, request

    refused: set[str] = set()

    @app.before_request
    def _same_origin_only() -> Any:
        if request.method not in _UNSAFE_METHODS:
            return None
        source = request.headers.get("Origin") or request.headers.get("Referer")
        foreign = foreign_origin(source, request.host, allowed)
        if foreign is None:
            return None
        message = (
            f"refused {request.method} {request.path} from {foreign}: the web UI takes orders only from "
            f"its own page ({request.host}); see --web-allowed-origins for a proxy"
        )
        if foreign not in refused:
            refused.add(foreign)
            logger.warning("%s", message)
        return jsonify({"success": False, "message": message}), 403


def host_allowed(host: str, allowed: frozenset[str] = frozenset()) -> bool:
    """Whether a ``Host`` header names this web UI: an IP address (v4 or v6), ``localhost``, or an
    allowed site (``--web-allowed-origins``). DNS rebinding points a name of the attacker's own at
    the UI's address, so its page is same-origin with the UI as far as the browser knows: only the
    name in ``Host`` gives it away."""
    site = _site(host)
    if site in allowed:
        return True
    if site.startswith("["):  # [v6]:port
        name = site[1 : site.find("]")] if "]" in site else site
    else:
        name = site.rsplit(":", 1)[0]
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def install_host_check(app: Any, allowed: frozenset[str]) -> None:
    """Refuse (403) every request whose ``Host`` is a name other than the UI's own (DNS rebinding)."""
    from flask import request

    refused: set[str] = set()

    @app.before_request
    def _own_host_only() -> Any:
        if host_allowed(request.host, allowed):
            return None
        host = request.host[:100]
        message = (
            f"refused {request.method} {request.path} for Host {host!r}: not this web UI's address; "
            "add the name to --web-allowed-origins if a proxy serves it"
        )
        if host not in refused:
            refused.add(host)
            logger.warning("%s", message)
        return message, 403, {"Content-Type": "text/plain; charset=utf-8"}


def install_no_cors(app: Any) -> None:
    """No cross-origin reads: Locust's own ``CORS(app)`` lets any site's page read every result.
    Its headers are dropped on the way out (flask_cors adds them after every other hook)."""
    inner = app.wsgi_app

    def wsgi(environ: Any, start_response: Any) -> Any:
        def start(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
            kept = [(k, v) for k, v in headers if not k.lower().startswith("access-control-")]
            return start_response(status, kept, *exc_info)

        return inner(environ, start)

    app.wsgi_app = wsgi


# Data and errors: nothing may run, load or frame it, even if a browser were made to render it.
CSP_DATA = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'; sandbox"
# specload's page: its script and stylesheet files, its JSON routes, inline SVG charts (style
# attributes in the drawn markup), data: images (the comparison's PNG).
CSP_PAGE = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
# Locust's own pages: a bundled app plus one inline script of template arguments.
CSP_LOCUST = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'self'"
)


def content_policy(path: str, mimetype: str | None) -> str:
    """The Content-Security-Policy for one response: only HTML pages may run script, and only their own."""
    if mimetype != "text/html":
        return CSP_DATA
    return CSP_PAGE if path.startswith(PAGE) else CSP_LOCUST


def install_headers(app: Any) -> None:
    """``nosniff`` and a Content-Security-Policy on every response of the web UI, Locust's included."""
    from flask import request

    @app.after_request
    def _headers(response: Any) -> Any:
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Content-Security-Policy"] = content_policy(request.path, response.mimetype)
        response.headers.setdefault("Referrer-Policy", "same-origin")
        return response


def install_confirm_per_run(environment: Any) -> None:
    """The confirm box counts for one submission: before each start form is applied, it goes back
    to its launch value, so an earlier run's "yes" never carries the key to a later run's host
    (Locust keeps a form value that a later request leaves out)."""
    from flask import request

    opts = environment.parsed_options
    launched = bool(getattr(opts, SEND_KEY_DEST, False))

    @environment.web_ui.app.before_request
    def _confirm_per_run() -> None:
        current = environment.parsed_options
        if request.method == "POST" and request.endpoint == "locust.swarm" and current is not None:
            setattr(current, SEND_KEY_DEST, launched)


def install_login(web_ui: Any, token: str) -> None:
    """Locust's ``--web-login`` page, with ``token`` as the password (any user name): the signed
    session cookie lives as long as this process (a random secret), and is never sent along with
    another site's POST (SameSite=Lax)."""
    from flask import redirect, request, session, url_for
    from flask_login import UserMixin, login_user

    class Operator(UserMixin):
        id = _USER_ID

    app = web_ui.app
    app.config["SECRET_KEY"] = secrets.token_bytes(32)
    app.config["SESSION_COOKIE_SAMESITE"] = "Lax"
    web_ui.login_manager.user_loader(lambda user_id: Operator() if user_id == _USER_ID else None)
    web_ui.auth_args = {**web_ui.auth_args, "username_password_callback": LOGIN_PATH}
    expected = token.encode()

    @app.route(LOGIN_PATH, methods=["GET", "POST"])
    def _login() -> Any:
        given = request.form.get("password") if request.method == "POST" else request.args.get("token")
        if given and hmac.compare_digest(given.encode(), expected):
            login_user(Operator())
            return redirect(PAGE)
        session["auth_error"] = "Wrong password: use the token that `specload ui` printed when it started"
        return redirect(url_for("locust.login"))


def protect_web_ui(environment: Any) -> None:
    """All the guards, on the web UI of this process (Locust's ``init`` event)."""
    web_ui = environment.web_ui
    allowed = allowed_sites(getattr(environment.parsed_options, "web_allowed_origins", ""))
    install_headers(web_ui.app)
    install_no_cors(web_ui.app)
    install_host_check(web_ui.app, allowed)
    install_origin_check(web_ui.app, allowed)
    install_confirm_per_run(environment)
    if not web_ui.web_login:
        return
    token = os.environ.pop(WEB_TOKEN_ENV, "")
    if not token:
        token = new_token()
        print(
            f"specload: web UI login: any user name, password {token} (made for this run)",
            file=sys.stderr,
            flush=True,
        )
    install_login(web_ui, token)
