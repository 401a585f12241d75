"""A node's shards in a cluster: the coordinator's gains and losses turned into
the owner's.

Order matters, and is the point of this module:

- **Losing** a shard (a rebalance, the lease lost, its local deadline passed)
  hands it over at once, on the event loop, before any later batch is formed:
  its timers are dropped and its runs forgotten, none marked lost. A batch
  already on its way to the store may still carry the shard's writes; the
  store refuses them once the new owner has fenced the shard.
- **Gaining** a shard fences it in the store first (its epoch raised to the
  coordinator's: from that commit on, the store refuses the previous owner's
  claims, completions and schedule moves), then loads it, then adds it to the
  owner. The load comes after the fence, so it holds everything the previous
  owner wrote; the node's change feed is rewound to the load's watermark so
  the API changes made through other nodes since then are read too.
- A gain is re-checked against the coordinator after every await: a shard
  lost (or re-acquired with a newer epoch) meanwhile is not added with a
  stale epoch. Gains are applied one at a time, in order.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from wheel.coord.base import Coordinator, OwnershipChange
from wheel.errors import StoreError
from wheel.recovery import checkpoint_contents, load_shard_contents

if TYPE_CHECKING:
    from wheel.node._node import Node

log = logging.getLogger("wheel.node")

# Store trouble while gaining shards: retried with this backoff while they are
# still ours.
GAIN_RETRY_S = (0.05, 2.0)


class ShardOwnership:
    """Applies a coordinator's ownership changes to a node's owner."""

    def __init__(self, node: Node, coordinator: Coordinator) -> None:
        self.node = node
        self.coordinator = coordinator
        # Gained and not yet added: shard -> epoch, newest wins.
        self._gaining: dict[int, int] = {}
        self._worker: asyncio.Task[None] | None = None
        self._on_gained: list[Callable[[Mapping[int, int]], None]] = []
        coordinator.subscribe(self._changed)

    def on_gained(self, callback: Callable[[Mapping[int, int]], None]) -> None:
        """Call ``callback(epochs)`` once shards are added to the owner."""
        self._on_gained.append(callback)

    def gaining(self) -> Mapping[int, int]:
        return dict(self._gaining)

    def _changed(self, change: OwnershipChange) -> None:
        """On the event loop, in the order the coordinator decided them."""
        if change.lost:
            for shard in change.lost:
                self._gaining.pop(shard, None)
            self.node.hand_over(change.lost)
        if change.gained:
            self._gaining.update(change.gained)
            if self._worker is None or self._worker.done():
                self._worker = asyncio.create_task(self._gain_all(), name="wheel-gain-shards")

    def _still_ours(self, epochs: Mapping[int, int]) -> dict[int, int]:
        owned = self.coordinator.owned()
        return {s: e for s, e in epochs.items() if owned.get(s) == e}

    async def _gain_all(self) -> None:
        backoff = GAIN_RETRY_S[0]
        while self._gaining and not self.node.stopping:
            epochs = self._still_ours(self._gaining)
            for shard in list(self._gaining):
                if shard not in epochs:
                    del self._gaining[shard]  # lost or moved on meanwhile
            if not epochs:
                break
            try:
                await self._gain(epochs)
            except StoreError as exc:
                log.warning(
                    "gaining %d shards failed (%s); retrying in %.2fs", len(epochs), exc, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, GAIN_RETRY_S[1])
                continue
            except Exception:
                log.exception("gaining %d shards failed; retrying", len(epochs))
                await asyncio.sleep(GAIN_RETRY_S[1])
                continue
            backoff = GAIN_RETRY_S[0]
            for shard, epoch in epochs.items():
                if self._gaining.get(shard) == epoch:
                    del self._gaining[shard]
        # The first gains are done: shards given later load from the store.
        self.node.release_recovered()

    async def _gain(self, epochs: Mapping[int, int]) -> None:
        node = self.node
        store = node.store
        fenced = await node.in_thread(
            functools.partial(store.fence_shards, epochs, node.config.node_id)
        )
        ahead = {s for s, e in epochs.items() if fenced.get(s, e) > e}
        if ahead:
            # A newer owner fenced them first: this hold is already stale.
            log.warning("shards %s were fenced by a newer owner; not served", sorted(ahead))
        epochs = {s: e for s, e in self._still_ours(epochs).items() if s not in ahead}
        if not epochs:
            return
        # Shards this node held before its restart come back from its
        # checkpoint and the changes since; the others from the store.
        as_of = node.checkpointed(epochs)
        parts: list[tuple[list[int], bool]] = [
            (sorted(as_of), True),
            (sorted(s for s in epochs if s not in as_of), False),
        ]
        for shards, from_checkpoint in parts:
            if not shards:
                continue
            if from_checkpoint:
                state = node.recovered()
                assert state is not None
                load = functools.partial(
                    checkpoint_contents, store, state, shards, min(as_of.values())
                )
            else:
                load = functools.partial(load_shard_contents, store, shards)
            contents, watermark = await node.in_thread(load)
            mine = {s: e for s, e in self._still_ours(epochs).items() if s in shards}
            if mine:
                node.take_on(mine, contents, watermark, from_checkpoint=from_checkpoint)
                for callback in list(self._on_gained):
                    callback(mine)
