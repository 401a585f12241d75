"""The SQLite store's SQL text: the statements both stores share, built for
SQLite, and its own set-based batch statements."""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Collection, Iterator, Sequence
from typing import Any, NamedTuple

from wheel.store import _rollup
from wheel.store._schema import INFLIGHT_SQL
from wheel.store._shared import JOB_INSERT_COLUMNS, Dialect, Queries


def _json_list(values: Collection[int]) -> str:
    return json.dumps(list(values))


# Change markers are plain integers (``change_seq``, ``move_seq``).
DIALECT = Dialect(
    param="?",
    in_ints="{expr} IN (SELECT value FROM json_each(?))",
    int_rows="json_each(?) AS l",
    ints=_json_list,
    change="j.change_seq",
    last_change="max(j.change_seq, coalesce(j.move_seq, 0))",
    marker="?",
    marker_value=int,
    not_in_markers="{expr} NOT IN (SELECT value FROM json_each(?))",
    markers=_json_list,
    as_int="{expr}",
    name_order="j.name",
    state_beside="+j.state",
)
QUERIES = Queries(DIALECT)


class SetStatement(NamedTuple):
    """A statement over a batch of rows bound as a ``VALUES`` list."""

    sql: str  # with a ``{rows}`` slot
    row: str  # one row's placeholders


# A batch's writes of one kind go out as few statements: the rows are bound as
# multi-row ``VALUES`` lists, ``ROWS_PER_STATEMENT`` at a time and the rest in
# power-of-two pieces, so a batch of n rows is at most 10 + n // 1024 steps
# over at most 11 statement texts per kind (all in the connection's statement
# cache). Each step hands the GIL back and waits to take it again: 1,024 rows
# a statement rather than 256 took p99 at 28,000 dispatches/s from 539 and
# 282 ms to 259 and 116 ms (two runs each). ``executemany`` binds and steps
# row by row, giving up and taking back the GIL around every row: the node's
# store thread then queued behind its busy event loop for each row of a batch
# (measured: most of a batch's time at 13k dispatches/s). An earlier form
# sent the rows as one JSON text unpacked with json_each: json_extract parsed
# each row once per column, and encoding the JSON held the GIL (measured:
# 7.3 us a row inserted against 3.0 us with VALUES, and 7% of the node's GIL
# at 12,000 dispatches/s). In the UPDATE forms the rows drive the plan and
# each looks its target up by primary key; a unary ``+`` keeps the planner
# off the other indexes (with ``executions_inflight`` it scanned every
# in-flight run and probed the batch for each one);
# ``test_set_based_statements_look_rows_up_by_key`` checks it.
ROWS_PER_STATEMENT = 1024

INSERT_RUNS = SetStatement(
    "INSERT INTO executions (run_id, job_id, scheduled_for, attempt, state, fence,"
    " dispatched_at_ms) VALUES {rows} ON CONFLICT (job_id, scheduled_for, attempt) DO NOTHING",
    "(?, ?, ?, ?, 'dispatched', ?, ?)",
)
# The schedule compare-and-swap of a won claim (seed R4). ``IS`` so that a
# claim may also swap from "no next fire" (NULL). The common case leaves
# ``state`` out of the SET list: SQLite then skips the indexes that only
# depend on state.
ADVANCE_CAS = SetStatement(
    "UPDATE jobs SET next_run_at = t.column1, updated_at_ms = max(updated_at_ms, t.column2),"
    " move_seq = t.column3 FROM (VALUES {rows}) AS t"
    " WHERE jobs.job_id = t.column4 AND +jobs.next_run_at IS t.column5",
    "(?, ?, ?, ?, ?)",
)
# For batches with a claim that ends its schedule: a job whose schedule can
# end (``one_shot``: a one-shot, or a bounded recurring schedule, see
# ``JobSpec.schedule_ends``) whose next fire is None becomes running (until
# its fire ends: ``END_ONE_SHOT``).
CLAIM_CAS_END = SetStatement(
    "UPDATE jobs SET next_run_at = t.column1,"
    " state = CASE WHEN t.column1 IS NULL AND one_shot = 1 AND state = 'active'"
    " THEN 'running' ELSE state END,"
    " updated_at_ms = max(updated_at_ms, t.column2), move_seq = t.column3"
    " FROM (VALUES {rows}) AS t WHERE jobs.job_id = t.column4 AND +jobs.next_run_at IS t.column5",
    "(?, ?, ?, ?, ?)",
)
# For batches with an advance that ends a bounded schedule
# (``ScheduleAdvance.ends``): its active job is running while a run of it is
# in flight, else completed.
ADVANCE_CAS_END = SetStatement(
    "UPDATE jobs SET next_run_at = t.column1,"
    " state = CASE WHEN t.column6 = 1 AND t.column1 IS NULL AND state = 'active'"
    " THEN CASE WHEN EXISTS (SELECT 1 FROM executions AS e WHERE e.job_id = jobs.job_id"
    f" AND e.state IN {INFLIGHT_SQL}) THEN 'running' ELSE 'completed' END ELSE state END,"
    " updated_at_ms = max(updated_at_ms, t.column2), move_seq = t.column3"
    " FROM (VALUES {rows}) AS t WHERE jobs.job_id = t.column4 AND +jobs.next_run_at IS t.column5",
    "(?, ?, ?, ?, ?, ?)",
)
MARK_RUNNING = SetStatement(
    "UPDATE executions SET state = 'running', worker_id = t.column1, started_at_ms = t.column2"
    " FROM (VALUES {rows}) AS t WHERE executions.run_id = t.column3"
    " AND executions.fence = t.column4 AND +executions.state = 'dispatched'",
    "(?, ?, ?, ?)",
)


