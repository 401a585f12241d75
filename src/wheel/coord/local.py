"""One node owns all shards: no cluster, no lease, epochs from the store.

Each start bumps every shard's epoch in the record of truth
(``Store.acquire_epochs``), so a restarted node fences out anything its previous
incarnation handed out.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Collection, Mapping

from wheel.coord.base import (
    MAX_EPOCH,
    SHARD_COUNT,
    Member,
    OwnershipChange,
    ShardHook,
    Subscribers,
)
from wheel.errors import CoordinationError

__all__ = ["LocalCoordinator"]


class LocalCoordinator:
    """Owns shards ``0..SHARD_COUNT-1`` from ``start`` to ``stop``."""

    def __init__(
        self,
        node_id: str,
        acquire_epochs: Callable[[Collection[int], str], dict[int, int]],
        *,
        address: str = "",
    ) -> None:
        self.node_id = node_id
        self.address = address
        self._acquire_epochs = acquire_epochs
        self._owned: dict[int, int] = {}
        self._subscribers = Subscribers()

    async def start(self) -> None:
        """Bump every shard's epoch and take all of them.

        The store call runs on the loop: it is one short transaction at boot,
        and some stores keep thread-bound connections.
        """
        self._subscribers.bind(asyncio.get_running_loop())
        shards = range(SHARD_COUNT)
        try:
            epochs = self._acquire_epochs(shards, self.node_id)
        except CoordinationError:
            raise
        except Exception as exc:
            raise CoordinationError(f"could not acquire shard epochs: {exc}") from exc
        missing = [s for s in shards if s not in epochs]
        if missing:
            raise CoordinationError(f"no epoch returned for shards {missing[:8]}")
        bad = {s: e for s, e in epochs.items() if not 0 < e <= MAX_EPOCH}
        if bad:
            raise CoordinationError(
                f"epochs out of range (1..2**32-1): {dict(list(bad.items())[:8])}"
            )
        self._owned = {s: epochs[s] for s in shards}
        self._subscribers.deliver(OwnershipChange(gained=dict(self._owned)))

    async def stop(self) -> None:
        lost = frozenset(self._owned)
        self._owned = {}
        if lost:
            self._subscribers.deliver(OwnershipChange(lost=lost))

    async def hand_off(self) -> None:
        """Nothing to hand to: a single node's shards wait for its restart."""

    def set_preparer(self, prepare: ShardHook) -> None:
        """Nothing ever moves to a single node while it runs."""

    def set_releaser(self, release: ShardHook) -> None:
        """Nor from it."""

    def subscribe(self, callback: Callable[[OwnershipChange], None]) -> None:
        self._subscribers.add(callback)

    def owned(self) -> Mapping[int, int]:
        return dict(self._owned)

    def may_dispatch(self, shard: int) -> bool:
        return shard in self._owned

    def valid_until(self) -> float:
        return math.inf

    def view_version(self) -> int:
        return 0

    def shard_owners(self) -> Mapping[int, str]:
        return dict.fromkeys(self._owned, self.node_id)

    def members(self) -> list[Member]:
        return [Member(node_id=self.node_id, address=self.address)] if self._owned else []
