"""What the two SQL stores share, written once: row shapes, the statements
they run alike, and the rules they apply alike.

The backends write a few things differently: PostgreSQL takes ``%s`` and
arrays, SQLite ``?`` and JSON lists; a job's change marker is a transaction
id (``xid8``) in one and an integer in the other. A ``Dialect`` holds those
fragments and ``Queries`` builds every shared statement from one. What only
one backend does (its batch writes, its submits) stays in that backend.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from wheel.engine.jobtable import NO_FIRE
from wheel.engine.model import (
    SHARD_COUNT,
    TERMINAL_RUN_STATES,
    JobState,
    MissedReason,
    RunState,
    shard_of,
)
from wheel.engine.profiles import Profile, profile_of, split_spec
from wheel.engine.records import ClaimOutcome, JobRow, NewJob, PackedRows, RowChanges
from wheel.engine.spec import JobSpec
from wheel.errors import AlreadyExists, InvalidArgument, NotFound
from wheel.store._schema import DUE_BUCKET_SHIFT, INFLIGHT_WHERE
from wheel.store.base import Completion, ExecutionRecord, JobRecord, MissedFire

Row = Sequence[Any]


class Cursor(Protocol):
    """What the shared code needs of a statement's result, in both drivers."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def fetchmany(self, size: int = 1, /) -> list[Any]: ...


class Executor(Protocol):
    """A connection or cursor inside a transaction (psycopg or sqlite3)."""

    def execute(self, sql: str, params: Any = (), /) -> Cursor: ...


# Runs a function in one read or write transaction (a backend's ``_read`` or
# ``_write``), for the parts a store is composed of.
Transaction = Callable[[Callable[[Executor], Any]], Any]


TERMINAL_SQL = "(" + ", ".join(f"'{s.value}'" for s in sorted(TERMINAL_RUN_STATES)) + ")"

# -- rows ------------------------------------------------------------------------------

JOB_FROM = "jobs AS j JOIN job_specs AS s ON s.job_id = j.job_id"
RUN_COLUMNS = (
    "run_id, job_id, scheduled_for, attempt, state, fence, worker_id,"
    " dispatched_at_ms, started_at_ms, finished_at_ms, error, result"
)
# The same, qualified for "executions AS e" in a join.
RUN_COLUMNS_E = ", ".join("e." + c.strip() for c in RUN_COLUMNS.split(","))
MISSED_COLUMNS = "job_id, scheduled_for, reason, recorded_at_ms"
# A new job's row, as ``new_job_row`` lays it out.
JOB_INSERT_COLUMNS = (
    "job_id, shard, tenant, name, state, next_run_at, one_shot, idempotency_key,"
    " created_at_ms, updated_at_ms, profile_id, sched_param, has_payload"
)
# Jobs an owner takes on from their row alone (``load_shards(packed=True)``):
# paused, or active with a next fire, and of a known profile.
PACKABLE = "j.profile_id IS NOT NULL AND (j.state = 'paused' OR j.next_run_at IS NOT NULL)"
# A job as a ``JobRow``.
ROW_COLUMNS = "j.job_id, j.state, j.next_run_at, j.profile_id, j.sched_param, j.has_payload"
PACKED_COLUMNS = (
    f"j.job_id, j.state = 'paused', COALESCE(j.next_run_at, {NO_FIRE}), j.profile_id,"
    " j.sched_param, j.has_payload"
)


@functools.lru_cache(maxsize=4096)
def _profile(template: JobSpec) -> Profile:
    return profile_of(template)


def profile_and_param(new: NewJob) -> tuple[Profile, int]:
    """A new job's profile and schedule parameter: as its caller gave them,
    or worked out from its spec."""
    if new.profile is not None:
        return new.profile, new.param
    template, param = split_spec(new.spec)
    return _profile(template), param


def new_job_row(job_id: int, new: NewJob) -> tuple[Any, ...]:
    """A new job's values for ``JOB_INSERT_COLUMNS``."""
    spec = new.spec
    profile, param = profile_and_param(new)
    return (
        job_id,
        shard_of(job_id),
        spec.tenant,
        spec.name,
        "active",
        new.next_run_at,
        spec.schedule_ends,
        new.idempotency_key,
        new.created_at_ms,
        new.created_at_ms,
        profile.profile_id,
        param,
        bool(spec.payload),
    )


