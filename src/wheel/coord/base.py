"""The coordinator plug point: who owns which shard, under which fence epoch.

A node dispatches a shard only while its coordinator says so. Ownership comes
with an epoch that is strictly increasing per shard across owners, so the fence
``(epoch << 32) | counter`` of a new owner always beats every fence an old
owner handed out. Backends: ``LocalCoordinator`` (one node owns everything) and
``EtcdCoordinator`` (a cluster shares the shards through etcd leases).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from wheel.engine.model import SHARD_COUNT

__all__ = [
    "MAX_EPOCH",
    "SHARD_COUNT",
    "Coordinator",
    "Member",
    "OwnershipChange",
    "ShardHook",
    "Subscribers",
]

# The fence packs the epoch into its high 32 bits.
MAX_EPOCH = 2**32 - 1

_log = logging.getLogger(__name__)

# A node's part in a planned move (``set_preparer``, ``set_releaser``).
ShardHook = Callable[[frozenset[int]], Coroutine[Any, Any, None]]


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnershipChange:
    """Shards this node just gained (with their new epochs) and just lost."""

    gained: Mapping[int, int] = field(default_factory=dict)
    lost: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    """A live node of the cluster and the address its peers reach it at."""

    node_id: str
    address: str


@runtime_checkable
class Coordinator(Protocol):
    """Shard ownership for one node: what the node calls, and nothing more."""

    node_id: str
    # Where the other members and workers reach this node ("host:port").
    address: str

    async def start(self) -> None:
        """Join and acquire shards; the first OwnershipChange reaches the
        subscribers before this returns."""

    async def stop(self) -> None:
        """Release every shard so other nodes take over without waiting."""

    async def hand_off(self) -> None:
        """Before ``stop``, a planned leave: say this node is leaving and wait
        (bounded) until the members its shards go to have loaded them, while
        this node still serves them."""

    def set_preparer(self, prepare: ShardHook) -> None:
        """``prepare(shards)`` loads shards a planned move (this node joining,
        another leaving) is about to give this node, while their owner still
        serves them; awaited on the event loop before the move."""

    def set_releaser(self, release: ShardHook) -> None:
        """``release(shards)`` hands shards over in a planned move of them to
        another member (one joining): awaited on the event loop (bounded)
        before they are released, so that their unsent runs go with them."""

    def subscribe(self, callback: Callable[[OwnershipChange], None]) -> None:
        """Call ``callback`` on the event loop for every ownership change.
        Subscribe before ``start`` to see the first one."""

    def owned(self) -> Mapping[int, int]:
        """Shard -> epoch held now."""

    def may_dispatch(self, shard: int) -> bool:
        """True only while this node holds ``shard`` and its own monotonic
        clock says the hold cannot have lapsed yet."""

    def valid_until(self) -> float:
        """``time.monotonic()`` past which nothing held may be dispatched
        (the local lease deadline; ``inf`` when holds cannot lapse). One
        check a loop iteration gates every shard at once."""

    def members(self) -> list[Member]:
        """The live members as last seen."""

    def view_version(self) -> int:
        """Grows whenever the members or the shard holders seen change,
        comparable across members (etcd's revision of the view; 0 alone)."""

    def shard_owners(self) -> Mapping[int, str]:
        """Shard -> the node id holding it as last seen (a shard between
        holders is absent): where a call about a job of another node goes."""


class Subscribers:
    """The callbacks of one coordinator, delivered on its event loop.

    A failing callback is logged and does not stop the others: the coordinator
    must outlive a bug in one consumer.
    """

    __slots__ = ("_callbacks", "_loop")

    def __init__(self) -> None:
        self._callbacks: list[Callable[[OwnershipChange], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, callback: Callable[[OwnershipChange], None]) -> None:
        self._callbacks.append(callback)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver on ``loop`` from now on (called from ``start``)."""
        self._loop = loop

    def deliver(self, change: OwnershipChange) -> None:
        """Run every callback now; call this on the event loop."""
        for callback in list(self._callbacks):
            try:
                callback(change)
            except Exception:
                _log.exception("ownership callback failed")

    def post(self, change: OwnershipChange) -> None:
        """Queue ``change`` for delivery on the loop; safe from any thread.
        Changes are delivered in the order they were posted."""
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self.deliver, change)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            _log.debug("ownership change dropped: event loop closed")
