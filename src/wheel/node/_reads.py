"""What a node serves to read: jobs, runs and missed fires from the store (off
the event loop), and its own status from the owner (on it). The rpc layer
reads nothing else of the node."""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterable, Mapping

from wheel.engine.driver import Driver
from wheel.engine.model import AlertKind, JobState
from wheel.engine.records import ExecutionRecord, JobRecord, MissedFire
from wheel.node._changes import InThread
from wheel.node._moving import Moves
from wheel.node._values import Clock, InFlightRun, NodeConfig, NodeStatus
from wheel.store.base import Store


class Reads:
    """What a node reads for its callers: jobs, runs and history from the
    store, and its own status from the owner."""

    def __init__(
        self,
        config: NodeConfig,
        store: Store,
        clock: Clock,
        *,
        in_thread: InThread,
        driver: Callable[[], Driver | None],
        moves: Moves,
        alerts_firing: Callable[[], Mapping[AlertKind, int]],
    ) -> None:
        self._config = config
        self._store = store
        self._clock = clock
        self._in_thread = in_thread
        # The node's driver once it started.
        self._driver = driver
        # When each shard began and stopped being dispatched.
        self._moves = moves
        self._alerts_firing = alerts_firing
        # The dispatch lags of the last hand-outs (ms), for the percentiles.
        self._lags: deque[int] = deque(maxlen=10_000)

    def lagged(self, lags: Iterable[int]) -> None:
        """Runs went out this late (ms)."""
        self._lags.extend(lags)

    def now_ms(self) -> int:
        return self._clock.now_ms()

    async def list_jobs(
        self,
        *,
        tenant: str | None,
        state: JobState | None,
        after_job_id: int,
        limit: int,
        name_prefix: str = "",
        after_name: str | None = None,
    ) -> list[JobRecord]:
        return await self._in_thread(
            functools.partial(
                self._store.list_jobs,
                tenant=tenant,
                state=state,
                after_job_id=after_job_id,
                limit=limit,
                name_prefix=name_prefix,
                after_name=after_name,
            )
        )

    async def get_run(self, run_id: int) -> ExecutionRecord:
        """One run, its result included (raises ``NotFound``)."""
        return await self._in_thread(self._store.get_run, run_id)

    async def list_runs(
        self, job_id: int, *, before_run_id: int | None = None, limit: int
    ) -> list[ExecutionRecord]:
        return await self._in_thread(
            functools.partial(
                self._store.list_runs, job_id, before_run_id=before_run_id, limit=limit
            )
        )

    async def list_history(
        self,
        job_id: int,
        *,
        before_run_id: int | None,
        before_scheduled_for: int | None,
        limit: int,
        runs: bool = True,
        missed: bool = True,
    ) -> tuple[list[ExecutionRecord], list[MissedFire]]:
        """A page of a job's executions and of its missed fires, each newest
        first (before the cursors given; None: from the newest), read in one
        trip off the event loop. ``runs``/``missed`` False: that part is not
        read (its stream was read to its end)."""

        def read() -> tuple[list[ExecutionRecord], list[MissedFire]]:
            store = self._store
            return (
                store.list_runs(job_id, before_run_id=before_run_id, limit=limit) if runs else [],
                store.list_missed(job_id, before_scheduled_for=before_scheduled_for, limit=limit)
                if missed
                else [],
            )

        return await self._in_thread(read)

    def status(self, *, percentiles: bool = True) -> NodeStatus:
        """The node's view of itself: shards, jobs, runs, workers, backlog,
        lag and totals (the lag percentiles, a sort of the last 10,000
        samples, only with ``percentiles``: metrics have the histogram)."""
        p50, p99 = self.lag_percentiles() if percentiles else (0.0, 0.0)
        driver = self._driver()
        if driver is None:
            return NodeStatus(node_id=self._config.node_id, lag_p50_ms=p50, lag_p99_ms=p99)
        census = driver.census()
        workers = census.workers
        return NodeStatus(
            node_id=self._config.node_id,
            lag_p50_ms=p50,
            lag_p99_ms=p99,
            shards=census.shards,
            jobs=census.jobs,
            jobs_awake=census.jobs_awake,
            pending_timers=census.pending_timers,
            in_flight=census.in_flight,
            backlog=census.backlog,
            overdue_backlog=census.overdue_backlog,
            workers=workers,
            worker_capacity=sum(w.capacity for w in workers),
            stats=census.stats,
            reaper_paused=census.reaper_paused,
            unserved=census.unserved,
            alerts_firing=tuple(sorted(k.value for k, n in self._alerts_firing().items() if n)),
            dispatching_since=self._moves.dispatching_since(),
            released=self._moves.released(),
        )

    def in_flight(self, limit: int) -> tuple[list[InFlightRun], int]:
        """Up to ``limit`` of the runs the owner holds, by run id, and how
        many it holds in all."""
        driver = self._driver()
        if driver is None:
            return [], 0
        runs, total = driver.runs_in_flight(limit)
        return [
            InFlightRun(
                run_id=run.run_id,
                job_id=run.job_id,
                scheduled_for=run.scheduled_for,
                attempt=run.attempt,
                fence=run.fence,
                worker_id=run.worker_id or "",
                phase=run.phase,
            )
            for run in runs
        ], total

    def lag_percentiles(self) -> tuple[float, float]:
        if not self._lags:
            return 0.0, 0.0
        lags = sorted(self._lags)
        return float(lags[len(lags) // 2]), float(lags[min(len(lags) - 1, len(lags) * 99 // 100)])