def spec_text(spec: JobSpec) -> str:
    """A spec as ``job_specs.spec`` keeps it: its JSON without the payload,
    which has a column of its own."""
    if not spec.payload:
        return spec.to_json()
    return replace(spec, payload=b"").to_json()


def new_spec_text(new: NewJob) -> str:
    """``spec_text`` of a new job, from its profile's pieces when it has one."""
    if new.profile is not None:
        return new.profile.spec_json(new.spec.name, new.param)
    return spec_text(new.spec)


def spec_row(job_id: int, new: NewJob) -> tuple[int, str, bytes]:
    """A new job's ``job_specs`` values: (job_id, spec, payload)."""
    return job_id, new_spec_text(new), new.spec.payload


def new_profiles(news: Sequence[NewJob]) -> list[tuple[int, str]]:
    """The distinct (profile id, body) of a batch of submits."""
    out: dict[int, str] = {}
    for new in news:
        profile, _ = profile_and_param(new)
        out.setdefault(profile.profile_id, profile.body)
    return list(out.items())


def job_from_row(row: Row) -> JobRecord:
    """A row of ``Queries.job_columns``."""
    spec = JobSpec.from_json(row[2])
    if row[9] is not None and not spec.payload:
        spec = replace(spec, payload=bytes(row[9]))
    return JobRecord(
        job_id=row[0],
        shard=row[1],
        spec=spec,
        state=JobState(row[3]),
        next_run_at=row[4],
        created_at_ms=row[5],
        updated_at_ms=row[6],
        idempotency_key=row[7],
        change=row[8],
    )


# Packed rows are turned into Python rows, then into an array, this many at a
# time: each step holds the GIL, and a load runs beside the event loop. In
# one go, 180,000 rows held it (and stalled the loop) for 400-800 ms.
PACKED_CHUNK = 10_000


def fetch_packed(cur: Cursor) -> PackedRows:
    """A statement's rows of ``PACKED_COLUMNS`` as columns, fetched
    ``PACKED_CHUNK`` at a time."""
    tables = []
    while part := cur.fetchmany(PACKED_CHUNK):
        tables.append(np.array(part, dtype=np.int64))
    return packed_rows(np.concatenate(tables) if tables else np.empty((0, 6), dtype=np.int64))


def packed_rows(rows: Sequence[Row] | np.ndarray) -> PackedRows:
    """Rows of ``PACKED_COLUMNS`` as columns."""
    if isinstance(rows, np.ndarray):
        table = rows
    else:
        table = np.array(rows, dtype=np.int64) if rows else np.empty((0, 6), dtype=np.int64)
    return PackedRows(
        job_id=np.ascontiguousarray(table[:, 0]),
        paused=table[:, 1].astype(np.bool_),
        next_run_at=np.ascontiguousarray(table[:, 2]),
        profile_id=np.ascontiguousarray(table[:, 3]),
        param=np.ascontiguousarray(table[:, 4]),
        has_payload=table[:, 5].astype(np.bool_),
    )


def payload_of(payload: bytes | None, spec: str | None) -> bytes:
    """A payload as ``Queries.payloads`` reads it: its column, or the spec of
    a job stored before payloads had one."""
    if payload is not None:
        return bytes(payload)
    return JobSpec.from_json(spec).payload if spec is not None else b""


def run_from_row(row: Row) -> ExecutionRecord:
    return ExecutionRecord(
        run_id=row[0],
        job_id=row[1],
        scheduled_for=row[2],
        attempt=row[3],
        state=RunState(row[4]),
        fence=row[5],
        worker_id=row[6],
        dispatched_at_ms=row[7],
        started_at_ms=row[8],
        finished_at_ms=row[9],
        error=row[10],
        result=row[11],
        payload=payload_of(row[12], row[13]) if len(row) > 12 else b"",
    )


def missed_from_row(row: Row) -> MissedFire:
    return MissedFire(
        job_id=row[0], scheduled_for=row[1], reason=MissedReason(row[2]), recorded_at_ms=row[3]
    )


