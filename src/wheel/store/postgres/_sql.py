"""The PostgreSQL store's SQL text: the statements both stores share, built
for PostgreSQL, and its own set-based batch statements.

A batch goes to the server as column arrays (``_arrays``) that one statement
``unnest()``s: a claim batch is one statement (insert the executions, then
the schedule compare-and-swap of the inserts that won), a completion batch
another, whatever the batch's size.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from wheel.store._rollup import ADD as ADD_COUNTS
from wheel.store._rollup import MINUTE_MS
from wheel.store._schema import INFLIGHT_SQL
from wheel.store._shared import JOB_INSERT_COLUMNS, Dialect, Queries
from wheel.store.base import (
    SHARD_COUNT,
    TERMINAL_RUN_STATES,
    Completion,
    FireClaim,
    MissedFire,
    RunStart,
    RunState,
)
from wheel.store.postgres._arrays import Bools, Int4s, Int8s, Texts

# Change markers are transaction ids (xid8): parameters go in as text and are
# cast, so that comparisons with change_xid can use its index.
DIALECT = Dialect(
    param="%s",
    in_ints="{expr} = ANY(%s::{type}[])",
    int_rows="unnest(%s::{type}[]) AS l(value)",
    ints=list,
    change="j.change_xid",
    last_change="greatest(j.change_xid, j.move_xid)",
    marker="%s::text::xid8",
    marker_value=str,
    not_in_markers="{expr} <> ALL(%s::text[]::xid8[])",
    markers=lambda markers: [str(m) for m in markers],
    as_int="{expr}::text::int8",
    name_order='j.name COLLATE "C"',
    spec_handler="(s.spec::jsonb ->> 'handler')",
    spec_holds="strpos(s.spec, %s) > 0",
)
QUERIES = Queries(DIALECT)


def none_of(states: Collection[RunState]) -> str:
    """``<> ALL`` of these states: the filter the batch updates put on the
    row they look up, written as what the row must NOT be.

    The planner gives an expression compared ``= ANY`` a default selectivity
    of 0.5% an element. Filtering the looked-up runs with ``IN (in flight)``,
    it expected about 1 of a batch's B runs to pass and nested the unnest of
    the batch inside a loop over them: B x B comparisons (8.5 ms instead of
    1.8 ms for B = 100). ``<> ALL`` gets 99.5% an element, the estimate
    follows B, and the join is hashed at every size."""
    return "ALL (ARRAY[" + ", ".join(f"'{s.value}'" for s in sorted(states)) + "])"


NOT_INFLIGHT = none_of(TERMINAL_RUN_STATES)
NOT_DISPATCHED = none_of(set(RunState) - {RunState.DISPATCHED})

# One claim batch (one "round", see ``_runs._rounds``): insert the executions, keep the
# ones that won, compare-and-swap their jobs' next_run_at, report both. Inside a
# round every job_id is unique, so joins on job_id are one-to-one and the UPDATE
# touches each job at most once. Inserts go in job_id order so concurrent
# batches take unique-index locks in the same order (no deadlock cycles).
# ``j.job_id = ANY(...)`` steers the planner to primary-key lookups: joined to
# the input alone it chose a merge join that walked the whole jobs_pkey index.
#
# A batch tries the plain form first: ``CLAIM_INSERT_SQL`` then
# ``CLAIM_MOVE_SQL``, two statements of one transaction. The insert fails the
# whole transaction on a fire that is claimed already, so when it succeeds
# every claim won and every advancing claim moves its job. A conflict needs
# another owner of the shard, a trigger or backfill of the same instant, or a
# retry of our own commit; then the batch runs again as ``CLAIM_SQL``, one
# statement whose insert drops the claims another transaction holds (``ON
# CONFLICT DO NOTHING``) and moves the job of every advancing claim whose
# schedule still stands at its fire (rule 1 of ``wheel.store.base``).
# Speculative insertion cost PostgreSQL 2-3 us more a row (4-5 against 6-9 us
# for 1000-row inserts into executions), and the CTE's joins that match
# winners to their claims another 1.5-2 us a claim (14.9 against 13.2 us of
# PostgreSQL CPU a claim, 1000-claim batches over 100,000 jobs).
# A claim that leaves no next fire to a job whose schedule can end
# (``one_shot``: a one-shot, or a bounded recurring schedule, see
# ``JobSpec.schedule_ends``) makes it running until its fire ends.
CLAIM_INPUT = """
    SELECT * FROM unnest(%(idx)b::int4[], %(job)b::int8[], %(sf)b::int8[], %(att)b::int4[],
                         %(fence)b::int8[], %(disp)b::int8[], %(adv)b::bool[],
                         %(exp)b::int8[], %(new)b::int8[])
        AS t(idx, job_id, scheduled_for, attempt, fence, dispatched_at_ms, advance,
             expected, new_next)
