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
from concurrent.futures import Executor

from wheel.coord._moves import rendezvous_owner
from wheel.coord.base import Coordinator, Member
from wheel.engine.driver import Driver
from wheel.engine.jobtable import Columns
from wheel.engine.model import shard_of
from wheel.engine.profiles import Profile
from wheel.errors import StoreError
from wheel.node._values import Clock, MovedRun, NodeConfig, WorkerSession
from wheel.store.base import Store

log = logging.getLogger("wheel.node")

# How many of the shards a node stopped dispatching it remembers (status).
RELEASES_KEPT = 1_024


MovedSink = Callable[[WorkerSession, list[MovedRun]], None]


class Moves:
    """Shards that move, of a node: when it began and stopped dispatching
    each, the rest of a gain loaded due first, and planned hand-overs."""

    def __init__(
        self,
        *,
        config: NodeConfig,
        clock: Clock,
        store: Store,
        store_thread: Executor,
        coordinator: Coordinator | None,
        sessions: Mapping[str, WorkerSession],
        sink: Callable[[], MovedSink | None],
        left: Callable[[], bool],
        hand_over: Callable[[Collection[int]], None],
        wake: Callable[[], None],
    ) -> None:
        self._config = config
        self._clock = clock
        self._store = store
        # Batches go there: a hand-over's store write goes behind them.
        self._store_thread = store_thread
        self._coordinator = coordinator
        self._sessions = sessions
        # Tells one worker stream where runs report now (the rpc layer's).
        self._sink = sink
        # Whether the node is leaving its cluster.
        self._left = left
        self._hand_over = hand_over
        self._wake = wake
        # When this node began dispatching each shard it holds, and the
        # shards it stopped dispatching lately: (shard, epoch, at ms), both
        # on the cluster's clock, so that a move's gap between its two
        # owners reads off their statuses exactly.
        self._since: dict[int, int] = {}
        self._released: deque[tuple[int, int, int]] = deque(maxlen=RELEASES_KEPT)

    def began_dispatching(self, shards: Collection[int]) -> None:
        """``shards`` are dispatched from now on."""
        now = self._clock.now_ms()
        for shard in shards:
            self._since[shard] = now

    def ended_dispatching(self, epochs: Mapping[int, int]) -> None:
        """The shards of ``epochs`` (held under those) are dispatched no more."""
        now = self._clock.now_ms()
        for shard, epoch in sorted(epochs.items()):
            self._since.pop(shard, None)
            self._released.append((shard, epoch, now))

    def dispatching_since(self) -> dict[int, int]:
        """Shard -> when this node began dispatching it (cluster clock ms)."""
        return dict(self._since)

    def released(self) -> tuple[tuple[int, int, int], ...]:
        """The shards it stopped dispatching lately: (shard, epoch, at ms)."""
        return tuple(self._released)

    def add_rest(
        self,
        driver: Driver,
        shards: Collection[int],
        packed: Mapping[int, Columns],
        profiles: Sequence[Profile],
    ) -> int:
        """The rest of ``shards`` taken on due first (those still held),
        added to the owner; how many jobs. The caller gives the heap back
        (``trim_heap``) once all of it is in."""
        held = set(shards) & set(driver.shards())
        added = driver.add_rest({s: c for s, c in packed.items() if s in held}, profiles)
        self._wake()
        return added

    async def hand_over_planned(self, driver: Driver, shards: Collection[int]) -> None:
        """A planned hand-over (this node leaving, or a member joining that
        takes them): ``hand_over``, then the runs of ``shards`` claimed and
        never sent are marked so that their next owner sends them at once.
        On the store's thread, after the batches on their way there: claims
        they commit are marked too."""
        held = [s for s in shards if s in driver.shards()]
        if not held:
            return
        sent = driver.sent_runs(held)
        at_workers = driver.runs_at_workers(held)
        self._hand_over(held)
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
        sink = self._sink()
        coordinator = self._coordinator
        if sink is None or coordinator is None or not runs:
            return
        me = self._config.node_id
        members = coordinator.members()
        ids = [m.node_id for m in members if not (self._left() and m.node_id == me)]
        where = {m.node_id: m for m in members}
        by_worker: dict[str, list[MovedRun]] = {}
        for worker_id, run_id, fence, job_id in runs:
            owner = rendezvous_owner(shard_of(job_id), ids) or ""
            member = where.get(owner) if owner != me else None
            by_worker.setdefault(worker_id, []).append(
                MovedRun(run_id, fence, job_id, member or Member(node_id="", address=""))
            )
        for worker_id, moved in by_worker.items():
            session = self._sessions.get(worker_id)
            if session is not None and not session.closed:
                sink(session, moved)

    async def _release_unsent(self, shards: Collection[int], sent: Collection[int]) -> None:
        loop = asyncio.get_running_loop()
        release = functools.partial(self._store.release_unsent, shards, sent)
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
