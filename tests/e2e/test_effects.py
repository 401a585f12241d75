"""Fenced effects with real processes: a node (2 s leases) and two worker
processes given the same fire, the first stopped past its lease and then
resumed. Both run the handler; the effect is written once, by the newer
attempt, and the stale fence's write is refused by the database."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from testkit.procs import wait_for
from tests.e2e.test_leases import GRACE_MS, LEASE_MS, TunedServer, Workers, job, of_job, runs
from wheel import effects
from wheel.client import Client

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[TunedServer]:
    srv = TunedServer(
        tmp_path / "data", "--lease-ms", str(LEASE_MS), "--grace-lease-ms", str(GRACE_MS)
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_the_same_fire_run_twice_writes_its_effect_once_and_refuses_the_stale_fence(
    server: TunedServer, tmp_path: Path, pg_dsn: str
) -> None:
    with psycopg.connect(pg_dsn) as conn:
        effects.create_table(conn)
        conn.execute("CREATE TABLE reminders (key text, fence bigint, attempt int, pid int)")
        conn.commit()
    workers = Workers(server.target, tmp_path / "out.txt", pool="effects")
    try:
        a = workers.start("effects-a")
        b = workers.start("effects-b")
        with Client(server.target) as client:
            job_id = client.submit(
                **job(workers.pool, {"sleep_s": [3, 0], "effect_dsn": pg_dsn})
            ).job_id
            first = wait_for(lambda: of_job(workers.out, job_id, "start"), 20, "attempt 1")[0]
            holder = first["pid"]
            workers.signal(holder, signal.SIGSTOP)
            try:
                wait_for(
                    lambda: runs(client, job_id) == [(1, "lost"), (2, "succeeded")],
                    20,
                    "the newer attempt to win",
                )
            finally:
                workers.signal(holder, signal.SIGCONT)
            # The stopped worker wakes believing no time passed and makes
            # the effect with its old fence: the database refuses it.
            effects_seen: list[dict[str, Any]] = wait_for(
                lambda: (e := of_job(workers.out, job_id, "effect")) and len(e) == 2 and e,
                20,
                "both attempts' effects",
            )
    finally:
        workers.stop_all()
    starts = of_job(workers.out, job_id, "start")
    assert {s["pid"] for s in starts} == {a, b}  # both ran the handler
    by_attempt = {e["attempt"]: e for e in effects_seen}
    assert by_attempt[2]["outcome"] == "written" and by_attempt[2]["pid"] != holder
    assert by_attempt[1]["outcome"] == "stale" and by_attempt[1]["pid"] == holder
    assert by_attempt[1]["fence"] < by_attempt[2]["fence"]
    assert by_attempt[1]["key"] == by_attempt[2]["key"]
    with psycopg.connect(pg_dsn) as conn:
        written = conn.execute("SELECT key, fence, attempt FROM reminders").fetchall()
        recorded = conn.execute(
            "SELECT idempotency_key, fence, done_at IS NOT NULL FROM wheel_effects"
        ).fetchall()
    key, fence = by_attempt[2]["key"], by_attempt[2]["fence"]
    assert written == [(key, fence, 2)]
    assert recorded == [(key, fence, True)]