def prefix_end(prefix: str) -> str:
    """The least string above every string that starts with ``prefix`` (by
    code point): ``name >= prefix AND name < prefix_end(prefix)`` is the
    prefix match as an index range."""
    last = len(prefix) - 1
    while last >= 0 and prefix[last] == chr(0x10FFFF):
        last -= 1
    if last < 0:
        return chr(0x10FFFF) * (len(prefix) + 1)  # no string of code points is above
    return prefix[:last] + chr(ord(prefix[last]) + 1)


# -- statements ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Dialect:
    """The fragments one backend writes its own way. Templates take ``{expr}``
    and ``{type}`` (a list element's SQL type) through ``str.format``."""

    # A positional parameter.
    param: str
    # ``{expr}`` is one of a list of integers passed as one parameter ...
    in_ints: str
    # ... and that list as a table with one column, ``l.value``.
    int_rows: str
    # The parameter value of such a list.
    ints: Callable[[Sequence[int]], Any]
    # A job's last change through the API, and its last change of either kind
    # (an owner move may be NULL): change markers as the store keeps them.
    change: str
    last_change: str
    # A change-marker parameter as compared with those, and its value.
    marker: str
    marker_value: Callable[[int], Any]
    # ``{expr}`` is none of a list of change markers passed as one parameter,
    # and that parameter's value.
    not_in_markers: str
    markers: Callable[[Collection[int]], Any]
    # A change marker as an integer.
    as_int: str
    # The job's name as ``jobs_name`` orders it: by code point, so that a
    # prefix is a range of the index whatever the database's collation.
    name_order: str
    # The job's state as a filter beside another (a tenant, a name prefix)
    # whose index gives the page's order: SQLite, which plans by rules, is
    # kept off ``jobs_state`` (it read a state's every job and sorted them);
    # PostgreSQL plans by its statistics.
    state_beside: str = "j.state"
    # The handler of the spec ``s`` (``job_specs AS s``), read from its JSON.
    spec_handler: str = "json_extract(s.spec, '$.handler')"
    # The spec ``s``'s text holds a parameter's text (a test as cheap as a
    # search of the bytes, where reading the JSON parses it).
    spec_holds: str = "instr(s.spec, ?) > 0"


