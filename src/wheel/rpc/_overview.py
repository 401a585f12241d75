"""JobService's calls for the console's overview: ``GetRunOverview``,
``ListRecentRuns`` and ``GetJobHistory``. Each reads what the caller may
see (scope ``jobs:read``): a tenant's credential its own tenant's jobs and
runs only, whatever the request names; an operator every tenant's or the
one it names."""

from __future__ import annotations

import grpc

from wheel.engine.model import RunState
from wheel.errors import InvalidArgument, LimitExceeded
from wheel.node import Node
from wheel.rpc import convert
from wheel.rpc._common import _call, _job_id, _page_size
from wheel.rpc._guard import Guard
from wheel.rpc._operator import _token
from wheel.rpc.v1 import job_service_pb2 as pb
from wheel.rpc.v1 import jobs_pb2
from wheel.store.base import FireMark

__all__ = ["OverviewCalls"]

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS
MAX_WINDOW_MS = 7 * DAY_MS
MAX_BUCKETS = 1_440
MIN_BUCKET_MS = 1_000
FEED_PAGE = 50
MAX_FILTER = 200


def _window(value: int, default: int, field: str) -> int:
    if value < 0:
        raise InvalidArgument(field, f"{value} is negative")
    if value > MAX_WINDOW_MS:
        raise LimitExceeded(field, f"{value} is over the limit of {MAX_WINDOW_MS} (7 days)")
    return value or default


def _bucket(value: int, window_ms: int) -> int:
    if value < 0:
        raise InvalidArgument("bucket_ms", f"{value} is negative")
    bucket = value or MINUTE_MS
    if bucket < MIN_BUCKET_MS:
        raise InvalidArgument("bucket_ms", f"{value} is under {MIN_BUCKET_MS} ms")
    if -(-window_ms // bucket) > MAX_BUCKETS:
        raise LimitExceeded(
            "bucket_ms", f"{value} makes more than {MAX_BUCKETS} buckets of the window"
        )
    return bucket


def _filter(value: str, field: str) -> str | None:
    if len(value) > MAX_FILTER:
        raise LimitExceeded(field, f"longer than {MAX_FILTER} characters")
    if "\x00" in value:
        raise InvalidArgument(field, "must not contain NUL")
    return value or None


def _outcome(value: int) -> RunState | None:
    if value == jobs_pb2.RUN_STATE_UNSPECIFIED:
        return None
    if value == jobs_pb2.RUN_STATE_MISSED:
        raise InvalidArgument("outcome", "missed fires are not runs: read a job's history")
    return convert.run_state_from_proto(value, field="outcome")


def _outcome_to_proto(outcome: str) -> jobs_pb2.RunState:
    if outcome == "missed":
        return jobs_pb2.RUN_STATE_MISSED
    return convert.run_state_to_proto(RunState(outcome))


def fire_to_proto(job_id: int, mark: FireMark) -> jobs_pb2.Run:
    """One fire of a job's history strip as a ``Run``."""
    if mark.run_id is None:
        return jobs_pb2.Run(
            job_id=job_id,
            scheduled_for_ms=mark.scheduled_for,
            state=jobs_pb2.RUN_STATE_MISSED,
            missed_reason=mark.detail or "",
        )
    return jobs_pb2.Run(
        run_id=mark.run_id,
        job_id=job_id,
        scheduled_for_ms=mark.scheduled_for,
        attempt=convert.wire_attempt(mark.attempt),
        state=_outcome_to_proto(mark.outcome),
        error=mark.detail or "",
    )


class OverviewCalls:
    """The three calls, for ``JobServicer`` to answer with."""

    def __init__(self, node: Node, guard: Guard) -> None:
        self.node = node
        self.guard = guard

    async def GetRunOverview(
        self, request: pb.GetRunOverviewRequest, context: grpc.aio.ServicerContext
    ) -> pb.RunOverview:
        async def work() -> pb.RunOverview:
            tenant = Guard.list_tenant(await self.guard.principal(context), request.tenant)
            window = _window(request.window_ms, HOUR_MS, "window_ms")
            bucket = _bucket(request.bucket_ms, window)
            got = await self.node.run_overview(tenant=tenant, window_ms=window, bucket_ms=bucket)
            return pb.RunOverview(
                jobs=[
                    pb.JobStateCount(state=convert.job_state_to_proto(s), count=n)
                    for s, n in sorted(got.jobs.items())
                ],
                runs=[
                    pb.OutcomeCount(
                        bucket_ms=c.bucket_ms, outcome=_outcome_to_proto(c.outcome), count=c.count
                    )
                    for c in got.runs
                ],
                since_ms=got.since_ms,
                bucket_ms=got.bucket_ms,
                now_ms=got.now_ms,
            )

        return await _call(context, work())

    async def ListRecentRuns(
        self, request: pb.ListRecentRunsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListRecentRunsResponse:
        async def work() -> pb.ListRecentRunsResponse:
            tenant = Guard.list_tenant(await self.guard.principal(context), request.tenant)
            size = _page_size(request.page_size) if request.page_size else FEED_PAGE
            page = await self.node.recent_runs(
                tenant=tenant,
                outcome=_outcome(request.outcome),
                handler=_filter(request.handler, "handler"),
                job_name=_filter(request.job_name, "job_name"),
                before_run_id=_token(request.page_token),
                limit=size,
            )
            return pb.ListRecentRunsResponse(
                runs=[
                    pb.RecentRun(
                        run=convert.run_to_proto(r.run),
                        tenant=r.tenant,
                        job_name=r.job_name,
                        handler=r.handler,
                    )
                    for r in page.runs
                ],
                next_page_token="" if page.next_before is None else str(page.next_before),
            )

        return await _call(context, work())

    async def GetJobHistory(
        self, request: pb.GetJobHistoryRequest, context: grpc.aio.ServicerContext
    ) -> pb.JobHistory:
        async def work() -> pb.JobHistory:
            job_id = _job_id(request.job_id)
            fires = _page_size(request.fires, "fires")
            window = _window(request.window_ms, DAY_MS, "window_ms")
            # NOT_FOUND for unknown ids, and for another tenant's.
            self.guard.check_job(
                await self.guard.principal(context), await self.node.get_job(job_id)
            )
            got = await self.node.job_history(job_id, fires=fires, window_ms=window)
            s = got.stats
            return pb.JobHistory(
                fires=[fire_to_proto(job_id, m) for m in got.fires],
                runs=s.runs,
                succeeded=s.succeeded,
                p50_ms=s.p50_ms or 0,
                p99_ms=s.p99_ms or 0,
                since_ms=got.since_ms,
            )

        return await _call(context, work())
