"""Shard ownership: which node dispatches which shard, under which fence epoch."""

from wheel.coord.base import MAX_EPOCH, SHARD_COUNT, Coordinator, Member, OwnershipChange
from wheel.coord.etcd import EtcdCoordinator, assign_shards, rendezvous_owner
from wheel.coord.local import LocalCoordinator

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
