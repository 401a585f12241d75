"""Jobs at rest as packed rows (``wheel.engine.jobtable``,
``wheel.engine.owner._packed``): the table's rows, the arming window, jobs
going to rest and waking, and -- the property that matters -- a job kept
packed between its fires fires exactly as one kept awake as an object."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.sim import HOUR, MIN, SEC
from tests.engine.test_owner import Node, T, spec
from wheel.engine.jobtable import AWAKE, GONE, NEVER, Columns, ShardJobs, rows_of
from wheel.engine.model import MissedReason
from wheel.engine.owner import FIRE, Outcome, OwnerConfig
from wheel.engine.spec import (
    CatchUp,
    CatchUpMode,
    Cron,
    DstFold,
    DstGap,
    Interval,
    IntervalMode,
    JobSpec,
    Once,
    Overlap,
    OverlapPolicy,
    Retry,
)

DAY = 24 * HOUR
# 2027-03-13 00:00 UTC: the US springs forward on the 14th, Europe on the
# 28th; the runs below cross one or both.
T_DST = 1_805_155_200_000

# -- the table ----------------------------------------------------------------------------


def test_rows_stay_sorted_by_id_and_a_row_is_found_written_and_made_a_tombstone() -> None:
    t = ShardJobs()
    for job_id in (5, 9, 7, 1):  # one append each but 7 and 1, inserted in place
        t.put(job_id, job_id * 10, job_id * 10, 0, 0, 0)
    assert list(t.ids) == [1, 5, 7, 9]
    assert [t.nxt[t.find(j)] for j in (1, 5, 7, 9)] == [10, 50, 70, 90]
    t.put(7, 700, 701, 3, 2, 1)  # written over
    i = t.find(7)
    assert (t.nxt[i], t.due[i], t.param[i], t.prof[i], t.flags[i]) == (700, 701, 3, 2, 1)
    t.remove_at(t.find(5))
    assert t.find(5) == -1 and t.locate(5) >= 0 and len(t) == 3
    t.put(5, 1, 1, 0, 0, 0)  # a tombstone comes back to life
    assert t.find(5) >= 0 and len(t) == 4
    assert t.find(6) == -1


def test_many_rows_merge_over_held_ones_and_tombstones_are_compacted_away() -> None:
    t = ShardJobs(rows_of([2, 4, 6], [1, 1, 1], [1, 1, 1], [0, 0, 0], [0, 0, 0], [0, 0, 0]))
    t.extend(rows_of([8, 10], [2, 2], [2, 2], [0, 0], [0, 0], [0, 0]))  # appended
    t.extend(rows_of([3, 6], [3, 3], [3, 3], [0, 0], [0, 0], [0, 0]))  # merged
    assert list(t.ids) == [2, 3, 4, 6, 8, 10]
    assert t.nxt[t.find(6)] == 3
    for job_id in (2, 3, 4):
        t.remove_at(t.find(job_id))
    t.compact()
    assert list(t.ids) == [6, 8, 10] and t.gone == 0


def test_arming_finds_the_rows_due_in_a_stretch_and_the_first_one_after_it() -> None:
    for n in (10, 1_000):  # a Python loop, and numpy
        ids = list(range(1, n + 1))
        due = [1_000 * i for i in ids]
        due[3] = NEVER  # paused, say
        t = ShardJobs(rows_of(ids, due, due, [0] * n, [0] * n, [0] * n))
        found, deadlines, after = t.arm(5_000, 9_000)
        assert found == [5, 6, 7, 8] and deadlines == [5_000, 6_000, 7_000, 8_000]
        assert after == 9_000
        assert t.arm(9_000, 9_000) == ([], [], 9_000)  # below its low mark: no scan
        assert t.due_from(9_000) == n - 8


def test_a_table_is_renumbered_in_place_across_its_slices_and_keeps_only_the_flags_asked() -> None:
    n = 70_000  # more rows than one slice of the renumbering
    ids = list(range(1, n + 1))
    prof = [i % 3 for i in ids]
    flags = [AWAKE | GONE if i % 5 == 0 else AWAKE for i in ids]
    t = ShardJobs(rows_of(ids, ids, ids, [0] * n, prof, flags))
    before = t.prof
    t.renumber(np.array([2, 0, 1], dtype=np.int32), GONE)
    assert t.prof is before  # the same column, written over
    assert list(t.prof) == [(2, 0, 1)[p] for p in prof]
    assert list(t.flags) == [f & GONE for f in flags]
    assert len(t) == n - n // 5  # its tombstones still count as gone
    t.renumber(np.arange(3, dtype=np.int32), GONE)  # the owner's numbers are the table's
    assert list(t.prof) == [(2, 0, 1)[p] for p in prof]
    t.put(n + 1, n + 1, n + 1, 0, 0, 0)  # no view of a column is left to keep it from growing
    assert t.ids_due_by(3) == [1, 2, 3]
    assert ShardJobs().ids_due_by(NEVER) == []


def test_group_by_shard_keeps_the_last_row_of_a_job_and_drops_tombstones() -> None:
    from wheel.engine.jobtable import group_by_shard
    from wheel.engine.model import shard_of

    ids = np.array([11, 12, 11, 13, 12], dtype=np.int64)
    rows = Columns(
        ids,
        np.array([1, 2, 3, 4, 5], dtype=np.int64),
        np.array([1, 2, 3, 4, 5], dtype=np.int64),
        np.zeros(5, dtype=np.int64),
        np.zeros(5, dtype=np.int32),
        np.array([0, 0, 0, 0, GONE], dtype=np.uint8),
    )
    by_shard = group_by_shard(rows)
    found = {int(j): int(c.nxt[k]) for c in by_shard.values() for k, j in enumerate(c.ids)}
    assert found == {11: 3, 13: 4}  # 11's last row; 12's last row is a tombstone
    assert all(all(shard_of(int(j)) == s for j in c.ids) for s, c in by_shard.items())


# -- the owner ----------------------------------------------------------------------------


def test_jobs_due_in_days_rest_as_rows_and_only_the_next_minute_is_armed() -> None:
    n = Node()
    n.hello(capacity=10_000)
    daily = Interval(period_ms=DAY, start_at_ms=T + DAY)
    jobs = [
        n.submit(spec(schedule=Interval(period_ms=DAY, start_at_ms=T + HOUR + 60 * i)))
        for i in range(2_000)
    ]
    late = n.submit(spec(schedule=daily))
    n.step(T)
    assert not n.owner.jobs  # no object for any of them
    assert n.owner.job_count() == 2_001
    assert len(n.owner.wheel) == 0  # nothing due within the minute
    assert n.owner.pending_timers() == 2_001
    # An hour on, the first ones come due: armed a minute ahead, fired, and
    # back to rest with their next fire a day away.
    acts = n.step(T + HOUR + 30 * SEC)
    fired = {a.job_id for a in acts.assignments["w1"]}
    assert fired == {j for i, j in enumerate(jobs) if 60 * i <= 30 * SEC}
    for a in acts.assignments["w1"]:
        n.owner.worker_complete("w1", [(a.run_id, a.fence, Outcome.SUCCEEDED, "")], n.now, n.acts)
    n.step()
    assert not n.owner.jobs
    assert len(n.owner.wheel) < 2_000 and (jobs[0] << 2) | FIRE not in n.owner.wheel
    image = n.owner.image_of(jobs[0])
    assert image is not None and image.nxt == T + HOUR + DAY
    assert n.owner.image_of(late) is not None


def test_a_job_that_fires_often_stays_awake_and_one_that_fires_daily_goes_to_rest() -> None:
    n = Node(OwnerConfig(keep_awake_ms=MIN))
    n.hello()
    often = n.submit(spec(schedule=Interval(period_ms=30 * SEC, start_at_ms=T + 30 * SEC)))
    daily = n.submit(spec(schedule=Interval(period_ms=DAY, start_at_ms=T + 30 * SEC)))
    for a in n.step(T + 30 * SEC).assignments["w1"]:
        n.complete(a)
    assert often in n.owner.jobs and daily not in n.owner.jobs
    assert n.owner.awake_count() == 1


def test_a_woken_job_at_rest_keeps_its_row_and_an_awake_one_leaves_no_stale_timer() -> None:
    n = Node(OwnerConfig(keep_awake_ms=10 * SEC))
    j = n.submit(spec(schedule=Interval(period_ms=DAY, start_at_ms=T + 30 * SEC)))
    n.step(T)
    assert (j << 2) | FIRE in n.owner.wheel
    assert n.owner.next_fires(j, 2) == [T + 30 * SEC, T + 30 * SEC + DAY]  # woken to read
    table = n.owner.shard_map[n.owner.book.job_or_raise(j).shard].table
    assert table.flags[table.find(j)] & AWAKE
    n.step(T + SEC)  # nothing going on: back to rest, its timer where it was
    assert j not in n.owner.jobs and (j << 2) | FIRE in n.owner.wheel


# -- a job at rest fires as an awake one does ---------------------------------------------

ZONES = ("UTC", "America/New_York", "Europe/London", "Australia/Sydney")
CRONS = (
    "*/7 * * * *",  # every few minutes
    "30 2 * * *",  # in the spring-forward gap of New York and London
    "30 1 * * *",  # in the fall-back fold (Sydney in April)
    "0 */5 * * *",
    "15 9 * * 1-5",
    "*/45 * * * * *",  # seconds
)

schedules = st.one_of(
    st.builds(Once, at_ms=st.integers(T_DST - HOUR, T_DST + 3 * DAY)),
    st.builds(
        Interval,
        period_ms=st.sampled_from([45 * SEC, 7 * MIN, HOUR, DAY]),
        mode=st.sampled_from(list(IntervalMode)),
        start_at_ms=st.integers(T_DST, T_DST + DAY),
    ),
    st.builds(
        Cron,
        expr=st.sampled_from(CRONS),
        time_zone=st.sampled_from(ZONES),
        dst_gap=st.sampled_from(list(DstGap)),
        dst_fold=st.sampled_from(list(DstFold)),
    ),
)
specs = st.builds(
    JobSpec,
    name=st.just("j"),
    handler=st.just("h"),
    payload=st.sampled_from([b"", b"x"]),
    schedule=schedules,
    jitter_ms=st.sampled_from([0, 0, 30 * SEC]),
    catch_up=st.builds(
        CatchUp,
        mode=st.sampled_from(list(CatchUpMode)),
        window_ms=st.sampled_from([None, HOUR]),
        max_count=st.sampled_from([3, 100]),
    ),
    overlap=st.builds(Overlap, policy=st.sampled_from([OverlapPolicy.SKIP, OverlapPolicy.ALLOW])),
    retry=st.just(Retry(max_attempts=2, initial_backoff_ms=0, max_backoff_ms=0)),
)


@dataclass(frozen=True, slots=True)
class History:
    claims: list[tuple[int, int, int, int]]  # job, fire, attempt, when claimed
    missed: dict[tuple[int, int], MissedReason]
    next_run_at: dict[int, int | None]


def _replay(
    jobs: Sequence[JobSpec], steps: Sequence[int], fail: Sequence[bool], *, awake: bool
) -> History:
    # Leases of an hour: the node wakes (heartbeats) every 20 minutes through
    # a long step instead of every 20 seconds; fires come due between wakes
    # and are caught up, alike in both.
    config = OwnerConfig(keep_awake_ms=10 * 366 * DAY if awake else 0, lease_ms=HOUR)
    n = Node(config, now=T_DST)
    n.hello(capacity=1_000)
    ids = [n.submit(s) for s in jobs]
    if awake:
        for j in ids:
            n.owner.book.job(j)  # an object from the start, and kept so
    claims: list[tuple[int, int, int, int]] = []
    k = 0
    for dt in steps:
        acts = n.step(n.now + dt)
        claims += [(c.job_id, c.scheduled_for, c.attempt, c.dispatched_at_ms) for c in acts.claims]
        for a in acts.assignments.get("w1", []):
            outcome = Outcome.FAILED if fail[k % len(fail)] else Outcome.SUCCEEDED
            k += 1
            n.owner.worker_complete("w1", [(a.run_id, a.fence, outcome, "")], n.now, n.acts)
        claims += [
            (c.job_id, c.scheduled_for, c.attempt, c.dispatched_at_ms) for c in n.step().claims
        ]
        if awake:
            assert all(j in n.owner.jobs for j in ids if n.owner.has_job(j))
        else:
            assert not n.owner.jobs or n.owner.awake_count() <= len(ids)
    # Jobs by their place in the list: the two stores number them alike, but
    # not necessarily from the same first id.
    index = {j: i for i, j in enumerate(ids)}
    # Per job, in order: jobs due at the same instant are claimed in an order
    # of no meaning (that of their timers' slot), which may differ.
    return History(
        claims=sorted((index[j], f, att, at) for j, f, att, at in claims),
        missed={(index[j], f): m.reason for (j, f), m in n.store.missed.items()},
        next_run_at={index[j]: n.store.jobs[j].next_run_at for j in ids},
    )


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    jobs=st.lists(specs, min_size=1, max_size=5),
    # Steps of the clock: seconds to hours, and jumps of a day (an owner
    # down or busy: catch-up).
    steps=st.lists(
        st.sampled_from([SEC, 20 * SEC, 3 * MIN, 47 * MIN, 5 * HOUR, DAY]), min_size=1, max_size=25
    ),
    fail=st.lists(st.booleans(), min_size=1, max_size=4),
)
def test_a_job_at_rest_between_its_fires_fires_exactly_as_one_kept_awake(
    jobs: list[JobSpec], steps: list[int], fail: list[bool]
) -> None:
    packed = _replay(jobs, steps, fail, awake=False)
    awake = _replay(jobs, steps, fail, awake=True)
    assert packed.claims == awake.claims
    assert packed.missed == awake.missed
    assert packed.next_run_at == awake.next_run_at