def _complete(result: bool) -> SetStatement:
    """The fenced terminal transition of a batch of completions; ``result``:
    its rows carry an eighth column, the run's result (a batch without any
    takes the form that binds and writes none)."""
    return SetStatement(
        "UPDATE executions SET state = t.column1, finished_at_ms = t.column2, error = t.column3,"
        " worker_id = coalesce(t.column4, executions.worker_id),"
        " started_at_ms = coalesce(executions.started_at_ms, t.column7)"
        + (", result = t.column8" if result else "")
        + " FROM (VALUES {rows}) AS t WHERE executions.run_id = t.column5"
        f" AND executions.fence = t.column6 AND +executions.state IN {INFLIGHT_SQL}"
        " AND NOT EXISTS (SELECT 1 FROM executions AS newer"
        "  WHERE newer.job_id = executions.job_id"
        "  AND newer.scheduled_for = executions.scheduled_for"
        "  AND newer.fence > executions.fence)",
        "(?, ?, ?, ?, ?, ?, ?, ?)" if result else "(?, ?, ?, ?, ?, ?, ?)",
    )


COMPLETE = _complete(result=False)
COMPLETE_WITH_RESULTS = _complete(result=True)

# A completion that ends a one-shot's fire (``Completion.job_state``): its
# job, if its schedule is over, takes the state that says how (a cancelled
# or paused job keeps its own). Completions of recurring jobs never run it.
END_ONE_SHOT = (
    "UPDATE jobs SET state = ?, updated_at_ms = max(updated_at_ms, ?)"
    " WHERE job_id = (SELECT job_id FROM executions WHERE run_id = ?)"
    " AND state IN ('running', 'completed', 'failed')"
)


# Claims, starts and completions that find their run already as they would
# leave it, with their own fence: the caller's own earlier write (see
# ``wheel.store.base``, rule 3). Each row starts with its index in the batch.
RECOGNISE_CLAIMS = SetStatement(
    "SELECT t.column1, e.run_id, j.next_run_at IS t.column6 FROM (VALUES {rows}) AS t"
    " JOIN executions AS e ON e.job_id = t.column2 AND e.scheduled_for = t.column3"
    " AND e.attempt = t.column4 AND e.fence = t.column5"
    " JOIN jobs AS j ON j.job_id = t.column2",
    "(?, ?, ?, ?, ?, ?)",
)
RECOGNISE_STARTS = SetStatement(
    "SELECT t.column1 FROM (VALUES {rows}) AS t JOIN executions AS e"
    " ON e.run_id = t.column2 AND e.fence = t.column3"
    " WHERE e.state = 'running' AND e.worker_id = t.column4",
    "(?, ?, ?, ?)",
)
RECOGNISE_COMPLETIONS = SetStatement(
    "SELECT t.column1 FROM (VALUES {rows}) AS t JOIN executions AS e"
    " ON e.run_id = t.column2 AND e.fence = t.column3"
    " WHERE e.state = t.column4 AND e.finished_at_ms = t.column5",
    "(?, ?, ?, ?, ?)",
)


