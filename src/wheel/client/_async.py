"""``AsyncClient``: the asyncio client over a ``grpc.aio`` channel to each node.

The same calls as ``Client``, awaited, with async iterators for the lists;
requests and responses go through the same ``_wire`` functions, and the choice
of node through the same ``_nodes.Tries``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import date, datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar, Unpack

import grpc  # type: ignore[import-untyped, unused-ignore]
import grpc.aio  # type: ignore[import-untyped, unused-ignore]
from grpc_health.v1 import health_pb2_grpc  # type: ignore[import-untyped, unused-ignore]

from wheel.auth import call_metadata
from wheel.client import _admin, _overview, _wire
from wheel.client._admin import AuditEntry, Calendar, Limit, Secret, TenantQuota, Token
from wheel.client._nodes import (
    CHANNEL_OPTIONS,
    CONNECT_TIMEOUT_S,
    PROBE,
    Resend,
    Tries,
    connected,
    traced,
)
from wheel.client._overview import JobHistory, RecentRun, RunOverview
from wheel.client._pages import Pages
from wheel.client._specs import JobArgs, JobRequest, UpdateArgs
from wheel.client._time import Duration, When, time_ms, utc
from wheel.client._values import (
    Alerts,
    Backfill,
    DstFold,
    DstGap,
    InFlight,
    Job,
    JobState,
    JobUpdate,
    LagMinute,
    Membership,
    Page,
    Run,
    RunState,
    Status,
    Trigger,
)
from wheel.codec import PayloadCodec
from wheel.errors import WheelError
from wheel.rpc.targets import targets_of
from wheel.rpc.v1 import admin_service_pb2 as admin_pb
from wheel.rpc.v1 import admin_service_pb2_grpc, job_service_pb2_grpc
from wheel.tls import ChannelSecurity, make_channel

_T = TypeVar("_T")


class _Node:
    """One address: its channel, the stubs on it, and whether it answered last."""

    __slots__ = ("address", "admin", "answered", "channel", "health", "jobs", "tls")

    def __init__(
        self, address: str, security: ChannelSecurity, interceptors: Sequence[Any]
    ) -> None:
        self.address = address
        self.tls = security.secure
        self.channel = make_channel(
            address, security, aio=True, options=CHANNEL_OPTIONS, interceptors=interceptors
        )
        self.jobs = job_service_pb2_grpc.JobServiceStub(self.channel)
        self.admin = admin_service_pb2_grpc.AdminServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.answered = False


class AsyncClient:
    """An asyncio connection to wheel nodes; use it on one event loop.

    ``async with AsyncClient(target) as client: job = await client.submit(...)``.
    Targets, security, errors, arguments and results are those of ``Client``
    (``interceptors`` are ``grpc.aio`` client interceptors).
    """

    def __init__(
        self,
        target: str | Sequence[str] = _wire.DEFAULT_TARGET,
        *,
        timeout: float = 10.0,
        security: ChannelSecurity | None = None,
        interceptors: Sequence[Any] = (),
        token: str | None = None,
        codec: PayloadCodec | None = None,
    ) -> None:
        self.targets = tuple(targets_of(target))
        # Encodes the payloads it sends and decodes those it reads (wheel.codec).
        self.codec = codec
        if security is None:
            security = ChannelSecurity.from_env()
        # Sent with every call: ``token``, else $WHEEL_TOKEN (none: no auth).
        self._metadata = call_metadata(token)
        self.target = ",".join(self.targets)
        self.timeout = timeout
        self._nodes = [_Node(address, security, interceptors) for address in self.targets]
        # The node that answered last: where the next call goes first.
        self._preferred = 0

    async def close(self) -> None:
        for node in self._nodes:
            await node.channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _call(
        self,
        method: Callable[[_Node], Callable[..., Any]],
        request: Any,
        resend: Resend = Resend.ALWAYS,
    ) -> Any:
        """See ``Client._call``."""
        tries = Tries(len(self._nodes), self._preferred, self.timeout, time.monotonic())
        while True:
            node = self._nodes[tries.index]
            remaining = tries.remaining(time.monotonic())
            # Never sent: a probe that went unanswered says so.
            failure = None
            if resend is Resend.UNSENT or not node.answered:
                failure = await self._probe(node, min(remaining, CONNECT_TIMEOUT_S))
            if failure is None:
                try:
                    response = await method(node)(
                        request, timeout=remaining, metadata=traced(self._metadata)
                    )
                except grpc.RpcError as exc:  # grpc.aio's AioRpcError is one
                    failure = _wire.error_from_rpc(exc)
                    failure.__cause__ = exc
                    if not _wire.is_unavailable(exc) or resend is Resend.UNSENT:
                        raise failure from exc
                    node.answered = False
                else:
                    node.answered = True
                    self._preferred = tries.index
                    return response
            delay = tries.next(time.monotonic())
            if delay is None:
                raise failure
            await asyncio.sleep(delay)

    async def _probe(self, node: _Node, timeout: float) -> WheelError | None:
        """None if ``node`` answers the health probe (any answer), else the
        failure: a call has not been sent to it."""
        try:
            await node.health.Check(PROBE, timeout=timeout)
        except grpc.RpcError as exc:
            if not connected(exc):
                failure = _wire.unreachable(node.address, exc, tls=node.tls)
                failure.__cause__ = exc
                return failure
        return None

    async def _pages(
        self, method: Callable[[_Node], Callable[..., Any]], pages: Pages[_T]
    ) -> AsyncIterator[_T]:
        token = ""
        while True:
            resp = await self._call(method, pages.request(token))
            for item in pages.items(resp):
                yield item
            token = resp.next_page_token
            if not token:
                return

    # -- jobs ------------------------------------------------------------------

    async def submit(self, **job: Unpack[JobArgs]) -> Job:
        """See ``Client.submit``."""
        request, generated = _wire.submit_request(JobRequest(**job), self.codec)
        resp = await self._call(lambda n: n.jobs.SubmitJob, request)
        return _wire.job_of(resp.job, created=resp.created or generated, codec=self.codec)

    async def submit_many(self, jobs: Iterable[JobRequest | JobArgs]) -> list[Job | WheelError]:
        """See ``Client.submit_many``."""
        submits = _wire.submit_many_request(jobs, self.codec)
        request = submits.request
        resp = await self._call(lambda n: n.jobs.SubmitJobs, request) if request.jobs else None
        return _wire.submit_many_results(submits, resp)

    async def get(self, job_id: int, *, next_fires: int = 5, recent_runs: int = 10) -> Job:
        """See ``Client.get``."""
        request = _wire.get_request(job_id, next_fires, recent_runs)
        return _wire.job_of(await self._call(lambda n: n.jobs.GetJob, request), codec=self.codec)

    def jobs(
        self,
        *,
        tenant: str | None = None,
        state: JobState | str | None = None,
        name_prefix: str = "",
        page_size: int = 100,
    ) -> AsyncIterator[Job]:
        """See ``Client.jobs``; ``async for job in client.jobs(): ...``."""
        pages = _wire.job_pages(tenant, state, page_size, name_prefix)
        return self._pages(lambda n: n.jobs.ListJobs, pages)

    async def jobs_page(
        self,
        *,
        tenant: str | None = None,
        state: JobState | str | None = None,
        name_prefix: str = "",
        page_size: int = 100,
        page_token: str = "",
    ) -> Page[Job]:
        """See ``Client.jobs_page``."""
        pages = _wire.job_pages(tenant, state, page_size, name_prefix)
        resp = await self._call(lambda n: n.jobs.ListJobs, pages.request(page_token))
        return Page(items=pages.items(resp), next_page_token=resp.next_page_token)

    async def cancel(self, job_id: int) -> Job:
        """See ``Client.cancel``."""
        return _wire.job_of(
            await self._call(lambda n: n.jobs.CancelJob, _wire.job_ref(job_id)), codec=self.codec
        )

    async def pause(self, job_id: int) -> Job:
        """See ``Client.pause``."""
        return _wire.job_of(
            await self._call(lambda n: n.jobs.PauseJob, _wire.job_ref(job_id)), codec=self.codec
        )

    async def resume(self, job_id: int) -> Job:
        """See ``Client.resume``."""
        return _wire.job_of(
            await self._call(lambda n: n.jobs.ResumeJob, _wire.job_ref(job_id)), codec=self.codec
        )

    async def trigger(self, job_id: int) -> Trigger:
        """See ``Client.trigger``."""
        request = _wire.job_ref(job_id)
        resp = await self._call(lambda n: n.jobs.TriggerJob, request, Resend.UNSENT)
        return _wire.trigger_of(resp)

    async def backfill(self, job_id: int, start: When, end: When) -> Backfill:
        """See ``Client.backfill``."""
        request = _wire.backfill_request(job_id, start, end)
        return _wire.backfill_of(await self._call(lambda n: n.jobs.BackfillJob, request))

    def runs(
        self, job_id: int, *, states: Iterable[RunState | str] = (), page_size: int = 100
    ) -> AsyncIterator[Run]:
        """See ``Client.runs``; ``async for run in client.runs(job_id): ...``."""
        return self._pages(lambda n: n.jobs.ListRuns, _wire.run_pages(job_id, states, page_size))

    async def get_run(self, run_id: int) -> Run:
        """See ``Client.get_run``."""
        return _wire.run_of(await self._call(lambda n: n.jobs.GetRun, _wire.run_ref(run_id)))

    async def runs_page(
        self,
        job_id: int,
        *,
        states: Iterable[RunState | str] = (),
        page_size: int = 100,
        page_token: str = "",
    ) -> Page[Run]:
        """See ``Client.runs_page``."""
        pages = _wire.run_pages(job_id, states, page_size)
        resp = await self._call(lambda n: n.jobs.ListRuns, pages.request(page_token))
        return Page(items=pages.items(resp), next_page_token=resp.next_page_token)

    async def update(
        self,
        job_id: int,
        *,
        idempotency_key: str | None = None,
        if_version: int | None = None,
        **changes: Unpack[UpdateArgs],
    ) -> Job:
        """Change a job in place (the keywords are ``JobRequest``'s, all but
        ``tenant``; a schedule keyword replaces the whole schedule), keeping
        its id and history: its next fires follow the new spec at once, runs
        in flight finish under the old one, and the change is recorded
        (``job_updates``). With ``idempotency_key``, the same update again
        returns the job without changing it again. With ``if_version``, it
        applies only if the job's newest update is still that version (0:
        never updated; ``job_updates`` gives it), else ``FailedPrecondition``
        and nothing changes."""
        request = _wire.update_request(job_id, idempotency_key, changes, self.codec)
        if if_version is not None:
            request.if_version = if_version
        resp = await self._call(lambda n: n.jobs.UpdateJob, request)
        return _wire.job_of(resp.job, codec=self.codec)

    def job_updates(self, job_id: int, *, page_size: int = 100) -> AsyncIterator[JobUpdate]:
        """A job's recorded spec updates, newest first."""
        return self._pages(lambda n: n.jobs.ListJobUpdates, _wire.update_pages(job_id, page_size))

    async def preview(
        self,
        job_id: int | None = None,
        *,
        cron: str | None = None,
        every: Duration | None = None,
        at: When | None = None,
        tz: str = "UTC",
        dst_gap: DstGap | str = DstGap.FIRE_AT_TRANSITION,
        dst_fold: DstFold | str = DstFold.FIRST,
        start: When | None = None,
        active_from: When | None = None,
        active_until: When | None = None,
        max_fires: int | None = None,
        start_from: When | None = None,
        count: int = 10,
        skip_calendars: Sequence[str] = (),
    ) -> list[datetime]:
        """The next ``count`` fire times (at most 1000) at or after
        ``start_from`` (default now) of a job, or of a schedule given as to
        ``submit``, as the scheduler computes them (time zone, DST gap and
        fold policies, the bounds ``active_from``, ``active_until`` and
        ``max_fires``), skipping the days of ``skip_calendars`` (a job skips
        its own)."""
        schedule = {
            k: v
            for k, v in (
                ("cron", cron), ("every", every), ("at", at), ("tz", tz), ("dst_gap", dst_gap),
                ("dst_fold", dst_fold), ("start", start), ("active_from", active_from),
                ("active_until", active_until), ("max_fires", max_fires),
            )
            if v is not None
        }  # fmt: skip
        if job_id is not None:
            schedule = {k: v for k, v in schedule.items() if k in ("cron", "every", "at", "start")}
        request = _wire.preview_request(job_id, schedule, start_from, count, skip_calendars)
        resp = await self._call(lambda n: n.jobs.PreviewSchedule, request)
        return [utc(ms) for ms in resp.fires_ms]

    async def dead_letters(self, job_id: int | None = None, *, page_size: int = 100) -> list[Run]:
        """Dead-lettered runs not redriven yet, newest first: of one job, or of
        every job the caller may see."""
        pages = self._pages(
            lambda n: n.jobs.ListDeadLetters, _wire.dead_letter_pages(job_id, page_size)
        )
        return [run async for run in pages]

    async def dead_letters_page(
        self, job_id: int | None = None, *, page_size: int = 100, page_token: str = ""
    ) -> Page[Run]:
        """See ``Client.dead_letters_page``."""
        pages = _wire.dead_letter_pages(job_id, page_size)
        resp = await self._call(lambda n: n.jobs.ListDeadLetters, pages.request(page_token))
        return Page(items=pages.items(resp), next_page_token=resp.next_page_token)

    async def redrive(self, job_id: int, *, run_id: int | None = None) -> list[Run]:
        """Run a job's dead letters again (or the one of ``run_id``), each as a
        new attempt of its fire with a new fence; returns the new attempts.
        A node redrives at most 1,000 a call: this calls again until none of
        those the job had remain. Not repeated on another node unless it
        never left for the first."""
        runs: list[Run] = []
        token = ""
        while True:
            request = _wire.redrive_request(job_id, run_id, token)
            resp = await self._call(lambda n: n.jobs.RedriveDeadLetters, request, Resend.UNSENT)
            runs += (_wire.run_of(r) for r in resp.runs)
            token = resp.next_page_token
            if not token:
                return runs

    # -- at a glance (scope jobs:read) ------------------------------------------

    async def run_overview(
        self,
        *,
        tenant: str = "",
        window: Duration | None = None,
        bucket: Duration | None = None,
    ) -> RunOverview:
        """See ``Client.run_overview``."""
        request = _overview.overview_request(tenant, window, bucket)
        return _overview.overview_of(await self._call(lambda n: n.jobs.GetRunOverview, request))

    async def recent_runs_page(
        self,
        *,
        tenant: str = "",
        outcome: RunState | str | None = None,
        handler: str = "",
        job_name: str = "",
        page_size: int = 50,
        page_token: str = "",
    ) -> Page[RecentRun]:
        """See ``Client.recent_runs_page``."""
        request = _overview.recent_runs_request(
            tenant=tenant,
            outcome=outcome,
            handler=handler,
            job_name=job_name,
            page_size=page_size,
            page_token=page_token,
        )
        return _overview.recent_runs_of(await self._call(lambda n: n.jobs.ListRecentRuns, request))

    async def job_history(
        self, job_id: int, *, fires: int = 100, window: Duration | None = None
    ) -> JobHistory:
        """See ``Client.job_history``."""
        request = _overview.history_request(job_id, fires, window)
        return _overview.history_of(await self._call(lambda n: n.jobs.GetJobHistory, request))

    # -- admin -----------------------------------------------------------------

    async def status(self, *, include_shards: bool = False) -> Status:
        """See ``Client.status``."""
        request = _wire.status_request(include_shards)
        return _wire.status_of(await self._call(lambda n: n.admin.GetClusterStatus, request))

    async def membership(self) -> Membership:
        """See ``Client.membership``."""
        msg = await self._call(lambda n: n.admin.GetMembership, _wire.membership_request())
        return _wire.membership_of(msg)

    async def lag_history(self) -> list[LagMinute]:
        """See ``Client.lag_history``."""
        request = admin_pb.GetLagHistoryRequest()
        return _wire.lag_history_of(await self._call(lambda n: n.admin.GetLagHistory, request))

    async def in_flight(self, *, limit: int = 100) -> InFlight:
        """See ``Client.in_flight``."""
        request = _wire.build(admin_pb.ListInFlightRequest, limit=limit)
        return _wire.in_flight_of(await self._call(lambda n: n.admin.ListInFlight, request))

    async def alerts(self, *, since: When | None = None, limit: int = 0) -> Alerts:
        """See ``Client.alerts``."""
        request = _wire.alerts_request(since, limit)
        return _wire.alerts_of(await self._call(lambda n: n.admin.ListAlerts, request))

    # -- tokens and tenants (a node run with --auth; scope admin) ---------------

    async def create_token(
        self,
        *,
        tenant: str,
        scopes: Sequence[str],
        ttl: timedelta | None = None,
        worker_id: str = "",
        pools: Sequence[str] = (),
        label: str = "",
    ) -> tuple[str, Token]:
        """See ``Client.create_token``."""
        request = _admin.create_token_request(
            tenant=tenant,
            scopes=list(scopes),
            ttl=ttl,
            worker_id=worker_id,
            pools=list(pools),
            label=label,
        )
        resp = await self._call(lambda n: n.admin.CreateToken, request, Resend.UNSENT)
        return resp.token, _admin.token_of(resp.info)

    async def tokens(self) -> list[Token]:
        """See ``Client.tokens``."""
        resp = await self._call(lambda n: n.admin.ListTokens, admin_pb.ListTokensRequest())
        return [_admin.token_of(t) for t in resp.tokens]

    async def revoke_token(self, token_id: str) -> Token:
        """See ``Client.revoke_token``."""
        request = _wire.build(admin_pb.RevokeTokenRequest, token_id=token_id)
        return _admin.token_of(await self._call(lambda n: n.admin.RevokeToken, request))

    async def set_tenant_quota(self, quota: TenantQuota) -> TenantQuota:
        """See ``Client.set_tenant_quota``."""
        request = _admin.quota_request(quota)
        return _admin.quota_of(await self._call(lambda n: n.admin.SetTenantQuota, request))

    async def tenant_quotas(self) -> list[TenantQuota]:
        """See ``Client.tenant_quotas``."""
        request = admin_pb.ListTenantQuotasRequest()
        resp = await self._call(lambda n: n.admin.ListTenantQuotas, request)
        return [_admin.quota_of(q) for q in resp.quotas]

    # -- signing secrets of HTTP targets (scope jobs:write; listing jobs:read) -----

    async def set_secret(
        self,
        name: str,
        *,
        tenant: str = "",
        value: bytes | str | None = None,
        generate: bool = False,
    ) -> tuple[Secret, str | None]:
        """See ``Client.set_secret``."""
        request = _admin.set_secret_request(name, tenant, value, generate)
        resp = await self._call(lambda n: n.admin.SetSecret, request, Resend.UNSENT)
        return _admin.secret_of(resp.info), resp.value or None

    async def rotate_secret(
        self,
        name: str,
        *,
        tenant: str = "",
        value: bytes | str | None = None,
        generate: bool | None = None,
        overlap: timedelta | None = None,
    ) -> tuple[Secret, str | None]:
        """See ``Client.rotate_secret``."""
        request = _admin.rotate_secret_request(name, tenant, value, generate, overlap)
        resp = await self._call(lambda n: n.admin.RotateSecret, request, Resend.UNSENT)
        return _admin.secret_of(resp.info), resp.value or None

    async def secrets(self, tenant: str = "") -> list[Secret]:
        """See ``Client.secrets``."""
        request = admin_pb.ListSecretsRequest(tenant=tenant)
        resp = await self._call(lambda n: n.admin.ListSecrets, request)
        return [_admin.secret_of(m) for m in resp.secrets]

    async def audit(
        self,
        *,
        since: When | None = None,
        job_id: int | None = None,
        tenant: str = "",
        limit: int = 100,
        before_id: int | None = None,
    ) -> list[AuditEntry]:
        """See ``Client.audit``."""
        since_ms = 0 if since is None else time_ms(since, "since")
        out: list[AuditEntry] = []
        token = "" if before_id is None else str(before_id)
        while len(out) < limit:
            size = min(1000, limit - len(out))
            request = _admin.audit_request(since_ms, job_id, tenant, size, token)
            resp = await self._call(lambda n: n.admin.ListAudit, request)
            out.extend(_admin.audit_of(m) for m in resp.entries)
            token = resp.next_page_token
            if not token:
                break
        return out

    async def delete_secret(self, name: str, *, tenant: str = "") -> int:
        """See ``Client.delete_secret``."""
        request = admin_pb.DeleteSecretRequest(tenant=tenant, name=name)
        resp = await self._call(lambda n: n.admin.DeleteSecret, request)
        return int(resp.deleted)

    # -- calendars (scope jobs:write; reading jobs:read) ---------------------------

    async def set_calendar(
        self,
        name: str,
        *,
        tenant: str = "",
        dates: Iterable[date | str] = (),
        ranges: Iterable[tuple[date | str, date | str]] = (),
        weekdays: Iterable[str] = (),
    ) -> Calendar:
        """Create the calendar ``name`` of ``tenant`` (empty: the caller's) or
        replace its days: dates and inclusive ranges (``date`` values or
        ``YYYY-MM-DD``) and weekdays (``mon`` .. ``sun``). The jobs skipping
        it are re-armed by the node before it answers."""
        request = _admin.set_calendar_request(name, tenant, dates, ranges, weekdays)
        resp = await self._call(lambda n: n.admin.SetCalendar, request)
        return _admin.calendar_of(resp)

    async def calendar(self, name: str, *, tenant: str = "") -> Calendar:
        """The calendar; ``NotFound`` when there is none such."""
        request = admin_pb.GetCalendarRequest(tenant=tenant, name=name)
        return _admin.calendar_of(await self._call(lambda n: n.admin.GetCalendar, request))

    async def calendars(self, tenant: str = "") -> list[Calendar]:
        """Every calendar (of ``tenant``; empty: every tenant the caller
        sees), by tenant and name."""
        request = admin_pb.ListCalendarsRequest(tenant=tenant)
        resp = await self._call(lambda n: n.admin.ListCalendars, request)
        return [_admin.calendar_of(m) for m in resp.calendars]

    async def delete_calendar(self, name: str, *, tenant: str = "") -> bool:
        """Delete the calendar (False: there was none). Jobs naming it fire
        on every day from then on."""
        request = admin_pb.DeleteCalendarRequest(tenant=tenant, name=name)
        resp = await self._call(lambda n: n.admin.DeleteCalendar, request)
        return bool(resp.deleted)

    async def set_limit(
        self,
        key: str,
        *,
        tenant: str = "",
        max_concurrent: int | None = None,
        rate: int | None = None,
        per: timedelta = timedelta(seconds=1),
        burst: int | None = None,
    ) -> Limit:
        """See ``Client.set_limit``."""
        request = _admin.set_limit_request(key, tenant, max_concurrent, rate, per, burst)
        return _admin.limit_of(await self._call(lambda n: n.admin.SetLimit, request))

    async def limits(self, tenant: str = "") -> list[Limit]:
        """See ``Client.limits``."""
        request = admin_pb.ListLimitsRequest(tenant=tenant)
        resp = await self._call(lambda n: n.admin.ListLimits, request)
        return [_admin.limit_of(m) for m in resp.limits]

    async def delete_limit(self, key: str, *, tenant: str = "") -> int:
        """See ``Client.delete_limit``."""
        request = admin_pb.DeleteLimitRequest(tenant=tenant, key=key)
        resp = await self._call(lambda n: n.admin.DeleteLimit, request)
        return int(resp.deleted)
