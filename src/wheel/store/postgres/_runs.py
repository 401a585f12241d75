"""Runs on PostgreSQL: the dispatch loop's batch writes (claims, schedule
advances, starts, completions, missed fires). Each function runs one batch
inside the caller's transaction and answers in the batch's order.

A write that loses finds out whether it lost to its own earlier commit
(``wheel.store.base``, rule 3): after an unknown commit, or when the node
writes a batch again because a later part of it failed.

Given a writer's ``Held`` epochs, a function checks them first thing in the
transaction and leaves out the writes of the shards it refuses
(``Store.write_batch``); it answers for those as not applied and returns
the refused shards beside its answers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import psycopg.errors

from wheel.engine.model import shard_of
from wheel.store import _limits
from wheel.store._fence import (
    holds_every_shard,
    job_shards,
    kept,
    least_epoch,
    run_shards,
    spread,
    stale_shards,
)
from wheel.store._shared import first_per_run, wall_ms
from wheel.store.base import Completion, FireClaim, MissedFire, RunStart, ScheduleAdvance
from wheel.store.postgres import _sql as sql
from wheel.store.postgres._arrays import Bools, Int4s, Int8s
from wheel.store.postgres._db import Attempt, Conn

W = TypeVar("W")


class Held:
    """A writer's epochs (``WriteBatch.epochs``) as the check statement
    takes them: built once for all of a batch's transactions."""

    __slots__ = ("_check", "epochs", "every")

    def __init__(self, epochs: Mapping[int, int], idle_ms: int) -> None:
        self.epochs = epochs
        self.every = holds_every_shard(epochs)
        self._check = sql.lock_epochs_sql(epochs, least_epoch(epochs), idle_ms)

    def stale(self, conn: Conn) -> set[int]:
        """Lock the writer's shards until the transaction ends and return
        those whose stored epoch is newer than the writer's; from here on the
        transaction may wait on its client ``idle_ms`` at most."""
        if not self.epochs:
            return set()
        return stale_shards(self.epochs, conn.execute(self._check))

    def check_jobs(self, conn: Conn, job_ids: Sequence[int]) -> tuple[list[int] | None, set[int]]:
        """The check for writes that carry a job id: the indexes of the ones
        to make (None: all of them) and the refused shards."""
        refused = self.stale(conn)
        if not refused and self.every:
            return None, refused
        return kept(job_shards(job_ids), self.epochs, refused), refused


def _check_jobs(
    conn: Conn, held: Held | None, job_ids: Sequence[int]
) -> tuple[list[int] | None, set[int]]:
    return (None, set()) if held is None else held.check_jobs(conn, job_ids)


def _rounds(job_ids: Sequence[int]) -> list[list[int]]:
    """Split batch indexes so that no job appears twice in one round; a job's
    k-th item of the batch goes to round k (the batch's order is kept per job)."""
    seen: dict[int, int] = {}
    rounds: list[list[int]] = [[]]
    for i, job_id in enumerate(job_ids):
        k = seen.get(job_id, 0)
        seen[job_id] = k + 1
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(i)
    return rounds


def claim(
    conn: Conn, attempt: Attempt, claims: Sequence[FireClaim], held: Held | None
) -> tuple[list[int | None], list[bool], set[int], set[int]]:
    """Each claim's run id (None: lost, refused or waiting), whether it moved
    its schedule, the refused shards, and the indexes of the claims waiting
    for a permit of their concurrency key (``wheel.store._limits``)."""
    plain = not attempt.after_unknown_commit
    now = wall_ms()
    while True:
        keep, refused = _check_jobs(conn, held, [c.job_id for c in claims])
        part = claims if keep is None else [claims[i] for i in keep]
        permits = _limits.take(conn, sql.DIALECT, part, now, " FOR UPDATE") if part else None
        sub = part if permits is None else [part[i] for i in permits.write]
        try:
            run_ids, advanced, new = _claim(conn, sub, plain=plain) if sub else ([], [], [])
        except psycopg.errors.UniqueViolation:
            if not plain:
                raise
            # Some fire is claimed already: sort them out. The rollback let
            # the check's locks go, so the check runs again too.
            conn.rollback()
            plain = False
            continue
        waiting: list[int] = []
        if permits is not None:
            _limits.settle(conn, sql.DIALECT, permits, sub, new, now)
            run_ids = spread(part, permits.write, run_ids, lambda _: None)
            advanced = spread(part, permits.write, advanced, lambda _: False)
            waiting = permits.waiting
        if keep is None:
            return run_ids, advanced, refused, set(waiting)
        return (
            spread(claims, keep, run_ids, lambda _: None),
            spread(claims, keep, advanced, lambda _: False),
            refused,
            {keep[i] for i in waiting},
        )


