"""Runs on PostgreSQL: the dispatch loop's batch writes (claims, schedule
advances, starts, completions, missed fires). Each function runs one batch
inside the caller's transaction and answers in the batch's order.

A write that loses finds out whether it lost to its own earlier commit
(``wheel.store.base``, rule 3): after an unknown commit, or when the node
writes a batch again because a later part of it failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg.errors

from wheel.store.base import Completion, FireClaim, MissedFire, RunStart, ScheduleAdvance
from wheel.store.postgres import _sql as sql
from wheel.store.postgres._arrays import Int4s, Int8s
from wheel.store.postgres._db import Attempt, Conn


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
    conn: Conn, attempt: Attempt, claims: Sequence[FireClaim]
) -> tuple[list[int | None], list[bool]]:
    """Each claim's run id (None: lost) and whether it moved its schedule."""
    rounds = _rounds([c.job_id for c in claims])
    if not attempt.after_unknown_commit:
        try:
            return _claim(conn, claims, rounds, plain=True)
        except psycopg.errors.UniqueViolation:
            conn.rollback()  # some fire is claimed already: sort them out
    return _claim(conn, claims, rounds, plain=False)


def _claim(
    conn: Conn, claims: Sequence[FireClaim], rounds: list[list[int]], *, plain: bool
) -> tuple[list[int | None], list[bool]]:
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
    return run_ids, advanced


def advance(conn: Conn, advances: Sequence[ScheduleAdvance], now_ms: int) -> list[bool]:
    """Schedule compare-and-swaps, a job's k-th of the batch in round k."""
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
                },
            )
            for (i,) in cur:
                applied[i] = True
    return applied


def mark_running(conn: Conn, starts: Sequence[RunStart], first: list[int]) -> list[bool]:
    """dispatched -> running for the ``first`` of each (run, fence)."""
    params = sql.start_arrays(first, [starts[i] for i in first])
    return _fenced_update(
        conn, sql.MARK_RUNNING_SQL, sql.RECOGNISE_STARTS_SQL, params, first, len(starts), "started"
    )


def complete(conn: Conn, completions: Sequence[Completion], first: list[int]) -> list[bool]:
    """Fenced terminal transitions for the ``first`` of each (run, fence)."""
    params = sql.completion_arrays(first, [completions[i] for i in first])
    return _fenced_update(
        conn,
        sql.COMPLETE_SQL,
        sql.RECOGNISE_COMPLETIONS_SQL,
        params,
        first,
        len(completions),
        "error",
        "worker",
    )


def _fenced_update(
    conn: Conn,
    update: str,
    recognise: str,
    params: dict[str, Any],
    first: list[int],
    n: int,
    *unmatched: str,
) -> list[bool]:
    """Apply ``update`` to a batch of ``n`` (its ``first`` of each key); a
    row that did not apply but whose run ``recognise`` finds exactly as the
    update would leave it is applied all the same. ``unmatched``: arrays the
    recognising statement does not take."""
    applied = [False] * n
    with conn.cursor(binary=True) as cur:
        cur.execute(update, params)
        for (i,) in cur:
            applied[i] = True
        if not all(applied[i] for i in first):
            for name in unmatched:
                del params[name]
            cur.execute(recognise, params)
            for (i,) in cur:
                applied[i] = True
    return applied


def record_missed(conn: Conn, missed: Sequence[MissedFire]) -> None:
    conn.execute(sql.RECORD_MISSED_SQL, sql.missed_arrays(missed))
