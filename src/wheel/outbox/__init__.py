"""Submit a job inside the application's own PostgreSQL transaction.

``submit(conn, **job)`` takes the keywords of ``wheel.client.Client.submit``
and inserts the request into the ``wheel_outbox`` table in the transaction
``conn`` is in: the job exists if and only if that transaction commits. A
node's relay (``wheelctl serve --outbox-dsn``) is woken by the insert's
NOTIFY, claims the row, creates the job under the row's idempotency key (so
a row picked up twice, after a crash, still makes one job) and records the
row's fate in it: ``fate(conn, entry.id)``.

``conn``, for ``submit``, ``submit_many``, ``fate`` and ``status`` alike, is
a psycopg 3 ``Connection`` or a SQLAlchemy ``Session`` or ``Connection``
(they return the result), or a psycopg 3 ``AsyncConnection`` or a SQLAlchemy
``AsyncSession`` or ``AsyncConnection`` (they return an awaitable of it).
SQLAlchemy is imported only when one of its objects is given; anything else
is refused with ``InvalidArgument`` naming ``conn``. Create the table with
``create_table(conn)`` or ``wheelctl outbox init --dsn ...``; wheel's own
PostgreSQL store has it already.

What the request resolves here, with this host's clock: an ``at=`` given as
a ``timedelta``. An ``every=`` without ``start=`` is placed when the relay
picks the row up, as a node places one it receives.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, Unpack, overload

from wheel import http_targets, tracing
from wheel.client._specs import JobArgs, JobRequest, encoded, request_of, request_spec
from wheel.codec import PayloadCodec
from wheel.errors import InvalidArgument, NotFound
from wheel.rpc import convert
from wheel.rpc._common import MAX_IDEMPOTENCY_KEY
from wheel.store import outbox_sql as sql

if TYPE_CHECKING:
    import psycopg
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.ext.asyncio import AsyncConnection as SAAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session

    # What the functions here take: these return their result, those an
    # awaitable of it.
    SyncConn = psycopg.Connection[Any] | Session | SAConnection
    AsyncConn = psycopg.AsyncConnection[Any] | AsyncSession | SAAsyncConnection

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
    job: JobRequest | Mapping[str, Any],
    *,
    now_ms: int | None = None,
    codec: PayloadCodec | None = None,
) -> tuple[str, str, str, str]:
    """(tenant, idempotency key, spec JSON, body hash) of a request, checked the way
    ``Client.submit`` and the node check it: a bad one raises
    ``InvalidArgument`` naming the keyword, here, in the caller's
    transaction, not later in the row. ``codec``: the payload encoded
    (``wheel.codec``), so the row holds what a ``Client(codec=...)`` sends."""
    request = encoded(request_of(job), codec)
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    spec = request_spec(request, now_ms=now)
    spec.validate()
    # The body hash a node gives a Client.submit of this request: the same key
    # and request through either path name one job.
    wire = convert.spec_to_proto(spec).SerializeToString(deterministic=True)
    # An HTTP target checked and kept as the node keeps a submitted one.
    spec = http_targets.stored_spec(spec)
    key = request.idempotency_key or generated_key()
    if not isinstance(key, str) or len(key) > MAX_IDEMPOTENCY_KEY:
        raise InvalidArgument(
            "idempotency_key", f"must be a string of at most {MAX_IDEMPOTENCY_KEY} characters"
        )
    return spec.tenant, key, spec.to_json(), hashlib.sha256(wire).hexdigest()


# The statements with psycopg's named placeholders; SQLAlchemy's text() gets
# them as ":name" (``_sa_text``).
_INSERT = (
    "INSERT INTO wheel_outbox (tenant, idempotency_key, spec, body_hash)"
    " VALUES (%(tenant)s, %(key)s, %(spec)s, %(hash)s) RETURNING id"
)
# With the application's trace context (``_traced``).
_INSERT_TRACED = (
    "INSERT INTO wheel_outbox (tenant, idempotency_key, spec, body_hash, traceparent)"
    " VALUES (%(tenant)s, %(key)s, %(spec)s, %(hash)s, %(trace)s) RETURNING id"
)
_FATE = (
    "SELECT id, state, job_id, error_code, error, attempts, relayed_by FROM wheel_outbox"
    " WHERE id = %(id)s"
)
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")

# The kinds of connection every function here takes, told apart by ``_kind``.
_PSYCOPG, _PSYCOPG_ASYNC, _SA, _SA_ASYNC = "psycopg", "psycopg async", "sa", "sa async"
_EXPECTED = (
    "expected a psycopg Connection or AsyncConnection, or a SQLAlchemy Session,"
    " Connection, AsyncSession or AsyncConnection"
)

T = TypeVar("T")
Rows = list[tuple[Any, ...]]
Query = tuple[str, Mapping[str, Any] | None]


def _kind(conn: object) -> str:
    """Which of the connection kinds ``conn`` is; ``InvalidArgument`` naming
    ``conn`` for anything else (an Engine, a cursor, a DSN). SQLAlchemy is
    imported only for an object of one of its classes."""
    import psycopg

    if isinstance(conn, psycopg.AsyncConnection):
        return _PSYCOPG_ASYNC
    if isinstance(conn, psycopg.Connection):
        return _PSYCOPG
    if any(c.__module__.partition(".")[0] == "sqlalchemy" for c in type(conn).__mro__):
        from sqlalchemy.engine import Connection
        from sqlalchemy.orm import Session, scoped_session

        if isinstance(conn, Session | Connection | scoped_session):
            return _SA
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session

        if isinstance(conn, AsyncSession | AsyncConnection | async_scoped_session):
            return _SA_ASYNC
    raise InvalidArgument("conn", f"{_EXPECTED}, got {type(conn).__name__}")


def _sa_text(statement: str) -> Any:
    from sqlalchemy import text

    return text(_PLACEHOLDER.sub(r":\1", statement))


def _run(
    conn: Any, queries: Sequence[Query], finish: Callable[[list[Rows]], T]
) -> T | Awaitable[T]:
    """Each query's rows on ``conn``, in its transaction, handed to
    ``finish``; an awaitable of the result on an async connection."""
    kind = _kind(conn)
    if kind == _PSYCOPG:
        return finish([conn.execute(q, p).fetchall() for q, p in queries])
    if kind == _SA:
        return finish([[tuple(r) for r in conn.execute(_sa_text(q), p or {})] for q, p in queries])

    async def run() -> T:
        out: list[Rows] = []
        for q, p in queries:
            if kind == _PSYCOPG_ASYNC:
                out.append(await (await conn.execute(q, p)).fetchall())
            else:
                out.append([tuple(r) for r in (await conn.execute(_sa_text(q), p or {})).all()])
        return finish(out)

    return run()


def _named(row: tuple[str, str, str, str], trace: str = "") -> dict[str, str]:
    tenant, key, spec, digest = row
    named = {"tenant": tenant, "key": key, "spec": spec, "hash": digest}
    if trace:
        named["trace"] = trace
    return named


def _traced() -> str:
    """The current span's ``traceparent`` when the application traces with
    wheel (``wheel.tracing.install``): a row keeps it, so the job's fires
    link to the span that submitted it in the application's transaction."""
    return tracing.current_traceparent() if tracing.is_on() else ""


