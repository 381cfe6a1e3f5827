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


EXPERIMENT_PREFIX = (
    "experiment-"  # scenarios/experiment-*.toml are experiments (specload experiment), not sweeps
)


def builtin_scenarios() -> list[str]:
    return sorted(p.stem for p in scenarios_dir().glob("*.toml") if not p.stem.startswith(EXPERIMENT_PREFIX))


def _builtin(name: str, experiment: bool) -> Path | None:
    stem = name[:-5] if name.endswith(".toml") else name
    if "/" in stem or "\\" in stem or stem.startswith(EXPERIMENT_PREFIX) is not experiment:
        return None
    path = scenarios_dir() / f"{stem}.toml"
    return path if path.is_file() else None


def builtin_scenario(name: str) -> Path | None:
    """The built-in scenario called ``name`` (``mtp-sweep`` or ``mtp-sweep.toml``), if there is one."""
    return _builtin(name, experiment=False)


def builtin_experiment(name: str) -> Path | None:
    """The built-in experiment called ``name`` (``experiment-sim``), if there is one."""
    return _builtin(name, experiment=True)
