"""The fenced-effect helpers on both databases: a key's effect commits once,
a lower fence is refused, a refusal rolls the caller's transaction back, and
two attempts racing on one key end with one write."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from wheel import effects
from wheel.effects import http
from wheel.errors import EffectDone, InvalidArgument, StaleFence


@dataclass(frozen=True)
class Run:
    idempotency_key: str
    fence: int


class Db:
    """One backend: new connections, and a transaction that writes an effect."""

    def __init__(self, kind: str, connect: Callable[[], Any]) -> None:
        self.kind = kind
        self.connect = connect
        with self.connect() as conn:
            effects.create_table(conn)
            effects.create_table(conn)  # idempotent
            conn.execute("CREATE TABLE reminders (key text, fence bigint)")
            conn.commit()

    def effect(self, run: Run, *, name: str | None = None, fail: bool = False) -> None:
        """``record`` and the effect in one transaction (rolled back by a refusal)."""
        conn = self.connect()
        try:
            effects.record(conn, run, name=name)
            conn.execute(
                self.sql("INSERT INTO reminders VALUES (%s, %s)"), (run.idempotency_key, run.fence)
            )
            if fail:
                raise RuntimeError("the effect failed after its record")
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.close()

    def sql(self, text: str) -> str:
        return text.replace("%s", "?") if self.kind == "sqlite" else text

    def writes(self) -> list[tuple[str, int]]:
        with self.connect() as conn:
            rows = conn.execute("SELECT key, fence FROM reminders ORDER BY fence").fetchall()
        return [(k, int(f)) for k, f in rows]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    if request.param == "sqlite":
        path = tmp_path / "app.db"
        yield Db("sqlite", lambda: sqlite3.connect(path, timeout=10))
        return
    import psycopg

    dsn = request.getfixturevalue("pg_dsn")
    yield Db("postgres", lambda: psycopg.connect(dsn))


def test_a_keys_effect_commits_once_and_the_same_fence_again_is_done(db: Db) -> None:
    db.effect(Run("k1", 5))
    with pytest.raises(EffectDone):
        db.effect(Run("k1", 5))
    assert db.writes() == [("k1", 5)]


def test_a_lower_fence_after_the_effect_is_stale_and_a_higher_one_finds_it_done(db: Db) -> None:
    db.effect(Run("k", 7))
    with pytest.raises(StaleFence, match="older than 7"):
        db.effect(Run("k", 6))
    with pytest.raises(EffectDone):
        db.effect(Run("k", 8))
    assert db.writes() == [("k", 7)]


def test_an_older_attempt_that_records_first_wins_and_the_newer_one_finds_it_done(
    db: Db,
) -> None:
    """The paused worker resumes before the newer attempt records (the
    end-to-end test has the other order): a lower fence is refused only once
    a newer one is recorded, so the older attempt's write goes in and the
    newer attempt, which held nothing, is told EffectDone. Still one write."""
    db.effect(Run("paused", 33))  # worker A, paused past its lease, resumes first
    with pytest.raises(EffectDone, match="fence 33"):
        db.effect(Run("paused", 34))  # worker B, the fire's newer attempt
    assert db.writes() == [("paused", 33)]
    with db.connect() as conn:
        recorded = conn.execute(
            db.sql("SELECT fence FROM wheel_effects WHERE idempotency_key = %s"), ("paused",)
        ).fetchall()
    assert [int(f) for (f,) in recorded] == [33]


def test_keys_are_a_fires_so_a_prefix_keeps_two_clusters_in_one_table_apart(db: Db) -> None:
    """Job 7's fire at one time has the same key in any cluster: a bare key
    with its fence, prefixed with the cluster's name, records each apart."""
    fire_key = "7:1893456000000"
    db.effect(Run(fire_key, 3))
    with pytest.raises(EffectDone):  # another cluster's job 7, the same fire time
        db.effect(Run(fire_key, 5))
    for cluster in ("eu", "us"):
        conn = db.connect()
        try:
            effects.record(conn, f"{cluster}/{fire_key}", 5)
            conn.commit()
        finally:
            conn.close()
    with db.connect() as conn:
        keys = conn.execute("SELECT idempotency_key FROM wheel_effects").fetchall()
    assert sorted(k for (k,) in keys) == sorted([fire_key, f"eu/{fire_key}", f"us/{fire_key}"])


