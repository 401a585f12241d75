"""Priorities: the ranked queue against a reference model, its aging bound,
the spec's field (JSON, profile, validation), and the owner handing out
runs in priority order when workers are short."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.sim import MIN, SEC
from tests.engine.test_owner import Node, T, spec
from wheel.engine.owner import Outcome, OwnerConfig
from wheel.engine.priority import RankedQueue, effective_priority
from wheel.engine.profiles import profile_of, split_spec
from wheel.engine.spec import JobSpec, Once
from wheel.errors import InvalidArgument

AGING = 10 * SEC


def test_effective_priority_gains_a_level_each_aging_period_down_to_zero() -> None:
    assert effective_priority(9, 0, AGING) == 9
    assert effective_priority(9, AGING - 1, AGING) == 9
    assert effective_priority(9, AGING, AGING) == 8
    assert effective_priority(9, 9 * AGING, AGING) == 0
    assert effective_priority(9, 100 * AGING, AGING) == 0
    assert effective_priority(9, 100 * AGING, 0) == 9  # no aging


# A step: push (priority, advance of the clock) or pop n.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 9), st.integers(0, 3 * AGING)),
        st.tuples(st.just("pop"), st.integers(1, 4), st.integers(0, 3 * AGING)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(steps=steps, aging=st.sampled_from([0, AGING]))
def test_a_ranked_queue_pops_like_the_reference_order(
    steps: list[tuple[str, int, int]], aging: int
) -> None:
    # The reference: every waiting item, popped by (effective priority,
    # queued at, priority, order of arrival).
    q: RankedQueue[int] = RankedQueue(aging)
    model: list[tuple[int, int, int]] = []  # (priority, queued at, item)
    now, item = T, 0
    for op, arg, advance in steps:
        now += advance
        if op == "push":
            q.push("t", item, arg, now)
            model.append((arg, now, item))
            item += 1
            continue
        got = q.pop(arg, now)
        want = []
        for _ in range(min(arg, len(model))):
            best = min(
                model, key=lambda e: (effective_priority(e[0], now - e[1], aging), e[1], e[0], e[2])
            )
            model.remove(best)
            want.append(best[2])
        assert got == want
        assert len(q) == len(model)


def test_no_item_waits_past_the_aging_bound_under_a_stream_of_priority_zero() -> None:
    # One pop a second; two priority-0 items arrive every second, so the
    # queue of priority 0 never empties: without aging the priority-9 item
    # would wait for ever. With it, it goes out once it ranks 0 and is the
    # oldest of rank 0: by 9 x aging plus the priority-0 items queued
    # before it.
    q: RankedQueue[int] = RankedQueue(AGING)
    q.push("t", -1, 9, T)
    now, out_at = T, None
    for i in range(1, 200):
        now = T + i * SEC
        q.push("t", 2 * i, 0, now)
        q.push("t", 2 * i + 1, 0, now)
        if q.pop(1, now) == [-1]:
            out_at = now
            break
    assert out_at is not None
    assert out_at - T <= 9 * AGING + SEC


def test_a_pop_below_a_level_takes_only_the_better_priorities() -> None:
    q: RankedQueue[int] = RankedQueue(AGING)
    q.push("t", 1, 9, T)
    q.push("t", 2, 2, T)
    q.push("t", 3, 0, T)
    assert (q.best_level(), q.count_below(5)) == (0, 2)
    # The priority-9 item has aged past them both, and is still left out.
    assert q.pop(3, T + 100 * AGING, below=5) == [3, 2]
    assert (q.best_level(), q.count_below(5), len(q)) == (9, 0, 1)
    assert q.pop(1, T, below=5) == []


def test_tenants_stay_fair_within_a_level_and_a_held_back_one_keeps_its_items() -> None:
    q: RankedQueue[int] = RankedQueue(AGING)
    for i in range(3):
        q.push("a", i, 5, T)
        q.push("b", 10 + i, 5, T)
    q.push("b", 99, 9, T)
    assert q.pop(4, T) == [0, 10, 1, 11]
    assert q.pop(3, T, {"a": 0}) == [12, 99]  # a is held back; b's 9 comes last
    assert q.tenants() == ["a"] and q.levels()[5] == 1
    assert q.discard(lambda j: j == 2) == 1
    assert not q


def test_priority_is_in_the_json_and_profile_only_when_not_the_default() -> None:
    plain = JobSpec(name="j", handler="h", schedule=Once(at_ms=T))
    urgent = JobSpec(name="j", handler="h", schedule=Once(at_ms=T), priority=0)
    assert "priority" not in plain.to_dict()
    assert urgent.to_dict()["priority"] == 0
    assert JobSpec.from_json(urgent.to_json()) == urgent
    assert JobSpec.from_json(plain.to_json()).priority == 5
    plain_profile = profile_of(split_spec(plain)[0])
    urgent_profile = profile_of(split_spec(urgent)[0])
    assert "priority" not in plain_profile.body
    assert plain_profile.profile_id != urgent_profile.profile_id
    assert split_spec(urgent)[0].priority == 0
    assert urgent_profile.spec_json("j", T) == urgent.to_json()


@pytest.mark.parametrize("bad", [-1, 10, 100])
def test_a_priority_outside_0_to_9_names_the_field(bad: int) -> None:
    with pytest.raises(InvalidArgument, match=r"spec\.priority"):
        JobSpec(name="j", handler="h", schedule=Once(at_ms=T), priority=bad).validate()


def _due_together(n: Node, priorities: list[int], at: int) -> dict[int, int]:
    """One-shot jobs of ``priorities`` due at ``at``: job id -> priority."""
    return {
        n.submit(spec(name=f"j{i}", schedule=Once(at_ms=at), priority=p)): p
        for i, p in enumerate(priorities)
    }


def _serve_one_at_a_time(n: Node, at: int, count: int) -> list[int]:
    """The jobs of the runs handed out one at a time to a worker of
    capacity 1, each completed before the next goes out."""
    order = []
    acts = n.step(at)
    for _ in range(count):
        [a] = acts.assignments["w1"]
        order.append(a.job_id)
        n.owner.worker_ack("w1", [(a.run_id, a.fence)], n.now, n.acts)
        acts = n.complete(a)
    return order


def test_when_workers_are_short_runs_go_out_by_priority_then_by_arrival() -> None:
    n = Node()
    n.hello(capacity=1)
    jobs = _due_together(n, [9, 5, 0, 9, 0, 5], T + MIN)
    order = _serve_one_at_a_time(n, T + MIN, len(jobs))
    assert [jobs[j] for j in order] == [0, 0, 5, 5, 9, 9]


def test_a_retry_keeps_its_jobs_priority() -> None:
    n = Node()
    n.hello(capacity=1)
    first = n.submit(spec(name="first", schedule=Once(at_ms=T + MIN), priority=0))
    acts = n.step(T + MIN)
    [a] = acts.assignments["w1"]
    assert a.job_id == first
    jobs = _due_together(n, [9, 9, 9], T + MIN)
    n.owner.worker_ack("w1", [(a.run_id, a.fence)], n.now, n.acts)
    # The failure frees the worker before its retry (no backoff) is queued:
    # a priority-9 run takes it. The retry then goes ahead of the others.
    [b] = n.complete(a, Outcome.RETRYABLE).assignments["w1"]
    assert b.job_id in jobs
    n.owner.worker_ack("w1", [(b.run_id, b.fence)], n.now, n.acts)
    [c] = n.complete(b).assignments["w1"]
    assert (c.job_id, c.attempt) == (first, 1)


def test_a_priority_9_run_waits_no_longer_than_the_aging_bound() -> None:
    # A worker of capacity 1 busy for a second a run; a priority-0 run comes
    # due every half second, more than it can take: the priority-9 run,
    # due first, goes out within 9 x aging plus one run.
    aging = 2 * SEC
    n = Node(OwnerConfig(priority_aging_ms=aging))
    n.hello(capacity=1)
    low = n.submit(spec(name="low", schedule=Once(at_ms=T + MIN), priority=9))
    for i in range(60):
        n.submit(spec(name=f"hi{i}", schedule=Once(at_ms=T + MIN + i * 500), priority=0))
    now, running, low_out = T + MIN, None, None
    while low_out is None and now < T + MIN + 60 * SEC:
        acts = n.step(now)
        for a in acts.assignments.get("w1", []):
            running = a
            n.owner.worker_ack("w1", [(a.run_id, a.fence)], n.now, n.acts)
            if a.job_id == low:
                low_out = now
        now += SEC
        if running is not None:
            n.owner.worker_complete(
                "w1", [(running.run_id, running.fence, Outcome.SUCCEEDED, "")], n.now, n.acts
            )
            running = None
    assert low_out is not None
    assert low_out - (T + MIN) <= 9 * aging + SEC


def test_an_update_of_priority_moves_the_queued_work_to_its_new_level() -> None:
    n = Node()
    n.hello(capacity=1)
    blocker = n.submit(spec(name="blocker", schedule=Once(at_ms=T + MIN)))
    acts = n.step(T + MIN)
    [a] = acts.assignments["w1"]
    assert a.job_id == blocker
    jobs = _due_together(n, [5, 9], T + MIN)
    n.step(T + MIN + SEC)
    [late] = [j for j, p in jobs.items() if p == 9]
    record = n.store.get_job(late)
    update, _ = n.driver.update(record, replace(record.spec, priority=0), n.now)
    n.driver.updated(n.store.update_job(update).job, n.now)
    n.owner.worker_ack("w1", [(a.run_id, a.fence)], n.now, n.acts)
    [b] = n.complete(a).assignments["w1"]
    assert b.job_id == late


def test_runs_handed_back_wait_for_another_worker_in_priority_order() -> None:
    n = Node()
    n.hello(capacity=2)
    jobs = _due_together(n, [9, 0], T + MIN)
    acts = n.step(T + MIN)
    by_job = {a.job_id: a for a in acts.assignments["w1"]}
    assert set(by_job) == set(jobs)
    late, urgent = sorted(jobs, key=lambda j: -jobs[j])
    # The priority-9 run comes back first: the priority-0 one still goes first.
    n.complete(by_job[late], Outcome.HANDED_BACK)
    n.complete(by_job[urgent], Outcome.HANDED_BACK)
    n.hello("w2", capacity=1)
    [first] = n.step().assignments["w2"]
    assert first.job_id == urgent


def test_a_lost_runs_redispatch_keeps_its_jobs_priority() -> None:
    n = Node()
    n.hello(capacity=1)
    urgent = n.submit(spec(name="urgent", schedule=Once(at_ms=T + MIN), priority=0))
    [a] = n.step(T + MIN).assignments["w1"]
    assert a.job_id == urgent
    n.silent.add("w1")  # never acks: its grace lease lapses
    jobs = _due_together(n, [9, 9, 9], T + MIN)
    acts = n.step(T + MIN + n.config.grace_lease_ms + SEC)
    assert acts.revokes["w1"][0].run_id == a.run_id
    n.hello("w2", capacity=1)
    [b] = n.step().assignments["w2"]
    assert (b.job_id, b.attempt) == (urgent, 1)
    assert b.job_id not in jobs


def test_overdue_work_of_a_better_priority_goes_before_fresh_fires() -> None:
    # Overdue work waits behind fresh fires of its priority and worse ones
    # of a better priority; a late priority-0 fire goes ahead of fresh
    # priority-9 fires (inside the overdue budget).
    n = Node()
    n.hello(capacity=1)
    blocker = n.submit(spec(name="blocker", schedule=Once(at_ms=T + MIN)))
    [a] = n.step(T + MIN).assignments["w1"]
    assert a.job_id == blocker
    n.owner.worker_ack("w1", [(a.run_id, a.fence)], n.now, n.acts)
    late = n.submit(spec(name="late", schedule=Once(at_ms=T), priority=0))
    plain = n.submit(spec(name="plain", schedule=Once(at_ms=T), priority=5))
    n.step(T + MIN + 10 * SEC)  # queued overdue: ten seconds and more late
    fresh = _due_together(n, [9, 9, 5], T + MIN + 10 * SEC)
    n.step()
    [b] = n.complete(a).assignments["w1"]
    assert b.job_id == late
    n.owner.worker_ack("w1", [(b.run_id, b.fence)], n.now, n.acts)
    [c] = n.complete(b).assignments["w1"]
    assert fresh.get(c.job_id) == 5 and c.job_id != plain  # fresh first at equal priority


def test_a_restart_keeps_the_order_its_jobs_priorities_give() -> None:
    n = Node()
    jobs = _due_together(n, [9, 5, 0], T + MIN)
    n.restart()  # the owner's memory gone: priorities come back with the profiles
    n.hello(capacity=1)
    order = _serve_one_at_a_time(n, T + MIN, len(jobs))
    assert [jobs[j] for j in order] == [0, 5, 9]
