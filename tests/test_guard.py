"""`wheel` is also PyPA's distribution name: make sure the import is ours."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

import wheel

ROOT = Path(__file__).resolve().parent.parent


def test_import_wheel_resolves_to_this_project() -> None:
    assert Path(wheel.__file__).resolve() == ROOT / "src" / "wheel" / "__init__.py"
    assert wheel.__doc__ is not None and "job scheduler" in wheel.__doc__


def test_pypa_wheel_distribution_is_not_installed() -> None:
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("wheel")
