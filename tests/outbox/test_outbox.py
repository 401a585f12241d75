"""The transactional submit on a real PostgreSQL and a real node: a row
committed in the application's transaction becomes exactly one job, a rolled
back one nothing, and every row's fate is readable in the row.

One node (in process, serving gRPC) relays the module's schema for every
test; each test names its own jobs."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from testkit.procs import wait_for
from tests.ops._node import scrape
from tests.outbox._relay import RelayingNode
from wheel import http_targets, outbox
from wheel.client import Client, HttpTarget, JobRequest
from wheel.engine.spec import JobSpec, Once
from wheel.errors import InvalidArgument, NotFound
from wheel.node import NodeConfig
from wheel.node._outbox import LANES
from wheel.node._values import DAY_MS
from wheel.rpc.v1 import jobs_pb2

pytestmark = [pytest.mark.postgres]


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


@pytest.fixture(scope="module")
def live(module_pg_dsn: str) -> Iterator[RelayingNode]:
    with RelayingNode(module_pg_dsn, NodeConfig(node_id=unique("outbox-node"))) as node:
        yield node


@pytest.fixture
def conn(live: RelayingNode) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(live.store_url) as c:
        yield c


@pytest.fixture
def client(live: RelayingNode) -> Iterator[Client]:
    with Client(live.target) as c:
        yield c


def job(name: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "handler": "noop", "at": timedelta(hours=1), **kw}


def settled(conn: psycopg.Connection[Any], entry: outbox.OutboxEntry) -> outbox.OutboxFate | None:
    fate = outbox.fate(conn, entry)
    conn.commit()  # a fresh snapshot for the next look
    return None if fate.state == "pending" else fate


def fate_of(
    conn: psycopg.Connection[Any], entry: outbox.OutboxEntry, what: str
) -> outbox.OutboxFate:
    """The row's fate once it is settled (waited for)."""
    fate: outbox.OutboxFate = wait_for(lambda: settled(conn, entry), 10, what)
    return fate


def jobs_named(client: Client, name: str) -> list[int]:
    return [j.job_id for j in client.jobs() if j.name == name]


def test_a_committed_submit_becomes_one_job_whose_id_the_row_records(
    conn: psycopg.Connection[Any], client: Client
) -> None:
    name = unique("order-reminder")
    with conn.transaction():
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY)")
        conn.execute("INSERT INTO orders VALUES (%s)", (name,))
        entry = outbox.submit(conn, **job(name, payload={"order": name}))
    fate = wait_for(lambda: settled(conn, entry), 10, "the row to become a job")
    assert fate.state == "done" and fate.error is None and fate.attempts == 1
    got = client.get(fate.job_id)
    assert (got.name, got.handler, json.loads(got.payload)) == (name, "noop", {"order": name})
    assert jobs_named(client, name) == [fate.job_id]


def test_a_rows_priority_becomes_its_jobs_and_the_default_leaves_the_row_as_it_was(
    conn: psycopg.Connection[Any], client: Client
) -> None:
    name = unique("urgent")
    with conn.transaction():
        entry = outbox.submit(conn, **job(name, priority=0))
    fate = fate_of(conn, entry, "the row to become a job")
    assert fate.job_id is not None and client.get(fate.job_id).priority == 0
    # Priority 5 said or not: the same spec JSON and body hash as before.
    plain = job("plain", at=1_900_000_000.0, idempotency_key="k")
    assert outbox.row_of(plain) == outbox.row_of({**plain, "priority": 5})
    assert "priority" not in outbox.row_of(plain)[2]
    with pytest.raises(InvalidArgument) as err:
        outbox.row_of({**plain, "priority": 10})
    assert err.value.field == "priority"


