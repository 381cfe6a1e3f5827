"""A real install: the wheel, installed into a fresh virtual environment outside the checkout.

Catches what an editable install hides: the locustfile and the scenarios must ship as package
data, and nothing may reach for files next to the source tree. The new environment borrows the
test environment's installed dependencies (a path entry, not a copy), so the test needs no network.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from specload.sim.process import start_sim

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bin/ of a fresh venv with the built wheel installed (no editable link to the checkout)."""
    root = tmp_path_factory.mktemp("install")
    wheels = root / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("specload-*.whl")
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=False)
    site = next((env_dir / "lib").glob("python*/site-packages"))
    (site / "borrowed-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    py = env_dir / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return env_dir / "bin"


def run(bin_dir: Path, cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(bin_dir / "specload"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_installed_package_is_not_the_checkout(installed: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [
            str(installed / "python"),
            "-c",
            "import specload, specload.core.resources as r; print(specload.__file__); print(r.locustfile_path())",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    pkg, locustfile = out.stdout.split()
    assert str(REPO) not in pkg and "site-packages" in pkg
    assert Path(locustfile).is_file() and "site-packages" in locustfile
    shown = run(installed, tmp_path, "locustfile")
    assert shown.stdout.strip() == locustfile


def test_installed_sweep_with_a_builtin_scenario_from_another_folder(installed: Path, tmp_path: Path) -> None:
    sim = start_sim(["--ttft-ms", "20", "--itl-ms", "2"])
    try:
        out = run(
            installed,
            tmp_path,
            "sweep",
            "--host",
            sim.url,
            "--scenario",
            "smoke",
            "--levels",
            "1,2",
            "--out",
            "results",
            "--metrics-interval",
            "0",
            "--prompts",
            "real",  # the real-text set is package data: the wheel must carry it
        )
    finally:
        sim.stop()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (run_dir,) = (tmp_path / "results").iterdir()
    assert (run_dir / "records.jsonl").read_text().count("\n") == 4 + 4  # budgets max(4, 2*C) at C=1, 2
    assert json.loads((run_dir / "run.json").read_text())["prompts"]["material"] == "real text"
    assert "# specload report: smoke" in out.stdout and "SIMULATED SERVER" in out.stdout


def test_sweep_that_never_started_leaves_no_run_directory(installed: Path, tmp_path: Path) -> None:
    bad = tmp_path / "broken_locustfile.py"
    bad.write_text("raise SystemExit('this locustfile is broken')\n")
    sim = start_sim(["--ttft-ms", "5"])
    try:
        out = run(
            installed,
            tmp_path,
            "sweep",
            "--host",
            sim.url,
            "--scenario",
            "smoke",
            "--out",
            "results",
            "--locustfile",
            str(bad),
        )
    finally:
        sim.stop()
    assert out.returncode != 0
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())
