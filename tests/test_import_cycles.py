"""No two modules of ``wheel`` import each other, directly or around a
circle: each package's parts import downwards, so any one of them can be read
(and imported) without the rest. Checked on the source with ``ast``. An
import inside a function counts (putting it there is how a circle used to be
hidden: ``cli`` and ``cli_operator``, the worker's ``_api`` and ``_worker``);
one under ``if TYPE_CHECKING:`` does not (it names a type, it never runs)."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import wheel

SRC = Path(wheel.__file__).resolve().parent

# Circles known to remain while other parts are being taken apart: edges
# (importer, imported) left out of the graph. Remove each once the circle it
# closes is gone (the last test says when). ``node._cluster`` and
# ``node._node`` name each other only under TYPE_CHECKING, which is no circle
# here.
KNOWN_EDGES: frozenset[tuple[str, str]] = frozenset()


def module_names(root: Path, package: str = "wheel") -> dict[str, Path]:
    """Every module under ``root`` by its dotted name (a package by its own)."""
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([package, *parts])] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of ``body`` that can run, at import time or
    later in a function: all but those under ``if TYPE_CHECKING:``."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _runtime_imports(node.orelse)
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                for item in block:
                    if isinstance(item, ast.stmt):
                        yield from _runtime_imports([item])
                    elif isinstance(item, ast.ExceptHandler | ast.match_case):
                        yield from _runtime_imports(item.body)


def imports_of(name: str, source: str, modules: Mapping[str, object]) -> set[str]:
    """The modules among ``modules`` that module ``name`` imports when it is
    imported. ``from P import m`` names submodule ``P.m`` when there is one."""
    is_package = name in modules and any(m.startswith(name + ".") for m in modules)
    here = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_imports(ast.parse(source).body):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
            continue
        base = node.module or ""
        if node.level:
            anchor = here.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join(anchor + ([base] if base else []))
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            if sub in modules:
                found.add(sub)
            elif base in modules:
                found.add(base)
    found.discard(name)
    return found


def import_graph(root: Path, package: str = "wheel") -> dict[str, set[str]]:
    modules = module_names(root, package)
    return {
        name: imports_of(name, path.read_text(encoding="utf-8"), modules)
        for name, path in modules.items()
    }


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's),
    each sorted: every one holds at least one circle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def without(
    graph: Mapping[str, set[str]], edges: frozenset[tuple[str, str]]
) -> dict[str, set[str]]:
    return {m: {t for t in targets if (m, t) not in edges} for m, targets in graph.items()}


def _graph_of(tmp_path: Path, files: Mapping[str, str]) -> dict[str, set[str]]:
    for rel, text in files.items():
        path = tmp_path / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return import_graph(tmp_path / "pkg", "pkg")


def test_the_check_finds_a_circle_through_a_package(tmp_path: Path) -> None:
    graph = _graph_of(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg.sub import b\n",
            "sub/__init__.py": "",
            "sub/b.py": "from . import c\n",
            "sub/c.py": "import pkg.a\n",
        },
    )
    assert cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"]]


def test_the_check_ignores_type_only_imports(tmp_path: Path) -> None:
    graph = _graph_of(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg.b import f\n",
            "b.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from pkg.a import A\n"
                "else:\n    import json\n"
            ),
        },
    )
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == set()
    assert cycles(graph) == []


def test_the_check_finds_a_circle_hidden_in_a_function(tmp_path: Path) -> None:
    graph = _graph_of(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg.b import f\n",
            "b.py": "def f():\n    if True:\n        from pkg import a\n",
        },
    )
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


def test_no_module_of_wheel_imports_itself_around_a_circle() -> None:
    found = cycles(without(import_graph(SRC), KNOWN_EDGES))
    assert found == [], f"import circles: {found}"


def test_each_known_circle_is_still_there() -> None:
    """A known edge whose circle is gone must leave ``KNOWN_EDGES``, so that
    it cannot come back unnoticed."""
    graph = import_graph(SRC)
    circular = {m for component in cycles(graph) for m in component}
    stale = sorted(e for e in KNOWN_EDGES if not (set(e) <= circular and e[1] in graph[e[0]]))
    assert stale == [], f"no circle any more through {stale}: remove them from KNOWN_EDGES"