"""
CLAIM_MOVE = """
    UPDATE jobs AS j
       SET next_run_at = w.new_next,
           state = CASE WHEN w.new_next IS NULL AND j.one_shot AND j.state = 'active'
                        THEN 'running' ELSE j.state END,
           updated_at_ms = greatest(j.updated_at_ms, w.dispatched_at_ms),
           move_xid = pg_current_xact_id()
      FROM {won} AS w
     WHERE j.job_id = ANY(%(job)b::int8[])
       AND w.advance AND j.job_id = w.job_id
       AND j.next_run_at IS NOT DISTINCT FROM w.expected
    RETURNING w.idx
"""
CLAIM_INSERT_SQL = f"""
INSERT INTO executions (job_id, scheduled_for, attempt, state, fence, dispatched_at_ms)
SELECT job_id, scheduled_for, attempt, 'dispatched', fence, dispatched_at_ms
  FROM ({CLAIM_INPUT}) AS input ORDER BY job_id
RETURNING job_id, run_id
"""
CLAIM_MOVE_SQL = CLAIM_MOVE.format(won=f"({CLAIM_INPUT})")
CLAIM_SQL = f"""
WITH input AS ({CLAIM_INPUT}
), ins AS (
    INSERT INTO executions (job_id, scheduled_for, attempt, state, fence, dispatched_at_ms)
    SELECT job_id, scheduled_for, attempt, 'dispatched', fence, dispatched_at_ms
      FROM input ORDER BY job_id
    ON CONFLICT (job_id, scheduled_for, attempt) DO NOTHING
    RETURNING run_id, job_id
), moved AS ({CLAIM_MOVE.format(won="input")})
SELECT i.idx, ins.run_id, m.idx IS NOT NULL
  FROM input AS i LEFT JOIN ins ON ins.job_id = i.job_id LEFT JOIN moved AS m ON m.idx = i.idx
"""

# Claims whose insert lost to a row with the same fence are our own earlier,
# committed write of the same claim (see ``claim_fires``).
RECOGNISE_CLAIMS_SQL = """
SELECT t.idx, e.run_id,
       CASE WHEN t.new_next IS NULL
            THEN j.next_run_at IS NULL
            ELSE j.next_run_at = t.new_next END
  FROM unnest(%(idx)b::int4[], %(job)b::int8[], %(sf)b::int8[], %(att)b::int4[],
              %(fence)b::int8[], %(new)b::int8[])
       AS t(idx, job_id, scheduled_for, attempt, fence, new_next)
  JOIN executions AS e ON e.job_id = t.job_id AND e.scheduled_for = t.scheduled_for
                      AND e.attempt = t.attempt AND e.fence = t.fence
  JOIN jobs AS j ON j.job_id = t.job_id