@overload
def submit(
    conn: AsyncConn, *, codec: PayloadCodec | None = None, **job: Unpack[JobArgs]
) -> Awaitable[OutboxEntry]: ...


@overload
def submit(
    conn: SyncConn, *, codec: PayloadCodec | None = None, **job: Unpack[JobArgs]
) -> OutboxEntry: ...


def submit(
    conn: Any, *, codec: PayloadCodec | None = None, **job: Unpack[JobArgs]
) -> OutboxEntry | Awaitable[OutboxEntry]:
    """Insert a submit request in ``conn``'s transaction (see the module
    docstring); the entry names the row and the job's idempotency key.
    ``codec`` (``wheel.codec``): the payload is encoded before it is kept."""
    row = row_of(job, codec=codec)
    trace = _traced()
    return _run(
        conn,
        [(_INSERT_TRACED if trace else _INSERT, _named(row, trace))],
        lambda out: OutboxEntry(id=int(out[0][0][0]), idempotency_key=row[1]),
    )


@overload
def submit_many(
    conn: AsyncConn,
    jobs: Iterable[JobRequest | JobArgs | Mapping[str, Any]],
    *,
    codec: PayloadCodec | None = None,
) -> Awaitable[list[OutboxEntry]]: ...


@overload
def submit_many(
    conn: SyncConn,
    jobs: Iterable[JobRequest | JobArgs | Mapping[str, Any]],
    *,
    codec: PayloadCodec | None = None,
) -> list[OutboxEntry]: ...