def test_a_rolled_back_submit_leaves_no_row_and_makes_no_job(
    live: RelayingNode, conn: psycopg.Connection[Any], client: Client
) -> None:
    name = unique("rolled-back")
    with pytest.raises(RuntimeError), conn.transaction():
        entry = outbox.submit(conn, **job(name))
        raise RuntimeError("the order failed")
    assert conn.execute(
        "SELECT count(*) FROM wheel_outbox WHERE id = %s", (entry.id,)
    ).fetchone() == (0,)
    # A pass of the relay after the rollback, and a committed row behind it.
    after = outbox.submit(conn, **job(unique("after")))
    conn.commit()
    wait_for(lambda: settled(conn, after), 10, "the next row to become a job")
    assert jobs_named(client, name) == []


def test_an_async_connection_and_a_sqlalchemy_session_submit_in_their_transaction(
    live: RelayingNode, conn: psycopg.Connection[Any], client: Client
) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    a, b, c = unique("async"), unique("session"), unique("session-rolled-back")

    async def submit_async() -> outbox.OutboxEntry:
        aconn = await psycopg.AsyncConnection.connect(live.store_url)
        async with aconn, aconn.transaction():
            return await outbox.submit(aconn, **job(a))

    entry_a = asyncio.run(submit_async())
    url = live.store_url.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_engine(url)
    try:
        with Session(engine) as session:
            with session.begin():
                entry_b = outbox.submit(session, **job(b))
            session.begin()
            outbox.submit(session, **job(c))
            session.rollback()
    finally:
        engine.dispose()
    for entry, name in ((entry_a, a), (entry_b, b)):
        fate = fate_of(conn, entry, f"{name} to become a job")
        assert fate.job_id is not None and client.get(fate.job_id).name == name
    assert jobs_named(client, c) == []


def sa_url(live: RelayingNode) -> str:
    return live.store_url.replace("postgresql://", "postgresql+psycopg://", 1)


def test_sqlalchemys_async_session_and_connection_submit_in_their_transaction(
    live: RelayingNode, conn: psycopg.Connection[Any], client: Client
) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    a, b, c = unique("async-session"), unique("async-connection"), unique("async-rolled-back")

    async def submit_all() -> list[outbox.OutboxEntry]:
        engine = create_async_engine(sa_url(live))
        try:
            async with AsyncSession(engine) as session:
                async with session.begin():
                    entry_a = await outbox.submit(session, **job(a))
                await session.begin()
                await outbox.submit_many(session, [job(c)])
                await session.rollback()
            async with engine.connect() as sa_conn, sa_conn.begin():
                (entry_b,) = await outbox.submit_many(sa_conn, [job(b)])
        finally:
            await engine.dispose()
        return [entry_a, entry_b]

    entries = asyncio.run(submit_all())
    for entry, name in zip(entries, (a, b), strict=True):
        fate = fate_of(conn, entry, f"{name} to become a job")
        assert fate.job_id is not None and client.get(fate.job_id).name == name
    assert jobs_named(client, c) == []


def test_fate_and_status_read_through_every_connection_kind_submit_takes(
    live: RelayingNode, conn: psycopg.Connection[Any]
) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
    from sqlalchemy.orm import Session

    entry = outbox.submit(conn, **job(unique("read-back")))
    conn.commit()
    want = fate_of(conn, entry, "the row to become a job")
    assert want.state == "done"
    seen: dict[str, tuple[outbox.OutboxFate, outbox.OutboxStatus]] = {}

    def read(kind: str, c: Any) -> None:
        seen[kind] = (outbox.fate(c, entry), outbox.status(c))
        with pytest.raises(NotFound):
            outbox.fate(c, 2**62)

    read("psycopg", conn)
    engine = create_engine(sa_url(live))
    try:
        with Session(engine) as session:
            read("session", session)
        with engine.connect() as sa_conn:
            read("connection", sa_conn)
    finally:
        engine.dispose()

    async def read_async(kind: str, c: Any) -> None:
        seen[kind] = (await outbox.fate(c, entry.id), await outbox.status(c))
        with pytest.raises(NotFound):
            await outbox.fate(c, 2**62)

    async def read_all_async() -> None:
        aconn = await psycopg.AsyncConnection.connect(live.store_url)
        async with aconn:
            await read_async("psycopg async", aconn)
        async_engine = create_async_engine(sa_url(live))
        try:
            async with AsyncSession(async_engine) as session:
                await read_async("async session", session)
            async with async_engine.connect() as sa_conn:
                await read_async("async connection", sa_conn)
        finally:
            await async_engine.dispose()

    asyncio.run(read_all_async())
    assert {kind: f for kind, (f, _) in seen.items()} == dict.fromkeys(seen, want)
    assert all(isinstance(s, outbox.OutboxStatus) for _, s in seen.values())


