"""How long the web console's JSON calls take with many jobs in the store.

    python benchmarks/console.py --jobs 100000 --json benchmarks/out/console.json

Starts a node (``wheelctl serve --http-listen``; ``--store sqlite``, the
default, in a temporary directory, ``--store postgres`` in a schema of its
own in the ``test`` database, dropped afterwards, or a store URL), loads
``--jobs`` jobs through
``submit_many`` (ten thousand a call; every name distinct, two tenants, a
few paused), then calls each console endpoint ``--repeat`` times over HTTP
and reports p50, p99 and max in ms. The baseline, in the same run, is the
one gRPC call each list endpoint makes, timed from the same process: what
the console adds is the difference. The console's budget is 200 ms a call.

    python benchmarks/console.py --jobs 100000 --runs 1000000 --json ...
    python benchmarks/console.py --store postgres --runs 1000000 --dense-day --json ...

With ``--runs`` the jobs and that many ended runs, spread over the last
``--days`` days (``--dense-day``: all in the last 24 hours), go straight
into the store before the node starts (``_history.py``): the overview's
aggregates, the feed of recent runs and a job's history are timed against
a store of that size. Each call's first time (``first_ms``: the node has
kept nothing yet) is reported beside its p50, p99 and max.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _cluster import free_port
from _history import load_history

from wheel.client import Client, JobRequest

PG_DSN = os.environ.get("WHEEL_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
BUDGET_MS = 200.0
BATCH = 10_000
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


def timed(fn: Callable[[], Any], repeat: int) -> dict[str, float]:
    start = time.perf_counter()
    fn()  # warm: a first call opens channels, pages the index in, fills caches
    first = (time.perf_counter() - start) * 1000
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    ranked = sorted(samples)
    p99 = ranked[max(0, -(-99 * len(ranked) // 100) - 1)]
    return {
        "p50_ms": round(statistics.median(samples), 2),
        "p99_ms": round(p99, 2),
        "max_ms": round(max(samples), 2),
        "first_ms": round(first, 2),
    }


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status}")
        return json.loads(resp.read()) if "json" in resp.headers["Content-Type"] else resp.read()


@contextlib.contextmanager
def store_url(store: str, data: Path) -> Iterator[str]:
    """The URL of the store ``--store`` names: SQLite in ``data``, a fresh
    PostgreSQL schema (dropped afterwards), or the URL given."""
    if store == "sqlite":
        yield f"sqlite:///{data / 'wheel.db'}"
        return
    if store != "postgres":
        yield store
        return
    import psycopg

    schema = f"wheel_console_{secrets.token_hex(4)}"
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        sep = "&" if "?" in PG_DSN else "?"
        yield f"{PG_DSN}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


def start_node(data_dir: Path, store: str | None) -> tuple[subprocess.Popen[str], str, str]:
    grpc_port, http_port = free_port(), free_port()
    args = [sys.executable, "-m", "wheel", "serve", "--data-dir", str(data_dir)]
    args += ["--listen", f"127.0.0.1:{grpc_port}", "--http-listen", f"127.0.0.1:{http_port}"]
    if store:
        args += ["--store", store]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        if "wheel serving on" in line:
            break
        if time.monotonic() > deadline:
            raise RuntimeError("the node did not start")
    return proc, f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}"


def load(client: Client, jobs: int) -> list[int]:
    ids: list[int] = []
    start = datetime.now(UTC) + timedelta(hours=1)  # nothing fires while measured
    for first in range(0, jobs, BATCH):
        batch = [
            JobRequest(
                name=f"job-{i:06d}",
                handler="h",
                tenant="acme" if i % 2 else "globex",
                every=timedelta(hours=6),
                start=start,
            )
            for i in range(first, min(jobs, first + BATCH))
        ]
        for result in client.submit_many(batch):
            if isinstance(result, Exception):
                raise result
            ids.append(result.job_id)
    return ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument(
        "--store",
        default="sqlite",
        help="sqlite (in a temporary directory), postgres (a schema of its own) or a store URL",
    )
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument(
        "--runs", type=int, default=0, help="ended runs loaded straight into the store (0: none)"
    )
    ap.add_argument("--days", type=float, default=7.0, help="the runs' span, back from now")
    ap.add_argument(
        "--dense-day", action="store_true", help="every run in the last 24 hours (--days 1)"
    )
    ns = ap.parse_args()
    if ns.dense_day:
        ns.days = 1.0

    with tempfile.TemporaryDirectory() as tmp, store_url(ns.store, Path(tmp) / "data") as dsn:
        data = Path(tmp) / "data"
        data.mkdir()
        loaded: dict[str, float] = {}
        if ns.runs:
            loaded = load_history(dsn, jobs=ns.jobs, runs=ns.runs, days=ns.days)
        proc, target, url = start_node(data, None if ns.store == "sqlite" else dsn)
        try:
            with Client(target, timeout=120) as client:
                started = time.perf_counter()
                if ns.runs:
                    ids = sorted(j.job_id for j in client.jobs(page_size=1000))
                else:
                    ids = load(client, ns.jobs)
                load_s = time.perf_counter() - started + sum(loaded.values())
                for job_id in ids[:: max(1, len(ids) // 10)]:
                    client.pause(job_id)
                # A cursor deep in each list, as the last pages have.
                deep = str(ids[-60])
                deep_name = f"{ids[-60]}:job-{len(ids) - 60:06d}"
                middle = ids[len(ids) // 2]
                endpoints: dict[str, tuple[str, Callable[[], Any] | None]] = {
                    "page": ("/", None),
                    "jobs first page": (
                        "/api/jobs?page_size=50",
                        lambda: client.jobs_page(page_size=50),
                    ),
                    "jobs last page": (
                        f"/api/jobs?page_size=50&page_token={deep}",
                        lambda: client.jobs_page(page_size=50, page_token=deep),
                    ),
                    "jobs by name prefix": (
                        "/api/jobs?page_size=50&name=job-0999",
                        lambda: client.jobs_page(page_size=50, name_prefix="job-0999"),
                    ),
                    "jobs by name, last page": (
                        f"/api/jobs?page_size=50&name=job-&page_token={deep_name}",
                        lambda: client.jobs_page(
                            page_size=50, name_prefix="job-", page_token=deep_name
                        ),
                    ),
                    "jobs paused": (
                        "/api/jobs?page_size=50&state=paused",
                        lambda: client.jobs_page(page_size=50, state="paused"),
                    ),
                    "jobs of a tenant": (
                        "/api/jobs?page_size=50&tenant=acme",
                        lambda: client.jobs_page(page_size=50, tenant="acme"),
                    ),
                    "job": (f"/api/jobs/{middle}", lambda: client.get(middle, next_fires=10)),
                    "job runs": (f"/api/jobs/{middle}/runs", lambda: client.runs_page(middle)),
                    "job dead letters": (
                        f"/api/jobs/{middle}/dead-letters",
                        lambda: client.dead_letters_page(middle, page_size=50),
                    ),
                    "dead letters, every job": (
                        "/api/dead-letters",
                        lambda: client.dead_letters_page(page_size=50),
                    ),
                    "in flight": ("/api/in-flight", lambda: client.in_flight()),
                    "workers": ("/api/workers", lambda: client.status()),
                    "cluster": ("/api/cluster", lambda: client.status(include_shards=True)),
                    "lag": ("/api/lag", lambda: client.lag_history()),
                    # The overview, the feed of recent runs, a job's history.
                    "overview, hour": (
                        "/api/overview?window=hour",
                        lambda: client.run_overview(window=HOUR, bucket=MINUTE),
                    ),
                    "overview, day": (
                        "/api/overview?window=day",
                        lambda: client.run_overview(window=DAY, bucket=15 * MINUTE),
                    ),
                    "overview of a tenant, hour": (
                        "/api/overview?window=hour&tenant=acme",
                        lambda: client.run_overview(tenant="acme", window=HOUR, bucket=MINUTE),
                    ),
                    "overview of a tenant, day": (
                        "/api/overview?window=day&tenant=acme",
                        lambda: client.run_overview(tenant="acme", window=DAY, bucket=15 * MINUTE),
                    ),
                    "recent runs": ("/api/runs", lambda: client.recent_runs_page()),
                    "recent runs, failed": (
                        "/api/runs?outcome=failed",
                        lambda: client.recent_runs_page(outcome="failed"),
                    ),
                    "recent runs, dead-lettered": (
                        "/api/runs?outcome=dead_lettered",
                        lambda: client.recent_runs_page(outcome="dead_lettered"),
                    ),
                    "recent runs of a tenant": (
                        "/api/runs?tenant=acme",
                        lambda: client.recent_runs_page(tenant="acme"),
                    ),
                    "recent runs of a handler": (
                        "/api/runs?handler=mail.send",
                        lambda: client.recent_runs_page(handler="mail.send"),
                    ),
                    "recent runs by job name": (
                        "/api/runs?job=job-0999",
                        lambda: client.recent_runs_page(job_name="job-0999"),
                    ),
                    "job history": (
                        f"/api/jobs/{middle}/history",
                        lambda: client.job_history(middle),
                    ),
                    "alerts": ("/api/alerts", lambda: client.alerts(limit=100)),
                }
                results: dict[str, Any] = {}
                for name, (path, grpc_call) in endpoints.items():
                    row: dict[str, Any] = dict(
                        timed(lambda path=path: get(url + path), ns.repeat)  # type: ignore[misc]
                    )
                    if grpc_call is not None:
                        base = timed(grpc_call, ns.repeat)
                        row["grpc_p50_ms"] = base["p50_ms"]
                        row["grpc_p99_ms"] = base["p99_ms"]
                        row["grpc_max_ms"] = base["max_ms"]
                    row["path"] = path
                    results[name] = row
        finally:
            proc.terminate()
            proc.wait(30)
    worst = max(r["max_ms"] for r in results.values())
    out = {
        "jobs": ns.jobs,
        "runs": ns.runs,
        "runs_days": ns.days if ns.runs else 0,
        "dense_day": bool(ns.runs) and ns.days <= 1.0,
        "worst_p99_ms": max(r["p99_ms"] for r in results.values()),
        "worst_first_ms": max(r["first_ms"] for r in results.values()),
        "store": {"sqlite": "sqlite", "postgres": "postgresql"}.get(
            ns.store, ns.store.split("://")[0]
        ),
        "load_s": round(load_s, 2),
        "repeat": ns.repeat,
        "budget_ms": BUDGET_MS,
        "worst_max_ms": worst,
        "within_budget": worst < BUDGET_MS,
        "cpus": os.cpu_count(),
        "endpoints": results,
    }
    text = json.dumps(out, indent=2)
    print(text)
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