"""

# An advance that ends a bounded schedule (``ScheduleAdvance.ends``): its
# active job is running while a run of it is in flight, else completed.
ADVANCE_SQL = f"""
UPDATE jobs AS j
   SET next_run_at = t.new_next, updated_at_ms = greatest(j.updated_at_ms, %(now)s),
       state = CASE WHEN t.ends AND t.new_next IS NULL AND j.state = 'active'
                    THEN CASE WHEN EXISTS (SELECT 1 FROM executions AS e
                                            WHERE e.job_id = j.job_id
                                              AND e.state IN {INFLIGHT_SQL})
                              THEN 'running' ELSE 'completed' END
                    ELSE j.state END,
       move_xid = pg_current_xact_id()
  FROM unnest(%(idx)b::int4[], %(job)b::int8[], %(exp)b::int8[], %(new)b::int8[],
              %(ends)b::bool[])
       AS t(idx, job_id, expected, new_next, ends)
 WHERE j.job_id = t.job_id AND j.next_run_at IS NOT DISTINCT FROM t.expected
RETURNING t.idx
"""


def claim_arrays(idx: Sequence[int], claims: Sequence[FireClaim]) -> dict[str, Any]:
    """A claim batch as the column arrays the claim statements unnest."""
    return {
        "idx": Int4s(idx),
        "job": Int8s([c.job_id for c in claims]),
        "sf": Int8s([c.scheduled_for for c in claims]),
        "att": Int4s([c.attempt for c in claims]),
        "fence": Int8s([c.fence for c in claims]),
        "disp": Int8s([c.dispatched_at_ms for c in claims]),
        "adv": Bools([c.advance for c in claims]),
        "exp": Int8s([c.expected_next_run_at for c in claims]),
        "new": Int8s([c.new_next_run_at for c in claims]),
    }


def start_arrays(idx: Sequence[int], starts: Sequence[RunStart]) -> dict[str, Any]:
    """Starts as the column arrays the start statements unnest."""
    return {
        "idx": Int4s(idx),
        "run": Int8s([s.run_id for s in starts]),
        "fence": Int8s([s.fence for s in starts]),
        "worker": Texts([s.worker_id for s in starts]),
        "started": Int8s([s.started_at_ms for s in starts]),
    }


def completion_arrays(
    idx: Sequence[int], completions: Sequence[Completion], slot: int = 0
) -> dict[str, Any]:
    """Completions as the column arrays the completion statements unnest,
    and the store's ``slot`` of the minutes' counts (``_rollup``)."""
    return {
        "slot": slot,
        "idx": Int4s(idx),
        "run": Int8s([c.run_id for c in completions]),
        "fence": Int8s([c.fence for c in completions]),
        "state": Texts([c.state.value for c in completions]),
        "finished": Int8s([c.finished_at_ms for c in completions]),
        "error": Texts([c.error for c in completions]),
        "worker": Texts([c.worker_id for c in completions]),
        "started": Int8s([c.started_at_ms for c in completions]),
    }


def with_results(params: dict[str, Any], completions: Sequence[Completion]) -> dict[str, Any]:
    """``completion_arrays`` and the completions' results, for
    ``COMPLETE_WITH_RESULTS_SQL``."""
    params["result"] = Texts([c.result for c in completions])
    return params


# Completions that end a one-shot's fire (``Completion.job_state``): each
# run's job, if its schedule is over, takes the state that says how (a
# cancelled or paused job keeps its own). Completions of recurring jobs
# never run it.
END_ONE_SHOT_SQL = """
UPDATE jobs AS j
   SET state = t.state, updated_at_ms = greatest(j.updated_at_ms, t.finished_at_ms)
  FROM unnest(%(run)b::int8[], %(state)b::text[], %(finished)b::int8[])
       AS t(run_id, state, finished_at_ms)
  JOIN executions AS e ON e.run_id = t.run_id
 WHERE j.job_id = e.job_id AND j.state IN ('running', 'completed', 'failed')
