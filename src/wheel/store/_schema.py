"""Versioned schema migrations for both store backends.

Each backend keeps an ordered list of ``(version, statements)``. ``migrate()``
applies the versions above the recorded one inside one transaction that first
takes a lock (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: a transaction-scoped
advisory lock), so running it twice or from two processes at once is safe: the
second runner waits, then finds nothing left to do. Never edit a released
version; append a new one.

The shape follows the seed's data model: ``jobs`` keeps the spec as JSON text
plus the columns the hot paths filter on (``shard``, ``state``,
``next_run_at``, ``tenant``, ``name``), ``executions`` carries the dedupe
guarantee ``UNIQUE (job_id, scheduled_for, attempt)``.
"""

from __future__ import annotations

from wheel.store import _rollup
from wheel.store.outbox_sql import DDL_1 as OUTBOX_DDL_1
from wheel.store.outbox_sql import NOTIFY_FUNCTION as OUTBOX_NOTIFY_FUNCTION
from wheel.store.outbox_sql import SETTLED_INDEX as OUTBOX_SETTLED_INDEX
from wheel.store.outbox_sql import TRACE_COLUMN as OUTBOX_TRACE_COLUMN

# Run states that still hold a lease: the partial in-flight index covers them.
INFLIGHT_SQL = "('dispatched', 'running')"

# Due jobs by time: in schema 1 only, dropped by migration 3. Owners keep due
# fires in memory and no query reads it, while every claim moved each fired
# job's entry in it (two B-tree writes per dispatch).
DUE_INDEX = (
    "CREATE INDEX jobs_due ON jobs (next_run_at) WHERE state = 'active' AND next_run_at IS NOT NULL"
)
# In-flight runs by state: keyed by state then run id, so claims append and
# completions delete near the old end.
# The same as a condition on "executions AS e".
INFLIGHT_WHERE = f"e.state IN {INFLIGHT_SQL}"
INFLIGHT_INDEX = (
    f"CREATE INDEX executions_inflight ON executions (state) WHERE state IN {INFLIGHT_SQL}"
)

# Ended states whose fire may still be owed a retry or a re-dispatch.
UNWELL_SQL = "('failed', 'lost', 'timed_out')"
# Those runs by job: a restarting owner reads them (``retry_candidates``) and
# without it scanned every execution ever kept. Runs that end in these
# states are few; the index stays small and success writes nothing to it.
UNWELL_INDEX = f"CREATE INDEX executions_unwell ON executions (job_id) WHERE state IN {UNWELL_SQL}"
# Due-first gain (``Store.load_shards(due_by=...)``): a coarse due time,
# ``next_run_at >> DUE_BUCKET_SHIFT`` (buckets of about 17.5 minutes), so
# that a new owner finds a shard's jobs due soon through an index, not a scan.
# Indexing ``next_run_at`` itself would move every fired recurring job's
# entry (migration 3 dropped that index); the bucket changes only when a
# fire crosses a boundary, so on PostgreSQL most claims stay HOT updates (a
# job fired each minute crosses one boundary in about 17 fires). The index
# covers the active jobs by shard, and also finds those with no next fire.
DUE_BUCKET_SHIFT = 20
DUE_BUCKET_SQL = f"next_run_at >> {DUE_BUCKET_SHIFT}"


# ``retry_candidates`` on both stores (``e`` the execution, ``j`` its job):
# latest attempts owed a retry or re-dispatch, found through that index.
RETRY_WHERE = (
    f"e.state IN {UNWELL_SQL} AND j.state <> 'cancelled'"
    " AND NOT EXISTS (SELECT 1 FROM executions AS n WHERE n.job_id = e.job_id"
    " AND n.scheduled_for = e.scheduled_for AND n.attempt > e.attempt)"
)

