"""Spec updates and dead letters, alike on both SQL stores: each function
runs inside the caller's transaction, with the statements of its dialect.

An update is one transaction: the job's row (next fire, profile, schedule
parameter), its spec and payload, and a row of its history in
``job_updates``, with the change marker of the write on the job, so that an
owner reading the change feed gets the new schedule and spec together."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from wheel.engine.profiles import Profile, split_spec
from wheel.engine.records import JobChange, SpecUpdate, Updated
from wheel.engine.spec import JobSpec
from wheel.errors import AlreadyExists, FailedPrecondition
from wheel.http_targets import body_of, history_spec
from wheel.store._shared import (
    RUN_COLUMNS_E,
    Executor,
    Queries,
    Row,
    _profile,
    get_job,
    run_from_row,
    spec_text,
)
from wheel.store.base import ExecutionRecord, JobState

CHANGE_COLUMNS = (
    "job_id, version, updated_at_ms, old_spec, new_spec, payload_changed, updated_by,"
    " idempotency_key"
)


class UpdateSQL:
    """The statements of updates and dead letters in one dialect."""

    def __init__(self, q: Queries, *, lock_job: str | None) -> None:
        p = q.dialect.param
        self.queries = q
        # PostgreSQL: the job's row locked first, so two updates of one job
        # take their versions one after the other.
        self.lock_job = lock_job
        self.by_key = (
            f"SELECT version, body_hash FROM job_updates WHERE job_id = {p}"
            f" AND idempotency_key = {p}"
        )
        self.last_version = f"SELECT coalesce(max(version), 0) FROM job_updates WHERE job_id = {p}"
        self.change = (
            f"SELECT {CHANGE_COLUMNS} FROM job_updates WHERE job_id = {p} AND version = {p}"
        )
        self.insert_profile = (
            f"INSERT INTO job_profiles (profile_id, body) VALUES ({p}, {p}) ON CONFLICT DO NOTHING"
        )
        # ``{stamp}``: the dialect's change marker of the write.
        self.update_job = (
            f"UPDATE jobs SET name = {p}, next_run_at = {p}, one_shot = {p}, profile_id = {p},"
            f" sched_param = {p}, has_payload = {p}, updated_at_ms = {p}, {{stamp}}"
            f" WHERE job_id = {p}"
        )
        self.update_spec = f"UPDATE job_specs SET spec = {p}, payload = {p} WHERE job_id = {p}"
        self.insert_change = (
            f"INSERT INTO job_updates ({CHANGE_COLUMNS}, body_hash)"
            f" VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})"
        )
        self.list_changes = (
            f"SELECT {CHANGE_COLUMNS} FROM job_updates WHERE job_id = {p} AND version < {p}"
            f" ORDER BY version DESC LIMIT {p}"
        )
        # Dead letters with no later attempt of their fire: not redriven.
        not_redriven = (
            "NOT EXISTS (SELECT 1 FROM executions AS n WHERE n.job_id = e.job_id"
            " AND n.scheduled_for = e.scheduled_for AND n.attempt > e.attempt)"
        )
        dead = "e.state = 'dead_lettered'"
        self.dead_of_job = (
            f"SELECT {RUN_COLUMNS_E} FROM executions AS e WHERE {dead} AND e.job_id = {p}"
            f" AND e.run_id < {p} AND {not_redriven} ORDER BY e.run_id DESC LIMIT {p}"
        )
        self.dead_of_all = (
            f"SELECT {RUN_COLUMNS_E} FROM executions AS e WHERE {dead}"
            f" AND e.run_id < {p} AND {not_redriven} ORDER BY e.run_id DESC LIMIT {p}"
        )
        self.dead_of_tenant = (
            f"SELECT {RUN_COLUMNS_E} FROM executions AS e JOIN jobs AS j ON j.job_id = e.job_id"
            f" WHERE {dead} AND j.tenant = {p} AND e.run_id < {p} AND {not_redriven}"
            f" ORDER BY e.run_id DESC LIMIT {p}"
        )


def profile_of_update(update: SpecUpdate) -> tuple[Profile, int]:
    """An update's profile and schedule parameter: as its caller gave them,
    or worked out from its spec."""
    if update.profile is not None:
        return update.profile, update.param
    template, param = split_spec(update.spec)
    return _profile(template), param


def change_from_row(row: Row) -> JobChange:
    return JobChange(
        job_id=int(row[0]),
        version=int(row[1]),
        updated_at_ms=int(row[2]),
        old_spec=JobSpec.from_json(row[3]),
        new_spec=JobSpec.from_json(row[4]),
        payload_changed=bool(row[5]),
        updated_by=row[6],
        idempotency_key=row[7],
    )


def check_version(job_id: int, newest: int, if_version: int | None) -> None:
    """Refuse an update made on the condition that the job's newest update
    is ``if_version`` when it is another (``newest``)."""
    if if_version is not None and newest != if_version:
        raise FailedPrecondition(
            f"if_version: job {job_id} was updated since (its newest update is version"
            f" {newest}, not {if_version}): read it again"
        )


def update_job(
    cur: Executor,
    sql: UpdateSQL,
    update: SpecUpdate,
    stamp: Callable[[Executor], tuple[str, tuple[Any, ...]]],
    if_version: int | None = None,
) -> Updated:
    """``Store.update_job`` in the caller's write transaction. ``stamp``
    gives the SET clause of the write's change marker and its parameters."""
    q = sql.queries
    job_id = update.job_id
    if sql.lock_job is not None:
        cur.execute(sql.lock_job, (job_id,))
    before = get_job(cur, q, job_id)  # NotFound
    key = update.idempotency_key
    if key is not None:
        held = cur.execute(sql.by_key, (job_id, key)).fetchone()
        if held is not None:
            if held[1] != update.body_hash:
                raise AlreadyExists(
                    f"idempotency key {key!r} of job {job_id} was used with a different request"
                )
            row = cur.execute(sql.change, (job_id, int(held[0]))).fetchone()
            return Updated(before, change_from_row(row), False)
    if before.state is JobState.CANCELLED:
        raise FailedPrecondition(f"job {job_id} is cancelled")
    spec = replace(update.spec, tenant=before.spec.tenant)
    version = int(cur.execute(sql.last_version, (job_id,)).fetchone()[0]) + 1
    check_version(job_id, version - 1, if_version)
    profile, param = profile_of_update(update)
    cur.execute(sql.insert_profile, (profile.profile_id, profile.body))
    clause, marker = stamp(cur)
    cur.execute(
        sql.update_job.format(stamp=clause),
        (
            spec.name,
            update.next_run_at,
            spec.schedule_ends,
            profile.profile_id,
            param,
            bool(spec.payload),
            update.updated_at_ms,
            *marker,
            job_id,
        ),
    )
    new_text = spec_text(spec)
    cur.execute(sql.update_spec, (new_text, spec.payload, job_id))
    change = JobChange(
        job_id=job_id,
        version=version,
        updated_at_ms=update.updated_at_ms,
        old_spec=history_spec(before.spec),
        new_spec=history_spec(spec),
        payload_changed=body_of(before.spec) != body_of(spec),
        updated_by=update.updated_by,
        idempotency_key=key,
    )
    cur.execute(
        sql.insert_change,
        (
            job_id,
            version,
            update.updated_at_ms,
            change.old_spec.to_json(),
            change.new_spec.to_json(),
            change.payload_changed,
            update.updated_by,
            key,
            update.body_hash,
        ),
    )
    return Updated(get_job(cur, q, job_id), change, True)


def list_updates(
    cur: Executor, sql: UpdateSQL, job_id: int, before_version: int | None, limit: int
) -> list[JobChange]:
    before = before_version if before_version is not None else 2**31 - 1
    rows = cur.execute(sql.list_changes, (job_id, before, max(0, limit))).fetchall()
    return [change_from_row(r) for r in rows]


def dead_letters(
    cur: Executor,
    sql: UpdateSQL,
    job_id: int | None,
    tenant: str | None,
    before_run_id: int | None,
    limit: int,
) -> list[ExecutionRecord]:
    before = before_run_id if before_run_id is not None else 2**63 - 1
    n = max(0, limit)
    if job_id is not None:
        rows = cur.execute(sql.dead_of_job, (job_id, before, n)).fetchall()
    elif tenant is not None:
        rows = cur.execute(sql.dead_of_tenant, (tenant, before, n)).fetchall()
    else:
        rows = cur.execute(sql.dead_of_all, (before, n)).fetchall()
    return [run_from_row(r) for r in rows]
