"""The calls a node answers for the rpc layer, the console and the outbox
relay, each passed to the part of the node that answers it: the job API
(``Jobs``, ``Updates``), tenancy (``Tenancy``), signing secrets
(``Secrets``), reads (``Reads``), the console's aggregates
(``Overview``) and the cluster's view (``ClusterView``).
``Node`` builds the parts and hands them here; nothing here holds state of
its own."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from wheel.coord.base import Member
from wheel.engine.calendars import Calendar, CalendarDays
from wheel.engine.model import JobState, RunState
from wheel.engine.records import (
    ExecutionRecord,
    JobChange,
    JobRecord,
    MissedFire,
    Updated,
)
from wheel.engine.spec import JobSpec
from wheel.errors import ResourceExhausted, WheelError
from wheel.node._audit import Audit
from wheel.node._calendars import Calendars
from wheel.node._jobs import Jobs, Submits
from wheel.node._limits import Limits, LimitView
from wheel.node._membership import ClusterView
from wheel.node._overview import JobHistory, Overview, RunOverview
from wheel.node._reads import Reads
from wheel.node._secrets import Secrets
from wheel.node._tenancy import Tenancy
from wheel.node._traces import JobTraces
from wheel.node._updates import Redriven, Updates
from wheel.node._values import InFlightRun, Membership, NodeStatus
from wheel.store.base import (
    AuditEntry,
    CalendarRecord,
    FeedPage,
    LimitRecord,
    SecretRecord,
    TenantQuota,
    TokenRecord,
)


class NodeCalls:
    """The node's API, passed to its parts."""

    def __init__(
        self,
        *,
        jobs: Jobs,
        updates: Updates,
        tenancy: Tenancy,
        secrets: Secrets,
        calendars: Calendars,
        limits: Limits,
        reads: Reads,
        view: ClusterView,
        audit: Audit,
        traces: JobTraces,
        overview: Overview,
    ) -> None:
        self._jobs = jobs
        self._updates = updates
        self._tenancy = tenancy
        self._secrets = secrets
        self._calendars = calendars
        self._limits = limits
        self._reads = reads
        self._view = view
        self._audit = audit
        self._traces = traces
        self._overview = overview

    # -- jobs (wheel.node._jobs, wheel.node._updates) ----------------------------

    def submit_later(
        self,
        spec: JobSpec,
        idempotency_key: str | None,
        *,
        body_hash: str | None = None,
        now_ms: int | None = None,
    ) -> asyncio.Future[tuple[JobRecord, bool] | WheelError]:
        """Validate now, then store the job with the other submits waiting
        (see ``Jobs.submit_later``); the future of its outcome."""
        return self._jobs.submit_later(spec, idempotency_key, body_hash=body_hash, now_ms=now_ms)

    def submit_batch(self) -> Submits:
        """A bulk submit's batch: each job validated and queued as it is
        given, one future of every outcome (see ``Jobs.submit_batch``)."""
        return self._jobs.submit_batch()

    async def get_job(self, job_id: int) -> JobRecord:
        return await self._jobs.get_job(job_id)

    async def set_state(self, job_id: int, state: JobState) -> JobRecord:
        """Pause, resume or cancel: the store first, then the owner."""
        return await self._jobs.set_state(job_id, state)

    async def trigger(self, job_id: int) -> int:
        return await self._jobs.trigger(job_id)

    async def backfill(self, job_id: int, fires: Sequence[int]) -> tuple[list[int], int]:
        return await self._jobs.backfill(job_id, fires)

    def next_fires(self, job_id: int, count: int, record: JobRecord | None = None) -> list[int]:
        days = None
        if record is not None and record.spec.skip_calendars:
            days = self._calendars.days(record.spec.tenant, record.spec.skip_calendars)
        return self._jobs.next_fires(job_id, count, record, days)

    async def update_job(
        self,
        job_id: int,
        spec: JobSpec,
        *,
        idempotency_key: str | None = None,
        body_hash: str = "",
        updated_by: str = "",
        if_version: int | None = None,
    ) -> Updated:
        return await self._updates.update_job(
            job_id,
            spec,
            idempotency_key=idempotency_key,
            body_hash=body_hash,
            updated_by=updated_by,
            if_version=if_version,
        )

    async def list_job_updates(
        self, job_id: int, *, before_version: int | None, limit: int
    ) -> list[JobChange]:
        return await self._updates.list_job_updates(
            job_id, before_version=before_version, limit=limit
        )

    async def list_dead_letters(
        self,
        *,
        job_id: int | None,
        tenant: str | None,
        before_run_id: int | None,
        limit: int,
    ) -> list[ExecutionRecord]:
        return await self._updates.list_dead_letters(
            job_id=job_id, tenant=tenant, before_run_id=before_run_id, limit=limit
        )

    async def redrive(
        self, job_id: int, run_id: int | None = None, *, before_run_id: int | None = None
    ) -> Redriven:
        return await self._updates.redrive(job_id, run_id, before_run_id=before_run_id)

    # -- the audit trail (wheel.node._audit) ---------------------------------------

    async def record_audit(self, entries: Sequence[AuditEntry]) -> bool:
        """Append to the audit trail (False: the store refused; logged)."""
        return await self._audit.record(entries)

    async def list_audit(
        self,
        *,
        since_ms: int | None = None,
        job_id: int | None = None,
        tenant: str | None = None,
        before_id: int | None = None,
        limit: int = 100,
    ) -> list[AuditEntry]:
        """The audit trail, newest first (see ``AuditStore.list_audit``)."""
        return await self._audit.list(
            since_ms=since_ms, job_id=job_id, tenant=tenant, before_id=before_id, limit=limit
        )

    # -- trace contexts of jobs (wheel.node._traces) ----------------------------

    async def record_job_traces(self, traces: Sequence[tuple[int, str]]) -> None:
        """Keep each job's (job id, traceparent) with it, replacing the last."""
        await self._traces.record(traces)

    async def job_traces(self, job_ids: Sequence[int]) -> dict[int, str]:
        """The traceparent kept with each of ``job_ids`` that has one."""
        return await self._traces.read(job_ids)

    # -- tenants (wheel.node._tenancy) -------------------------------------------

    async def set_tenant_quota(self, quota: TenantQuota) -> TenantQuota:
        return await self._tenancy.set_tenant_quota(quota)

    async def list_tenant_quotas(self) -> list[TenantQuota]:
        """Every tenant with limits set, as the store has them now."""
        return await self._tenancy.list_tenant_quotas()

    async def create_token(self, record: TokenRecord) -> None:
        """Store a minted token (``AlreadyExists`` for a token id in use)."""
        await self._tenancy.create_token(record)

    async def get_token(self, token_id: str) -> TokenRecord:
        """A token's record as the store has it now (``NotFound``)."""
        return await self._tenancy.get_token(token_id)

    async def list_tokens(self) -> list[TokenRecord]:
        """Every token, revoked and expired ones included."""
        return await self._tenancy.list_tokens()

    async def revoke_token(self, token_id: str) -> TokenRecord:
        """Revoke a token as of now by the node's clock (``NotFound``)."""
        return await self._tenancy.revoke_token(token_id)

    # -- signing secrets (wheel.node._secrets) ----------------------------------

    async def set_secret(self, tenant: str, name: str, key: bytes) -> SecretRecord:
        """Create the secret, or replace every version of it with ``key``."""
        return await self._secrets.set(tenant, name, key)

    async def rotate_secret(
        self, tenant: str, name: str, key: bytes, overlap_ms: int
    ) -> SecretRecord:
        """A new version; the ones before sign ``overlap_ms`` longer
        (0: a day). ``NotFound``."""
        return await self._secrets.rotate(tenant, name, key, overlap_ms)

    async def list_secrets(self, tenant: str | None) -> list[SecretRecord]:
        """Every version still signing, of ``tenant`` (None: of all)."""
        return await self._secrets.list(tenant)

    async def delete_secret(self, tenant: str, name: str) -> int:
        return await self._secrets.delete(tenant, name)

    def knows_secret(self, tenant: str, name: str) -> bool:
        """Whether ``tenant`` has a signing secret ``name``, as this node's
        cache holds the store's (``learn_secrets`` reads it again first)."""
        return self._secrets.knows(tenant, name)

    async def learn_secrets(self, wanted: Iterable[tuple[str, str]]) -> None:
        """Read the secrets again if the cache lacks one of ``wanted``
        (tenant, name): one made through another node a moment ago is then
        known to a submit that names it."""
        await self._secrets.learn(wanted)

    # -- calendars (wheel.node._calendars) ----------------------------------------

    async def set_calendar(self, tenant: str, name: str, calendar: Calendar) -> CalendarRecord:
        return await self._calendars.set(tenant, name, calendar)

    async def get_calendar(self, tenant: str, name: str) -> CalendarRecord | None:
        return await self._calendars.get(tenant, name)

    async def list_calendars(self, tenant: str | None) -> list[CalendarRecord]:
        return await self._calendars.list(tenant)

    async def delete_calendar(self, tenant: str, name: str) -> bool:
        return await self._calendars.delete(tenant, name)

    def knows_calendar(self, tenant: str, name: str) -> bool:
        """Whether ``tenant`` has a calendar ``name``, as this node last read
        the store (``learn_calendars`` reads it again first)."""
        return self._calendars.knows(tenant, name)

    async def learn_calendars(self, wanted: Iterable[tuple[str, str]]) -> None:
        await self._calendars.learn(wanted)

    def calendar_days(self, tenant: str, names: Sequence[str]) -> CalendarDays | None:
        """The days a job of ``tenant`` skipping ``names`` does not fire on."""
        return self._calendars.days(tenant, names)

    def signed_headers(
        self, tenant: str, name: str, msg_id: str, body: bytes
    ) -> list[tuple[str, str]]:
        """A hand-out's Standard Webhooks headers (``SignError``)."""
        return self._secrets.signed_headers(tenant, name, msg_id, body)

    # -- concurrency keys and rate limits (wheel.node._limits) ---------------------

    async def set_limit(self, limit: LimitRecord) -> LimitView:
        return await self._limits.put(limit)

    async def list_limits(self, tenant: str | None) -> list[LimitView]:
        """Every limit of ``tenant`` (None: of all), with the claims of its
        key waiting here."""
        return await self._limits.read(tenant)

    async def delete_limit(self, tenant: str, key: str) -> int:
        return await self._limits.delete(tenant, key)

    async def known_limits(self, wanted: set[tuple[str, str]]) -> set[tuple[str, str]]:
        """Of ``wanted`` (tenant, key), those with a limit defined."""
        return await self._limits.known(wanted)

    def release_returned(
        self, worker_id: str, runs: Sequence[tuple[int, int]], *, acked_only: bool = False
    ) -> None:
        """Give back the permits of runs whose handlers returned on
        ``worker_id`` while their completions cannot reach their owner; in
        the background, answering nothing (``Limits.release_returned``)."""
        self._limits.release_returned(worker_id, runs, acked_only=acked_only)

    def limit_waiting(self) -> dict[tuple[str, str], int]:
        """Claims waiting for a permit here, by (tenant, key)."""
        return self._limits.waiting()

    def limit_census(self) -> tuple[list[LimitRecord], dict[tuple[str, str], int]]:
        """The limits as this node last read them (about every second), and
        the claims of each key waiting here."""
        return self._limits.census()

    async def admit_submits(self, tenants: Sequence[str]) -> list[ResourceExhausted | None]:
        """For each submit (by its tenant, in order): None when it may go on,
        or the quota it is over (see ``Tenancy.admit_submits``)."""
        return await self._tenancy.admit_submits(tenants)

    def submits_done(self, tenants: Sequence[str]) -> None:
        """Give back the places ``admit_submits`` held for these submits."""
        self._tenancy.submits_done(tenants)

    # -- reads (wheel.node._reads) ----------------------------------------------

    def now_ms(self) -> int:
        return self._reads.now_ms()

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
        return await self._reads.list_jobs(
            tenant=tenant,
            state=state,
            after_job_id=after_job_id,
            limit=limit,
            name_prefix=name_prefix,
            after_name=after_name,
        )

    async def get_run(self, run_id: int) -> ExecutionRecord:
        """Raises ``NotFound``."""
        return await self._reads.get_run(run_id)

    async def list_runs(
        self, job_id: int, *, before_run_id: int | None = None, limit: int
    ) -> list[ExecutionRecord]:
        return await self._reads.list_runs(job_id, before_run_id=before_run_id, limit=limit)

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
        first (see ``Reads.list_history``)."""
        return await self._reads.list_history(
            job_id,
            before_run_id=before_run_id,
            before_scheduled_for=before_scheduled_for,
            limit=limit,
            runs=runs,
            missed=missed,
        )

    # -- the console's aggregates (wheel.node._overview) ---------------------------

    async def run_overview(
        self, *, tenant: str | None, window_ms: int, bucket_ms: int
    ) -> RunOverview:
        """Jobs by state and runs by bucket and outcome over the window
        ending now (``tenant=None``: every tenant's)."""
        return await self._overview.run_overview(
            tenant=tenant, window_ms=window_ms, bucket_ms=bucket_ms
        )

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
        """Runs of every job, newest first (see ``OverviewStore.recent_runs``)."""
        return await self._overview.recent_runs(
            tenant=tenant,
            outcome=outcome,
            handler=handler,
            job_name=job_name,
            before_run_id=before_run_id,
            limit=limit,
        )

    async def job_history(self, job_id: int, *, fires: int, window_ms: int) -> JobHistory:
        """A job's last ``fires`` fires and its runs ended over the window."""
        return await self._overview.job_history(job_id, fires=fires, window_ms=window_ms)

    def status(self, *, percentiles: bool = True) -> NodeStatus:
        """The node's view of itself (see ``Reads.status``)."""
        return self._reads.status(percentiles=percentiles)

    def in_flight(self, limit: int) -> tuple[list[InFlightRun], int]:
        """Up to ``limit`` of the runs the owner holds, by run id, and how
        many it holds in all."""
        return self._reads.in_flight(limit)

    def lag_percentiles(self) -> tuple[float, float]:
        return self._reads.lag_percentiles()

    # -- the cluster (wheel.node._membership) --------------------------------------

    def route(self, job_id: int) -> str | None:
        """Where a call that changes the job must run: None here, else the
        owner's address (see ``ClusterView.route``)."""
        return self._view.route(job_id)

    def owners_of(self, job_ids: Sequence[int]) -> dict[str, list[int]]:
        """The jobs held by other members, by their owner's address."""
        return self._view.owners_of(job_ids)

    def jobs_changed(self, job_ids: Iterable[int]) -> None:
        """Another member stored or changed these jobs: read them now."""
        self._view.jobs_changed(job_ids)

    def members(self) -> list[Member]:
        """The cluster's live members (this node alone without a cluster)."""
        return self._view.members()

    def membership(self) -> Membership:
        """The cluster as this node sees it: what workers route runs by."""
        return self._view.membership()

    def run_home(self, job_id: int) -> Member | None:
        """Where a worker reports a run of ``job_id`` (see
        ``ClusterView.run_home``)."""
        return self._view.run_home(job_id)

    def shard_owners(self) -> dict[int, str]:
        """Shard -> the node id holding it, as last seen."""
        return self._view.shard_owners()
