"""The ``Store`` contract as an in-memory model.

``ReferenceStore`` keeps the rules of ``wheel.store.base`` with plain dicts,
one write after another, and logs what it did for the simulator's checker
(``claims_log``, ``applied``, ``moves``). The store contract suite runs
against it as a third backend beside SQLite and PostgreSQL, so the model
that the simulator and the owner tests trust cannot drift from the stores
they stand for. ``RefStore`` is the same store with the two shorthands the
simulator drives it by.

Change markers are one counter, a marker per write (SQLite's way), and the
watermark is the last marker seen.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple, overload

import numpy as np

from tests.store.reference_limits import RefLimits
from tests.store.reference_overview import OverviewModel
from wheel.engine.jobtable import NO_FIRE
from wheel.engine.model import SCHEDULE_OVER
from wheel.engine.profiles import profile_of, split_spec
from wheel.engine.spec import JobSpec
from wheel.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, WheelError
from wheel.store import base as store_base
from wheel.store._fence import stale_shards, write_checked
from wheel.store._shared import body_hash
from wheel.store._updates import check_version
from wheel.store.base import (
    SHARD_COUNT,
    TERMINAL_RUN_STATES,
    AuditEntry,
    BatchOutcome,
    CalendarRecord,
    Changes,
    ClaimOutcome,
    Completion,
    CompletionOutcome,
    ExecutionRecord,
    FireClaim,
    JobChange,
    JobRecord,
    JobState,
    LimitRecord,
    MissedFire,
    NewJob,
    PackedRows,
    RowChanges,
    RunStart,
    RunState,
    ScheduleAdvance,
    Seal,
    SecretRecord,
    ShardLoad,
    SpecUpdate,
    Submitted,
    TenantQuota,
    TokenRecord,
    Updated,
    WriteBatch,
    shard_of,
    write_in_order,
)

INFLIGHT = (RunState.DISPATCHED, RunState.RUNNING)
UNWELL = (RunState.FAILED, RunState.LOST, RunState.TIMED_OUT)


@dataclass(slots=True)
class JobRow:
    job_id: int
    spec: JobSpec
    state: JobState
    next_run_at: int | None
    created_at_ms: int
    updated_at_ms: int
    idempotency_key: str | None
    change: int  # marker of the last change through the API
    move: int | None = None  # marker of the last owner move

    def record(self) -> JobRecord:
        return JobRecord(
            job_id=self.job_id,
            shard=shard_of(self.job_id),
            spec=self.spec,
            state=self.state,
            next_run_at=self.next_run_at,
            created_at_ms=self.created_at_ms,
            updated_at_ms=self.updated_at_ms,
            idempotency_key=self.idempotency_key,
            change=self.change,
        )


@dataclass(slots=True)
class ExecRow:
    run_id: int
    job_id: int
    scheduled_for: int
    attempt: int
    state: RunState
    fence: int
    worker_id: str | None
    dispatched_at_ms: int
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    error: str | None = None
    result: str | None = None
    # The concurrency key whose permit the run holds while in flight.
    concurrency_key: str | None = None

    def record(self) -> ExecutionRecord:
        return ExecutionRecord(
            run_id=self.run_id,
            job_id=self.job_id,
            scheduled_for=self.scheduled_for,
            attempt=self.attempt,
            state=self.state,
            fence=self.fence,
            worker_id=self.worker_id,
            dispatched_at_ms=self.dispatched_at_ms,
            started_at_ms=self.started_at_ms,
            finished_at_ms=self.finished_at_ms,
            error=self.error,
            result=self.result,
        )


class LoggedClaim(NamedTuple):
    at_ms: int
    seq: int  # position in the store's write order
    claim: FireClaim
    run_id: int | None  # None: the insert lost


@dataclass(frozen=True, slots=True, kw_only=True)
class AppliedCompletion:
    at_ms: int
    seq: int  # position in the store's write order
    run_id: int
    fence: int
    state: RunState


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleMove:
    at_ms: int
    job_id: int
    old: int | None
    new: int | None
    by: str  # "claim" or "advance"


class ReferenceStore:
    """``Store`` in memory, with a log for the simulator's checker.

    ``now_ms`` is the clock of its bookkeeping columns (a schedule advance's
    ``updated_at_ms``); the simulation sets it before each call, as the real
    stores read their own clock.
    """

    def __init__(self) -> None:
        self.now_ms = 0
        self.jobs: dict[int, JobRow] = {}
        self.keys: dict[tuple[str, str], tuple[str, int]] = {}  # -> (digest, job id)
        self.execs: dict[int, ExecRow] = {}
        self.by_attempt: dict[tuple[int, int, int], int] = {}
        self.fire_fences: dict[tuple[int, int], list[int]] = defaultdict(list)
        self.missed: dict[tuple[int, int], MissedFire] = {}
        self.epochs: dict[int, int] = {}
        self.owners: dict[int, str] = {}
        self.tokens: dict[str, TokenRecord] = {}
        self.quotas: dict[str, TenantQuota] = {}
        self.secrets: dict[tuple[str, str], list[SecretRecord]] = {}
        self.audit: list[AuditEntry] = []
        self.traces: dict[int, str] = {}
        self.calendars: dict[tuple[str, str], CalendarRecord] = {}
        self.limits = RefLimits(self._in_flight)
        # Each job's recorded updates in version order, and its update keys.
        self.updates: dict[int, list[JobChange]] = defaultdict(list)
        self.update_keys: dict[tuple[int, str], tuple[str, int]] = {}  # -> (digest, version)
        self.last_change = 0
        self._next_job = 1
        self._next_run = 1
        # History for the checker.
        self.seq = 0
        self.claims_log: list[LoggedClaim] = []
        self.applied: list[AppliedCompletion] = []
        self.moves: list[ScheduleMove] = []
        # The console's aggregates, read off the dicts above.
        self.overview = OverviewModel(self.jobs, self.execs, self.missed)
        self.count_jobs_by_state = self.overview.count_jobs_by_state
        self.outcome_counts = self.overview.outcome_counts
        self.recent_runs = self.overview.recent_runs
        self.recent_fires = self.overview.recent_fires
        self.run_stats = self.overview.run_stats

    def migrate(self) -> None:
        pass

    def close(self) -> None:
        pass

    def _marker(self) -> int:
        self.last_change += 1
        return self.last_change

    @staticmethod
    def _shards(shards: Collection[int]) -> set[int]:
        for s in shards:
            if not 0 <= s < SHARD_COUNT:
                raise InvalidArgument("shards", f"shard {s} is outside [0, {SHARD_COUNT})")
        return set(shards)

    # -- jobs ---------------------------------------------------------------------

    def submit_job(self, new: NewJob) -> Submitted:
        (result,) = self.submit_jobs([new])
        if isinstance(result, WheelError):
            raise result
        return result

    def submit_jobs(self, news: Sequence[NewJob]) -> list[Submitted | WheelError]:
        out: list[Submitted | WheelError] = []
        change: int | None = None  # one marker for the write
        for new in news:
            tenant, key = new.spec.tenant, new.idempotency_key
            digest = (new.body_hash or body_hash(new.spec)) if key is not None else ""
            if key is not None and (tenant, key) in self.keys:
                held, job_id = self.keys[(tenant, key)]
                if held != digest:
                    out.append(AlreadyExists(f"idempotency key {key!r} of tenant {tenant!r}"))
                else:
                    out.append(Submitted(self.jobs[job_id].record(), False))
                continue
            if change is None:
                change = self._marker()
            job_id = self._next_job
            self._next_job += 1
            row = JobRow(
                job_id,
                new.spec,
                JobState.ACTIVE,
                new.next_run_at,
                new.created_at_ms,
                new.created_at_ms,
                key,
                change,
            )
            self.jobs[job_id] = row
            if key is not None:
                self.keys[(tenant, key)] = (digest, job_id)
            out.append(Submitted(row.record(), True))
        return out

    def get_job(self, job_id: int) -> JobRecord:
        if job_id not in self.jobs:
            raise NotFound(f"job {job_id} does not exist")
        return self.jobs[job_id].record()

    def list_jobs(
        self,
        *,
        tenant: str | None = None,
        state: JobState | None = None,
        after_job_id: int = 0,
        limit: int = 100,
        name_prefix: str = "",
        after_name: str | None = None,
    ) -> list[JobRecord]:
        rows = [
            r
            for _, r in sorted(self.jobs.items())
            if (tenant is None or r.spec.tenant == tenant)
            and (state is None or r.state is state)
            and r.spec.name.startswith(name_prefix)
        ]
        if name_prefix:
            rows.sort(key=lambda r: (r.spec.name, r.job_id))
            if after_name is not None:
                rows = [r for r in rows if (r.spec.name, r.job_id) > (after_name, after_job_id)]
        else:
            rows = [r for r in rows if r.job_id > after_job_id]
        return [r.record() for r in rows[: max(0, limit)]]

    def count_jobs(self, tenant: str) -> int:
        return sum(
            1
            for r in self.jobs.values()
            if r.spec.tenant == tenant and r.state in (JobState.ACTIVE, JobState.PAUSED)
        )

    # -- tokens and tenants ---------------------------------------------------------

    def create_token(self, token: TokenRecord) -> None:
        held = self.tokens.get(token.token_id)
        if held is not None and held != token:
            raise AlreadyExists(f"token {token.token_id} already exists")
        self.tokens[token.token_id] = token

    def get_token(self, token_id: str) -> TokenRecord:
        if token_id not in self.tokens:
            raise NotFound(f"token {token_id} does not exist")
        return self.tokens[token_id]

    def list_tokens(self) -> list[TokenRecord]:
        return sorted(self.tokens.values(), key=lambda t: (t.created_at_ms, t.token_id))

    def revoke_token(self, token_id: str, now_ms: int) -> TokenRecord:
        token = self.get_token(token_id)
        if token.revoked_at_ms is None:
            token = self.tokens[token_id] = replace(token, revoked_at_ms=now_ms)
        return token

    def set_tenant_quota(self, quota: TenantQuota) -> TenantQuota:
        self.quotas[quota.tenant] = quota
        return quota

    def list_tenant_quotas(self) -> list[TenantQuota]:
        return [self.quotas[t] for t in sorted(self.quotas)]

    def _new_secret(
        self, tenant: str, name: str, version: int, seal: Seal, now_ms: int
    ) -> SecretRecord:
        key_id, ciphertext = seal(version)
        return SecretRecord(
            tenant=tenant,
            name=name,
            version=version,
            key_id=key_id,
            ciphertext=ciphertext,
            created_at_ms=now_ms,
        )

    def set_secret(self, tenant: str, name: str, seal: Seal, now_ms: int) -> SecretRecord:
        old = self.secrets.get((tenant, name), [])
        new = self._new_secret(
            tenant, name, max((r.version for r in old), default=0) + 1, seal, now_ms
        )
        self.secrets[(tenant, name)] = [new]
        return new

    def rotate_secret(
        self, tenant: str, name: str, seal: Seal, now_ms: int, overlap_ms: int
    ) -> SecretRecord:
        old = self.secrets.get((tenant, name))
        if not old:
            raise NotFound(f"secret {name!r} of tenant {tenant!r} does not exist")
        until = now_ms + max(0, overlap_ms)
        kept = [
            replace(r, retires_at_ms=min(until, r.retires_at_ms or until))
            for r in old
            if r.signing(now_ms)
        ]
        new = self._new_secret(tenant, name, old[-1].version + 1, seal, now_ms)
        self.secrets[(tenant, name)] = [*kept, new]
        return new

    def list_secrets(self, now_ms: int, tenant: str | None = None) -> list[SecretRecord]:
        for key, versions in list(self.secrets.items()):
            self.secrets[key] = [r for r in versions if r.signing(now_ms)]
        return [
            r
            for key in sorted(self.secrets)
            if tenant is None or key[0] == tenant
            for r in self.secrets[key]
        ]

    def delete_secret(self, tenant: str, name: str) -> int:
        return len(self.secrets.pop((tenant, name), []))

    def record_audit(self, entries: Sequence[AuditEntry]) -> None:
        for e in entries:
            self.audit.append(replace(e, entry_id=len(self.audit) + 1))

    def list_audit(
        self,
        *,
        since_ms: int | None = None,
        job_id: int | None = None,
        tenant: str | None = None,
        before_id: int | None = None,
        limit: int = 100,
    ) -> list[AuditEntry]:
        return [
            e
            for e in reversed(self.audit)
            if (since_ms is None or e.at_ms >= since_ms)
            and (job_id is None or e.job_id == job_id)
            and (tenant is None or e.tenant == tenant)
            and (before_id is None or e.entry_id < before_id)
        ][: max(1, limit)]

    def record_job_traces(self, traces: Sequence[tuple[int, str]], now_ms: int) -> None:
        self.traces.update(traces)

    def job_traces(self, job_ids: Sequence[int]) -> dict[int, str]:
        return {j: self.traces[j] for j in job_ids if j in self.traces}

    def purge_audit(self, before_ms: int) -> int:
        kept = [e for e in self.audit if e.at_ms >= before_ms]
        gone = len(self.audit) - len(kept)
        self.audit = kept
        return gone

    def refresh_statistics(self) -> list[tuple[str, int]]:
        return []

    def set_calendar(self, tenant: str, name: str, body: str, now_ms: int) -> CalendarRecord:
        old = self.calendars.get((tenant, name))
        new = CalendarRecord(
            tenant=tenant,
            name=name,
            body=body,
            version=1 if old is None else old.version + 1,
            updated_at_ms=now_ms,
        )
        self.calendars[(tenant, name)] = new
        return new

    def get_calendar(self, tenant: str, name: str) -> CalendarRecord | None:
        return self.calendars.get((tenant, name))

    def list_calendars(self, tenant: str | None = None) -> list[CalendarRecord]:
        return [
            self.calendars[k] for k in sorted(self.calendars) if tenant is None or k[0] == tenant
        ]

    def delete_calendar(self, tenant: str, name: str) -> bool:
        return self.calendars.pop((tenant, name), None) is not None

    def set_job_state(
        self, job_id: int, state: JobState, *, next_run_at: int | None, now_ms: int
    ) -> JobRecord:
        if job_id not in self.jobs:
            raise NotFound(f"job {job_id} does not exist")
        row = self.jobs[job_id]
        row.state, row.next_run_at, row.updated_at_ms = state, next_run_at, now_ms
        row.change = self._marker()
        return row.record()

    def update_job(self, update: SpecUpdate, *, if_version: int | None = None) -> Updated:
        row = self.jobs.get(update.job_id)
        if row is None:
            raise NotFound(f"job {update.job_id} does not exist")
        key = update.idempotency_key
        if key is not None and (update.job_id, key) in self.update_keys:
            digest, version = self.update_keys[(update.job_id, key)]
            if digest != update.body_hash:
                raise AlreadyExists(f"idempotency key {key!r} was used with a different request")
            return Updated(row.record(), self.updates[update.job_id][version - 1], False)
        if row.state is JobState.CANCELLED:
            raise FailedPrecondition(f"job {update.job_id} is cancelled")
        check_version(update.job_id, len(self.updates[update.job_id]), if_version)
        spec = replace(update.spec, tenant=row.spec.tenant)
        change = JobChange(
            job_id=update.job_id,
            version=len(self.updates[update.job_id]) + 1,
            updated_at_ms=update.updated_at_ms,
            old_spec=replace(row.spec, payload=b""),
            new_spec=replace(spec, payload=b""),
            payload_changed=row.spec.payload != spec.payload,
            updated_by=update.updated_by,
            idempotency_key=key,
        )
        self.updates[update.job_id].append(change)
        if key is not None:
            self.update_keys[(update.job_id, key)] = (update.body_hash, change.version)
        row.spec, row.next_run_at = spec, update.next_run_at
        row.updated_at_ms = update.updated_at_ms
        row.change = self._marker()
        return Updated(row.record(), change, True)

    def list_job_updates(
        self, job_id: int, *, before_version: int | None = None, limit: int = 100
    ) -> list[JobChange]:
        out = [
            c
            for c in reversed(self.updates.get(job_id, []))
            if before_version is None or c.version < before_version
        ]
        return out[: max(0, limit)]

    def list_dead_letters(
        self,
        *,
        job_id: int | None = None,
        tenant: str | None = None,
        before_run_id: int | None = None,
        limit: int = 100,
    ) -> list[ExecutionRecord]:
        out = [
            e.record()
            for _, e in sorted(self.execs.items(), reverse=True)
            if e.state is RunState.DEAD_LETTERED
            and (job_id is None or e.job_id == job_id)
            and (tenant is None or self.jobs[e.job_id].spec.tenant == tenant)
            and (before_run_id is None or e.run_id < before_run_id)
            and not any(
                (j, f) == (e.job_id, e.scheduled_for) and a > e.attempt
                for j, f, a in self.by_attempt
            )
        ]
        return out[: max(0, limit)]

    def _cas(self, job_id: int, expected: int | None, new: int | None, by: str, move: int) -> bool:
        """The schedule compare-and-swap (seed R4)."""
        row = self.jobs.get(job_id)
        if row is None or row.next_run_at != expected:
            return False
        self.moves.append(
            ScheduleMove(at_ms=self.now_ms, job_id=job_id, old=expected, new=new, by=by)
        )
        row.next_run_at = new
        row.move = move
        return True

    # -- limits (``tests.store.reference_limits``) -------------------------------

    def set_limit(self, limit: LimitRecord, now_ms: int) -> LimitRecord:
        return self.limits.put(limit, now_ms)

    def list_limits(self, tenant: str | None = None, now_ms: int = 0) -> list[LimitRecord]:
        return self.limits.read(tenant, now_ms)

    def delete_limit(self, tenant: str, key: str) -> int:
        return self.limits.delete(tenant, key)

    def recount_limits(self) -> int:
        return self.limits.recount()

    def release_returned(
        self, worker_id: str, runs: Sequence[tuple[int, int]], *, acked_only: bool = False
    ) -> int:
        tenants = {j: row.spec.tenant for j, row in self.jobs.items()}
        whose = (worker_id,) if acked_only else (None, worker_id)
        return self.limits.release(self.execs, tenants, whose, runs, INFLIGHT)

    def _in_flight(self, k: tuple[str, str]) -> int:
        """The runs of key ``k`` (tenant, key) dispatched or running."""
        return sum(
            1
            for ex in self.execs.values()
            if ex.state in INFLIGHT
            and ex.concurrency_key == k[1]
            and ex.job_id in self.jobs
            and self.jobs[ex.job_id].spec.tenant == k[0]
        )

    # -- executions ---------------------------------------------------------------

    def claim_fires(self, claims: Sequence[FireClaim]) -> list[ClaimOutcome]:
        out: list[ClaimOutcome] = []
        move = self.last_change + 1  # the write's marker, taken if a schedule moves
        keyed = any(c.concurrency_key for c in claims)
        waiting = self.limits.waiting(claims, self.now_ms) if keyed else set()
        for i, c in enumerate(claims):
            if i in waiting:
                out.append(ClaimOutcome(claim=c, run_id=None, advanced=False, waiting=True))
                continue
            key = (c.job_id, c.scheduled_for, c.attempt)
            held = self.by_attempt.get(key)
            if held is not None:
                self.seq += 1
                self.claims_log.append(LoggedClaim(self.now_ms, self.seq, c, None))
                row = self.jobs.get(c.job_id)
                if self.execs[held].fence == c.fence:  # our own earlier write
                    moved = c.advance and row is not None and row.next_run_at == c.new_next_run_at
                    payload = row.spec.payload if c.payload and row is not None else b""
                    out.append(ClaimOutcome(claim=c, run_id=held, advanced=moved, payload=payload))
                else:
                    # Held by another run: the schedule moves past it all the same.
                    moved = c.advance and self._claim_moves(c, move)
                    out.append(ClaimOutcome(claim=c, run_id=None, advanced=moved))
                continue
            run_id = self._next_run
            self._next_run += 1
            self.by_attempt[key] = run_id
            self.execs[run_id] = ExecRow(
                run_id,
                c.job_id,
                c.scheduled_for,
                c.attempt,
                RunState.DISPATCHED,
                c.fence,
                None,
                c.dispatched_at_ms,
                concurrency_key=c.concurrency_key or None,
            )
            if c.concurrency_key:
                self.limits.take(c.tenant, c.concurrency_key, self.now_ms)
            self.fire_fences[(c.job_id, c.scheduled_for)].append(c.fence)
            self.seq += 1
            self.claims_log.append(LoggedClaim(self.now_ms, self.seq, c, run_id))
            advanced = c.advance and self._claim_moves(c, move)
            payload = self.jobs[c.job_id].spec.payload if c.payload else b""
            out.append(ClaimOutcome(claim=c, run_id=run_id, advanced=advanced, payload=payload))
        return out

    def _claim_moves(self, c: FireClaim, move: int) -> bool:
        """A claim's schedule compare-and-swap (a one-shot's, or a bounded
        schedule's, last ends the job)."""
        if not self._cas(c.job_id, c.expected_next_run_at, c.new_next_run_at, "claim", move):
            return False
        self.last_change = move
        row = self.jobs[c.job_id]
        row.updated_at_ms = max(row.updated_at_ms, c.dispatched_at_ms)
        if c.new_next_run_at is None and row.spec.schedule_ends and row.state is JobState.ACTIVE:
            row.state = JobState.RUNNING
        return True

    def write_batch(self, batch: WriteBatch) -> BatchOutcome:
        epochs = batch.epochs
        if epochs is None:
            return write_in_order(self, batch)
        stale = stale_shards(epochs, self.epochs.items())
        return write_checked(
            batch,
            stale,
            lambda run_ids: {r: self.execs[r].job_id for r in run_ids if r in self.execs},
            lambda part: write_in_order(self, part),
        )

    def advance_schedules(self, advances: Sequence[ScheduleAdvance]) -> list[bool]:
        out = []
        move = self.last_change + 1
        for a in advances:
            ok = self._cas(a.job_id, a.expected_next_run_at, a.new_next_run_at, "advance", move)
            if ok:
                self.last_change = move
                row = self.jobs[a.job_id]
                row.updated_at_ms = max(row.updated_at_ms, self.now_ms)
                if a.ends and a.new_next_run_at is None and row.state is JobState.ACTIVE:
                    # A bounded schedule moved past its last fire is over.
                    inflight = any(
                        e.job_id == a.job_id and e.state in INFLIGHT for e in self.execs.values()
                    )
                    row.state = JobState.RUNNING if inflight else JobState.COMPLETED
            out.append(ok)
        return out

    def mark_running(self, starts: Sequence[RunStart]) -> list[bool]:
        out = []
        seen: set[tuple[int, int]] = set()
        for s in starts:
            first = (s.run_id, s.fence) not in seen
            seen.add((s.run_id, s.fence))
            ex = self.execs.get(s.run_id)
            ok = ex is not None and ex.fence == s.fence and ex.state is RunState.DISPATCHED
            if ok and ex is not None:
                ex.state, ex.worker_id, ex.started_at_ms = (
                    RunState.RUNNING,
                    s.worker_id,
                    s.started_at_ms,
                )
            elif first and ex is not None and ex.fence == s.fence:
                # Our own earlier write, if the run is exactly as it left it.
                ok = ex.state is RunState.RUNNING and ex.worker_id == s.worker_id
            out.append(ok)
        return out

    def complete_runs(self, completions: Sequence[Completion]) -> list[CompletionOutcome]:
        for c in completions:
            if c.state not in TERMINAL_RUN_STATES:
                raise InvalidArgument("completion.state", f"{c.state} is not a terminal state")
        out = []
        seen: set[tuple[int, int]] = set()
        for c in completions:
            first = (c.run_id, c.fence) not in seen
            seen.add((c.run_id, c.fence))
            ex = self.execs.get(c.run_id)
            ok = (
                ex is not None
                and ex.state in INFLIGHT
                and ex.fence == c.fence
                and max(self.fire_fences[(ex.job_id, ex.scheduled_for)]) <= c.fence
            )
            if ok and ex is not None:
                job = self.jobs.get(ex.job_id)
                if ex.concurrency_key is not None and job is not None:
                    self.limits.give(job.spec.tenant, ex.concurrency_key)
                ex.state, ex.finished_at_ms, ex.error = c.state, c.finished_at_ms, c.error
                ex.result = c.result
                if c.worker_id is not None:
                    ex.worker_id = c.worker_id
                job = self.jobs.get(ex.job_id)
                if c.job_state is not None and job is not None and job.state in SCHEDULE_OVER:
                    job.state = c.job_state
                    job.updated_at_ms = max(job.updated_at_ms, c.finished_at_ms)
                if ex.started_at_ms is None:
                    ex.started_at_ms = c.started_at_ms
                self.seq += 1
                self.applied.append(
                    AppliedCompletion(
                        at_ms=self.now_ms,
                        seq=self.seq,
                        run_id=c.run_id,
                        fence=c.fence,
                        state=c.state,
                    )
                )
            elif first and ex is not None and ex.fence == c.fence:
                # Our own earlier write, if the run ended exactly so.
                ok = ex.state is c.state and ex.finished_at_ms == c.finished_at_ms
            out.append(CompletionOutcome(run_id=c.run_id, applied=ok))
        return out

    def record_missed(self, missed: Sequence[MissedFire]) -> None:
        for m in missed:
            self.missed.setdefault((m.job_id, m.scheduled_for), m)

    def get_run(self, run_id: int) -> ExecutionRecord:
        if run_id not in self.execs:
            raise NotFound(f"run {run_id} does not exist")
        return self.execs[run_id].record()

    def list_runs(
        self, job_id: int, *, before_run_id: int | None = None, limit: int = 100
    ) -> list[ExecutionRecord]:
        def place(e: ExecRow) -> tuple[int, int]:
            return e.scheduled_for, e.attempt

        runs = sorted((e for e in self.execs.values() if e.job_id == job_id), key=place)[::-1]
        cursor = self.execs.get(before_run_id) if before_run_id is not None else None
        if cursor is not None and cursor.job_id == job_id:
            runs = [e for e in runs if place(e) < place(cursor)]
        elif before_run_id is not None:  # gone: the runs claimed before it
            runs = [e for e in runs if e.run_id < before_run_id]
        return [e.record() for e in runs[: max(0, limit)]]

    def runs_of_fires(self, job_id: int, scheduled_for: Sequence[int]) -> list[ExecutionRecord]:
        fires = set(scheduled_for)
        runs = (e for e in self.execs.values() if e.job_id == job_id and e.scheduled_for in fires)
        return [e.record() for e in sorted(runs, key=lambda e: (e.scheduled_for, e.attempt))]

    def list_missed(
        self, job_id: int, *, before_scheduled_for: int | None = None, limit: int = 100
    ) -> list[MissedFire]:
        missed = [
            m
            for (j, f), m in sorted(self.missed.items(), reverse=True)
            if j == job_id and (before_scheduled_for is None or f < before_scheduled_for)
        ]
        return missed[: max(0, limit)]

    def fires_exist(self, job_id: int, scheduled_for: Sequence[int]) -> set[int]:
        return {
            f
            for f in scheduled_for
            if (job_id, f) in self.fire_fences or (job_id, f) in self.missed
        }

    # -- ownership ----------------------------------------------------------------

    def clock_ms(self) -> int:
        return self.now_ms

    def change_mark(self) -> int:
        return 0

    def acquire_epochs(self, shards: Collection[int], owner: str) -> dict[int, int]:
        wanted = self._shards(shards)
        for s in wanted:
            self.epochs[s] = self.epochs.get(s, 0) + 1
            self.owners[s] = owner
        return {s: self.epochs[s] for s in sorted(wanted)}

    def fence_shards(self, epochs: Mapping[int, int], owner: str) -> dict[int, int]:
        wanted = self._shards(epochs)
        for s in wanted:
            if self.epochs.get(s, 0) < epochs[s]:
                self.epochs[s] = epochs[s]
                self.owners[s] = owner
        return {s: self.epochs[s] for s in sorted(wanted)}

    def shard_epochs(self, shards: Collection[int]) -> dict[int, int]:
        return {s: self.epochs[s] for s in sorted(self._shards(shards)) if s in self.epochs}

    def take_unsent(self, run_ids: Collection[int]) -> set[int]:
        taken = set()
        for run_id in run_ids:
            e = self.execs.get(run_id)
            if e is not None and e.state is RunState.DISPATCHED and e.worker_id == "":
                e.worker_id = None
                taken.add(run_id)
        return taken

    def release_unsent(self, shards: Collection[int], sent: Collection[int]) -> int:
        wanted, sent = self._shards(shards), set(sent)
        marked = 0
        for e in self.execs.values():
            shard = shard_of(e.job_id)
            if (
                e.state is RunState.DISPATCHED
                and e.worker_id is None
                and shard in wanted
                and e.fence >> 32 == self.epochs.get(shard)
                and e.run_id not in sent
            ):
                e.worker_id = ""
                marked += 1
        return marked

    def load_shards(
        self,
        shards: Collection[int],
        *,
        packed: bool = False,
        due_by: int | None = None,
        later_than: int | None = None,
    ) -> ShardLoad:
        if (due_by is not None or later_than is not None) and not packed:
            raise InvalidArgument("packed", "a load in two parts is packed")
        wanted = self._shards(shards)
        live = [
            r
            for _, r in sorted(self.jobs.items())
            if r.state in (JobState.ACTIVE, JobState.PAUSED) and shard_of(r.job_id) in wanted
        ]

        # As the stores do: what the row alone arms comes packed.
        def armed_by_row(r: JobRow) -> bool:
            return packed and (r.state is JobState.PAUSED or r.next_run_at is not None)

        def due(r: JobRow) -> bool:
            return (
                r.state is JobState.ACTIVE
                and r.next_run_at is not None
                and (r.next_run_at <= (due_by if due_by is not None else r.next_run_at))
            )

        rows = [r for r in live if armed_by_row(r)]
        if due_by is not None:
            rows = [r for r in rows if due(r)]
        elif later_than is not None:
            rows = [
                r for r in rows if r.state is JobState.PAUSED or (r.next_run_at or 0) > later_than
            ]
            live = rows
        profiles = {}
        params = []
        for r in rows:
            template, param = split_spec(r.spec)
            profile = profile_of(template)
            profiles[profile.profile_id] = profile.body
            params.append((profile.profile_id, param))
        return ShardLoad(
            jobs=[r.record() for r in live if not armed_by_row(r)],
            inflight=self.inflight_runs(wanted) if later_than is None else [],
            watermark=self.last_change,
            packed=PackedRows(
                job_id=np.array([r.job_id for r in rows], dtype=np.int64),
                paused=np.array([r.state is JobState.PAUSED for r in rows], dtype=np.bool_),
                next_run_at=np.array(
                    [NO_FIRE if r.next_run_at is None else r.next_run_at for r in rows],
                    dtype=np.int64,
                ),
                profile_id=np.array([p for p, _ in params], dtype=np.int64),
                param=np.array([q for _, q in params], dtype=np.int64),
                has_payload=np.array([bool(r.spec.payload) for r in rows], dtype=np.bool_),
            )
            if packed
            else None,
            profiles=profiles,
        )

    def inflight_runs(self, shards: Collection[int]) -> list[ExecutionRecord]:
        wanted = self._shards(shards)
        return [
            replace(e.record(), payload=self.jobs[e.job_id].spec.payload)
            for _, e in sorted(self.execs.items())
            if e.state in INFLIGHT and shard_of(e.job_id) in wanted
        ]

    def retry_candidates(self, shards: Collection[int]) -> list[ExecutionRecord]:
        wanted = self._shards(shards)
        latest: dict[tuple[int, int], ExecRow] = {}
        for e in self.execs.values():
            key = (e.job_id, e.scheduled_for)
            if shard_of(e.job_id) in wanted and (
                key not in latest or e.attempt > latest[key].attempt
            ):
                latest[key] = e
        return [
            e.record()
            for e in sorted(latest.values(), key=lambda e: e.run_id)
            if e.state in UNWELL and self.jobs[e.job_id].state is not JobState.CANCELLED
        ]

    def changes_since(
        self,
        watermark: int,
        shards: Collection[int],
        limit: int = 10_000,
        *,
        owner_moves: bool = True,
        exclude: Collection[int] = (),
    ) -> Changes:
        wanted = self._shards(shards)
        left_out = set(exclude)
        by_marker: dict[int, list[JobRow]] = defaultdict(list)
        for _, r in sorted(self.jobs.items()):
            marker = max(r.change, r.move or 0) if owner_moves else r.change
            if marker > watermark and marker not in left_out and shard_of(r.job_id) in wanted:
                by_marker[marker].append(r)
        page: list[JobRow] = []
        for marker in sorted(by_marker):
            # Whole writes only; one larger than a page comes alone.
            if page and len(page) + len(by_marker[marker]) > max(1, limit):
                return Changes([r.record() for r in page], marker - 1)
            page += by_marker[marker]
        return Changes([r.record() for r in page], max(self.last_change, watermark))

    def changed_rows(
        self,
        watermark: int,
        shards: Collection[int],
        limit: int = 10_000,
        *,
        owner_moves: bool = True,
        exclude: Collection[int] = (),
    ) -> RowChanges:
        page, mark = self.changes_since(
            watermark, shards, limit, owner_moves=owner_moves, exclude=exclude
        )
        return replace(_as_rows(page), watermark=mark)

    def job_rows(self, job_ids: Collection[int]) -> RowChanges:
        return _as_rows([self.jobs[j].record() for j in sorted(set(job_ids)) if j in self.jobs])

    # -- retention ----------------------------------------------------------------

    def purge_history(self, finished_before_ms: int, batch: int = 10_000) -> int:
        return sum(self.purge_steps(finished_before_ms, batch))

    def purge_steps(self, finished_before_ms: int, batch: int = 1_000) -> Iterator[int]:
        batch = max(1, batch)
        old_runs = [
            e
            for e in self.execs.values()
            if e.state in TERMINAL_RUN_STATES
            and e.finished_at_ms is not None
            and e.finished_at_ms < finished_before_ms
        ]
        for i in range(0, len(old_runs), batch):
            for e in old_runs[i : i + batch]:
                del self.execs[e.run_id]
                del self.by_attempt[(e.job_id, e.scheduled_for, e.attempt)]
                self.fire_fences[(e.job_id, e.scheduled_for)].remove(e.fence)
                if not self.fire_fences[(e.job_id, e.scheduled_for)]:
                    del self.fire_fences[(e.job_id, e.scheduled_for)]
            yield len(old_runs[i : i + batch])
        old_missed = [k for k, m in self.missed.items() if m.recorded_at_ms < finished_before_ms]
        for i in range(0, len(old_missed), batch):
            for k in old_missed[i : i + batch]:
                del self.missed[k]
            yield len(old_missed[i : i + batch])

    def ping(self) -> None:
        """In memory: always answers."""