# ListJobs by name prefix (the web console's search): a range of this index,
# in code-point order on both stores, and by state: a page of paused jobs
# among a million active ones reads a page of rows. A claim writes neither,
# save the state of a one-shot it completes (a column PostgreSQL's
# jobs_due_soon already reads, so that update was never a HOT one).
NAME_INDEX = "CREATE INDEX jobs_name ON jobs (name{collate}, job_id)"
STATE_INDEX = "CREATE INDEX jobs_state ON jobs (state, job_id)"
# A name search within a tenant (the console's every search with auth on):
# a range of one index in the page's order, not the tenant's every job
# sorted. Migration 13. A state beside a tenant or a name is checked on the
# rows of their index, not indexed with them: a job's state changes on the
# hot path (a one-shot's fire completes it), and each index holding the state
# is written again then (two such indexes cost the node about a tenth of its
# CPU at 2,000 fires/s of which half end one-shots, measured A/B).
TENANT_NAME_INDEX = "CREATE INDEX jobs_tenant_name ON jobs (tenant, name{collate}, job_id)"


def _tenant_name_index(collate: str) -> list[str]:
    """Migration 13: a tenant's names, in code-point order."""
    return [TENANT_NAME_INDEX.format(collate=collate)]


# Dead letters not redriven yet (``Store.list_dead_letters``): by job and for
# every job, newest first. Runs end dead-lettered rarely: the indexes stay
# small, and a success writes nothing to them.
DEAD_BY_JOB_INDEX = (
    "CREATE INDEX executions_dead ON executions (job_id, run_id) WHERE state = 'dead_lettered'"
)
DEAD_INDEX = "CREATE INDEX executions_dead_all ON executions (run_id) WHERE state = 'dead_lettered'"


# Migration 22, the console's aggregates (wheel.store._overview): runs by
# when they ended, and missed fires by when they were recorded. A claim
# inserts a run with no end, which this partial index leaves out; the
# completion sets the end and the terminal state once, together, adding one
# entry at the newest end, and nothing moves it after. Keyed by end first (a
# range of the last hour or day), carrying the state and the job, it covers
# the count of every tenant's runs by minute and outcome.
FINISHED_INDEX = (
    "CREATE INDEX executions_finished ON executions (finished_at_ms, state, job_id)"
    " WHERE finished_at_ms IS NOT NULL"
)
MISSED_RECORDED_INDEX = "CREATE INDEX missed_fires_recorded ON missed_fires (recorded_at_ms)"
OVERVIEW_INDEXES = [FINISHED_INDEX, MISSED_RECORDED_INDEX]


def _job_updates(integer: str, text: str, boolean: str) -> list[str]:
    """Migration 9 in a backend's types: each job's recorded spec updates
    (``Store.update_job``), keyed by job and version, and the per-job
    idempotency keys of updates."""
    return [
        f"""CREATE TABLE job_updates (
            job_id          {integer} NOT NULL,
            version         {integer} NOT NULL,
            updated_at_ms   {integer} NOT NULL,
            old_spec        {text}    NOT NULL,
            new_spec        {text}    NOT NULL,
            payload_changed {boolean} NOT NULL,
            updated_by      {text}    NOT NULL,
            idempotency_key {text},
            body_hash       {text}    NOT NULL,
            PRIMARY KEY (job_id, version)
        )""",
        "CREATE UNIQUE INDEX job_updates_key ON job_updates (job_id, idempotency_key)"
        " WHERE idempotency_key IS NOT NULL",
        DEAD_BY_JOB_INDEX,
        DEAD_INDEX,
    ]


def _results_and_secrets(integer: str, text: str, blob: str) -> list[str]:
    """Migration 16 in a backend's types: each run's result (a JSON object,
    NULL where a run left none; it goes with its run's row, so retention
    removes it too), and the signing secrets of HTTP targets, by tenant, name
    and version, their values encrypted with the nodes' secrets key
    (``key_id`` names it). A version past ``retires_at_ms`` no longer signs."""
    return [
        f"ALTER TABLE executions ADD COLUMN result {text}",
        f"""CREATE TABLE secrets (
            tenant        {text}    NOT NULL,
            name          {text}    NOT NULL,
            version       {integer} NOT NULL,
            key_id        {text}    NOT NULL,
            ciphertext    {blob}    NOT NULL,
            created_at_ms {integer} NOT NULL,
            retires_at_ms {integer},
            PRIMARY KEY (tenant, name, version)
        )""",
    ]


