"""``Client``: the blocking client over a gRPC channel to each node address."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import date, datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar, Unpack

import grpc  # type: ignore[import-untyped, unused-ignore]
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
            address, security, aio=False, options=CHANNEL_OPTIONS, interceptors=interceptors
        )
        self.jobs = job_service_pb2_grpc.JobServiceStub(self.channel)
        self.admin = admin_service_pb2_grpc.AdminServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.answered = False


class Client:
    """A blocking connection to wheel nodes (any node serves every call).

    ``target`` is one address or several (a list, or ``"host:port,host:port"``):
    a call that meets an unavailable node is tried on the next address until
    its ``timeout`` (seconds) runs out; see ``wheel.client._nodes`` for what is
    repeated. Every failure is raised as a ``wheel.errors.WheelError``:
    ``InvalidArgument`` naming the field, ``NotFound``, ``AlreadyExists``,
    ``FailedPrecondition``, ``ResourceExhausted``, or a plain ``WheelError``
    starting with the gRPC code's name (``UNAVAILABLE: ...``). Safe to share
    between threads.

    ``security`` secures the channels (``ChannelSecurity.from_files(ca=...,
    cert=..., key=...)`` for TLS); None reads ``WHEEL_TLS_CA``,
    ``WHEEL_TLS_CERT`` and ``WHEEL_TLS_KEY``, plaintext when they are unset.
    ``interceptors`` (``grpc`` client interceptors) wrap every call.
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

    def close(self) -> None:
        for node in self._nodes:
            node.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(
        self,
        method: Callable[[_Node], Callable[..., Any]],
        request: Any,
        resend: Resend = Resend.ALWAYS,
    ) -> Any:
        """``method`` of a node's stubs with ``request``, on one node after
        another while they are unavailable (``_nodes``' rules)."""
        tries = Tries(len(self._nodes), self._preferred, self.timeout, time.monotonic())
        while True:
            node = self._nodes[tries.index]
            remaining = tries.remaining(time.monotonic())
            # Never sent: a probe that went unanswered says so.
            failure = None
            if resend is Resend.UNSENT or not node.answered:
                failure = self._probe(node, min(remaining, CONNECT_TIMEOUT_S))
            if failure is None:
                try:
                    response = method(node)(
                        request, timeout=remaining, metadata=traced(self._metadata)
                    )
                except grpc.RpcError as exc:
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
            time.sleep(delay)

    def _probe(self, node: _Node, timeout: float) -> WheelError | None:
        """None if ``node`` answers the health probe (any answer), else the
        failure: a call has not been sent to it."""
        try:
            node.health.Check(PROBE, timeout=timeout)
        except grpc.RpcError as exc:
            if not connected(exc):
                failure = _wire.unreachable(node.address, exc, tls=node.tls)
                failure.__cause__ = exc
                return failure
        return None

    def _pages(
        self, method: Callable[[_Node], Callable[..., Any]], pages: Pages[_T]
    ) -> Iterator[_T]:
        token = ""
        while True:
            resp = self._call(method, pages.request(token))
            yield from pages.items(resp)
            token = resp.next_page_token
            if not token:
                return

    # -- jobs ------------------------------------------------------------------

    def submit(self, **job: Unpack[JobArgs]) -> Job:
        """Submit a job (the keywords are ``JobRequest``'s) and return it as the
        node stored it; ``created`` is False when an earlier submit with the
        same ``idempotency_key`` made it."""
        request, generated = _wire.submit_request(JobRequest(**job), self.codec)
        resp = self._call(lambda n: n.jobs.SubmitJob, request)
        # A key of this call's own: whatever job it names, this call made it.
        return _wire.job_of(resp.job, created=resp.created or generated, codec=self.codec)

    def submit_many(self, jobs: Iterable[JobRequest | JobArgs]) -> list[Job | WheelError]:
        """Submit many jobs in one call and one store transaction (at most
        10,000): each item's ``Job``, or the error of that item alone."""
        submits = _wire.submit_many_request(jobs, self.codec)
        request = submits.request
        resp = self._call(lambda n: n.jobs.SubmitJobs, request) if request.jobs else None
        return _wire.submit_many_results(submits, resp)

    def get(self, job_id: int, *, next_fires: int = 5, recent_runs: int = 10) -> Job:
        """A job with its next ``next_fires`` fires and ``recent_runs`` latest runs
        (each at most 100)."""
        request = _wire.get_request(job_id, next_fires, recent_runs)
        return _wire.job_of(self._call(lambda n: n.jobs.GetJob, request), codec=self.codec)

    def jobs(
        self,
        *,
        tenant: str | None = None,
        state: JobState | str | None = None,
        name_prefix: str = "",
        page_size: int = 100,
    ) -> Iterator[Job]:
        """Every job (of ``tenant``, in ``state``, if given) in job id order,
        fetched ``page_size`` at a time; with ``name_prefix``, only those
        whose name starts with it (case-sensitive), in name order."""
        pages = _wire.job_pages(tenant, state, page_size, name_prefix)
        return self._pages(lambda n: n.jobs.ListJobs, pages)

    def jobs_page(
        self,
        *,
        tenant: str | None = None,
        state: JobState | str | None = None,
        name_prefix: str = "",
        page_size: int = 100,
        page_token: str = "",
    ) -> Page[Job]:
        """One page of ``jobs``: pass its ``next_page_token`` back for the next."""
        pages = _wire.job_pages(tenant, state, page_size, name_prefix)
        resp = self._call(lambda n: n.jobs.ListJobs, pages.request(page_token))
        return Page(items=pages.items(resp), next_page_token=resp.next_page_token)

    def cancel(self, job_id: int) -> Job:
        """Cancel a job; a run in flight is revoked. Cancelling again is a no-op."""
        return _wire.job_of(
            self._call(lambda n: n.jobs.CancelJob, _wire.job_ref(job_id)), codec=self.codec
        )

    def pause(self, job_id: int) -> Job:
        """Pause a job: fires that come due are recorded as missed (``paused``)."""
        return _wire.job_of(
            self._call(lambda n: n.jobs.PauseJob, _wire.job_ref(job_id)), codec=self.codec
        )

    def resume(self, job_id: int) -> Job:
        """Resume a paused job from now, without a burst of the fires it missed."""
        return _wire.job_of(
            self._call(lambda n: n.jobs.ResumeJob, _wire.job_ref(job_id)), codec=self.codec
        )

    def trigger(self, job_id: int) -> Trigger:
        """Run a job now, out of band, as a fire of its own. Not idempotent: it
        goes to another node only if it never left for the first."""
        request = _wire.job_ref(job_id)
        return _wire.trigger_of(self._call(lambda n: n.jobs.TriggerJob, request, Resend.UNSENT))

    def backfill(self, job_id: int, start: When, end: When) -> Backfill:
        """Run the job's fires with ``start <= scheduled_for < end`` (both in the
        past) that are not already in its history."""
        request = _wire.backfill_request(job_id, start, end)
        return _wire.backfill_of(self._call(lambda n: n.jobs.BackfillJob, request))

    def runs(
        self, job_id: int, *, states: Iterable[RunState | str] = (), page_size: int = 100
    ) -> Iterator[Run]:
        """A job's executions (every attempt) and missed fires, newest first;
        ``states`` keeps only those states (``RunState.MISSED`` for missed fires)."""
        return self._pages(lambda n: n.jobs.ListRuns, _wire.run_pages(job_id, states, page_size))

    def get_run(self, run_id: int) -> Run:
        """One run whole, its ``result`` included (``NotFound`` for an
        unknown run, and for another tenant's)."""
        return _wire.run_of(self._call(lambda n: n.jobs.GetRun, _wire.run_ref(run_id)))

    def runs_page(
        self,
        job_id: int,
        *,
        states: Iterable[RunState | str] = (),
        page_size: int = 100,
        page_token: str = "",
    ) -> Page[Run]:
        """One page of ``runs``: pass its ``next_page_token`` back for the next."""
        pages = _wire.run_pages(job_id, states, page_size)
        resp = self._call(lambda n: n.jobs.ListRuns, pages.request(page_token))
        return Page(items=pages.items(resp), next_page_token=resp.next_page_token)

    def update(
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
        resp = self._call(lambda n: n.jobs.UpdateJob, request)
        return _wire.job_of(resp.job, codec=self.codec)

    def job_updates(self, job_id: int, *, page_size: int = 100) -> Iterator[JobUpdate]:
        """A job's recorded spec updates, newest first."""
        return self._pages(lambda n: n.jobs.ListJobUpdates, _wire.update_pages(job_id, page_size))

    def preview(
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
        resp = self._call(lambda n: n.jobs.PreviewSchedule, request)
        return [utc(ms) for ms in resp.fires_ms]

    def dead_letters(self, job_id: int | None = None, *, page_size: int = 100) -> list[Run]:
        """Dead-lettered runs not redriven yet, newest first: of one job, or of
        every job the caller may see."""
        return list(
            self._pages(
                lambda n: n.jobs.ListDeadLetters, _wire.dead_letter_pages(job_id, page_size)
            )
        )

    def dead_letters_page(
        self, job_id: int | None = None, *, page_size: int = 100, page_token: str = ""
    ) -> Page[Run]:
        """One page of ``dead_letters``: pass its ``next_page_token`` back for the next."""
        pages = _wire.dead_letter_pages(job_id, page_size)
        resp = self._call(lambda n: n.jobs.ListDeadLetters, pages.request(page_token))
        return Page(items=pages.items(resp), next_page_token=resp.next_page_token)

    def redrive(self, job_id: int, *, run_id: int | None = None) -> list[Run]:
        """Run a job's dead letters again (or the one of ``run_id``), each as a
        new attempt of its fire with a new fence; returns the new attempts.
        A node redrives at most 1,000 a call: this calls again until none of
        those the job had remain. Not repeated on another node unless it
        never left for the first."""
        runs: list[Run] = []
        token = ""
        while True:
            request = _wire.redrive_request(job_id, run_id, token)
            resp = self._call(lambda n: n.jobs.RedriveDeadLetters, request, Resend.UNSENT)
            runs += (_wire.run_of(r) for r in resp.runs)
            token = resp.next_page_token
            if not token:
                return runs

    # -- at a glance (scope jobs:read) ------------------------------------------

    def run_overview(
        self,
        *,
        tenant: str = "",
        window: Duration | None = None,
        bucket: Duration | None = None,
    ) -> RunOverview:
        """Jobs by state, and runs that ended over the last ``window`` (None:
        an hour; at most 7 days) in buckets of ``bucket`` (None: a minute) by
        outcome, missed fires included: of every job the caller sees, or of
        ``tenant``'s (a tenant's token: its own always)."""
        request = _overview.overview_request(tenant, window, bucket)
        return _overview.overview_of(self._call(lambda n: n.jobs.GetRunOverview, request))

    def recent_runs_page(
        self,
        *,
        tenant: str = "",
        outcome: RunState | str | None = None,
        handler: str = "",
        job_name: str = "",
        page_size: int = 50,
        page_token: str = "",
    ) -> Page[RecentRun]:
        """A page of the runs of every job the caller sees, newest first,
        with their jobs' tenant, name and handler; filtered by outcome (a
        run state), tenant, exact handler and job name prefix."""
        request = _overview.recent_runs_request(
            tenant=tenant,
            outcome=outcome,
            handler=handler,
            job_name=job_name,
            page_size=page_size,
            page_token=page_token,
        )
        return _overview.recent_runs_of(self._call(lambda n: n.jobs.ListRecentRuns, request))

    def job_history(
        self, job_id: int, *, fires: int = 100, window: Duration | None = None
    ) -> JobHistory:
        """A job's last ``fires`` fires (at most 1,000; each fire's latest
        attempt, and the missed ones), and its runs that ended over the
        last ``window`` (None: a day): count, successes, p50 and p99."""
        request = _overview.history_request(job_id, fires, window)
        return _overview.history_of(self._call(lambda n: n.jobs.GetJobHistory, request))

    # -- admin -----------------------------------------------------------------

    def status(self, *, include_shards: bool = False) -> Status:
        """The node's view of the cluster: nodes, workers, backlog, lag, totals."""
        msg = self._call(lambda n: n.admin.GetClusterStatus, _wire.status_request(include_shards))
        return _wire.status_of(msg)

    def membership(self) -> Membership:
        """The members and each shard's owner, as the node asked sees them."""
        msg = self._call(lambda n: n.admin.GetMembership, _wire.membership_request())
        return _wire.membership_of(msg)

    def lag_history(self) -> list[LagMinute]:
        """The node's dispatch lag minute by minute over the last hour, oldest
        first, quiet minutes included (scope admin)."""
        request = admin_pb.GetLagHistoryRequest()
        return _wire.lag_history_of(self._call(lambda n: n.admin.GetLagHistory, request))

    def in_flight(self, *, limit: int = 100) -> InFlight:
        """Up to ``limit`` (at most 1,000) of the runs the node holds now, by
        run id, and how many it holds (scope admin; ask each member)."""
        request = _wire.build(admin_pb.ListInFlightRequest, limit=limit)
        return _wire.in_flight_of(self._call(lambda n: n.admin.ListInFlight, request))

    def alerts(self, *, since: When | None = None, limit: int = 0) -> Alerts:
        """The alerts the node asked raised at or after ``since`` (None: all
        it keeps), oldest first, at most the newest ``limit`` (0: all), and
        the kinds firing now. Each node keeps its own: in a cluster, ask each
        member (``Client(member.address)`` for ``membership().members``)."""
        request = _wire.alerts_request(since, limit)
        return _wire.alerts_of(self._call(lambda n: n.admin.ListAlerts, request))

    # -- tokens and tenants (a node run with --auth; scope admin) ---------------

    def create_token(
        self,
        *,
        tenant: str,
        scopes: Sequence[str],
        ttl: timedelta | None = None,
        worker_id: str = "",
        pools: Sequence[str] = (),
        label: str = "",
    ) -> tuple[str, Token]:
        """A new bearer token (shown here only) and what the node stored of it."""
        request = _admin.create_token_request(
            tenant=tenant,
            scopes=list(scopes),
            ttl=ttl,
            worker_id=worker_id,
            pools=list(pools),
            label=label,
        )
        resp = self._call(lambda n: n.admin.CreateToken, request, Resend.UNSENT)
        return resp.token, _admin.token_of(resp.info)

    def tokens(self) -> list[Token]:
        """Every token, revoked and expired ones too (never their secrets)."""
        resp = self._call(lambda n: n.admin.ListTokens, admin_pb.ListTokensRequest())
        return [_admin.token_of(t) for t in resp.tokens]

    def revoke_token(self, token_id: str) -> Token:
        request = _wire.build(admin_pb.RevokeTokenRequest, token_id=token_id)
        return _admin.token_of(self._call(lambda n: n.admin.RevokeToken, request))

    def set_tenant_quota(self, quota: TenantQuota) -> TenantQuota:
        """Replace a tenant's limits with ``quota``'s (None: no limit)."""
        request = _admin.quota_request(quota)
        return _admin.quota_of(self._call(lambda n: n.admin.SetTenantQuota, request))

    def tenant_quotas(self) -> list[TenantQuota]:
        request = admin_pb.ListTenantQuotasRequest()
        resp = self._call(lambda n: n.admin.ListTenantQuotas, request)
        return [_admin.quota_of(q) for q in resp.quotas]

    # -- signing secrets of HTTP targets (scope jobs:write; listing jobs:read) -----

    def set_secret(
        self,
        name: str,
        *,
        tenant: str = "",
        value: bytes | str | None = None,
        generate: bool = False,
    ) -> tuple[Secret, str | None]:
        """Create the secret ``name`` of ``tenant`` (empty: the caller's), or
        replace every version of it: with ``value`` (``whsec_`` and base64, or
        24 to 64 raw bytes), or with a new random one when ``generate``, which
        is returned here (and never shown again); None for a given value."""
        request = _admin.set_secret_request(name, tenant, value, generate)
        resp = self._call(lambda n: n.admin.SetSecret, request, Resend.UNSENT)
        return _admin.secret_of(resp.info), resp.value or None

    def rotate_secret(
        self,
        name: str,
        *,
        tenant: str = "",
        value: bytes | str | None = None,
        generate: bool | None = None,
        overlap: timedelta | None = None,
    ) -> tuple[Secret, str | None]:
        """A new version of the secret (generated unless ``value`` is given;
        the generated value is returned, once); the versions before keep
        signing for ``overlap`` (None: a day), requests carrying a signature
        by each. ``NotFound`` when there is no such secret."""
        request = _admin.rotate_secret_request(name, tenant, value, generate, overlap)
        resp = self._call(lambda n: n.admin.RotateSecret, request, Resend.UNSENT)
        return _admin.secret_of(resp.info), resp.value or None

    def secrets(self, tenant: str = "") -> list[Secret]:
        """Every secret version still signing (of ``tenant``; empty: every
        tenant the caller sees), by tenant, name and version; never values."""
        request = admin_pb.ListSecretsRequest(tenant=tenant)
        resp = self._call(lambda n: n.admin.ListSecrets, request)
        return [_admin.secret_of(m) for m in resp.secrets]

    def audit(
        self,
        *,
        since: When | None = None,
        job_id: int | None = None,
        tenant: str = "",
        limit: int = 100,
        before_id: int | None = None,
    ) -> list[AuditEntry]:
        """The audit trail, newest first: administrative changes (pause,
        update, redrive, tokens, quotas, secrets...) at or after ``since``, of
        ``job_id``, of ``tenant`` (an operator's token; a tenant's sees its
        own), at most ``limit`` of them, with ids below ``before_id`` (the
        last ``entry_id`` of a page, for the next)."""
        since_ms = 0 if since is None else time_ms(since, "since")
        out: list[AuditEntry] = []
        token = "" if before_id is None else str(before_id)
        while len(out) < limit:
            size = min(1000, limit - len(out))
            request = _admin.audit_request(since_ms, job_id, tenant, size, token)
            resp = self._call(lambda n: n.admin.ListAudit, request)
            out.extend(_admin.audit_of(m) for m in resp.entries)
            token = resp.next_page_token
            if not token:
                break
        return out

    def delete_secret(self, name: str, *, tenant: str = "") -> int:
        """Delete every version of the secret: how many (0: none such). Runs
        of jobs signing with it fail to sign from then on."""
        request = admin_pb.DeleteSecretRequest(tenant=tenant, name=name)
        resp = self._call(lambda n: n.admin.DeleteSecret, request)
        return int(resp.deleted)

    # -- calendars (scope jobs:write; reading jobs:read) ---------------------------

    def set_calendar(
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
        resp = self._call(lambda n: n.admin.SetCalendar, request)
        return _admin.calendar_of(resp)

    def calendar(self, name: str, *, tenant: str = "") -> Calendar:
        """The calendar; ``NotFound`` when there is none such."""
        request = admin_pb.GetCalendarRequest(tenant=tenant, name=name)
        return _admin.calendar_of(self._call(lambda n: n.admin.GetCalendar, request))

    def calendars(self, tenant: str = "") -> list[Calendar]:
        """Every calendar (of ``tenant``; empty: every tenant the caller
        sees), by tenant and name."""
        request = admin_pb.ListCalendarsRequest(tenant=tenant)
        resp = self._call(lambda n: n.admin.ListCalendars, request)
        return [_admin.calendar_of(m) for m in resp.calendars]

    def delete_calendar(self, name: str, *, tenant: str = "") -> bool:
        """Delete the calendar (False: there was none). Jobs naming it fire
        on every day from then on."""
        request = admin_pb.DeleteCalendarRequest(tenant=tenant, name=name)
        resp = self._call(lambda n: n.admin.DeleteCalendar, request)
        return bool(resp.deleted)

    # -- concurrency keys and rate limits (scope jobs:write; listing jobs:read) ----

    def set_limit(
        self,
        key: str,
        *,
        tenant: str = "",
        max_concurrent: int | None = None,
        rate: int | None = None,
        per: timedelta = timedelta(seconds=1),
        burst: int | None = None,
    ) -> Limit:
        """Create or replace the limit of concurrency key ``key`` (of
        ``tenant``; empty: the caller's): at most ``max_concurrent`` runs of
        its jobs in flight across the cluster, and/or at most ``rate``
        starts per ``per`` (a second or a minute) with ``burst`` at once
        (default: ``rate``). Jobs join it with ``concurrency_key=key``."""
        request = _admin.set_limit_request(key, tenant, max_concurrent, rate, per, burst)
        return _admin.limit_of(self._call(lambda n: n.admin.SetLimit, request))

    def limits(self, tenant: str = "") -> list[Limit]:
        """Every limit (of ``tenant``; empty: every tenant the caller sees)
        with its runs in flight, and the fires waiting on every member."""
        request = admin_pb.ListLimitsRequest(tenant=tenant)
        resp = self._call(lambda n: n.admin.ListLimits, request)
        return [_admin.limit_of(m) for m in resp.limits]

    def delete_limit(self, key: str, *, tenant: str = "") -> int:
        """Delete the key's limit: 1, or 0 when there was none. Its jobs keep
        the key and run unlimited until a limit is set again."""
        request = admin_pb.DeleteLimitRequest(tenant=tenant, key=key)
        resp = self._call(lambda n: n.admin.DeleteLimit, request)
        return int(resp.deleted)
