"""Fenced effects: a handler's own database write happens once per fire, even
when the fire is dispatched twice.

wheel runs a fire at least once: a worker paused past its lease (or cut off)
is still running when the fire is handed to another, and both may finish.
Each attempt carries the fire's ``idempotency_key`` (the same for every
attempt) and a ``fence`` (larger for each newer attempt). ``record`` writes
``(idempotency_key, fence)`` into a ``wheel_effects`` table inside the
handler's own transaction, beside its effect, and refuses:

- ``StaleFence`` when a newer attempt's fence is recorded for the key (it
  holds the key, or has done the effect): this attempt is superseded;
- ``EffectDone`` when the key's effect is done (by this fence or an older
  one): the effect happened; this attempt has nothing left to do.

The refusal is raised before the effect's own statements run, and the
caller's ``with conn.transaction():`` (or ``with conn:`` on SQLite) rolls
back: the effect and its record commit together or not at all. Because the
check is the database's (a unique key and a conditional upsert, under the
row lock), two attempts racing both reach it and exactly one commits.

``hold`` raises the key's fence ahead of the effect, committed on its own, so
that an older attempt still running is refused even before this one's
effect is done: call it first thing in a long handler.

Limits: a lower fence is refused only once a newer one is recorded (or
held): an older attempt that records first wins, and the newer one is told
``EffectDone`` (still one write; ``hold`` first thing prevents it). The key
is the fire's (job id and fire time), so two clusters sharing one table need
a table each (a schema each) or a prefix: ``record(conn, "eu/" + key, fence)``.
The guarantee covers writes in the same database transaction as
``record`` and nothing else. A message sent, a file written or a call to
another service is not rolled back with it: give such a service the key
(``wheel.effects.http`` sends it as the ``Idempotency-Key`` header) and rely
on its deduplication, or mark the job ``at_most_once``.

Backends: a psycopg 3 ``Connection`` or ``AsyncConnection`` (``record`` and
``hold`` return an awaitable for the latter), a ``sqlite3.Connection``.
Create the table once with ``create_table(conn)``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol, overload

from wheel.errors import EffectDone, InvalidArgument, StaleFence

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "EffectDone",
    "Fenced",
    "StaleFence",
    "create_table",
    "effect_key",
    "hold",
    "record",
]


class Fenced(Protocol):
    """What ``record`` needs of a run: ``wheel.worker.RunContext`` is one."""

    @property
    def idempotency_key(self) -> str: ...

    @property
    def fence(self) -> int: ...


_PG_DDL = """CREATE TABLE IF NOT EXISTS wheel_effects (
    idempotency_key text        PRIMARY KEY,
    fence           bigint      NOT NULL,
    done_at         timestamptz
)"""
_SQLITE_DDL = """CREATE TABLE IF NOT EXISTS wheel_effects (
    idempotency_key TEXT    PRIMARY KEY,
    fence           INTEGER NOT NULL,
    done_at_ms      INTEGER
)"""

# The row is written, or moved to this fence, only while not done and not
# held by a newer fence; RETURNING says whether it was.
_PG_RECORD = """INSERT INTO wheel_effects AS e (idempotency_key, fence, done_at)
VALUES (%s, %s, clock_timestamp())
ON CONFLICT (idempotency_key) DO UPDATE SET fence = EXCLUDED.fence, done_at = EXCLUDED.done_at
 WHERE e.done_at IS NULL AND e.fence <= EXCLUDED.fence
RETURNING fence"""
_PG_HOLD = """INSERT INTO wheel_effects AS e (idempotency_key, fence) VALUES (%s, %s)
ON CONFLICT (idempotency_key) DO UPDATE SET fence = EXCLUDED.fence
 WHERE e.done_at IS NULL AND e.fence <= EXCLUDED.fence
RETURNING fence"""
_PG_WHY = "SELECT fence, done_at IS NOT NULL FROM wheel_effects WHERE idempotency_key = %s"

_SQLITE_RECORD = """INSERT INTO wheel_effects (idempotency_key, fence, done_at_ms)
VALUES (?, ?, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))
ON CONFLICT (idempotency_key) DO UPDATE SET fence = excluded.fence, done_at_ms = excluded.done_at_ms
 WHERE wheel_effects.done_at_ms IS NULL AND wheel_effects.fence <= excluded.fence
RETURNING fence"""
_SQLITE_HOLD = """INSERT INTO wheel_effects (idempotency_key, fence) VALUES (?, ?)
ON CONFLICT (idempotency_key) DO UPDATE SET fence = excluded.fence
 WHERE wheel_effects.done_at_ms IS NULL AND wheel_effects.fence <= excluded.fence
