"""The tenant limits part on its own (``wheel.engine.owner._tenants``): what
each limited tenant may take in a dispatch, what it holds, and when one held
back gets its next token. Rule numbers are the module's."""

from __future__ import annotations

from wheel.engine.owner import TenantLimit
from wheel.engine.owner._tenants import Tenants
from wheel.engine.priority import RankedQueue

T = 1_000_000


def test_only_tenants_with_a_limit_are_kept_and_those_counting_runs_are_named() -> None:
    tenants = Tenants()
    counted = tenants.set_limits(
        {
            "free": TenantLimit(),
            "rate": TenantLimit(fires_per_s=5),
            "busy": TenantLimit(max_in_flight=2),
        },
        T,
    )
    assert set(tenants.limits) == {"rate", "busy"}
    assert counted == {"busy"}
    assert tenants.counts_claims()


def test_the_allowance_is_the_smaller_of_tokens_and_room_in_flight_rule_1() -> None:
    tenants = Tenants()
    tenants.set_limits({"a": TenantLimit(fires_per_s=3, max_in_flight=2)}, T)
    assert tenants.allowance(T, {}) == {"a": 2}
    assert tenants.allowance(T, {"a": 1}) == {"a": 1}  # a claim on its way counts
    tenants.hold(1, "a")
    assert tenants.allowance(T, {"a": 1}) == {"a": 0}


def test_what_a_tenant_took_costs_its_tokens_and_one_left_without_waits_rule_2() -> None:
    tenants = Tenants()
    tenants.set_limits({"a": TenantLimit(fires_per_s=2)}, T)
    before = tenants.allowance(T, {})
    allow = dict(before)
    allow["a"] = 0  # the dispatch took both tokens
    tenants.took(before, allow, T)
    assert tenants.any_blocked()
    assert tenants.allowance(T, {}) == {"a": 0}
    wake = tenants.wake(T)
    assert wake is not None and T < wake <= T + 1_000
    q: RankedQueue[int] = RankedQueue(10_000)
    q.push("a", 1, 5, T)
    assert not tenants.has_unblocked(q)
    q.push("b", 2, 0, T)
    assert tenants.has_unblocked(q)


def test_a_run_is_counted_once_and_uncounted_once_rule_3() -> None:
    tenants = Tenants()
    tenants.set_limits({"a": TenantLimit(max_in_flight=1)}, T)
    tenants.hold_if_limited(7, "a")
    tenants.hold_if_limited(7, "a")
    tenants.hold_if_limited(8, "unlimited")
    assert tenants.in_flight("a") == 1 and tenants.in_flight("unlimited") == 0
    assert tenants.over_in_flight("a", {})
    tenants.unhold(7)
    tenants.unhold(7)
    assert tenants.in_flight("a") == 0 and not tenants.holds_runs()
    assert not tenants.over_in_flight("a", {})


def test_new_limits_forget_the_runs_counted() -> None:
    tenants = Tenants()
    tenants.set_limits({"a": TenantLimit(max_in_flight=1)}, T)
    tenants.hold(7, "a")
    tenants.set_limits({"a": TenantLimit(max_in_flight=3)}, T)
    assert tenants.in_flight("a") == 0 and not tenants.holds_runs()
