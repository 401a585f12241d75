"""The outbox relay: rows an application committed to ``wheel_outbox``
(``wheel.outbox.submit``) become jobs through the node's own submit path.

Two tasks beside the dispatch loop, never in it:

- the listener holds a connection that LISTENs on the table's channel (the
  insert's trigger notifies it at commit) and wakes the pump; it reconnects
  with backoff when the database goes away, and wakes the pump each time it
  does (rows may have committed while nobody listened);
- a pump, woken or every ``poll_s`` at the latest (the bounded fallback
  when a notification is lost), claims up to ``batch_rows`` pending rows,
  oldest first, ``FOR UPDATE SKIP LOCKED``, queues them all on the node's
  group-committed submit path (``Node.submit_later``, as a bulk submit
  does), and records each row's fate in the claim's transaction: ``done``
  with the job id, ``failed`` with the error, or still ``pending`` with the
  error of a failure that passes (the store down, a tenant over its quota).
  ``LANES`` pumps run side by side, each on a connection of its own, so
  that one's store commit overlaps another's claim or record (measured
  with a backlog of 20,000 rows: 1.0x the client's bulk submit with one
  lane, 1.2-1.7x with two). Each goes on its own: a wake while one lane's
  pass is in flight starts an idle lane's pass at once, on the rows
  committed since (the first pass's rows are locked, and skipped), so that
  under a steady stream of commits a row waits for about one pass, not for
  the pass in flight and then its own.

Why a row never becomes two jobs: its job is made under the row's
idempotency key with the row's spec, so a second pick-up (the node killed
after the job was stored but before the fate committed; two relays) finds
the job the first made. The claim's lock keeps two live relays off the same
row; the key covers the cases a lock cannot (a crash).

Settled rows (done or failed) are kept for the node's ``retain_ms`` (``wheelctl
serve --retain``, as finished runs are), then deleted by the relaying node in
batches through their index (``outbox_sql.SETTLED_INDEX``), each pass taking
at most ``retention_share`` of its time; pending rows are never deleted.

In a cluster one member relays: the holder of shard 0, as retention picks
its runner (``wheel.node._ops``). A second member that briefly believes it
holds shard 0 too costs nothing: SKIP LOCKED gives it other rows, and the
key holds across both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from prometheus_client import Counter
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict

from wheel import http_targets, tracing
from wheel._retry import Backoff
from wheel.engine.records import JobRecord
from wheel.engine.spec import JobSpec
from wheel.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    StoreUnavailable,
    WheelError,
)
from wheel.store import outbox_sql as sql

if TYPE_CHECKING:
    from wheel.node._node import Node

log = logging.getLogger("wheel.outbox")

__all__ = ["OutboxRelay", "RowFate"]

# Rows claimed in one transaction: a bulk submit's worth, in one group commit.
BATCH_ROWS = 2_000
# The listener's reconnects, and a lane whose pass left rows pending.
RELAY_BACKOFF = Backoff(initial=0.1, max=5.0)
# Passes side by side (``OutboxRelay(lanes=...)``).
LANES = 2
# The fallback poll: a row whose notification was lost waits this long at most.
POLL_S = 1.0
# Errors that are the request's own: the row fails for good. Any other
# failure (the store, a quota, a node starting or moving) passes: the row
# stays pending and is tried again.
PERMANENT: tuple[type[WheelError], ...] = (
    InvalidArgument,
    AlreadyExists,
    NotFound,
    PermissionDenied,
)
# A claimed row: id, idempotency key, its spec (or why it is none), body
# hash, and the trace context of the application's span ("": none).
Claimed = tuple[int, str, JobSpec | WheelError, str | None, str]
# Queued submits between two yields to the loop.
YIELD_EVERY = 250


@dataclass(frozen=True, slots=True, kw_only=True)
class RowFate:
    """What the relay writes back into a row."""

    id: int
    state: str
    job_id: int | None = None
    error_code: str | None = None
    error: str | None = None


def _failure(row_id: int, exc: BaseException) -> RowFate:
    state = "failed" if isinstance(exc, PERMANENT) else "pending"
    return RowFate(id=row_id, state=state, error_code=type(exc).__name__, error=str(exc))


def _application_name(dsn: str) -> str | None:
    try:
        name = conninfo_to_dict(dsn).get("application_name")
    except psycopg.ProgrammingError:
        return None  # a malformed DSN: connecting will say what is wrong
    return str(name) if name else None


class OutboxRelay:
    """Turns a ``wheel_outbox`` table's rows into jobs of ``node``."""

    def __init__(
        self,
        node: Node,
        dsn: str,
        *,
        batch_rows: int = BATCH_ROWS,
        poll_s: float = POLL_S,
        record_delay_s: float = 0.0,
        lanes: int = LANES,
    ) -> None:
        """``lanes``: passes that run side by side, each on a connection and
        a thread of its own (one's store commit overlaps another's claim or
        record). ``record_delay_s``: a test hook (``wheelctl serve
        --outbox-record-delay``), a pause
        between the jobs stored and their rows' fate recorded, the window
        in which a crash leaves a row pending whose job exists."""
        self.node = node
        self.record_delay_s = record_delay_s
        self.dsn = dsn
        self.batch_rows = batch_rows
        self.poll_s = poll_s
        self._tasks: list[asyncio.Task[None]] = []
        self._lanes: list[_Lane] = []
        registry = node.metrics.registry
        self._rows = Counter(
            "wheel_outbox_rows_total",
            "Outbox rows this node relayed, by fate: done (a job), failed (refused for"
            " good), retried (a failure that passes; the row stays pending).",
            ["fate"],
            registry=registry,
        )
        self._errors = Counter(
            "wheel_outbox_errors_total",
            "Relay passes that failed on the outbox's database (claim or record).",
            registry=registry,
        )
        self._purged = Counter(
            "wheel_outbox_purged_rows_total",
            "Settled outbox rows (done or failed) this node deleted once older than --retain.",
            registry=registry,
        )
        for fate in ("done", "failed", "retried"):
            self._rows.labels(fate)
        self._purger = _Purger(self)
        self._purge_thread = ThreadPoolExecutor(1, thread_name_prefix="wheel-outbox-purge")
        self._no_index_said = False
        self.listening = asyncio.Event()
        # Its connections' application_name, for pg_stat_activity: the DSN's
        # own if it names one (an operator's or a benchmark's tag holds).
        self.name = _application_name(dsn) or f"wheel-outbox/{node.config.node_id}"
        self._lanes = [_Lane(self) for _ in range(max(1, lanes))]

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._listen(), name="wheel-outbox-listen")]
        self._tasks += [
            asyncio.create_task(self._pump(lane), name=f"wheel-outbox-pump-{n}")
            for n, lane in enumerate(self._lanes)
        ]
        if self.node.config.retain_ms is not None:
            self._tasks.append(asyncio.create_task(self._retain(), name="wheel-outbox-retain"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        loop = asyncio.get_running_loop()
        for lane in self._lanes:
            await loop.run_in_executor(lane.thread, lane.close)
            lane.thread.shutdown(wait=True)
        await loop.run_in_executor(self._purge_thread, self._purger.close)
        self._purge_thread.shutdown(wait=True)

    def wake(self) -> None:
        for lane in self._lanes:
            lane.woken.set()

    def picks(self) -> bool:
        """Whether this node relays now: it serves, and it is the only node
        or the holder of shard 0."""
        node = self.node
        if not node.ready.is_set() or node.stopping:
            return False
        return node.coordinator is None or 0 in node.held_shards()

    # -- the listener -----------------------------------------------------------------

    async def _listen(self) -> None:
        delays = RELAY_BACKOFF.delays()
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, connect_timeout=5, application_name=self.name
                )
                async with conn:
                    row = await (await conn.execute(sql.TABLE_CHANNEL)).fetchone()
                    if row is None:
                        log.warning(
                            "no wheel_outbox table in the outbox's database"
                            " (wheelctl outbox init --dsn ...); looking again in 5s"
                        )
                        await asyncio.sleep(max(self.poll_s, 5.0))
                        continue
                    # The trigger's channel, computed as the trigger does.
                    channel = pgsql.Identifier(row[0])
                    await conn.execute(pgsql.SQL("LISTEN {}").format(channel))
                    delays.reset()
                    self.listening.set()
                    self.wake()  # rows committed while nobody listened
                    async for _ in conn.notifies():
                        self.wake()
            except psycopg.Error as exc:
                self.listening.clear()
                backoff = delays.wait()
                log.warning("outbox listener: %s; reconnecting in %.1fs", exc, backoff)
                self.wake()
            except Exception:  # a bug here must not end the listening for good
                self.listening.clear()
                backoff = delays.wait()
                log.exception("outbox listener failed; reconnecting in %.1fs", backoff)
                self.wake()
            else:
                backoff = delays.wait()
            await asyncio.sleep(backoff)

    # -- retention ----------------------------------------------------------------------

    async def _retain(self) -> None:
        config = self.node.config
        retain_ms = config.retain_ms
        assert retain_ms is not None
        await asyncio.sleep(min(config.retention_first_s, config.retention_interval_s))
        while True:
            if self.picks():
                try:
                    await self.purge(retain_ms)
                except Exception as exc:
                    self._errors.inc()
                    log.warning("outbox purge failed: %s", exc)
            await asyncio.sleep(config.retention_interval_s)

    async def purge(self, retain_ms: int) -> int:
        """One purge pass: delete the rows settled more than ``retain_ms``
        ago, ``retention_batch`` a transaction, sleeping between batches so
        that the pass takes at most ``retention_share`` of its time. Returns
        the rows deleted: none when the table lacks the index that finds
        them (said once in the log: a purge would read the whole table)."""
        config = self.node.config
        share = min(1.0, max(0.01, config.retention_share))
        batch = max(1, config.retention_batch)
        loop = asyncio.get_running_loop()
        purger = self._purger
        total = 0
        started = time.perf_counter()
        try:
            while True:
                at = time.perf_counter()
                deleted = await loop.run_in_executor(
                    self._purge_thread, purger.delete, retain_ms, batch
                )
                if deleted is None:
                    if not self._no_index_said:
                        self._no_index_said = True
                        log.warning(
                            "wheel_outbox has no index wheel_outbox_settled: settled rows are kept"
                            " until `wheelctl outbox init --dsn ...` is run again to add it"
                        )
                    break
                total += deleted
                self._purged.inc(deleted)
                if deleted < batch:
                    break
                await asyncio.sleep((time.perf_counter() - at) * (1 / share - 1))
        finally:
            await loop.run_in_executor(self._purge_thread, purger.close)
        if total:
            log.info(
                "outbox retention: deleted %d rows settled over %d ms ago in %.1fs",
                total,
                retain_ms,
                time.perf_counter() - started,
            )
        return total

    # -- the pump ---------------------------------------------------------------------

    async def _pump(self, lane: _Lane) -> None:
        delays = RELAY_BACKOFF.delays()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lane.woken.wait(), self.poll_s)
            lane.woken.clear()
            if await self._drain(lane):
                await asyncio.sleep(delays.wait())
            else:
                delays.reset()

    async def _drain(self, lane: _Lane) -> bool:
        """Passes on ``lane`` while whole batches settle (rows that stay
        pending, a quota or a store down, wait for the poll); True when a
        pass failed."""
        while self.picks():
            try:
                claimed, settled = await self.relay_once(lane)
            except Exception as exc:
                self._errors.inc()
                log.warning("outbox pass failed: %s", exc)
                return True
            if claimed < self.batch_rows or settled < claimed:
                break
        return False

    async def relay_once(self, lane: _Lane | None = None) -> tuple[int, int]:
        """One pass: claim, submit, record. Returns the rows claimed, and
        how many of them are settled (done or failed, not pending still)."""
        lane = lane or self._lanes[0]
        loop = asyncio.get_running_loop()
        claimed = await loop.run_in_executor(lane.thread, lane.claim)
        if not claimed:
            return 0, 0
        try:
            fates = await self._submit(claimed)
        except BaseException:
            await asyncio.shield(loop.run_in_executor(lane.thread, lane.rollback))
            raise
        if self.record_delay_s:
            await asyncio.sleep(self.record_delay_s)
        await loop.run_in_executor(lane.thread, lane.record, fates)
        created = [f.job_id for f in fates if f.state == "done" and f.job_id is not None]
        failed = sum(1 for f in fates if f.state == "failed")
        self._rows.labels("done").inc(len(created))
        self._rows.labels("failed").inc(failed)
        self._rows.labels("retried").inc(len(fates) - len(created) - failed)
        sink = self.node.job_changes_sink
        if sink is not None and created:
            sink(created)  # the owners of other members' shards, told at once
        return len(claimed), len(created) + failed

    async def _submit(self, claimed: Sequence[Claimed]) -> list[RowFate]:
        node = self.node
        tenants = [spec.tenant for _, _, spec, _, _ in claimed if isinstance(spec, JobSpec)]
        verdicts = iter(await node.admit_submits(tenants))
        fates: list[RowFate] = []
        waiting: list[tuple[int, asyncio.Future[tuple[JobRecord, bool] | WheelError]]] = []
        admitted: list[str] = []
        now = node.now_ms()
        try:
            for n, (row_id, key, spec, digest, _) in enumerate(claimed):
                if n % YIELD_EVERY == YIELD_EVERY - 1:
                    await asyncio.sleep(0)
                if not isinstance(spec, JobSpec):
                    fates.append(_failure(row_id, spec))
                    continue
                over = next(verdicts)
                if over is not None:
                    fates.append(_failure(row_id, over))
                    continue
                admitted.append(spec.tenant)
                try:
                    waiting.append(
                        (row_id, node.submit_later(spec, key, body_hash=digest, now_ms=now))
                    )
                except WheelError as exc:
                    fates.append(_failure(row_id, exc))
            for row_id, future in waiting:
                try:
                    result = await future
                except Exception as exc:  # the batch's store write failed: it passes
                    fates.append(_failure(row_id, exc))
                    continue
                if isinstance(result, WheelError):
                    fates.append(_failure(row_id, result))
                else:
                    fates.append(RowFate(id=row_id, state="done", job_id=result[0].job_id))
        finally:
            node.submits_done(admitted)
        await self._link_traces(claimed, fates)
        return fates

    async def _link_traces(self, claimed: Sequence[Claimed], fates: Sequence[RowFate]) -> None:
        """With tracing on, each job a traced row made keeps the row's trace
        context, as a traced submit's keeps its call's (``wheel.tracing``):
        the job's fires link to the application's span."""
        if not tracing.is_on():
            return
        traced = {row_id: tp for row_id, _, _, _, tp in claimed if tp}
        made = [(f.job_id, traced[f.id]) for f in fates if f.job_id is not None and f.id in traced]
        if made:
            await self.node.record_job_traces(made)


