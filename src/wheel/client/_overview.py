"""The overview calls' values and wire forms: jobs by state and runs by
time bucket and outcome (``run_overview``), the feed of recent runs across
jobs (``recent_runs_page``), and a job's history at a glance
(``job_history``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from wheel.client import _wire
from wheel.client._time import Duration, as_duration, millis, utc
from wheel.client._values import JobState, Page, Run, RunState, choice
from wheel.rpc import convert
from wheel.rpc.v1 import job_service_pb2 as js

MS = timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True, kw_only=True)
class OutcomeBucket:
    """How many runs ended with ``outcome`` in the bucket that starts at
    ``start`` (``RunState.MISSED``: fires recorded missed in it)."""

    start: datetime
    outcome: RunState
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOverview:
    """Jobs by state, and runs ended since ``since`` in buckets of
    ``bucket`` by outcome (empty buckets left out), as of ``now``."""

    jobs: dict[JobState, int]
    runs: list[OutcomeBucket]
    since: datetime
    bucket: timedelta
    now: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class RecentRun:
    """A run of the feed of recent runs, with its job's tenant, name and
    handler."""

    run: Run
    tenant: str
    job_name: str
    handler: str


@dataclass(frozen=True, slots=True, kw_only=True)
class JobHistory:
    """A job's last fires, newest first (each fire's latest attempt, or a
    missed fire), and its runs ended since ``since``: how many, how many
    succeeded, and the 50th and 99th percentile of their durations (None:
    no run ended)."""

    fires: list[Run]
    runs: int
    succeeded: int
    p50: timedelta | None
    p99: timedelta | None
    since: datetime


def _ms(value: Duration | None, field: str) -> int:
    return 0 if value is None else millis(as_duration(value, field))


def overview_request(
    tenant: str, window: Duration | None, bucket: Duration | None
) -> js.GetRunOverviewRequest:
    return _wire.build(
        js.GetRunOverviewRequest,
        tenant=tenant,
        window_ms=_ms(window, "window"),
        bucket_ms=_ms(bucket, "bucket"),
    )


def overview_of(msg: js.RunOverview) -> RunOverview:
    return RunOverview(
        jobs={
            JobState(convert.job_state_from_proto(c.state) or JobState.ACTIVE): c.count
            for c in msg.jobs
        },
        runs=[
            OutcomeBucket(
                start=utc(c.bucket_ms), outcome=_wire.run_state_of(c.outcome), count=c.count
            )
            for c in msg.runs
        ],
        since=utc(msg.since_ms),
        bucket=msg.bucket_ms * MS,
        now=utc(msg.now_ms),
    )


def recent_runs_request(
    *,
    tenant: str,
    outcome: RunState | str | None,
    handler: str,
    job_name: str,
    page_size: int,
    page_token: str,
) -> js.ListRecentRunsRequest:
    state = None if outcome is None else choice(RunState, outcome, "outcome")
    return _wire.build(
        js.ListRecentRunsRequest,
        tenant=tenant,
        outcome=0 if state is None else _wire.run_state_to_proto(state),
        handler=handler,
        job_name=job_name,
        page_size=page_size,
        page_token=page_token,
    )


def recent_runs_of(msg: js.ListRecentRunsResponse) -> Page[RecentRun]:
    return Page(
        items=[
            RecentRun(
                run=_wire.run_of(r.run), tenant=r.tenant, job_name=r.job_name, handler=r.handler
            )
            for r in msg.runs
        ],
        next_page_token=msg.next_page_token,
    )


def history_request(job_id: int, fires: int, window: Duration | None) -> js.GetJobHistoryRequest:
    return _wire.build(
        js.GetJobHistoryRequest, job_id=job_id, fires=fires, window_ms=_ms(window, "window")
    )


def history_of(msg: js.JobHistory) -> JobHistory:
    ran = msg.runs > 0
    return JobHistory(
        fires=[_wire.run_of(r) for r in msg.fires],
        runs=msg.runs,
        succeeded=msg.succeeded,
        p50=msg.p50_ms * MS if ran else None,
        p99=msg.p99_ms * MS if ran else None,
        since=utc(msg.since_ms),
    )
