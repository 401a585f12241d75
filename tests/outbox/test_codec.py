"""Encrypted payloads on a real PostgreSQL (``wheel.codec``): a job submitted
with ``Client(codec=...)`` and one through the transactional outbox with the
same codec leave no trace of their plaintext in any table of wheel's schema,
and read back as plaintext only where the codec is."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from testkit.procs import wait_for
from tests.outbox._relay import RelayingNode
from wheel import outbox
from wheel.client import Client
from wheel.codec import AesGcmCodec, envelope_key
from wheel.node import NodeConfig

pytestmark = [pytest.mark.postgres]

CODEC = AesGcmCodec({"k1": secrets.token_bytes(32), "k2": secrets.token_bytes(32)}, "k2")


@pytest.fixture(scope="module")
def live(module_pg_dsn: str) -> Iterator[RelayingNode]:
    config = NodeConfig(node_id=f"codec-node-{secrets.token_hex(4)}")
    with RelayingNode(module_pg_dsn, config) as node:
        yield node


def traces(conn: psycopg.Connection[Any], plain: bytes) -> list[str]:
    """The tables of the connection's schema holding ``plain`` as text, as hex
    (bytea) or as the base64 a spec's JSON keeps a payload in."""
    needles = [plain.decode(), plain.hex(), base64.b64encode(plain).decode()[:-4]]
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
        )
    ]
    assert {"jobs", "job_specs", "wheel_outbox", "executions"} <= set(tables), tables
    found = []
    for table in tables:
        for (row,) in conn.execute(f'SELECT t::text FROM "{table}" t'):
            if any(n in row for n in needles):
                found.append(table)
                break
    return found


def test_no_table_holds_the_plaintext_of_a_job_submitted_with_a_codec(
    live: RelayingNode,
) -> None:
    plain = f"iban-DE89-3704-0044-0532-0130-00-{secrets.token_hex(4)}".encode()
    with Client(live.target, codec=CODEC) as client:
        job = client.submit(name="direct", handler="noop", at=timedelta(hours=1), payload=plain)
        assert client.get(job.job_id).payload == plain
        updated = client.update(job.job_id, payload=plain + b"-updated")
        assert updated.payload == plain + b"-updated"
    with Client(live.target) as keyless:
        kept = keyless.get(job.job_id).payload
    assert envelope_key(kept) == "k2" and CODEC.decode(kept) == plain + b"-updated"

    with psycopg.connect(live.store_url) as conn:
        with conn.transaction():
            entry = outbox.submit(
                conn, codec=CODEC, name="via-outbox", handler="noop",
                at=timedelta(hours=1), payload=plain + b"-outbox",
            )  # fmt: skip

        def settled() -> outbox.OutboxFate | None:
            fate = outbox.fate(conn, entry)
            conn.commit()
            return None if fate.state == "pending" else fate

        fate = wait_for(settled, 10, "the outbox row to become a job")
        assert fate.state == "done" and fate.job_id is not None
        with Client(live.target, codec=CODEC) as client:
            assert client.get(fate.job_id).payload == plain + b"-outbox"
        for variant in (plain, plain + b"-updated", plain + b"-outbox"):
            assert traces(conn, variant) == []
        # The search finds a payload kept in clear (it would have found these).
        with Client(live.target) as keyless:
            keyless.submit(name="clear", handler="noop", at=timedelta(hours=1), payload=plain)
        assert "job_specs" in traces(conn, plain)
