"""The simulator's verdict on promises 1 to 5 is ``testkit.promises.check``'s,
the nemesis's judge: a fire the history drops, or records missed although it
ran, is reported through it."""

from __future__ import annotations

from typing import Any

import pytest

from testkit import promises
from testkit.promises import Promise, Verdict, Violation
from tests.engine import sim_check
from tests.engine.sim import HOUR, Sim, SimScale
from tests.engine.sim_check import check
from wheel.engine.model import MissedReason, RunState
from wheel.engine.records import MissedFire


@pytest.fixture(scope="module")
def small() -> Sim:
    return Sim(3, SimScale(jobs=60, days=0.25, quiet_ms=HOUR)).run()


def _judged(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Verdict], list[Violation]]:
    verdicts: list[Verdict] = []

    def spy(*args: Any, **kwargs: Any) -> Verdict:
        verdicts.append(promises.check(*args, **kwargs))
        return verdicts[-1]

    monkeypatch.setattr(sim_check, "check_promises", spy)
    return verdicts, check(sim)


def test_a_clean_history_is_judged_by_the_one_checker(
    small: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    verdicts, violations = _judged(small, monkeypatch)
    assert violations == []
    [verdict] = verdicts
    assert verdict.fires > 100 and verdict.fires_run > 100
    assert set(verdict.violations().values()) == {0}
    assert small.history.writes and any(e["kind"] == "end" for e in small.history.effects)


def _ran_fire(sim: Sim) -> tuple[int, int]:
    """A scheduled fire that one attempt ran to success."""
    attempts: dict[tuple[int, int], int] = {}
    for ex in sim.store.execs.values():
        key = (ex.job_id, ex.scheduled_for)
        attempts[key] = attempts.get(key, 0) + 1
    return next(
        (ex.job_id, ex.scheduled_for)
        for ex in sim.store.execs.values()
        if ex.scheduled_for < sim.end
        and ex.scheduled_for not in sim.jobs[ex.job_id].extra_fires
        and ex.state is RunState.SUCCEEDED
        and attempts[(ex.job_id, ex.scheduled_for)] == 1
    )


def test_a_fire_both_run_and_recorded_missed_is_reported_through_the_checker(
    small: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id, f = _ran_fire(small)
    key = (job_id, f)
    small.store.missed[key] = MissedFire(
        job_id=job_id, scheduled_for=f, reason=MissedReason.OVERLAP, recorded_at_ms=f
    )
    try:
        verdicts, violations = _judged(small, monkeypatch)
    finally:
        del small.store.missed[key]
    [verdict] = verdicts
    assert [(m["job"], m["scheduled_for"]) for m in verdict.missed_without_reason] == [key]
    assert verdict.missed_without_reason[0]["why"] == "the fire also has executions"
    [v] = violations
    assert v.rule == "missed_without_reason" and v.promise is Promise.NO_SILENT_DROP
    assert f"job {job_id} " in v.detail and f"fire {f} " in v.detail


def test_a_lost_fire_is_reported_through_the_checker(
    small: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id, f = _ran_fire(small)
    # Its success, undone: the store says the run's lease was lost, and no
    # attempt follows.
    [ex] = [ex for ex in small.store.execs.values() if (ex.job_id, ex.scheduled_for) == (job_id, f)]
    ex.state = RunState.LOST
    try:
        verdicts, violations = _judged(small, monkeypatch)
    finally:
        ex.state = RunState.SUCCEEDED
    [verdict] = verdicts
    assert verdict.lost == [(job_id, f)]
    lost = [v for v in violations if v.rule == "lost"]
    assert len(lost) == 1 and lost[0].promise is Promise.NO_SILENT_DROP
    assert f"fire {f} " in lost[0].detail
