"""The node's modules import each other in one direction only: no circle,
counting the imports made for type checking alone (a circle there is a
circle in the design, whatever Python's import order lets through)."""

from __future__ import annotations

import ast
from pathlib import Path

import wheel

SRC = Path(wheel.__file__).resolve().parent.parent


def module_of(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``path`` imports, anywhere in it."""
    package = module_of(path) if path.name == "__init__.py" else module_of(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                name = f"{base}.{alias.name}"
                found.add(name if name in known else base)
    return found & known


def import_graph(package: str) -> dict[str, set[str]]:
    root = SRC.joinpath(*package.split("."))
    paths = {module_of(p): p for p in root.rglob("*.py")}
    known = set(paths)
    return {name: imports_of(path, known) - {name} for name, path in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_circle_and_only_that() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_the_node_package_has_no_import_circle() -> None:
    graph = import_graph("wheel.node")
    # The package's own __init__ re-exports its parts: it imports them, and
    # none of them imports it.
    assert circles(graph) == []
