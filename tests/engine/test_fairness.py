"""The overdue budget, the per-tenant fair queue and the fresh/overdue split
(seed C5/R5): one tenant's backlog must not starve anyone's new or overdue work."""

from __future__ import annotations

import time
from collections import Counter, deque
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wheel.engine.fairness import (
    DEFAULT_OVERDUE_SHARE,
    DispatchSplit,
    FairQueue,
    TokenBucket,
    split_capacity,
)

DAY_MS = 86_400_000

# -- TokenBucket ------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [1 / 3, 0.01, 7.3, 1666.6667])
def test_bucket_rate_over_days_matches_rate_times_time_within_one_token(rate: float) -> None:
    # The burst holds the longest step's refill, so draining greedily loses nothing.
    burst = rate * 400 + 1
    bucket = TokenBucket(rate, burst=burst, now_ms=0)
    granted = bucket.take(10**12, 0)
    assert granted == int(burst)
    now, step = 0, 1
    # Irregular steps (1 ms .. ~7 min) over three days, draining greedily.
    while now < 3 * DAY_MS:
        step = (step * 48271) % 2_147_483_647
        now = min(3 * DAY_MS, now + 1 + step % 399_000)
        granted += bucket.take(10**12, now)
    expected = int(burst) + rate * (3 * DAY_MS) / 1000
    assert abs(granted - expected) <= 1


def test_bucket_refill_does_not_depend_on_how_time_is_sliced() -> None:
    coarse = TokenBucket(0.7, burst=10**9, now_ms=0)
    fine = TokenBucket(0.7, burst=10**9, now_ms=0)
    for t in range(0, DAY_MS + 1, 997):
        fine.available(t)
    assert coarse.available(DAY_MS) == fine.available(DAY_MS)


def test_bucket_starts_full_and_never_holds_more_than_burst() -> None:
    bucket = TokenBucket(100.0, burst=50, now_ms=0)
    assert bucket.available(0) == 50
    assert bucket.available(DAY_MS) == 50
    assert bucket.take(80, DAY_MS) == 50
    assert bucket.take(1, DAY_MS) == 0
    assert bucket.available(DAY_MS + 100) == 10


def test_bucket_grants_partially_and_refuses_nonpositive_requests() -> None:
    bucket = TokenBucket(10.0, burst=5, now_ms=0)
    assert bucket.take(0, 0) == 0
    assert bucket.take(-3, 0) == 0
    assert bucket.take(3, 0) == 3
    assert bucket.take(3, 0) == 2
    assert bucket.available(0) == 0


def test_bucket_clamps_a_clock_that_steps_backwards() -> None:
    bucket = TokenBucket(10.0, burst=100, now_ms=10_000)
    assert bucket.take(100, 10_000) == 100
    # The clock jumps back 5 s: nothing is refilled for the jump, nothing is taken back.
    assert bucket.available(5_000) == 0
    assert bucket.take(1, 5_000) == 0
    # Back past the latest time seen: only the 500 ms since then count.
    assert bucket.available(10_500) == 5


def test_next_available_is_exact() -> None:
    bucket = TokenBucket(3.0, burst=2, now_ms=0)
    assert bucket.next_available_ms(0) == 0
    bucket.take(2, 0)
    when = bucket.next_available_ms(0)
    assert when == 334  # 1 token at 3/s: ceil(1000 / 3) ms
    assert bucket.available(when - 1) == 0
    assert bucket.available(when) == 1
    bucket.take(1, when)
    following = bucket.next_available_ms(when)
    assert following is not None
    assert bucket.available(following - 1) == 0
    assert bucket.available(following) == 1
    assert following == 667  # no drift: the second token lands on ceil(2000 / 3)


def test_next_available_is_none_when_no_token_will_ever_come() -> None:
    assert TokenBucket(0.0, burst=5, now_ms=0).next_available_ms(0) == 0
    idle = TokenBucket(0.0, burst=5, now_ms=0)
    idle.take(5, 0)
    assert idle.next_available_ms(0) is None
    assert TokenBucket(10.0, burst=0.5, now_ms=0).next_available_ms(0) is None


