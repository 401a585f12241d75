"""The console reads and acts only through the node's API: its modules
import the client SDK and the shared values of TLS, errors and listen
addresses, never the node, the store, the engine or the servicers. Checked
on the source, so a short cut fails here rather than in review."""

from __future__ import annotations

import ast
from pathlib import Path

import wheel.console

CONSOLE = Path(wheel.console.__file__).resolve().parent
ALLOWED = frozenset({"wheel.client", "wheel.codec", "wheel.errors", "wheel.tls", "wheel.metrics"})


def wheel_imports(source: str) -> set[str]:
    found: set[str] = set()
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("wheel"):
            found.add(n.module)
        elif isinstance(n, ast.Import):
            found |= {a.name for a in n.names if a.name.startswith("wheel")}
    return found


def test_the_check_finds_an_import_past_the_api() -> None:
    source = "from wheel.node import Node\nimport wheel.store.open\nfrom wheel.client import Job\n"
    assert wheel_imports(source) - ALLOWED == {"wheel.node", "wheel.store.open"}


def test_the_console_imports_nothing_past_the_nodes_api() -> None:
    modules = sorted(CONSOLE.glob("*.py"))
    assert len(modules) >= 3
    for path in modules:
        outside = {
            m
            for m in wheel_imports(path.read_text())
            if m not in ALLOWED and m != "wheel.console" and not m.startswith("wheel.console.")
        }
        assert not outside, f"{path.name} imports {sorted(outside)}"