class _Connected:
    """One connection to the outbox's database, opened on first use (again
    after ``close``), used on one thread only."""

    def __init__(self, relay: OutboxRelay) -> None:
        self.relay = relay
        self._conn: psycopg.Connection[Any] | None = None
        # The claim's statement for the table this connection finds (with
        # its rows' trace context where the table has the column).
        self._claim_sql = ""

    def connection(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is None or conn.closed:
            conn = self._conn = psycopg.connect(
                self.relay.dsn, connect_timeout=5, application_name=self.relay.name
            )
        return conn

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None
        self._claim_sql = ""  # the table may be another (or altered) next time


class _Purger(_Connected):
    """The purge's connection, on the purge's thread, for one pass."""

    def delete(self, retain_ms: int, batch: int) -> int | None:
        """One batch, in one transaction: ``None`` when the table has no valid
        index to find the rows by. The transaction holds the table's lock
        that a ``DROP INDEX`` waits for before it asks, so an index dropped
        during a pass stops the pass at its next batch, never midway into a
        read of the whole table."""
        try:
            conn = self.connection()
            conn.execute(sql.LOCK_FOR_PURGE)
            row = conn.execute(sql.HAS_SETTLED_INDEX).fetchone()
            if not (row and row[0]):
                conn.rollback()
                return None
            deleted = conn.execute(sql.PURGE, (retain_ms, batch)).rowcount
            conn.commit()
        except psycopg.Error as exc:
            self.close()
            raise StoreUnavailable(f"outbox purge: {exc}") from exc
        return max(0, deleted)


class _Lane(_Connected):
    """One connection, used on one thread of its own: a claim, then its
    record (or rollback), in turn."""

    def __init__(self, relay: OutboxRelay) -> None:
        super().__init__(relay)
        # Set by every wake of the relay: this lane's pump has a pass to make.
        self.woken = asyncio.Event()
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="wheel-outbox")

    def claim(self) -> list[Claimed]:
        try:
            conn = self.connection()
            if not self._claim_sql:
                has = conn.execute(sql.HAS_TRACE_COLUMN).fetchone()
                trace = "traceparent" if has and has[0] else "NULL"
                self._claim_sql = sql.CLAIM.format(trace=trace)
            rows = conn.execute(self._claim_sql, (self.relay.batch_rows,)).fetchall()
            if not rows:
                conn.rollback()  # no transaction left open between polls
        except psycopg.Error as exc:
            self.close()
            raise StoreUnavailable(f"outbox claim: {exc}") from exc
        out: list[Claimed] = []
        for row_id, key, text, digest, traceparent in rows:
            spec: JobSpec | WheelError
            try:
                # A row written by another language's SDK: its HTTP target
                # is checked here, as a submit's is by the node's API.
                spec = http_targets.stored_spec(JobSpec.from_json(text))
            except InvalidArgument as exc:
                spec = exc
            except (ValueError, KeyError, TypeError) as exc:
                spec = InvalidArgument("spec", f"not a job spec ({type(exc).__name__}: {exc})")
            out.append((row_id, key, spec, digest, traceparent or ""))
        return out

    def record(self, fates: Sequence[RowFate]) -> None:
        started = time.perf_counter()
        try:
            conn = self.connection()
            conn.execute(
                sql.RECORD,
                (
                    self.relay.node.config.node_id,
                    [f.id for f in fates],
                    [f.state for f in fates],
                    [f.job_id for f in fates],
                    [f.error_code for f in fates],
                    [f.error for f in fates],
                ),
            )
            conn.commit()
        except psycopg.Error as exc:
            # The rows go back to pending with the transaction; their jobs
            # are stored, and the next pick-up finds them by key.
            self.close()
            raise StoreUnavailable(f"outbox record: {exc}") from exc
        log.debug("outbox: %d rows recorded in %.3fs", len(fates), time.perf_counter() - started)

    def rollback(self) -> None:
        if self._conn is not None:
            try:
                self._conn.rollback()
            except psycopg.Error:
                self.close()
