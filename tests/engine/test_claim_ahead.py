"""Fires claimed ahead of their time (``OwnerConfig.claim_ahead_ms``): the
claim's store commit leaves the path from a fire's due time to its worker,
and the run still goes out at its time, never before (invariant 2)."""

from __future__ import annotations

from tests.engine.sim import HOUR, MIN, SEC
from tests.engine.test_owner import Node, T, spec
from wheel.engine.model import JobState, RunState
from wheel.engine.owner import OwnerConfig
from wheel.engine.spec import Interval, Once, SideEffect

LEAD = 500


def ahead(**kw: int) -> Node:
    """A node whose every fire may go ahead (``claim_ahead_min`` 1)."""
    return Node(OwnerConfig(**{"claim_ahead_ms": LEAD, "claim_ahead_min": 1, **kw}))


def handed(n: Node, to: int, worker: str = "w1") -> list[int]:
    return [a.scheduled_for for a in n.step(to).assignments.get(worker, [])]


def test_a_fire_is_claimed_a_lead_ahead_and_handed_out_at_its_time() -> None:
    n = ahead()
    n.hello()
    j = n.submit(spec())
    assert not n.step(T + MIN - LEAD - 1).claims
    acts = n.step(T + MIN - LEAD)
    [claim] = acts.claims
    assert claim.scheduled_for == T + MIN and not acts.assignments
    # The run is in the store, dispatched at its time, not at its claim's.
    [(fire, attempt, state)] = n.execs(j)
    assert (fire, attempt, state) == (T + MIN, 0, RunState.DISPATCHED)
    [row] = n.store.execs.values()
    assert row.dispatched_at_ms == T + MIN
    # It waits for its time, the worker's credit kept for it...
    assert n.owner.workers["w1"].free == 9
    assert n.owner.next_deadline() == T + MIN
    assert handed(n, T + MIN - 1) == []
    # ...and goes out at it, late by nothing.
    assert handed(n, T + MIN) == [T + MIN]
    assert n.lags == [0]
    # The schedule moved on with the claim: the next fire is claimed ahead too.
    assert n.store.jobs[j].next_run_at == T + 2 * MIN


def test_a_burst_of_one_shots_is_claimed_in_one_batch_ahead_and_handed_out_at_once() -> None:
    n = ahead()
    n.hello(capacity=2_000)
    at = T + MIN
    jobs = [n.submit(spec(schedule=Once(at_ms=at))) for _ in range(1_000)]
    acts = n.step(at - LEAD)
    assert len(acts.claims) == 1_000 and not acts.assignments
    assert len(handed(n, at)) == 1_000
    assert all(n.store.jobs[j].state is JobState.RUNNING for j in jobs)


def test_a_job_busy_as_its_lead_begins_waits_for_its_fire_and_its_overlap_is_judged_then() -> None:
    n = ahead()
    n.hello()
    j = n.submit(spec())
    a = n.run_once(j, T + MIN)
    # Its run still going at the next fire's lead: no claim ahead, which the
    # overlap policy (skip) would have recorded missed.
    assert not n.step(T + 2 * MIN - LEAD).claims
    n.now = T + 2 * MIN - LEAD // 2
    n.complete(a)
    assert handed(n, T + 2 * MIN - 1) == []
    assert handed(n, T + 2 * MIN) == [T + 2 * MIN]
    assert n.missed(j) == {}


def test_a_jittered_fire_is_not_claimed_ahead() -> None:
    n = ahead()
    n.hello()
    j = n.submit(spec(jitter_ms=20 * SEC))
    due = n.owner.book.job_or_raise(j).compiled.jittered(T + MIN)
    assert due > T + MIN
    assert not n.step(due - 1).claims
    [claim] = n.step(due).claims
    assert claim.dispatched_at_ms == due


def test_a_cancel_inside_the_lead_ends_the_claimed_run_cancelled() -> None:
    n = ahead()
    n.hello()
    j = n.submit(spec())
    assert n.step(T + MIN - LEAD).claims
    n.now = T + MIN - LEAD // 2
    updated = n.store.set_job_state(j, JobState.CANCELLED, next_run_at=None, now_ms=n.now)
    n.owner.cancel_job(j, n.acts)
    n.owner.upsert_job(updated, n.now, n.acts)
    n.step()
    assert handed(n, T + MIN) == []
    assert n.execs(j) == [(T + MIN, 0, RunState.CANCELLED)]
    # Its reservation was given back at its time.
    assert n.owner.workers["w1"].free == 10


def test_a_run_held_for_a_worker_that_went_away_goes_to_another_at_its_time() -> None:
    n = ahead()
    n.hello("w1", capacity=1)
    n.submit(spec())
    assert n.step(T + MIN - LEAD).claims
    n.owner.worker_disconnect("w1")
    n.hello("w2", capacity=1)
    assert handed(n, T + MIN - 1, "w2") == []
    assert handed(n, T + MIN, "w2") == [T + MIN]
    # The gone worker's reservation went with it: back, it has all its credit.
    n.hello("w1", capacity=1)
    assert n.owner.workers["w1"].free == 1