def submit_many(
    conn: Any,
    jobs: Iterable[JobRequest | JobArgs | Mapping[str, Any]],
    *,
    codec: PayloadCodec | None = None,
) -> list[OutboxEntry] | Awaitable[list[OutboxEntry]]:
    """``submit`` of each job, in one round trip on psycopg (a pipelined
    ``executemany``): all in the caller's transaction, or, if one request is
    bad, none (the ``InvalidArgument`` is raised before anything is sent)."""
    rows = [row_of(job, codec=codec) for job in jobs]
    kind = _kind(conn)
    trace = _traced()
    insert_sql = sql.INSERT_TRACED if trace else sql.INSERT
    params = [(*r, trace) for r in rows] if trace else rows

    def entries(ids: Iterable[int]) -> list[OutboxEntry]:
        return [OutboxEntry(id=i, idempotency_key=r[1]) for i, r in zip(ids, rows, strict=True)]

    if kind == _PSYCOPG_ASYNC:

        async def insert() -> list[OutboxEntry]:
            async with conn.cursor() as cur:
                await cur.executemany(insert_sql, params, returning=True)
                return entries(await _ids(cur))

        return insert()
    if kind == _PSYCOPG:
        with conn.cursor() as cur:
            cur.executemany(insert_sql, params, returning=True)
            ids = []
            while True:
                ids.append(cur.fetchone()[0])
                if not cur.nextset():
                    break
            return entries(ids)
    statement = _INSERT_TRACED if trace else _INSERT
    return _run(
        conn,
        [(statement, _named(r, trace)) for r in rows],
        lambda out: entries(int(o[0][0]) for o in out),
    )


async def _ids(cur: Any) -> list[int]:
    ids = []
    while True:
        ids.append((await cur.fetchone())[0])
        if not cur.nextset():
            break
    return ids


def _fate_of(row_id: int, rows: Rows) -> OutboxFate:
    if not rows:
        raise NotFound(f"outbox row {row_id} does not exist")
    row = rows[0]
    return OutboxFate(
        id=row[0],
        state=row[1],
        job_id=row[2],
        error_code=row[3],
        error=row[4],
        attempts=row[5],
        relayed_by=row[6],
    )


@overload
def fate(conn: AsyncConn, entry: OutboxEntry | int) -> Awaitable[OutboxFate]: ...


@overload
def fate(conn: SyncConn, entry: OutboxEntry | int) -> OutboxFate: ...


def fate(conn: Any, entry: OutboxEntry | int) -> OutboxFate | Awaitable[OutboxFate]:
    """What became of the row (``NotFound`` for an id not in the table), read
    in ``conn``'s transaction: a new look needs a new transaction."""
    row_id = entry.id if isinstance(entry, OutboxEntry) else entry
    return _run(conn, [(_FATE, {"id": row_id})], lambda out: _fate_of(row_id, out[0]))


def _status_of(out: list[Rows]) -> OutboxStatus:
    pending, oldest, retrying = out[0][0] if out[0] else (0, 0, 0)
    (failed,) = out[1][0] if out[1] else (0,)
    return OutboxStatus(
        pending=int(pending),
        oldest_pending_s=float(oldest),
        retrying=int(retrying),
        failed=int(failed),
    )


@overload
def status(conn: AsyncConn) -> Awaitable[OutboxStatus]: ...


@overload
def status(conn: SyncConn) -> OutboxStatus: ...


def status(conn: Any) -> OutboxStatus | Awaitable[OutboxStatus]:
    """The backlog (``wheelctl outbox status``)."""
    return _run(conn, [(sql.STATUS, None), (sql.FAILED, None)], _status_of)


def create_table(conn: psycopg.Connection[Any]) -> None:
    """Create ``wheel_outbox``, its indexes and its NOTIFY trigger in the
    schema ``conn``'s search_path names first (idempotent), and commit."""
    for statement in sql.DDL:
        conn.execute(statement)
    conn.commit()
