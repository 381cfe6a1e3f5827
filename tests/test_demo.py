"""`specload demo --scenario smoke`: the demo's whole path (two simulators, two sweeps, the comparison)
with tiny requests, as a pip user runs it; the full demo's story is tests/test_integration_spec.py's."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import specload_cmd


def test_the_quick_demo_runs_and_names_the_pip_command(tmp_path: Path) -> None:
    out = subprocess.run(
        specload_cmd("demo", "--scenario", "smoke", "--out", str(tmp_path / "r")),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),  # no Makefile here: the closing line must not send a pip user to make alone
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert "=== specload demo: BASELINE" in text and "=== specload demo: MTP" in text
    assert "=== specload demo: baseline vs MTP ===" in text and "## Verdict" in text
    assert "Against a real server: specload sweep --host http://server:port" in text
    assert "\x1b[" not in text  # not a terminal: no colour
    runs = sorted(p.name.split("-")[0] for p in (tmp_path / "r").iterdir() if (p / "report.md").exists())
    assert runs == ["baseline", "mtp"]
