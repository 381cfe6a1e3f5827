#!/usr/bin/env python3
"""The entrypoint of specload's image under Locust's Kubernetes operator (LocustTest, locust.cloud/v1).

The operator starts its master pod as ``ENTRYPOINT --master ARGS`` and its worker pods as
``ENTRYPOINT --worker --master-host <test>-master ARGS``, ARGS being the LocustTest's ``args``
split as a shell would. This turns them into specload's own commands, so that the sweep keeps
``specload sweep``'s checks before any load, its run directory, report and exit code:

  --master ARGS                  -> specload sweep --master-bind-host 0.0.0.0 --master-bind-port 5557 ARGS
  --worker --master-host H ARGS  -> specload worker --master-host H --master-port 5557

(the operator's master Service listens on 5557; a worker needs nothing of ARGS). The operator's ``env``
takes literal values only (its schema has no ``valueFrom``), so the master token and the server's key
come from a Secret through the Kubernetes API instead: ``SPECLOAD_SECRET=<name>`` makes this read that
Secret of the pod's namespace with the pod's service account (a Role granting ``get`` on it alone,
docs/deploy/locust-operator/rbac.yaml) and export its keys SPECLOAD_MASTER_TOKEN and SPECLOAD_API_KEY,
and nothing else of it. ``SPECLOAD_HOLD_S=<seconds>``: the master stays up that long after the sweep,
since the operator deletes its Job (and with it the pod, its log and its run directory) as soon as
it ends; ``kubectl cp`` takes the results meanwhile. The pod then exits with the sweep's code.
Standard library only: it runs before specload does.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

MASTER_PORT = "5557"  # the operator's master Service port (master-p1)
SECRET_KEYS = ("SPECLOAD_MASTER_TOKEN", "SPECLOAD_API_KEY")
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class EntryError(Exception):
    """The pod cannot start as asked (exit 2, the message on stderr)."""


def specload_argv(argv: Sequence[str]) -> list[str]:
    """specload's command line for what the operator started the pod with."""
    args = list(argv)
    if args[:1] == ["--master"]:
        taken = {"--master-bind-host", "--master-bind-port"} & {a.split("=")[0] for a in args}
        if taken:
            raise EntryError(f"leave {', '.join(sorted(taken))} out of the LocustTest's args: set here")
        if not any(a == "--workers" or a.startswith("--workers=") for a in args):
            raise EntryError(
                "the LocustTest's args need --workers N, N its workers: else no worker is waited for"
            )
        return ["sweep", "--master-bind-host", "0.0.0.0", "--master-bind-port", MASTER_PORT, *args[1:]]
    if args[:2] == ["--worker", "--master-host"] and len(args) >= 3:
        return ["worker", "--master-host", args[2], "--master-port", MASTER_PORT]
    raise EntryError(
        f"expected --master ARGS or --worker --master-host HOST ARGS (the operator's), got {args[:3]}"
    )


def read_secret(name: str, api: str | None = None, sa_dir: Path = SA_DIR) -> dict[str, str]:
    """SECRET_KEYS of the Secret ``name`` in the pod's namespace, read with the pod's service account;
    ``api``: the API server's base URL (default: the in-cluster one)."""
    token = (sa_dir / "token").read_text().strip()
    namespace = (sa_dir / "namespace").read_text().strip()
    if api is None:
        host, port = (
            os.environ.get("KUBERNETES_SERVICE_HOST"),
            os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
        )
        if not host:
            raise EntryError("SPECLOAD_SECRET: not inside a Kubernetes pod (no KUBERNETES_SERVICE_HOST)")
        api = f"https://{host}:{port}"
    url = f"{api}/api/v1/namespaces/{namespace}/secrets/{name}"
    req = urllib.request.Request(
        url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"}
    )
    ctx = ssl.create_default_context(cafile=str(sa_dir / "ca.crt")) if url.startswith("https://") else None
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            data = json.load(resp).get("data") or {}
    except urllib.error.HTTPError as e:
        why = {403: "the pod's service account may not read it (rbac.yaml)", 404: "no such Secret"}.get(
            e.code, ""
        )
        raise EntryError(
            f"SPECLOAD_SECRET {namespace}/{name}: HTTP {e.code}" + (f": {why}" if why else "")
        ) from None
    except (OSError, ValueError) as e:
        raise EntryError(f"SPECLOAD_SECRET {namespace}/{name}: {e}") from None
    out = {k: base64.b64decode(data[k]).decode() for k in SECRET_KEYS if k in data}
    if "SPECLOAD_MASTER_TOKEN" not in out:
        raise EntryError(f"SPECLOAD_SECRET {namespace}/{name}: no key SPECLOAD_MASTER_TOKEN")
    return out


def _exec(cmd: list[str], env: dict[str, str]) -> int:
    """specload in this process's place (PID 1 of the pod): the pod's SIGTERM reaches it."""
    os.execvpe("specload", ["specload", *cmd], env)
    return 127  # (not reached)


def _child(cmd: list[str], env: dict[str, str]) -> int:
    """specload as a child, the pod's SIGTERM passed on to it (the hold follows it)."""
    import signal
    import subprocess

    proc = subprocess.Popen(["specload", *cmd], env=env)
    signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
    code = proc.wait()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # during the hold, a SIGTERM ends the pod
    return code


def main(
    argv: Sequence[str],
    env: Mapping[str, str] = os.environ,
    run: Callable[[list[str], dict[str, str]], int] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    secret: Callable[[str], dict[str, str]] = read_secret,
) -> int:
    """Start specload as the operator asked; its exit code (after SPECLOAD_HOLD_S on the master)."""
    try:
        cmd = specload_argv(argv)
        child_env = dict(env)
        if env.get("SPECLOAD_SECRET"):
            child_env.update(secret(env["SPECLOAD_SECRET"]))
        hold = float(env.get("SPECLOAD_HOLD_S") or 0) if cmd[0] == "sweep" else 0.0
    except (EntryError, ValueError) as e:
        print(f"specload operator entry: {e}", file=sys.stderr, flush=True)
        return 2
    if run is None:
        run = _exec if hold <= 0 else _child
    code = run(cmd, child_env)
    if hold > 0:
        print(
            f"specload operator entry: the sweep exited {code}; holding {hold:g} s (SPECLOAD_HOLD_S) so that "
            "`kubectl cp` can take the results",
            flush=True,
        )
        sleep(hold)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