def test_a_held_fence_refuses_an_older_attempt_before_the_effect_is_done(db: Db) -> None:
    conn = db.connect()
    effects.hold(conn, Run("h", 10))
    conn.commit()
    conn.close()
    with pytest.raises(StaleFence):
        db.effect(Run("h", 9))
    db.effect(Run("h", 10))  # the holder's own effect goes in
    conn = db.connect()
    with pytest.raises(EffectDone):
        effects.hold(conn, Run("h", 11))
    conn.close()
    assert db.writes() == [("h", 10)]


def test_an_effect_rolled_back_leaves_the_key_free_for_the_next_attempt(db: Db) -> None:
    with pytest.raises(RuntimeError):
        db.effect(Run("r", 1), fail=True)
    db.effect(Run("r", 2))
    assert db.writes() == [("r", 2)]


def test_named_effects_of_one_run_are_recorded_apart(db: Db) -> None:
    db.effect(Run("n", 1), name="email")
    db.effect(Run("n", 1), name="invoice")
    with pytest.raises(EffectDone):
        db.effect(Run("n", 1), name="email")
    assert len(db.writes()) == 2


def test_two_attempts_racing_on_one_key_end_with_one_write(db: Db) -> None:
    """The older attempt's transaction is open with its record when the newer
    one records: the newer waits on the row, then finds the effect done."""
    first = db.connect()
    effects.record(first, Run("race", 1))
    first.execute(db.sql("INSERT INTO reminders VALUES (%s, %s)"), ("race", 1))
    outcome: list[BaseException | None] = []

    def second() -> None:
        try:
            db.effect(Run("race", 2))
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=second)
    t.start()
    time.sleep(0.3)
    assert outcome == []  # waiting for the first to commit or roll back
    first.commit()
    first.close()
    t.join(15)
    assert len(outcome) == 1 and isinstance(outcome[0], EffectDone)
    assert db.writes() == [("race", 1)]


def test_a_bad_key_or_fence_is_refused_naming_it(db: Db) -> None:
    conn = db.connect()
    try:
        with pytest.raises(InvalidArgument) as err:
            effects.record(conn, Run("", 1))
        assert err.value.field == "idempotency_key"
        with pytest.raises(InvalidArgument) as err:
            effects.record(conn, "key")  # a bare key needs its fence
        assert err.value.field == "fence"
        effects.record(conn, "key", 3)
        with pytest.raises(InvalidArgument) as err:
            effects.record(object(), Run("k", 1))  # type: ignore[call-overload]
        assert err.value.field == "conn"
    finally:
        conn.rollback()
        conn.close()


@pytest.mark.postgres
def test_an_async_connection_records_in_its_transaction(pg_dsn: str) -> None:
    import psycopg

    with psycopg.connect(pg_dsn) as conn:
        effects.create_table(conn)

    async def attempt(fence: int) -> str:
        aconn = await psycopg.AsyncConnection.connect(pg_dsn)
        async with aconn:
            try:
                async with aconn.transaction():
                    await effects.record(aconn, Run("a", fence))
            except (StaleFence, EffectDone) as exc:
                return type(exc).__name__
        return "done"

    assert asyncio.run(attempt(4)) == "done"
    assert asyncio.run(attempt(3)) == "StaleFence"
    assert asyncio.run(attempt(4)) == "EffectDone"


def test_the_http_helper_sends_the_key_as_the_idempotency_key_header() -> None:
    seen: list[tuple[str, str | None, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append((self.path, self.headers.get("Idempotency-Key"), body))
            status = 409 if len(seen) > 1 else 201
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/charges"
        run = Run("fire-key", 9)
        first = http.request("POST", url, run, body=b"{}", headers={"X-A": "1"})
        again = http.request("post", url, run, body=b"{}", name="charge")
    finally:
        server.shutdown()
        server.server_close()
    assert (first.status, first.body, again.status) == (201, b"ok", 409)
    assert seen == [("/charges", "fire-key", b"{}"), ("/charges", "fire-key/charge", b"{}")]
    assert http.idempotency_headers(run, {"A": "b"}) == {"A": "b", "Idempotency-Key": "fire-key"}
