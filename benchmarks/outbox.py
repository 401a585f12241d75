"""The transactional submit: how fast a node turns outbox rows into jobs, and
how soon after its commit a row's job is armed, against the client's own
submit to the same node in the same run.

    python benchmarks/outbox.py --rows 10000 --json out.json

One node (``wheelctl serve`` on a PostgreSQL schema of the benchmark's own;
the relay reads the store's own ``wheel_outbox``). The jobs are one-shots an
hour ahead: none fires during the run.

1. Throughput: ``--rows`` rows committed in ONE application transaction
   (``wheel.outbox.submit_many``), then the wait until the last row's fate is
   recorded. ``rows_per_s`` is the rows over the time from the commit to the
   last row's ``done_at``. The baseline: the same number of jobs through
   ``Client.submit_many`` (10,000 a call) to the same node.
2. Arm lag: ``--lag-rows`` transactions of one row each, at ``--lag-rate`` a
   second; a row's lag is from its commit's return (this host's clock) to its
   ``done_at`` (the database's clock, on the same host), written after the
   job is in the owner: an upper bound of the arm lag. The baseline: the
   round trip of ``Client.submit`` at the same rate.
3. Arm lag with the relay busy: the same probe rows, timed the same way,
   while another process commits a steady background of ``--busy-rate`` rows
   a second in transactions of ``--busy-batch`` rows (after a second to
   settle in; ``--busy-rate 0``: no such phase).

JSON keys: ``rows``, ``rows_per_s``, ``insert_rows_per_s`` (the
application's own cost: the one transaction's inserts), ``baseline_submit_many_per_s``,
``rows_ratio`` (rows_per_s over the baseline), ``lag_rows``,
``arm_lag_p50_ms``, ``arm_lag_p99_ms``, ``arm_lag_max_ms``,
``baseline_submit_p50_ms``, ``baseline_submit_p99_ms``; with the relay busy
``busy_rows_per_s`` (the background committed), ``busy_pending_max`` (the
most rows pending at a look, about every 50 ms, while the probes ran),
``busy_arm_lag_p50_ms``, ``busy_arm_lag_p99_ms``, ``busy_arm_lag_max_ms``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import _report
import numpy as np
import psycopg
from _cluster import free_port, stop_all, wait_until
from _drivers import DEFAULT_PG, PY, PgSchema

from wheel import outbox
from wheel.client import Client, JobRequest


def request(name: str, i: int, at: datetime) -> JobRequest:
    return JobRequest(name=name, handler="bench.noop", at=at, payload={"i": i})


def serving(target: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        with grpc.insecure_channel(target) as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
    except grpc.RpcError:
        return False
    return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


def pending(conn: psycopg.Connection[Any], ids: list[int]) -> int:
    (n,) = conn.execute(
        "SELECT count(*) FROM wheel_outbox WHERE id = ANY(%s) AND state = 'pending'", (ids,)
    ).fetchone() or (0,)
    conn.commit()
    return int(n)


def done_at(conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, float]:
    rows = conn.execute(
        "SELECT id, extract(epoch FROM done_at) FROM wheel_outbox"
        " WHERE id = ANY(%s) AND state = 'done'",
        (ids,),
    ).fetchall()
    conn.commit()
    return {int(i): float(t) for i, t in rows}


def throughput(dsn: str, target: str, rows: int, at: datetime) -> dict[str, float]:
    with psycopg.connect(dsn) as conn:
        started = time.perf_counter()
        entries = outbox.submit_many(conn, [request("bulk", i, at) for i in range(rows)])
        conn.commit()
        committed = time.time()
        insert_s = time.perf_counter() - started
        ids = [e.id for e in entries]
        wait_until(lambda: pending(conn, ids) == 0, 600, "every row's fate")
        last = max(done_at(conn, ids).values())
    relay_s = max(last - committed, 1e-6)
    started = time.perf_counter()
    with Client(target, timeout=600) as client:
        for low in range(0, rows, 10_000):
            high = min(rows, low + 10_000)
            client.submit_many([request("baseline", i, at) for i in range(low, high)])
    baseline_s = time.perf_counter() - started
    return {
        "rows_per_s": round(rows / relay_s, 1),
        "insert_rows_per_s": round(rows / insert_s, 1),
        "baseline_submit_many_per_s": round(rows / baseline_s, 1),
        "rows_ratio": round((rows / relay_s) / (rows / baseline_s), 3),
    }


def probe(
    dsn: str, count: int, rate: float, at: datetime, name: str = "lag"
) -> np.ndarray[Any, np.dtype[np.float64]]:
    """``count`` rows, one a transaction at ``rate`` a second: each one's lag
    (ms) from its commit to its fate."""
    interval = 1.0 / rate
    commits: dict[int, float] = {}
    with psycopg.connect(dsn) as conn:
        next_at = time.perf_counter()
        for i in range(count):
            time.sleep(max(0.0, next_at - time.perf_counter()))
            next_at += interval
            entry = outbox.submit(conn, name=name, handler="bench.noop", at=at, payload=i)
            conn.commit()
            commits[entry.id] = time.time()
        ids = list(commits)
        wait_until(lambda: pending(conn, ids) == 0, 120, "the lag rows' fates")
        done = done_at(conn, ids)
    return np.array([(done[i] - commits[i]) * 1000 for i in ids])


def lag(dsn: str, target: str, count: int, rate: float, at: datetime) -> dict[str, float]:
    lags = probe(dsn, count, rate, at)
    interval = 1.0 / rate
    trips = []
    with Client(target) as client:
        next_at = time.perf_counter()
        for i in range(count):
            time.sleep(max(0.0, next_at - time.perf_counter()))
            next_at += interval
            started = time.perf_counter()
            client.submit(name="lag-baseline", handler="bench.noop", at=at, payload=i)
            trips.append((time.perf_counter() - started) * 1000)
    base = np.array(trips)
    return {
        "lag_rows": count,
        "arm_lag_p50_ms": round(float(np.percentile(lags, 50)), 2),
        "arm_lag_p99_ms": round(float(np.percentile(lags, 99)), 2),
        "arm_lag_max_ms": round(float(lags.max()), 2),
        "baseline_submit_p50_ms": round(float(np.percentile(base, 50)), 2),
        "baseline_submit_p99_ms": round(float(np.percentile(base, 99)), 2),
    }


def background(dsn: str, rate: float, batch: int, at: datetime, stop: Any, committed: Any) -> None:
    """Commit ``batch`` rows a transaction, ``rate`` rows a second, until
    ``stop`` is set; ``committed`` counts the rows. A process of its own: in
    the probes' process its work would hold the GIL their clock reads need."""
    interval = batch / rate
    n = 0
    with psycopg.connect(dsn) as conn:
        next_at = time.perf_counter()
        while not stop.is_set():
            time.sleep(max(0.0, next_at - time.perf_counter()))
            # Behind by more than a second (the host busy): go on from now
            # rather than catch up in a burst.
            next_at = max(next_at + interval, time.perf_counter() - 1.0)
            outbox.submit_many(conn, [request("busy", n + i, at) for i in range(batch)])
            conn.commit()
            n += batch
            committed.value = n


