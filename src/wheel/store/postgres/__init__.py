"""The shared record of truth: PostgreSQL through psycopg 3 and a connection pool.

Durability: the backend relies on the server's defaults (``synchronous_commit
= on``, ``fsync = on``): a commit returns only after its WAL record is flushed
on the server, so an acknowledged write survives a crash of this process, of
the server process, and a power loss of the server's machine as far as its
disk honours fsync. With streaming replication and ``synchronous_standby_names``
the same holds for a failover; without it a promoted replica may miss the last
commits.

Batches are set-based: a claim batch is ONE statement built on ``unnest()``
arrays (insert executions ``ON CONFLICT DO NOTHING``, then the schedule
compare-and-swap only for the inserts that won), a completion batch another.

A lost connection is retried with backoff for every operation whose retry is
safe. When the connection died while COMMIT was in flight, the first attempt
may have committed; the retry then recognises its own earlier work: a claim
whose insert conflicts with a row carrying the SAME fence is reported won with
that row's run id, a completion or start that finds the run already in exactly
the requested state with the same fence is reported applied. Fences are unique
per assignment, so the same fence means the same claim.

The modules, along the seams: ``_sql`` (the SQL text), ``_arrays`` (batch
arrays in binary form), ``_db`` (connections, transactions, retries, errors),
``_jobs`` (submits and job changes), ``_runs`` (claims, starts, completions),
``_feed`` (loading shards and the change feed), ``_store`` (the ``Store``).
"""

from wheel.store.postgres._store import PostgresStore

__all__ = ["PostgresStore"]
