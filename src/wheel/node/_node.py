"""The I/O shell of one node: drives the pure shard owner with a clock, the
record of truth and worker streams; its dispatch loop is ``_dispatch``'s.

Everything that touches the owner runs on the event loop thread, so the owner
needs no locks, and reaches it through the ``Driver`` alone. Store calls run
on one dedicated thread for dispatch and a small pool for API reads.

The node is composed of parts that own their state, each given what it uses:
the dispatch loop (``_dispatch``), the batches on their way and the store
thread's writer (``_batches``), the change feed (``_changes``), the
checkpoint and its log (``_checkpointing``), shards that move (``_moving``),
shard ownership in a cluster (``_cluster``), health, alerts and metrics
(``_ops``), the job API (``_jobs``, ``_updates``), tenancy (``_tenancy``) and
signing secrets (``_secrets``). ``Node`` builds them, starts the loop and
passes its API calls to them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from wheel.checkpoint.owner_state import OwnerState
from wheel.coord.base import Coordinator
from wheel.engine.driver import Driver
from wheel.engine.jobtable import Columns
from wheel.engine.model import SHARD_COUNT, AlertKind
from wheel.engine.owner import Outcome, Owner, ShardContents
from wheel.engine.profiles import Profile
from wheel.errors import FailedPrecondition
from wheel.metrics import LagMinute
from wheel.node._audit import Audit
from wheel.node._batches import Batches
from wheel.node._calendars import Calendars
from wheel.node._calls import NodeCalls
from wheel.node._changes import ChangeFeed
from wheel.node._checkpointing import Checkpointing
from wheel.node._cluster import ShardOwnership
from wheel.node._dispatch import Dispatch
from wheel.node._jobs import Jobs
from wheel.node._limits import Limits
from wheel.node._membership import ClusterView
from wheel.node._metrics import NodeMetrics
from wheel.node._moving import Moves
from wheel.node._ops import HealthListener, Ops
from wheel.node._overview import Overview
from wheel.node._reads import Reads
from wheel.node._secrets import Secrets
from wheel.node._secrets_key import SecretsKey
from wheel.node._tenancy import Tenancy
from wheel.node._traces import JobTraces
from wheel.node._updates import Updates
from wheel.node._values import (
    Clock,
    Health,
    Membership,
    MessageSink,
    MovedRun,
    NodeConfig,
    RaisedAlert,
    Wake,
    WorkerSession,
    read_store_clock,
    trim_heap,
)
from wheel.recovery import restore_owner
from wheel.store.base import Store

log = logging.getLogger("wheel.node")
# A host clock further than this off the store's is reported at start.
CLOCK_WARN_MS = 500
T = TypeVar("T")


class Node(NodeCalls):
    """One node owning shards (all 256 on a single node)."""

    def __init__(
        self,
        store: Store,
        config: NodeConfig | None = None,
        *,
        coordinator: Coordinator | None = None,
        clock: Clock | None = None,
        secrets_key: SecretsKey | None = None,
    ) -> None:
        """A single node owning every shard, or with ``coordinator`` a member
        of a cluster owning the shards the coordinator gives it; ``clock``:
        the host's clock as the node reads it (default: the host's own);
        ``secrets_key``: what seals the signing secrets in the store (None: a
        key of this process alone, for throwaway nodes: what it seals no
        other node, and no later process, can open)."""
        self.store = store
        self.config = config or NodeConfig()
        self.coordinator = coordinator
        self._ownership: ShardOwnership | None = None
        # Awaited by ``stop`` (the rpc layer's channels to other members).
        self._closers: list[Callable[[], Awaitable[None]]] = []
        self._left = False
        self.clock = clock or Clock()
        # The owner's loop and job API without I/O; set by ``start``.
        self._driver: Driver | None = None
        self.sessions: dict[str, WorkerSession] = {}
        self.message_sink: MessageSink | None = None
        # Push the cluster's view, and where moved runs report now, to a
        # worker stream (set by the rpc layer).
        self.membership_sink: Callable[[WorkerSession, Membership], None] | None = None
        self.moved_sink: Callable[[WorkerSession, list[MovedRun]], None] | None = None
        # Tells the owners of other members' shards that these jobs are new
        # or changed (set by the rpc layer; the outbox relay's jobs go
        # through it).
        self.job_changes_sink: Callable[[list[int]], None] | None = None
        self._wake = Wake()
        self._store_thread = ThreadPoolExecutor(1, thread_name_prefix="wheel-store")
        self._api_threads = ThreadPoolExecutor(4, thread_name_prefix="wheel-api")
        self._stopping = False
        self._changes = ChangeFeed(
            self.config,
            store,
            self.clock,
            in_thread=self._api,
            failed=lambda: self.metrics.store_errors.labels("changes").inc(),
        )
        self.ready = asyncio.Event()
        # Store batches on their way (durable triggers wait for one).
        self._batches = Batches(self.config, self._store_thread, wake=self._wake.set)
        jobs = Jobs(
            self.config,
            store,
            self.clock,
            in_thread=self._api,
            driver=self._the_driver,
            changes=self._changes,
            batches=self._batches,
            wake=self.wake,
        )
        updates = Updates(
            self.config,
            store,
            self.clock,
            in_thread=self._api,
            driver=self._the_driver,
            changes=self._changes,
            jobs=jobs,
            wake=self.wake,
        )
        self._checkpointing = Checkpointing(
            self.config, store, watermark=lambda: self._changes.watermark
        )
        self._moves = Moves(
            config=self.config,
            clock=self.clock,
            store=store,
            store_thread=self._store_thread,
            coordinator=coordinator,
            sessions=self.sessions,
            sink=lambda: self.moved_sink,
            left=lambda: self._left,
            hand_over=self.hand_over,
            wake=self.wake,
        )
        # Set when the dispatch loop ends; a node whose loop died must exit
        # (and be restarted) rather than keep serving without dispatching.
        self.stopped = asyncio.Event()
        # Health, alerts, metrics and retention (wheel.node._ops).
        self._ops = Ops(
            self.config,
            store,
            self.clock,
            coordinator,
            ready=self.ready,
            driver=lambda: self._driver,
            stopping=lambda: self._stopping,
            source=self,
        )
        self.metrics: NodeMetrics = self._ops.metrics
        self.lag_histogram = self._ops.lag_histogram
        self.lag_ring = self._ops.lag_ring
        self.alerts = self._ops.alerts
        tenancy = Tenancy(
            store, self.clock, in_thread=self._api, driver=lambda: self._driver, wake=self.wake
        )
        secrets = Secrets(
            store, self.clock, secrets_key or SecretsKey.generate(), in_thread=self._api
        )
        calendars = Calendars(
            store, self.clock, in_thread=self._api, driver=lambda: self._driver, wake=self.wake
        )
        limits = Limits(store, self.clock, in_thread=self._api, driver=lambda: self._driver)
        reads = Reads(
            self.config,
            store,
            self.clock,
            in_thread=self._api,
            driver=lambda: self._driver,
            moves=self._moves,
            alerts_firing=self.alerts_firing,
        )
        view = ClusterView(
            self.config,
            coordinator,
            driver=self._the_driver,
            sessions=self.sessions,
            sink=lambda: self.membership_sink,
            wake=self.wake,
        )
        NodeCalls.__init__(
            self,
            jobs=jobs,
            updates=updates,
            tenancy=tenancy,
            secrets=secrets,
            calendars=calendars,
            limits=limits,
            reads=reads,
            view=view,
            audit=Audit(store, self.clock, in_thread=self._api),
            traces=JobTraces(store, self.clock, in_thread=self._api),
            overview=Overview(store, self.clock, in_thread=self._api),
        )
        self._dispatch = Dispatch(
            config=self.config,
            store=store,
            clock=self.clock,
            coordinator=coordinator,
            driver=self._the_driver,
            wake=self._wake,
            batches=self._batches,
            checkpointing=self._checkpointing,
            changes=self._changes,
            moves=self._moves,
            ops=self._ops,
            view=view,
            reads=reads,
            sessions=self.sessions,
            sink=lambda: self.message_sink,
            hand_over=self.hand_over,
            stopping=lambda: self._stopping,
            stopped=self.stopped,
        )

    # -- life cycle -------------------------------------------------------------

    async def start(self) -> None:
        await self._api(self.store.migrate)
        await self._limits.repair()
        await self._anchor_clock()
        if self.coordinator is not None:
            await self._start_in_cluster(self.coordinator)
            return
        shards = list(range(SHARD_COUNT))
        epochs = await self._api(self.store.acquire_epochs, shards, self.config.node_id)
        checkpointing = self._checkpointing
        if self.config.checkpoint_dir is not None:
            checkpointing.use(await self._api(checkpointing.open_file))
        restored = await self._api(
            functools.partial(
                restore_owner,
                self.store,
                checkpointing.checkpoint,
                epochs=epochs,
                config=self.config.owner,
                now_ms=self.clock.now_ms(),
            )
        )
        driver = self._driver = Driver(restored.owner, restored.actions)
        await self._calendars.refresh()  # before a fire of a skipped day comes due
        self._moves.began_dispatching(driver.shards())
        trim_heap()
        self._changes.watermark = restored.watermark
        if restored.source == "store":
            checkpointing.start_log(records=restored.log_records)
            if checkpointing.enabled():
                # A full snapshot follows instead of a huge log batch.
                driver.take_dirty()
                checkpointing.start_snapshot(driver)
        else:
            checkpointing.start_log(records=restored.log_records, covered=epochs)
        log.info(
            "node %s owns %d shards: %d jobs, %d runs in flight (restored from the %s in %.2fs)",
            self.config.node_id,
            len(epochs),
            driver.job_count(),
            driver.run_count(),
            restored.source,
            restored.seconds,
        )
        self._dispatch.start()
        self.ready.set()
        self._ops.start()
        self._tenancy.start()
        self._secrets.start()
        self._calendars.start()
        self._limits.start()

    async def _anchor_clock(self) -> None:
        """Read the store's clock and run on it: fires come due by the record
        of truth's time, not by this host's, which may be off (a node started
        on a wrong clock would otherwise fire early or late by that much)."""
        before, after, store_ms = await self._api(read_store_clock, self.store.clock_ms)
        mid = (before + after) // 2
        host_ms = self.clock.wall_ms() - (time.monotonic_ns() - mid) // 1_000_000
        self.clock.anchor_read(before, after, store_ms)
        off = host_ms - store_ms
        if abs(off) > CLOCK_WARN_MS:
            log.warning("this host's clock is %+d ms off the store's; running on the store's", off)

    async def _start_in_cluster(self, coordinator: Coordinator) -> None:
        """Join: an owner with no shards, its loop running, then the
        coordinator's first shards fenced, loaded and added as they come: a
        shard this node held before its restart from its checkpoint and the
        store's changes since, the others from the store."""
        checkpointing = self._checkpointing
        if self.config.checkpoint_dir is not None:
            checkpointing.use(await self._api(checkpointing.open_file))
            recovered = await self._api(checkpointing.recover_file)
            checkpointing.keep_recovered(recovered)
            if recovered is not None:
                log.info(
                    "checkpoint holds %d jobs of %d shards to gain back",
                    recovered.job_count(),
                    len(recovered.as_of),
                )
        checkpointing.start_log()
        self._driver = Driver(Owner(now_ms=self.clock.now_ms(), config=self.config.owner))
        await self._calendars.refresh()  # before the first shard is gained
        self._changes.watermark = (await self._api(self.store.load_shards, [])).watermark
        self._ownership = ShardOwnership(self, coordinator)
        self._dispatch.start()
        await coordinator.start()
        log.info(
            "node %s joined the cluster: %d shards held, %d being loaded",
            self.config.node_id,
            len(coordinator.owned()),
            len(self._ownership.gaining()),
        )
        self.ready.set()
        self._ops.start()
        self._tenancy.start()
        self._secrets.start()
        self._calendars.start()
        self._limits.start()

    # -- shards gained and lost (see wheel.node._cluster) -------------------------

    def on_stop(self, close: Callable[[], Awaitable[None]]) -> None:
        """Await ``close()`` when the node stops."""
        self._closers.append(close)

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def in_thread(self, fn: Callable[..., T], *args: object) -> T:
        """Run a blocking store call off the event loop."""
        return await self._api(fn, *args)

    def held_shards(self) -> Collection[int]:
        """The shards the owner holds now (none while the node starts)."""
        return () if self._driver is None else self._driver.shards().keys()

    def hand_over(self, shards: Collection[int]) -> None:
        """Stop dispatching ``shards`` at once and forget them; their runs go
        on and their next owner adopts them from the store."""
        driver = self._the_driver()
        epochs = driver.shards()
        held = [s for s in shards if s in epochs]
        if not held:
            return
        self._moves.ended_dispatching({s: epochs[s] for s in held})
        handed = driver.hand_over(held)
        self._checkpointing.handed_over(held)
        log.info("handed over %d shards with %d runs in flight", len(held), len(handed))
        self._view.push()
        self.wake()

    def take_on(
        self,
        epochs: Mapping[int, int],
        contents: ShardContents,
        watermark: int,
        *,
        from_checkpoint: bool = False,
        how: str = "",
    ) -> None:
        """Add shards fenced and loaded as of ``watermark``: the change feed
        goes back there, so changes made through other nodes since are read.
        ``from_checkpoint``: loaded from this node's checkpoint and the store's
        changes since, which the log gets as they apply."""
        driver = self._the_driver()
        held = driver.shards()
        stale = {s: held[s] for s in epochs if s in held}
        if stale:
            # Held under an older epoch still (its loss not heard yet): the
            # new hold replaces it whole.
            self._moves.ended_dispatching(stale)
            driver.hand_over(stale)
        driver.add_shards(epochs, contents, self.clock.now_ms())
        self._moves.began_dispatching(epochs)
        self._checkpointing.gained(epochs, covered=from_checkpoint)
        self._changes.loaded_as_of(watermark)
        log.info(
            "took on %d shards from %s: %d jobs, %d runs in flight",
            len(epochs),
            how or ("its checkpoint" if from_checkpoint else "the store"),
            len(contents.jobs)
            + sum(len(rows) for rows in contents.packed.values())
            + sum(len(table) for table in contents.tables.values()),
            len(contents.inflight),
        )
        self._view.push()
        self.wake()
        # Off the loop: with a large heap it takes a good part of a second,
        # and the shards just taken on are to dispatch now.
        asyncio.get_running_loop().run_in_executor(None, trim_heap)

    async def leave(self) -> None:
        """In a cluster, before anything else of a stop: let the members
        taking its shards load them, hand every shard over, release them in
        etcd so the other members take them at once (not a TTL later), and
        end the worker streams; the workers report
        their runs to the new owners. A single node has nothing to hand
        over: its stop ends the streams after the last batches' answers."""
        if self._left or self.coordinator is None:
            return
        self._left = True
        # The members taking the shards load them first, while this node
        # still serves them: the switch below then costs them a fence and
        # the changes since.
        await self.coordinator.hand_off()
        await self.hand_over_planned(self.held_shards())
        await self.coordinator.stop()
        for session in list(self.sessions.values()):
            session.closed = True
            session.outbox.put_nowait(None)

    async def stop(self) -> None:
        """Stop dispatching (after ``leave``, if it was not called)."""
        await self.leave()
        self._stopping = True
        await self._tenancy.stop()
        await self._secrets.stop()
        await self._calendars.stop()
        await self._limits.stop()
        await self._ops.stop()
        self._wake.set()
        await self._dispatch.join()
        for close in self._closers:
            await close()
        for session in list(self.sessions.values()):
            session.closed = True
            session.outbox.put_nowait(None)
        await self._checkpointing.stop_snapshot()
        self._store_thread.shutdown(wait=True)
        self._api_threads.shutdown(wait=True)
        self._checkpointing.close()

    # -- the checkpoint (wheel.node._checkpointing) -------------------------------

    def checkpoint_log_records(self) -> int | None:
        """Job records in the checkpoint's log since its last snapshot (None:
        no checkpoint)."""
        return self._checkpointing.log_records()

    def checkpointed(self, shards: Collection[int]) -> dict[int, int]:
        """Of ``shards``, those the node's checkpoint can give back, each with
        the watermark its rows are current up to."""
        return self._checkpointing.checkpointed(shards)

    def recovered(self) -> OwnerState | None:
        return self._checkpointing.recovered()

    def release_recovered(self) -> None:
        self._checkpointing.release_recovered()

    def loading_rest(self, shards: Collection[int]) -> None:
        """``shards`` were taken on due first; their rest is on its way."""
        self._checkpointing.loading_rest(shards)

    def rest_loaded(self, shards: Collection[int]) -> None:
        """The rest of ``shards`` is in (or will not come)."""
        self._checkpointing.rest_loaded(shards)

    # -- health, alerts, metrics, retention (wheel.node._ops) --------------------

    def health(self) -> Health:
        """The node's health now (see ``wheel.node._ops``)."""
        return self._ops.health()

    def on_health(self, listener: HealthListener) -> None:
        """Await ``listener(health)`` whenever the node's health changes."""
        self._ops.on_health(listener)

    def list_alerts(self, since_ms: int = 0, limit: int = 0) -> list[RaisedAlert]:
        return self._ops.list_alerts(since_ms, limit)

    def alerts_firing(self) -> Mapping[AlertKind, int]:
        """Each condition alert's kind -> how many of it hold now (0: clear)."""
        return self._ops.alerts_firing()

    def lag_history(self) -> list[LagMinute]:
        """The dispatch lag minute by minute over the last hour, oldest first."""
        return self._ops.lag_history()

    async def purge_history(self, retain_ms: int) -> int:
        return await self._ops.purge_history(retain_ms)

    def loop_stall_max_s(self) -> float:
        return self._ops.loop_stall_max_s()

    # -- shards that move (wheel.node._moving) ------------------------------------

    def add_rest(
        self, shards: Collection[int], packed: Mapping[int, Columns], profiles: Sequence[Profile]
    ) -> int:
        """The rest of ``shards`` taken on due first (those still held),
        added to the owner; how many jobs."""
        return self._moves.add_rest(self._the_driver(), shards, packed, profiles)

    async def hand_over_planned(self, shards: Collection[int]) -> None:
        """Hand ``shards`` over, the runs claimed and never sent marked for
        their next owner to send at once (see ``Moves.hand_over_planned``)."""
        if self._driver is not None:
            await self._moves.hand_over_planned(self._driver, shards)

    def _the_driver(self) -> Driver:
        if self._driver is None:
            raise FailedPrecondition("node is starting")
        return self._driver

    async def _api(self, fn: Callable[..., T], *args: object) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._api_threads, fn, *args)

    def wake(self) -> None:
        self._wake.set()

    def permit_freed(self, tenant: str, key: str) -> None:
        """A permit of the key came back in the store (``wheel.node._permits``)."""
        if self._driver is not None and self._driver.permit_freed(tenant, key):
            self.wake()

    # -- worker streams ---------------------------------------------------------

    def attach_worker(
        self,
        worker_id: str,
        capacity: int,
        pools: Sequence[str],
        *,
        handlers: Sequence[str] = (),
    ) -> WorkerSession:
        old = self.sessions.pop(worker_id, None)
        if old is not None:
            old.closed = True
            old.outbox.put_nowait(None)
        session = WorkerSession(worker_id)
        self.sessions[worker_id] = session
        self._the_driver().worker_hello(
            worker_id, capacity, pools, self.clock.now_ms(), handlers=handlers
        )
        self.wake()
        return session

    def detach_worker(self, session: WorkerSession) -> None:
        session.closed = True
        if self.sessions.get(session.worker_id) is session:
            del self.sessions[session.worker_id]
            self._the_driver().worker_disconnect(session.worker_id)
            self.wake()

    def worker_ack(self, worker_id: str, refs: Sequence[tuple[int, int]]) -> None:
        self._the_driver().worker_ack(worker_id, refs, self.clock.now_ms())
        self.wake()

    def worker_heartbeat(self, worker_id: str, refs: Sequence[tuple[int, int]]) -> None:
        self._the_driver().worker_heartbeat(worker_id, refs, self.clock.now_ms())
        self.wake()

    def worker_complete(
        self,
        worker_id: str,
        completions: Sequence[tuple[int, int, Outcome, str]],
        ran_ms: Mapping[int, int] | None = None,
        results: Mapping[int, str] | None = None,
        retry_after_ms: Mapping[int, int] | None = None,
    ) -> None:
        """Completions from a worker's stream; ``ran_ms``, ``results`` (a JSON
        object each) and ``retry_after_ms`` by run id, only for runs that
        have one."""
        self._the_driver().worker_complete(
            worker_id, completions, self.clock.now_ms(), ran_ms, results, retry_after_ms
        )
        self.wake()

    def worker_credit(self, worker_id: str, add: int, seq: int = 0) -> None:
        self._the_driver().worker_credit(worker_id, add, self.clock.now_ms(), seq=seq)
        self.wake()

    def worker_capacity(self, worker_id: str) -> int | None:
        return self._the_driver().worker_capacity(worker_id)

    def worker_drain(self, worker_id: str) -> None:
        self._the_driver().worker_drain(worker_id)