def _audit(integer: str, text: str, identity: str) -> list[str]:
    """Migration 21 in a backend's types: the audit trail of administrative
    changes (wheel.store.base.AuditEntry), read newest first by time, by job
    and by tenant, and purged by time."""
    return [
        f"""CREATE TABLE audit_log (
            entry_id {identity},
            at_ms    {integer} NOT NULL,
            actor    {text}    NOT NULL,
            tenant   {text}    NOT NULL,
            address  {text}    NOT NULL,
            action   {text}    NOT NULL,
            target   {text}    NOT NULL,
            job_id   {integer},
            details  {text}    NOT NULL
        )""",
        "CREATE INDEX audit_log_at ON audit_log (at_ms)",
        "CREATE INDEX audit_log_job ON audit_log (job_id, entry_id) WHERE job_id IS NOT NULL",
        "CREATE INDEX audit_log_tenant ON audit_log (tenant, entry_id)",
    ]


def _calendars(integer: str, text: str) -> list[str]:
    """Migration 18 in a backend's types: calendars, the days jobs skip, by
    tenant and name; ``body`` holds the days as JSON, ``version`` counts
    the calendar's changes."""
    return [
        f"""CREATE TABLE calendars (
            tenant     {text}    NOT NULL,
            name       {text}    NOT NULL,
            body       {text}    NOT NULL,
            version    {integer} NOT NULL,
            updated_at {integer} NOT NULL,
            PRIMARY KEY (tenant, name)
        )""",
    ]


def _job_traces(integer: str, text: str) -> list[str]:
    """Migration 23 in a backend's types: the W3C trace context of the API
    call that last submitted or updated a job, when tracing is on
    (wheel.tracing): each fire's dispatch span links to it."""
    return [
        f"""CREATE TABLE job_traces (
            job_id        {integer} PRIMARY KEY,
            traceparent   {text}    NOT NULL,
            updated_at_ms {integer} NOT NULL
        )""",
    ]


def _limits(integer: str, text: str) -> list[str]:
    """Migration 20 in a backend's types: concurrency keys and rate limits
    (``wheel.store._limits``), one row per tenant and key, each its key's
    arbiter; and each run's key, NULL for a job without one (set by the
    claim that took the run's permit, read by the trigger that gives it
    back)."""
    return [
        f"""CREATE TABLE limits (
            tenant          {text}    NOT NULL,
            concurrency_key {text}    NOT NULL,
            max_concurrent  {integer} NOT NULL,
            rate            {integer} NOT NULL,
            rate_period_ms  {integer} NOT NULL,
            burst           {integer} NOT NULL,
            in_flight       {integer} NOT NULL,
            tokens_milli    {integer} NOT NULL,
            refilled_at_ms  {integer} NOT NULL,
            updated_at_ms   {integer} NOT NULL,
            PRIMARY KEY (tenant, concurrency_key)
        )""",
        f"ALTER TABLE executions ADD COLUMN concurrency_key {text}",
    ]


