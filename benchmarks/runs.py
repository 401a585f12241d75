"""A month of runs: what a large ``executions`` table costs a node.

    python benchmarks/runs.py --runs 1000000 --store postgres --json out.json
    python benchmarks/runs.py --runs 1000000 --store sqlite --json out.json

Two stores of one kind, one after the other in the same run, each with the
same ``--history-jobs`` jobs (none of them fires while measured):

1. **Empty**: no runs. A node (``wheelctl serve``) and ``--workers`` worker
   processes dispatch ``--rate`` fires a second (interval jobs, submitted
   first) for ``--duration`` seconds: CPU per thousand fires (the node, its
   workers and, on PostgreSQL, the database's backends) and the p99 lag of
   every fire (``dispatch.py``'s harness and figures).
2. **Full**: ``--runs`` ended runs of those jobs, spread evenly over the last
   ``--days`` days (40: past the node's default 30-day retention), go straight
   into the store (COPY on PostgreSQL, one transaction on SQLite: the console
   benchmark's ``_history.py``, per-minute counts included; 96% succeeded,
   the rest dead-lettered: nothing owed a retry, as in a store a node has run
   for a month), and the table's size on disk is read. Then the same dispatch
   as above, and while fires keep coming at the same rate: ``wheelctl runs
   JOB_ID`` (the gRPC call it makes) and the console's history calls over
   HTTP, for jobs across the table; then the node's own first retention pass
   (``--retain 30d``, started ``--retention-after`` seconds after the node, at
   most 60) runs to its end while dispatch goes on.

JSON keys: ``runs``, ``store``, ``history_jobs``, ``fill_s``,
``fill_runs_per_s``, ``bytes_per_run`` (the table with its indexes, on disk,
over the runs loaded), ``heap_bytes_per_run`` (the rows alone),
``cpu_s_per_1k`` and ``lag_p99_ms`` (full) beside ``empty_cpu_s_per_1k`` and
``empty_lag_p99_ms``, ``dispatch_cost_ratio`` (full over empty, CPU per
thousand fires of the node, its workers and the database), ``lag_ratio``,
``history_p99_ms`` (the worst p99 of the history calls; each call's own under
``history``; ``history_during_retention``: the pass began before they ended,
so they were timed under its load too), ``retention_s`` (the pass, first
deletion to the pass's end, as the node logs it; null when it had not ended
within ``--retention-timeout``, ``retention_ended`` false, and the rest says
what it did by then), ``retention_purged_rows``, ``retention_rows_per_s``,
``retention_stall_ms_max`` (the node's longest event-loop stall while it ran,
from ``wheel_loop_stall_max_seconds``; when that maximum was set before the
pass, the top of the highest ``wheel_loop_stall_seconds`` bucket that grew
during it), ``retention_lag_p99_ms`` (the fires due during the pass),
``rate``, ``lost`` and ``duplicates`` (both windows summed).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h
import _report
import numpy as np
from _cluster import free_port
from _drivers import DEFAULT_PG, PY, RunConfig, WheelDriver
from _history import load_history, settled
from console import get, timed

DAY_MS = 86_400_000
RETAIN = "30d"
# ``wheelctl runs JOB_ID`` without --limit: the newest 50, and one more to
# say whether there are more.
RUNS_PAGE = 51


class FilledDriver(WheelDriver):
    """The dispatch benchmark's wheel driver on a store filled first (jobs,
    and runs when ``runs``), serving its metrics and the console."""

    def __init__(
        self, cfg: RunConfig, tmp: Path, records: list[Path], *, jobs: int, runs: int, days: float
    ) -> None:
        super().__init__(cfg, tmp, records)
        self.with_metrics = True
        self.jobs, self.runs, self.days = jobs, runs, days
        self.filled: dict[str, Any] = {}

    def make_store(self, data: Path) -> str:
        url = super().make_store(data)
        took = load_history(url, jobs=self.jobs, runs=self.runs, days=self.days,
                            first_fire_in_ms=30 * DAY_MS, outcomes=settled)  # fmt: skip
        self.filled = {"fill_s": took["runs_s"], "jobs_s": took["jobs_s"], **table_size(url)}
        return url


def table_size(url: str) -> dict[str, int]:
    """``executions`` on disk: with its indexes, and its rows alone (bytes)."""
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///").split("?")[0]
        con = sqlite3.connect(path)
        try:
            sizes = dict(
                con.execute(
                    "SELECT name, SUM(pgsize) FROM dbstat WHERE name IN (SELECT name FROM"
                    " sqlite_master WHERE tbl_name = 'executions') GROUP BY name"
                ).fetchall()
            )
        finally:
            con.close()
        return {"total": sum(sizes.values()), "heap": sizes.get("executions", 0)}
    import psycopg

    with psycopg.connect(url) as pg:
        row = pg.execute(
            "SELECT pg_total_relation_size('executions'), pg_relation_size('executions')"
        ).fetchone()
    assert row is not None
    return {"total": int(row[0]), "heap": int(row[1])}


def metrics(url: str) -> dict[str, float]:
    """The node's /metrics: sample name (with its labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = float(s.value)
    return out