def _claim(
    conn: Conn, claims: Sequence[FireClaim], *, plain: bool
) -> tuple[list[int | None], list[bool], list[int | None]]:
    """Each claim's run id and schedule move, and the run it inserted (None:
    lost, or found as this writer's own earlier commit)."""
    rounds = _rounds([c.job_id for c in claims])
    n = len(claims)
    run_ids: list[int | None] = [None] * n
    advanced = [False] * n
    with conn.cursor(binary=True) as cur:
        for members in rounds:
            part = [claims[i] for i in members] if len(rounds) > 1 else claims
            arrays = sql.claim_arrays(members, part)
            if plain:  # every claim wins, or the insert fails them all
                cur.execute(sql.CLAIM_INSERT_SQL, arrays)
                index = {claims[i].job_id: i for i in members}  # unique in a round
                for job_id, run_id in cur:
                    run_ids[index[job_id]] = run_id
                cur.execute(sql.CLAIM_MOVE_SQL, arrays)
                for (i,) in cur:
                    advanced[i] = True
            else:
                cur.execute(sql.CLAIM_SQL, arrays)
                for i, run_id, moved in cur:
                    run_ids[i] = run_id
                    advanced[i] = moved
        new = list(run_ids)
        if not plain:
            # A claim that lost to a row with its own fence lost to our own
            # earlier commit. It is ours.
            lost = [i for i in range(n) if run_ids[i] is None]
            if lost:
                part = [claims[i] for i in lost]
                cur.execute(sql.RECOGNISE_CLAIMS_SQL, sql.claim_arrays(lost, part))
                for i, run_id, moved in cur:
                    run_ids[i] = run_id
                    advanced[i] = bool(moved) and claims[i].advance
    return run_ids, advanced, new


def advance(
    conn: Conn, advances: Sequence[ScheduleAdvance], now_ms: int, held: Held | None
) -> tuple[list[bool], set[int]]:
    """Schedule compare-and-swaps, a job's k-th of the batch in round k;
    and the refused shards."""
    keep, refused = _check_jobs(conn, held, [a.job_id for a in advances])
    if keep is None:
        return _advance(conn, advances, now_ms), refused
    applied = _advance(conn, [advances[i] for i in keep], now_ms) if keep else []
    return spread(advances, keep, applied, lambda _: False), refused


def _advance(conn: Conn, advances: Sequence[ScheduleAdvance], now_ms: int) -> list[bool]:
    applied = [False] * len(advances)
    with conn.cursor(binary=True) as cur:
        for members in _rounds([a.job_id for a in advances]):
            part = [advances[i] for i in members]
            cur.execute(
                sql.ADVANCE_SQL,
                {
                    "now": now_ms,
                    "idx": Int4s(members),
                    "job": Int8s([a.job_id for a in part]),
                    "exp": Int8s([a.expected_next_run_at for a in part]),
                    "new": Int8s([a.new_next_run_at for a in part]),
                    "ends": Bools([a.ends for a in part]),
                },
            )
            for (i,) in cur:
                applied[i] = True
    return applied


def mark_running(
    conn: Conn, starts: Sequence[RunStart], held: Held | None
) -> tuple[list[bool], set[int]]:
    """dispatched -> running for the first of each (run, fence); and the
    refused shards."""

    def write(part: Sequence[RunStart]) -> tuple[list[bool], list[int]]:
        first = first_per_run(part)
        params = sql.start_arrays(
            first, part if len(first) == len(part) else [part[i] for i in first]
        )
        update, recognise = sql.MARK_RUNNING_SQL, sql.RECOGNISE_STARTS_SQL
        return _fenced_update(conn, update, recognise, params, first, len(part), "started")

    return _run_writes(conn, held, starts, [s.run_id for s in starts], write)