# A keyed run leaving dispatched/running gives its permit back in the
# transaction that moves it, whichever write does (a completion, the reaper's
# lost, a timeout, a cancel, a dead letter, or a delete): the trigger is the
# one place, so no path can forget it. Its WHEN clause is all a run without
# a key pays. The limit's tenant is the run's job's.
RELEASE_WHEN = (
    f"OLD.concurrency_key IS NOT NULL AND OLD.state IN {INFLIGHT_SQL}"
    f" AND NEW.state NOT IN {INFLIGHT_SQL}"
)
RELEASE_DELETED_WHEN = f"OLD.concurrency_key IS NOT NULL AND OLD.state IN {INFLIGHT_SQL}"
_RELEASE = (
    "UPDATE limits SET in_flight = {greatest}(in_flight - 1, 0)"
    " WHERE tenant = (SELECT j.tenant FROM jobs AS j WHERE j.job_id = OLD.job_id)"
    " AND concurrency_key = OLD.concurrency_key"
)
SQLITE_LIMIT_TRIGGERS = [
    "CREATE TRIGGER executions_release_permit AFTER UPDATE OF state ON executions"
    f" WHEN {RELEASE_WHEN} BEGIN {_RELEASE.format(greatest='max')}; END",
    "CREATE TRIGGER executions_release_deleted AFTER DELETE ON executions"
    f" WHEN {RELEASE_DELETED_WHEN} BEGIN {_RELEASE.format(greatest='max')}; END",
]
PG_LIMIT_TRIGGERS = [
    "CREATE FUNCTION wheel_release_permit() RETURNS trigger LANGUAGE plpgsql AS $$"
    f" BEGIN {_RELEASE.format(greatest='greatest')}; RETURN NULL; END $$",
    "CREATE TRIGGER executions_release_permit AFTER UPDATE OF state ON executions"
    f" FOR EACH ROW WHEN ({RELEASE_WHEN}) EXECUTE FUNCTION wheel_release_permit()",
    "CREATE TRIGGER executions_release_deleted AFTER DELETE ON executions"
    f" FOR EACH ROW WHEN ({RELEASE_DELETED_WHEN}) EXECUTE FUNCTION wheel_release_permit()",
]


# Schema 26 (PostgreSQL alone): a release that takes a key off its limit
# (``in_flight`` was at ``max_concurrent`` or past it: claims of other nodes
# may be waiting for the permit) notifies ``PERMITS_CHANNEL`` at commit, with
# the schema, tenant and key as a JSON array; the nodes LISTEN and send the
# key's waiting claims at once instead of at their next poll
# (``wheel.node._permits``). A release under a limit that does not bind
# notifies nothing.
PERMITS_CHANNEL = "wheel_permits"
PG_NOTIFYING_RELEASE = [
    "CREATE OR REPLACE FUNCTION wheel_release_permit() RETURNS trigger LANGUAGE plpgsql AS $$"
    " DECLARE t text; n bigint; m bigint;"
    " BEGIN"
    " SELECT j.tenant INTO t FROM jobs AS j WHERE j.job_id = OLD.job_id;"
    " UPDATE limits SET in_flight = greatest(in_flight - 1, 0)"
    " WHERE tenant = t AND concurrency_key = OLD.concurrency_key"
    " RETURNING in_flight, max_concurrent INTO n, m;"
    " IF m > 0 AND n + 1 >= m THEN"
    f" PERFORM pg_notify('{PERMITS_CHANNEL}',"
    " json_build_array(current_schema(), t, OLD.concurrency_key)::text);"
    " END IF;"
    " RETURN NULL; END $$",
]

