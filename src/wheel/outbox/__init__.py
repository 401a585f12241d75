"""Submit a job inside the application's own PostgreSQL transaction.

``submit(conn, **job)`` takes the keywords of ``wheel.client.Client.submit``
and inserts the request into the ``wheel_outbox`` table in the transaction
``conn`` is in: the job exists if and only if that transaction commits. A
node's relay (``wheelctl serve --outbox-dsn``) is woken by the insert's
NOTIFY, claims the row, creates the job under the row's idempotency key (so
a row picked up twice, after a crash, still makes one job) and records the
row's fate in it: ``fate(conn, entry.id)``.

``conn`` is a psycopg 3 ``Connection`` (``submit`` returns the entry), a
psycopg 3 ``AsyncConnection`` (``submit`` returns an awaitable of it) or a
SQLAlchemy ``Session`` or ``Connection`` (SQLAlchemy is imported only when
one is given). Create the table with ``create_table(conn)`` or ``wheelctl
outbox init --dsn ...``; wheel's own PostgreSQL store has it already.

What the request resolves here, with this host's clock: an ``at=`` given as
a ``timedelta``. An ``every=`` without ``start=`` is placed when the relay
picks the row up, as a node places one it receives.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Unpack, overload

from wheel.client._specs import JobArgs, JobRequest, job_spec, request_of
from wheel.errors import InvalidArgument, NotFound
from wheel.rpc import convert
from wheel.rpc._common import MAX_IDEMPOTENCY_KEY
from wheel.store import outbox_sql as sql

if TYPE_CHECKING:
    import psycopg
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.orm import Session

__all__ = [
    "OutboxEntry",
    "OutboxFate",
    "OutboxStatus",
    "create_table",
    "fate",
    "generated_key",
    "status",
    "submit",
    "submit_many",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxEntry:
    """A submit request in the outbox: its row and the key its job is made under."""

    id: int
    idempotency_key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxFate:
    """What became of a row: ``pending`` (``error``: the last failure that
    passes, tried again), ``done`` (``job_id``) or ``failed`` (``error_code``,
    a gRPC status name, and ``error``; no job was made)."""

    id: int
    state: str
    job_id: int | None
    error_code: str | None
    error: str | None
    attempts: int
    # The node that wrote the fate (None: no pick-up yet).
    relayed_by: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxStatus:
    """The backlog: rows not yet jobs, the oldest one's age, those of them
    whose last pick-up failed for a passing reason, and the failed rows."""

    pending: int
    oldest_pending_s: float
    retrying: int
    failed: int


def generated_key() -> str:
    """A key for a row given none: 128 random bits."""
    return f"wheel-outbox-{secrets.token_hex(16)}"


def row_of(
    job: JobRequest | Mapping[str, Any], *, now_ms: int | None = None
) -> tuple[str, str, str, str]:
    """(tenant, idempotency key, spec JSON, body hash) of a request, checked the way
    ``Client.submit`` and the node check it: a bad one raises
    ``InvalidArgument`` naming the keyword, here, in the caller's
    transaction, not later in the row."""
    request = request_of(job)
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    spec = job_spec(request, now_ms=now)
    spec.validate()
    # The body hash a node gives a Client.submit of this request: the same key
    # and request through either path name one job.
    wire = convert.spec_to_proto(spec).SerializeToString(deterministic=True)
    key = request.idempotency_key or generated_key()
    if not isinstance(key, str) or len(key) > MAX_IDEMPOTENCY_KEY:
        raise InvalidArgument(
            "idempotency_key", f"must be a string of at most {MAX_IDEMPOTENCY_KEY} characters"
        )
    return spec.tenant, key, spec.to_json(), hashlib.sha256(wire).hexdigest()


_SA_INSERT = (
    "INSERT INTO wheel_outbox (tenant, idempotency_key, spec, body_hash)"
    " VALUES (:tenant, :key, :spec, :hash) RETURNING id"
)
_FATE = (
    "SELECT id, state, job_id, error_code, error, attempts, relayed_by FROM wheel_outbox"
    " WHERE id = %s"
)


def _is_async(conn: object) -> bool:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is a dependency of wheel
        return False
    return isinstance(conn, psycopg.AsyncConnection)


def _is_psycopg(conn: object) -> bool:
    import psycopg

    return isinstance(conn, psycopg.Connection)


def _sa_execute(conn: Any, statement: str, params: Mapping[str, Any]) -> Any:
    if not type(conn).__module__.startswith("sqlalchemy."):
        raise InvalidArgument(
            "conn",
            "expected a psycopg Connection or AsyncConnection, or a SQLAlchemy Session or"
            f" Connection, got {type(conn).__name__}",
        )
    from sqlalchemy import text

    return conn.execute(text(statement), params)


@overload
def submit(
    conn: psycopg.AsyncConnection[Any], **job: Unpack[JobArgs]
) -> Awaitable[OutboxEntry]: ...


@overload
def submit(
    conn: psycopg.Connection[Any] | Session | SAConnection, **job: Unpack[JobArgs]
) -> OutboxEntry: ...


def submit(conn: Any, **job: Unpack[JobArgs]) -> OutboxEntry | Awaitable[OutboxEntry]:
    """Insert a submit request in ``conn``'s transaction (see the module
    docstring); the entry names the row and the job's idempotency key."""
    values = row_of(job)
    tenant, key, spec, digest = values
    if _is_async(conn):

        async def insert() -> OutboxEntry:
            cur = await conn.execute(sql.INSERT, values)
            (row_id,) = await cur.fetchone()
            return OutboxEntry(id=row_id, idempotency_key=key)

        return insert()
    if _is_psycopg(conn):
        (row_id,) = conn.execute(sql.INSERT, values).fetchone()
        return OutboxEntry(id=row_id, idempotency_key=key)
    result = _sa_execute(
        conn, _SA_INSERT, {"tenant": tenant, "key": key, "spec": spec, "hash": digest}
    )
    return OutboxEntry(id=int(result.scalar_one()), idempotency_key=key)