"""


def end_one_shot_arrays(ends: Sequence[Completion]) -> dict[str, Any]:
    """Completions that end a one-shot as the arrays ``END_ONE_SHOT_SQL`` unnests."""
    return {
        "run": Int8s([c.run_id for c in ends]),
        "state": Texts([c.job_state.value if c.job_state is not None else "" for c in ends]),
        "finished": Int8s([c.finished_at_ms for c in ends]),
    }


MARK_RUNNING_SQL = f"""
UPDATE executions AS e
   SET state = 'running', worker_id = t.worker_id, started_at_ms = t.started_at_ms
  FROM unnest(%(idx)b::int4[], %(run)b::int8[], %(fence)b::int8[], %(worker)b::text[],
              %(started)b::int8[])
       AS t(idx, run_id, fence, worker_id, started_at_ms)
 WHERE e.run_id = ANY(%(run)b::int8[]) AND e.run_id = t.run_id AND e.fence = t.fence
   AND e.state || '' <> {NOT_DISPATCHED}
RETURNING t.idx, e.job_id
"""

RECOGNISE_STARTS_SQL = """
SELECT t.idx, e.job_id
  FROM unnest(%(idx)b::int4[], %(run)b::int8[], %(fence)b::int8[], %(worker)b::text[])
       AS t(idx, run_id, fence, worker_id)
  JOIN executions AS e ON e.run_id = t.run_id AND e.fence = t.fence
 WHERE e.state = 'running' AND e.worker_id = t.worker_id
"""

# Runs are found by primary key: ``run_id = ANY(...)`` offers the lookup and
# ``state || ''`` keeps the planner off the partial in-flight index, which it
# otherwise scanned whole (every in-flight run) and hashed for a 1000-row batch;
# the state test is written as ``<> ALL`` (see ``none_of``).


def _complete_sql(result: bool) -> str:
    """The fenced terminal transition of a batch of completions; ``result``:
    it also writes each run's result (a batch without any takes the form
    that sends and writes none). The runs it ends are counted in the same
    statement, in the store's ``slot`` of their minutes (``_rollup``)."""
    set_result, result_array, result_column = (
        (", result = t.result", ", %(result)b::text[]", ", result") if result else ("", "", "")
    )
    return f"""
WITH ended AS (
UPDATE executions AS e
   SET state = t.state, finished_at_ms = t.finished_at_ms, error = t.error,
       worker_id = coalesce(t.worker_id, e.worker_id),
       started_at_ms = coalesce(e.started_at_ms, t.started_at_ms){set_result}
  FROM unnest(%(idx)b::int4[], %(run)b::int8[], %(fence)b::int8[], %(state)b::text[],
              %(finished)b::int8[], %(error)b::text[], %(worker)b::text[],
              %(started)b::int8[]{result_array})
       AS t(idx, run_id, fence, state, finished_at_ms, error, worker_id,
            started_at_ms{result_column})
 WHERE e.run_id = ANY(%(run)b::int8[]) AND e.run_id = t.run_id AND e.fence = t.fence
   AND e.state || '' <> {NOT_INFLIGHT}
   AND NOT EXISTS (SELECT 1 FROM executions AS newer
                    WHERE newer.job_id = e.job_id AND newer.scheduled_for = e.scheduled_for
                      AND newer.fence > e.fence)
RETURNING t.idx, e.job_id, e.state, e.finished_at_ms
), counted AS (
INSERT INTO run_minutes (minute_ms, tenant, outcome, slot, runs)
SELECT (d.finished_at_ms / {MINUTE_MS}) * {MINUTE_MS}, j.tenant, d.state, %(slot)s::int8, count(*)
  FROM ended AS d JOIN jobs AS j ON j.job_id = d.job_id
 GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
{ADD_COUNTS}
)
SELECT idx, job_id FROM ended
"""


COMPLETE_SQL = _complete_sql(result=False)
COMPLETE_WITH_RESULTS_SQL = _complete_sql(result=True)

RECOGNISE_COMPLETIONS_SQL = """
SELECT t.idx, e.job_id
  FROM unnest(%(idx)b::int4[], %(run)b::int8[], %(fence)b::int8[], %(state)b::text[],
              %(finished)b::int8[])
       AS t(idx, run_id, fence, state, finished_at_ms)
  JOIN executions AS e ON e.run_id = t.run_id AND e.fence = t.fence
 WHERE e.state = t.state AND e.finished_at_ms = t.finished_at_ms
"""