def stall_buckets(m: dict[str, float]) -> dict[float, float]:
    """``wheel_loop_stall_seconds``'s cumulative buckets: upper bound -> count."""
    out = {}
    for key, value in m.items():
        if key.startswith("wheel_loop_stall_seconds_bucket{"):
            le = re.search(r"le=([^,}]+)", key)
            if le is not None:
                out[float(le.group(1))] = value
    return out


def stalled_during(before: dict[str, float], after: dict[str, float]) -> tuple[float, str]:
    """The longest loop stall between two scrapes (s), and how it is known."""
    top0 = before.get("wheel_loop_stall_max_seconds", 0.0)
    top1 = after.get("wheel_loop_stall_max_seconds", 0.0)
    if top1 > top0:
        return top1, "max"
    b0, b1 = stall_buckets(before), stall_buckets(after)
    grew = {le: b1[le] - b0.get(le, 0.0) for le in sorted(b1)}
    if not grew or not grew[max(grew)]:
        return 0.0, "none"
    # Cumulative buckets: every stall of the interval lies at or under the
    # first bound whose count grew by as many as the last (+Inf) did.
    top = next(le for le, n in grew.items() if n == grew[max(grew)])
    return min(top, top0), "bucket"


def measure(
    driver: FilledDriver,
    rate: float,
    cfg: RunConfig,
    label: str,
    after: Callable[[FilledDriver, h.RecordReader], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One node on the driver's store: dispatch at ``rate`` for the window,
    its figures; then ``after`` while the same fires keep coming."""
    try:
        driver.prepare()
        lead_ms = 3000 + round(1500 * rate * cfg.period_s / driver.submit_rate_hint)
        workload = h.Workload.build(
            rate=rate, duration_s=cfg.duration_s, start_ms=h.now_ms() + lead_ms,
            recurring_fraction=1.0, period_s=cfg.period_s,
        )  # fmt: skip
        job_index = driver.submit(workload)
        pids = driver.launch()
        time.sleep(max(0.0, (workload.start_ms - h.now_ms()) / 1000))
        purged0 = driver.purged()
        cpu0, db0 = h.cpu_total(pids), h.cpu_total(driver.db_pids())
        reader = h.RecordReader(driver.records)
        progress = h.Progress(label, workload, job_index)
        hard_end = workload.end_ms + round(cfg.drain_s * 1000)
        while True:
            time.sleep(0.2)
            now = h.now_ms()
            progress.feed(reader.poll())
            progress.show(now)
            if (progress.all_dispatched and now >= workload.end_ms + 600) or now >= hard_end:
                break
            if any(p.poll() is not None for p in driver.procs):
                raise RuntimeError(f"a process exited during the run; see {driver.tmp}")
        end_ms = h.now_ms()
        progress.show(end_ms, force=True)
        progress.done()
        cpu1, db1 = h.cpu_total(pids), h.cpu_total(driver.db_pids())
        purged1 = driver.purged()
        a = h.analyse(workload, reader.all(), job_index=job_index, end_ms=end_ms)
        per_k = 1000 / a.dispatched if a.dispatched else float("nan")
        cpu = sum(cpu1[p] - cpu0.get(p, 0.0) for p in cpu1)
        db = sum(db1[p] - db0.get(p, 0.0) for p in db1)
        out: dict[str, Any] = {
            "cpu_s_per_1k": round(cpu * per_k, 4),
            "db_cpu_s_per_1k": round(db * per_k, 4),
            "lag_p50_ms": h.pct(a.lag_ms, 50),
            "lag_p99_ms": h.pct(a.lag_ms, 99),
            "dispatched": a.dispatched,
            "lost": a.lost,
            "duplicates": a.duplicates,
            # A retention pass inside the window would be measured with it.
            "purged_in_window": (purged1 or 0.0) - (purged0 or 0.0),
        }
        print(f"{label}: {out}", file=sys.stderr)
        if after is not None:
            out.update(after(driver, reader))
        return out
    finally:
        try:
            driver.stop()
        finally:
            driver.teardown()


def history_calls(
    target: str, http: str, job_ids: list[int], repeat: int
) -> dict[str, dict[str, float]]:
    """``wheelctl runs JOB_ID``'s call and the console's history calls, each
    ``repeat`` times, a different job each time."""
    from wheel.client import Client

    out = {}
    with Client(target, timeout=60) as client:
        turn = iter(range(10**9))

        def job() -> int:
            return job_ids[next(turn) % len(job_ids)]

        calls: dict[str, Callable[[], Any]] = {
            "runs JOB_ID": lambda: client.runs_page(job(), page_size=RUNS_PAGE),
            "console job runs": lambda: get(f"{http}/api/jobs/{job()}/runs"),
            "console job history": lambda: get(f"{http}/api/jobs/{job()}/history"),
            "console job dead letters": lambda: get(f"{http}/api/jobs/{job()}/dead-letters"),
            "console dead letters": lambda: get(f"{http}/api/dead-letters"),
            "console recent runs": lambda: get(f"{http}/api/runs"),
            "console overview, day": lambda: get(f"{http}/api/overview?window=day"),
        }
        for name, call in calls.items():
            out[name] = timed(call, repeat)
    return out


def poll_metrics(
    driver: FilledDriver, name: str, timeout_s: float
) -> tuple[dict[str, float], bool]:
    """Scrape the node every 0.1 s until ``name`` is above 0 or ``timeout_s``
    passed: the last scrape, and whether it was."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = metrics(driver.metrics)
        if m.get(name, 0.0) > 0:
            return m, True
        if driver.procs[0].poll() is not None:
            raise RuntimeError(f"the node exited; see {driver.tmp}")
        if time.monotonic() > deadline:
            return m, False
        time.sleep(0.1)


def retention_phase(
    args: argparse.Namespace, http: str
) -> Callable[[FilledDriver, h.RecordReader], dict[str, Any]]:
    def after(driver: FilledDriver, reader: h.RecordReader) -> dict[str, Any]:
        job_ids = list(range(1, args.history_jobs + 1, max(1, args.history_jobs // 97)))
        history = history_calls(driver.target, http, job_ids, args.repeat)
        # At tens of millions of runs the calls can outlast the minute before
        # the pass: their figures then include its load, and say so.
        m0 = metrics(driver.metrics)
        overlapped = m0.get("wheel_retention_purged_rows_total", 0.0) > 0
        # The pass begins: its first deletion.
        m1, began_ok = poll_metrics(
            driver, "wheel_retention_purged_rows_total", args.retention_after + 120
        )
        if not began_ok:
            raise RuntimeError("the node's retention pass did not begin")
        began = time.perf_counter()
        began_ms = h.now_ms()
        # A pass longer than --retention-timeout: what it did by then.
        m2, ended = poll_metrics(driver, "wheel_retention_passes_total", args.retention_timeout)
        polled_s = time.perf_counter() - began
        ended_ms = h.now_ms()
        stall_s, how = stalled_during(m1, m2)
        reader.poll()
        recs = reader.all()
        due = (recs["sched"] >= began_ms) & (recs["sched"] < ended_ms)
        lags = (recs["recv"][due] - recs["sched"][due]).astype(np.float64)
        logged = re.findall(
            r"retention: deleted (\d+) .* in ([0-9.]+)s",
            (driver.tmp / "wheel-serve.log").read_text(errors="replace"),
        )
        return {
            "history": history,
            "history_p99_ms": max(r["p99_ms"] for r in history.values()),
            "history_during_retention": overlapped,
            "retention_s": float(logged[0][1]) if logged else round(polled_s, 2),
            "retention_s_polled": round(polled_s, 2),
            "retention_ended": ended,
            "retention_purged_rows": m2.get("wheel_retention_purged_rows_total", 0.0),
            "retention_rows_per_s": round(
                m2.get("wheel_retention_purged_rows_total", 0.0) / max(polled_s, 1e-3)
            ),
            "retention_stall_ms_max": round(stall_s * 1000, 1),
            "retention_stall_from": how,
            "retention_fires": int(due.sum()),
            "retention_lag_p99_ms": h.pct(lags, 99),
            "stall_ms_max_before_retention": round(
                m1.get("wheel_loop_stall_max_seconds", 0.0) * 1000, 1
            ),
        }

    return after


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="wheel-runs-"))
    http_port = free_port()

    def cfg(serve: str) -> RunConfig:
        return RunConfig(
            store=args.store, workers=args.workers, duration_s=args.duration,
            drain_s=args.drain, recurring_fraction=1.0, period_s=args.period, poll_limit=0,
            pg_dsn=args.pg_dsn, wheelctl=args.wheelctl, capacity=args.capacity,
            serve_args=f"--retain {RETAIN} --retention-interval {args.retention_after:g}s {serve}",
        )  # fmt: skip

    def driver(name: str, runs: int, serve: str = "") -> tuple[FilledDriver, RunConfig]:
        tmp = base / name
        tmp.mkdir()
        c = cfg(serve)
        records = [tmp / f"worker{i}.rec" for i in range(args.workers)]
        d = FilledDriver(c, tmp, records, jobs=args.history_jobs, runs=runs, days=args.days)
        return d, c

    try:
        d, c = driver("empty", 0)
        empty = measure(d, args.rate, c, "empty runs table")
        http = f"http://127.0.0.1:{http_port}"
        d, c = driver("full", args.runs, f"--http-listen 127.0.0.1:{http_port}")
        full = measure(d, args.rate, c, f"{args.runs:,} runs", retention_phase(args, http))
        filled = d.filled
    finally:
        if not os.environ.get("WHEEL_BENCH_KEEP"):
            shutil.rmtree(base, ignore_errors=True)
    for name, res in (("empty", empty), ("full", full)):
        if res["purged_in_window"]:
            print(f"warning: retention ran in the {name} window", file=sys.stderr)

    def total(r: dict[str, Any]) -> float:
        return float(r["cpu_s_per_1k"] + r["db_cpu_s_per_1k"])

    return {
        "runs": args.runs,
        "store": args.store,
        "history_jobs": args.history_jobs,
        "days": args.days,
        "fill_s": round(filled["fill_s"], 2),
        "fill_runs_per_s": round(args.runs / filled["fill_s"]) if filled["fill_s"] else None,
        "bytes_per_run": round(filled["total"] / args.runs, 1) if args.runs else None,
        "heap_bytes_per_run": round(filled["heap"] / args.runs, 1) if args.runs else None,
        "rate": args.rate,
        "cpu_s_per_1k": round(total(full), 4),
        "empty_cpu_s_per_1k": round(total(empty), 4),
        "dispatch_cost_ratio": round(total(full) / total(empty), 3),
        "lag_p99_ms": full["lag_p99_ms"],
        "empty_lag_p99_ms": empty["lag_p99_ms"],
        "lag_ratio": round(full["lag_p99_ms"] / max(1.0, empty["lag_p99_ms"]), 3),
        "history_p99_ms": full["history_p99_ms"],
        "history_during_retention": full["history_during_retention"],
        "retention_s": full["retention_s"] if full["retention_ended"] else None,
        "retention_ended": full["retention_ended"],
        "retention_purged_rows": full["retention_purged_rows"],
        "retention_rows_per_s": full["retention_rows_per_s"],
        "retention_stall_ms_max": full["retention_stall_ms_max"],
        "retention_lag_p99_ms": full["retention_lag_p99_ms"],
        "lost": empty["lost"] + full["lost"],
        "duplicates": empty["duplicates"] + full["duplicates"],
        "empty": empty,
        "full": full,
    }


def main(argv: list[str] | None = None) -> int:
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every child process.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", type=int, default=1_000_000, help="ended runs loaded")
    p.add_argument("--json", dest="json_path")
    p.add_argument("--store", choices=["sqlite", "postgres"], default="postgres")
    p.add_argument("--pg-dsn", default=DEFAULT_PG)
    p.add_argument("--history-jobs", type=int, default=10_000, help="the jobs the runs are of")
    p.add_argument("--days", type=float, default=40.0, help="the runs' span, back from now")
    p.add_argument("--rate", type=float, default=2000.0, help="fires per second, steady")
    p.add_argument("--duration", type=float, default=20.0, help="measured window, seconds")
    p.add_argument("--drain", type=float, default=5.0, help="seconds after the window")
    p.add_argument("--period", type=float, default=2.0, help="the fires' jobs' period, s")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--capacity", type=int, default=10_000, help="runs per worker")
    p.add_argument("--repeat", type=int, default=100, help="each history call, times")
    p.add_argument(
        "--retention-after",
        type=float,
        default=60.0,
        help="seconds from the node's start to its first retention pass (at most 60)",
    )
    p.add_argument("--retention-timeout", type=float, default=3600.0)
    p.add_argument("--wheelctl", default=str(Path(PY).parent / "wheelctl"))
    args = p.parse_args(argv)
    if not 0 < args.retention_after <= 60:
        p.error("--retention-after: the node's first pass starts within a minute")
    if args.history_jobs < 1 or args.runs < 0:
        p.error("--history-jobs must be at least 1, --runs at least 0")
    _report.emit(run(args), args.json_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