def test_a_connection_none_of_the_functions_can_use_is_refused_naming_conn(
    live: RelayingNode,
) -> None:
    from sqlalchemy import create_engine

    calls: list[Callable[[Any], object]] = [
        lambda c: outbox.submit(c, **job("unusable")),
        lambda c: outbox.submit_many(c, [job("unusable")]),
        lambda c: outbox.fate(c, 1),
        lambda c: outbox.status(c),
    ]
    engine = create_engine(sa_url(live))  # an Engine: no transaction to join
    try:
        for unusable in (object(), engine, live.store_url):
            for call in calls:
                with pytest.raises(InvalidArgument) as err:
                    call(unusable)
                assert err.value.field == "conn"
                assert type(unusable).__name__ in str(err.value)
    finally:
        engine.dispose()


def test_ten_thousand_rows_in_one_transaction_become_ten_thousand_jobs(
    conn: psycopg.Connection[Any], client: Client
) -> None:
    name = unique("bulk")
    with conn.transaction():
        entries = outbox.submit_many(conn, [job(name, payload=i) for i in range(10_000)])
    ids = [e.id for e in entries]

    def all_done() -> list[tuple[int, int]] | None:
        rows = conn.execute(
            "SELECT id, job_id FROM wheel_outbox WHERE id = ANY(%s) AND state = 'done'", (ids,)
        ).fetchall()
        conn.commit()
        return rows if len(rows) == len(ids) else None

    rows = wait_for(all_done, 60, "10,000 rows to become jobs", interval=0.5)
    job_ids = {job_id for _, job_id in rows}
    assert len(job_ids) == 10_000
    assert sorted(jobs_named(client, name)) == sorted(job_ids)


def test_the_same_key_in_two_rows_names_one_job_and_another_body_fails_the_row(
    conn: psycopg.Connection[Any], client: Client
) -> None:
    name, key = unique("keyed"), unique("key")
    first = outbox.submit(conn, **job(name, at=1_900_000_000, idempotency_key=key))
    again = outbox.submit(conn, **job(name, at=1_900_000_000, idempotency_key=key))
    other = outbox.submit(conn, **job(name, at=1_900_000_001, idempotency_key=key))
    conn.commit()
    fates = [fate_of(conn, e, "a row's fate") for e in (first, again)]
    assert fates[0].job_id == fates[1].job_id and fates[0].state == "done"
    failed = wait_for(lambda: settled(conn, other), 10, "the conflicting row's fate")
    assert (failed.state, failed.job_id, failed.error_code) == ("failed", None, "AlreadyExists")
    assert key in (failed.error or "")
    assert jobs_named(client, name) == [fates[0].job_id]
    # A Client.submit with the row's key and body finds the same job.
    same = client.submit(**job(name, at=1_900_000_000, idempotency_key=key))
    assert (same.job_id, same.created) == (fates[0].job_id, False)


