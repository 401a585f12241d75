"""The owner with concurrency keys: claims the store answers ``waiting`` stay
owed, go out again when a run of the key ends here or at the next poll, and
leave with their job (invariants of ``wheel.engine.owner._keywaits``).

Driven like ``wheel.node`` does, against the reference store, whose limits
follow the store contract (tests/store/test_contract_limits.py)."""

from __future__ import annotations

from tests.engine.sim import MIN
from tests.engine.test_owner import Node, T, spec
from wheel.engine.model import RunState
from wheel.engine.owner import Actions, Assignment, Outcome, OwnerConfig
from wheel.engine.owner._claims import _Pending
from wheel.engine.owner._keywaits import KeyWaits
from wheel.engine.records import FireClaim
from wheel.store.base import LimitRecord

POLL = 20


def keyed_node(max_concurrent: int, jobs: int, *, key: str = "db") -> tuple[Node, list[int]]:
    n = Node(OwnerConfig(limit_poll_ms=POLL))
    n.store.set_limit(LimitRecord(tenant="default", key=key, max_concurrent=max_concurrent), n.now)
    n.hello(capacity=50)
    ids = [n.submit(spec(name=f"j{i}", concurrency_key=key)) for i in range(jobs)]
    return n, ids


def handed(acts: Actions) -> list[Assignment]:
    return [a for batch in acts.assignments.values() for a in batch]


def in_flight(n: Node, key: str = "db") -> int:
    [limit] = [x for x in n.store.list_limits("default") if x.key == key]
    return limit.in_flight


def test_claims_past_the_limit_wait_without_a_run_or_a_missed_record() -> None:
    n, ids = keyed_node(2, 3)
    acts = n.step(T + MIN)
    assert len(handed(acts)) == 2
    assert in_flight(n) == 2
    waiting = [j for j in ids if not n.execs(j)]
    assert len(waiting) == 1
    assert n.missed(waiting[0]) == {}
    # Its fire is still the store's next one: a restart would arm it again.
    assert n.store.jobs[waiting[0]].next_run_at == T + MIN
    assert n.driver.limit_waiting() == {("default", "db"): 1}


def test_a_run_of_the_key_ending_here_sends_the_waiting_claim_at_once() -> None:
    n, _ = keyed_node(1, 2)
    [first] = handed(n.step(T + MIN))
    n.now += 5_000
    [second] = handed(n.complete(first))
    assert second.job_id != first.job_id and second.scheduled_for == T + MIN
    assert n.driver.limit_waiting() == {}
    # Its lag counts the wait: it is a fire handed out late.
    assert max(n.lags) >= 5_000


def test_a_permit_freed_elsewhere_is_found_by_the_next_poll() -> None:
    n, [j] = keyed_node(1, 1)
    n.store.limits[("default", "db")][1].in_flight = 1  # held by another node
    assert handed(n.step(T + MIN)) == []
    n.store.limits[("default", "db")][1].in_flight = 0  # its run ended there
    assert handed(n.step(T + MIN + POLL - 1)) == []
    # The owner asks to wake for the poll, and the poll claims it.
    assert n.driver.next_deadline() <= T + MIN + POLL  # type: ignore[operator]
    [a] = handed(n.step(T + MIN + POLL))
    assert a.job_id == j
    assert n.execs(j) == [(T + MIN, 0, RunState.DISPATCHED)]


def test_a_cancelled_job_gives_its_waiting_claim_up() -> None:
    n, [held, other] = keyed_node(1, 2)
    [a] = handed(n.step(T + MIN))
    waiting = other if a.job_id == held else held
    n.owner.cancel_job(waiting, n.acts, n.now)
    n.step(n.now + POLL)
    n.complete(a)
    n.step(n.now + 10 * POLL)
    assert n.execs(waiting) == []
    assert n.driver.limit_waiting() == {}


def test_a_waiting_fire_survives_a_restart_and_runs_once() -> None:
    n, [held, other] = keyed_node(1, 2)
    [a] = handed(n.step(T + MIN))
    waiting = other if a.job_id == held else held
    n.restart()
    n.hello(capacity=50)
    n.step(n.now + POLL)
    # The run of the first life keeps its permit until the reaper ends it.
    assert n.execs(waiting) == []
    n.store.limits[("default", "db")][1].in_flight = 0  # its run ended (lost, reaped)
    n.step(n.now + 2 * POLL)
    assert [(f, s) for f, _, s in n.execs(waiting)] == [(T + MIN, RunState.DISPATCHED)]


