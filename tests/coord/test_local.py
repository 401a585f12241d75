"""LocalCoordinator: one node owns every shard, epochs come from the store."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import pytest

from wheel.coord import SHARD_COUNT, Coordinator, LocalCoordinator, OwnershipChange
from wheel.errors import CoordinationError


class EpochCounter:
    """Stands in for Store.acquire_epochs: bump-and-return per shard."""

    def __init__(self) -> None:
        self.epochs: dict[int, int] = {}
        self.owners: dict[int, str] = {}

    def __call__(self, shards: Collection[int], owner: str) -> dict[int, int]:
        for s in shards:
            self.epochs[s] = self.epochs.get(s, 0) + 1
            self.owners[s] = owner
        return {s: self.epochs[s] for s in shards}


def test_local_coordinator_owns_every_shard_with_the_store_epochs() -> None:
    counter = EpochCounter()
    counter.epochs = {s: 40 + s for s in range(SHARD_COUNT)}
    coord = LocalCoordinator("n1", counter, address="127.0.0.1:7000")
    changes: list[OwnershipChange] = []
    coord.subscribe(changes.append)
    assert isinstance(coord, Coordinator)

    asyncio.run(coord.start())

    assert dict(coord.owned()) == {s: 41 + s for s in range(SHARD_COUNT)}
    assert all(coord.may_dispatch(s) for s in range(SHARD_COUNT))
    assert changes == [OwnershipChange(gained=coord.owned())]
    assert set(counter.owners.values()) == {"n1"}
    assert [m.node_id for m in coord.members()] == ["n1"]


def test_local_coordinator_restart_takes_strictly_higher_epochs() -> None:
    counter = EpochCounter()
    first = LocalCoordinator("n1", counter)
    asyncio.run(first.start())
    before = dict(first.owned())
    lost: list[frozenset[int]] = []
    first.subscribe(lambda c: lost.append(c.lost))
    asyncio.run(first.stop())
    assert lost == [frozenset(range(SHARD_COUNT))]
    assert not first.may_dispatch(0) and not first.owned()

    second = LocalCoordinator("n1", counter)
    asyncio.run(second.start())
    after = second.owned()
    assert all(after[s] > before[s] for s in range(SHARD_COUNT))


def test_local_coordinator_wraps_store_failures() -> None:
    def broken(shards: Collection[int], owner: str) -> dict[int, int]:
        raise OSError("disk gone")

    coord = LocalCoordinator("n1", broken)
    with pytest.raises(CoordinationError, match="disk gone"):
        asyncio.run(coord.start())
    assert not coord.may_dispatch(0)


@pytest.mark.parametrize(
    "epochs",
    [
        {s: 1 for s in range(SHARD_COUNT - 1)},  # a shard missing
        {s: 0 for s in range(SHARD_COUNT)},  # not a valid epoch
        {s: 2**32 for s in range(SHARD_COUNT)},  # does not fit the fence
    ],
)
def test_local_coordinator_rejects_epochs_it_cannot_fence_with(epochs: dict[int, int]) -> None:
    coord = LocalCoordinator("n1", lambda shards, owner: dict(epochs))
    with pytest.raises(CoordinationError):
        asyncio.run(coord.start())
    assert not coord.owned()
