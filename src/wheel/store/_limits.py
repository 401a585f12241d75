"""Concurrency keys and rate limits in both SQL stores (schema 20).

A key's arbiter is its row in ``limits``: every claim of every owner passes
through the store, fenced by its shard's epoch, so the permit is taken in
the claim's own transaction and no other process has to agree on it. Per
claim batch, the keyed claims of one key take their permits with one write
of the key's row (the batch is the owner's lease request: never a write
per run); the claims that do not fit are not written at all and come back
``waiting``. A claim of a job without a key pays nothing: no statement is
run for a batch without keyed claims.

Invariants (tests in tests/store/test_contract_limits.py):

1. ``in_flight`` of a key equals the number of its runs dispatched or
   running in the store that carry the key, in every committed state: the
   claim that inserts a keyed run adds it in the same transaction, and the
   trigger of schema 20 (``wheel.store._schema.RELEASE_WHEN``) takes it off
   in the transaction that moves the run out of dispatched/running, whatever
   write that is (completion, lost, timed out, cancelled, dead-lettered,
   deleted), or ``release_returned`` does, in the transaction that takes
   the key off a run still in flight whose handler returned (its worker
   says so, under the run's fence, while its completion cannot reach its
   owner): the run's end then gives nothing back twice.
2. A claim never makes ``in_flight`` exceed ``max_concurrent``: permits are
   granted under the row's lock (PostgreSQL: ``FOR UPDATE``; SQLite: the one
   writer) as ``min(asked, max_concurrent - in_flight)``.
3. A run of an owner that died keeps its permit until a new owner ends it
   in the store (it may still be running on a worker: it must count), or
   until its worker reports that its handler returned (``release_returned``):
   then nothing of it runs any more, whoever owns it.
4. Starts of a rate-limited key take a token each from a bucket refilled by
   elapsed time, ``tokens = min(burst, tokens + elapsed * rate / period)``;
   none is granted without a whole token.
5. A drift (a row written by hand, a release lost to a job deleted first)
   never stays: ``set_limit`` and ``recount_limits`` (run as a node starts)
   count the runs in flight again under the row's lock.

The key lives on the run (``executions.concurrency_key``), written by the
claim that took its permit: the release must give the permit back to the key
the run took it from, even if its job's key changed since. The owner passes
the key and tenant with the claim (it knows the job's profile), which is
cheaper than joining the jobs for every claim of a batch to find them.

Tokens are kept in thousandths of a start (``tokens_milli``) so the bucket
is exact integer arithmetic on both backends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from wheel.store._schema import INFLIGHT_SQL
from wheel.store._shared import Dialect, Executor
from wheel.store.base import FireClaim, LimitRecord

T = TypeVar("T")

MILLI = 1000
LIMIT_COLUMNS = (
    "tenant, concurrency_key, max_concurrent, rate, rate_period_ms, burst,"
    " in_flight, tokens_milli, refilled_at_ms, updated_at_ms"
)
# The runs in flight of the limit row being updated.
_COUNT_IN_FLIGHT = (
    "(SELECT count(*) FROM executions AS e JOIN jobs AS j ON j.job_id = e.job_id"
    f" WHERE e.state IN {INFLIGHT_SQL} AND e.concurrency_key = limits.concurrency_key"
    " AND j.tenant = limits.tenant)"
)


@dataclass(slots=True)
class _Row:
    """A limit row as a claim batch reads it, under its lock."""

    max_concurrent: int
    rate: int
    rate_period_ms: int
    burst: int
    in_flight: int
    tokens_milli: int
    refilled_at_ms: int


def refilled(row: _Row, now_ms: int) -> tuple[int, int]:
    """The bucket's tokens (milli) and refill time at ``now_ms``. Only whole
    milli-tokens are added and the refill time moves by the time they took,
    so no fraction is lost between reads; a clock behind the row's adds none."""
    full = row.burst * MILLI
    if row.tokens_milli >= full:
        return full, max(now_ms, row.refilled_at_ms)
    elapsed = max(0, now_ms - row.refilled_at_ms)
    per_ms = row.rate * MILLI  # milli-tokens per period_ms milliseconds
    added = elapsed * per_ms // row.rate_period_ms
    tokens = row.tokens_milli + added
    if tokens >= full:
        return full, max(now_ms, row.refilled_at_ms)
    used = added * row.rate_period_ms // per_ms if per_ms else elapsed
    return tokens, row.refilled_at_ms + used