def test_a_row_the_node_refuses_fails_with_the_field_named_and_the_rest_go_on(
    conn: psycopg.Connection[Any], client: Client
) -> None:
    name = unique("bad")
    # Past what the client checks: a spec no node can read, written directly.
    (bad_id,) = conn.execute(
        "INSERT INTO wheel_outbox (tenant, idempotency_key, spec) VALUES ('default', %s, %s)"
        " RETURNING id",
        (unique("k"), '{"name": "torn"'),
    ).fetchone() or (0,)
    good = outbox.submit(conn, **job(name))
    conn.commit()
    fate = wait_for(lambda: settled(conn, good), 10, "the good row to become a job")
    assert fate.state == "done"
    bad = outbox.fate(conn, bad_id)
    assert (bad.state, bad.error_code) == ("failed", "InvalidArgument")
    assert (bad.error or "").startswith("spec:")


def test_a_row_with_an_http_target_becomes_its_job_and_a_bad_target_fails_named(
    conn: psycopg.Connection[Any], client: Client
) -> None:
    name = unique("hooked")
    target = HttpTarget("https://hooks.example.com/x", method="put", headers={"X-A": "1"})
    good = outbox.submit(conn, name=name, http=target, payload=b"body", at=timedelta(hours=1))
    # Another language's SDK writes the spec's JSON itself: the relay checks
    # its target as the node's API would.
    call = http_targets.call_payload(jobs_pb2.HttpTarget(url="http://h/", method="FETCH"), b"")
    spec = JobSpec(name=unique("raw"), handler="http", schedule=Once(at_ms=1), payload=call)
    (bad_id,) = conn.execute(
        "INSERT INTO wheel_outbox (tenant, idempotency_key, spec) VALUES ('default', %s, %s)"
        " RETURNING id",
        (unique("k"), spec.to_json()),
    ).fetchone() or (0,)
    conn.commit()
    fate = fate_of(conn, good, "the row with a target to become a job")
    assert fate.state == "done" and fate.job_id is not None, fate.error
    got = client.get(fate.job_id)
    assert (got.handler, got.payload) == ("http", b"body")
    assert got.http == HttpTarget("https://hooks.example.com/x", method="PUT", headers={"X-A": "1"})

    def bad_fate() -> outbox.OutboxFate | None:
        f = outbox.fate(conn, bad_id)
        conn.commit()
        return None if f.state == "pending" else f

    bad = wait_for(bad_fate, 10, "the row with a bad target to fail")
    assert (bad.state, bad.error_code) == ("failed", "InvalidArgument")
    assert (bad.error or "").startswith("spec.http.method:")


def test_a_bad_request_is_refused_in_the_callers_transaction_naming_the_keyword(
    conn: psycopg.Connection[Any],
) -> None:
    before = conn.execute("SELECT count(*) FROM wheel_outbox").fetchone()
    with pytest.raises(InvalidArgument) as err:
        outbox.submit(conn, name="x", handler="h", cron="* * * * *", every=5)
    assert err.value.field == "schedule"
    with pytest.raises(InvalidArgument) as err:
        outbox.submit_many(conn, [job("fine"), {"name": "x", "handler": "h", "at": 1, "colour": 1}])
    assert err.value.field == "colour"
    with pytest.raises(InvalidArgument) as err:
        outbox.submit(conn, **job("long-key", idempotency_key="k" * 201))
    assert err.value.field == "idempotency_key"
    with pytest.raises(InvalidArgument) as err:
        outbox.submit(object(), **job("not-a-connection"))  # type: ignore[call-overload]
    assert err.value.field == "conn"
    assert conn.execute("SELECT count(*) FROM wheel_outbox").fetchone() == before
    request = JobRequest(name="as-a-value", handler="h", at=timedelta(minutes=5))
    assert outbox.submit_many(conn, [request])[0].idempotency_key.startswith("wheel-outbox-")
    conn.rollback()


