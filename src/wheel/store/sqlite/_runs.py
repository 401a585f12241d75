"""Runs on SQLite: the dispatch loop's batch writes (claims, schedule
advances, starts, completions, missed fires). Each function runs one batch
inside the caller's write transaction and answers in the batch's order.

A write that does not apply finds out whether its own earlier commit took it
already (``wheel.store.base``, rule 3); only then, so the common batch pays
nothing for it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from wheel.store import _fence, _limits
from wheel.store._shared import check_terminal, first_per_key, read_payloads, wall_ms
from wheel.store.base import (
    ClaimOutcome,
    Completion,
    CompletionOutcome,
    FireClaim,
    MissedFire,
    RunStart,
    ScheduleAdvance,
)
from wheel.store.sqlite import _sql as sql
from wheel.store.sqlite._db import bump


def apply_each(
    cur: sqlite3.Cursor, form: sql.SetStatement, rows: list[tuple[Any, ...]]
) -> list[bool]:
    """Apply the set-based ``form`` to each row as if run once per row, in
    order; True where it changed a row.

    Fast path: once over all the rows. When every row applied, each
    changed a row of its own (an UPDATE ... FROM changes a row at most
    once), which is what running them in order does too. Else roll back
    to a savepoint and redo the rows one at a time to learn which ones
    applied (conflicts, or two rows for one key: rare).
    """
    if not rows:
        return []
    cur.execute("SAVEPOINT apply_each")
    if sql.execute_rows(cur, form, rows) == len(rows):
        cur.execute("RELEASE apply_each")
        return [True] * len(rows)
    cur.execute("ROLLBACK TO apply_each")
    one = sql.statement(form, 1)
    out = []
    for row in rows:
        cur.execute(one, row)
        out.append(cur.rowcount == 1)
    cur.execute("RELEASE apply_each")
    return out


def claim(cur: sqlite3.Cursor, claims: Sequence[FireClaim]) -> list[ClaimOutcome]:
    """The batch's claims; those of keyed jobs take their permits first
    (``wheel.store._limits``), and those that get none come back waiting."""
    now = wall_ms()
    permits = _limits.take(cur, sql.DIALECT, claims, now, "")
    if permits is None:
        return _claim(cur, claims)[0]
    part = [claims[i] for i in permits.write]
    won, inserted = _claim(cur, part) if part else ([], [])
    _limits.settle(cur, sql.DIALECT, permits, part, inserted, now)
    out = [ClaimOutcome(claim=c, run_id=None, advanced=False, waiting=True) for c in claims]
    for i, outcome in zip(permits.write, won, strict=True):
        out[i] = outcome
    return out


def _claim(
    cur: sqlite3.Cursor, claims: Sequence[FireClaim]
) -> tuple[list[ClaimOutcome], list[int | None]]:
    """The claims' outcomes, and the run each inserted (None: lost, or found
    as this writer's own earlier commit)."""
    n = len(claims)
    base = bump(cur, "run_id", n)
    inserted = sql.execute_rows(
        cur,
        sql.INSERT_RUNS,
        [
            (base + i, c.job_id, c.scheduled_for, c.attempt, c.fence, c.dispatched_at_ms)
            for i, c in enumerate(claims)
        ],
    )
    run_ids: list[int | None] = list(range(base, base + n))
    if inserted < n:
        # Ids are ours alone (the counter was bumped under the write lock):
        # the ones present in the range are the inserts that won.
        present = {
            r[0]
            for r in cur.execute(
                "SELECT run_id FROM executions WHERE run_id BETWEEN ? AND ?", (base, base + n - 1)
            )
        }
        run_ids = [base + i if base + i in present else None for i in range(n)]
    advanced = [False] * n
    # Every advancing claim moves its schedule if it still stands at the fire:
    # one that lost found the fire held by another run (rule 1).
    cas_idx = [i for i, c in enumerate(claims) if c.advance]
    if cas_idx:
        change = bump(cur, "change_seq")
        rows: list[tuple[Any, ...]] = []
        ending = False
        for i in cas_idx:
            c = claims[i]
            ending = ending or c.new_next_run_at is None
            rows.append(
                (c.new_next_run_at, c.dispatched_at_ms, change, c.job_id, c.expected_next_run_at)
            )
        # Batches that end a schedule take the statement that may set state
        # (it is a no-op on state when next_run_at stays set).
        applied = apply_each(cur, sql.CLAIM_CAS_END if ending else sql.ADVANCE_CAS, rows)
        for i, ok in zip(cas_idx, applied, strict=True):
            advanced[i] = ok
    new = list(run_ids)
    if inserted < n:
        # A claim that lost to a row with its own fence lost to our own
        # earlier commit. It is ours.
        lost = [
            (i, c.job_id, c.scheduled_for, c.attempt, c.fence, c.new_next_run_at)
            for i, c in enumerate(claims)
            if run_ids[i] is None
        ]
        for i, run_id, moved in sql.select_rows(cur, sql.RECOGNISE_CLAIMS, lost):
            run_ids[i] = run_id
            advanced[i] = bool(moved) and claims[i].advance
    out = [
        ClaimOutcome(claim=c, run_id=run_ids[i], advanced=advanced[i]) for i, c in enumerate(claims)
    ]
    read_payloads(cur, sql.QUERIES, out)
    return out, new


