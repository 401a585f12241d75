"""``OverviewStore`` over the reference model's dicts: what the SQL of
``wheel.store._overview`` computes, by reading every row."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Protocol

from wheel.engine.spec import JobSpec
from wheel.store._overview import MISSED, merge_fires, stats_of
from wheel.store._shared import prefix_end
from wheel.store.base import (
    ExecutionRecord,
    FeedPage,
    FeedRun,
    FireMark,
    JobState,
    MissedFire,
    OutcomeCount,
    RunState,
    RunStats,
)


class _Job(Protocol):
    spec: JobSpec
    state: JobState


class _Run(Protocol):
    run_id: int
    job_id: int
    scheduled_for: int
    attempt: int
    state: RunState
    started_at_ms: int | None
    finished_at_ms: int | None
    error: str | None

    def record(self) -> ExecutionRecord: ...


class OverviewModel:
    """Reads the reference store's jobs, runs and missed fires; owns none."""

    def __init__(
        self,
        jobs: Mapping[int, _Job],
        execs: Mapping[int, _Run],
        missed: Mapping[tuple[int, int], MissedFire],
    ) -> None:
        self._jobs = jobs
        self._execs = execs
        self._missed = missed

    def _tenant_of(self, job_id: int) -> str | None:
        job = self._jobs.get(job_id)
        return None if job is None else job.spec.tenant

    def count_jobs_by_state(self, tenant: str | None = None) -> dict[JobState, int]:
        counts: Counter[JobState] = Counter(
            j.state for j in self._jobs.values() if tenant is None or j.spec.tenant == tenant
        )
        return dict(counts)

    def outcome_counts(
        self, *, since_ms: int, bucket_ms: int, tenant: str | None = None
    ) -> list[OutcomeCount]:
        width = max(1, bucket_ms)
        counts: Counter[tuple[int, str]] = Counter()
        for e in self._execs.values():
            end = e.finished_at_ms
            if end is None or end < since_ms:
                continue
            if tenant is None or self._tenant_of(e.job_id) == tenant:
                counts[(end // width * width, e.state.value)] += 1
        for (job_id, _), m in self._missed.items():
            mine = tenant is None or self._tenant_of(job_id) == tenant
            if m.recorded_at_ms >= since_ms and mine:
                counts[(m.recorded_at_ms // width * width, MISSED)] += 1
        return [
            OutcomeCount(bucket_ms=b, outcome=o, count=n) for (b, o), n in sorted(counts.items())
        ]

    def recent_runs(
        self,
        *,
        tenant: str | None = None,
        outcome: RunState | None = None,
        handler: str | None = None,
        job_name: str | None = None,
        before_run_id: int | None = None,
        limit: int = 50,
        scan: int = 20_000,
    ) -> FeedPage:
        if not self._execs:
            return FeedPage(runs=[], next_before=None)
        top = max(self._execs) + 1 if before_run_id is None else before_run_id
        floor = max(0, top - max(1, scan))
        size = max(1, limit)
        out = []
        for run_id in sorted(self._execs, reverse=True):
            e = self._execs[run_id]
            job = self._jobs.get(e.job_id)
            if job is None or not floor <= run_id < top:
                continue
            spec = job.spec
            if (
                (outcome is not None and e.state is not outcome)
                or (tenant is not None and spec.tenant != tenant)
                or (handler is not None and spec.handler != handler)
                or (job_name and not job_name <= spec.name < prefix_end(job_name))
            ):
                continue
            out.append(
                FeedRun(
                    run=e.record(), tenant=spec.tenant, job_name=spec.name, handler=spec.handler
                )
            )
            if len(out) >= size:
                return FeedPage(runs=out, next_before=run_id)
        older = [i for i in self._execs if i < floor]
        return FeedPage(runs=out, next_before=max(older) + 1 if older else None)

    def recent_fires(self, job_id: int, limit: int = 100) -> list[FireMark]:
        latest: dict[int, _Run] = {}
        for e in self._execs.values():
            if e.job_id != job_id:
                continue
            fire = e.scheduled_for
            if fire not in latest or latest[fire].attempt < e.attempt:
                latest[fire] = e
        runs = [
            FireMark(
                scheduled_for=f,
                outcome=e.state.value,
                attempt=e.attempt,
                run_id=e.run_id,
                detail=e.error,
            )
            for f, e in latest.items()
        ]
        missed = [
            FireMark(scheduled_for=f, outcome=MISSED, attempt=0, run_id=None, detail=m.reason.value)
            for (j, f), m in self._missed.items()
            if j == job_id
        ]
        return merge_fires(runs, missed, limit)

    def run_stats(self, job_id: int, since_ms: int) -> RunStats:
        rows = []
        for e in self._execs.values():
            end = e.finished_at_ms
            if e.job_id != job_id or end is None or e.scheduled_for < since_ms:
                continue
            start = e.started_at_ms
            rows.append((e.state.value, None if start is None else end - start))
        return stats_of(rows)