SQLITE_MIGRATIONS: list[tuple[int, list[str]]] = [
    (
        1,
        [
            # Id and change counters. SQLite serializes writers, so a counter row
            # read and bumped inside a write transaction hands out values in
            # commit order (which is what makes changes_since a simple "> seq").
            """CREATE TABLE counters (
                name  TEXT PRIMARY KEY,
                value INTEGER NOT NULL
            ) WITHOUT ROWID""",
            "INSERT INTO counters (name, value) VALUES"
            " ('job_id', 0), ('run_id', 0), ('change_seq', 0)",
            """CREATE TABLE jobs (
                job_id          INTEGER PRIMARY KEY,
                shard           INTEGER NOT NULL,
                tenant          TEXT    NOT NULL,
                name            TEXT    NOT NULL,
                state           TEXT    NOT NULL,
                next_run_at     INTEGER,
                one_shot        INTEGER NOT NULL,
                idempotency_key TEXT,
                created_at_ms   INTEGER NOT NULL,
                updated_at_ms   INTEGER NOT NULL,
                change_seq      INTEGER NOT NULL
            )""",
            # The definition lives beside the hot schedule row: a claim rewrites
            # ~60 bytes of jobs instead of the whole spec (measured: the spec in
            # the row tripled the WAL volume of a claim batch).
            """CREATE TABLE job_specs (
                job_id INTEGER PRIMARY KEY,
                spec   TEXT    NOT NULL
            )""",
            DUE_INDEX,
            "CREATE INDEX jobs_owned ON jobs (shard) WHERE state IN ('active', 'paused')",
            "CREATE INDEX jobs_changes ON jobs (change_seq)",
            "CREATE INDEX jobs_tenant ON jobs (tenant, job_id)",
            """CREATE TABLE executions (
                run_id           INTEGER PRIMARY KEY,
                job_id           INTEGER NOT NULL,
                scheduled_for    INTEGER NOT NULL,
                attempt          INTEGER NOT NULL,
                state            TEXT    NOT NULL,
                fence            INTEGER NOT NULL,
                worker_id        TEXT,
                dispatched_at_ms INTEGER NOT NULL,
                started_at_ms    INTEGER,
                finished_at_ms   INTEGER,
                error            TEXT,
                UNIQUE (job_id, scheduled_for, attempt)
            )""",
            INFLIGHT_INDEX,
            """CREATE TABLE missed_fires (
                id             INTEGER PRIMARY KEY,
                job_id         INTEGER NOT NULL,
                scheduled_for  INTEGER NOT NULL,
                reason         TEXT    NOT NULL,
                recorded_at_ms INTEGER NOT NULL,
                UNIQUE (job_id, scheduled_for)
            )""",
            """CREATE TABLE idempotency_keys (
                tenant          TEXT    NOT NULL,
                idempotency_key TEXT    NOT NULL,
                body_hash       TEXT    NOT NULL,
                job_id          INTEGER NOT NULL,
                created_at_ms   INTEGER NOT NULL,
                PRIMARY KEY (tenant, idempotency_key)
            ) WITHOUT ROWID""",
            """CREATE TABLE shard_epochs (
                shard INTEGER PRIMARY KEY,
                epoch INTEGER NOT NULL,
                owner TEXT    NOT NULL
            )""",
        ],
    ),
    (
        2,
        [
            # A schedule move by the shard's owner (claim or advance CAS), as
            # opposed to a change made through the API: a running owner reads
            # only the latter back (it made the former itself); a restarting
            # owner reads both.
            "ALTER TABLE jobs ADD COLUMN owner_move INTEGER NOT NULL DEFAULT 0",
        ],
    ),
    (3, ["DROP INDEX IF EXISTS jobs_due"]),
    (
        4,
        [
            # An owner's schedule move takes its change number in move_seq,
            # which no index covers; change_seq (indexed) is left to changes
            # through the API, so a claim's update of its job writes no index
            # (unless it ends a one-shot: state is in jobs_state).
            # A running owner reads back only API changes, now also those an
            # owner move followed (owner_move hid them).
            "ALTER TABLE jobs ADD COLUMN move_seq INTEGER",
            "ALTER TABLE jobs DROP COLUMN owner_move",
        ],
    ),
    (5, [UNWELL_INDEX]),
    (
        6,
        [
            # Bearer tokens (wheel.auth): only a hash of each secret is kept.
            # scopes and pools are JSON lists of strings.
            """CREATE TABLE auth_tokens (
                token_id      TEXT    PRIMARY KEY,
                secret_hash   TEXT    NOT NULL,
                tenant        TEXT    NOT NULL,
                scopes        TEXT    NOT NULL,
                worker_id     TEXT,
                pools         TEXT    NOT NULL,
                label         TEXT    NOT NULL,
                created_at_ms INTEGER NOT NULL,
                expires_at_ms INTEGER,
                revoked_at_ms INTEGER
            ) WITHOUT ROWID""",
            # Per-tenant limits; NULL: no limit.
            """CREATE TABLE tenant_quotas (
                tenant        TEXT    PRIMARY KEY,
                max_jobs      INTEGER,
                submits_per_s REAL,
                fires_per_s   REAL,
                max_in_flight INTEGER,
                updated_at_ms INTEGER NOT NULL
            ) WITHOUT ROWID""",
        ],
    ),
    (
        7,
        [
            # Profiles (wheel.engine.profiles): what jobs share, kept once.
            # A job names its profile and keeps the one instant of its
            # schedule that is its own, so an owner loads a job from four
            # integers without parsing its spec. A NULL profile: a job stored
            # before, read from its spec.
            """CREATE TABLE job_profiles (
                profile_id INTEGER PRIMARY KEY,
                body       TEXT    NOT NULL
            )""",
            "ALTER TABLE jobs ADD COLUMN profile_id INTEGER",
            "ALTER TABLE jobs ADD COLUMN sched_param INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE jobs ADD COLUMN has_payload INTEGER NOT NULL DEFAULT 0",
            # The payload beside the spec, read with the claim that dispatches
            # it; a NULL: a job stored before, whose spec holds it.
            "ALTER TABLE job_specs ADD COLUMN payload BLOB",
        ],
    ),
    (
        8,
        [
            # A coarse due time (DUE_BUCKET_SHIFT) for the due-first load's
            # query, shared with PostgreSQL. Computed, not stored, and not
            # indexed: only a cluster gains shards due first, on PostgreSQL.
            "ALTER TABLE jobs ADD COLUMN due_bucket INTEGER"
            f" GENERATED ALWAYS AS ({DUE_BUCKET_SQL}) VIRTUAL",
        ],
    ),
    (9, _job_updates("INTEGER", "TEXT", "INTEGER")),
    (10, [NAME_INDEX.format(collate=""), STATE_INDEX]),
    (
        11,
        # The outbox is PostgreSQL's alone (it rides in the application's
        # transaction): nothing here, so the two backends' versions stay equal.
        [],
    ),
    (12, []),  # the outbox's trigger function again: PostgreSQL's alone
    (13, _tenant_name_index("")),
    (14, []),  # the outbox's settled rows by age: PostgreSQL's alone
    (
        15,
        [
            # jobs_owned found a shard's live jobs; a SQLite node is the only
            # one and loads every shard in a scan by id, and jobs_state finds
            # the live jobs when a query asks by state. Keyed by shard first,
            # it cost a random leaf page for every one-shot a batch ended:
            # 65 of the 91 pages a batch wrote to the WAL at 2,000 fires/s.
            "DROP INDEX IF EXISTS jobs_owned",
        ],
    ),
    (16, _results_and_secrets("INTEGER", "TEXT", "BLOB")),
    (18, _calendars("INTEGER", "TEXT")),
    (20, _limits("INTEGER", "TEXT") + SQLITE_LIMIT_TRIGGERS),
    (21, _audit("INTEGER", "TEXT", "INTEGER PRIMARY KEY")),
    # The console's runs by when they ended, and missed fires by when they
    # were recorded (wheel.store._overview says what each write costs).
    (22, OVERVIEW_INDEXES),
    (23, _job_traces("INTEGER", "TEXT")),
    (24, []),  # the outbox's trace context: PostgreSQL's alone
    # Runs and missed fires counted by minute, tenant and outcome
    # (wheel.store._rollup), filled from the rows already kept.
    (25, _rollup.migration("INTEGER", " WITHOUT ROWID")),
    (26, []),  # a release notifies the other nodes: PostgreSQL's alone
]


