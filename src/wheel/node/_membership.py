"""A node's place in its cluster: where a job's calls and a run's reports
go, who the members are, and the view pushed to workers when that changes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from wheel.coord.base import Coordinator, Member
from wheel.engine.driver import Driver
from wheel.engine.model import SHARD_COUNT, shard_of
from wheel.errors import NotOwner
from wheel.node._values import Membership, NodeConfig, WorkerSession


class NodeMembership:
    """The cluster-facing part of ``wheel.node.Node``."""

    coordinator: Coordinator | None
    config: NodeConfig
    sessions: dict[str, WorkerSession]
    membership_sink: Callable[[WorkerSession, Membership], None] | None
    _pushed_view: Membership | None
    # Tells the owners of other members' shards that these jobs are new or
    # changed (set by the rpc layer; the outbox relay's jobs go through it).
    job_changes_sink: Callable[[list[int]], None] | None = None

    if TYPE_CHECKING:

        def _the_driver(self) -> Driver: ...
        def wake(self) -> None: ...

    def route(self, job_id: int) -> str | None:
        """Where a call that changes the job must run: None here (this node
        owns its shard, or is the only node), else the owner's address.
        Raises ``NotOwner`` when no member is known to hold the shard (it is
        moving): the client retries."""
        coordinator = self.coordinator
        if coordinator is None or self._the_driver().owns(job_id):
            return None
        shard = shard_of(job_id)
        holder = coordinator.shard_owners().get(shard)
        if holder is not None and holder != self.config.node_id:
            for member in coordinator.members():
                if member.node_id == holder:
                    return member.address
        raise NotOwner(f"shard {shard} of job {job_id} is moving between nodes; retry")

    def owners_of(self, job_ids: Sequence[int]) -> dict[str, list[int]]:
        """The jobs held by other members, by their owner's address."""
        coordinator = self.coordinator
        if coordinator is None:
            return {}
        owners = coordinator.shard_owners()
        addresses = {m.node_id: m.address for m in coordinator.members()}
        out: dict[str, list[int]] = {}
        for job_id in job_ids:
            holder = owners.get(shard_of(job_id))
            if holder is not None and holder != self.config.node_id and holder in addresses:
                out.setdefault(addresses[holder], []).append(job_id)
        return out

    def jobs_changed(self, job_ids: Iterable[int]) -> None:
        """Another member stored or changed these jobs: read them now."""
        driver = self._the_driver()
        driver.reread(j for j in job_ids if driver.owns(j))
        self.wake()

    def members(self) -> list[Member]:
        """The cluster's live members (this node alone without a cluster)."""
        if self.coordinator is None:
            return [Member(node_id=self.config.node_id, address="")]
        return self.coordinator.members()

    def membership(self) -> Membership:
        """The cluster as this node sees it: what workers route runs by."""
        owners = self.shard_owners()
        version = 0 if self.coordinator is None else self.coordinator.view_version()
        return Membership(
            members=tuple(self.members()),
            shard_owners=tuple(owners.get(s, "") for s in range(SHARD_COUNT)),
            version=version,
        )

    def _push_membership(self) -> None:
        """Tell every worker stream when the members or shard owners changed:
        workers open streams to new members and re-home runs of gone ones."""
        sink = self.membership_sink
        if sink is None:
            return
        view = self.membership()
        if view == self._pushed_view:
            return
        self._pushed_view = view
        for session in list(self.sessions.values()):
            sink(session, view)

    def run_home(self, job_id: int) -> Member | None:
        """Where a worker reports a run of ``job_id``: None when this node
        holds its shard; else the member that does (this node itself while
        it is still loading a shard it just gained, so the worker comes
        back), or an empty member while the shard is between owners."""
        if self._the_driver().owns(job_id):
            return None
        coordinator = self.coordinator
        if coordinator is None:
            return None  # one node holds everything: nothing moves
        shard = shard_of(job_id)
        me = self.config.node_id
        if shard in coordinator.owned():
            return Member(node_id=me, address=coordinator.address)
        holder = coordinator.shard_owners().get(shard)
        for member in coordinator.members():
            if member.node_id == holder and holder != me:
                return member
        return Member(node_id="", address="")

    def shard_owners(self) -> dict[int, str]:
        """Shard -> the node id holding it, as last seen."""
        if self.coordinator is None:
            return dict.fromkeys(self._the_driver().shards(), self.config.node_id)
        return dict(self.coordinator.shard_owners())
