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
    "wheel.engine.policy",
    "wheel.engine.schedule",
    "wheel.engine.profiles",
    "wheel.engine.jobtable",
)

SRC = Path(__file__).resolve().parent.parent
MANIFEST = Path(__file__).with_name("_compiled.json")


def source_of(module: str) -> Path:
    return SRC.joinpath(*module.split(".")).with_suffix(".py")


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
    """Loads the compiled modules from their sources."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, source_of(fullname))


def use_sources() -> None:
    if not any(isinstance(f, PureFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, PureFinder())
