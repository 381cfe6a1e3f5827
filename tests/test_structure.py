"""The package's shape, checked from its source: no import circles, Locust confined to its package.

Walks every module's ``import`` statements with ``ast`` (function-level imports included, since a
lazy import still makes a circle for the reader), so a new arrow that closes a circle fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "specload"

# Outside specload/locust/, only the hot path (the HTTP client, its socket writes and the stream
# reader) and the simulator (its own server) may use gevent; nothing may use Locust.
GEVENT_ALLOWED = {"specload.http", "specload.sendall", "specload.stream"}


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
    return {name: {i for i in imports(path, names) if i in modules and i != name} for name, path in modules.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(g[n]):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
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
        if roots & {"gevent", "geventhttpclient"} and name not in GEVENT_ALLOWED and not name.startswith("specload.sim"):
            offenders.append(f"{name} imports gevent")
    assert not offenders, offenders