def _as_rows(records: Sequence[JobRecord]) -> RowChanges:
    """Jobs as the SQL stores give them as rows: every one has a profile."""
    rows, profiles = [], {}
    for r in records:
        template, param = split_spec(r.spec)
        profile = profile_of(template)
        profiles[profile.profile_id] = profile.body
        rows.append(
            store_base.JobRow(
                r.job_id, r.state, r.next_run_at, profile.profile_id, param, bool(r.spec.payload)
            )
        )
    return RowChanges(rows=rows, jobs=[], profiles=profiles)


class RefStore(ReferenceStore):
    """The reference store as the simulator drives it: a submit is a spec
    with its time and first fire, answered with the job, and the epochs are
    the simulated node's."""

    @overload
    def submit_job(self, new: NewJob) -> Submitted: ...

    @overload
    def submit_job(self, new: JobSpec, now_ms: int, next_run_at: int | None) -> JobRecord: ...

    def submit_job(
        self, new: NewJob | JobSpec, now_ms: int = 0, next_run_at: int | None = None
    ) -> Submitted | JobRecord:
        if isinstance(new, NewJob):
            return super().submit_job(new)
        return (
            super().submit_job(NewJob(spec=new, created_at_ms=now_ms, next_run_at=next_run_at)).job
        )

    def acquire_epochs(self, shards: Collection[int], owner: str = "sim") -> dict[int, int]:
        return super().acquire_epochs(shards, owner)