PG_MIGRATIONS: list[tuple[int, list[str]]] = [
    (
        1,
        [
            "CREATE SEQUENCE job_id_seq AS bigint",
            # change_xid: the 64-bit id of the transaction that last changed the
            # job (pg_current_xact_id()). changes_since orders by it and only
            # hands out transactions below the snapshot's xmin; see postgres/_feed.py.
            """CREATE TABLE jobs (
                job_id          bigint PRIMARY KEY,
                shard           smallint NOT NULL,
                tenant          text     NOT NULL,
                name            text     NOT NULL,
                state           text     NOT NULL,
                next_run_at     bigint,
                one_shot        boolean  NOT NULL,
                idempotency_key text,
                created_at_ms   bigint   NOT NULL,
                updated_at_ms   bigint   NOT NULL,
                change_xid      xid8     NOT NULL DEFAULT pg_current_xact_id()
            )""",
            """CREATE TABLE job_specs (
                job_id bigint PRIMARY KEY,
                spec   text   NOT NULL
            )""",
            DUE_INDEX,
            "CREATE INDEX jobs_changes ON jobs (change_xid)",
            """CREATE TABLE executions (
                run_id           bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
                job_id           bigint   NOT NULL,
                scheduled_for    bigint   NOT NULL,
                attempt          integer  NOT NULL,
                state            text     NOT NULL,
                fence            bigint   NOT NULL,
                worker_id        text,
                dispatched_at_ms bigint   NOT NULL,
                started_at_ms    bigint,
                finished_at_ms   bigint,
                error            text,
                CONSTRAINT executions_fire_attempt UNIQUE (job_id, scheduled_for, attempt)
            )""",
            INFLIGHT_INDEX,
            """CREATE TABLE missed_fires (
                id             bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
                job_id         bigint NOT NULL,
                scheduled_for  bigint NOT NULL,
                reason         text   NOT NULL,
                recorded_at_ms bigint NOT NULL,
                CONSTRAINT missed_fires_fire UNIQUE (job_id, scheduled_for)
            )""",
            """CREATE TABLE idempotency_keys (
                tenant          text   NOT NULL,
                idempotency_key text   NOT NULL,
                body_hash       text   NOT NULL,
                job_id          bigint NOT NULL,
                created_at_ms   bigint NOT NULL,
                PRIMARY KEY (tenant, idempotency_key)
            )""",
            """CREATE TABLE shard_epochs (
                shard integer PRIMARY KEY,
                epoch bigint  NOT NULL,
                owner text    NOT NULL
            )""",
        ],
    ),
    (
        2,
        [
            # A schedule move by the shard's owner (claim or advance CAS), as
            # opposed to a change made through the API: a running owner reads
            # only the latter back (it made the former itself); a restarting
            # owner reads both.
            "ALTER TABLE jobs ADD COLUMN owner_move boolean NOT NULL DEFAULT false",
        ],
    ),
    (3, ["DROP INDEX IF EXISTS jobs_due"]),
    (
        4,
        [
            # An owner's schedule move records its transaction in move_xid,
            # which no index covers; change_xid (indexed) is left to changes
            # through the API. A claim's update of its job touches no indexed
            # column and stays HOT, and the room a page keeps free lets it stay
            # on its page. A running owner reads back only API changes, now
            # also those an owner move followed (owner_move hid them).
            "ALTER TABLE jobs ADD COLUMN move_xid xid8",
            "ALTER TABLE jobs DROP COLUMN owner_move",
            "ALTER TABLE jobs SET (fillfactor = 90)",
        ],
    ),
    (5, [UNWELL_INDEX]),
    (
        6,
        [
            # Bearer tokens (wheel.auth): only a hash of each secret is kept.
            # scopes and pools are JSON lists of strings.
            """CREATE TABLE auth_tokens (
                token_id      text   PRIMARY KEY,
                secret_hash   text   NOT NULL,
                tenant        text   NOT NULL,
                scopes        text   NOT NULL,
                worker_id     text,
                pools         text   NOT NULL,
                label         text   NOT NULL,
                created_at_ms bigint NOT NULL,
                expires_at_ms bigint,
                revoked_at_ms bigint
            )""",
            # Per-tenant limits; NULL: no limit.
            """CREATE TABLE tenant_quotas (
                tenant        text             PRIMARY KEY,
                max_jobs      bigint,
                submits_per_s double precision,
                fires_per_s   double precision,
                max_in_flight bigint,
                updated_at_ms bigint           NOT NULL
            )""",
            # A tenant's jobs (ListJobs of one tenant, its max-jobs quota), as
            # SQLite has had since schema 1.
            "CREATE INDEX jobs_tenant ON jobs (tenant, job_id)",
        ],
    ),
    (
        7,
        [
            # Profiles (wheel.engine.profiles): what jobs share, kept once.
            # A job names its profile and keeps the one instant of its
            # schedule that is its own, so an owner loads a job from four
            # integers without parsing its spec. A NULL profile: a job stored
            # before, read from its spec.
            """CREATE TABLE job_profiles (
                profile_id bigint PRIMARY KEY,
                body       text   NOT NULL
            )""",
            "ALTER TABLE jobs ADD COLUMN profile_id bigint",
            "ALTER TABLE jobs ADD COLUMN sched_param bigint NOT NULL DEFAULT 0",
            "ALTER TABLE jobs ADD COLUMN has_payload boolean NOT NULL DEFAULT false",
            # The payload beside the spec, read with the claim that dispatches
            # it; a NULL: a job stored before, whose spec holds it.
            "ALTER TABLE job_specs ADD COLUMN payload bytea",
        ],
    ),
    (
        8,
        [
            # A coarse due time (DUE_BUCKET_SHIFT), stored and indexed by shard
            # for the active jobs: a shard gained due first reads its jobs due
            # soon (and those with no next fire) through it. The table is
            # rewritten once, here.
            "ALTER TABLE jobs ADD COLUMN due_bucket bigint"
            f" GENERATED ALWAYS AS ({DUE_BUCKET_SQL}) STORED",
            "CREATE INDEX jobs_due_soon ON jobs (shard, due_bucket) WHERE state = 'active'",
            # Jobs stored before profiles, which the due-first load reads whole.
            "CREATE INDEX jobs_unprofiled ON jobs (shard)"
            " WHERE profile_id IS NULL AND state IN ('active', 'paused')",
        ],
    ),
    (9, _job_updates("bigint", "text", "boolean")),
    (10, [NAME_INDEX.format(collate=' COLLATE "C"'), STATE_INDEX]),
    (
        11,
        # The transactional submit's outbox (wheel.store.outbox_sql), for
        # applications whose tables live in wheel's own database; its DDL is
        # idempotent, so a table made before by ``wheelctl outbox init`` stays.
        OUTBOX_DDL_1,
    ),
    (
        12,
        # The outbox trigger's channel fits PostgreSQL's 63 bytes whatever
        # the schema's name (outbox_sql.CHANNEL): with 11's, a schema's name
        # of over 50 bytes failed every insert into the outbox.
        [OUTBOX_NOTIFY_FUNCTION],
    ),
    (13, _tenant_name_index(' COLLATE "C"')),
    (
        14,
        # The outbox's settled rows by when they settled, which the relay's
        # purge reads (done and failed rows were kept for ever).
        [OUTBOX_SETTLED_INDEX],
    ),
    (15, []),  # SQLite's jobs_owned dropped: PostgreSQL keeps its shard indexes
    (16, _results_and_secrets("bigint", "text", "bytea")),
    (18, _calendars("bigint", "text")),
    (20, _limits("bigint", "text") + PG_LIMIT_TRIGGERS),
    (21, _audit("bigint", "text", "bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY")),
    (22, OVERVIEW_INDEXES),
    (23, _job_traces("bigint", "text")),
    # The trace context an application's span gave an outbox row.
    (24, [OUTBOX_TRACE_COLUMN]),
    (25, _rollup.migration("bigint", "")),
    (26, PG_NOTIFYING_RELEASE),
]