def pending_all(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM wheel_outbox WHERE state = 'pending'").fetchone()
    conn.commit()
    return int(row[0]) if row else 0


def busy_lag(
    dsn: str, count: int, rate: float, busy_rate: float, busy_batch: int, at: datetime
) -> dict[str, float]:
    """The probe rows' lags while a background of ``busy_rate`` rows a second
    keeps the relay busy, and how many rows were pending at most meanwhile;
    then the wait until the background's rows are all relayed."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    committed = ctx.Value("q", 0)
    writer = ctx.Process(
        target=background, args=(dsn, busy_rate, busy_batch, at, stop, committed), daemon=True
    )
    writer.start()
    peak = 0
    watching = threading.Event()

    def watch() -> None:
        nonlocal peak
        with psycopg.connect(dsn) as conn:
            while not watching.wait(0.05):
                peak = max(peak, pending_all(conn))

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        wait_until(lambda: committed.value > 0, 60, "the background's first rows")
        time.sleep(1.0)  # the background settles in
        started, before = time.perf_counter(), committed.value
        watcher.start()
        lags = probe(dsn, count, rate, at, name="busy-lag")
        busy_per_s = (committed.value - before) / (time.perf_counter() - started)
    finally:
        watching.set()
        stop.set()
        writer.join(30)
    if watcher.is_alive():
        watcher.join(10)
    with psycopg.connect(dsn) as conn:
        wait_until(lambda: pending_all(conn) == 0, 300, "the background rows' fates")
    return {
        "busy_rows_per_s": round(busy_per_s, 1),
        "busy_pending_max": peak,
        "busy_arm_lag_p50_ms": round(float(np.percentile(lags, 50)), 2),
        "busy_arm_lag_p99_ms": round(float(np.percentile(lags, 99)), 2),
        "busy_arm_lag_max_ms": round(float(lags.max()), 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=10_000)
    p.add_argument("--lag-rows", type=int, default=500)
    p.add_argument("--lag-rate", type=float, default=100.0, help="lag rows a second")
    p.add_argument(
        "--busy-rate",
        type=float,
        default=2_000.0,
        help="background rows a second while the busy phase's lag rows are timed (0: no phase)",
    )
    p.add_argument("--busy-batch", type=int, default=20, help="background rows a transaction")
    p.add_argument("--pg-dsn", default=DEFAULT_PG)
    p.add_argument("--json")
    ns = p.parse_args()
    schema = PgSchema(ns.pg_dsn, "wheel-bench-outbox")
    root = Path(tempfile.mkdtemp(prefix="wheel-bench-outbox-"))
    port = free_port()
    target = f"127.0.0.1:{port}"
    cmd = [PY, "-m", "wheel", "serve", "--data-dir", str(root / "data"), "--listen", target]
    cmd += ["--store", schema.dsn]
    with open(root / "serve.log", "wb") as log:
        node = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: serving(target), 60, "the node to serve")
        at = datetime.now(UTC) + timedelta(hours=1)
        result: dict[str, Any] = {"rows": ns.rows}
        result |= throughput(schema.dsn, target, ns.rows, at)
        result |= lag(schema.dsn, target, ns.lag_rows, ns.lag_rate, at)
        if ns.busy_rate > 0:
            result |= busy_lag(
                schema.dsn, ns.lag_rows, ns.lag_rate, ns.busy_rate, ns.busy_batch, at
            )
    except BaseException:
        print(f"see {root / 'serve.log'}", file=sys.stderr)
        raise
    finally:
        stop_all([node])
        schema.drop()
    _report.emit(result, ns.json)


if __name__ == "__main__":
    main()