class Queries:
    """The statements both SQL stores run alike, built from one dialect."""

    def __init__(self, d: Dialect) -> None:
        self.dialect = d
        p = d.param
        self.shards_in = d.in_ints.format(expr="j.shard", type="int2")
        self.job_columns = (
            "j.job_id, j.shard, s.spec, j.state, j.next_run_at, j.created_at_ms,"
            f" j.updated_at_ms, j.idempotency_key, {d.as_int.format(expr=d.change)}, s.payload"
        )
        jobs = f"SELECT {self.job_columns} FROM {JOB_FROM}"
        self.get_job = f"{jobs} WHERE j.job_id = {p}"
        self.jobs_by_id = f"{jobs} WHERE {d.in_ints.format(expr='j.job_id', type='int8')}"
        live = "j.state IN ('active', 'paused')"
        self.live_jobs = f"{jobs} WHERE {live} ORDER BY j.job_id"
        self.live_jobs_of_shards = f"{jobs} WHERE {live} AND {self.shards_in} ORDER BY j.job_id"
        # ``load_shards(packed=True)``: the packable jobs as integers, the
        # rest parsed, and every profile. The shard filter is left out when
        # all are asked for (one node): a scan in id order is the fastest.
        packed = f"SELECT {PACKED_COLUMNS} FROM jobs AS j WHERE {live} AND {PACKABLE}"
        self.packed_jobs = f"{packed} ORDER BY j.job_id"
        self.packed_jobs_of_shards = f"{packed} AND {self.shards_in} ORDER BY j.job_id"
        # A gain due first (parameters: the bound's due bucket, the bound,
        # the shards): the rows due by the bound, through the due bucket's
        # index, then the others.
        self.packed_due_of_shards = (
            f"{packed} AND j.state = 'active' AND j.due_bucket <= {p} AND j.next_run_at <= {p}"
            f" AND {self.shards_in} ORDER BY j.job_id"
        )
        self.packed_later_of_shards = (
            f"{packed} AND (j.state = 'paused' OR j.next_run_at > {p}) AND {self.shards_in}"
            " ORDER BY j.job_id"
        )
        unpacked = f"{jobs} WHERE {live} AND NOT ({PACKABLE})"
        self.unpacked_jobs = f"{unpacked} ORDER BY j.job_id"
        self.unpacked_jobs_of_shards = f"{unpacked} AND {self.shards_in} ORDER BY j.job_id"
        # The same for a gain due first, through the indexes of jobs without
        # a profile and of active jobs by due bucket (NULL: no next fire).
        self.unpacked_due_of_shards = (
            f"{jobs} WHERE {self.shards_in} AND (j.profile_id IS NULL AND {live}"
            " OR j.state = 'active' AND j.due_bucket IS NULL) ORDER BY j.job_id"
        )
        self.profiles = "SELECT profile_id, body FROM job_profiles"
        self.profiles_by_id = (
            "SELECT profile_id, body FROM job_profiles"
            f" WHERE {d.in_ints.format(expr='profile_id', type='int8')}"
        )
        # Jobs as rows (``job_rows``), by id.
        self.job_rows = (
            f"SELECT {ROW_COLUMNS} FROM jobs AS j"
            f" WHERE {d.in_ints.format(expr='j.job_id', type='int8')} ORDER BY j.job_id"
        )
        # Payloads of the jobs in the one parameter, for the claims of a batch.
        self.payloads = (
            "SELECT job_id, payload, CASE WHEN payload IS NULL THEN spec END FROM job_specs"
            f" WHERE {d.in_ints.format(expr='job_id', type='int8')}"
        )
        self.get_run = f"SELECT {RUN_COLUMNS} FROM executions WHERE run_id = {p}"
        # A job's runs newest first, read backwards along the unique key
        # (job_id, scheduled_for, attempt): a page reads its own rows, not
        # every run the job has. From the newest (parameters: the job, the
        # limit); below a run's (fire, attempt) (the job, the fire twice,
        # the attempt, the limit: the first term bounds the key range, the
        # second leaves out the fire's later attempts); the cursor run's
        # place (its id, the job).
        newest = f" ORDER BY scheduled_for DESC, attempt DESC LIMIT {p}"
        self.list_runs = f"SELECT {RUN_COLUMNS} FROM executions WHERE job_id = {p}{newest}"
        self.list_runs_below = (
            f"SELECT {RUN_COLUMNS} FROM executions WHERE job_id = {p} AND scheduled_for <= {p}"
            f" AND (scheduled_for < {p} OR attempt < {p}){newest}"
        )
        self.run_place = (
            f"SELECT scheduled_for, attempt FROM executions WHERE run_id = {p} AND job_id = {p}"
        )
        # A cursor whose run is gone (retention deleted it while the pages
        # were read): the runs claimed before it, in the same order
        # (parameters: the job, the run id, the limit).
        self.list_runs_claimed_before = (
            f"SELECT {RUN_COLUMNS} FROM executions WHERE job_id = {p} AND run_id < {p}{newest}"
        )
        self.list_missed = (
            f"SELECT {MISSED_COLUMNS} FROM missed_fires WHERE job_id = {p}"
            f" AND scheduled_for < {p} ORDER BY scheduled_for DESC LIMIT {p}"
        )
        fires_in = d.in_ints.format(expr="scheduled_for", type="int8")
        # Every attempt of some of a job's fires (parameters: the job, the
        # fire times), oldest first.
        self.runs_of_fires = (
            f"SELECT {RUN_COLUMNS} FROM executions WHERE job_id = {p} AND {fires_in}"
            " ORDER BY scheduled_for, attempt"
        )
        # Parameters: the job, its fire times, the job, its fire times.
        self.fires_exist = (
            f"SELECT scheduled_for FROM executions WHERE job_id = {p} AND {fires_in}"
            f" UNION SELECT scheduled_for FROM missed_fires WHERE job_id = {p} AND {fires_in}"
        )
        # Parameters: the owner, the shards. ``WHERE true`` tells SQLite that
        # ON CONFLICT belongs to the INSERT.
        self.acquire_epochs = (
            "INSERT INTO shard_epochs (shard, epoch, owner)"
            f" SELECT l.value, 1, {p} FROM {d.int_rows.format(type='int4')} WHERE true"
            " ON CONFLICT (shard) DO UPDATE"
            " SET epoch = shard_epochs.epoch + 1, owner = excluded.owner"
            " RETURNING shard, epoch"
        )
        # One shard at a time (parameters: shard, epoch, owner): never lowers.
        self.fence_shard = (
            f"INSERT INTO shard_epochs (shard, epoch, owner) VALUES ({p}, {p}, {p})"
            " ON CONFLICT (shard) DO UPDATE SET epoch = excluded.epoch, owner = excluded.owner"
            " WHERE shard_epochs.epoch < excluded.epoch"
        )
        self.shard_epochs = (
            "SELECT shard, epoch FROM shard_epochs"
            f" WHERE {d.in_ints.format(expr='shard', type='int4')}"
        )
        self.create_version_table = (
            "CREATE TABLE IF NOT EXISTS wheel_schema_version (version integer NOT NULL)"
        )
        self.schema_version = "SELECT max(version) FROM wheel_schema_version"
        self.record_version = f"INSERT INTO wheel_schema_version (version) VALUES ({p})"
        # A planned hand-over (parameters: the shards, the runs their owner
        # sent to a worker): the shards' runs claimed under the epoch the
        # store has for their shard (the releasing owner's own, so nothing
        # once another owner fenced it) and never sent are marked with an
        # empty worker, which the next owner sends at once.
        sent = d.in_ints.format(expr="e.run_id", type="int8")
        self.release_unsent = (
            "UPDATE executions SET worker_id = '' WHERE run_id IN ("
            " SELECT e.run_id FROM executions AS e JOIN jobs AS j ON j.job_id = e.job_id"
            " JOIN shard_epochs AS f ON f.shard = j.shard"
            f" WHERE e.state = '{RunState.DISPATCHED.value}' AND e.worker_id IS NULL"
            f" AND {self.shards_in} AND (e.fence >> 32) = f.epoch AND NOT ({sent}))"
        )
        # A new owner takes the runs marked unsent (parameter: their ids): the
        # mark goes, so that an owner after it, not knowing whether this one
        # sent them, waits for their workers instead of sending them again.
        self.take_unsent = (
            "UPDATE executions SET worker_id = NULL"
            f" WHERE {d.in_ints.format(expr='run_id', type='int8')} AND worker_id = ''"
            f" AND state = '{RunState.DISPATCHED.value}' RETURNING run_id"
        )
        # Dispatched or running executions of the shards in the one
        # parameter, with their jobs' payloads (an owner that adopts them may
        # hand them to another worker).
        self.inflight_runs = (
            f"SELECT {RUN_COLUMNS_E}, s.payload, CASE WHEN s.payload IS NULL THEN s.spec END"
            " FROM executions AS e JOIN jobs AS j ON j.job_id = e.job_id"
            " JOIN job_specs AS s ON s.job_id = e.job_id"
            f" WHERE {INFLIGHT_WHERE} AND {self.shards_in} ORDER BY e.run_id"
        )
        # Retention walks what expired and nothing else: ranges of the index
        # by end time (``executions_finished``, ``missed_fires_recorded``),
        # oldest first, each from a lower bound just past the range before,
        # so neither the rows kept nor the index entries of the rows just
        # deleted (PostgreSQL keeps them until vacuum) are read again. The
        # top of the next range of ``batch`` entries (parameters: low, the
        # cutoff, batch - 1), then what goes in it (low, high): only
        # terminal runs, a run in flight stays however old.
        self.purges = [
            (
                f"SELECT {key} FROM {table} WHERE {key} >= {p} AND {key} < {p}"
                f" ORDER BY {key} LIMIT 1 OFFSET {p}",
                f"DELETE FROM {table} WHERE {key} >= {p} AND {key} <= {p}{cond}",
            )
            for table, key, cond in (
                ("executions", "finished_at_ms", f" AND state IN {TERMINAL_SQL}"),
                ("missed_fires", "recorded_at_ms", ""),
            )
        ]

    def list_jobs(
        self,
        *,
        tenant: str | None,
        state: JobState | None,
        after_job_id: int,
        limit: int,
        name_prefix: str = "",
        after_name: str | None = None,
    ) -> tuple[str, list[Any]]:
        """Jobs by id after ``after_job_id``, filtered: the statement and its
        parameters. With ``name_prefix``: the jobs whose name starts with it,
        by (name, id) after (``after_name``, ``after_job_id``), a range of the
        ``jobs_name`` index (``None``: from the first)."""
        p = self.dialect.param
        name = self.dialect.name_order
        where: list[str] = []
        params: list[Any] = []
        if name_prefix:
            # One lower bound on the name, the cursor's when there is one: the
            # index is sought to it rather than read from the prefix's start
            # (SQLite keeps only one of two lower bounds for the range).
            low = name_prefix if after_name is None else max(name_prefix, after_name)
            where += [f"{name} >= {p}", f"{name} < {p}"]
            params += [low, prefix_end(name_prefix)]
            if after_name is not None:
                # (name, id) > (after_name, after_id), given name >= after_name.
                where.append(f"({name} > {p} OR j.job_id > {p})")
                params += [after_name, after_job_id]
            order = f"{name}, j.job_id"
        else:
            where.append(f"j.job_id > {p}")
            params.append(after_job_id)
            order = "j.job_id"
        if tenant is not None:
            where.append(f"j.tenant = {p}")
            params.append(tenant)
        if state is not None:
            beside = tenant is not None or bool(name_prefix)
            where.append(f"{self.dialect.state_beside if beside else 'j.state'} = {p}")
            params.append(state.value)
        params.append(max(0, limit))
        sql = (
            f"SELECT {self.job_columns} FROM {JOB_FROM} WHERE {' AND '.join(where)}"
            f" ORDER BY {order} LIMIT {p}"
        )
        return sql, params

    def runs_of_shards(self, where: str, index: str = "") -> str:
        """Executions (``e``) matching ``where`` whose job (``j``) is in the
        shards of the one parameter; ``index`` follows the executions alias."""
        return (
            f"SELECT {RUN_COLUMNS_E} FROM executions AS e{index}"
            f" JOIN jobs AS j ON j.job_id = e.job_id"
            f" WHERE {where} AND {self.shards_in} ORDER BY e.run_id"
        )

    def changes(self, *, owner_moves: bool, exclude: bool, rows: bool = False) -> str:
        """Jobs whose last change (of the kinds asked for) has a marker in
        ``[low, high)``, not among those left out, in marker order, the marker
        last; with ``rows``, as ``row_columns``. Parameters: low, high,
        shards, (excluded markers,) limit."""
        d = self.dialect
        last = d.last_change if owner_moves else d.change
        out = f" AND {d.not_in_markers.format(expr=last)}" if exclude else ""
        columns, source = (ROW_COLUMNS, "jobs AS j") if rows else (self.job_columns, JOB_FROM)
        return (
            f"SELECT {columns}, {d.as_int.format(expr=last)} FROM {source}"
            f" WHERE {last} >= {d.marker} AND {last} < {d.marker} AND {self.shards_in}{out}"
            f" ORDER BY {last}, j.job_id LIMIT {d.param}"
        )

    def changes_of(self, *, owner_moves: bool, rows: bool = False) -> str:
        """Jobs whose last change has exactly this marker: parameters marker, shards."""
        d = self.dialect
        last = d.last_change if owner_moves else d.change
        columns, source = (ROW_COLUMNS, "jobs AS j") if rows else (self.job_columns, JOB_FROM)
        return (
            f"SELECT {columns}, {d.as_int.format(expr=last)} FROM {source}"
            f" WHERE {last} = {d.marker} AND {self.shards_in} ORDER BY j.job_id"
        )


