"""How a worker splits its capacity between nodes (``wheel.worker._credit``)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from wheel.worker._credit import fair_shares


def test_one_node_gets_the_whole_capacity_whatever_it_wants() -> None:
    assert fair_shares(16, [1]) == [16]
    assert fair_shares(16, [math.inf]) == [16]


def test_nodes_that_all_want_more_than_there_is_share_it_evenly() -> None:
    assert fair_shares(12, [math.inf] * 3) == [4, 4, 4]
    assert sorted(fair_shares(10, [math.inf] * 3)) == [3, 3, 4]


def test_an_idle_node_keeps_its_probe_and_the_busy_ones_share_the_rest() -> None:
    shares = fair_shares(12, [1, math.inf, math.inf])
    assert shares[0] == 1 and sorted(shares[1:]) == [5, 6]


def test_what_nobody_wants_is_split_evenly() -> None:
    assert fair_shares(30, [1, 2, 3]) == [1 + 8, 2 + 8, 3 + 8]


def test_nothing_to_share_gives_nothing() -> None:
    assert fair_shares(0, [math.inf, 1]) == [0, 0]
    assert fair_shares(5, []) == []


@given(
    budget=st.integers(0, 10_000),
    demands=st.lists(st.one_of(st.integers(0, 5_000), st.just(math.inf)), max_size=8),
)
def test_shares_add_up_to_the_budget_and_meet_small_demands_first(
    budget: int, demands: list[float]
) -> None:
    shares = fair_shares(budget, demands)
    assert all(s >= 0 for s in shares)
    if demands:
        assert sum(shares) == budget
    # A node that got less than it wanted got at least as much as any other
    # node got of what it wanted (max-min fairness).
    for i, d in enumerate(demands):
        if shares[i] < d:
            assert all(shares[i] >= min(shares[j], d2) - 1 for j, d2 in enumerate(demands))