RETURNING fence"""
_SQLITE_WHY = "SELECT fence, done_at_ms IS NOT NULL FROM wheel_effects WHERE idempotency_key = ?"


def effect_key(run: Fenced | str, name: str | None = None) -> str:
    """The key an effect is recorded under: the fire's idempotency key, and
    ``name`` after it for a run with more than one effect to make once."""
    key = run if isinstance(run, str) else run.idempotency_key
    if not isinstance(key, str) or not key:
        raise InvalidArgument("idempotency_key", "must be a non-empty string")
    return key if name is None else f"{key}/{name}"


def _fence(run: Fenced | str, fence: int | None) -> int:
    value = fence if fence is not None else (None if isinstance(run, str) else run.fence)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgument("fence", f"expected a fence (an integer >= 0), got {value!r}")
    return value


def _refusal(key: str, fence: int, why: tuple[Any, ...] | None) -> Exception:
    if why is None:  # pragma: no cover - the upsert writes a row that is not there
        return StaleFence(f"effect {key!r}: no row written and none found")
    held, done = int(why[0]), bool(why[1])
    if held > fence:
        return StaleFence(
            f"effect {key!r}: fence {fence} is older than {held}, a newer attempt's"
            f"{' (its effect is done)' if done else ''}"
        )
    return EffectDone(f"effect {key!r} is already done (fence {held})")


def _is_async(conn: object) -> bool:
    import psycopg

    return isinstance(conn, psycopg.AsyncConnection)


def _apply(conn: Any, pg: str, lite: str, key: str, fence: int) -> Awaitable[None] | None:
    if isinstance(conn, sqlite3.Connection):
        row = conn.execute(lite, (key, fence)).fetchone()
        if row is None:
            raise _refusal(key, fence, conn.execute(_SQLITE_WHY, (key,)).fetchone())
        return None
    if _is_async(conn):

        async def go() -> None:
            cur = await conn.execute(pg, (key, fence))
            if await cur.fetchone() is None:
                why = await (await conn.execute(_PG_WHY, (key,))).fetchone()
                raise _refusal(key, fence, why)

        return go()
    import psycopg

    if not isinstance(conn, psycopg.Connection):
        raise InvalidArgument(
            "conn",
            "expected a psycopg Connection or AsyncConnection or a sqlite3 Connection,"
            f" got {type(conn).__name__}",
        )
    row = conn.execute(pg, (key, fence)).fetchone()
    if row is None:
        raise _refusal(key, fence, conn.execute(_PG_WHY, (key,)).fetchone())
    return None


@overload
def record(
    conn: psycopg.AsyncConnection[Any],
    run: Fenced | str,
    fence: int | None = None,
    *,
    name: str | None = None,
) -> Awaitable[None]: ...


@overload
def record(
    conn: psycopg.Connection[Any] | sqlite3.Connection,
    run: Fenced | str,
    fence: int | None = None,
    *,
    name: str | None = None,
) -> None: ...


def record(
    conn: Any, run: Fenced | str, fence: int | None = None, *, name: str | None = None
) -> Awaitable[None] | None:
    """Record the run's effect as done, in the caller's transaction, or
    raise ``StaleFence`` / ``EffectDone`` (see the module docstring).
    ``run`` is a ``RunContext`` (or an idempotency key, with ``fence``)."""
    key = effect_key(run, name)
    return _apply(conn, _PG_RECORD, _SQLITE_RECORD, key, _fence(run, fence))


@overload
def hold(
    conn: psycopg.AsyncConnection[Any],
    run: Fenced | str,
    fence: int | None = None,
    *,
    name: str | None = None,
) -> Awaitable[None]: ...


@overload
def hold(
    conn: psycopg.Connection[Any] | sqlite3.Connection,
    run: Fenced | str,
    fence: int | None = None,
    *,
    name: str | None = None,
) -> None: ...


def hold(
    conn: Any, run: Fenced | str, fence: int | None = None, *, name: str | None = None
) -> Awaitable[None] | None:
    """Raise the key's fence to this run's, its effect not yet done; commit
    it on its own so that older attempts are refused from then on. Raises
    ``StaleFence`` / ``EffectDone`` as ``record`` does."""
    key = effect_key(run, name)
    return _apply(conn, _PG_HOLD, _SQLITE_HOLD, key, _fence(run, fence))


def create_table(conn: psycopg.Connection[Any] | sqlite3.Connection) -> None:
    """Create ``wheel_effects`` (idempotent) and commit."""
    if isinstance(conn, sqlite3.Connection):
        conn.execute(_SQLITE_DDL)
    else:
        conn.execute(_PG_DDL)
    conn.commit()
