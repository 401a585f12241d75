"""The ``wheel_outbox`` table: its DDL and the statements that use it.

The table lives in the application's PostgreSQL database (``wheelctl outbox
init``) or in wheel's own (migration 11 of the PostgreSQL store, its trigger's
function replaced by migration 12). An application inserts a row in its own
transaction (``wheel.outbox.submit``); an INSERT's trigger notifies the
schema's channel (``CHANNEL``) once per statement, and a node's relay
(``wheel.node.OutboxRelay``) claims pending rows, creates their jobs under
the row's idempotency key and records each row's fate in it.

A row's states: ``pending`` (not yet a job; ``error`` may hold the last
transient failure, such as the store being down), ``done`` (``job_id`` is the
job; a row picked up twice names the same job, its key makes sure of it) and
``failed`` (``error_code`` and ``error`` say why; nothing was created).

Plain strings only: the store's migrations, the application's side and the
relay all read them, and none of them needs another's imports.
"""

from __future__ import annotations

__all__ = [
    "CHANNEL",
    "CLAIM",
    "DDL",
    "DDL_1",
    "FAILED",
    "HAS_SETTLED_INDEX",
    "HAS_TRACE_COLUMN",
    "INSERT",
    "INSERT_TRACED",
    "LOCK_FOR_PURGE",
    "NOTIFY_FUNCTION",
    "PURGE",
    "RECORD",
    "SETTLED_INDEX",
    "STATES",
    "STATUS",
    "TABLE_CHANNEL",
    "TRACE_COLUMN",
]

# The notification channel of the schema ``{schema}`` (a SQL expression),
# computed by the database on both sides, the trigger's pg_notify and the
# relay's LISTEN. Per schema: one database may hold several wheel_outbox
# tables (one per schema), and a relay wakes for its own only. A channel is
# an identifier, at most 63 bytes (NAMEDATALEN - 1), and pg_notify fails the
# INSERT, and with it the application's transaction, on a longer one: the
# prefix (13 bytes) and a schema's name of up to 50 bytes fit as they are;
# past that the name is replaced by the first 128 bits of its SHA-256 in hex
# (45 bytes in all; sha256, not md5, which a server in FIPS mode refuses).
# Two schemas whose channels agreed by chance would only wake each other's
# relay for nothing.
CHANNEL = (
    "CASE WHEN octet_length({schema}) <= 50 THEN 'wheel_outbox:' || {schema}"
    " ELSE 'wheel_outbox:'"
    " || left(encode(sha256(convert_to({schema}, 'UTF8')), 'hex'), 32) END"
)

STATES = ("pending", "done", "failed")

_TABLE: list[str] = [
    """CREATE TABLE IF NOT EXISTS wheel_outbox (
        id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
        tenant          text        NOT NULL,
        idempotency_key text        NOT NULL,
        spec            text        NOT NULL,
        -- What "the same request" means for the key, as a node reckons it
        -- for Client.submit (the wire spec's hash): a row and a Client.submit
        -- with one key and one request name one job. NULL: the spec's hash.
        body_hash       text,
        state           text        NOT NULL DEFAULT 'pending'
                        CHECK (state IN ('pending', 'done', 'failed')),
        attempts        integer     NOT NULL DEFAULT 0,
        job_id          bigint,
        error_code      text,
        error           text,
        done_at         timestamptz,
        -- The node whose relay wrote the row's fate last.
        relayed_by      text
    )""",
    # The relay's claim and the backlog's count read only these. Pending rows
    # by attempts first: a row whose pick-ups keep failing for a passing
    # reason (its tenant over quota) goes behind the fresh ones, not before.
    "CREATE INDEX IF NOT EXISTS wheel_outbox_pending ON wheel_outbox (attempts, id)"
    " WHERE state = 'pending'",
    "CREATE INDEX IF NOT EXISTS wheel_outbox_failed ON wheel_outbox (id) WHERE state = 'failed'",
]

# Once per statement, not per row: 10,000 rows inserted in one statement
# wake the relay once (and PostgreSQL folds a transaction's identical
# notifications into one, delivered at its commit; a rollback sends none).
_TRIGGER = """CREATE OR REPLACE TRIGGER wheel_outbox_notify
        AFTER INSERT ON wheel_outbox
        FOR EACH STATEMENT EXECUTE FUNCTION wheel_outbox_notify()"""

# The trigger's function as migration 11 made it: a schema's name of over 50
# bytes made a channel too long, and the INSERT failed.
_NOTIFY_FUNCTION_1 = """CREATE OR REPLACE FUNCTION wheel_outbox_notify() RETURNS trigger
        LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('wheel_outbox:' || TG_TABLE_SCHEMA, '');
        RETURN NULL;
    END $$"""

# The trigger's function now: its channel always fits (``CHANNEL``).
NOTIFY_FUNCTION = f"""CREATE OR REPLACE FUNCTION wheel_outbox_notify() RETURNS trigger
        LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify({CHANNEL.format(schema="TG_TABLE_SCHEMA")}, '');
        RETURN NULL;
    END $$"""

