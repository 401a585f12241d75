"""The hot path runs compiled (mypyc), and the same sources run without it."""

from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import sys

import pytest

from testkit.services import IN_CI
from wheel._compiled import MANIFEST, MODULES, compiled, source_hashes

PURE = bool(os.environ.get("WHEEL_PURE_PYTHON"))


@pytest.mark.skipif(PURE, reason="the pure-Python run loads the sources")
def test_the_hot_modules_are_loaded_compiled() -> None:
    if not MANIFEST.exists() and not IN_CI:
        pytest.skip("not compiled here (no C compiler?): ./scripts/bootstrap.sh builds them")
    loaded = {m: importlib.import_module(m) for m in MODULES}
    assert [m for m, mod in loaded.items() if not compiled(mod)] == []
    # Built from the sources as they are now.
    assert MANIFEST.exists()
    assert set(source_hashes()) == set(MODULES)


@pytest.mark.skipif(not PURE, reason="only in the pure-Python run")
def test_the_pure_python_run_loads_every_hot_module_from_its_source() -> None:
    for m in MODULES:
        mod = importlib.import_module(m)
        assert not compiled(mod), mod.__file__
        assert mod.__file__ is not None and mod.__file__.endswith(".py")


def test_wheel_pure_python_switches_a_fresh_interpreter_to_the_sources() -> None:
    code = (
        "import wheel.engine.timerwheel as t, wheel.engine.owner as o\n"
        "w = t.TimerWheel(0); w.add(1, 5)\n"
        "print(t.__file__, sorted(w.advance(10)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "WHEEL_PURE_PYTHON": "1"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[0].endswith("timerwheel.py")
    assert out[1:] == ["[1]"]


def test_every_compiled_class_with_a_length_says_its_truth() -> None:
    # Compiled code tests an Optional of a compiled class that has __len__
    # and no __bool__ for None only: an empty queue was true there, and the
    # owner's dispatch went wrong without a word (a simulator seed found it).
    import ast

    from wheel._compiled import source_of

    missing = []
    for m in MODULES:
        for node in ast.walk(ast.parse(source_of(m).read_text())):
            if isinstance(node, ast.ClassDef):
                names = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                if "__len__" in names and "__bool__" not in names:
                    missing.append(f"{m}.{node.name}")
    assert missing == []


def test_the_records_built_per_dispatch_are_built_by_their_own_init() -> None:
    # The __init__ ``dataclass`` writes is made with exec at run time: the
    # build cannot compile it, and each record built with it ran Python (300
    # to 600 ns against 26 to 40 compiled). One built per dispatch spells
    # its own out (``init=False``); a module that builds one per dispatch
    # names it here.
    from wheel.engine import records, spec
    from wheel.engine.owner import _claims, _values

    per_dispatch = [
        records.FireClaim,
        records.ClaimOutcome,
        records.ScheduleAdvance,
        records.RunStart,
        records.Completion,
        records.CompletionOutcome,
        records.MissedFire,
        _values.Assignment,
        _values.CompletionResult,
        _claims._Pending,
        spec.Once,
    ]
    # dataclass's own is a function compiled from a string (its code's file
    # is "<string>"); compiled, ours is no Python function at all.
    made = [
        c.__name__
        for c in per_dispatch
        if getattr(getattr(vars(c)["__init__"], "__code__", None), "co_filename", "") == "<string>"
    ]
    assert made == []
    claim = records.FireClaim(job_id=1, scheduled_for=2, attempt=1, fence=3, dispatched_at_ms=4)
    # Still a dataclass: defaults, equality, replace.
    assert (claim.advance, claim.expected_next_run_at, claim.payload) == (True, None, False)
    assert dataclasses.replace(claim, fence=9) == records.FireClaim(
        job_id=1, scheduled_for=2, attempt=1, fence=9, dispatched_at_ms=4
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.Once(at_ms=5).at_ms = 6  # type: ignore[misc]


@pytest.mark.skipif(PURE, reason="compares the compiled engine with its sources")
@pytest.mark.parametrize("seed", [3, 25])
def test_the_compiled_engine_decides_exactly_as_its_sources(seed: int) -> None:
    """A simulated fleet with faults, run on the compiled engine here and on
    the sources in a fresh interpreter: every store batch and every message,
    in order, the same."""
    from tests.engine.sim_digest import digest

    here = digest(seed)
    out = subprocess.run(
        [sys.executable, "-m", "tests.engine.sim_digest", str(seed)],
        env={**os.environ, "WHEEL_PURE_PYTHON": "1"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert here[1] > 1_000
    assert (out[0], int(out[1])) == here