def test_bucket_rejects_negative_rate_or_burst() -> None:
    with pytest.raises(ValueError, match="rate_per_s"):
        TokenBucket(-1.0, burst=1, now_ms=0)
    with pytest.raises(ValueError, match="burst"):
        TokenBucket(1.0, burst=-1, now_ms=0)
    with pytest.raises(ValueError, match="rate_per_s"):
        TokenBucket(float("nan"), burst=1, now_ms=0)


def test_set_rate_applies_from_now_on() -> None:
    bucket = TokenBucket(10.0, burst=1_000, now_ms=0)
    bucket.take(1_000, 0)
    bucket.set_rate(100.0, 1_000)  # the first second refilled at 10/s
    assert bucket.available(2_000) == 10 + 100
    bucket.set_rate(100.0, 2_000, burst=50)
    assert bucket.available(2_000) == 50
    assert bucket.rate_per_s == 100.0 and bucket.burst == 50


@given(
    rate=st.floats(0.0, 5_000.0),
    burst=st.integers(0, 500),
    ops=st.lists(st.tuples(st.integers(-2_000, 60_000), st.integers(0, 1_000)), max_size=40),
)
@settings(deadline=None, max_examples=200)
def test_bucket_never_grants_more_than_burst_plus_refill(
    rate: float, burst: int, ops: list[tuple[int, int]]
) -> None:
    bucket = TokenBucket(rate, burst=burst, now_ms=0)
    now = latest = 0
    granted = 0
    for dt, n in ops:
        now += dt  # may step backwards
        latest = max(latest, now)
        got = bucket.take(n, now)
        assert 0 <= got <= n
        granted += got
        assert granted <= burst + rate * latest / 1000 + 1e-6
        assert 0 <= bucket.available(now) <= burst


# -- FairQueue ---------------------------------------------------------------------------


def test_round_robin_interleaves_tenants() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(3):
        q.push("a", f"a{i}")
    q.push("b", "b0")
    q.push("c", "c0")
    q.push("c", "c1")
    assert len(q) == 6
    assert q.tenants() == ["a", "b", "c"]
    assert q.pop(4) == ["a0", "b0", "c0", "a1"]
    assert q.tenants() == ["c", "a"]  # b drained and left; c's turn is next
    assert q.pop(10) == ["c1", "a2"]
    assert len(q) == 0 and q.tenants() == [] and q.pop(3) == []


def test_turn_order_survives_pop_boundaries() -> None:
    q: FairQueue[str] = FairQueue()
    q.extend("a", ["a0", "a1", "a2"])
    q.extend("b", ["b0", "b1", "b2"])
    popped = q.pop(1) + q.pop(1) + q.pop(3) + q.pop(1)
    assert popped == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_weights_give_proportional_shares() -> None:
    q: FairQueue[int] = FairQueue()
    q.extend("big", range(1_000), weight=3)
    q.extend("small", range(1_000, 2_000))
    # pop(2) cuts turns in the middle: the tenant keeps the rest of its turn.
    out = [x for _ in range(200) for x in q.pop(2)]
    big = sum(1 for x in out if x < 1_000)
    assert (big, len(out) - big) == (300, 100)


def test_the_latest_push_sets_the_tenants_weight() -> None:
    q: FairQueue[str] = FairQueue()
    q.extend("a", ["a0", "a1", "a2", "a3"])
    q.extend("b", ["b0", "b1", "b2", "b3"])
    q.push("a", "a4", weight=2)
    assert q.pop(6) == ["a0", "a1", "b0", "a2", "a3", "b1"]


def test_weight_must_be_positive() -> None:
    q: FairQueue[int] = FairQueue()
    with pytest.raises(ValueError, match="weight"):
        q.push("a", 1, weight=0)


def test_a_tenant_that_drains_rejoins_at_the_back() -> None:
    q: FairQueue[str] = FairQueue()
    q.extend("a", ["a0", "a1"])
    q.push("b", "b0")
    assert q.pop(2) == ["a0", "b0"]
    q.push("b", "b1")
    assert q.pop(2) == ["a1", "b1"]
    assert q.tenant_len("a") == 0 and q.tenant_len("zzz") == 0