# Settled rows by when their fate was recorded: the relay's purge (``PURGE``)
# reads the oldest of them and nothing else. Rows enter it as the relay
# records their fate, never in the application's insert. Migration 14 of
# wheel's own store; ``wheelctl outbox init`` run again adds it to a table
# made before.
SETTLED_INDEX = (
    "CREATE INDEX IF NOT EXISTS wheel_outbox_settled ON wheel_outbox (done_at)"
    " WHERE state <> 'pending'"
)

# The W3C trace context of the span a row was inserted under, when the
# application traces (``wheel.tracing``): the job's fires link to it.
# Migration 24 of wheel's own store; ``wheelctl outbox init`` run again adds
# it to a table made before (until then a traced insert is refused by the
# database, and the relay reads no context: ``HAS_TRACE_COLUMN``).
TRACE_COLUMN = "ALTER TABLE wheel_outbox ADD COLUMN IF NOT EXISTS traceparent text"

# The DDL as migration 11 of wheel's own store ran it, never to change (a
# released migration; migration 12 replaces the function, 14 adds
# ``SETTLED_INDEX``).
DDL_1: list[str] = [*_TABLE, _NOTIFY_FUNCTION_1, _TRIGGER]
# The DDL now, all of it idempotent: ``wheelctl outbox init`` run again on a
# table made before brings its trigger's function and its indexes up to date.
DDL: list[str] = [*_TABLE, SETTLED_INDEX, TRACE_COLUMN, NOTIFY_FUNCTION, _TRIGGER]

INSERT = (
    "INSERT INTO wheel_outbox (tenant, idempotency_key, spec, body_hash)"
    " VALUES (%s, %s, %s, %s) RETURNING id"
)

INSERT_TRACED = (
    "INSERT INTO wheel_outbox (tenant, idempotency_key, spec, body_hash, traceparent)"
    " VALUES (%s, %s, %s, %s, %s) RETURNING id"
)

# Whether the table the search_path finds has ``TRACE_COLUMN``.
HAS_TRACE_COLUMN = """
SELECT EXISTS (
  SELECT 1 FROM pg_attribute
   WHERE attrelid = to_regclass('wheel_outbox') AND attname = 'traceparent' AND NOT attisdropped)
"""

# The channel of the table the search_path finds, to listen on (no row: no
# table).
TABLE_CHANNEL = (
    f"SELECT {CHANNEL.format(schema='n.nspname')}"
    " FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
    " WHERE c.oid = to_regclass('wheel_outbox')"
)

# Fewest pick-ups, then oldest, first; rows another relay holds are passed
# over, not waited for.
CLAIM = (
    "SELECT id, idempotency_key, spec, body_hash, {trace} FROM wheel_outbox"
    " WHERE state = 'pending' ORDER BY attempts, id LIMIT %s FOR UPDATE SKIP LOCKED"
)

# Each claimed row's fate, in the claim's transaction.
RECORD = """
UPDATE wheel_outbox AS o
   SET state = v.state, job_id = v.job_id, error_code = v.code, error = v.error,
       attempts = o.attempts + 1, relayed_by = %s,
       done_at = CASE WHEN v.state = 'pending' THEN NULL ELSE clock_timestamp() END
  FROM unnest(%s::bigint[], %s::text[], %s::bigint[], %s::text[], %s::text[])
       AS v (id, state, job_id, code, error)
 WHERE o.id = v.id
"""

# Whether the table the search_path finds has ``SETTLED_INDEX``, valid (an
# index a failed or a concurrent build or drop left invalid is one the planner
# skips): without it a purge would read the whole table, so the relay purges
# nothing then.
HAS_SETTLED_INDEX = """
SELECT EXISTS (
  SELECT 1 FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
   WHERE i.indrelid = to_regclass('wheel_outbox') AND c.relname = 'wheel_outbox_settled'
     AND i.indisvalid)
"""

# Taken first in a purge's transaction, before it asks for the index: the
# lock a DELETE takes anyway, and one that a ``DROP INDEX`` waits for, so the
# answer holds until the DELETE has run.
LOCK_FOR_PURGE = "LOCK TABLE wheel_outbox IN ROW EXCLUSIVE MODE"

# Up to a batch of the rows settled (done or failed) more than a number of
# milliseconds ago, oldest first, through ``SETTLED_INDEX``; rows another
# transaction holds are left for the next batch. Pending rows are never
# touched, however old.
PURGE = """
DELETE FROM wheel_outbox WHERE id IN (
  SELECT id FROM wheel_outbox
   WHERE state <> 'pending' AND done_at < clock_timestamp() - %s * interval '1 millisecond'
   ORDER BY done_at LIMIT %s FOR UPDATE SKIP LOCKED)
"""

# The backlog through the partial indexes: pending rows, the oldest one's age
# (s), and those whose last pick-up failed for a reason that passes (they are
# tried again); then the failed rows.
STATUS = """
SELECT count(*) FILTER (WHERE state = 'pending'),
       coalesce(extract(epoch FROM clock_timestamp()
                - min(created_at) FILTER (WHERE state = 'pending')), 0),
       count(*) FILTER (WHERE state = 'pending' AND error IS NOT NULL)
  FROM wheel_outbox WHERE state = 'pending'
"""

FAILED = "SELECT count(*) FROM wheel_outbox WHERE state = 'failed'"
