"""A node's side of shards that move (``wheel.node._cluster``): the rest of
a gain loaded due first, and a planned hand-over that passes the runs
claimed and never sent to the next owner."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from wheel.coord._moves import rendezvous_owner
from wheel.coord.base import Coordinator, Member
from wheel.engine.jobtable import Columns
from wheel.engine.model import shard_of
from wheel.engine.profiles import Profile
from wheel.errors import StoreError
from wheel.node._values import Clock, MovedRun, NodeConfig, WorkerSession
from wheel.store.base import Store

if TYPE_CHECKING:
    from wheel.engine.driver import Driver

log = logging.getLogger("wheel.node")

# How many of the shards a node stopped dispatching it remembers (status).
RELEASES_KEPT = 1_024


class NodeMoving:
    """Shards that move, of ``wheel.node.Node``."""

    store: Store
    _driver: Driver | None
    _store_thread: ThreadPoolExecutor

    clock: Clock
    config: NodeConfig
    coordinator: Coordinator | None
    sessions: dict[str, WorkerSession]
    _left: bool
    # Tells one worker stream where runs report now (set by the rpc layer).
    moved_sink: Callable[[WorkerSession, list[MovedRun]], None] | None

    if TYPE_CHECKING:

        def _the_driver(self) -> Driver: ...

        def wake(self) -> None: ...

        def hand_over(self, shards: Collection[int]) -> None: ...

    def _init_moving(self) -> None:
        # When this node began dispatching each shard it holds, and the
        # shards it stopped dispatching lately: (shard, epoch, at ms), both
        # on the cluster's clock, so that a move's gap between its two
        # owners reads off their statuses exactly.
        self._since: dict[int, int] = {}
        self._released: deque[tuple[int, int, int]] = deque(maxlen=RELEASES_KEPT)

    def _began_dispatching(self, shards: Collection[int]) -> None:
        """``shards`` are dispatched from now on."""
        now = self.clock.now_ms()
        for shard in shards:
            self._since[shard] = now

    def _ended_dispatching(self, epochs: Mapping[int, int]) -> None:
        """The shards of ``epochs`` (held under those) are dispatched no more."""
        now = self.clock.now_ms()
        for shard, epoch in sorted(epochs.items()):
            self._since.pop(shard, None)
            self._released.append((shard, epoch, now))

    def add_rest(
        self, shards: Collection[int], packed: Mapping[int, Columns], profiles: Sequence[Profile]
    ) -> int:
        """The rest of ``shards`` taken on due first (those still held),
        added to the owner; how many jobs. The caller gives the heap back
        (``trim_heap``) once all of it is in."""
        driver = self._the_driver()
        held = set(shards) & set(driver.shards())
        added = driver.add_rest({s: c for s, c in packed.items() if s in held}, profiles)
        self.wake()
        return added

    async def hand_over_planned(self, shards: Collection[int]) -> None:
        """A planned hand-over (this node leaving, or a member joining that
        takes them): ``hand_over``, then the runs of ``shards`` claimed and
        never sent are marked so that their next owner sends them at once.
        On the store's thread, after the batches on their way there: claims
        they commit are marked too."""
        if self._driver is None:
            return
        held = [s for s in shards if s in self._driver.shards()]
        if not held:
            return
        sent = self._driver.sent_runs(held)
        at_workers = self._driver.runs_at_workers(held)
        self.hand_over(held)
        self._tell_moved(at_workers)
        await self._release_unsent(held, sent)

    def _tell_moved(self, runs: Sequence[tuple[str, int, int, int]]) -> None:
        """Tell each worker where the runs it holds of shards just handed
        over report from now on (``Results.moved``, naming the member the
        assignment gives each shard). Without it a worker learnt it only
        from its next message about the run (a heartbeat, up to a third of a
        lease later) or from a newer membership view; a completion this node
        dropped unanswered waited for that view: meanwhile the run's grace
        lease lapsed at the new owner, which knew no worker for it, and the
        fire went out again 2 s late (a join in a loaded suite)."""
        sink = self.moved_sink
        coordinator = self.coordinator
        if sink is None or coordinator is None or not runs:
            return
        me = self.config.node_id
        members = coordinator.members()
        ids = [m.node_id for m in members if not (self._left and m.node_id == me)]
        where = {m.node_id: m for m in members}
        by_worker: dict[str, list[MovedRun]] = {}
        for worker_id, run_id, fence, job_id in runs:
            owner = rendezvous_owner(shard_of(job_id), ids) or ""
            member = where.get(owner) if owner != me else None
            by_worker.setdefault(worker_id, []).append(
                MovedRun(run_id, fence, job_id, member or Member(node_id="", address=""))
            )
        for worker_id, moved in by_worker.items():
            session = self.sessions.get(worker_id)
            if session is not None and not session.closed:
                sink(session, moved)

    async def _release_unsent(self, shards: Collection[int], sent: Collection[int]) -> None:
        loop = asyncio.get_running_loop()
        release = functools.partial(self.store.release_unsent, shards, sent)
        started = time.perf_counter()
        try:
            marked = await loop.run_in_executor(self._store_thread, release)
        except StoreError as exc:
            log.warning(
                "runs not sent yet were not handed over (their grace leases lapse): %s", exc
            )
            return
        log.info(
            "handed over %d runs not sent to a worker yet in %.3fs (behind the batches before)",
            marked,
            time.perf_counter() - started,
        )
