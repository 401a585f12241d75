"""Bulk ingest: N jobs submitted through the client, against the store's own
limit in the same run; what holding them costs the nodes; and whether the
owners stay responsive meanwhile.

    python benchmarks/ingest.py --jobs 1000000 --nodes 1 --store sqlite --json out.json
    python benchmarks/ingest.py --jobs 1000000 --nodes 3 --store postgres --json out.json

``--nodes 1`` is the embedded node (``wheelctl serve``); more nodes are a
cluster over an etcd of the benchmark's own on one PostgreSQL schema. The
jobs (intervals and crons in several zones, half with a small payload, in ten
tenants) come due days ahead: none fires during the run. Twenty probe jobs
fire every second throughout, run by a worker process, so that an owner too
busy to hear a worker would show as a fire run twice.

1. The store's limit: the same job rows written straight into a scratch
   store of the same kind in bulk (COPY on PostgreSQL, one prepared
   statement a batch on SQLite), with no scheduler in the way.
2. The submit: ``Client.submit_many`` of ``--batch`` jobs a call from
   ``--threads`` threads, spread over the nodes, until all N are in; then the
   wait until the owners hold them all.
3. The nodes' RSS over what they used before the submit, per job; then every
   node restarted (SIGTERM, start again) and the same once they hold every
   job again.

JSON keys: ``jobs``, ``nodes``, ``store``, ``submit_per_s``,
``store_limit_per_s``, ``submit_ratio`` (of the two), ``held_after_s`` (from
the last answer until the owners held every job), ``rss_bytes_per_job``,
``rss_bytes_per_job_restored``, ``anon_bytes_per_job`` and
``anon_bytes_per_job_restored`` (the same without file pages: the
checkpoint's, mapped), ``restart_held_s`` (from the restart until the owners
held every job again), ``loop_stall_ms_max`` (the longest event-loop stall of
any node, from its ``wheel_loop_stall_max_seconds``), ``probe_fires`` (probe
fires the worker ran) and ``duplicates`` (of those, fires the worker was
handed more than once); ``node_cpu_us_per_job`` (the nodes' CPU, all
threads, from the first submit until the owners held every job) and
``client_cpu_us_per_job`` (this process's, making and sending the requests
and reading the answers), a job: what other load on the machine moves least.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import _report
import numpy as np
from _cluster import Etcd, free_port, stop_all, wait_until
from _drivers import DEFAULT_PG, HERE, PY, PgSchema
from _harness import RecordReader

from wheel.client import Client
from wheel.client._specs import JobRequest, job_spec
from wheel.engine.records import NewJob
from wheel.store._shared import new_job_row, new_profiles, spec_row

ZONES = ("UTC", "America/New_York", "Europe/London", "Asia/Tokyo")
PROBES = 20
# Seconds a submit_many call may take, its wait for its turn included.
SUBMIT_TIMEOUT_S = 120.0
DAY = timedelta(days=1)


def job_request(i: int, now: datetime) -> JobRequest:
    """Job ``i`` of the bulk: daily intervals starting days ahead, and crons
    that fire at night; half carry a payload."""
    payload = {"order": i, "kind": "reminder"} if i % 2 else b""
    tenant = f"tenant-{i % 10}"
    if i % 4 == 3:
        zone = ZONES[i % len(ZONES)]
        return JobRequest(
            name=f"nightly-{i}",
            handler="reports.nightly",
            cron=f"{i % 60} 3 * * *",
            tz=zone,
            payload=payload,
            tenant=tenant,
        )
    start = now + 2 * DAY + timedelta(seconds=i % 86_400)
    return JobRequest(
        name=f"reminder-{i}",
        handler="reminders.send",
        every=DAY,
        start=start,
        payload=payload,
        tenant=tenant,
    )


def _batches(n: int, size: int) -> list[range]:
    return [range(s, min(n, s + size)) for s in range(0, n, size)]


# -- the store's limit -------------------------------------------------------------------


def store_limit(
    kind: str, tmp: Path, dsn: str, jobs: int, batch: int, now: datetime
) -> tuple[float, float]:
    """Rows per second the store takes in bulk, and the seconds it took: the
    rows are made first (untimed, on every core, a chunk of batches at a
    time), then written batch by batch (timed, with nothing else running)."""
    spent = 0.0
    if kind == "sqlite":
        from wheel.store.sqlite import SQLiteStore
        from wheel.store.sqlite import _sql as sq

        lite = SQLiteStore(tmp / "limit.db")
        lite.migrate()
        lite.close()
        db = sqlite3.connect(tmp / "limit.db", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        for rows, specs, keys, profiles in _made_rows(jobs, batch, now, sqlite=True):
            t0 = time.perf_counter()
            db.execute("BEGIN IMMEDIATE")
            db.executemany(sq.INSERT_PROFILE, profiles)
            db.executemany(sq.INSERT_JOB, rows)
            db.executemany(sq.INSERT_SPEC, specs)
            db.executemany(sq.INSERT_KEY, keys)
            db.execute("COMMIT")
            spent += time.perf_counter() - t0
        db.close()
    else:
        import psycopg

        from wheel.store.postgres import PostgresStore
        from wheel.store.postgres import _sql as pg

        scratch = PgSchema(dsn, f"wheel-ingest-limit-{tmp.name[-8:]}")
        try:
            store = PostgresStore(scratch.dsn)
            store.migrate()
            store.close()
            with psycopg.connect(scratch.dsn) as conn:
                for rows, specs, keys, profiles in _made_rows(jobs, batch, now, sqlite=False):
                    t0 = time.perf_counter()
                    with conn.cursor() as cur:
                        cur.executemany(
                            "INSERT INTO job_profiles (profile_id, body) VALUES (%s, %s)"
                            " ON CONFLICT DO NOTHING",
                            profiles,
                        )
                        with cur.copy(pg.COPY_JOBS_SQL) as copy:
                            for row in rows:
                                copy.write_row(row)
                        with cur.copy(pg.COPY_SPECS_SQL) as copy:
                            for spec in specs:
                                copy.write_row(spec)
                        with cur.copy(_COPY_KEYS) as copy:
                            for key in keys:
                                copy.write_row(key)
                    conn.commit()
                    spent += time.perf_counter() - t0
        finally:
            scratch.drop()
    return jobs / spent, spent


# Batches of rows made at once before they are written: enough to keep every
# core busy, few enough to hold (a batch of 10,000 is a few megabytes).
ROWS_CHUNK_BATCHES = 16

Made = tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]], list[Any]]


def _made_rows(jobs: int, batch: int, now: datetime, *, sqlite: bool) -> Iterator[Made]:
    """Every batch's rows (jobs, specs, keys, profiles), in order: made in a
    pool of processes a chunk of batches at a time, and handed out only once
    the whole chunk is made, so that no process is busy while a batch is
    written and timed. Making ten million rows takes a core about a quarter
    of an hour, which is not what is measured."""
    parts = _batches(jobs, batch)
    make = functools.partial(_rows_of, now=now, sqlite=sqlite)
    workers = os.cpu_count() or 1
    if len(parts) <= 1 or workers == 1:
        yield from map(make, parts)
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        for at in range(0, len(parts), ROWS_CHUNK_BATCHES):
            yield from list(pool.map(make, parts[at : at + ROWS_CHUNK_BATCHES]))


def _rows_of(part: range, *, now: datetime, sqlite: bool) -> Made:
    """Jobs ``part``'s rows, their ids from ``part.start + 1``."""
    now_ms = int(now.timestamp() * 1000)
    first_id = part.start + 1
    news = [_new(i, now, now_ms) for i in part]
    tail = (1,) if sqlite else ()
    rows = [(*new_job_row(first_id + k, n), *tail) for k, n in enumerate(news)]
    specs = [spec_row(first_id + k, n) for k, n in enumerate(news)]
    keys = [_key_row(first_id + k, n) for k, n in enumerate(news)]
    return rows, specs, keys, new_profiles(news)


