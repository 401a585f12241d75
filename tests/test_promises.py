"""The promises checker's numbering: every rule the simulator or the nemesis
checks is named after a promise of ``docs/design.md``, numbered as there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from testkit.promises import RULES, Promise, Verdict, Violation

ROOT = Path(__file__).resolve().parents[1]


def test_the_promises_are_numbered_as_in_the_design() -> None:
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("## The promise to users", 1)[1].split("\n## ", 1)[0]
    numbered = re.findall(r"^(\d+)\. \*\*([^*]+)\*\*", section, flags=re.MULTILINE)
    assert [int(n) for n, _ in numbered] == [p.value for p in Promise]
    said = {
        Promise.NO_SILENT_DROP: "never a silent drop",
        Promise.NEVER_EARLY: "never early",
        Promise.EFFECT_ONCE_WITH_THE_HANDLER: "exactly-once effect needs the handler",
        Promise.PER_JOB_SERIALIZATION: "per-job serialization",
        Promise.ACKNOWLEDGED_NEVER_LOST: "acknowledged are never lost",
    }
    for p, (_, title) in zip(Promise, numbered, strict=True):
        assert said[p] in title.lower(), (p, title)


def test_every_rule_the_simulator_names_guards_a_promise() -> None:
    sim = ast.parse((ROOT / "tests" / "engine" / "sim_check.py").read_text())
    named = {
        node.args[0].value
        for node in ast.walk(sim)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "Violation"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }
    assert named and named <= RULES.keys(), named - RULES.keys()


def test_every_count_the_nemesis_must_find_zero_guards_a_promise() -> None:
    assert Verdict().violations().keys() <= RULES.keys()
    verdict = Verdict(lost=[(1, 10)], duplicates=[(2, 20), (3, 30)])
    by_promise = verdict.by_promise()
    assert by_promise[Promise.NO_SILENT_DROP] == 1
    assert by_promise[Promise.EFFECT_ONCE_WITH_THE_HANDLER] == 2
    assert by_promise[Promise.NEVER_EARLY] == 0


def test_a_violation_reads_with_its_promise_number() -> None:
    v = Violation("never early", "run 7 handed out at 5 < 10")
    assert v.promise is Promise.NEVER_EARLY
    assert str(v) == "[promise 2, never early] run 7 handed out at 5 < 10"