@functools.lru_cache(maxsize=128)
def statement(form: SetStatement, n: int) -> str:
    """``form`` for ``n`` rows."""
    return form.sql.format(rows=", ".join([form.row] * n))


def pieces(rows: Sequence[tuple[Any, ...]]) -> Iterator[Sequence[tuple[Any, ...]]]:
    """``rows`` in full statements, then the rest in power-of-two pieces."""
    i, n = 0, len(rows)
    size = ROWS_PER_STATEMENT
    while i < n:
        while n - i < size:
            size //= 2
        yield rows[i : i + size]
        i += size


def execute_rows(cur: sqlite3.Cursor, form: SetStatement, rows: Sequence[tuple[Any, ...]]) -> int:
    """Apply ``form`` to ``rows``; returns the rows it changed."""
    changed = 0
    for piece in pieces(rows):
        cur.execute(statement(form, len(piece)), [v for row in piece for v in row])
        changed += cur.rowcount
    return changed


def select_rows(
    cur: sqlite3.Cursor, form: SetStatement, rows: Sequence[tuple[Any, ...]]
) -> list[Any]:
    """What ``form`` selects for ``rows``."""
    out: list[Any] = []
    for piece in pieces(rows):
        out += cur.execute(statement(form, len(piece)), [v for row in piece for v in row])
    return out


# -- submits -----------------------------------------------------------------------------

# The keys of a batch (a JSON list of [tenant, key]) that earlier submits hold.
HELD_KEYS = (
    "SELECT i.tenant, i.idempotency_key, i.body_hash, i.job_id"
    " FROM json_each(?) AS u JOIN idempotency_keys AS i"
    " ON i.tenant = json_extract(u.value, '$[0]')"
    " AND i.idempotency_key = json_extract(u.value, '$[1]')"
)
INSERT_JOB = (
    f"INSERT INTO jobs ({JOB_INSERT_COLUMNS}, change_seq)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_SPEC = "INSERT INTO job_specs (job_id, spec, payload) VALUES (?, ?, ?)"
INSERT_PROFILE = "INSERT INTO job_profiles (profile_id, body) VALUES (?, ?) ON CONFLICT DO NOTHING"
INSERT_KEY = (
    "INSERT INTO idempotency_keys (tenant, idempotency_key, body_hash, job_id, created_at_ms)"
    " VALUES (?, ?, ?, ?, ?)"
)
SET_STATE = (
    "UPDATE jobs SET state = ?, next_run_at = ?, updated_at_ms = ?, change_seq = ? WHERE job_id = ?"
)
# The epoch check of a batch (``Store.write_batch``): the shards whose epoch
# is above the writer's least one, the only ones that can be newer than the
# writer's (usually none). A scan of at most 256 rows, without parameters
# per shard.
EPOCHS_ABOVE = "SELECT shard, epoch FROM shard_epochs WHERE epoch > ?"
# The jobs of a batch's runs, to find their shards: only when a shard is refused
# or the writer does not hold every shard.
JOB_IDS = "SELECT run_id, job_id FROM executions WHERE run_id IN (SELECT value FROM json_each(?))"
RECORD_MISSED = (
    "INSERT INTO missed_fires (job_id, scheduled_for, reason, recorded_at_ms)"
    " VALUES (?, ?, ?, ?) ON CONFLICT (job_id, scheduled_for) DO NOTHING"
)
# The minutes' counts (``wheel.store._rollup``): of the runs a batch ended
# (parameters: slot 0, their ids), and of the fires it recorded missed,
# those after the last missed fire before it (slot 0, that id).
ADD_ENDED = _rollup.add_ended("?", DIALECT.in_ints)
ADD_MISSED = _rollup.add_missed("?")
LAST_MISSED = "SELECT coalesce(max(id), 0) FROM missed_fires"
# The last change number handed out.
LAST_CHANGE = "SELECT value FROM counters WHERE name = 'change_seq'"
