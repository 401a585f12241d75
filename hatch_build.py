"""The package build's compile step: the hot modules (``wheel._compiled.MODULES``)
through mypyc into C extensions.

As a hatchling build hook it runs with every build: an editable install
compiles the extensions in place, beside their sources under ``src/``; a
wheel gets them in its archive and a platform tag. Run by hand
(``python hatch_build.py``) it compiles in place for the checkout's own
interpreter, which is what ``scripts/bootstrap.sh`` does when a compiled
module's source changed. ``WHEEL_PURE_PYTHON=1`` builds without compiling;
so does a machine without a C compiler (with a warning): the sources then
run as they are.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
SRC = ROOT / "src"
LIST = SRC / "wheel" / "_compiled.py"
MANIFEST = SRC / "wheel" / "_compiled.json"


# The build environment holds the build's requirements alone, not the
# packages the compiled modules import (psycopg, prometheus_client,
# cryptography, OpenTelemetry): there their types are unknown (Any), which
# the strict checks of the project's own type check would refuse. The
# compile reads the types it can; the type check of the sources
# (``mypy``, with every package installed) stays strict.
LENIENT = [
    "--ignore-missing-imports",
    "--allow-subclassing-any",
    "--no-warn-return-any",
    "--no-warn-unused-ignores",
    "--allow-untyped-calls",
    "--allow-untyped-decorators",
]


def modules() -> list[str]:
    """``MODULES`` of wheel/_compiled.py, read without importing wheel."""
    for node in ast.parse(LIST.read_text()).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "MODULES":
            assert node.value is not None
            return list(ast.literal_eval(node.value))
    raise RuntimeError(f"no MODULES in {LIST}")


def sources(names: list[str]) -> list[Path]:
    paths = [SRC.joinpath(*m.split(".")) for m in names]
    return [p / "__init__.py" if p.is_dir() else p.with_suffix(".py") for p in paths]


def clean() -> None:
    """Remove every extension built in place (back to the sources)."""
    for so in [*SRC.glob("*__mypyc*.so"), *(SRC / "wheel").rglob("*.so")]:
        so.unlink()
    MANIFEST.unlink(missing_ok=True)


def compile_to(out: Path) -> list[Path]:
    """Compile the modules with mypyc; the extensions go under ``out`` at
    their package paths (and the shared runtime library at its top).
    Returns them, relative to ``out``."""
    from mypyc.build import mypycify
    from setuptools import Distribution

    names = modules()
    cwd = Path.cwd()
    build = Path(tempfile.mkdtemp(prefix="wheel-mypyc-"))
    try:
        os.chdir(ROOT)  # mypyc reads [tool.mypy] of pyproject.toml from here
        paths = [str(p.relative_to(ROOT)) for p in sources(names)]
        extensions = mypycify(
            ["--config-file", "pyproject.toml", *LENIENT, *paths],
            opt_level="3",
            target_dir=str(build / "c"),
            # A C file a module, compiled side by side (``_parallel``): as
            # one file the C compiler took five minutes on one core.
            multi_file=True,
        )
        dist = Distribution({"name": "wheel-compiled", "ext_modules": extensions})
        cmd = dist.get_command_obj("build_ext")
        cmd.build_lib = str(build / "lib")  # type: ignore[attr-defined]
        cmd.build_temp = str(build / "tmp")  # type: ignore[attr-defined]
        cmd.inplace = False  # type: ignore[attr-defined]
        cmd.parallel = os.cpu_count() or 1  # type: ignore[attr-defined]
        cmd.ensure_finalized()
        serial = cmd.build_extensions  # type: ignore[attr-defined]

        def build_extensions() -> None:
            _parallel(cmd.compiler)  # type: ignore[attr-defined]
            serial()

        cmd.build_extensions = build_extensions  # type: ignore[attr-defined]
        cmd.run()
        built = []
        for so in (build / "lib").rglob("*.so"):
            rel = so.relative_to(build / "lib")
            dest = out / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(so, dest)
            built.append(rel)
    finally:
        os.chdir(cwd)
        shutil.rmtree(build, ignore_errors=True)
    (out / "wheel").mkdir(parents=True, exist_ok=True)
    (out / "wheel" / "_compiled.json").write_text(
        json.dumps(
            {
                m: hashlib.sha256(p.read_bytes()).hexdigest()
                for m, p in zip(names, sources(names), strict=True)
            },
            indent=1,
        )
    )
    return built


def _parallel(compiler: Any) -> None:
    """Have ``compiler`` compile an extension's C files on every core: the
    shared library of the compiled modules is one extension of dozens of
    files, which setuptools compiles one after another. Left serial where
    the compiler is not the one whose steps this repeats."""
    steps = ("_setup_compile", "_get_cc_args", "_compile")
    if not all(hasattr(compiler, step) for step in steps):
        return

    def compile(
        sources: list[str],
        output_dir: str | None = None,
        macros: Any = None,
        include_dirs: Any = None,
        debug: bool = False,
        extra_preargs: list[str] | None = None,
        extra_postargs: list[str] | None = None,
        depends: Any = None,
    ) -> list[str]:
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs
        )
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj: str) -> None:
            if obj in build:
                src, ext = build[obj]
                compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            list(pool.map(one, objects))  # raises the first compile's error
        return list(objects)

    compiler.compile = compile


def wanted() -> bool:
    if os.environ.get("WHEEL_PURE_PYTHON"):
        return False
    if shutil.which(os.environ.get("CC", "gcc")) is None and shutil.which("cc") is None:
        print("wheel: no C compiler: the hot modules stay pure Python", file=sys.stderr)
        return False
    return True


try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # run by hand: no hatchling needed
    pass
else:

    class CompileHook(BuildHookInterface):  # type: ignore[type-arg]
        PLUGIN_NAME = "custom"

        def initialize(self, version: str, build_data: dict[str, Any]) -> None:
            if self.target_name not in ("wheel", "editable") and version != "editable":
                return
            if not wanted():
                return
            try:
                if version == "editable":
                    clean()
                    compile_to(SRC)
                    return
                out = Path(self.directory) / "mypyc-out"
                built = compile_to(out)
            except (Exception, SystemExit) as exc:  # the sources run as they are
                print(
                    f"wheel: compiling the hot modules failed ({exc}): pure Python", file=sys.stderr
                )
                if version == "editable":  # a wheel's failed compile leaves the checkout's be
                    clean()
                return
            for rel in [*built, Path("wheel/_compiled.json")]:
                build_data["force_include"][str(out / rel)] = str(rel)
            build_data["pure_python"] = False
            build_data["infer_tag"] = True

        def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
            # The extensions are in the wheel now: the output directory
            # (dist/) keeps the artifacts alone.
            shutil.rmtree(Path(self.directory) / "mypyc-out", ignore_errors=True)


def main() -> int:
    if "--clean" in sys.argv:
        clean()
        return 0
    if not wanted():
        clean()
        return 0
    clean()
    built = compile_to(SRC)
    print(f"wheel: compiled {len(built)} extensions in place", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
