"""A PostgreSQL error becomes a ``StoreError`` that never quotes a row: a
constraint failure's DETAIL lists the row's values (a job's payload among
them), and store errors reach logs and callers."""

from __future__ import annotations

import traceback

import pytest

from wheel.errors import StoreError
from wheel.store.postgres._db import Conn, Database

pytestmark = pytest.mark.postgres


def test_a_constraint_failure_is_reported_without_the_failing_row(pg_dsn: str) -> None:
    db = Database(pg_dsn, min_size=1, max_size=1, retries=1, pool_timeout_s=5)
    secret = "payload-secret-7d1e"

    def insert(conn: Conn, _attempt: object) -> None:
        conn.execute("CREATE TEMP TABLE leak (a int NOT NULL, p text)")
        conn.execute("INSERT INTO leak VALUES (NULL, %s)", (secret,))

    try:
        with pytest.raises(StoreError) as caught:
            db.run(insert, idempotent=True)
    finally:
        db.close()
    message = str(caught.value)
    assert message.startswith("postgresql: null value in column")
    assert "SQLSTATE 23502" in message
    written = "".join(traceback.format_exception(caught.value))
    assert secret not in written