def test_extending_with_nothing_leaves_no_empty_tenant_behind() -> None:
    q: FairQueue[int] = FairQueue()
    q.extend("a", [])
    assert q.tenants() == [] and len(q) == 0
    q.push("a", 1)
    assert q.pop(5) == [1]


def test_discard_removes_matching_items_and_keeps_order() -> None:
    q: FairQueue[tuple[int, int]] = FairQueue()  # (job_id, fire)
    q.extend("a", [(1, 0), (2, 0), (1, 1), (2, 1)])
    q.extend("b", [(3, 0), (3, 1)])
    q.push("c", (4, 0))
    assert q.discard(lambda item: item[0] == 1) == 2
    assert len(q) == 5 and q.tenant_len("a") == 2
    # Cancelling a tenant's only job removes the tenant from the rotation.
    assert q.discard(lambda item: item[0] == 3, tenant="b") == 2
    assert q.tenants() == ["a", "c"]
    assert q.discard(lambda item: item[0] == 4, tenant="a") == 0  # scoped to a
    assert q.discard(lambda item: False) == 0
    assert q.pop(10) == [(2, 0), (4, 0), (2, 1)]
    assert len(q) == 0


def test_discard_of_the_current_tenant_passes_the_turn_on() -> None:
    q: FairQueue[int] = FairQueue()
    q.extend("a", range(10), weight=5)
    q.extend("b", range(100, 103))
    assert q.pop(2) == [0, 1]  # a is mid-turn
    assert q.discard(lambda x: x < 100) == 8
    assert q.pop(5) == [100, 101, 102]


_tenants = st.sampled_from(["a", "b", "c", "d"])
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), _tenants, st.integers(1, 30)),
        st.tuples(st.just("pop"), st.just(""), st.integers(0, 25)),
    ),
    max_size=40,
)


@given(ops=_ops)
@settings(deadline=None, max_examples=200)
def test_fair_queue_against_per_tenant_fifos(ops: list[tuple[str, str, int]]) -> None:
    q: FairQueue[tuple[str, int]] = FairQueue()
    model: dict[str, deque[tuple[str, int]]] = {t: deque() for t in "abcd"}
    seq = 0
    # The popped stream, with the tenants that had items pending before each pop.
    stream: list[tuple[str, frozenset[str]]] = []
    for op, tenant, k in ops:
        if op == "push":
            for _ in range(k):
                item = (tenant, seq)
                seq += 1
                q.push(tenant, item)
                model[tenant].append(item)
        else:
            out = q.pop(k)
            assert len(out) == min(k, sum(len(m) for m in model.values()))
            for t, _ in out:
                pending = frozenset(name for name, m in model.items() if m)
                # Per-tenant FIFO order is preserved.
                assert model[t].popleft() == (t, _)
                stream.append((t, pending))
        assert len(q) == sum(len(m) for m in model.values())
        assert sorted(q.tenants()) == sorted(t for t, m in model.items() if m)
        assert all(q.tenant_len(t) == len(m) for t, m in model.items())

    # Over any window of pops in which two tenants both had items pending, their
    # counts differ by at most one: running difference spans at most one.
    for x, y in combinations("abcd", 2):
        lo = hi = diff = 0
        for t, pending in stream:
            if x not in pending or y not in pending:
                lo = hi = diff = 0
                continue
            diff += (t == x) - (t == y)
            lo, hi = min(lo, diff), max(hi, diff)
            assert hi - lo <= 1, (x, y, stream)


def test_c5_one_tenants_huge_backlog_does_not_delay_another_tenant() -> None:
    # Seed C5: 10,000 run_all jobs, two hours down, 1-minute period = 1.2M overdue fires.
    q: FairQueue[int] = FairQueue()
    q.extend("a", range(1_200_000))
    for i in range(10):
        q.push("b", -1 - i)
    started = time.perf_counter()
    first = q.pop(20)
    elapsed = time.perf_counter() - started
    assert sorted(x for x in first if x < 0) == sorted(-1 - i for i in range(10))
    assert [x for x in first if x >= 0] == list(range(10))
    assert q.tenant_len("a") == 1_200_000 - 10 and q.tenants() == ["a"]
    # pop cost does not grow with the backlog (generous bound: 20 items).
    assert elapsed < 0.05