# -- what both stores do alike ---------------------------------------------------------


def read_payloads(cur: Executor, q: Queries, claims: Sequence[ClaimOutcome]) -> None:
    """Fill in the payloads of the won claims that ask for theirs."""
    wanted = {o.claim.job_id for o in claims if o.run_id is not None and o.claim.payload}
    if not wanted:
        return
    found = {
        int(job_id): payload_of(payload, spec)
        for job_id, payload, spec in cur.execute(
            q.payloads, (q.dialect.ints(sorted(wanted)),)
        ).fetchall()
    }
    for o in claims:
        if o.run_id is not None and o.claim.payload:
            o.payload = found.get(o.claim.job_id, b"")


def load_packed(
    cur: Executor,
    q: Queries,
    shards: Sequence[int],
    *,
    due_by: int | None = None,
    later_than: int | None = None,
) -> tuple[list[JobRecord], PackedRows, dict[int, str]]:
    """``load_shards(packed=True)``'s jobs: the rest parsed, the packable
    ones as columns, and the profiles' bodies. ``due_by``: only the
    packable rows due by then (the rest whole); ``later_than``: only the
    packable rows paused or due after it (and no rest)."""
    everything = len(shards) == SHARD_COUNT
    ints = q.dialect.ints(shards)
    if due_by is not None:
        rest = cur.execute(q.unpacked_due_of_shards, (ints,)).fetchall()
        packed = fetch_packed(
            cur.execute(q.packed_due_of_shards, (due_by >> DUE_BUCKET_SHIFT, due_by, ints))
        )
    elif later_than is not None:
        rest = []
        packed = fetch_packed(cur.execute(q.packed_later_of_shards, (later_than, ints)))
    elif everything:
        rest = cur.execute(q.unpacked_jobs).fetchall()
        packed = fetch_packed(cur.execute(q.packed_jobs))
    else:
        rest = cur.execute(q.unpacked_jobs_of_shards, (ints,)).fetchall()
        packed = fetch_packed(cur.execute(q.packed_jobs_of_shards, (ints,)))
    profiles = {int(pid): body for pid, body in cur.execute(q.profiles).fetchall()}
    return [job_from_row(r) for r in rest], packed, profiles


