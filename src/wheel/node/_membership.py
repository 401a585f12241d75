"""A node's place in its cluster: where a job's calls and a run's reports
go, who the members are, and the view pushed to workers when that changes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from wheel.coord.base import Coordinator, Member
from wheel.engine.driver import Driver
from wheel.engine.model import SHARD_COUNT, shard_of
from wheel.errors import NotOwner
from wheel.node._values import Membership, NodeConfig, WorkerSession

MembershipSink = Callable[[WorkerSession, Membership], None]


class ClusterView:
    """A node's view of its cluster: routing, members, and the view pushed
    to worker streams when it changes."""

    def __init__(
        self,
        config: NodeConfig,
        coordinator: Coordinator | None,
        *,
        driver: Callable[[], Driver],
        sessions: Mapping[str, WorkerSession],
        sink: Callable[[], MembershipSink | None],
        wake: Callable[[], None],
    ) -> None:
        self._config = config
        self._coordinator = coordinator
        # The node's driver (``FailedPrecondition`` while it starts).
        self._driver = driver
        self._sessions = sessions
        # Pushes the view to one worker stream (the rpc layer's).
        self._sink = sink
        self._wake = wake
        # The view last pushed, to push only changes.
        self._pushed_view: Membership | None = None

    def route(self, job_id: int) -> str | None:
        """Where a call that changes the job must run: None here (this node
        owns its shard, or is the only node), else the owner's address.
        Raises ``NotOwner`` when no member is known to hold the shard (it is
        moving): the client retries."""
        coordinator = self._coordinator
        if coordinator is None or self._driver().owns(job_id):
            return None
        shard = shard_of(job_id)
        holder = coordinator.shard_owners().get(shard)
        if holder is not None and holder != self._config.node_id:
            for member in coordinator.members():
                if member.node_id == holder:
                    return member.address
        raise NotOwner(f"shard {shard} of job {job_id} is moving between nodes; retry")

    def owners_of(self, job_ids: Sequence[int]) -> dict[str, list[int]]:
        """The jobs held by other members, by their owner's address."""
        coordinator = self._coordinator
        if coordinator is None:
            return {}
        owners = coordinator.shard_owners()
        addresses = {m.node_id: m.address for m in coordinator.members()}
        out: dict[str, list[int]] = {}
        for job_id in job_ids:
            holder = owners.get(shard_of(job_id))
            if holder is not None and holder != self._config.node_id and holder in addresses:
                out.setdefault(addresses[holder], []).append(job_id)
        return out

    def jobs_changed(self, job_ids: Iterable[int]) -> None:
        """Another member stored or changed these jobs: read them now."""
        driver = self._driver()
        driver.reread(j for j in job_ids if driver.owns(j))
        self._wake()

    def members(self) -> list[Member]:
        """The cluster's live members (this node alone without a cluster)."""
        if self._coordinator is None:
            return [Member(node_id=self._config.node_id, address="")]
        return self._coordinator.members()

    def membership(self) -> Membership:
        """The cluster as this node sees it: what workers route runs by."""
        owners = self.shard_owners()
        version = 0 if self._coordinator is None else self._coordinator.view_version()
        return Membership(
            members=tuple(self.members()),
            shard_owners=tuple(owners.get(s, "") for s in range(SHARD_COUNT)),
            version=version,
        )

    def push(self) -> None:
        """Tell every worker stream when the members or shard owners changed:
        workers open streams to new members and re-home runs of gone ones."""
        sink = self._sink()
        if sink is None:
            return
        view = self.membership()
        if view == self._pushed_view:
            return
        self._pushed_view = view
        for session in list(self._sessions.values()):
            sink(session, view)

    def run_home(self, job_id: int) -> Member | None:
        """Where a worker reports a run of ``job_id``: None when this node
        holds its shard; else the member that does (this node itself while
        it is still loading a shard it just gained, so the worker comes
        back), or an empty member while the shard is between owners."""
        if self._driver().owns(job_id):
            return None
        coordinator = self._coordinator
        if coordinator is None:
            return None  # one node holds everything: nothing moves
        shard = shard_of(job_id)
        me = self._config.node_id
        if shard in coordinator.owned():
            return Member(node_id=me, address=coordinator.address)
        holder = coordinator.shard_owners().get(shard)
        for member in coordinator.members():
            if member.node_id == holder and holder != me:
                return member
        return Member(node_id="", address="")

    def shard_owners(self) -> dict[int, str]:
        """Shard -> the node id holding it, as last seen."""
        if self._coordinator is None:
            return dict.fromkeys(self._driver().shards(), self._config.node_id)
        return dict(self._coordinator.shard_owners())
