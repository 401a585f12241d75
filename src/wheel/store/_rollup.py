"""Runs and missed fires counted by minute (schema 25): the overview's
counts read these rows, so a day costs its minutes, not its runs.

``run_minutes`` holds, for each minute, tenant and outcome (a run's
terminal state, or ``missed``), how many runs ended in that minute with
that outcome (or how many fires were recorded missed in it). The rules:

1. A run is counted once, in the minute of its end, by the write that
   ends it: the statement that moves it to a terminal state adds it in the
   same transaction. A write that finds its run already ended (its own
   earlier commit, recognised after the fact) adds nothing.
2. A missed fire is counted once, in the minute it was recorded, by the
   insert that records it; one already recorded (the insert's conflict)
   adds nothing.
3. A batch adds one row per (minute, tenant, outcome) it touches, not one
   per run: the counts are grouped in the statement, in key order, so two
   writers adding to the same rows lock them in one order.
4. ``slot`` spreads concurrent writers: a PostgreSQL store (so a node)
   picks one of ``SLOTS`` at random as it opens and writes only that one,
   so owners seldom wait on each other's rows (two on one slot wait, in
   key order, and count alike); a reader adds the slots up. SQLite has one
   writer and one slot, 0, as the migration's counts have.
5. Nothing else changes a row but retention, which drops whole minutes
   older than its cutoff (``purge_sql``).

Migration 25 fills the table from the runs and missed fires already kept
(``backfill``), with the same grouping the writes use.
"""

from __future__ import annotations

MINUTE_MS = 60_000
# Slots a PostgreSQL store picks its own from (rule 4).
SLOTS = 16

KEY = "(minute_ms, tenant, outcome, slot)"
ADD = f"ON CONFLICT {KEY} DO UPDATE SET runs = run_minutes.runs + excluded.runs"


def table(integer: str, without_rowid: str) -> str:
    """The table in a backend's integer type (``without_rowid``: SQLite's
    suffix, so that rows live in the key's order)."""
    return f"""CREATE TABLE run_minutes (
        minute_ms {integer} NOT NULL,
        tenant    TEXT      NOT NULL,
        outcome   TEXT      NOT NULL,
        slot      {integer} NOT NULL,
        runs      {integer} NOT NULL,
        PRIMARY KEY {KEY}
    ){without_rowid}"""


def _minute(expr: str) -> str:
    return f"({expr} / {MINUTE_MS}) * {MINUTE_MS}"


def backfill() -> list[str]:
    """Count what the store already keeps, into slot 0."""
    return [
        "INSERT INTO run_minutes (minute_ms, tenant, outcome, slot, runs)"
        f" SELECT {_minute('x.finished_at_ms')}, j.tenant, x.state, 0, count(*)"
        " FROM executions AS x JOIN jobs AS j ON j.job_id = x.job_id"
        " WHERE x.finished_at_ms IS NOT NULL GROUP BY 1, 2, 3",
        "INSERT INTO run_minutes (minute_ms, tenant, outcome, slot, runs)"
        f" SELECT {_minute('x.recorded_at_ms')}, j.tenant, 'missed', 0, count(*)"
        " FROM missed_fires AS x JOIN jobs AS j ON j.job_id = x.job_id GROUP BY 1, 2",
    ]


def migration(integer: str, without_rowid: str) -> list[str]:
    """Migration 25: the table, filled from what is kept."""
    return [table(integer, without_rowid), *backfill()]


def add_ended(p: str, in_ints: str) -> str:
    """Rule 1 where the ended runs are named by id, in a backend's parameter
    marker ``p`` and list test ``in_ints`` (``Dialect``'s; parameters: the
    slot, then the runs' ids): their counts added."""
    ids = in_ints.format(expr="e.run_id", type="int8")
    return (
        "INSERT INTO run_minutes (minute_ms, tenant, outcome, slot, runs)"
        f" SELECT {_minute('e.finished_at_ms')}, j.tenant, e.state, {p}, count(*)"
        f" FROM executions AS e JOIN jobs AS j ON j.job_id = e.job_id WHERE {ids}"
        f" GROUP BY 1, 2, 3 ORDER BY 1, 2, 3 {ADD}"
    )


def add_missed(p: str) -> str:
    """Rule 2 where the new missed fires are those with an id above a
    parameter (SQLite's, whose one writer gives new rows the next ids;
    parameters: the slot, then that id)."""
    return (
        "INSERT INTO run_minutes (minute_ms, tenant, outcome, slot, runs)"
        f" SELECT {_minute('m.recorded_at_ms')}, j.tenant, 'missed', {p}, count(*)"
        f" FROM missed_fires AS m JOIN jobs AS j ON j.job_id = m.job_id WHERE m.id > {p}"
        f" GROUP BY 1, 2 ORDER BY 1, 2 {ADD}"
    )


def counts_sql(p: str, *, tenant: bool) -> str:
    """The counts of the minutes from one parameter on (parameters: the
    bucket width twice, the first minute, and the tenant if ``tenant``), by
    bucket and outcome; the width is a whole number of minutes."""
    where = f" AND tenant = {p}" if tenant else ""
    return (
        f"SELECT (minute_ms / {p}) * {p}, outcome, sum(runs) FROM run_minutes"
        f" WHERE minute_ms >= {p}{where} GROUP BY 1, 2"
    )


def purge_sql(p: str) -> str:
    """Retention (rule 5): the minutes before one parameter, a minute's start."""
    return f"DELETE FROM run_minutes WHERE minute_ms < {p}"
