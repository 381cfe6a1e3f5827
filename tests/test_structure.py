"""The package's shape, checked from its source: no import circles, each subpackage imports only the
layers below it, Locust confined to its package, the simulator self-contained.

Walks every module's ``import`` statements with ``ast`` (function-level imports included, since a
lazy import still makes a circle for the reader), so a new arrow that closes a circle fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "specload"

# The layers, lowest first: a module may import its own subpackage and those before it in this list
# (each subpackage's docstring says the same). "app" is the top-level modules (cli, launch, demo).
LAYERS = ["core", "client", "workload", "analysis", "sweep", "present", "locust", "app"]
# Only these may use gevent: the hot path, the Locust glue and the simulator (its own server).
GEVENT_ALLOWED = ("specload.client", "specload.locust", "specload.sim")


def layer_of(module: str) -> str:
    """The subpackage a module belongs to: ``specload.core.records`` -> core; the top level -> app."""
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    return parts[1] if parts[1] in LAYERS or parts[1] == "sim" else "app"


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


def test_locust_is_confined_to_its_package() -> None:
    offenders = []
    for path in PKG.rglob("*.py"):
        name = module_name(path)
        if name.startswith("specload.locust"):
            continue
        roots = {i.split(".")[0] for i in imports(path)}
        if "locust" in roots:
            offenders.append(f"{name} imports locust")
        if roots & {"gevent", "geventhttpclient"} and not name.startswith(GEVENT_ALLOWED):
            offenders.append(f"{name} imports gevent")
    assert not offenders, offenders


def upward_imports(g: dict[str, set[str]]) -> list[str]:
    """Every arrow from a module to a layer above its own, or into or out of the simulator."""
    bad = []
    for name, deps in sorted(g.items()):
        mine = layer_of(name)
        for dep in sorted(deps):
            theirs = layer_of(dep)
            if theirs == "root":  # the package itself: __version__
                continue
            if mine == "sim" or theirs == "sim":
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
    }
    assert upward_imports(g) == [
        "specload.client.http -> specload.sim.sendall",
        "specload.core.records -> specload.analysis.metrics",
        "specload.sim.httpd -> specload.client.http",
    ]


def test_each_subpackage_imports_only_the_layers_below_it() -> None:
    g = graph()
    assert "specload.core.records" in g and "specload.present.report" in g
    assert not upward_imports(g), upward_imports(g)


def test_every_module_lives_in_a_subpackage_but_the_entry_points() -> None:
    top = sorted(p.stem for p in PKG.glob("*.py"))
    assert top == ["__init__", "__main__", "cli", "demo", "launch"], top
    for sub in [*LAYERS[:-1], "sim"]:
        doc = ast.get_docstring(ast.parse((PKG / sub / "__init__.py").read_text()))
        assert doc, f"specload/{sub}/__init__.py needs a docstring that says what it holds and may import"