def test_jobs_at_rest_are_armed_a_lead_ahead_also_after_a_restart() -> None:
    n = ahead(keep_awake_ms=SEC)
    n.hello()
    j = n.submit(spec(schedule=Interval(period_ms=HOUR, start_at_ms=T + HOUR)))
    n.step(T + SEC)
    assert j not in n.owner.jobs  # at rest, a row
    n.restart()
    n.hello()
    assert not n.step(T + HOUR - LEAD - 1).claims
    assert n.step(T + HOUR - LEAD).claims
    assert handed(n, T + HOUR) == [T + HOUR]


def test_a_run_claimed_ahead_and_adopted_by_a_restarted_owner_still_waits_for_its_time() -> None:
    n = ahead()
    n.hello()
    j = n.submit(spec())
    assert n.step(T + MIN - LEAD).claims
    # The node dies holding the claimed run; the store has it dispatched,
    # never sent. Its restart takes it as lost when its grace lease lapses,
    # after its time, and sends the fire again: not early either way.
    n.restart()
    n.hello()
    assert handed(n, T + MIN - 1) == []
    acts = n.step(T + MIN + n.config.grace_lease_ms + SEC)
    assert [a.scheduled_for for a in acts.assignments["w1"]] == [T + MIN]
    assert n.execs(j) == [(T + MIN, 0, RunState.LOST), (T + MIN, 1, RunState.DISPATCHED)]


def test_by_default_only_a_burst_is_claimed_ahead() -> None:
    # The default: a 250 ms lead for an instant at which 64 fires or more
    # were armed. Jobs at rest are armed a minute ahead, a burst's together.
    n = Node()
    lead, least = n.config.claim_ahead_ms, n.config.claim_ahead_min
    assert lead > 0 and least > 1
    n.hello(capacity=1_000)
    burst, few = T + 5 * MIN, T + 6 * MIN
    for _ in range(least):
        n.submit(spec(schedule=Once(at_ms=burst)))
    for _ in range(least - 1):
        n.submit(spec(schedule=Once(at_ms=few)))
    # A steady stream, one fire an instant, goes at its time.
    for k in range(200):
        n.submit(spec(schedule=Once(at_ms=T + 7 * MIN + k)))
    acts = n.step(burst - lead)
    assert len(acts.claims) == least and not acts.assignments
    assert len(handed(n, burst, "w1")) == least
    assert n.lags == [0] * least
    assert not n.step(few - 1).claims
    acts = n.step(few)
    assert len(acts.claims) == least - 1 and len(acts.assignments["w1"]) == least - 1
    for k in range(200):
        assert not n.step(T + 7 * MIN + k - 1).claims
        [claim] = n.step(T + 7 * MIN + k).claims
        assert claim.dispatched_at_ms == T + 7 * MIN + k


def test_a_burst_armed_one_fire_at_a_time_goes_ahead_from_its_threshold_on() -> None:
    # Submitted inside the minute armed ahead, each fire is armed as it
    # comes: the first few of the instant at it, the rest ahead; all of
    # them reach the worker at the instant, none before. A smaller group
    # goes at its time whole.
    n = Node(OwnerConfig(claim_ahead_ms=LEAD, claim_ahead_min=10))
    n.hello(capacity=100)
    n.submit(spec(schedule=Once(at_ms=T + 2 * SEC)))
    n.step(T + SEC)  # the next minute armed ahead
    at, small = T + 30 * SEC, T + 40 * SEC
    for _ in range(25):
        n.submit(spec(schedule=Once(at_ms=at)))
    for _ in range(9):
        n.submit(spec(schedule=Once(at_ms=small)))
    assert len(n.step(T + 2 * SEC).claims) == 1  # the first job's
    acts = n.step(at - LEAD)
    assert len(acts.claims) == 16 and not acts.assignments
    assert handed(n, at - 1) == []
    acts = n.step(at)
    assert len(acts.claims) == 9 and len(acts.assignments["w1"]) == 25
    assert not n.step(small - 1).claims
    acts = n.step(small)
    assert len(acts.claims) == 9 and len(acts.assignments["w1"]) == 9
    assert n.lags[-34:] == [0] * 34


def test_without_a_lead_nothing_is_claimed_before_its_time() -> None:
    n = Node(OwnerConfig(claim_ahead_ms=0))
    n.hello()
    n.submit(spec())
    assert not n.step(T + MIN - 1).claims
    acts = n.step(T + MIN)
    assert acts.claims and acts.assignments["w1"]


def test_an_at_most_once_or_keyed_job_is_claimed_at_its_time_not_ahead() -> None:
    # Lost inside the lead, an at-most-once run claimed ahead would end
    # unknown, never sent again, though no worker had it; a keyed one would
    # hold its key's permit for the lead.
    for s in (spec(side_effect=SideEffect.AT_MOST_ONCE), spec(concurrency_key="k")):
        n = ahead()
        n.hello()
        n.submit(s)
        assert not n.step(T + MIN - 1).claims
        acts = n.step(T + MIN)
        assert acts.claims and [a.scheduled_for for a in acts.assignments["w1"]] == [T + MIN]
