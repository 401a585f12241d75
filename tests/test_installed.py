"""The package as a user gets it: the wheel built from this tree (its hot
modules compiled, as the build hook does), installed into a fresh virtualenv
without the dev extras, runs ``wheelctl --version``, the demo and the web
console. An editable checkout with the dev extras hides what only the dev
extras bring (``mypy_extensions`` came with mypy, and the compiled owner
modules once imported it: the owner's parts are plain classes now, and the
installed package must run without it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import urllib.request
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.procs import ServerProc
from testkit.services import free_port
from wheel._compiled import MODULES

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# What only the dev extras install: none of it may be in the user's venv.
# The console's static files, the page first (uPlot's vendored beside them).
ASSETS = (
    "index.html",
    "console.js",
    "glance.js",
    "console.css",
    "uPlot.iife.min.js",
    "uPlot.min.css",
    "uPlot.LICENSE.txt",
)
DEV_ONLY = ("mypy", "mypy_extensions", "pytest", "hypothesis", "ruff", "grpcio-tools", "wheel")


def compiler() -> bool:
    """Whether the build hook compiles here (it needs a C compiler)."""
    return bool(shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc"))


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    # Where its commands run: not this checkout, whose files must not be found.
    cwd: Path

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WHEEL_PURE_PYTHON")}
        return subprocess.run(
            argv, cwd=self.cwd, env=env, capture_output=True, text=True, timeout=timeout
        )


def _check(proc: subprocess.CompletedProcess[str], what: str) -> None:
    assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """One build and one install for the module's tests (the compile alone
    takes a minute or more)."""
    tmp = tmp_path_factory.mktemp("installed")
    dist = tmp / "dist"
    # pip builds it as a user's `python -m build` would: in an isolated
    # environment holding only [build-system] requires (hatchling needs no
    # PyPA `wheel`, so none comes near this project's own venv).
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    _check(build, "building the wheel")
    (whl,) = dist.glob("wheel_scheduler-*.whl")
    env = tmp / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    cwd = tmp / "cwd"
    cwd.mkdir()
    pkg = Installed(wheel=whl, venv=env, cwd=cwd)
    # The versions this project is tested with, from the same index as ever.
    _check(
        pkg.run(
            pkg.python, "-m", "pip", "install", "-q", "-c", str(ROOT / "requirements" / "lock.txt"),
            str(whl), timeout=600,
        ),
        "installing the wheel",
    )  # fmt: skip
    yield pkg


def test_the_wheel_holds_the_compiled_modules_and_the_console_files(
    installed: Installed,
) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    for asset in ASSETS:
        assert f"wheel/console/static/{asset}" in names
    if not compiler():
        pytest.skip("no C compiler: the build keeps the hot modules pure Python")
    for module in MODULES:
        path = module.replace(".", "/")
        prefixes = (f"{path}.cpython-", f"{path}/__init__.cpython-")
        assert any(n.startswith(prefixes) and n.endswith(".so") for n in names), module
    assert "wheel/_compiled.json" in names


def test_wheelctl_version_prints_the_installed_distributions_version(
    installed: Installed,
) -> None:
    out = installed.run(str(installed.venv / "bin" / "wheelctl"), "--version")
    _check(out, "wheelctl --version")
    assert out.stdout.strip() == f"wheelctl {VERSION}"


def test_every_module_imports_without_the_dev_extras(installed: Installed) -> None:
    """Not only what the demo happens to touch: every module of the package."""
    script = f"""
import importlib, importlib.metadata, importlib.util, pkgutil, sys
import wheel
from wheel._compiled import MODULES, compiled
assert wheel.__file__.startswith({str(installed.venv)!r}), wheel.__file__
for name in {DEV_ONLY!r}:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        continue
    sys.exit(f"{{name}} is installed: the venv must not have the dev extras")
for info in pkgutil.walk_packages(wheel.__path__, "wheel."):
    if info.name != "wheel.__main__":
        importlib.import_module(info.name)
print(sum(compiled(sys.modules[m]) for m in MODULES))
"""
    out = installed.run(installed.python, "-c", script)
    _check(out, "importing every module")
    if compiler():
        assert int(out.stdout.strip()) == len(MODULES)


def test_the_demo_runs_from_the_installed_package(installed: Installed) -> None:
    out = installed.run(
        str(installed.venv / "bin" / "wheelctl"),
        "demo", "--duration", "5", "--port", str(free_port()),
        timeout=90,
    )  # fmt: skip
    _check(out, "wheelctl demo")
    assert "-> succeeded" in out.stdout, out.stdout
    assert "== done:" in out.stdout


def test_the_console_serves_its_page_and_static_files_from_the_installed_package(
    installed: Installed, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    http = free_port()
    node = ServerProc(data, args=("--http-listen", f"127.0.0.1:{http}"), python=installed.python)
    node.start()
    try:
        static = ROOT / "src" / "wheel" / "console" / "static"
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/", timeout=10) as page:
            assert page.status == 200
            assert page.read() == (static / "index.html").read_bytes()
        for asset in ASSETS[1:]:
            url = f"http://127.0.0.1:{http}/static/{asset}"
            with urllib.request.urlopen(url, timeout=10) as resp:
                assert resp.status == 200
                assert resp.read() == (static / asset).read_bytes()
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/api/jobs", timeout=10) as resp:
            assert resp.status == 200
    finally:
        node.stop()
