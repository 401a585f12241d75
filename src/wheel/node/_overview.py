"""The console's aggregates as a node answers them: jobs by state and runs
by time bucket and outcome over a window ending now, the feed of recent
runs across jobs, and a job's history at a glance, each read from the
store's indexes off the event loop (``wheel.store.base.OverviewStore``).

Buckets that closed are kept (``SettledBuckets``): a run's end is the
owner's clock when it ended, written within a batch's time, so a bucket
that ended ``SETTLE_MS`` ago gains no run and its counts are read once. An
overview left open refreshes every few seconds; each refresh then reads
the open buckets only, not the day again. Kept counts are read again after
``KEEP_MS`` at most, which bounds what a write delayed past ``SETTLE_MS``
(the store unreachable that long) or a retention pass could leave out of
date."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from wheel.engine.model import JobState, RunState
from wheel.node._changes import InThread
from wheel.node._values import Clock
from wheel.store.base import FeedPage, FireMark, OutcomeCount, RunStats, Store


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


# A bucket this long over is closed: no run ends in it any more.
SETTLE_MS = 120_000
# Closed buckets' counts are read again after this long at most.
KEEP_MS = 600_000
# Windows kept (by tenant and bucket width), the least recently used dropped.
WINDOWS_KEPT = 64


@dataclass(slots=True)
class _Kept:
    """The counts of the closed buckets of one window, from ``start`` up to
    ``through`` (exclusive), read at ``read_at``."""

    start: int
    through: int
    read_at: int
    counts: list[OutcomeCount] = field(default_factory=list)


class SettledBuckets:
    """Counts of closed buckets by (tenant, width): see the module."""

    def __init__(self) -> None:
        self._kept: OrderedDict[tuple[str | None, int], _Kept] = OrderedDict()

    def known(self, key: tuple[str | None, int], since: int, now: int) -> _Kept | None:
        """What is kept of the window from ``since``: None when nothing is,
        or too little, or it is too old."""
        kept = self._kept.get(key)
        if kept is None or kept.start > since or now - kept.read_at > KEEP_MS:
            return None
        self._kept.move_to_end(key)
        return kept

    def keep(
        self, key: tuple[str | None, int], kept: _Kept | None, fresh: list[OutcomeCount],
        *, since: int, read_from: int, now: int, width: int,
    ) -> list[OutcomeCount]:  # fmt: skip
        """The window's counts (kept ones, then ``fresh`` read from
        ``read_from``), keeping those of the buckets closed by now."""
        closed = (now - SETTLE_MS) // width * width  # buckets before it are closed
        old = [] if kept is None else [c for c in kept.counts if c.bucket_ms >= since]
        every = old + fresh
        if kept is None or closed > kept.through:
            read_at = now if kept is None else kept.read_at
            self._kept[key] = _Kept(
                start=since,
                through=max(closed, read_from),
                read_at=read_at,
                counts=[c for c in every if c.bucket_ms < closed],
            )
            self._kept.move_to_end(key)
            while len(self._kept) > WINDOWS_KEPT:
                self._kept.popitem(last=False)
        return every


class Overview:
    """Reads the store's aggregates off the event loop."""

    def __init__(self, store: Store, clock: Clock, *, in_thread: InThread) -> None:
        self._store = store
        self._clock = clock
        self._in_thread = in_thread
        self._settled = SettledBuckets()

    async def run_overview(
        self, *, tenant: str | None, window_ms: int, bucket_ms: int
    ) -> RunOverview:
        now = self._clock.now_ms()
        # The window starts on a bucket's edge: the first bucket is whole.
        since = (now - window_ms) // bucket_ms * bucket_ms
        key = (tenant, bucket_ms)
        kept = self._settled.known(key, since, now)
        read_from = since if kept is None else max(since, kept.through)
        store = self._store

        def read() -> tuple[dict[JobState, int], list[OutcomeCount]]:
            return (
                store.count_jobs_by_state(tenant),
                store.outcome_counts(since_ms=read_from, bucket_ms=bucket_ms, tenant=tenant),
            )

        jobs, fresh = await self._in_thread(read)
        runs = self._settled.keep(
            key, kept, fresh, since=since, read_from=read_from, now=now, width=bucket_ms
        )
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
    ) -> FeedPage:
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