def complete(
    conn: Conn, completions: Sequence[Completion], held: Held | None, slot: int
) -> tuple[list[bool], set[int]]:
    """Fenced terminal transitions for the first of each (run, fence), the
    runs they end counted in the store's ``slot`` of their minutes; and the
    refused shards."""

    def write(part: Sequence[Completion]) -> tuple[list[bool], list[int]]:
        first = first_per_run(part)
        firsts = part if len(first) == len(part) else [part[i] for i in first]
        params = sql.completion_arrays(first, firsts, slot)
        update = sql.COMPLETE_SQL
        unmatched: tuple[str, ...] = ("error", "worker", "slot")
        if any(c.result is not None for c in firsts):
            # Only a batch with a result sends the array (most have none).
            update = sql.COMPLETE_WITH_RESULTS_SQL
            params = sql.with_results(params, firsts)
            unmatched = ("error", "worker", "slot", "result")
        applied, jobs = _fenced_update(
            conn, update, sql.RECOGNISE_COMPLETIONS_SQL, params, first, len(part), *unmatched
        )
        ends = [c for c, ok in zip(part, applied, strict=True) if ok and c.job_state is not None]
        if ends:
            conn.execute(sql.END_ONE_SHOT_SQL, sql.end_one_shot_arrays(ends))
        return applied, jobs

    return _run_writes(conn, held, completions, [c.run_id for c in completions], write)


def _run_writes(
    conn: Conn,
    held: Held | None,
    writes: Sequence[W],
    run_ids: Sequence[int],
    write: Callable[[Sequence[W]], tuple[list[bool], list[int]]],
) -> tuple[list[bool], set[int]]:
    """``write`` the runs' writes (it answers each, and gives the jobs of
    the ones it reports applied) after the check of ``held``.

    Writes carry only a run id, so their shards are looked up only when the
    check refused a shard. A writer that does not hold every shard could
    still write about a run of one it lacks: the jobs of the runs written
    show it, and then the transaction starts over and looks them up."""
    if held is None:
        return write(writes)[0], set()
    look_up = False
    while True:
        refused = held.stale(conn)
        if not (refused or look_up):
            applied, jobs = write(writes)
            if held.every or all(shard_of(j) in held.epochs for j in jobs):
                return applied, refused
            conn.rollback()
            look_up = True
            continue
        found = conn.execute(sql.JOB_IDS_SQL, {"run": Int8s(run_ids)}).fetchall()
        keep = kept(run_shards(run_ids, dict(found)), held.epochs, refused)
        applied = write([writes[i] for i in keep])[0] if keep else []
        return spread(writes, keep, applied, lambda _: False), refused


def _fenced_update(
    conn: Conn,
    update: str,
    recognise: str,
    params: dict[str, Any],
    first: list[int],
    n: int,
    *unmatched: str,
) -> tuple[list[bool], list[int]]:
    """Apply ``update`` to a batch of ``n`` (its ``first`` of each key); a
    row that did not apply but whose run ``recognise`` finds exactly as the
    update would leave it is applied all the same. ``unmatched``: arrays the
    recognising statement does not take. Returns what applied, and the jobs
    of the runs that did."""
    applied = [False] * n
    jobs = []
    with conn.cursor(binary=True) as cur:
        cur.execute(update, params)
        for i, job_id in cur:
            applied[i] = True
            jobs.append(job_id)
        if not all(applied[i] for i in first):
            for name in unmatched:
                del params[name]
            cur.execute(recognise, params)
            for i, job_id in cur:
                applied[i] = True
                jobs.append(job_id)
    return applied, jobs


def record_missed(
    conn: Conn, missed: Sequence[MissedFire], held: Held | None, slot: int
) -> set[int]:
    """Missed fires, once each, counted in the store's ``slot`` of their
    minutes; returns the refused shards."""
    keep, refused = _check_jobs(conn, held, [m.job_id for m in missed])
    part = missed if keep is None else [missed[i] for i in keep]
    if part:
        conn.execute(sql.RECORD_MISSED_SQL, (*sql.missed_arrays(part), slot))
    return refused
