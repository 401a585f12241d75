"""The cluster as a worker follows it: members and the owner of every shard.

Nodes send their view (``Membership``) in Welcome, push it on every change,
and answer it to ``AdminService.GetMembership``. Views from different nodes
are ordered by ``version`` (cluster-wide: the etcd revision the view was read
at); the worker keeps the newest. A single node outside a cluster sends an
unversioned view naming only itself: there is nothing to follow, and
``view_of`` says so, so such a worker behaves exactly as before clusters.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from wheel._retry import Backoff
from wheel.engine.model import SHARD_COUNT, shard_of
from wheel.rpc.v1 import admin_service_pb2, admin_service_pb2_grpc, cluster_pb2

if TYPE_CHECKING:
    from wheel.worker._runs import Done, Run

__all__ = [
    "BOUNCE_WINDOW_S",
    "MEMBERSHIP_MIN_INTERVAL_S",
    "REHOME_BACKOFF",
    "Bounces",
    "Stray",
    "View",
    "fetch_membership",
    "view_of",
]

log = logging.getLogger("wheel.worker")

# Rule 6: how soon a stray is tried again, and the most it waits.
REHOME_RETRY_S = 0.2
REHOME_RETRY_MAX_S = 2.0
# A run moved again this soon after its last move is bouncing: it backs off.
BOUNCE_WINDOW_S = 5.0
# GetMembership: its deadline, and the least time between two asks.
MEMBERSHIP_TIMEOUT_S = 2.0
MEMBERSHIP_MIN_INTERVAL_S = 0.2
# The wait before try ``retries + 1`` to place a stray (rule 6).
REHOME_BACKOFF = Backoff(initial=REHOME_RETRY_S, max=REHOME_RETRY_MAX_S)


class Bounces:
    """Runs moved lately (rule 6), to tell a run bouncing between nodes."""

    __slots__ = ("_limit", "_moves")

    def __init__(self) -> None:
        self._moves: dict[int, tuple[int, float]] = {}  # run id -> (moves, last)
        self._limit = 4096

    def delay(self, run_id: int, now: float, wait: bool) -> float:
        """How long a run moved now waits before it is placed: none for a
        first move, backing off for one within ``BOUNCE_WINDOW_S`` of its
        last (or for every one that must ``wait``)."""
        count, last = self._moves.get(run_id, (0, -math.inf))
        count = count + 1 if now - last < BOUNCE_WINDOW_S else 1
        self._moves[run_id] = (count, now)
        if len(self._moves) > self._limit:
            self._moves = {k: v for k, v in self._moves.items() if now - v[1] < BOUNCE_WINDOW_S}
            self._limit = max(4096, 2 * len(self._moves))
        if wait:
            return REHOME_BACKOFF.delay(count - 1)
        return 0.0 if count == 1 else REHOME_BACKOFF.delay(count - 2)


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


class Stray:
    """A run, or the completion of one, with no node to report to yet: its
    shard moved and its owner is not known or not connected (rule 6)."""

    __slots__ = (
        "disowned",
        "disowned_in",
        "done",
        "due",
        "hint",
        "job_id",
        "run",
        "since",
        "tries",
    )

    def __init__(self, job_id: int, now: float) -> None:
        self.job_id = job_id
        self.run: Run | None = None
        self.done: Done | None = None
        # The owner a node named for it ("" if none was named).
        self.hint = ""
        # The node that answered ``moved`` for it, and the view version then:
        # not its home, whatever that view says, until a newer view.
        self.disowned = ""
        self.disowned_in = 0
        self.tries = 0
        self.due = now
        self.since = now


async def fetch_membership(
    channel: grpc.aio.Channel | None, target: str, metadata: Sequence[tuple[str, str]] | None
) -> cluster_pb2.Membership | None:
    """The cluster as the node at ``channel`` sees it (GetMembership); None
    when it did not answer in time or the channel closed under the call."""
    if channel is None:
        return None
    try:
        stub = admin_service_pb2_grpc.AdminServiceStub(channel)
        msg: cluster_pb2.Membership = await stub.GetMembership(
            admin_service_pb2.GetMembershipRequest(),
            timeout=MEMBERSHIP_TIMEOUT_S,
            metadata=metadata,
        )
    except grpc.RpcError as exc:  # grpc.aio's AioRpcError is one
        log.debug("GetMembership on %s failed: %s", target, exc)
        return None
    except Exception:  # the channel closed under the call
        log.debug("GetMembership on %s failed", target, exc_info=True)
        return None
    return msg
