"""The package as a user gets it (built and installed in conftest.py): the
sdist carries what a build needs and nothing of a checkout's debris, the
wheel built from it the compiled modules, the console files and the
generated protobuf modules; installed into a fresh virtualenv without the
dev extras it runs ``wheelctl --version``, the demo and the web console. An
editable checkout with the dev extras hides what only the dev extras bring
(``mypy_extensions`` came with mypy, and the compiled owner modules once
imported it: the owner's parts are plain classes now, and the installed
package must run without it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tomllib
import urllib.request
import zipfile
from pathlib import Path

import pytest

from testkit.procs import ServerProc
from testkit.services import free_port
from tests.installed.conftest import Installed, check, clean_env
from wheel._compiled import MODULES

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
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
# What a build from the sdist needs, and what its reader expects.
SDIST_FILES = (
    "PKG-INFO",
    "pyproject.toml",
    "hatch_build.py",
    "README.md",
    "LICENSE",
    "CHANGELOG.md",
    "requirements/lock.txt",
    "src/wheel/__init__.py",
    "src/wheel/_compiled.py",
    "src/wheel/console/static/index.html",
    "src/wheel/console/static/console.js",
    "src/wheel/console/static/console.css",
    "ops/systemd/wheel-node.service",
    "ops/systemd/wheel-worker@.service",
)
SDIST_TREES = ("src/wheel/", "proto/", "docs/", "ops/", "requirements/")
# A checkout's debris: caches, venvs, compiled extensions, build output.
DEBRIS = ("__pycache__", ".pyc", ".so", "venv", "_cache", ".hypothesis", "_compiled.json", "dist/")


def compiler() -> bool:
    """Whether the build hook compiles here (it needs a C compiler)."""
    return bool(shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc"))


def tracked(*paths: str) -> list[str]:
    """The checkout's files under ``paths`` as git knows them."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--", *paths],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return out.stdout.split()


def test_python_m_build_makes_the_sdist_then_the_wheel_from_it(installed: Installed) -> None:
    assert installed.sdist.name == f"wheel_scheduler-{VERSION}.tar.gz"
    assert "Building wheel from sdist" in installed.build_log, installed.build_log
    # Nothing else in dist/: the compile step cleans up after itself.
    assert sorted(installed.sdist.parent.iterdir()) == sorted([installed.sdist, installed.wheel])


def test_the_sdist_holds_what_a_build_needs_and_no_debris(installed: Installed) -> None:
    prefix = f"wheel_scheduler-{VERSION}/"
    with tarfile.open(installed.sdist) as tar:
        names = [m.name.removeprefix(prefix) for m in tar.getmembers() if m.isfile()]
    for name in SDIST_FILES:
        assert name in names, name
    if (ROOT / ".git").exists():
        # The contract and the generated modules, the docs and the ops files.
        for name in tracked("proto", "src/wheel", "docs", "ops"):
            assert name in names, name
    loose = [n for n in names if "/" in n and not n.startswith(SDIST_TREES)]
    assert loose == [], "files outside what the sdist carries"
    assert [n for n in names if any(d in n for d in DEBRIS)] == []
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", ".venv/"))]


def test_the_wheel_holds_the_compiled_modules_and_the_console_files(
    installed: Installed,
) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    for asset in ASSETS:
        assert f"wheel/console/static/{asset}" in names
    for proto in (ROOT / "proto" / "wheel" / "rpc" / "v1").glob("*.proto"):
        for generated in ("_pb2.py", "_pb2_grpc.py"):
            assert f"wheel/rpc/v1/{proto.stem}{generated}" in names
    assert f"wheel_scheduler-{VERSION}.dist-info/licenses/LICENSE" in names
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
    out = installed.run(installed.wheelctl, "--version")
    check(out, "wheelctl --version")
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
    check(out, "importing every module")
    if compiler():
        assert int(out.stdout.strip()) == len(MODULES)


def test_the_demo_runs_from_the_installed_package(installed: Installed) -> None:
    out = installed.run(
        installed.wheelctl,
        "demo", "--duration", "5", "--port", str(free_port()),
        timeout=90,
    )  # fmt: skip
    check(out, "wheelctl demo")
    assert "-> succeeded" in out.stdout, out.stdout
    assert "== done:" in out.stdout


def test_the_console_serves_its_page_and_static_files_from_the_installed_package(
    installed: Installed, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    http = free_port()
    node = ServerProc(
        data,
        args=("--http-listen", f"127.0.0.1:{http}"),
        python=installed.python,
        env=clean_env(),  # the installed package's modules, not the checkout's
    )
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
