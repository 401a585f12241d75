"""A node's gains loaded due first, on PostgreSQL: the rest of a gain loads
behind it without holding up the gains after it, comes in once the store is
back when its read fails, and a fault of the node while it adds the rest
gains the shards again whole. Each ends with every job held once."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import pytest

from tests.ops._node import LiveNode, relay_to
from tests.rpc.test_api import wait_for
from wheel.coord.base import OwnershipChange
from wheel.coord.local import LocalCoordinator
from wheel.engine.model import SHARD_COUNT, shard_of
from wheel.engine.records import NewJob
from wheel.engine.spec import Interval, JobSpec
from wheel.node import Node, NodeConfig, _cluster
from wheel.store.base import Store
from wheel.store.open import open_store

pytestmark = [pytest.mark.postgres]

HOUR_MS = 3_600_000
IDLE = 3_000  # due in two days: the rest of every gain
SOON = 64  # due within the minute: the first part


class Scripted(LocalCoordinator):
    """Gives ``first`` at start and more on ``give``, each under an epoch
    the store hands out (newer than any before, as etcd's would be)."""

    def __init__(self, node_id: str, store: Store, first: Collection[int]) -> None:
        super().__init__(node_id, store.acquire_epochs)
        self._first = sorted(first)

    async def start(self) -> None:
        self._subscribers.bind(asyncio.get_running_loop())
        self.give(self._first)

    def give(self, shards: Collection[int]) -> None:
        epochs = self._acquire_epochs(sorted(shards), self.node_id)
        self._owned.update(epochs)
        self._subscribers.deliver(OwnershipChange(gained=epochs))


@pytest.fixture
def jobs(pg_dsn: str) -> Iterator[tuple[str, dict[int, int]]]:
    """The DSN, and shard -> how many jobs it has: ``IDLE`` due in two days
    and ``SOON`` due within the minute, spread over the shards."""
    store = open_store(pg_dsn)
    try:
        now = store.clock_ms()
        news = [_job(f"idle-{i}", now + 48 * HOUR_MS) for i in range(IDLE)]
        news += [_job(f"soon-{i}", now + 30_000) for i in range(SOON)]
        per_shard: dict[int, int] = {}
        for at in range(0, len(news), 1_000):
            for made in store.submit_jobs(news[at : at + 1_000]):
                assert not isinstance(made, Exception), made
                shard = shard_of(made.job.job_id)
                per_shard[shard] = per_shard.get(shard, 0) + 1
        yield pg_dsn, per_shard
    finally:
        store.close()


def _job(name: str, at_ms: int) -> NewJob:
    spec = JobSpec(name=name, handler="h", schedule=Interval(period_ms=24 * HOUR_MS))
    return NewJob(spec=spec, created_at_ms=at_ms - 1_000, next_run_at=at_ms)


def _held(live: LiveNode) -> tuple[Mapping[int, int], int, set[int]]:
    """(shards held with their epochs, jobs held, shards whose rest is on its way)."""
    node = live.node
    assert node is not None

    def read() -> tuple[Mapping[int, int], int, set[int]]:
        status = node.status()
        return status.shards, status.jobs, node._checkpointing.partial()

    held: tuple[Mapping[int, int], int, set[int]] = live.call(read)
    return held


def _coordinated(store_url: str, first: Collection[int]) -> tuple[LiveNode, list[Scripted]]:
    made: list[Scripted] = []

    def coordinator(store: Store) -> Scripted:
        made.append(Scripted("node-1", store, first))
        return made[-1]

    return LiveNode(store_url, NodeConfig(retain_ms=None), coordinator=coordinator), made


def test_a_gains_rest_loads_behind_without_holding_up_the_next_and_after_the_store_is_back(
    jobs: tuple[str, dict[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn, per_shard = jobs
    first, second = range(SHARD_COUNT // 2), range(SHARD_COUNT // 2, SHARD_COUNT)
    in_first = sum(per_shard.get(s, 0) for s in first)
    total = IDLE + SOON
    # The first gain's rest waits for the test, then reads through the relay.
    go = threading.Event()
    reads: list[tuple[int, bool]] = []  # (first shard, failed)
    real = _cluster.load_later  # type: ignore[attr-defined]

    def load_later(store: Store, shards: Sequence[int], later_than: int) -> Any:
        if shards[0] == 0 and not reads:
            assert go.wait(30)
        try:
            out = real(store, shards, later_than)
        except Exception:
            reads.append((shards[0], True))
            raise
        reads.append((shards[0], False))
        return out

    monkeypatch.setattr(_cluster, "load_later", load_later)
    with relay_to(dsn) as (relay, through):
        # Tries of a read that fail fast while the relay is cut.
        live, made = _coordinated(f"{through}&retries=2&pool_timeout_ms=1000", first)
        with live:
            [coordinator] = made
            # Due first: the first half dispatches what is due soon, its rest held back.
            wait_for(lambda: set(_held(live)[0]) == set(first), 20, "the first gain")
            _, count, partial = _held(live)
            assert partial == set(first) and count < in_first
            # The next gain does not wait for that rest: it comes in whole.
            live.call(lambda: coordinator.give(second))
            wait_for(
                lambda: (
                    set(_held(live)[0]) == set(range(SHARD_COUNT)) and _held(live)[2] == set(first)
                ),
                20,
                "the second gain and its rest, the first's still held back",
            )
            assert reads == [(second[0], False)]
            # The store goes away as the first rest reads: it fails, and is
            # read again once the store is back.
            relay.cut()
            go.set()
            wait_for(lambda: (0, True) in reads, 30, "the rest's read to fail")
            assert _held(live)[2] == set(first)
            relay.restore()
            wait_for(lambda: _held(live)[1:] == (total, set()), 30, "every job held")
            assert reads[-1] == (0, False)
            assert set(_held(live)[0]) == set(range(SHARD_COUNT))


def test_a_fault_while_adding_a_rest_gains_its_shards_again_whole(
    jobs: tuple[str, dict[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn, _ = jobs
    real = Node.add_rest
    faults: list[int] = []

    def add_rest(self: Node, shards: Any, packed: Any, profiles: Any) -> int:
        if not faults:
            faults.append(len(packed))
            raise RuntimeError("injected: a fault of the node adding a rest")
        return real(self, shards, packed, profiles)

    monkeypatch.setattr(Node, "add_rest", add_rest)
    live, made = _coordinated(dsn, range(SHARD_COUNT))
    with live:
        [coordinator] = made
        wait_for(lambda: _held(live)[1:] == (IDLE + SOON, set()), 30, "every job held")
        assert faults, "the fault was not injected"
        epochs = coordinator.owned()
        # Gained again under the same epochs, and every job held once.
        assert _held(live)[0] == epochs
        store = open_store(dsn)
        try:
            assert store.shard_epochs(range(SHARD_COUNT)) == epochs
        finally:
            store.close()


def test_a_gain_does_not_wait_for_another_gains_load(
    jobs: tuple[str, dict[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn, _ = jobs
    first, second = range(SHARD_COUNT // 2), range(SHARD_COUNT // 2, SHARD_COUNT)
    go = threading.Event()
    real = _cluster.load_shard_contents  # type: ignore[attr-defined]

    def load_shard_contents(store: Store, shards: Sequence[int], bound: int) -> Any:
        if shards[0] == 0:
            assert go.wait(30)
        return real(store, shards, bound)

    monkeypatch.setattr(_cluster, "load_shard_contents", load_shard_contents)
    live, made = _coordinated(dsn, first)
    with live:
        [coordinator] = made
        # The first gain's load is held up; the second's is not, nor waits.
        live.call(lambda: coordinator.give(second))
        wait_for(lambda: set(_held(live)[0]) == set(second), 20, "the second gain")
        go.set()
        wait_for(lambda: _held(live)[1:] == (IDLE + SOON, set()), 30, "every job held")
        assert set(_held(live)[0]) == set(range(SHARD_COUNT))
