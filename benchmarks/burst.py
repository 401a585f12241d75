"""A burst: ``--count`` one-shots all due at the same instant, dispatched by
one wheel node to ``--workers`` worker processes; how late each reached a
worker (issue 49's target: 2,000 at p99 <= 50 ms).

    python benchmarks/burst.py --store sqlite,postgres --count 2000 --repeat 3 --json out.json

Each repeat is a fresh node and store (``dispatch.py``'s run with a burst
for its workload): the jobs are submitted ahead, all due at the window's
start, and lag is measured from that instant to each run's receipt by a
worker, over every fire (one never received counts as lost, censored at the
end). Per store the JSON gives the median over the repeats of each figure
(``burst_lag_p50_ms``, ``burst_lag_p99_ms``, ``burst_lag_max_ms``) and every
repeat's own.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _report
import dispatch
from _drivers import DEFAULT_PG, PY, RunConfig

FIGURES = ("lag_p50_ms", "lag_p99_ms", "lag_max_ms", "server_cpu_s_per_1k", "db_cpu_s_per_1k")


def measure(cfg: RunConfig, repeat: int) -> dict[str, Any]:
    """``repeat`` bursts on ``cfg.store``; the medians and every repeat."""
    runs = []
    for i in range(repeat):
        res, _, _ = dispatch.run_once("wheel", float(cfg.burst), cfg, label=f"burst {i + 1}")
        runs.append({k: res[k] for k in (*FIGURES, "dispatched", "lost", "duplicates")})
    out: dict[str, Any] = {"store": cfg.store, "burst": cfg.burst, "workers": cfg.workers}
    for k in FIGURES:
        out[f"burst_{k}"] = statistics.median(r[k] for r in runs)
    out["lost"] = sum(r["lost"] for r in runs)
    out["duplicates"] = sum(r["duplicates"] for r in runs)
    out["repeats"] = runs
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--store", default="sqlite", help="sqlite|postgres, comma-separated")
    p.add_argument("--count", type=int, default=2_000, help="one-shots due at the same instant")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="bursts per store, each on a fresh node")
    p.add_argument("--drain", type=float, default=10.0, help="s after the instant before giving up")
    p.add_argument("--capacity", type=int, default=10_000, help="runs per worker")
    p.add_argument("--serve-args", default="", help="extra flags for wheelctl serve")
    p.add_argument("--pg-dsn", default=DEFAULT_PG)
    p.add_argument("--wheelctl", default=str(Path(PY).parent / "wheelctl"))
    p.add_argument("--json", type=Path, help="write the result here")
    args = p.parse_args(argv)
    if args.count < 1 or args.repeat < 1:
        p.error("--count and --repeat must be at least 1")
    results = []
    for store in [s.strip() for s in args.store.split(",") if s.strip()]:
        if store not in ("sqlite", "postgres"):
            p.error(f"unknown store {store!r}")
        cfg = RunConfig(
            store=store, workers=args.workers, duration_s=0.001, drain_s=args.drain,
            recurring_fraction=0.0, period_s=1.0, poll_limit=10_000, pg_dsn=args.pg_dsn,
            wheelctl=args.wheelctl, capacity=args.capacity, serve_args=args.serve_args,
            burst=args.count,
        )  # fmt: skip
        results.append(measure(cfg, args.repeat))
    _report.emit(results[0] if len(results) == 1 else results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
