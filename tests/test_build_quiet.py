"""A fresh install prints no setuptools warnings: a newcomer reads "Package would be ignored" or a
deprecation banner before the demo's first line as a broken package.

Both builds run offline with this environment's setuptools (the same the Makefile's install gets)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# setuptools' warning classes (BuildBackendWarning, SetuptoolsDeprecationWarning, ...) and its banners
WARNING = re.compile(r"Warning\b|would be ignored|deprecated", re.IGNORECASE)


def _setuptools_lines(output: str) -> list[str]:
    # pip's own "Location ... is ignored" lines come from this machine's pip configuration
    return [line for line in output.splitlines() if WARNING.search(line) and "Location '" not in line]


def test_the_wheel_builds_without_a_setuptools_warning(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert _setuptools_lines(done.stdout + done.stderr) == []
    (wheel,) = tmp_path.glob("specload-*.whl")
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    # package-data alone ships the data folders (include-package-data is off)
    for data in (
        "specload/locust/webpage/index.html",
        "specload/sim/presets/mtp.toml",
        "specload/workload/data/realtext.json.gz",
        "specload/scenarios/smoke.toml",
        "specload/locustfiles/specload_sweep.py",
    ):
        assert data in names, data


def test_the_makefiles_editable_build_prints_no_setuptools_warning(tmp_path: Path) -> None:
    """The editable wheel of `make install`, built by setuptools' backend under the Makefile's filter."""
    quiet = re.search(r"^EDITABLE_QUIET := PYTHONWARNINGS='([^']+)'$", (REPO / "Makefile").read_text(), re.M)
    assert quiet, "the Makefile's EDITABLE_QUIET line"
    env = {**os.environ, "PYTHONWARNINGS": quiet.group(1)}
    build = f"from setuptools import build_meta as b; b.build_editable({str(tmp_path)!r})"
    done = subprocess.run(
        [sys.executable, "-c", build], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert _setuptools_lines(done.stderr) == [], done.stderr[-3000:]
    assert list(tmp_path.glob("specload-*.whl"))