def advance(cur: sqlite3.Cursor, advances: Sequence[ScheduleAdvance], now_ms: int) -> list[bool]:
    change = bump(cur, "change_seq")
    rows: list[tuple[Any, ...]] = [
        (a.new_next_run_at, now_ms, change, a.job_id, a.expected_next_run_at) for a in advances
    ]
    if any(a.ends for a in advances):
        # The statement that may set state (``ScheduleAdvance.ends``).
        ends = [(*row, a.ends) for row, a in zip(rows, advances, strict=True)]
        return apply_each(cur, sql.ADVANCE_CAS_END, ends)
    return apply_each(cur, sql.ADVANCE_CAS, rows)


def mark_running(cur: sqlite3.Cursor, starts: Sequence[RunStart]) -> list[bool]:
    return _fenced_update(
        cur,
        sql.MARK_RUNNING,
        sql.RECOGNISE_STARTS,
        [(s.worker_id, s.started_at_ms, s.run_id, s.fence) for s in starts],
        lambda i: (starts[i].run_id, starts[i].fence, starts[i].worker_id),
    )[0]


def complete(cur: sqlite3.Cursor, completions: Sequence[Completion]) -> list[bool]:
    rows: list[tuple[Any, ...]] = [
        (
            c.state.value,
            c.finished_at_ms,
            c.error,
            c.worker_id,
            c.run_id,
            c.fence,
            c.started_at_ms,
        )
        for c in completions
    ]
    form = sql.COMPLETE
    if any(c.result is not None for c in completions):
        # Only a batch with a result binds the column (most have none).
        form = sql.COMPLETE_WITH_RESULTS
        rows = [(*row, c.result) for row, c in zip(rows, completions, strict=True)]
    applied, changed = _fenced_update(
        cur,
        form,
        sql.RECOGNISE_COMPLETIONS,
        rows,
        lambda i: (
            completions[i].run_id,
            completions[i].fence,
            completions[i].state.value,
            completions[i].finished_at_ms,
        ),
    )
    ended = [c.run_id for c, ok in zip(completions, changed, strict=True) if ok]
    if ended:
        cur.execute(sql.ADD_ENDED, (0, sql.DIALECT.ints(ended)))
    ends = [
        (c.job_state.value, c.finished_at_ms, c.run_id)
        for c, ok in zip(completions, applied, strict=True)
        if ok and c.job_state is not None
    ]
    if ends:
        cur.executemany(sql.END_ONE_SHOT, ends)
    return applied


def _fenced_update(
    cur: sqlite3.Cursor,
    update: sql.SetStatement,
    recognise: sql.SetStatement,
    rows: list[tuple[Any, ...]],
    leaves: Callable[[int], tuple[Any, ...]],
) -> tuple[list[bool], list[bool]]:
    """Apply ``update`` to each row in order. The first write of each (run,
    fence) that did not apply but finds its run exactly as it would have
    left it is applied all the same: ``leaves(i)`` is what ``recognise``
    matches row i on (run, fence, then what the write leaves). Only a batch
    with a row that did not apply pays for that. Returns what applied, and
    what this write changed (not what it recognised)."""
    changed = apply_each(cur, update, rows)
    applied = list(changed)
    if not all(applied):
        keys = [leaves(i) for i in range(len(rows))]
        first = first_per_key([(k[0], k[1]) for k in keys])
        todo = [(i, *keys[i]) for i in first if not applied[i]]
        for (i,) in sql.select_rows(cur, recognise, todo):
            applied[i] = True
    return applied, changed


def record_missed(cur: sqlite3.Cursor, missed: Sequence[MissedFire]) -> None:
    """Missed fires, once each, and their minutes' counts (``_rollup``)."""
    row = cur.execute(sql.LAST_MISSED).fetchone()
    cur.executemany(
        sql.RECORD_MISSED,
        [(m.job_id, m.scheduled_for, m.reason.value, m.recorded_at_ms) for m in missed],
    )
    if cur.rowcount:
        cur.execute(sql.ADD_MISSED, (0, row[0]))


def stale_shards(cur: sqlite3.Cursor, epochs: Mapping[int, int]) -> set[int]:
    """The writer's shards whose stored epoch is newer than its own."""
    rows = cur.execute(sql.EPOCHS_ABOVE, (_fence.least_epoch(epochs),))
    return _fence.stale_shards(epochs, rows)


def job_ids(cur: sqlite3.Cursor, run_ids: Sequence[int]) -> dict[int, int]:
    """Run -> job, for the runs the store has."""
    return dict(cur.execute(sql.JOB_IDS, (sql.DIALECT.ints(run_ids),)).fetchall())


class Writes:
    """The one-kind writes (``KindWrites``) in the open transaction ``cur``:
    a batch hands this to ``write_in_order``, so that every kind writes in
    the batch's one transaction."""

    __slots__ = ("cur",)

    def __init__(self, cur: sqlite3.Cursor) -> None:
        self.cur = cur

    def claim_fires(self, claims: Sequence[FireClaim]) -> list[ClaimOutcome]:
        return claim(self.cur, claims) if claims else []

    def advance_schedules(self, advances: Sequence[ScheduleAdvance]) -> list[bool]:
        return advance(self.cur, advances, wall_ms()) if advances else []

    def mark_running(self, starts: Sequence[RunStart]) -> list[bool]:
        return mark_running(self.cur, starts) if starts else []

    def complete_runs(self, completions: Sequence[Completion]) -> list[CompletionOutcome]:
        if not completions:
            return []
        check_terminal(completions)
        applied = complete(self.cur, completions)
        return [
            CompletionOutcome(run_id=c.run_id, applied=ok)
            for c, ok in zip(completions, applied, strict=True)
        ]

    def record_missed(self, missed: Sequence[MissedFire]) -> None:
        if missed:
            record_missed(self.cur, missed)