def test_push_and_pop_scale_to_many_tenants() -> None:
    q: FairQueue[int] = FairQueue()
    for i in range(200_000):
        q.push(f"t{i % 5_000}", i)
    assert len(q.tenants()) == 5_000
    first = q.pop(5_000)
    assert Counter(x % 5_000 for x in first) == Counter(range(5_000))
    out = first + q.pop(10**9)
    assert len(out) == 200_000 and len(q) == 0


# -- split_capacity ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capacity", "fresh", "overdue", "tokens", "split"),
    [
        (100, 30, 1_000, 20, (30, 20)),  # tokens bound overdue
        (100, 90, 1_000, 20, (90, 10)),  # leftover capacity bounds overdue
        (100, 150, 1_000, 20, (100, 0)),  # fresh takes everything; overdue waits
        (100, 30, 5, 20, (30, 5)),  # only what is waiting
        (100, 0, 1_000, 0, (0, 0)),  # no tokens, no overdue: idle beats starving fresh later
        (100, 0, 1_000, 500, (0, 100)),  # capacity still bounds a large budget
        (0, 10, 10, 10, (0, 0)),
        (-5, 10, 10, 10, (0, 0)),
        (10, -1, -1, -1, (0, 0)),
    ],
)
def test_split_capacity_table(
    capacity: int, fresh: int, overdue: int, tokens: int, split: tuple[int, int]
) -> None:
    got = split_capacity(
        capacity=capacity, fresh_waiting=fresh, overdue_waiting=overdue, overdue_tokens=tokens
    )
    assert got == DispatchSplit(fresh=split[0], overdue=split[1])


@given(
    capacity=st.integers(0, 1_000),
    fresh=st.integers(0, 2_000),
    overdue=st.integers(0, 2_000),
    tokens=st.integers(0, 2_000),
)
@settings(deadline=None, max_examples=200)
def test_fresh_is_never_delayed_by_overdue(
    capacity: int, fresh: int, overdue: int, tokens: int
) -> None:
    s = split_capacity(
        capacity=capacity, fresh_waiting=fresh, overdue_waiting=overdue, overdue_tokens=tokens
    )
    assert s.fresh == min(fresh, capacity)
    assert 0 <= s.overdue <= min(overdue, tokens, capacity - s.fresh)
    assert s.fresh + s.overdue <= capacity
    # Work-conserving within the budget: overdue only stops at one of its bounds.
    assert s.overdue == min(overdue, tokens, capacity - s.fresh)


def test_c5_recovery_keeps_fresh_on_time_and_shares_the_overdue_budget() -> None:
    # Dispatch capacity 1,000 fires/s in 100 ms rounds; fresh work arrives at
    # 600/s. Tenant A has 200,000 overdue fires (a lighter stand-in for C5's
    # 1.2M: the queue's cost does not depend on it), tenant B has 500.
    capacity_per_s = 1_000
    budget = TokenBucket(capacity_per_s * DEFAULT_OVERDUE_SHARE, burst=20, now_ms=0)
    overdue: FairQueue[str] = FairQueue()
    overdue.extend("a", ("a" for _ in range(200_000)))
    overdue.extend("b", ("b" for _ in range(500)))
    fresh_backlog = 0
    sent: Counter[str] = Counter()
    b_done_ms = None
    for now in range(0, 60_000, 100):
        fresh_backlog += 60
        tokens = budget.available(now)
        s = split_capacity(
            capacity=100,
            fresh_waiting=fresh_backlog,
            overdue_waiting=len(overdue),
            overdue_tokens=tokens,
        )
        fresh_backlog -= s.fresh
        assert fresh_backlog == 0  # every fresh fire goes out in the round it came due
        assert budget.take(s.overdue, now) == s.overdue
        sent.update(overdue.pop(s.overdue))
        if b_done_ms is None and overdue.tenant_len("b") == 0:
            b_done_ms = now
    # Overdue dispatch ran at the 20% budget (200/s) and no faster.
    assert abs(sent.total() - (20 + 200 * 59.9)) <= 1
    # B's 500 overdue fires shared the budget evenly with A: done in ~5 s, not
    # after A's 200,000 (which would take 1,000 s at this budget).
    assert b_done_ms is not None and b_done_ms <= 5_100
    assert sent["b"] == 500
