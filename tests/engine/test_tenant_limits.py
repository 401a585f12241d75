"""A tenant's in-flight limit holds on every way a run reaches a worker
(``wheel.engine.owner._tenants``, rule 4): fresh fires, claimed runs that
wait for a worker (handed back, their worker gone), fires run again after a
lost lease, and runs an owner adopts after a restart."""

from __future__ import annotations

from tests.engine.sim import MIN, SEC
from tests.engine.test_owner import Node, T, spec
from wheel.engine.owner import Outcome, TenantLimit
from wheel.engine.spec import Interval, Once

LIMIT = 2


def _limited(n: Node) -> None:
    n.owner.set_tenant_limits({"acme": TenantLimit(max_in_flight=LIMIT)}, n.now)


def _acme_held(n: Node) -> int:
    """Runs of acme held by workers, counted from the workers' side."""
    return sum(
        1
        for w in n.owner.workers.values()
        for run_id in w.held
        if (job := n.owner.book.job(n.owner.runs[run_id].job_id)) is not None
        and job.spec.tenant == "acme"
    )


def _every_minute(at: int) -> Interval:
    return Interval(period_ms=MIN, start_at_ms=at)


def test_a_run_handed_back_waits_while_its_tenant_is_at_its_limit() -> None:
    n = Node()
    n.hello("w1", capacity=10)
    _limited(n)
    jobs = [n.submit(spec(tenant="acme", schedule=Once(at_ms=T + MIN + i))) for i in range(2)]
    handed = n.step(T + MIN + 1).assignments["w1"]
    assert sorted(a.job_id for a in handed) == jobs and _acme_held(n) == LIMIT
    # One is handed back, never started: it waits for a worker other than
    # the one that gave it back. A new fire of the tenant takes its place.
    back, done = handed
    n.owner.worker_complete(
        "w1", [(back.run_id, back.fence, Outcome.HANDED_BACK, "")], n.now, n.acts
    )
    # (w1 is not offered it again for a grace lease.)
    third = n.submit(spec(tenant="acme", schedule=Once(at_ms=n.now + SEC)))
    acts = n.step(n.now + SEC)
    assert [a.job_id for a in acts.assignments["w1"]] == [third]
    # A worker comes that could take the waiting run: it stays waiting while
    # the tenant is at its limit.
    n.hello("w2", capacity=10)
    for _ in range(10):
        acts = n.step(n.now + SEC)
        assert not any(acts.assignments.values()) and _acme_held(n) == LIMIT
    # A run of the tenant ends: the waiting one goes out.
    n.owner.worker_complete("w1", [(done.run_id, done.fence, Outcome.SUCCEEDED, "")], n.now, n.acts)
    acts = n.step()
    assert [a.run_id for w in acts.assignments.values() for a in w] == [back.run_id]
    assert _acme_held(n) == LIMIT


def _holder(n: Node, run_id: int) -> str:
    return next(w for w, worker in n.owner.workers.items() if run_id in worker.held)


def test_runs_adopted_after_a_restart_count_against_the_limit() -> None:
    n = Node()
    n.hello("w1", capacity=10)
    _limited(n)
    for i in range(LIMIT):
        n.submit(spec(tenant="acme", schedule=_every_minute(T + MIN + i), timeout_ms=60 * MIN))
    later = n.submit(spec(tenant="acme", schedule=Once(at_ms=T + 3 * MIN)))
    acts = n.step(T + MIN + LIMIT)
    running = acts.assignments["w1"]
    for a in running:
        n.owner.worker_ack("w1", [(a.run_id, a.fence)], n.now, n.acts)
    n.step()
    # The node dies; a new life adopts the two runs from the store, and the
    # limits come back once it is up (as a node loads its tenants' quotas).
    n.restart()
    _limited(n)
    n.hello("w1", capacity=10)
    n.owner.worker_heartbeat("w1", [(a.run_id, a.fence) for a in running], n.now, n.acts)
    acts = n.step(T + 3 * MIN)
    assert all(a.job_id != later for a in acts.assignments.get("w1", []))
    assert n.owner.tenant_in_flight("acme") == LIMIT


def test_a_fire_run_again_after_a_lost_lease_waits_for_room_too() -> None:
    n = Node()
    n.hello("w1", capacity=10)
    n.hello("w2", capacity=10)
    _limited(n)
    first = n.submit(spec(tenant="acme", schedule=Once(at_ms=T + MIN)))
    acts = n.step(T + MIN)
    [lost] = [a for w in acts.assignments.values() for a in w]
    silent = _holder(n, lost.run_id)
    n.silent.add(silent)  # its lease lapses: the fire goes to the reaper
    others = [n.submit(spec(tenant="acme", schedule=Once(at_ms=T + 2 * MIN + i))) for i in range(2)]
    n.step(T + 2 * MIN + 1)
    # The lapsed run goes back to the reaper and is run again: never more
    # than two of the tenant's runs on the live worker at once.
    redone = False
    for _ in range(30):
        n.step(n.now + 5 * SEC)
        live = [
            r
            for r in n.owner.runs.values()
            if r.worker_id not in (None, silent) and r.job_id in (first, *others)
        ]
        assert len(live) <= LIMIT
        redone = redone or any(r.job_id == first and r.attempt == 1 for r in live)
    assert redone  # the fire whose lease lapsed did run again
