"""``tests`` and ``benchmarks`` do not import each other; what both need is in
``testkit``, which imports neither.

Read with ``ast``: an import of the other tree by its package name, an import
of a benchmark module by its bare name (``import dispatch``, how a script
beside it imports it), or a ``sys.path`` change that would make such an
import work. Running a benchmark as a program (``python benchmarks/x.py``)
is not an import and is fine.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
BENCHMARK_MODULES = frozenset(p.stem for p in BENCHMARKS.glob("*.py")) | {"benchmarks"}


def modules(tree: str) -> list[Path]:
    return sorted((ROOT / tree).rglob("*.py"))


def imports(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def path_changes(path: Path) -> Iterator[int]:
    """Lines that change ``sys.path`` (``sys.path.insert``, ``.append``, ...)."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        ):
            yield node.lineno


def offences(path: Path, refused: frozenset[str], *, path_changes_refused: bool) -> list[str]:
    where = path.relative_to(ROOT)
    found = [f"{where}:{line} imports {name}" for line, name in imports(path) if name in refused]
    if path_changes_refused:
        found += [f"{where}:{line} changes sys.path" for line in path_changes(path)]
    return found


@pytest.mark.parametrize("path", modules("tests"), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_test_imports_a_benchmark(path: Path) -> None:
    assert offences(path, BENCHMARK_MODULES, path_changes_refused=True) == []


@pytest.mark.parametrize("path", modules("benchmarks"), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_benchmark_imports_the_tests(path: Path) -> None:
    assert offences(path, frozenset({"tests"}), path_changes_refused=False) == []


@pytest.mark.parametrize("path", modules("testkit"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_shared_kit_imports_neither(path: Path) -> None:
    refused = BENCHMARK_MODULES | {"tests"}
    assert offences(path, refused, path_changes_refused=True) == []


def test_the_check_finds_an_import_either_way_and_a_path_change(tmp_path: Path) -> None:
    probe = ROOT / "tests" / "probe.py"
    assert not probe.exists()
    source = (
        "import sys\nsys.path.insert(0, 'benchmarks')\nimport dispatch\nfrom tests.x import y\n"
    )
    fake = tmp_path / "probe.py"
    fake.write_text(source)
    assert [name for _, name in imports(fake)] == ["sys", "dispatch", "tests"]
    assert list(path_changes(fake)) == [2]
