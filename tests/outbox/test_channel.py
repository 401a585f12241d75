"""The outbox's notification channel fits PostgreSQL's 63-byte identifiers
whatever the schema is called: an insert into a table in a schema with a
long name commits, and the relay hears it (its poll, a minute here, would
come far too late to pass for the notification)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from testkit.procs import wait_for
from tests.conftest import PG_DSN
from tests.outbox._relay import RelayingNode
from wheel import outbox
from wheel.client import Client
from wheel.node import NodeConfig
from wheel.store import outbox_sql

pytestmark = [pytest.mark.postgres]

# Longer than any wait below: a row made a job in time was woken by its NOTIFY.
POLL_S = 60.0


@contextlib.contextmanager
def long_schema() -> Iterator[str]:
    """A DSN whose search_path is a fresh schema whose name is 63 bytes long,
    the most PostgreSQL allows; the schema is dropped afterwards."""
    schema = f"wheel_test_{secrets.token_hex(6)}_".ljust(63, "x")
    assert len(schema.encode()) == 63
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            yield f"{PG_DSN}?options=-csearch_path%3D{schema}"
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


def job(name: str) -> dict[str, Any]:
    return {"name": name, "handler": "noop", "at": timedelta(hours=1)}


def made_a_job(conn: psycopg.Connection[Any], entry: outbox.OutboxEntry) -> int | None:
    fate = outbox.fate(conn, entry)
    conn.commit()
    return fate.job_id if fate.state == "done" else None


def heard(conn: psycopg.Connection[Any], name: str) -> int:
    """Commit a row and wait for its job, twice; the second row's job id.
    The relay's pass when it starts listening may take the first row without
    a notification; the second is committed when it is idle again."""
    job_id = 0
    for n in range(2):
        entry = outbox.submit(conn, **job(f"{name}-{n}"))
        conn.commit()
        job_id = wait_for(partial(made_a_job, conn, entry), 10, "the row's NOTIFY to be heard")
    return job_id


def test_a_store_in_a_schema_with_a_63_byte_name_takes_outbox_rows_and_hears_them() -> None:
    """wheel's own store, its outbox made by the migrations (11, then 12)."""
    with (
        long_schema() as dsn,
        RelayingNode(dsn, NodeConfig(node_id="long-schema"), poll_s=POLL_S) as live,
        psycopg.connect(dsn) as conn,
    ):
        job_id = heard(conn, "in-a-long-schema")
        with Client(live.target) as client:
            assert client.get(job_id).name == "in-a-long-schema-1"


def test_outbox_init_run_again_brings_an_older_trigger_up_to_a_channel_that_fits(
    tmp_path: Path,
) -> None:
    """The application's database, its table made by an older ``wheelctl
    outbox init``: there an insert failed, and the application's transaction
    with it; ``create_table`` (``init``) again replaces the trigger's function."""
    with long_schema() as dsn, psycopg.connect(dsn) as conn:
        for statement in outbox_sql.DDL_1:
            conn.execute(statement)
        conn.commit()
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="channel name too long"):
            outbox.submit(conn, **job("refused"))
        conn.rollback()
        outbox.create_table(conn)
        store = f"sqlite:///{tmp_path / 'store.db'}"
        config = NodeConfig(node_id="long-schema-app")
        with RelayingNode(store, config, outbox_dsn=dsn, poll_s=POLL_S):
            heard(conn, "in-a-long-schema")