def test_outbox_init_then_status_show_the_backlog_of_a_database_nobody_relays(
    pg_dsn: str,
) -> None:
    def wheelctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "wheel", "outbox", *args],
            capture_output=True,
            text=True,
            timeout=30,
        )

    assert wheelctl("init", "--dsn", pg_dsn).returncode == 0
    assert wheelctl("init", "--dsn", pg_dsn).returncode == 0  # idempotent
    with psycopg.connect(pg_dsn) as c:
        outbox.submit_many(c, [job(f"backlog-{i}") for i in range(3)])
        c.execute(
            "INSERT INTO wheel_outbox (tenant, idempotency_key, spec, state, error_code, error)"
            " VALUES ('default', 'k', '{}', 'failed', 'InvalidArgument', 'spec: bad')"
        )
        c.commit()
    time.sleep(0.05)  # the oldest row has an age
    out = wheelctl("status", "--dsn", pg_dsn, "--json")
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    assert (status["pending"], status["failed"], status["retrying"]) == (3, 1, 0)
    assert status["oldest_pending_s"] > 0
    missing = wheelctl("status", "--dsn", pg_dsn.replace("wheel_test_", "no_such_"), "--json")
    assert missing.returncode == 2 and "wheelctl outbox init" in missing.stderr


def test_the_relay_holds_no_transaction_open_between_its_polls(
    live: RelayingNode, conn: psycopg.Connection[Any]
) -> None:
    """An idle relay's claim finds nothing and ends its transaction: a
    transaction left open would hold back vacuum on the application's
    database between every two polls."""
    entry = outbox.submit(conn, **job(unique("then-idle")))
    conn.commit()
    fate_of(conn, entry, "the row to become a job")
    held_open = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
        " AND state = 'idle in transaction' AND clock_timestamp() - state_change > '100 ms'"
    )
    samples = []
    for _ in range(12):  # over two and a half polls
        time.sleep(0.1)
        samples.append(conn.execute(held_open, (live.relay.name,)).fetchone())
        conn.commit()
    assert samples == [(0,)] * 12
    assert conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (live.relay.name,)
    ).fetchone() == (1 + LANES,)  # the listener, and a claim's connection a lane


def test_rows_over_their_tenants_quota_wait_pending_with_the_error_and_go_in_once_allowed(
    live: RelayingNode, conn: psycopg.Connection[Any], client: Client
) -> None:
    from wheel.store.base import TenantQuota

    tenant, name = unique("capped"), unique("quota")
    node = live.node
    assert node is not None
    live.run(node.set_tenant_quota(TenantQuota(tenant=tenant, max_jobs=3)))
    entries = outbox.submit_many(conn, [job(name, tenant=tenant, payload=i) for i in range(5)])
    fresh = outbox.submit(conn, **job(unique("behind-them")))
    conn.commit()

    def states() -> list[tuple[str, str | None]] | None:
        fates = [outbox.fate(conn, e) for e in entries]
        conn.commit()
        if sum(f.state == "done" for f in fates) == 3 and all(f.attempts for f in fates):
            return [(f.state, f.error_code) for f in fates]
        return None

    got = wait_for(states, 10, "three rows in, two held back")
    assert sorted(got, key=str) == [("done", None)] * 3 + [("pending", "ResourceExhausted")] * 2
    assert fate_of(conn, fresh, "a row behind the held ones").state == "done"
    assert outbox.status(conn).retrying == 2
    conn.commit()
    live.run(node.set_tenant_quota(TenantQuota(tenant=tenant, max_jobs=10)))
    for entry in entries:
        assert fate_of(conn, entry, "the held rows once allowed").state == "done"
    assert len(jobs_named(client, name)) == 5