def get_job(cur: Executor, q: Queries, job_id: int) -> JobRecord:
    row = cur.execute(q.get_job, (job_id,)).fetchone()
    if row is None:
        raise NotFound(f"job {job_id} does not exist")
    return job_from_row(row)


def valid_shards(shards: Collection[int]) -> list[int]:
    """The shards, sorted and once each; ``InvalidArgument`` for one out of range."""
    for s in shards:
        if not 0 <= s < SHARD_COUNT:
            raise InvalidArgument("shards", f"shard {s} is outside [0, {SHARD_COUNT})")
    return sorted(set(shards))


def check_terminal(completions: Sequence[Completion]) -> None:
    for c in completions:
        if c.state not in TERMINAL_RUN_STATES:
            raise InvalidArgument("completion.state", f"{c.state} is not a terminal state")


def check_importable(news: Sequence[NewJob]) -> None:
    if any(n.idempotency_key is not None for n in news):
        raise InvalidArgument("idempotency_key", "import_jobs does not take keys")


class RunWrite(Protocol):
    """A write about one run with its fence (a start, a completion)."""

    @property
    def run_id(self) -> int: ...
    @property
    def fence(self) -> int: ...


def first_per_run(writes: Sequence[RunWrite]) -> list[int]:
    """``first_per_key`` of the writes' (run, fence): every index when no
    run repeats, as in nearly every batch, found without building a key a
    write."""
    run_ids = {w.run_id for w in writes}
    if len(run_ids) == len(writes):
        return list(range(len(writes)))
    return first_per_key([(w.run_id, w.fence) for w in writes])


