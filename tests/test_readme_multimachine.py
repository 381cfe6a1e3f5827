"""The README's multi-machine commands, run as written: the token read from the terminal, the
master's sweep and the worker command on each of 2 "load machines" (here two shells on this one),
with only the addresses and ports swapped for local ones and the sweep kept short.

tests/test_multihost.py runs the same flags on separate hosts (network namespaces); this one holds
the README's text itself to account."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specload.core.records import read_records
from tests.conftest import Procs, free_port

pytestmark = pytest.mark.slow  # nine Locust processes: make test-slow

README = Path(__file__).resolve().parent.parent / "README.md"
TOKEN = "readme-token-" + "x" * 20
SHORT = "--levels 2,4 --requests-per-level 12 --input-tokens 16 --output-tokens 8 --metrics-interval 0"


def readme_block(heading: str) -> list[str]:
    """The commands of the first sh block under ``heading``: comments dropped, continuations joined."""
    text = README.read_text()
    section = text.split(f"\n## {heading}\n", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, f"no sh block under {heading!r}"
    joined = re.sub(
        r"\\\n\s*", " ", "\n".join(re.sub(r"\s+#.*$", "", ln) for ln in block.group(1).splitlines())
    )
    return [ln.strip() for ln in joined.splitlines() if ln.strip()]


def test_the_readme_sets_the_master_token_before_the_master_and_workers_start() -> None:
    lines = readme_block("More load than one machine sends")
    assert lines[0] == "read -rs SPECLOAD_MASTER_TOKEN && export SPECLOAD_MASTER_TOKEN", lines
    assert lines[1].startswith("specload sweep ") and "--workers 8" in lines[1], lines
    assert lines[2].startswith("specload worker ") and "--processes 4" in lines[2], lines


def test_the_readmes_multi_machine_commands_run_as_written(sim, procs: Procs, tmp_path: Path) -> None:
    token_line, master_cmd, worker_cmd = readme_block("More load than one machine sends")
    server = sim("--ttft-ms", "20", "--itl-ms", "5")
    port = str(free_port())

    def local(cmd: str) -> str:
        host = re.search(r"--host (\S+)", cmd)
        cmd = cmd.replace(host.group(1), server.url) if host else cmd
        return cmd.replace("10.0.0.5", "127.0.0.1").replace("5557", port)

    out = tmp_path / "results"
    # specload on the PATH as after `pip install`; the token typed at the prompt (stdin here)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("SPECLOAD_MASTER_TOKEN", None)

    def shell(script: str) -> subprocess.Popen[bytes]:
        proc = procs.popen(["bash", "-c", script], env=env, stdin=subprocess.PIPE)
        assert proc.stdin is not None
        proc.stdin.write(f"{TOKEN}\n".encode())
        proc.stdin.close()
        return proc

    master = shell(f"{token_line}\n{local(master_cmd)} {SHORT} --out {out}")
    workers = [shell(f"{token_line}\n{local(worker_cmd)}") for _ in range(2)]
    try:
        code = master.wait(timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("the master did not finish: " + procs.log(master)[-4000:])
    log = procs.log(master)
    assert code == 0, log[-4000:]
    (run,) = out.iterdir()
    recs = [r for r in read_records(str(run / "records.jsonl")) if r.phase == "measure"]
    assert (len(recs), {r.status for r in recs}) == (24, {"ok"})  # the budgets, exactly
    assert "local" not in {r.worker for r in recs}  # the load came from the workers
    for w in workers:
        assert "has not answered" not in procs.log(w)  # joined at once: no "master not there" line
