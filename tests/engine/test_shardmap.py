"""The shards an owner holds, on their own (``wheel.engine.owner._shardmap``):
fences, their epochs, and the epochs mapping. Invariant numbers are the
module's."""

from __future__ import annotations

import pytest

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
