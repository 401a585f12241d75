"""The chaos checker on made-up histories: each violation it exists to find,
found; a clean history, clean."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.promises import Missed, PlannedJob, ResourceWrite, Run, check

E = 1 << 32  # epoch 1's first fence


def start(job: int, fire: int, run: int, t_ms: int, attempt: int = 0) -> dict[str, Any]:
    return {"kind": "start", "job": job, "scheduled_for": fire, "run": run, "attempt": attempt,
            "fence": E + run, "t": t_ms / 1000}  # fmt: skip


def end(job: int, fire: int, run: int, outcome: str = "succeeded", **extra: Any) -> dict[str, Any]:
    return {"kind": "end", "job": job, "scheduled_for": fire, "run": run, "attempt": 0,
            "fence": E + run, "outcome": outcome, **extra}  # fmt: skip


def ok(job: int, fire: int, run: int, attempt: int = 0, state: str = "succeeded") -> Run:
    return Run(run_id=run, job_id=job, scheduled_for=fire, attempt=attempt, state=state,
               fence=E + run, dispatched_at_ms=fire, finished_at_ms=fire + 100)  # fmt: skip


ONCE = PlannedJob(job_id=1, kind="once", first_ms=10_000)
EVERY = PlannedJob(job_id=2, kind="interval", first_ms=10_000, period_ms=1_000)


def test_a_clean_history_has_no_violation() -> None:
    runs = [ok(1, 10_000, 1), ok(2, 10_000, 2), ok(2, 11_000, 3)]
    effects = [start(1, 10_000, 1, 10_005), end(1, 10_000, 1, accepted=True)]
    effects += [start(2, 10_000, 2, 10_050), start(2, 11_000, 3, 11_900)]
    missed = [Missed(job_id=2, scheduled_for=12_000, reason="overlap")]
    runs.append(Run(run_id=4, job_id=2, scheduled_for=11_500, attempt=0, state="succeeded",
                    fence=E + 4, dispatched_at_ms=11_600, finished_at_ms=None))  # fmt: skip
    v = check([ONCE, EVERY], runs, missed, effects, [], end_ms=12_000)
    assert v.fires == 4 and v.fires_run == 3
    assert set(v.violations().values()) == {0}
    assert v.max_late_s == pytest.approx(0.9) and v.latest == (2, 11_000)


def test_a_fire_with_only_a_lost_attempt_is_lost_and_settled_ones_are_not() -> None:
    runs = [ok(1, 10_000, 1, state="lost"), ok(2, 10_000, 2, state="dead_lettered")]
    runs += [ok(2, 11_000, 3, state="unknown")]
    v = check([ONCE, EVERY], runs, [], [], [], end_ms=11_000)
    assert v.lost == [(1, 10_000)]
    assert v.unknown == [(2, 11_000)] and v.dead_lettered == 1


def test_a_start_before_the_fire_is_early() -> None:
    v = check([ONCE], [ok(1, 10_000, 1)], [], [start(1, 10_000, 1, 9_998)], [], end_ms=20_000)
    assert [e["early_ms"] for e in v.early] == [2]


def test_two_accepted_successes_and_a_stale_fence_are_found() -> None:
    runs = [ok(1, 10_000, 1), ok(1, 10_000, 2, attempt=1)]
    v = check([ONCE], runs, [], [], [], end_ms=20_000)
    assert v.duplicates == [(1, 10_000)]
    assert [s["run"] for s in v.stale_fence_accepted] == [1]


def test_the_resource_accepting_an_older_fence_is_stale() -> None:
    writes = [
        ResourceWrite(seq=1, job_id=1, key="1:10000", fence=E + 5, run_id=5, accepted=True),
        ResourceWrite(seq=2, job_id=1, key="1:10000", fence=E + 3, run_id=3, accepted=True),
        ResourceWrite(seq=3, job_id=1, key="1:10000", fence=E + 2, run_id=2, accepted=False),
    ]
    v = check([ONCE], [ok(1, 10_000, 5)], [], [], writes, end_ms=20_000)
    assert [(s["where"], s["run"]) for s in v.stale_fence_accepted] == [("resource", 3)]


def test_missed_records_the_history_does_not_bear_out() -> None:
    runs = [ok(2, 10_000, 1), ok(2, 13_000, 2)]
    missed = [
        Missed(job_id=2, scheduled_for=10_000, reason="collapsed"),  # it ran
        Missed(job_id=2, scheduled_for=11_000, reason="collapsed"),  # 13_000 ran: fine
        Missed(job_id=2, scheduled_for=12_000, reason="overlap"),  # nothing in flight
        Missed(job_id=2, scheduled_for=14_000, reason="collapsed"),  # nothing later
        Missed(job_id=2, scheduled_for=15_000, reason="paused"),  # never paused
    ]
    v = check([EVERY], runs, missed, [], [], end_ms=15_000, overlap_tolerance_ms=500)
    assert [m["scheduled_for"] for m in v.missed_without_reason] == [10_000, 12_000, 14_000, 15_000]
    assert v.lost == []


def test_an_overlap_judged_late_is_borne_out_by_a_run_in_flight_when_it_was_judged() -> None:
    # Due at 12_000, judged at 15_000 by an owner that took the shard on late,
    # while the 11_000 fire's run (dispatched at 14_000) was going.
    late = Run(run_id=1, job_id=2, scheduled_for=11_000, attempt=0, state="lost",
               fence=E + 1, dispatched_at_ms=14_000, finished_at_ms=19_000)  # fmt: skip
    missed = [Missed(job_id=2, scheduled_for=12_000, reason="overlap", recorded_at_ms=15_000)]
    v = check([EVERY], [late], missed, [], [], end_ms=12_000, overlap_tolerance_ms=500)
    assert v.missed_without_reason == []
    missed = [Missed(job_id=2, scheduled_for=12_000, reason="overlap", recorded_at_ms=13_000)]
    v = check([EVERY], [late], missed, [], [], end_ms=12_000, overlap_tolerance_ms=500)
    assert len(v.missed_without_reason) == 1


def test_a_fire_waiting_for_its_redispatch_or_retry_still_holds_the_jobs_slot() -> None:
    # The 10_000 fire's first attempt was lost at 10_500 and re-dispatched at
    # 14_000 (the reaper waited for workers): fires due meanwhile were rightly
    # skipped for the overlap; one due after its success was not.
    lost = Run(run_id=1, job_id=2, scheduled_for=10_000, attempt=0, state="lost",
               fence=E + 1, dispatched_at_ms=10_000, finished_at_ms=10_500)  # fmt: skip
    redo = Run(run_id=2, job_id=2, scheduled_for=10_000, attempt=1, state="succeeded",
               fence=E + 2, dispatched_at_ms=14_000, finished_at_ms=14_100)  # fmt: skip
    missed = [
        Missed(job_id=2, scheduled_for=f, reason="overlap", recorded_at_ms=f)
        for f in (12_000, 13_000, 17_000)
    ]
    v = check([EVERY], [lost, redo], missed, [], [], end_ms=10_000, overlap_tolerance_ms=500)
    assert [m["scheduled_for"] for m in v.missed_without_reason] == [17_000]
    # Its re-dispatch still owed at the end: the slot is still held.
    v = check([EVERY], [lost], missed, [], [], end_ms=10_000, overlap_tolerance_ms=500)
    assert v.missed_without_reason == []


def test_an_at_most_once_fire_sent_again_after_a_lost_lease_is_found() -> None:
    job = PlannedJob(job_id=1, kind="once", first_ms=10_000, at_most_once=True)
    runs = [ok(1, 10_000, 1, state="lost"), ok(1, 10_000, 2, attempt=1)]
    assert check([job], runs, [], [], [], end_ms=20_000).at_most_once_redispatched == [(1, 10_000)]


def test_a_success_whose_fenced_write_was_refused_is_found() -> None:
    effects = [start(1, 10_000, 1, 10_001), end(1, 10_000, 1, accepted=False)]
    v = check([ONCE], [ok(1, 10_000, 1)], [], effects, [], end_ms=20_000)
    assert [s["run"] for s in v.success_with_refused_effect] == [1]


def test_cron_fires_are_the_listed_seconds_of_each_minute_from_the_judged_start() -> None:
    job = PlannedJob(job_id=3, kind="cron", seconds=(0, 30), from_ms=59_000)
    assert job.fires_until(121_000) == [60_000, 90_000, 120_000]


def test_a_listed_plan_owes_its_fires_and_allows_the_missed_reasons_it_names() -> None:
    job = PlannedJob(job_id=4, kind="listed", fires=(10_000, 20_000, 30_000),
                     missed_reasons=frozenset({"skipped"}), cancelled_at_ms=25_000,
                     dst_gaps=frozenset({15_000}))  # fmt: skip
    assert job.fires_until(20_000) == [10_000, 20_000]
    assert PlannedJob.from_json(job.to_json()) == job
    missed = [
        Missed(job_id=4, scheduled_for=10_000, reason="skipped"),
        Missed(job_id=4, scheduled_for=15_000, reason="dst_gap"),  # a gap instant
        Missed(job_id=4, scheduled_for=20_000, reason="cancelled"),  # queued at the cancel
        Missed(job_id=4, scheduled_for=30_000, reason="cancelled"),  # due after it
        Missed(job_id=4, scheduled_for=35_000, reason="dst_gap"),  # no gap there
    ]
    v = check([job], [], missed, [], [], end_ms=40_000)
    assert v.fires == 3 and v.lost == []
    assert [m["scheduled_for"] for m in v.missed_without_reason] == [30_000, 35_000]
