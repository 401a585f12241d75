"""The package as a user gets it, built once for every test here: the PyPA
``build`` front end makes the sdist and then the wheel from that sdist (its
hot modules compiled, as the build hook does), and the wheel is installed
(not editable) into a fresh virtualenv without the dev extras.

``build`` runs from a throwaway virtualenv holding only itself, at the
lock's version: the tests do not depend on the venv they run from having
been made since ``build`` joined the dev extra. It builds in isolation, as a
user's ``python -m build`` does: the build requirements come from the
package index pip is configured with, and the project's venv (which must
never get PyPA's ``wheel``) is not touched."""

from __future__ import annotations

import os
import subprocess
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "lock.txt"


@dataclass(frozen=True, slots=True, kw_only=True)
class Installed:
    sdist: Path
    wheel: Path
    # What `python -m build` printed: which artifact it built from what.
    build_log: str
    venv: Path
    # Where its commands run: not this checkout, whose files must not be found.
    cwd: Path

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    @property
    def wheelctl(self) -> str:
        return str(self.venv / "bin" / "wheelctl")

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, cwd=self.cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout
        )


def clean_env() -> dict[str, str]:
    """This process's environment without what points at the checkout's
    sources or keeps the build from compiling."""
    drop = ("PYTHONPATH", "WHEEL_PURE_PYTHON", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if k not in drop}


def check(proc: subprocess.CompletedProcess[str], what: str) -> None:
    assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"


def new_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(path)
    return path / "bin" / "python"


# The build alone may take its 900 s (below) on a machine busy with the
# rest of the suite; pytest's timeout of a test counts its fixtures' setup.
BUILD_TIMEOUT_S = 900
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # every test collected, not only this directory's
        if "installed" in getattr(item, "fixturenames", ()) and item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.timeout(BUILD_TIMEOUT_S + 300))


@pytest.fixture(scope="package")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """One build and one install for the package's tests (the compile alone
    takes a minute or more)."""
    tmp = tmp_path_factory.mktemp("installed")
    cwd = tmp / "cwd"
    cwd.mkdir()

    def run(*argv: str | Path, what: str, timeout: float = 600) -> str:
        proc = subprocess.run(
            [str(a) for a in argv], cwd=cwd, env=clean_env(), capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        check(proc, what)
        return proc.stdout + proc.stderr

    builder = new_venv(tmp / "builder")
    run(builder, "-m", "pip", "install", "-q", "-c", LOCK, "build", what="installing build")
    dist = tmp / "dist"
    # No --sdist or --wheel: the sdist, then the wheel built from it.
    log = run(
        builder, "-m", "build", "--outdir", dist, ROOT, what="python -m build",
        timeout=BUILD_TIMEOUT_S,
    )  # fmt: skip
    (sdist,) = dist.glob("wheel_scheduler-*.tar.gz")
    (whl,) = dist.glob("wheel_scheduler-*.whl")
    user = tmp / "venv"
    python = new_venv(user)
    # The versions this project is tested with, from the same index as ever.
    run(python, "-m", "pip", "install", "-q", "-c", LOCK, whl, what="installing the wheel")
    yield Installed(sdist=sdist, wheel=whl, build_log=log, venv=user, cwd=cwd)
