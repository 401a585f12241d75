"""A worker process of the dispatch benchmark: receives runs, runs a no-op handler
and records (job, scheduled_for, received, completed) for every run it got.

--system poll         the seed's worker: connects to the dispatch queue, claims
                      each batch in the lease table (R1 + R2), runs the handlers,
                      writes the terminal state fenced (``fence <= mine``).
--system apscheduler  connects to the dispatch queue the APScheduler executor
                      forwards to; no store writes (APScheduler keeps none).
--system wheel        a ``wheel.worker.Worker`` on the server's lease stream.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import RecordWriter, now_ms, recv_frames

_stop = False


def _on_term(signum: int, frame: Any) -> None:
    global _stop
    _stop = True


class PollStore:
    """The seed worker's two store writes per batch of runs, on SQLite or PostgreSQL."""

    def __init__(self, url: str, worker_id: str) -> None:
        self.worker_id = worker_id
        self.pg = url.startswith("postgresql")
        if self.pg:
            import psycopg

            self.conn: Any = psycopg.connect(url)
        else:
            import sqlite3

            self.conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
            self.conn.execute("PRAGMA busy_timeout = 30000")
            self.conn.execute("PRAGMA synchronous = NORMAL")

    def claim(self, runs: list[tuple[int, int, int, int]]) -> None:
        """R1's claim, kept out of the executions row as R2 asks: a lease row per run."""
        if self.pg:
            with self.conn.transaction(), self.conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO leases (run_id, worker_id, fence, expires_at)"
                    " VALUES (%s, %s, %s, now() + interval '60 s')"
                    " ON CONFLICT (run_id) DO UPDATE SET worker_id = excluded.worker_id,"
                    " fence = excluded.fence, expires_at = excluded.expires_at"
                    " WHERE leases.fence <= excluded.fence",
                    [(r[0], self.worker_id, r[3]) for r in runs],
                )
        else:
            expires = now_ms() + 60_000
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.executemany(
                "INSERT INTO leases (run_id, worker_id, fence, expires_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (run_id) DO UPDATE SET worker_id = excluded.worker_id,"
                " fence = excluded.fence, expires_at = excluded.expires_at"
                " WHERE leases.fence <= excluded.fence",
                [(r[0], self.worker_id, r[3], expires) for r in runs],
            )
            self.conn.execute("COMMIT")

    def complete(self, runs: list[tuple[int, int, int, int]], started_ms: int) -> None:
        """Terminal state, fenced by the store: a superseded run writes nothing."""
        if self.pg:
            with self.conn.transaction(), self.conn.cursor() as cur:
                cur.executemany(
                    "UPDATE executions SET state = 'succeeded', worker_id = %s,"
                    " started_at = to_timestamp(%s / 1000.0), finished_at = now()"
                    " WHERE run_id = %s AND fence <= %s AND state = 'dispatched'",
                    [(self.worker_id, started_ms, r[0], r[3]) for r in runs],
                )
                cur.execute("DELETE FROM leases WHERE run_id = ANY(%s)", ([r[0] for r in runs],))
        else:
            finished = now_ms()
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.executemany(
                "UPDATE executions SET state = 'succeeded', worker_id = ?, started_at = ?,"
                " finished_at = ? WHERE run_id = ? AND fence <= ? AND state = 'dispatched'",
                [(self.worker_id, started_ms, finished, r[0], r[3]) for r in runs],
            )
            self.conn.executemany("DELETE FROM leases WHERE run_id = ?", [(r[0],) for r in runs])
            self.conn.execute("COMMIT")


def run_queue_worker(args: argparse.Namespace) -> None:
    """poll and apscheduler: frames of runs from the loopback dispatch queue."""
    out = RecordWriter(Path(args.out))
    store = PollStore(args.store, f"w{os.getpid()}") if args.system == "poll" else None
    host, port = args.connect.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(0.1)
    buf = bytearray()
    try:
        while not _stop:
            try:
                chunk = sock.recv(1 << 20)
            except TimeoutError:
                out.maybe_flush()
                continue
            if not chunk:
                break
            buf += chunk
            for runs in recv_frames(buf):
                recv = now_ms()
                if store is not None:
                    store.claim(runs)
                # The handler: a no-op.
                if store is not None:
                    store.complete(runs, recv)
                done = now_ms()
                for run in runs:
                    out.add(run[1], run[2], recv, done)
            out.maybe_flush()
    finally:
        out.close()


def run_wheel_worker(args: argparse.Namespace) -> None:
    """K of these run ``wheel.worker.Worker`` with a recording no-op handler."""
    import asyncio

    from wheel.worker import Worker

    out = RecordWriter(Path(args.out))

    async def bench(ctx: Any) -> None:
        recv = now_ms()
        out.add(int(ctx.job_id), int(ctx.scheduled_for_ms), recv, now_ms())
        out.maybe_flush()

    async def main() -> None:
        # One stream per node of a cluster (a comma-separated --connect).
        worker = Worker(args.connect.split(","), capacity=args.capacity)
        worker.register("bench", bench)
        task = asyncio.ensure_future(worker.run())
        while not _stop and not task.done():
            await asyncio.sleep(0.1)
            out.maybe_flush()
        if not task.done():
            stop = getattr(worker, "stop", None)
            if stop is not None:
                res = stop()
                if asyncio.iscoroutine(res):
                    await res
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    profile = os.environ.get("WHEEL_WORKER_PROFILE")
    try:
        if profile:
            # Where a worker's time goes (the node's counterpart: WHEEL_PROFILE).
            import cProfile

            with cProfile.Profile() as prof:
                asyncio.run(main())
            prof.dump_stats(f"{profile}.{os.getpid()}")
        else:
            asyncio.run(main())
    finally:
        out.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--system", choices=["poll", "apscheduler", "wheel"], required=True)
    p.add_argument(
        "--connect",
        required=True,
        help="host:port of the queue or the server (wheel: several, comma-separated)",
    )
    p.add_argument("--out", required=True, help="this worker's record file")
    p.add_argument("--store", default="", help="poll: the store URL (workers write results)")
    p.add_argument("--capacity", type=int, default=1000, help="wheel: runs in flight")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    if args.system == "wheel":
        run_wheel_worker(args)
    else:
        run_queue_worker(args)
    time.sleep(0)


if __name__ == "__main__":
    main()
