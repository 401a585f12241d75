"""The console's aggregates as a node answers them: jobs by state and runs
by time bucket and outcome over a window ending now, the feed of recent
runs across jobs, and a job's history at a glance, each read from the
store's indexes off the event loop (``wheel.store.base.OverviewStore``)."""

from __future__ import annotations

from dataclasses import dataclass

from wheel.engine.model import JobState, RunState
from wheel.node._changes import InThread
from wheel.node._values import Clock
from wheel.store.base import FeedRun, FireMark, OutcomeCount, RunStats, Store


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOverview:
    """Jobs by state, and runs ended since ``since_ms`` by bucket and
    outcome, as of ``now_ms``."""

    jobs: dict[JobState, int]
    runs: list[OutcomeCount]
    since_ms: int
    bucket_ms: int
    now_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class JobHistory:
    """A job's last fires, newest first, and its runs ended since
    ``since_ms``."""

    fires: list[FireMark]
    stats: RunStats
    since_ms: int


class Overview:
    """Reads the store's aggregates off the event loop."""

    def __init__(self, store: Store, clock: Clock, *, in_thread: InThread) -> None:
        self._store = store
        self._clock = clock
        self._in_thread = in_thread

    async def run_overview(
        self, *, tenant: str | None, window_ms: int, bucket_ms: int
    ) -> RunOverview:
        now = self._clock.now_ms()
        # The window starts on a bucket's edge: the first bucket is whole.
        since = (now - window_ms) // bucket_ms * bucket_ms
        store = self._store

        def read() -> tuple[dict[JobState, int], list[OutcomeCount]]:
            return (
                store.count_jobs_by_state(tenant),
                store.outcome_counts(since_ms=since, bucket_ms=bucket_ms, tenant=tenant),
            )

        jobs, runs = await self._in_thread(read)
        return RunOverview(jobs=jobs, runs=runs, since_ms=since, bucket_ms=bucket_ms, now_ms=now)

    async def recent_runs(
        self,
        *,
        tenant: str | None,
        outcome: RunState | None,
        handler: str | None,
        job_name: str | None,
        before_run_id: int | None,
        limit: int,
    ) -> list[FeedRun]:
        store = self._store
        return await self._in_thread(
            lambda: store.recent_runs(
                tenant=tenant,
                outcome=outcome,
                handler=handler,
                job_name=job_name,
                before_run_id=before_run_id,
                limit=limit,
            )
        )

    async def job_history(self, job_id: int, *, fires: int, window_ms: int) -> JobHistory:
        since = self._clock.now_ms() - window_ms
        store = self._store

        def read() -> tuple[list[FireMark], RunStats]:
            return store.recent_fires(job_id, fires), store.run_stats(job_id, since)

        marks, stats = await self._in_thread(read)
        return JobHistory(fires=marks, stats=stats, since_ms=since)
