"""Priorities in a saturated pool: how much sooner priority-0 runs start than
priority-9 runs due with them, and that no run waits past the aging bound.

    python benchmarks/priorities.py --jobs 1400 --capacity 4 --run-ms 50 \\
        --duration 20 --json out.json

One node (``wheelctl serve`` on SQLite, ``--priority-aging``) and one worker
(``wheelctl worker --capacity C``) whose handler (``e2e_handlers:started``)
writes when it started each run, then sleeps ``--run-ms``. The jobs are
one-shots submitted ahead, due in bursts every ``--burst-ms`` over
``--duration`` seconds; ``--p0-share`` of each burst (at least one) has
priority 0, the rest priority 9. The worker takes ``C x 1000 / run-ms`` runs
a second: with the defaults a burst takes most of the time to the next one
to drain, so the pool is saturated each burst and runs wait for a slot.

A run's lag is from when it was due to when its handler started (both this
host's wall clock). JSON keys: ``jobs``, ``capacity``, ``run_ms``,
``offered_per_s`` and ``pool_per_s`` (the load and what the worker takes),
``lag_p50_ms_p0``, ``lag_p99_ms_p0``, ``lag_p50_ms_p9``, ``lag_p99_ms_p9``,
``lag_ratio`` (p99 of priority 0 over p99 of priority 9; the target is at
most 0.1), ``max_wait_ms`` (the longest lag of any run), ``aging_ms``,
``aging_bound_ms`` (9 x aging: by then a priority-9 run ranks with priority
0, and only work queued before it goes first), ``within_bound``, ``lost``
(jobs whose run never started) and ``duplicates`` (starts past the first of
a job).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _report

from testkit.e2e_handlers import starts
from testkit.procs import ServerProc, WorkerProc, wait_for
from wheel.client import Client, JobRequest


def workload(
    jobs: int, duration_s: float, burst_ms: int, p0_share: float, first: datetime
) -> list[JobRequest]:
    """The jobs, in bursts: each burst's priority-0 jobs last in submit
    order, so that arrival order alone would run them last."""
    bursts = max(1, int(duration_s * 1000) // burst_ms)
    out: list[JobRequest] = []
    for b in range(bursts):
        size = jobs // bursts + (1 if b < jobs % bursts else 0)
        urgent = max(1, round(size * p0_share)) if size else 0
        at = first + timedelta(milliseconds=b * burst_ms)
        for i in range(size):
            priority = 0 if i >= size - urgent else 9
            name = f"p{priority}-{b}-{i}"
            out.append(
                JobRequest(name=name, handler="started", at=at, payload=name, priority=priority)
            )
    return out


def pct(values: list[int], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    data = work / "data"
    data.mkdir()
    node = ServerProc(data, args=("--priority-aging", f"{args.aging_ms}ms"))
    node.start()
    out = work / "runs"
    worker = WorkerProc(
        node.target,
        out,
        "w1",
        "e2e_handlers:started",
        flags=("--capacity", str(args.capacity)),
        env={"WHEEL_E2E_RUN_S": str(args.run_ms / 1000)},
    )
    try:
        wait_for(worker.connected, 30, "the worker to connect")
        lead_s = 2 + args.jobs / 2000  # time to submit them all before the first is due
        first = datetime.now(UTC) + timedelta(seconds=lead_s)
        requests = workload(args.jobs, args.duration, args.burst_ms, args.p0_share, first)
        with Client(node.target) as client:
            for i in range(0, len(requests), 1000):
                client.submit_many(requests[i : i + 1000])
        pool_per_s = args.capacity * 1000 / args.run_ms
        drain_s = lead_s + args.duration + args.jobs / pool_per_s + 30
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline and len(starts(out)) < len(requests):
            time.sleep(0.2)
        time.sleep(max(1.0, 3 * args.run_ms / 1000))  # stragglers, and any duplicate
        ran = starts(out)
    finally:
        worker.stop()
        node.stop()
    first_start: dict[str, dict[str, Any]] = {}
    for r in ran:
        first_start.setdefault(r["payload"], r)
    lags: dict[int, list[int]] = {0: [], 9: []}
    for name, r in first_start.items():
        lags[int(name[1])].append(r["started_ms"] - r["scheduled_for_ms"])
    p0, p9 = pct(lags[0], 99), pct(lags[9], 99)
    max_wait = max((v for vs in lags.values() for v in vs), default=0)
    bound = 9 * args.aging_ms
    return {
        "jobs": len(requests),
        "capacity": args.capacity,
        "run_ms": args.run_ms,
        "burst_ms": args.burst_ms,
        "offered_per_s": round(len(requests) / args.duration, 1),
        "pool_per_s": round(pool_per_s, 1),
        "p0_jobs": len(lags[0]),
        "p9_jobs": len(lags[9]),
        "lag_p50_ms_p0": pct(lags[0], 50),
        "lag_p99_ms_p0": p0,
        "lag_p50_ms_p9": pct(lags[9], 50),
        "lag_p99_ms_p9": p9,
        "lag_ratio": round(p0 / p9, 4) if p9 else 0.0,
        "max_wait_ms": max_wait,
        "aging_ms": args.aging_ms,
        "aging_bound_ms": bound,
        "within_bound": max_wait <= bound,
        "lost": len(requests) - len(first_start),
        "duplicates": len(ran) - len(first_start),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=1400)
    p.add_argument("--capacity", type=int, default=4, help="the worker's slots")
    p.add_argument("--run-ms", type=int, default=50, help="how long a run holds its slot")
    p.add_argument("--duration", type=float, default=20.0, help="seconds the jobs come due over")
    p.add_argument("--burst-ms", type=int, default=2000, help="jobs come due this far apart")
    p.add_argument("--p0-share", type=float, default=0.05, help="of each burst, priority 0")
    p.add_argument("--aging-ms", type=int, default=10_000, help="the node's --priority-aging")
    p.add_argument("--json", help="write the result here too")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="wheel-priorities-") as tmp:
        result = measure(args, Path(tmp))
    _report.emit(result, args.json)


if __name__ == "__main__":
    main()
