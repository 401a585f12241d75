"""Shard ownership: which node dispatches which shard, under which fence epoch.

The etcd coordinator is imported when first named: a single node, which
never uses it, starts without loading the etcd client and its stubs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from wheel.coord.base import MAX_EPOCH, SHARD_COUNT, Coordinator, Member, OwnershipChange
from wheel.coord.local import LocalCoordinator

if TYPE_CHECKING:
    from wheel.coord.etcd import EtcdCoordinator, assign_shards, rendezvous_owner

__all__ = [
    "MAX_EPOCH",
    "SHARD_COUNT",
    "Coordinator",
    "EtcdCoordinator",
    "LocalCoordinator",
    "Member",
    "OwnershipChange",
    "assign_shards",
    "rendezvous_owner",
]

_FROM_ETCD = frozenset({"EtcdCoordinator", "assign_shards", "rendezvous_owner"})


def __getattr__(name: str) -> Any:
    if name in _FROM_ETCD:
        from wheel.coord import etcd

        return getattr(etcd, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
