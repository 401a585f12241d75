"""The cluster as a worker follows it: members and the owner of every shard.

Nodes send their view (``Membership``) in Welcome, push it on every change,
and answer it to ``AdminService.GetMembership``. Views from different nodes
are ordered by ``version`` (cluster-wide: the etcd revision the view was read
at); the worker keeps the newest. A single node outside a cluster sends an
unversioned view naming only itself: there is nothing to follow, and
``view_of`` says so, so such a worker behaves exactly as before clusters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from wheel.engine.model import SHARD_COUNT, shard_of
from wheel.rpc.v1 import cluster_pb2

__all__ = ["View", "view_of"]


@dataclass(frozen=True, slots=True, kw_only=True)
class View:
    """One membership: each member's address by node id, each shard's owner."""

    version: int
    members: Mapping[str, str]
    # SHARD_COUNT entries: the owning node id, or "" (no owner known).
    shard_owners: tuple[str, ...]

    def owner_of(self, job_id: int) -> str:
        """The member owning ``job_id``'s shard, or "" when none is known (an
        owner that is not a member is leaving: as good as none)."""
        owner = self.shard_owners[shard_of(job_id)]
        return owner if owner in self.members else ""

    def supersedes(self, other: View | None) -> bool:
        """Whether this view replaces ``other``: it is at least as new, or
        either is unversioned (taken as it comes)."""
        return (
            other is None
            or self.version == 0
            or other.version == 0
            or self.version >= other.version
        )


def view_of(msg: cluster_pb2.Membership) -> View | None:
    """The view in ``msg``, or None when it is nothing to follow: no members,
    or an unversioned view of one node (a single node outside a cluster)."""
    members = {m.node_id: m.address for m in msg.members if m.node_id}
    if not members or (msg.version == 0 and len(members) == 1):
        return None
    owners = tuple(msg.shard_owners)
    if len(owners) != SHARD_COUNT:
        # A malformed list routes nothing rather than misroute by position.
        owners = ("",) * SHARD_COUNT
    return View(version=msg.version, members=members, shard_owners=owners)
