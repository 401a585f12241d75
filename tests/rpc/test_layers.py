"""The rpc layer reads and acts only through the node's API: it never
reaches past the node to the store it holds, nor into the node's private
members. Checked on the source, so a new servicer that takes the short cut
fails here rather than in review."""

from __future__ import annotations

import ast
from pathlib import Path

import wheel.rpc

RPC = Path(wheel.rpc.__file__).resolve().parent
# The node's members the rpc layer must not use: the record of truth itself,
# and the way to run any blocking call (a store call) on the node's threads.
FORBIDDEN = frozenset({"store", "in_thread"})
# What the rpc layer may import of wheel.store: its value types, no backend.
STORE_VALUES = "wheel.store.base"


def _sources() -> list[Path]:
    return sorted(p for p in RPC.rglob("*.py") if "v1" not in p.relative_to(RPC).parts)


def _names_the_node(expr: ast.expr) -> bool:
    """``node``, ``self.node``, ``server.node``...: an expression for the node."""
    if isinstance(expr, ast.Name):
        return expr.id == "node"
    return isinstance(expr, ast.Attribute) and expr.attr == "node"


def reaches_past_the_node(source: str) -> list[str]:
    """Each ``node.<member>`` in ``source`` that is the store, ``in_thread``
    or private, and each import of wheel.store beyond its value types, as
    ``line: text``."""
    found = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Attribute) and _names_the_node(n.value):
            if n.attr in FORBIDDEN or n.attr.startswith("_"):
                found.append(f"{n.lineno}: {ast.unparse(n)}")
        elif isinstance(n, ast.ImportFrom) and n.module is not None:
            module = n.module
            if module.startswith("wheel.store") and module != STORE_VALUES:
                found.append(f"{n.lineno}: from {module} import ...")
        elif isinstance(n, ast.Import):
            found += [
                f"{n.lineno}: import {a.name}" for a in n.names if a.name.startswith("wheel.store")
            ]
    return found


def test_the_check_finds_each_way_past_the_node() -> None:
    source = """
async def work(self, node):
    await self.node.in_thread(self.node.store.list_tokens)
    node._owner().has_job(1)
    server.node.store.get_token("t")
    self.node.status()
from wheel.store.open import open_store
from wheel.store.base import TokenRecord
import wheel.store.sqlite
"""
    assert sorted(reaches_past_the_node(source)) == [
        "3: self.node.in_thread",
        "3: self.node.store",
        "4: node._owner",
        "5: server.node.store",
        "7: from wheel.store.open import ...",
        "9: import wheel.store.sqlite",
    ]


def test_no_rpc_module_reaches_past_the_node() -> None:
    sources = _sources()
    assert RPC / "_tenancy.py" in sources and RPC / "server.py" in sources
    offences = {
        str(path.relative_to(RPC)): found
        for path in sources
        if (found := reaches_past_the_node(path.read_text()))
    }
    assert offences == {}
