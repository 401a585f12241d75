"""The engine is a pure core: it takes ``now`` and returns what to do.

Every module under ``wheel/engine`` is read with ``ast`` (never imported), and
the test fails on an import of I/O, threads, processes or a clock, on a
``datetime.now()``-style read of the wall clock, and on an import of a
``wheel`` module outside the engine other than ``wheel.errors`` (which is how
I/O would come in through the back door). ``os`` is refused too: the engine
reads no environment and no files; a zone's rules come through ``zoneinfo``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import wheel.engine

ENGINE = Path(wheel.engine.__file__).resolve().parent

# Top-level module names the engine may not import (their submodules neither).
FORBIDDEN = frozenset(
    {
        "asyncio",
        "concurrent",
        "etcd3",
        "grpc",
        "http",
        "lmdb",
        "multiprocessing",
        "os",
        "psycopg",
        "psycopg_pool",
        "selectors",
        "signal",
        "socket",
        "sqlite3",
        "ssl",
        "subprocess",
        "threading",
        "time",
        "urllib",
    }
)
# Modules of the package outside the engine it may import.
ALLOWED_WHEEL = frozenset({"wheel.errors"})
# ``datetime.now()``, ``date.today()``: the wall clock read in passing (a
# conversion of a given time, ``datetime.fromtimestamp(ms / 1000, tz)``, is fine).
CLOCK_CALLS = frozenset({"now", "utcnow", "today"})
CLOCK_OWNERS = frozenset({"datetime", "date"})


def engine_modules() -> list[Path]:
    return sorted(ENGINE.rglob("*.py"))


def imported(tree: ast.AST) -> list[tuple[int, str]]:
    """Every absolute module name the tree imports, with its line."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def offences(path: Path, root: Path = ENGINE) -> list[str]:
    """What ``path`` (a module under ``root``) does that the engine may not."""
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(root.parent)
    found: list[str] = []
    for line, name in imported(tree):
        top = name.split(".")[0]
        if top in FORBIDDEN:
            found.append(f"{where}:{line} imports {name}")
        elif top == "wheel" and not (
            name == "wheel.engine" or name.startswith("wheel.engine.") or name in ALLOWED_WHEEL
        ):
            found.append(f"{where}:{line} imports {name} (outside the engine)")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in CLOCK_CALLS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in CLOCK_OWNERS
        ):
            clock = f"{node.func.value.id}.{node.func.attr}"
            found.append(f"{where}:{node.lineno} reads the clock ({clock})")
    return found


def test_the_engine_has_modules_to_check() -> None:
    names = {p.name for p in engine_modules()}
    assert "model.py" in names and "driver.py" in names


@pytest.mark.parametrize("path", engine_modules(), ids=lambda p: str(p.relative_to(ENGINE)))
def test_engine_module_imports_no_io_threads_or_clock(path: Path) -> None:
    assert offences(path) == []


def test_the_check_catches_io_a_clock_and_a_way_round(tmp_path: Path) -> None:
    probe = tmp_path / "engine" / "probe.py"
    probe.parent.mkdir()
    probe.write_text(
        "import time\n"
        "from asyncio import sleep\n"
        "import os.path\n"
        "from wheel.store import base\n"
        "from wheel.engine import model\n"
        "from wheel.errors import NotFound\n"
        "from datetime import datetime\n"
        "x = datetime.now()\n"
    )
    found = offences(probe, tmp_path / "engine")
    assert [f.split(" ", 1)[0] for f in found] == [
        "engine/probe.py:1",
        "engine/probe.py:2",
        "engine/probe.py:3",
        "engine/probe.py:4",
        "engine/probe.py:8",
    ]