def test_waits_go_out_by_fire_per_key_and_a_kick_sends_only_its_key() -> None:
    waits = KeyWaits(POLL)

    def park(job: int, fire: int, key: str) -> None:
        c = FireClaim(
            job_id=job,
            scheduled_for=fire,
            attempt=0,
            fence=job,
            dispatched_at_ms=0,
            concurrency_key=key,
            tenant="t",
        )
        waits.park(c, _Pending(job, fire, 0, job, None), 0, None)

    park(1, 300, "a")
    park(2, 100, "a")
    park(3, 200, "b")
    assert not waits.due(POLL - 1)
    waits.kick("t", "a")
    assert waits.due(1)
    assert [p.claim.job_id for p in waits.take(1)] == [2, 1]
    assert waits.waiting() == {("t", "b"): 1}
    assert [p.claim.job_id for p in waits.take(POLL)] == [3]
    assert not waits and waits.next_wake() is None


def test_the_waiting_claim_rides_in_the_batch_that_ends_the_run_of_its_key() -> None:
    n, [a, b] = keyed_node(1, 2)
    [first] = handed(n.step(T + MIN))
    waiting = b if first.job_id == a else a
    n.owner.worker_ack("w1", [(first.run_id, first.fence)], n.now, n.acts)
    n.step()
    n.owner.worker_complete(
        "w1", [(first.run_id, first.fence, Outcome.SUCCEEDED, "")], n.now, n.acts
    )
    n.driver.advance(n.now)
    batch = n.driver.take_batch()
    assert [c.run_id for c in batch.completions] == [first.run_id]
    assert [c.job_id for c in batch.claims] == [waiting]
    # Written in that order, the end gives the permit back before the claim asks.
    n.store.now_ms = n.now
    n.driver.apply(n.store.write_batch(batch), n.now)
    assert [a.job_id for a in handed(n.driver.take_messages())] == [waiting]


def test_waits_go_out_by_priority_then_fire_and_a_long_wait_ages_up() -> None:
    aging = 1_000
    waits = KeyWaits(POLL, aging)

    def park(job: int, fire: int, priority: int, since: int) -> None:
        c = FireClaim(
            job_id=job,
            scheduled_for=fire,
            attempt=0,
            fence=job,
            dispatched_at_ms=0,
            concurrency_key="k",
            tenant="t",
        )
        waits.park(c, _Pending(job, fire, 0, job, None), since, since, priority)

    park(1, 100, 9, 0)
    park(2, 300, 0, 0)
    park(3, 200, 5, 0)
    park(4, 150, 0, 0)
    # Fresh: by priority, then by fire.
    assert [p.claim.job_id for p in waits.take(POLL)] == [4, 2, 3, 1]
    # Job 1 (priority 9) has waited 9 periods: it ranks 0, and its fire is
    # the oldest; job 5 (priority 0) just came.
    park(1, 100, 9, 0)
    park(5, 400, 0, 9 * aging)
    assert [p.claim.job_id for p in waits.take(9 * aging + POLL)] == [1, 5]
    # One priority alone: by fire, as before priorities.
    park(6, 500, 5, 0)
    park(7, 450, 5, 0)
    assert [p.claim.job_id for p in waits.take(20 * aging)] == [7, 6]


def test_a_freed_permit_goes_to_the_waiting_fire_of_the_better_priority() -> None:
    n = Node(OwnerConfig(limit_poll_ms=POLL))
    n.store.set_limit(LimitRecord(tenant="default", key="db", max_concurrent=1), n.now)
    n.hello(capacity=50)
    holder = n.submit(spec(name="holder", concurrency_key="db", priority=5))
    [first] = handed(n.step(T + MIN))
    assert first.job_id == holder
    low = n.submit(spec(name="low", concurrency_key="db", priority=9))
    high = n.submit(spec(name="high", concurrency_key="db", priority=0))
    assert handed(n.step(T + 2 * MIN)) == []  # both wait for the one permit
    [nxt] = handed(n.complete(first))
    assert nxt.job_id == high, (nxt.job_id, low, high)


