"""The shards an owner holds, on their own (``wheel.engine.owner._shardmap``):
fences, their epochs, and the epochs mapping. Invariant numbers are the
module's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wheel.engine import model
from wheel.engine.model import shard_of
from wheel.engine.owner import COUNTER_BITS, COUNTER_MASK
from wheel.engine.owner._shardmap import ShardMap


def test_fences_strictly_increase_and_carry_the_epoch_invariant_1() -> None:
    shards = ShardMap({3: 7})
    fences = [shards.next_fence(3) for _ in range(3)]
    assert fences == [(7 << COUNTER_BITS) | n for n in (1, 2, 3)]


def test_an_exhausted_counter_is_refused_not_wrapped_invariant_1() -> None:
    shards = ShardMap({3: 7})
    shards.adopt_fence(3, (7 << COUNTER_BITS) | COUNTER_MASK)
    with pytest.raises(OverflowError, match="bump the epoch"):
        shards.next_fence(3)


def test_an_adopted_fence_moves_the_counter_up_only_and_only_in_its_epoch_invariant_2() -> None:
    shards = ShardMap({3: 7})
    shards.adopt_fence(3, (7 << COUNTER_BITS) | 40)
    shards.adopt_fence(3, (7 << COUNTER_BITS) | 5)  # older: no step back
    shards.adopt_fence(3, (6 << COUNTER_BITS) | 900)  # an older epoch's: not ours
    assert shards.next_fence(3) == (7 << COUNTER_BITS) | 41


def test_the_epochs_mapping_is_kept_until_the_shards_change_invariant_3() -> None:
    shards = ShardMap({1: 2})
    first = shards.epochs()
    assert first == {1: 2} and shards.epochs() is first
    shards.add(5, 9)
    second = shards.epochs()
    assert second == {1: 2, 5: 9} and first == {1: 2}
    assert [s.shard for s in shards.remove([1, 4])] == [1]
    assert shards.epochs() == {5: 9} and second == {1: 2, 5: 9}


def test_a_job_is_owned_and_tabled_by_its_shard() -> None:
    job = 12345
    shards = ShardMap({shard_of(job): 1})
    assert shards.owns(job) and shards.table_of(job) is shards[shard_of(job)].table
    shards.remove([shard_of(job)])
    assert not shards.owns(job) and shards.table_of(job) is None and not shards


def _fibonacci_shard(job_id: int) -> int:
    """The shard function as first written: the one every store's rows and
    every cluster's ownership were placed by."""
    return ((job_id * 0x9E3779B97F4A7C15) >> 56) & 0xFF


@given(st.integers(min_value=-(1 << 70), max_value=1 << 70))
def test_a_job_s_shard_is_the_top_byte_of_its_fibonacci_hash(job_id: int) -> None:
    assert shard_of(job_id) == _fibonacci_shard(job_id)


def test_the_shard_of_sequential_and_edge_ids_never_moved() -> None:
    assert model._F0 | model._F1 << 21 | model._F2 << 42 == model._FIB  # the limbs
    edges = [(1 << k) + d for k in range(64) for d in (-1, 0, 1)]
    for job_id in [*range(100_000), *edges, (1 << 63) - 1]:
        assert shard_of(job_id) == _fibonacci_shard(job_id), job_id
