"""The running cap in a server's command line: what a server that specload started was told.

vLLM says its ``--max-num-seqs`` only in dev mode (``/server_info``), so for a server the experiment
started, the command line is the next best witness: its cap goes into each run's run.json ``server``
(unless the server said one itself), and the report and the comparison name it as read from there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from specload.client.introspect import CAP_SOURCE
from specload.core.rundir import RUN_JSON, write_json_atomic

# Command-line flags that cap the running requests, by engine (llama.cpp: its slots).
CAP_FLAGS = ("--max-num-seqs", "--max-running-requests", "--parallel", "-np")


def command_cap(argv: Sequence[str]) -> tuple[int, str] | None:
    """(N, the flag) for the last cap flag of a command line (``--max-num-seqs 8``, ``--max-num-seqs=8``)."""
    found: tuple[int, str] | None = None
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag not in CAP_FLAGS:
            continue
        text = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        if text.isdigit() and int(text) > 0:
            found = (int(text), flag)
    return found


def declare_command_cap(run_dir: str | Path, argv: Sequence[str]) -> int | None:
    """Write the command line's cap into the run's run.json ``server`` when the server said none; the cap."""
    cap = command_cap(argv)
    path = Path(run_dir) / RUN_JSON
    if cap is None or not path.exists():
        return None
    meta = json.loads(path.read_text())
    server = meta.get("server")
    if not isinstance(server, dict):
        server = meta["server"] = {}
    if server.get("max_running_requests") or server.get("max_running_requests_effective"):
        return None
    n, flag = cap
    server["max_running_requests"] = n
    server[CAP_SOURCE] = f"the {flag} {n} of the server's command line"
    write_json_atomic(str(path), meta)
    return n
