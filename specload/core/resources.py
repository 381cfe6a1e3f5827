"""Files specload ships: the locustfile and the built-in scenarios, found wherever specload runs.

In a wheel they are package data (``specload/locustfiles``, ``specload/scenarios``, mapped from the
top-level folders by pyproject.toml); in a source checkout they are those folders themselves.
(Plain paths, not importlib.resources: the two folders are namespace packages, whose resource
readers give no single filesystem path for ``locust -f``.)
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent
_CHECKOUT = _PACKAGE.parent
LOCUSTFILE_NAME = "specload_sweep.py"


def _folder(name: str) -> Path:
    """``<checkout>/name`` in a source tree (and an editable install), else ``specload/name`` in a wheel."""
    here = _CHECKOUT / name
    if (_CHECKOUT / "pyproject.toml").is_file() and here.is_dir():
        return here
    return _PACKAGE / name


def locustfile_path() -> Path:
    """The locustfile to give ``locust -f`` (``specload locustfile`` prints it)."""
    return _folder("locustfiles") / LOCUSTFILE_NAME


def scenarios_dir() -> Path:
    return _folder("scenarios")


def builtin_scenarios() -> list[str]:
    return sorted(p.stem for p in scenarios_dir().glob("*.toml"))


def builtin_scenario(name: str) -> Path | None:
    """The built-in scenario called ``name`` (``mtp-sweep`` or ``mtp-sweep.toml``), if there is one."""
    stem = name[:-5] if name.endswith(".toml") else name
    if "/" in stem or "\\" in stem:
        return None
    path = scenarios_dir() / f"{stem}.toml"
    return path if path.is_file() else None
