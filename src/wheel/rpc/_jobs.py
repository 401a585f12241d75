"""JobService: submits (group-committed), reads, and the calls that change a
job, each answered with a status code and a message naming the field."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Iterable
from typing import Any, cast, overload

import grpc

from wheel.engine.fires import next_fires_of
from wheel.engine.model import JobState
from wheel.engine.records import JobRecord
from wheel.engine.schedule import compile_spec
from wheel.engine.spec import DEFAULT_LIMITS, no_nul
from wheel.errors import (
    InvalidArgument,
    LimitExceeded,
    NotFound,
    NotOwner,
    ResourceExhausted,
    WheelError,
)
from wheel.node import Node
from wheel.node._jobs import Submits
from wheel.rpc import convert
from wheel.rpc._common import (
    MAX_NEXT_FIRES,
    MAX_SUBMIT_MANY,
    _call,
    _idempotency_key,
    _ignore_outcome,
    _job_id,
    _page_size,
    status_of,
)
from wheel.rpc._guard import Guard
from wheel.rpc._limits import check_key, keys_known
from wheel.rpc._operator import OperatorCalls
from wheel.rpc._overview import OverviewCalls
from wheel.rpc._peers import Peers, credential, forwarded_by
from wheel.rpc.v1 import (
    job_service_pb2,
    job_service_pb2_grpc,
    jobs_pb2,
)

log = logging.getLogger("wheel.rpc")

# A bulk submit lets the event loop in every this many jobs: its 10,000
# would hold every stream and timer of the node for half a second.
YIELD_EVERY = 64
# A name prefix is at most a name (JobLimits.max_name_len's default).
MAX_NAME_PREFIX = 200
# Bulk submits a node works on at once (see ``JobServicer``).
BULK_AT_ONCE = 1


class JobServicer(OperatorCalls, job_service_pb2_grpc.JobServiceServicer):
    """Any member serves every call: reads from the store here, submits
    stored here (and their owners told at once), calls that change a job
    carried out by the owner of its shard (forwarded once)."""

    def __init__(self, node: Node, peers: Peers, guard: Guard | None = None) -> None:
        self.node = node
        self.peers = peers
        self.guard = guard or Guard(None)
        # Bulk submits worked on at once; the others wait their turn. Each
        # holds its jobs as objects until its answer goes (a few kilobytes a
        # job), and works the loop and the store thread flat out: measured
        # with 4 clients of 10,000 jobs, one at a time went 10% faster than
        # all at once, with the longest loop stall 78 ms instead of 148 and
        # 30% less heap left behind.
        self._bulk = asyncio.Semaphore(BULK_AT_ONCE)
        self.overview = OverviewCalls(node, self.guard)

    # -- the console's overview (wheel.rpc._overview) -------------------------------

    async def GetRunOverview(
        self, request: job_service_pb2.GetRunOverviewRequest, context: grpc.aio.ServicerContext
    ) -> job_service_pb2.RunOverview:
        return await self.overview.GetRunOverview(request, context)

    async def ListRecentRuns(
        self, request: job_service_pb2.ListRecentRunsRequest, context: grpc.aio.ServicerContext
    ) -> job_service_pb2.ListRecentRunsResponse:
        return await self.overview.ListRecentRuns(request, context)

    async def GetJobHistory(
        self, request: job_service_pb2.GetJobHistoryRequest, context: grpc.aio.ServicerContext
    ) -> job_service_pb2.JobHistory:
        return await self.overview.GetJobHistory(request, context)

    async def _visible(self, job_id: int, context: grpc.aio.ServicerContext) -> None:
        """NOT_FOUND for a job the caller's tenant may not see (a read of the
        store only with a tenant's credential)."""
        principal = await self.guard.principal(context)
        if principal is not None and not principal.operator:
            self.guard.check_job(principal, await self.node.get_job(job_id))

    async def _elsewhere(
        self, job_id: int, method: str, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        """The owner's answer when another member owns the job's shard (the
        call is forwarded there), None when this node does."""
        address = self.node.route(job_id)
        if address is None:
            return None
        if forwarded_by(context) is not None:
            raise NotOwner(f"job {job_id}'s shard is not owned here either; retry")
        return await self.peers.forward(address, method, request, context)

    def _tell_owners(self, job_ids: list[int], context: grpc.aio.ServicerContext) -> None:
        by_owner = self.node.owners_of(job_ids)
        if by_owner:
            self.peers.jobs_changed(by_owner, credential(context))

    async def SubmitJob(
        self, request: job_service_pb2.SubmitJobRequest, context: grpc.aio.ServicerContext
    ) -> job_service_pb2.SubmitJobResponse:
        async def work() -> job_service_pb2.SubmitJobResponse:
            mine = self.guard.own_submit(await self.guard.principal(context), request)
            tenant = [mine.spec.tenant or "default"]
            (over,) = await self.node.admit_submits(tenant)
            if over is not None:
                raise over
            try:
                await self.node.learn_secrets(_secrets_named([mine]))
                await self.node.learn_calendars(_calendars_named([mine]))
                known = await keys_known(self.node, [mine.spec])
                response = await self._submit_one(mine, known)
            finally:
                self.node.submits_done(tenant)
            if response.created:
                self._tell_owners([response.job.job_id], context)
            return response

        return await _call(context, work())

    async def SubmitJobs(
        self, request: job_service_pb2.SubmitJobsRequest, context: grpc.aio.ServicerContext
    ) -> job_service_pb2.SubmitJobsResponse:
        async def work() -> job_service_pb2.SubmitJobsResponse:
            async with self._bulk:
                return await bulk()

        async def bulk() -> job_service_pb2.SubmitJobsResponse:
            if len(request.jobs) > MAX_SUBMIT_MANY:
                raise LimitExceeded(
                    "jobs", f"{len(request.jobs)} submits is over the limit of {MAX_SUBMIT_MANY}"
                )
            # Every job is validated and queued first, so the whole request
            # goes into one group commit; then each outcome is awaited in turn.
            principal = await self.guard.principal(context)
            mine: list[job_service_pb2.SubmitJobRequest | WheelError] = []
            # What the jobs name, gathered in the same pass (which lets the
            # loop in): a pass of its own over ten thousand jobs each held
            # the loop for tens of milliseconds.
            named = _Named()
            for i, item in enumerate(request.jobs):
                if i % YIELD_EVERY == YIELD_EVERY - 1:
                    await asyncio.sleep(0)  # ten thousand jobs must not stall the loop
                try:
                    own = self.guard.own_submit(principal, item)
                except WheelError as exc:
                    mine.append(exc)
                    continue
                mine.append(own)
                named.add(own.spec)
            await self.node.learn_secrets(named.secrets)
            await self.node.learn_calendars(named.calendars)
            known = await self.node.known_limits(named.keys) if named.keys else set()
            verdicts = iter(await self.node.admit_submits(named.tenants))
            admitted: list[str] = []
            # Each job's error, or None: its outcome is the batch's next.
            refused: list[WheelError | None] = []
            out = job_service_pb2.SubmitJobsResponse()
            now = self.node.now_ms()
            created: list[int] = []
            batch = self.node.submit_batch()
            try:
                for i, item in enumerate(mine):
                    if i % YIELD_EVERY == YIELD_EVERY - 1:
                        await asyncio.sleep(0)
                    if isinstance(item, WheelError):
                        refused.append(item)
                        continue
                    over = next(verdicts)
                    if over is not None:
                        refused.append(over)
                        continue
                    admitted.append(item.spec.tenant or "default")
                    try:
                        self._queue_submit(item, now, known, batch)
                    except WheelError as exc:
                        refused.append(exc)
                        continue
                    refused.append(None)
                results = iter(await batch.close())
                for i, error in enumerate(refused):
                    if i % YIELD_EVERY == YIELD_EVERY - 1:
                        await asyncio.sleep(0)
                    result = error if error is not None else next(results)
                    if isinstance(result, WheelError):
                        out.results.add(
                            error_code=status_of(result).name, error_message=str(result)
                        )
                        continue
                    if request.lean:
                        _lean(out.results.add().response, *result)
                    else:
                        out.results.add(response=self._submitted(*result))
                    if result[1]:
                        created.append(result[0].job_id)
            except BaseException:
                # Nobody awaits the outcomes now: their ending is no error to log.
                batch.close().add_done_callback(_ignore_outcome)
                raise
            finally:
                self.node.submits_done(admitted)
            self._tell_owners(created, context)
            return out

        return await _call(context, work())

    async def _submit_one(
        self, request: job_service_pb2.SubmitJobRequest, known: set[tuple[str, str]]
    ) -> job_service_pb2.SubmitJobResponse:
        result = await self._queue_submit(request, self.node.now_ms(), known)
        if isinstance(result, WheelError):
            raise result
        return self._submitted(*result)

    @overload
    def _queue_submit(
        self, request: job_service_pb2.SubmitJobRequest, now: int, known: set[tuple[str, str]]
    ) -> asyncio.Future[tuple[JobRecord, bool] | WheelError]: ...

    @overload
    def _queue_submit(
        self,
        request: job_service_pb2.SubmitJobRequest,
        now: int,
        known: set[tuple[str, str]],
        batch: Submits,
    ) -> None: ...

    def _queue_submit(
        self,
        request: job_service_pb2.SubmitJobRequest,
        now: int,
        known: set[tuple[str, str]],
        batch: Submits | None = None,
    ) -> asyncio.Future[tuple[JobRecord, bool] | WheelError] | None:
        """Validate one submit and queue it for the node's next group commit
        (``now``: the request's time; a bulk submit's jobs share it;
        ``known``: the concurrency keys with a limit, of those named): the
        future of its outcome, or with ``batch`` (a bulk submit's) its
        outcome the batch's next."""
        if not request.HasField("spec"):
            raise InvalidArgument("spec", "is required")
        _idempotency_key(request.idempotency_key)
        spec = convert.spec_from_proto(
            request.spec,
            now_ms=now,
            sent=True,
            secret_known=self.node.knows_secret,
            calendar_known=self.node.knows_calendar,
        )
        check_key(spec, known)
        digest = None
        if request.idempotency_key:
            # The request as sent decides "same body" for a retry, not the spec
            # after server-side defaults (an interval's start is now + period).
            wire = request.spec.SerializeToString(deterministic=True)
            digest = hashlib.sha256(wire).hexdigest()
        key = request.idempotency_key or None
        if batch is not None:
            batch.submit(spec, key, body_hash=digest, now_ms=now)
            return None
        return self.node.submit_later(spec, key, body_hash=digest, now_ms=now)

    def _first_fires(self, record: JobRecord) -> list[int]:
        spec = record.spec
        days = (
            self.node.calendar_days(spec.tenant, spec.skip_calendars)
            if spec.skip_calendars
            else None
        )
        return next_fires_of(record, 5, days)

    def _submitted(self, record: JobRecord, created: bool) -> job_service_pb2.SubmitJobResponse:
        # Its fires as its schedule computes them from the stored first one:
        # asking the owner would wake a job that has just gone to rest.
        return job_service_pb2.SubmitJobResponse(
            job=convert.job_to_proto(record, next_fires_ms=self._first_fires(record)),
            created=created,
        )

    async def GetJob(
        self, request: job_service_pb2.GetJobRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.Job:
        async def work() -> jobs_pb2.Job:
            job_id = _job_id(request.job_id)
            if not 0 <= request.next_fires <= MAX_NEXT_FIRES:
                raise InvalidArgument("next_fires", f"must be within [0, {MAX_NEXT_FIRES}]")
            if not 0 <= request.recent_runs <= MAX_NEXT_FIRES:
                raise InvalidArgument("recent_runs", f"must be within [0, {MAX_NEXT_FIRES}]")
            record = self.guard.check_job(
                await self.guard.principal(context), await self.node.get_job(job_id)
            )
            runs = await self.node.list_runs(job_id, limit=request.recent_runs or 10)
            return convert.job_to_proto(
                record,
                next_fires_ms=self.node.next_fires(job_id, request.next_fires or 5, record),
                recent_runs=[convert.run_to_proto(r) for r in runs],
            )

        return await _call(context, work())

    async def ListJobs(
        self, request: job_service_pb2.ListJobsRequest, context: grpc.aio.ServicerContext
    ) -> job_service_pb2.ListJobsResponse:
        async def work() -> job_service_pb2.ListJobsResponse:
            size = _page_size(request.page_size)
            prefix = request.name_prefix
            if len(prefix) > MAX_NAME_PREFIX:
                raise LimitExceeded(
                    "name_prefix",
                    f"{len(prefix)} characters is over the limit of {MAX_NAME_PREFIX}",
                )
            no_nul("name_prefix", prefix)
            no_nul("tenant", request.tenant)
            after, after_name = _job_cursor(request.page_token, named=bool(prefix))
            state = convert.job_state_from_proto(request.state)
            tenant = self.guard.list_tenant(await self.guard.principal(context), request.tenant)
            records = await self.node.list_jobs(
                tenant=tenant,
                state=state,
                after_job_id=after,
                limit=size,
                name_prefix=prefix,
                after_name=after_name,
            )
            token = ""
            if len(records) == size:
                last = records[-1]
                # By name: the name goes in the token too, after the id.
                token = f"{last.job_id}:{last.spec.name}" if prefix else str(last.job_id)
            return job_service_pb2.ListJobsResponse(
                jobs=[convert.job_to_proto(r) for r in records], next_page_token=token
            )

        return await _call(context, work())

    async def _state(
        self,
        request: job_service_pb2.JobRef,
        context: grpc.aio.ServicerContext,
        state: JobState,
        method: str,
    ) -> jobs_pb2.Job:
        async def work() -> jobs_pb2.Job:
            job_id = _job_id(request.job_id)
            await self._visible(job_id, context)
            answer = await self._elsewhere(job_id, method, request, context)
            if answer is not None:
                return cast(jobs_pb2.Job, answer)
            record = await self.node.set_state(job_id, state)
            return convert.job_to_proto(
                record, next_fires_ms=self.node.next_fires(record.job_id, 5)
            )

        return await _call(context, work())

    async def CancelJob(
        self, request: job_service_pb2.JobRef, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.Job:
        return await self._state(request, context, JobState.CANCELLED, "CancelJob")

    async def PauseJob(
        self, request: job_service_pb2.JobRef, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.Job:
        return await self._state(request, context, JobState.PAUSED, "PauseJob")

    async def ResumeJob(
        self, request: job_service_pb2.JobRef, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.Job:
        return await self._state(request, context, JobState.ACTIVE, "ResumeJob")

    async def TriggerJob(
        self, request: job_service_pb2.JobRef, context: grpc.aio.ServicerContext
    ) -> job_service_pb2.TriggerJobResponse:
        async def work() -> job_service_pb2.TriggerJobResponse:
            job_id = _job_id(request.job_id)
            await self._visible(job_id, context)
            answer = await self._elsewhere(job_id, "TriggerJob", request, context)
            if answer is not None:
                return cast(job_service_pb2.TriggerJobResponse, answer)
            at = await self.node.trigger(job_id)
            return job_service_pb2.TriggerJobResponse(
                job_id=job_id, scheduled_for_ms=at, idempotency_key=f"{job_id}:{at}"
            )

        return await _call(context, work())

    async def BackfillJob(
        self, request: job_service_pb2.BackfillJobRequest, context: grpc.aio.ServicerContext
    ) -> job_service_pb2.BackfillJobResponse:
        async def work() -> job_service_pb2.BackfillJobResponse:
            job_id = _job_id(request.job_id)
            if request.from_ms < 0:
                raise InvalidArgument("from_ms", f"{request.from_ms} is before the epoch")
            if request.to_ms <= request.from_ms:
                raise InvalidArgument("to_ms", "must be after from_ms")
            now = self.node.now_ms()
            if request.to_ms > now:
                raise InvalidArgument("to_ms", "backfill covers past fires only")
            record = self.guard.check_job(
                await self.guard.principal(context), await self.node.get_job(job_id)
            )
            # Inside the job's bounds only: a fire outside them does not exist.
            compiled = compile_spec(record.spec, job_id=job_id)
            cap = DEFAULT_LIMITS.max_backfill_fires
            fires = compiled.fires_between(request.from_ms - 1, request.to_ms - 1, cap + 1)
            if len(fires) > cap:
                raise ResourceExhausted(
                    f"backfill of {len(fires)}+ fires is over the limit of {cap} per request"
                )
            answer = await self._elsewhere(job_id, "BackfillJob", request, context)
            if answer is not None:
                return cast(job_service_pb2.BackfillJobResponse, answer)
            todo, skipped = await self.node.backfill(job_id, fires)
            return job_service_pb2.BackfillJobResponse(
                scheduled=len(todo), skipped_existing=skipped, scheduled_for_ms=todo
            )

        return await _call(context, work())

    async def ListRuns(
        self, request: job_service_pb2.ListRunsRequest, context: grpc.aio.ServicerContext
    ) -> job_service_pb2.ListRunsResponse:
        async def work() -> job_service_pb2.ListRunsResponse:
            job_id = _job_id(request.job_id)
            size = _page_size(request.page_size)
            wanted = convert.run_filter_from_proto(request.states)
            before_run, before_missed = _runs_token(request.page_token)
            node = self.node
            # NOT_FOUND for unknown ids, and for another tenant's.
            self.guard.check_job(await self.guard.principal(context), await node.get_job(job_id))

            if not wanted.missed:
                before_missed = 0
            runs, missed = await node.list_history(
                job_id,
                before_run_id=before_run,
                before_scheduled_for=before_missed,
                limit=size,
                runs=before_run != 0,
                missed=before_missed != 0,
            )
            # Merge the two newest-first streams without reordering either, so
            # each cursor only ever passes items that were on a page: runs are
            # paged by fire time then attempt (the cursor a run's id), missed
            # fires by fire time.
            page: list[jobs_pb2.Run] = []
            i = j = 0
            while len(page) < size and (i < len(runs) or j < len(missed)):
                if j >= len(missed) or (
                    i < len(runs) and runs[i].scheduled_for >= missed[j].scheduled_for
                ):
                    page.append(convert.run_to_proto(runs[i]))
                    i += 1
                else:
                    page.append(convert.missed_to_proto(missed[j]))
                    j += 1
            # A source read to its end (fewer than a page) is exhausted: 0.
            next_run = 0 if i == len(runs) < size else (runs[i - 1].run_id if i else before_run)
            next_missed = (
                0
                if j == len(missed) < size
                else (missed[j - 1].scheduled_for if j else before_missed)
            )
            token = f"{_cursor(next_run)}:{_cursor(next_missed)}" if next_run or next_missed else ""
            states = _proto_states(wanted)
            out = [p for p in page if p.state in states]
            return job_service_pb2.ListRunsResponse(runs=out, next_page_token=token)

        return await _call(context, work())

    async def GetRun(
        self, request: job_service_pb2.GetRunRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.Run:
        async def work() -> jobs_pb2.Run:
            if request.run_id <= 0:
                raise InvalidArgument("run_id", "must be a positive run id")
            node = self.node
            principal = await self.guard.principal(context)
            run = await node.get_run(request.run_id)
            if principal is not None and not principal.operator:
                try:
                    # As ListRuns: NOT_FOUND for another tenant's, in the
                    # same words as for a run that does not exist.
                    self.guard.check_job(principal, await node.get_job(run.job_id))
                except NotFound:
                    raise NotFound(f"run {request.run_id} does not exist") from None
            return convert.run_to_proto(run)

        return await _call(context, work())


def _lean(answer: job_service_pb2.SubmitJobResponse, record: JobRecord, created: bool) -> None:
    """A submit's answer without the spec the caller sent, and with its first
    fire only (``SubmitJobsRequest.lean``), written into ``answer``: field
    by field in place costs half what a message made and copied in does."""
    job = answer.job
    job.job_id = record.job_id
    job.state = convert.JOB_STATE_TO_PROTO[record.state]
    job.shard = record.shard
    job.created_at_ms = record.created_at_ms
    job.updated_at_ms = record.updated_at_ms
    job.next_fire_ms = record.next_run_at or 0
    answer.created = created


def _proto_states(wanted: convert.RunFilter) -> set[int]:
    states: set[int] = {convert.run_state_to_proto(s) for s in wanted.states}
    if wanted.missed:
        states.add(jobs_pb2.RUN_STATE_MISSED)
    return states


def _job_cursor(token: str, *, named: bool) -> tuple[int, str | None]:
    """A ListJobs page token: the last job's id, and by name also its name
    (``ID:NAME``); (0, None) for the first page."""
    if not named:
        return _token_int(token, "page_token"), None
    if not token:
        return 0, None
    job_id, colon, name = token.partition(":")
    if not colon:
        raise InvalidArgument("page_token", "is not a token this server issued")
    return _token_int(job_id, "page_token"), name


def _token_int(token: str, field: str) -> int:
    if not token:
        return 0
    try:
        value = int(token)
    except ValueError:
        raise InvalidArgument(field, "is not a token this server issued") from None
    if value < 0:
        raise InvalidArgument(field, "is not a token this server issued")
    return value


def _cursor(value: int | None) -> str:
    return "" if value is None else str(value)


def _runs_token(token: str) -> tuple[int | None, int | None]:
    """(before_run_id, before_missed_sf) from "RUN:MISSED"; an empty part (None)
    means from the newest, 0 means that source is exhausted."""
    if not token:
        return None, None
    try:
        a, b = token.split(":")
        before_run, before_missed = (int(a) if a else None), (int(b) if b else None)
    except ValueError:
        raise InvalidArgument("page_token", "is not a token this server issued") from None
    if (before_run or 0) < 0 or (before_missed or 0) < 0:
        raise InvalidArgument("page_token", "is not a token this server issued")
    return before_run, before_missed


class _Named:
    """What the specs of a bulk submit name, one spec at a time: the secrets
    their HTTP targets sign with, the calendars they skip and the
    concurrency keys they count against (each with its tenant), and each
    one's tenant in order."""

    __slots__ = ("calendars", "keys", "secrets", "tenants")

    def __init__(self) -> None:
        self.secrets: set[tuple[str, str]] = set()
        self.calendars: set[tuple[str, str]] = set()
        self.keys: set[tuple[str, str]] = set()
        self.tenants: list[str] = []

    def add(self, spec: jobs_pb2.JobSpec) -> None:
        tenant = spec.tenant or "default"
        self.tenants.append(tenant)
        if spec.HasField("http") and spec.http.signing_secret:
            self.secrets.add((tenant, spec.http.signing_secret))
        for name in spec.skip_calendars:
            self.calendars.add((tenant, name))
        if spec.concurrency_key:
            self.keys.add((tenant, spec.concurrency_key))


def _secrets_named(
    requests: Iterable[job_service_pb2.SubmitJobRequest],
) -> set[tuple[str, str]]:
    """The (tenant, signing secret) pairs the submits' HTTP targets name."""
    return {
        (r.spec.tenant or "default", r.spec.http.signing_secret)
        for r in requests
        if r.spec.HasField("http") and r.spec.http.signing_secret
    }


def _calendars_named(
    requests: Iterable[job_service_pb2.SubmitJobRequest],
) -> set[tuple[str, str]]:
    """The (tenant, calendar) pairs the submits skip."""
    return {(r.spec.tenant or "default", n) for r in requests for n in r.spec.skip_calendars}
