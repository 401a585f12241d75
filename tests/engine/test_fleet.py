"""The connected workers on their own (``wheel.engine.owner._fleet``):
credit, routes, reconnects. Invariant numbers are the module's."""

from __future__ import annotations

from wheel.engine.owner._fleet import Fleet

T = 1_000_000
ROUTE = ("default", "h")


def test_free_credit_is_capacity_less_held_and_reserved_none_while_draining_invariant_1() -> None:
    fleet = Fleet()
    w = fleet.hello("w1", 3, frozenset({"default"}), frozenset())
    w.held.add(1)
    w.reserved = 1
    assert w.free == 1 and fleet.any_free()
    w.draining = True
    assert w.free == 0 and not fleet.any_free()


def test_a_hello_again_keeps_the_runs_held_under_a_new_incarnation_invariant_2() -> None:
    fleet = Fleet()
    first = fleet.hello("w1", 3, frozenset({"default"}), frozenset())
    first.held.add(7)
    first.reserved = 2
    again = fleet.hello("w1", 5, frozenset({"default"}), frozenset({"h"}))
    assert again is fleet["w1"] and len(fleet) == 1
    assert again.held == {7} and again.reserved == 2 and again.capacity == 5
    assert again.incarnation > first.incarnation


def test_a_route_is_served_by_its_pool_and_handler_or_by_a_worker_of_any_handler() -> None:
    fleet = Fleet()
    fleet.hello("other", 1, frozenset({"gpu"}), frozenset())
    named = fleet.hello("named", 1, frozenset({"default"}), frozenset({"h"}))
    assert fleet.serving(ROUTE) == [named]
    assert fleet.serves_with_credit(ROUTE)
    assert not fleet.serves_with_credit(("default", "other"))
    anyone = fleet.hello("any", 1, frozenset({"default"}), frozenset())
    assert fleet.serving(("default", "other")) == [anyone]


def test_an_http_target_goes_only_to_a_worker_that_names_the_http_handler() -> None:
    fleet = Fleet()
    route = ("default", "http")
    anyone = fleet.hello("any", 1, frozenset({"default"}), frozenset())
    assert fleet.serving(route) == [] and not anyone.serves(route)
    assert not fleet.serves_with_credit(route)
    executor = fleet.hello("exec", 1, frozenset({"default"}), frozenset({"http", "h"}))
    assert fleet.serving(route) == [executor] and executor.serves(route)
    assert fleet.serving(ROUTE) == [anyone, executor]


def test_a_worker_that_handed_a_run_back_is_not_its_server_until_its_refusal_runs_out() -> None:
    fleet = Fleet()
    w1 = fleet.hello("w1", 1, frozenset({"default"}), frozenset())
    refused = {w1.incarnation: T + 5_000}
    assert fleet.server_for(ROUTE, refused, T) is None
    assert fleet.server_for(ROUTE, refused, T + 5_000) is w1
    w2 = fleet.hello("w2", 1, frozenset({"default"}), frozenset())
    assert fleet.server_for(ROUTE, refused, T) is w2


def test_the_fleet_is_busy_above_its_threshold_or_without_capacity() -> None:
    fleet = Fleet()
    assert fleet.busy(0.85)  # no capacity at all
    w = fleet.hello("w1", 10, frozenset({"default"}), frozenset())
    w.held.update(range(8))
    assert not fleet.busy(0.85)
    w.held.add(8)
    assert fleet.busy(0.85)
    assert fleet.gone("w1") is w and fleet.gone("w1") is None and not fleet