# The epoch check of a write's transaction (``Store.write_batch``), its first
# statement: the writer's shards locked FOR SHARE until the transaction ends,
# in shard order as ``fence_shards`` updates them (no deadlock between the
# two). A ``fence_shards`` that updated a row first makes this wait for its
# commit and then read the new epoch; one that comes later waits for this
# transaction to end. Only rows above the writer's least epoch come back:
# the ones that can be newer than the writer's, usually none.
#
# The writer's shards come as a bit mask read along one scan of the table's
# index: as an int4[] they cost the planner and an index descent each. And
# the statement carries its values as literals: they change only with the
# writer's shards, so psycopg prepares it after a few batches and the server
# plans it once (the session plans every statement with parameters anew,
# ``plan_cache_mode``). Measured on top of a one-row write, on a busy
# two-core machine: 440 us with an int4[] parameter, 320 with a mask
# parameter, 250 as here. The CTE is MATERIALIZED so that the filter on the
# epoch stays outside it: the planner pushes such a filter into a plain
# subquery, below the lock, which then locks only the rows it returns.
#
# The same statement bounds how long the server lets the rest of the
# transaction wait on its client (``idle_in_transaction_session_timeout``,
# for this transaction only): a node paused or cut off in the middle of a
# batch would otherwise hold the rows, and the next owner's fence, until it
# woke up. As an uncorrelated subquery the setting is made once, before the
# rows are read (a one-time filter), whether any row comes back or not.
_LOCK_EPOCHS = """
WITH held AS MATERIALIZED (
    SELECT shard, epoch FROM shard_epochs
     WHERE get_bit('\\x{mask}'::bytea, shard) = 1 ORDER BY shard FOR SHARE
)
SELECT shard, epoch FROM held
 WHERE (SELECT set_config('idle_in_transaction_session_timeout', '{idle}', true)) IS NOT NULL
   AND epoch > {least}
"""


# ``fence_shards`` in one statement (parameters: the owner, the shards in
# order, their epochs): the rows are locked in shard order, as the writers'
# check locks them. A round trip a shard cost a gain about a millisecond a
# shard on a busy machine, in the middle of a planned move's switch.
FENCE_SHARDS_SQL = """
INSERT INTO shard_epochs (shard, epoch, owner)
SELECT t.shard, t.epoch, %s FROM unnest(%s::int4[], %s::int8[]) AS t(shard, epoch)
 ORDER BY t.shard
    ON CONFLICT (shard) DO UPDATE SET epoch = excluded.epoch, owner = excluded.owner
 WHERE shard_epochs.epoch < excluded.epoch
"""


def lock_epochs_sql(shards: Collection[int], least: int, idle_ms: int) -> str:
    """The check for a writer holding ``shards``: the rows above ``least``
    come back; from it on the transaction may wait on its client ``idle_ms``."""
    return _LOCK_EPOCHS.format(mask=shard_mask(shards).hex(), least=int(least), idle=int(idle_ms))