def free_permits(row: _Row, now_ms: int) -> int:
    """How many starts the limit lets through now (either limit may bind)."""
    free = 1 << 62
    if row.max_concurrent > 0:
        free = max(0, row.max_concurrent - row.in_flight)
    if row.rate > 0:
        free = min(free, refilled(row, now_ms)[0] // MILLI)
    return free


@dataclass(slots=True)
class Permits:
    """A claim batch's permits, taken under the keys' locks: the indexes of
    the claims to write (granted or without a limit), those waiting, and the
    rows read, by (tenant, key)."""

    write: list[int]
    waiting: list[int]
    rows: dict[tuple[str, str], _Row | None]


def take(
    cur: Executor, dialect: Dialect, claims: Sequence[FireClaim], now_ms: int, lock: str
) -> Permits | None:
    """Lock the rows of the batch's keys (in key order, so batches cannot
    deadlock on them) and grant each key's claims in batch order as far as
    its limits let them through. None: the batch has no keyed claim (no
    statement ran)."""
    keyed: dict[tuple[str, str], list[int]] = {}
    for i, c in enumerate(claims):
        if c.concurrency_key:
            keyed.setdefault((c.tenant, c.concurrency_key), []).append(i)
    if not keyed:
        return None
    p = dialect.param
    keys = sorted(keyed)
    where = " OR ".join([f"(tenant = {p} AND concurrency_key = {p})"] * len(keys))
    found = cur.execute(
        "SELECT tenant, concurrency_key, max_concurrent, rate, rate_period_ms, burst,"
        f" in_flight, tokens_milli, refilled_at_ms FROM limits WHERE {where}"
        f" ORDER BY tenant, concurrency_key{lock}",
        [v for k in keys for v in k],
    ).fetchall()
    rows: dict[tuple[str, str], _Row | None] = dict.fromkeys(keys)
    for r in found:
        rows[(r[0], r[1])] = _Row(*(int(v) for v in r[2:]))
    waiting: list[int] = []
    for k, idx in keyed.items():
        row = rows[k]
        if row is not None:
            waiting.extend(idx[free_permits(row, now_ms) :])
    if not waiting:
        return Permits(list(range(len(claims))), [], rows)
    out = set(waiting)
    return Permits([i for i in range(len(claims)) if i not in out], sorted(waiting), rows)


def settle(
    cur: Executor,
    dialect: Dialect,
    permits: Permits,
    claims: Sequence[FireClaim],
    inserted: Sequence[int | None],
    now_ms: int,
) -> None:
    """After the batch's inserts: mark the runs ``inserted`` (the new run id
    of each claim of ``claims``, None where it inserted none: lost, or found
    as this writer's own earlier commit, which counted it then) with their
    key, and add them to their limits -- one write per key."""
    p = dialect.param
    new: dict[tuple[str, str], list[int]] = {}
    for c, run_id in zip(claims, inserted, strict=True):
        if c.concurrency_key and run_id is not None:
            new.setdefault((c.tenant, c.concurrency_key), []).append(run_id)
    for k, run_ids in sorted(new.items()):
        cur.execute(
            f"UPDATE executions SET concurrency_key = {p}"
            f" WHERE {dialect.in_ints.format(expr='run_id', type='int8')}",
            (k[1], dialect.ints(run_ids)),
        )
        row = permits.rows.get(k)
        if row is None:
            continue  # no limit: the runs carry the key, for a limit set later
        n = len(run_ids)
        tokens, at = refilled(row, now_ms) if row.rate > 0 else (0, now_ms)
        cur.execute(
            f"UPDATE limits SET in_flight = in_flight + {p}, tokens_milli = {p},"
            f" refilled_at_ms = {p} WHERE tenant = {p} AND concurrency_key = {p}",
            (n, max(0, tokens - n * MILLI), at, k[0], k[1]),
        )


def limit_from_row(row: Sequence[Any], now_ms: int) -> LimitRecord:
    r = _Row(*(int(v) for v in row[2:9]))
    tokens = refilled(r, now_ms)[0] if r.rate > 0 and now_ms else r.tokens_milli
    return LimitRecord(
        tenant=row[0],
        key=row[1],
        max_concurrent=r.max_concurrent,
        rate=r.rate,
        rate_period_ms=r.rate_period_ms,
        burst=r.burst,
        in_flight=r.in_flight,
        tokens=tokens / MILLI,
        updated_at_ms=int(row[9]),
    )


class LimitsSQL:
    """The limits' calls of ``SQLStore``, a part it holds: ``read`` and
    ``write`` run a function in one transaction; ``lock`` follows a SELECT
    to lock its rows to the transaction's end ("" where writers are
    serialized anyway)."""

    __slots__ = ("_lock", "_param", "_read", "_write")

    def __init__(
        self,
        read: Callable[[Callable[[Executor], Any]], Any],
        write: Callable[[Callable[[Executor], Any]], Any],
        param: str,
        lock: str,
    ) -> None:
        self._read = read
        self._write = write
        self._param = param
        self._lock = lock

    def set_limit(self, limit: LimitRecord, now_ms: int) -> LimitRecord:
        p = self._param
        burst = limit.burst or limit.rate
        period = limit.rate_period_ms or 1000

        def op(cur: Executor) -> LimitRecord:
            old = cur.execute(
                f"SELECT tokens_milli FROM limits WHERE tenant = {p} AND concurrency_key = {p}"
                f"{self._lock}",
                (limit.tenant, limit.key),
            ).fetchone()
            tokens = burst * MILLI if old is None else min(int(old[0]), burst * MILLI)
            values = (
                limit.max_concurrent,
                limit.rate,
                period,
                burst,
                tokens,
                now_ms,
                now_ms,
                limit.tenant,
                limit.key,
            )
            if old is None:
                cur.execute(
                    f"INSERT INTO limits (max_concurrent, rate, rate_period_ms, burst,"
                    f" tokens_milli, refilled_at_ms, updated_at_ms, tenant, concurrency_key,"
                    f" in_flight) VALUES ({', '.join([p] * 9)}, 0)",
                    values,
                )
            else:
                cur.execute(
                    f"UPDATE limits SET max_concurrent = {p}, rate = {p}, rate_period_ms = {p},"
                    f" burst = {p}, tokens_milli = {p}, refilled_at_ms = {p}, updated_at_ms = {p}"
                    f" WHERE tenant = {p} AND concurrency_key = {p}",
                    values,
                )
            # Counted in a statement after the lock was taken: on PostgreSQL
            # it then sees every claim that committed before it got the row.
            cur.execute(
                f"UPDATE limits SET in_flight = {_COUNT_IN_FLIGHT}"
                f" WHERE tenant = {p} AND concurrency_key = {p}",
                (limit.tenant, limit.key),
            )
            row = cur.execute(
                f"SELECT {LIMIT_COLUMNS} FROM limits WHERE tenant = {p} AND concurrency_key = {p}",
                (limit.tenant, limit.key),
            ).fetchone()
            return limit_from_row(row, now_ms)

        result: LimitRecord = self._write(op)
        return result

    def list_limits(self, tenant: str | None = None, now_ms: int = 0) -> list[LimitRecord]:
        sql = f"SELECT {LIMIT_COLUMNS} FROM limits"
        params: tuple[Any, ...] = ()
        if tenant is not None:
            sql += f" WHERE tenant = {self._param}"
            params = (tenant,)
        sql += " ORDER BY tenant, concurrency_key"
        rows = self._read(lambda cur: cur.execute(sql, params).fetchall())
        return [limit_from_row(r, now_ms) for r in rows]

    def delete_limit(self, tenant: str, key: str) -> int:
        p = self._param
        sql = f"DELETE FROM limits WHERE tenant = {p} AND concurrency_key = {p}"
        return int(self._write(lambda cur: cur.execute(sql, (tenant, key)).rowcount))

    def release_returned(
        self, worker_id: str, runs: Sequence[tuple[int, int]], *, acked_only: bool = False
    ) -> int:
        """Give back the permits of ``runs`` (run id, fence) whose handlers
        returned on ``worker_id`` (invariants 1 and 3): of each run still in
        flight under that fence, acked by that worker (or by none, unless
        ``acked_only``), the key is taken off and its limit's ``in_flight``
        lowered, in one transaction; how many permits came back. The run's
        end later finds no key and gives nothing back again."""
        p = self._param
        # The worker's run: acked by it (or by none yet, unless ``acked_only``).
        whose = f"executions.worker_id = {p}"
        if not acked_only:
            whose = f"(executions.worker_id IS NULL OR {whose})"
        find = (
            "SELECT executions.concurrency_key, jobs.tenant FROM executions"
            " JOIN jobs ON jobs.job_id = executions.job_id"
            f" WHERE executions.run_id = {p} AND executions.fence = {p}"
            f" AND executions.state IN {INFLIGHT_SQL}"
            f" AND executions.concurrency_key IS NOT NULL AND {whose}"
        )
        take_key = (
            f"UPDATE executions SET concurrency_key = NULL WHERE run_id = {p} AND fence = {p}"
            f" AND state IN {INFLIGHT_SQL} AND concurrency_key = {p} AND {whose}"
        )
        lock_limit = (
            f"SELECT 1 FROM limits WHERE tenant = {p} AND concurrency_key = {p}{self._lock}"
        )
        # Where rows are locked one by one (PostgreSQL), a run's row locked by
        # another writer is left alone: that writer is ending the run or
        # moving it, and this one must not wait for it while holding a
        # limit's row, which the run's end takes too (a deadlock).
        skip = f" {self._lock.strip()} SKIP LOCKED" if self._lock else ""
        lock_run = f"SELECT 1 FROM executions WHERE run_id = {p}{skip}"

        def op(cur: Executor) -> int:
            found: dict[tuple[int, int], tuple[str, str]] = {}
            for run_id, fence in sorted(set(runs)):
                row = cur.execute(find, (run_id, fence, worker_id)).fetchone()
                if row is not None:
                    found[(run_id, fence)] = (str(row[1]), str(row[0]))
            # The limits' rows first, in key order as a claim takes them, then
            # the runs' rows, never waiting for one (above).
            for tenant, key in sorted(set(found.values())):
                cur.execute(lock_limit, (tenant, key))
            given: dict[tuple[str, str], int] = {}
            for (run_id, fence), k in sorted(found.items()):
                if skip and cur.execute(lock_run, (run_id,)).fetchone() is None:
                    continue
                # Checked again as the row is written: a run ended meanwhile is left.
                done = cur.execute(take_key, (run_id, fence, k[1], worker_id))
                if done.rowcount == 1:
                    given[k] = given.get(k, 0) + 1
            for (tenant, key), n in sorted(given.items()):
                cur.execute(
                    f"UPDATE limits SET in_flight = CASE WHEN in_flight > {p}"
                    f" THEN in_flight - {p} ELSE 0 END"
                    f" WHERE tenant = {p} AND concurrency_key = {p}",
                    (n, n, tenant, key),
                )
            return sum(given.values())

        return int(self._write(op)) if runs else 0

    def recount_limits(self) -> int:
        def op(cur: Executor) -> int:
            cur.execute(f"SELECT 1 FROM limits ORDER BY tenant, concurrency_key{self._lock}")
            return int(
                cur.execute(
                    f"UPDATE limits SET in_flight = {_COUNT_IN_FLIGHT}"
                    f" WHERE in_flight <> {_COUNT_IN_FLIGHT}"
                ).rowcount
            )

        return int(self._write(op))