def test_a_row_whose_notification_never_comes_is_found_by_the_poll(
    live: RelayingNode, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("ALTER TABLE wheel_outbox DISABLE TRIGGER wheel_outbox_notify")
    conn.commit()
    try:
        entry = outbox.submit(conn, **job(unique("unannounced")))
        conn.commit()
        committed = time.monotonic()
        assert fate_of(conn, entry, "the poll to find the row").state == "done"
        # Within a poll and the pass itself, not by chance much later.
        assert time.monotonic() - committed < live.relay.poll_s + 1.0
    finally:
        conn.execute("ALTER TABLE wheel_outbox ENABLE TRIGGER wheel_outbox_notify")
        conn.commit()


def test_a_row_committed_during_a_pass_is_taken_by_an_idle_lane_without_waiting_for_it(
    pg_dsn: str,
) -> None:
    """Each lane goes on its own: while one lane's pass is held between
    storing its jobs and recording its rows' fate (the test hook, a long
    pause here), a row committed meanwhile becomes a job through the other
    lane, not only once the first pass is over."""
    config = NodeConfig(node_id=unique("lanes"))
    with (
        RelayingNode(pg_dsn, config, poll_s=60, record_delay_s=30) as live,
        psycopg.connect(pg_dsn) as conn,
    ):
        assert len(live.relay._lanes) == LANES >= 2

        def jobs_of(name: str) -> int:
            (n,) = conn.execute(
                "SELECT count(*) FROM jobs WHERE name = %s", (name,)
            ).fetchone() or (0,)
            conn.commit()
            return int(n)

        held, behind = unique("held"), unique("behind")
        first = outbox.submit(conn, **job(held))
        conn.commit()
        wait_for(lambda: jobs_of(held) == 1, 10, "the first pass to store its job")
        outbox.submit(conn, **job(behind))
        conn.commit()
        wait_for(lambda: jobs_of(behind) == 1, 10, "the other lane to take the row")
        assert outbox.fate(conn, first).state == "pending"  # the first pass is held still


def test_the_relays_rows_are_counted_by_fate_in_the_nodes_metrics(
    live: RelayingNode, conn: psycopg.Connection[Any]
) -> None:
    def done() -> float:
        return scrape(live.metrics_url)['wheel_outbox_rows_total{fate="done"}']

    before = done()
    entries = outbox.submit_many(conn, [job(unique("counted")) for _ in range(3)])
    conn.commit()
    for entry in entries:
        fate_of(conn, entry, "a counted row")
    assert done() == before + 3
    assert 'wheel_outbox_rows_total{fate="retried"}' in scrape(live.metrics_url)


def test_recurring_jobs_keep_their_schedule_through_the_outbox(
    conn: psycopg.Connection[Any], client: Client
) -> None:
    from wheel.client import Cron, Every

    cron, every = unique("cron"), unique("every")
    a = outbox.submit(conn, name=cron, handler="h", cron="0 3 * * *", tz="Europe/Paris")
    b = outbox.submit(conn, name=every, handler="h", every=timedelta(minutes=5))
    conn.commit()
    picked = time.time()
    fates = fate_of(conn, a, "the cron row"), fate_of(conn, b, "the interval row")
    assert fates[0].job_id is not None and fates[1].job_id is not None
    got_cron, got_every = client.get(fates[0].job_id), client.get(fates[1].job_id)
    assert isinstance(got_cron.schedule, Cron)
    assert (got_cron.schedule.expr, got_cron.schedule.tz) == ("0 3 * * *", "Europe/Paris")
    assert isinstance(got_every.schedule, Every)
    assert got_every.schedule.period == timedelta(minutes=5)
    # An interval without a start is placed when the relay takes it, as a
    # node places one it receives: its next fire within a period from then.
    assert got_every.next_fire is not None
    assert picked - 1 < got_every.next_fire.timestamp() <= picked + 301


def test_rows_settled_longer_than_retain_are_purged_in_batches_and_the_rest_kept(
    pg_dsn: str,
) -> None:
    """The relaying node deletes rows settled (done or failed) longer ago
    than its ``retain_ms``, a batch a transaction, in its retention passes;
    fresher rows and the jobs stay. A table without the index that finds
    them is not purged (a purge would read all of it)."""
    config = NodeConfig(
        node_id=unique("outbox-purge"),
        retain_ms=DAY_MS,
        retention_batch=2,
        retention_first_s=0.2,
        retention_interval_s=0.2,
        retention_share=1.0,
    )
    with (
        RelayingNode(pg_dsn, config) as node,
        psycopg.connect(pg_dsn) as conn,
        Client(node.target) as client,
    ):
        entries = outbox.submit_many(conn, [job(unique("purged")) for _ in range(6)])
        conn.commit()
        fates = [fate_of(conn, entry, "a row to settle") for entry in entries]
        conn.execute(
            "INSERT INTO wheel_outbox (tenant, idempotency_key, spec, state, error_code, error,"
            " done_at) VALUES ('default', 'bad', '{}', 'failed', 'InvalidArgument', 'spec: bad',"
            " clock_timestamp() - interval '2 days')"
        )
        old, fresh = [e.id for e in entries[:5]], entries[5].id
        conn.execute(
            "UPDATE wheel_outbox SET done_at = clock_timestamp() - interval '2 days'"
            " WHERE id = ANY(%s)",
            (old,),
        )
        conn.commit()

        def left() -> list[int] | None:
            ids = [r[0] for r in conn.execute("SELECT id FROM wheel_outbox ORDER BY id")]
            conn.commit()
            return ids if ids == [fresh] else None

        wait_for(left, 10, "the rows settled two days ago to be purged")
        purged = scrape(node.metrics_url)["wheel_outbox_purged_rows_total"]
        assert purged == 6  # five done, one failed: in batches of two
        for fate in fates:  # the jobs stay
            assert fate.job_id is not None and client.get(fate.job_id).job_id == fate.job_id

        conn.execute("DROP INDEX wheel_outbox_settled")
        conn.execute(
            "UPDATE wheel_outbox SET done_at = clock_timestamp() - interval '2 days' WHERE id = %s",
            (fresh,),
        )
        conn.commit()
        assert node.run(node.relay.purge(DAY_MS)) == 0
        assert conn.execute("SELECT count(*) FROM wheel_outbox").fetchone() == (1,)


def test_an_index_dropped_while_a_purge_waits_for_the_table_stops_that_purge(
    pg_dsn: str,
) -> None:
    """A purge asks for the index under the table lock a ``DROP INDEX``
    waits for: a pass that queued behind an uncommitted drop finds the
    index gone once the drop commits and deletes nothing (a DELETE planned
    after the drop would read the whole table to find its rows)."""
    config = NodeConfig(node_id=unique("outbox-drop"), retain_ms=DAY_MS, retention_first_s=3600)
    with (
        RelayingNode(pg_dsn, config) as node,
        psycopg.connect(pg_dsn) as conn,
        psycopg.connect(pg_dsn) as dropping,
    ):
        conn.execute(
            "INSERT INTO wheel_outbox (tenant, idempotency_key, spec, state, error_code, error,"
            " done_at) VALUES ('default', 'bad', '{}', 'failed', 'InvalidArgument', 'spec: bad',"
            " clock_timestamp() - interval '2 days')"
        )
        conn.commit()
        dropping.execute("DROP INDEX wheel_outbox_settled")
        with ThreadPoolExecutor(1) as pool:
            purged = pool.submit(node.run, node.relay.purge(DAY_MS))

            def queued() -> bool:  # the purge, not the relay's claims, which queue too
                row = conn.execute(
                    "SELECT count(*) FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid)"
                    " WHERE NOT l.granted AND l.relation = 'wheel_outbox'::regclass"
                    " AND a.query ~ '^\\s*(LOCK|DELETE)'"
                ).fetchone()
                conn.commit()
                return bool(row and row[0])

            wait_for(queued, 10, "the purge to wait for the table the drop holds")
            dropping.commit()
            assert purged.result(timeout=10) == 0
        assert conn.execute("SELECT count(*) FROM wheel_outbox").fetchone() == (1,)
