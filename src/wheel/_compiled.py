"""The modules of the hot path that the package build compiles with mypyc.

Each is ordinary typed Python, and stays the single truth: the build turns
it into a C extension beside its source (``hatch_build.py``), which Python
loads in its place. Without a compiler, or with ``WHEEL_PURE_PYTHON=1`` at
build time, nothing is compiled and the sources run as they are. With
``WHEEL_PURE_PYTHON=1`` at run time the sources run even where the
extensions were built: ``wheel/__init__.py`` then puts ``PureFinder`` first
on ``sys.meta_path`` (how the suite runs its pure-Python part).

``_compiled.json`` beside this file (written by the build, never committed)
records each compiled module's source hash, so a source edited after its
build is noticed (``stale``) instead of silently running the old code.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["MODULES", "PureFinder", "compiled", "source_hashes", "stale"]

# Leaf modules of the engine first; the owner and its driver are the hot
# path itself (fires, claims, hand-outs, completions).
MODULES: tuple[str, ...] = (
    "wheel.engine.model",
    "wheel.engine.spec",
    "wheel.engine.records",
    "wheel.engine.timerwheel",
    "wheel.engine.fairness",
    "wheel.engine.priority",
    "wheel.engine.policy",
    "wheel.engine.cronwall",
    "wheel.engine.schedule",
    "wheel.engine.profiles",
    "wheel.engine.jobtable",
    "wheel.engine.fires",
    "wheel.engine.owner._values",
    "wheel.engine.owner._runtable",
    "wheel.engine.owner._tenants",
    "wheel.engine.owner._shardmap",
    "wheel.engine.owner._redos",
    "wheel.engine.owner._fleet",
    "wheel.engine.owner._claims",
    "wheel.engine.owner._state",
    "wheel.engine.owner._packed",
    "wheel.engine.owner._jobs",
    "wheel.engine.owner._dispatch",
    "wheel.engine.owner._workers",
    "wheel.engine.owner._runs",
    "wheel.engine.owner._shards",
    "wheel.engine.owner",
    "wheel.engine.driver",
    # What a fire or a submitted job passes through on its way to the store,
    # the checkpoint and the wire (none with an async generator, which mypyc
    # cannot compile, and none whose constants a test changes).
    "wheel.rpc.convert",
    "wheel.checkpoint.owner_state",
    "wheel.store._shared",
    "wheel.store.sqlite._sql",
    "wheel.store.sqlite._runs",
    "wheel.store.postgres._sql",
    "wheel.client._wire",
    "wheel.store.base",
    "wheel.store._fence",
    "wheel.node._checkpointing",
    "wheel.node._batches",
    "wheel.node._dispatch",
    "wheel.store._keys",
    "wheel.store.sqlite._jobs",
    "wheel.store.postgres._jobs",
    "wheel.store.postgres._runs",
    "wheel.worker._columns",
    "wheel.worker._credit",
)

SRC = Path(__file__).resolve().parent.parent
MANIFEST = Path(__file__).with_name("_compiled.json")


def source_of(module: str) -> Path:
    path = SRC.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def source_hashes(modules: Sequence[str] = MODULES) -> dict[str, str]:
    return {m: hashlib.sha256(source_of(m).read_bytes()).hexdigest() for m in modules}


def compiled(module: ModuleType) -> bool:
    """Whether ``module`` was loaded from a C extension."""
    return not (module.__file__ or "").endswith(".py")


def stale() -> list[str]:
    """Compiled modules whose source changed since the build (empty when
    nothing was compiled)."""
    try:
        built = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return []
    now = source_hashes([m for m in MODULES if m in built])
    return sorted(m for m, digest in now.items() if built[m] != digest)


class PureFinder(importlib.abc.MetaPathFinder):
    """Loads compiled modules from their sources: all of them, or those named."""

    def __init__(self, only: frozenset[str] | None = None) -> None:
        self.only = only

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES or (self.only is not None and fullname not in self.only):
            return None
        return importlib.util.spec_from_file_location(fullname, source_of(fullname))


def use_sources(setting: str = "1") -> None:
    """``WHEEL_PURE_PYTHON``: 1 for every compiled module, or a comma-separated
    list of some (to tell which one a difference comes from)."""
    if any(isinstance(f, PureFinder) for f in sys.meta_path):
        return
    only = None if setting == "1" else frozenset(m.strip() for m in setting.split(","))
    sys.meta_path.insert(0, PureFinder(only))