def test_a_run_ending_with_claims_of_its_key_waiting_here_is_a_hand_off() -> None:
    """The owner says a permit is being handed off (the node's loop then
    writes without waiting for its tick) from the moment it learns a run of
    a key with claims waiting here ended, until the batch that carries those
    claims is taken; a run of a key nobody waits for here is no hand-off."""
    n, [a, b] = keyed_node(1, 2)
    other = n.submit(spec(name="other", concurrency_key="api"))
    n.store.set_limit(LimitRecord(tenant="default", key="api", max_concurrent=5), n.now)
    handed_out = handed(n.step(T + MIN))
    [first] = [x for x in handed_out if x.job_id in (a, b)]
    [lone] = [x for x in handed_out if x.job_id == other]
    waiting = b if first.job_id == a else a
    assert not n.driver.handing_off()  # a claim waits, but no permit came back
    for x in (first, lone):
        n.owner.worker_ack("w1", [(x.run_id, x.fence)], n.now, n.acts)
    n.step()
    n.owner.worker_complete("w1", [(lone.run_id, lone.fence, Outcome.SUCCEEDED, "")], n.now, n.acts)
    assert not n.driver.handing_off()  # nothing waits for "api"
    n.step()
    n.owner.worker_complete(
        "w1", [(first.run_id, first.fence, Outcome.SUCCEEDED, "")], n.now, n.acts
    )
    # As the end comes in, before the loop goes round.
    assert n.driver.handing_off()
    n.driver.advance(n.now)
    assert n.driver.handing_off()  # the claim waits for a batch
    batch = n.driver.take_batch()
    assert [c.job_id for c in batch.claims] == [waiting]
    assert not n.driver.handing_off()
    n.store.now_ms = n.now
    n.driver.apply(n.store.write_batch(batch), n.now)
    assert [x.job_id for x in handed(n.driver.take_messages())] == [waiting]
    assert not n.driver.handing_off()


def test_a_hand_off_ends_when_its_claims_cannot_go_out() -> None:
    """Claims kicked while no worker has credit are parked again: no hand-off
    is left pending (the loop would go round at every event for nothing)."""
    n, _ = keyed_node(1, 2)
    [first] = handed(n.step(T + MIN))
    n.owner.worker_ack("w1", [(first.run_id, first.fence)], n.now, n.acts)
    n.step()
    n.owner.worker_credit("w1", -50, n.now, n.acts)
    n.owner.worker_complete(
        "w1", [(first.run_id, first.fence, Outcome.SUCCEEDED, "")], n.now, n.acts
    )
    n.driver.advance(n.now)
    assert n.driver.take_batch().claims == []
    assert not n.driver.handing_off()
    assert n.driver.limit_waiting() == {("default", "db"): 1}


def test_a_permit_freed_elsewhere_sends_the_claims_of_its_key_at_once() -> None:
    """The store's notice that a permit of a key came back on another node
    (``wheel.node._permits``) sends the key's claims waiting here without
    waiting for the poll, and tells nothing for a key nobody waits for."""
    n, [j] = keyed_node(1, 1)
    n.store.limits[("default", "db")][1].in_flight = 1  # held by another node
    assert handed(n.step(T + MIN)) == []
    assert not n.driver.permit_freed("default", "api")
    assert not n.driver.permit_freed("other", "db")
    assert not n.driver.handing_off()
    n.store.limits[("default", "db")][1].in_flight = 0  # its run ended there
    assert n.driver.permit_freed("default", "db")
    assert n.driver.handing_off()
    [a] = handed(n.step(T + MIN + 1))  # long before the poll
    assert a.job_id == j
    assert not n.driver.handing_off()


def test_a_kick_after_the_store_answered_an_end_is_no_hand_off() -> None:
    """Only a permit on its way back (a run ending here) or back elsewhere
    skips the loop's tick; the kick once the store answered an end sends
    the claims still waiting at the next round, as a poll does."""
    waits = KeyWaits(POLL)
    c = FireClaim(
        job_id=1, scheduled_for=100, attempt=0, fence=1, dispatched_at_ms=0,
        concurrency_key="k", tenant="t",
    )  # fmt: skip
    waits.park(c, _Pending(1, 100, 0, 1, None), 0, None)
    waits.kick("t", "k")
    assert waits.due(1) and not waits.handing_off()
    waits.hand_off("t", "other")
    assert not waits.handing_off()  # nothing waits for it here
    waits.hand_off("t", "k")
    assert waits.handing_off()
    [p] = waits.take(1)
    assert not waits.handing_off()
    waits.park(p.claim, p.pend, 1, 0)
    assert waits.freed("t", "k") and waits.handing_off()