@overload
def submit_many(
    conn: psycopg.AsyncConnection[Any], jobs: Iterable[JobRequest | JobArgs | Mapping[str, Any]]
) -> Awaitable[list[OutboxEntry]]: ...


@overload
def submit_many(
    conn: psycopg.Connection[Any] | Session | SAConnection,
    jobs: Iterable[JobRequest | JobArgs | Mapping[str, Any]],
) -> list[OutboxEntry]: ...


def submit_many(
    conn: Any, jobs: Iterable[JobRequest | JobArgs | Mapping[str, Any]]
) -> list[OutboxEntry] | Awaitable[list[OutboxEntry]]:
    """``submit`` of each job, in one round trip on psycopg (a pipelined
    ``executemany``): all in the caller's transaction, or, if one request is
    bad, none (the ``InvalidArgument`` is raised before anything is sent)."""
    rows = [row_of(job) for job in jobs]
    if _is_async(conn):

        async def insert() -> list[OutboxEntry]:
            async with conn.cursor() as cur:
                await cur.executemany(sql.INSERT, rows, returning=True)
                return [
                    OutboxEntry(id=i, idempotency_key=r[1])
                    for i, r in zip(await _ids(cur), rows, strict=True)
                ]

        return insert()
    if _is_psycopg(conn):
        with conn.cursor() as cur:
            cur.executemany(sql.INSERT, rows, returning=True)
            ids = []
            while True:
                ids.append(cur.fetchone()[0])
                if not cur.nextset():
                    break
            return [OutboxEntry(id=i, idempotency_key=r[1]) for i, r in zip(ids, rows, strict=True)]
    out = []
    for tenant, key, spec, digest in rows:
        result = _sa_execute(
            conn, _SA_INSERT, {"tenant": tenant, "key": key, "spec": spec, "hash": digest}
        )
        out.append(OutboxEntry(id=int(result.scalar_one()), idempotency_key=key))
    return out


async def _ids(cur: Any) -> list[int]:
    ids = []
    while True:
        ids.append((await cur.fetchone())[0])
        if not cur.nextset():
            break
    return ids


def fate(conn: psycopg.Connection[Any], entry: OutboxEntry | int) -> OutboxFate:
    """What became of the row (``NotFound`` for an id not in the table)."""

    row_id = entry.id if isinstance(entry, OutboxEntry) else entry
    row = conn.execute(_FATE, (row_id,)).fetchone()
    if row is None:
        raise NotFound(f"outbox row {row_id} does not exist")
    return OutboxFate(
        id=row[0],
        state=row[1],
        job_id=row[2],
        error_code=row[3],
        error=row[4],
        attempts=row[5],
        relayed_by=row[6],
    )


def status(conn: psycopg.Connection[Any]) -> OutboxStatus:
    """The backlog (``wheelctl outbox status``)."""
    pending, oldest, retrying = conn.execute(sql.STATUS).fetchone() or (0, 0, 0)
    (failed,) = conn.execute(sql.FAILED).fetchone() or (0,)
    return OutboxStatus(
        pending=int(pending),
        oldest_pending_s=float(oldest),
        retrying=int(retrying),
        failed=int(failed),
    )


def create_table(conn: psycopg.Connection[Any]) -> None:
    """Create ``wheel_outbox``, its indexes and its NOTIFY trigger in the
    schema ``conn``'s search_path names first (idempotent), and commit."""
    for statement in sql.DDL:
        conn.execute(statement)
    conn.commit()