def shard_mask(shards: Collection[int]) -> bytes:
    """``shards`` as ``get_bit`` reads them: bit ``s % 8`` (from the least
    significant) of byte ``s // 8``. Shards outside [0, 256) have no row."""
    mask = bytearray(SHARD_COUNT // 8)
    for s in shards:
        if 0 <= s < SHARD_COUNT:
            mask[s >> 3] |= 1 << (s & 7)
    return bytes(mask)


# The jobs of a batch's runs, to find their shards: only when a shard is
# refused, or a run of a shard the writer lacks was written (``_runs``).
JOB_IDS_SQL = "SELECT run_id, job_id FROM executions WHERE run_id = ANY(%(run)b::int8[])"


# Missed fires, once each (parameters: their arrays, then the store's
# slot), and the minutes' counts of those this insert recorded.
RECORD_MISSED_SQL = f"""
WITH recorded AS (
INSERT INTO missed_fires (job_id, scheduled_for, reason, recorded_at_ms)
SELECT * FROM unnest(%b::int8[], %b::int8[], %b::text[], %b::int8[])
    ON CONFLICT (job_id, scheduled_for) DO NOTHING
RETURNING job_id, recorded_at_ms
)
INSERT INTO run_minutes (minute_ms, tenant, outcome, slot, runs)
SELECT (m.recorded_at_ms / {MINUTE_MS}) * {MINUTE_MS}, j.tenant, 'missed', %s::int8, count(*)
  FROM recorded AS m JOIN jobs AS j ON j.job_id = m.job_id
 GROUP BY 1, 2 ORDER BY 1, 2
{ADD_COUNTS}
"""


def missed_arrays(missed: Sequence[MissedFire]) -> tuple[Any, ...]:
    return (
        Int8s([m.job_id for m in missed]),
        Int8s([m.scheduled_for for m in missed]),
        Texts([m.reason.value for m in missed]),
        Int8s([m.recorded_at_ms for m in missed]),
    )


# -- submits -------------------------------------------------------------------------------

# Claim a batch's keys at once, each with a new job id; keys another submit
# holds (or holds until it commits: the insert waits for it) come back absent.
CLAIM_KEYS_SQL = """
INSERT INTO idempotency_keys (tenant, idempotency_key, body_hash, job_id, created_at_ms)
SELECT t, k, h, nextval('job_id_seq'), c
  FROM unnest(%b::text[], %b::text[], %b::text[], %b::int8[]) AS u(t, k, h, c)
    ON CONFLICT (tenant, idempotency_key) DO NOTHING
RETURNING tenant, idempotency_key, job_id
"""
HELD_KEYS_SQL = """
SELECT i.tenant, i.idempotency_key, i.body_hash, i.job_id
  FROM idempotency_keys AS i JOIN unnest(%b::text[], %b::text[]) AS u(t, k)
    ON i.tenant = u.t AND i.idempotency_key = u.k
"""
NEW_JOB_IDS_SQL = "SELECT nextval('job_id_seq') FROM generate_series(1, %s)"
# The new jobs, and the change marker they carry: this transaction's id.
INSERT_JOBS_SQL = f"""
WITH made AS (
    INSERT INTO jobs ({JOB_INSERT_COLUMNS})
    SELECT j, s, t, n, 'active', r, o, k, c, c, p, q, h
      FROM unnest(%b::int8[], %b::int4[], %b::text[], %b::text[], %b::int8[], %b::bool[],
                  %b::text[], %b::int8[], %b::int8[], %b::int8[], %b::bool[])
           AS u(j, s, t, n, r, o, k, c, p, q, h)
)
SELECT pg_current_xact_id()::text::int8
"""
INSERT_SPECS_SQL = (
    "INSERT INTO job_specs (job_id, spec, payload)"
    " SELECT * FROM unnest(%b::int8[], %b::text[], %b::bytea[])"
)
INSERT_PROFILES_SQL = (
    "INSERT INTO job_profiles (profile_id, body) SELECT * FROM unnest(%b::int8[], %b::text[])"
    " ON CONFLICT DO NOTHING"
)
COPY_JOBS_SQL = f"COPY jobs ({JOB_INSERT_COLUMNS}) FROM STDIN"
COPY_SPECS_SQL = "COPY job_specs (job_id, spec, payload) FROM STDIN"
SET_STATE_SQL = """
UPDATE jobs SET state = %s, next_run_at = %s, updated_at_ms = %s, change_xid = pg_current_xact_id()
 WHERE job_id = %s
"""

# The tables of the parameter (names) in this schema whose rows changed since
# their last analysis by more than the second parameter and the third's share
# of their live rows: (table, rows changed).
STALE_TABLES = """
SELECT relname, n_mod_since_analyze FROM pg_stat_user_tables
WHERE schemaname = current_schema() AND relname = ANY(%s)
  AND n_mod_since_analyze > %s + %s * n_live_tup
ORDER BY relname
"""
