"""The store's roles for operating it (``wheel.store.base.Store`` is all the
roles in one): the audit trail (``AuditStore``), calendars
(``CalendarStore``), jobs' trace contexts (``TraceStore``), concurrency
keys and rate limits (``LimitStore``) and the console's aggregates
(``OverviewStore``), with the records they take and give."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from wheel.engine.model import JobState, RunState
from wheel.engine.records import ExecutionRecord

__all__ = [
    "AuditEntry",
    "AuditStore",
    "CalendarRecord",
    "CalendarStore",
    "FeedPage",
    "FeedRun",
    "FireMark",
    "LimitRecord",
    "LimitStore",
    "OutcomeCount",
    "OverviewStore",
    "RunStats",
    "TraceStore",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditEntry:
    """One administrative change as the audit trail keeps it: when (epoch
    ms), who (``actor``: ``token ID`` with auth on, else empty), for which
    tenant (the change's, or the caller's where the change is not a
    tenant's), from which address, what (``action``: the API call, such as
    ``PauseJob``), on what (``job_id`` where a job, ``target`` a short
    name: ``job 12``, ``token t_ab12``, ``secret stripe``), and the change's
    details as a JSON object (never a secret's value). ``entry_id`` is the
    store's, 0 before it is written."""

    at_ms: int
    actor: str
    tenant: str
    address: str
    action: str
    target: str
    details: str = "{}"
    job_id: int | None = None
    entry_id: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CalendarRecord:
    """A calendar as the store keeps it: its days as JSON (``body``, what
    ``wheel.engine.calendars.Calendar.to_json`` writes), a version that
    counts its changes from 1, and when it last changed (epoch ms)."""

    tenant: str
    name: str
    body: str
    version: int
    updated_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitRecord:
    """A concurrency key's limits and its permits as the store keeps them
    (``wheel.store._limits``): at most ``max_concurrent`` runs in flight
    (0: no such limit) and at most ``rate`` starts per ``rate_period_ms``
    with ``burst`` at once (``rate`` 0: no rate limit). ``in_flight``: its
    runs dispatched or running now; ``tokens``: starts the bucket holds now."""

    tenant: str
    key: str
    max_concurrent: int = 0
    rate: int = 0
    rate_period_ms: int = 1000
    burst: int = 0
    in_flight: int = 0
    tokens: float = 0.0
    updated_at_ms: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class OutcomeCount:
    """How many runs ended with one outcome (or fires were recorded missed)
    in one time bucket: ``bucket_ms`` is the bucket's start, a multiple of
    its width; ``outcome`` a terminal ``RunState`` value or ``"missed"``."""

    bucket_ms: int
    outcome: str
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedRun:
    """A run as the feed of recent runs across jobs shows it: with the
    tenant, name and handler of its job."""

    run: ExecutionRecord
    tenant: str
    job_name: str
    handler: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedPage:
    """A page of the feed: its runs, newest first, and where the next page
    starts (``next_before``, a run id to pass as ``before_run_id``; None:
    no run is older). A page looks at a bounded range of run ids, so it may
    hold fewer runs than asked (even none) while older ones remain."""

    runs: list[FeedRun]
    next_before: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class FireMark:
    """One fire of a job as its history strip shows it: the latest attempt's
    run state, or ``"missed"`` with the reason as ``detail`` (a run's
    ``detail`` is its error, if any)."""

    scheduled_for: int
    outcome: str
    attempt: int
    run_id: int | None
    detail: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStats:
    """A job's runs that ended in a window: how many, how many succeeded,
    and the 50th and 99th percentile of their durations (None: no run with
    a known start ended)."""

    runs: int
    succeeded: int
    p50_ms: int | None
    p99_ms: int | None


class AuditStore(Protocol):
    """The audit trail: administrative changes, newest first, kept until
    the retention policy's horizon."""

    def record_audit(self, entries: Sequence[AuditEntry]) -> None:
        """Append the entries (their ``entry_id`` is ignored)."""

    def list_audit(
        self,
        *,
        since_ms: int | None = None,
        job_id: int | None = None,
        tenant: str | None = None,
        before_id: int | None = None,
        limit: int = 100,
    ) -> list[AuditEntry]:
        """Newest first: those at or after ``since_ms``, of ``job_id``, of
        ``tenant``, with an id below ``before_id`` (a page's continuation)."""

    def purge_audit(self, before_ms: int) -> int:
        """Delete the entries older than the cutoff; how many went."""


class CalendarStore(Protocol):
    """Calendars (days jobs skip), by tenant and name."""

    def set_calendar(self, tenant: str, name: str, body: str, now_ms: int) -> CalendarRecord:
        """Create the calendar (version 1) or replace its days (the version
        after the one it had)."""

    def get_calendar(self, tenant: str, name: str) -> CalendarRecord | None: ...

    def list_calendars(self, tenant: str | None = None) -> list[CalendarRecord]:
        """Every calendar of ``tenant`` (None: of every tenant), by tenant and name."""

    def delete_calendar(self, tenant: str, name: str) -> bool:
        """Delete the calendar; whether there was one."""


class TraceStore(Protocol):
    """The trace context of the API call that last submitted or updated each
    job (``wheel.tracing``; written only with tracing on)."""

    def record_job_traces(self, traces: Sequence[tuple[int, str]], now_ms: int) -> None:
        """Set each (job id, traceparent), replacing the one before."""

    def job_traces(self, job_ids: Sequence[int]) -> dict[int, str]:
        """The traceparent of each of ``job_ids`` that has one."""


class LimitStore(Protocol):
    """Concurrency keys and rate limits, by tenant and key. The permits
    themselves are taken by claims and given back by run endings
    (rule 8); these calls manage the limits."""

    def set_limit(self, limit: LimitRecord, now_ms: int) -> LimitRecord:
        """Create the key's limit or replace its limits (``in_flight`` and
        ``tokens`` of ``limit`` are ignored): its runs in flight are counted
        again from the runs, and a new bucket starts full."""

    def list_limits(self, tenant: str | None = None, now_ms: int = 0) -> list[LimitRecord]:
        """Every limit of ``tenant`` (None: of every tenant), by tenant and
        key; ``tokens`` as refilled up to ``now_ms``."""

    def delete_limit(self, tenant: str, key: str) -> int:
        """1 when the limit was there, else 0. Its jobs keep their key and
        run unlimited; a limit set again counts their runs in flight."""

    def recount_limits(self) -> int:
        """Count every limit's runs in flight again from the runs (a repair
        a node runs as it starts, so that no drift stays); how many limits
        it changed."""

    def release_returned(
        self, worker_id: str, runs: Sequence[tuple[int, int]], *, acked_only: bool = False
    ) -> int:
        """Give back the permits of ``runs`` (run id, fence) whose handlers
        returned on ``worker_id``, though their completions have not reached
        their owner: each run still in flight under that fence and acked by
        that worker (or by none yet, unless ``acked_only``) loses its key and
        its limit a run in flight, in one transaction; its end gives nothing
        back again. How many permits came back."""


class OverviewStore(Protocol):
    """Aggregates for the console's overview, the feed of recent runs and a
    job's history at a glance; each reads a range of an index, not every run
    (``tenant=None``: every tenant's)."""

    def count_jobs_by_state(self, tenant: str | None = None) -> dict[JobState, int]:
        """Jobs in each state (states with none are left out)."""

    def outcome_counts(
        self, *, since_ms: int, bucket_ms: int, tenant: str | None = None
    ) -> list[OutcomeCount]:
        """Runs that ended at or after ``since_ms`` by bucket of their end and
        by state, and fires recorded missed since then as ``"missed"``;
        ordered by bucket, then outcome."""

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
        """Runs of every job, newest first (by run id), with these filters:
        at most ``limit`` of those among the ``scan`` run ids below
        ``before_run_id`` (None: below every run), so that a rare filter
        costs a bounded read, never the whole history."""

    def recent_fires(self, job_id: int, limit: int = 100) -> list[FireMark]:
        """The job's last ``limit`` fires, newest first: each fire's latest
        attempt, and the fires recorded missed."""

    def run_stats(self, job_id: int, since_ms: int) -> RunStats:
        """The job's ended runs of its fires at or after ``since_ms`` (a
        fire's every attempt; a run still in flight is left out)."""