def first_per_key(keys: Sequence[tuple[int, int]]) -> list[int]:
    """Indexes of the first occurrence of each (run, fence): a repeat in one
    batch is reported as not applied (the first one took the transition)."""
    seen: set[tuple[int, int]] = set()
    out = []
    for i, k in enumerate(keys):
        if k not in seen:
            seen.add(k)
            out.append(i)
    return out


def apply_migrations(
    cur: Executor, q: Queries, migrations: Sequence[tuple[int, Sequence[str]]]
) -> None:
    """The versions above the recorded one, inside the caller's transaction
    (which holds the migration lock)."""
    cur.execute(q.create_version_table)
    current = cur.execute(q.schema_version).fetchone()[0]
    for version, statements in migrations:
        if current is not None and version <= current:
            continue
        for statement in statements:
            cur.execute(statement)
        cur.execute(q.record_version, (version,))


def change_page(
    cur: Executor,
    q: Queries,
    low: int,
    high: int,
    shards: Sequence[int],
    limit: int,
    owner_moves: bool,
    exclude: Collection[int],
    *,
    rows: bool,
) -> tuple[list[Row], int]:
    """One page of the change feed: the rows of jobs whose last change (of
    the kinds asked for) has a marker in ``[low, high)`` -- as
    ``Queries.job_columns``, or ``ROW_COLUMNS`` with ``rows`` -- and the
    marker to read on from.

    Every marker below ``high`` belongs to a write that has committed or never
    will (the caller's reason to pick it), so a page that ends short moves on
    to ``high``. A full page ends on a whole write: a write that changed many
    jobs is handed out in one page, never in two that a reader could stop
    between."""
    d = q.dialect
    limit = max(1, limit)
    params = [d.marker_value(low), d.marker_value(high), d.ints(shards)]
    # Only markers of this range can matter: leave the rest out of the statement.
    exclude = [m for m in exclude if low <= m < high]
    if exclude:
        params.append(d.markers(exclude))
    found = cur.execute(
        q.changes(owner_moves=owner_moves, exclude=bool(exclude), rows=rows), [*params, limit + 1]
    ).fetchall()
    if len(found) <= limit:
        return found, high
    cut = int(found[limit][-1])
    page = [r for r in found[:limit] if int(r[-1]) < cut]
    if not page:  # one write changed more than a page: hand all of it out
        page = cur.execute(
            q.changes_of(owner_moves=owner_moves, rows=rows), [d.marker_value(cut), d.ints(shards)]
        ).fetchall()
        cut += 1
    return page, cut