_COPY_KEYS = (
    "COPY idempotency_keys (tenant, idempotency_key, body_hash, job_id, created_at_ms) FROM STDIN"
)


def _new(i: int, now: datetime, now_ms: int) -> NewJob:
    """Job ``i`` as the store gets it: its spec, first fire and a key of its
    own, as the client sends every job."""
    spec = job_spec(job_request(i, now), now_ms=now_ms)
    first = spec.schedule.start_at_ms if hasattr(spec.schedule, "start_at_ms") else now_ms
    return NewJob(
        spec=spec,
        created_at_ms=now_ms,
        next_run_at=first,
        idempotency_key=f"wheel-client-{i:032x}",
        body_hash="0" * 64,
    )


def _key_row(job_id: int, new: NewJob) -> tuple[str, str | None, str | None, int, int]:
    return (new.spec.tenant, new.idempotency_key, new.body_hash, job_id, new.created_at_ms)


# -- the nodes ---------------------------------------------------------------------------


class NodeProc:
    """One ``wheelctl serve`` process, restartable on the same data dir."""

    def __init__(self, root: Path, index: int, wheelctl: str, args: Sequence[str]) -> None:
        self.dir = root / f"node-{index}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.metrics_port = free_port()
        self.cmd = [
            wheelctl, "serve", "--data-dir", str(self.dir / "data"), "--listen", self.target,
            "--metrics-listen", f"127.0.0.1:{self.metrics_port}", "--node-id", f"node-{index}",
            *args,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def spawn(self) -> None:
        self.starts += 1
        with open(self.dir / f"serve-{self.starts}.log", "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)

    def cpu_s(self) -> float:
        """The process's CPU seconds so far, all threads, user and system."""
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss(self) -> tuple[int, int]:
        assert self.proc is not None
        return rss_parts(self.proc.pid)

    def metric(self, name: str) -> float:
        import urllib.request

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return 0.0

    def jobs(self) -> int | None:
        from wheel.errors import WheelError

        try:
            with Client(self.target, timeout=5.0) as client:
                return client.status().jobs
        except WheelError:
            return None

    def stop(self) -> None:
        stop_all([self.proc] if self.proc is not None else [])


def _rss(nodes: Sequence[NodeProc]) -> tuple[int, int]:
    parts = [n.rss() for n in nodes]
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def held(nodes: Sequence[NodeProc]) -> int:
    total = 0
    for node in nodes:
        n = node.jobs()
        if n is None:
            return -1
        total += n
    return total


def submit_all(
    targets: Sequence[str], jobs: int, batch: int, threads: int, now: datetime
) -> tuple[float, int]:
    """Submit every job; the seconds from the first call to the last answer,
    and how many items came back with an error."""
    work = _batches(jobs, batch)
    lock = threading.Lock()
    errors = [0]
    failures: list[BaseException] = []

    def worker(n: int) -> None:
        # A call waits its turn behind the other threads' (a node works on
        # one bulk submit at a time): on a loaded machine, longer than the
        # client's default timeout.
        order = list(targets[n % len(targets) :]) + list(targets[: n % len(targets)])
        with Client(order, timeout=SUBMIT_TIMEOUT_S) as c:
            while True:
                with lock:
                    if not work:
                        return
                    part = work.pop(0)
                try:
                    out = c.submit_many(job_request(i, now) for i in part)
                except BaseException as exc:
                    failures.append(exc)
                    return
                bad = sum(1 for r in out if isinstance(r, Exception))
                with lock:
                    errors[0] += bad

    started = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if failures:
        raise RuntimeError(f"a submit call failed: {failures[0]!r}")
    return time.perf_counter() - started, errors[0]


def probe_runs(path: Path) -> tuple[int, int, int]:
    """From the worker's record file: probe fires it ran, those it was handed
    more than once, and the most times one was."""
    records = RecordReader([path])
    records.poll()
    runs = records.all()
    if not len(runs):
        return 0, 0, 0
    keys = runs["job"].astype(np.int64) * 1_000_003 + runs["sched"]
    _, counts = np.unique(keys, return_counts=True)
    return len(counts), int(np.count_nonzero(counts > 1)), int(counts.max())


def _own_cpu_s() -> float:
    """This process's CPU seconds so far, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_parts(pid: int) -> tuple[int, int]:
    """A process's resident memory: (all, anonymous: not file pages)."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["RssAnon"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.nodes > 1 and args.store != "postgres":
        raise SystemExit("a cluster (--nodes > 1) needs --store postgres")
    tmp = Path(tempfile.mkdtemp(prefix="wheel-ingest-"))
    now = datetime.now(UTC).replace(microsecond=0)
    limit_per_s, limit_s = store_limit(args.store, tmp, args.pg_dsn, args.jobs, args.batch, now)
    print(f"store limit: {limit_per_s:,.0f} rows/s ({limit_s:.1f} s)", file=sys.stderr)
    schema = (
        PgSchema(args.pg_dsn, f"wheel-ingest-{tmp.name[-8:]}") if args.store == "postgres" else None
    )
    etcd = Etcd(tmp / "etcd-data") if args.nodes > 1 else None
    nodes: list[NodeProc] = []
    worker: subprocess.Popen[bytes] | None = None
    try:
        serve: list[str] = list(args.serve_arg)
        if schema is not None:
            serve += ["--store", schema.dsn]
        if etcd is not None:
            etcd.start()
            serve += ["--cluster", f"etcd://{etcd.endpoint}/ingest"]
        nodes = [NodeProc(tmp, i + 1, args.wheelctl, serve) for i in range(args.nodes)]
        for node in nodes:
            node.spawn()
        wait_until(lambda: held(nodes) >= 0, 60, "the nodes to serve")
        targets = [n.target for n in nodes]
        with Client(targets) as client:
            for p in range(PROBES):
                client.submit(
                    name=f"probe-{p}",
                    handler="bench",
                    every=timedelta(seconds=1),
                    start=now + timedelta(seconds=5 + p / PROBES),
                )
        worker = subprocess.Popen(
            [PY, str(HERE / "bench_worker.py"), "--system", "wheel", "--connect",
             ",".join(targets), "--out", str(tmp / "probes.rec"), "--capacity", "64"],
            cwd=HERE,
        )  # fmt: skip
        wait_until(lambda: held(nodes) == PROBES, 60, "the owners to hold the probes")
        time.sleep(2)  # the worker connected, fires flowing
        empty = _rss(nodes)

        node_cpu = sum(n.cpu_s() for n in nodes)
        client_cpu = _own_cpu_s()
        submit_s, errors = submit_all(targets, args.jobs, args.batch, args.threads, now)
        client_cpu = _own_cpu_s() - client_cpu
        if errors:
            raise RuntimeError(f"{errors} submits came back with an error")
        print(f"submitted {args.jobs} in {submit_s:.1f} s", file=sys.stderr)
        answered = time.perf_counter()
        total = args.jobs + PROBES
        wait_until(lambda: held(nodes) == total, args.hold_timeout, "the owners to hold every job")
        held_after_s = time.perf_counter() - answered
        node_cpu = sum(n.cpu_s() for n in nodes) - node_cpu
        time.sleep(2)
        held_rss = _rss(nodes)
        stall_s = max(n.metric("wheel_loop_stall_max_seconds") for n in nodes)

        for node in nodes:
            node.stop()
        restarted = time.perf_counter()
        for node in nodes:
            node.spawn()
        wait_until(
            lambda: held(nodes) == total, args.hold_timeout, "the owners to hold every job again"
        )
        restart_held_s = time.perf_counter() - restarted
        time.sleep(2)
        restored_rss = _rss(nodes)
        stall_s = max(stall_s, *(n.metric("wheel_loop_stall_max_seconds") for n in nodes))
        time.sleep(3)  # probe fires after the restart
        stop_all([worker])
        probe_fires, duplicates, most = probe_runs(tmp / "probes.rec")
        if duplicates:
            print(f"{duplicates} probe fires run more than once (up to {most})", file=sys.stderr)
    finally:
        stop_all([worker] if worker is not None else [])
        for node in nodes:
            node.stop()
        if etcd is not None:
            etcd.stop()
        if schema is not None:
            schema.drop()
    return {
        "jobs": args.jobs,
        "nodes": args.nodes,
        "store": args.store,
        "submit_per_s": round(args.jobs / submit_s),
        "store_limit_per_s": round(limit_per_s),
        "submit_ratio": round(args.jobs / submit_s / limit_per_s, 3),
        "held_after_s": round(held_after_s, 2),
        "rss_bytes_per_job": round((held_rss[0] - empty[0]) / args.jobs, 1),
        "rss_bytes_per_job_restored": round((restored_rss[0] - empty[0]) / args.jobs, 1),
        # Of those, not file pages (the checkpoint's, mapped): memory only the
        # process itself can give back.
        "anon_bytes_per_job": round((held_rss[1] - empty[1]) / args.jobs, 1),
        "anon_bytes_per_job_restored": round((restored_rss[1] - empty[1]) / args.jobs, 1),
        "restart_held_s": round(restart_held_s, 2),
        "loop_stall_ms_max": round(stall_s * 1000, 1),
        "probe_fires": probe_fires,
        "duplicates": duplicates,
        "node_cpu_us_per_job": round(node_cpu / args.jobs * 1e6, 1),
        "client_cpu_us_per_job": round(client_cpu / args.jobs * 1e6, 1),
    }


def main(argv: list[str] | None = None) -> int:
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every child process.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--json", dest="json_path")
    p.add_argument("--batch", type=int, default=10_000, help="jobs a submit_many call")
    p.add_argument("--threads", type=int, default=4, help="client threads submitting")
    p.add_argument("--hold-timeout", type=float, default=600.0)
    p.add_argument("--pg-dsn", default=DEFAULT_PG)
    p.add_argument("--wheelctl", default=str(Path(PY).with_name("wheelctl")))
    p.add_argument("--serve-arg", action="append", default=[], help="an extra argument for serve")
    args = p.parse_args(argv)
    _report.emit(run(args), args.json_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