def job_rows_of(cur: Executor, q: Queries, found: Sequence[Row]) -> RowChanges:
    """Rows of ``ROW_COLUMNS`` as ``JobRow`` values, the bodies of their
    profiles, and the jobs stored before profiles parsed from their spec."""
    rows: list[JobRow] = []
    older: list[int] = []
    for r in found:
        if r[3] is None:
            older.append(r[0])
        else:
            rows.append(JobRow(r[0], JobState(r[1]), r[2], r[3], r[4], bool(r[5])))
    jobs = []
    if older:
        found_older = cur.execute(q.jobs_by_id, (q.dialect.ints(older),)).fetchall()
        jobs = [job_from_row(r) for r in found_older]
    profiles: dict[int, str] = {}
    wanted = sorted({r.profile_id for r in rows})
    if wanted:
        for pid, body in cur.execute(q.profiles_by_id, (q.dialect.ints(wanted),)).fetchall():
            profiles[int(pid)] = body
    return RowChanges(rows=rows, jobs=jobs, profiles=profiles)


def purge_range(
    bound: str, delete: str, low: int, batch: int, cutoff: int, cur: Executor
) -> tuple[int, int | None]:
    """Delete what expired among the ``batch`` index entries from ``low``
    up, the range widened to hold every entry of its top's time: the rows
    deleted, and where the next range starts (None: this was the last)."""
    row = cur.execute(bound, (low, cutoff, batch - 1)).fetchone()
    if row is None:
        return cur.execute(delete, (low, cutoff - 1)).rowcount, None
    high = int(row[0])
    return cur.execute(delete, (low, high)).rowcount, high + 1


# -- submits -----------------------------------------------------------------------------


def batch_keys(news: Sequence[NewJob]) -> tuple[list[str], dict[tuple[str, str], int]]:
    """For a batch of submits: each one's body digest ("" without a key), and
    for each (tenant, key) the first submit of the batch that uses it."""
    digests = [
        (n.body_hash or body_hash(n.spec)) if n.idempotency_key is not None else "" for n in news
    ]
    first: dict[tuple[str, str], int] = {}
    for i, n in enumerate(news):
        if n.idempotency_key is not None:
            first.setdefault((n.spec.tenant, n.idempotency_key), i)
    return digests, first


def created_record(job_id: int, new: NewJob, change: int) -> JobRecord:
    """The job a submit created, as the store now has it."""
    return JobRecord(
        job_id=job_id,
        shard=shard_of(job_id),
        spec=new.spec,
        state=JobState.ACTIVE,
        next_run_at=new.next_run_at,
        created_at_ms=new.created_at_ms,
        updated_at_ms=new.created_at_ms,
        idempotency_key=new.idempotency_key,
        change=change,
    )


def key_conflict(new: NewJob) -> AlreadyExists:
    return AlreadyExists(
        f"idempotency key {new.idempotency_key!r} of tenant {new.spec.tenant!r}"
        " was used with a different request"
    )


def body_hash(spec: JobSpec) -> str:
    """What "the same request body" means for an idempotent submit: the spec."""
    return hashlib.sha256(spec.to_json().encode()).hexdigest()


def wall_ms() -> int:
    """Wall clock for bookkeeping columns only (updated_at of a schedule CAS)."""
    return time.time_ns() // 1_000_000
