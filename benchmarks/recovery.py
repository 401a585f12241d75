"""Restart of a shard owner with N pending timers: from the LMDB checkpoint
(snapshot + log) against a rebuild from the store alone, in the same run.

    python benchmarks/recovery.py --timers 1000000 --json out.json

The store (SQLite) is built first, with hourly jobs whose first fires lie
between one and 25 hours ahead: nothing comes due while the benchmark runs.
Each restart then runs in a process of its own, so that its time and memory
are its own: the rebuild from the store (which then writes a snapshot and a
log tail), and the restart from that checkpoint.

JSON keys: ``timers``; ``checkpoint_restart_s`` (open the checkpoint, replay
it, reconcile with the store, arm the next minute's fires: back to
dispatching); ``store_rebuild_s`` (read every job from SQLite and take it on;
specs are parsed when a job is first touched, as after a checkpoint);
``speedup`` (their ratio); ``wal_appends_per_s`` (job rows appended to the
log, batches of 1000, fsync per batch); ``snapshot_s``; ``bytes_per_job``
(the restarted process's RSS growth over the restart, per job: what an owner
holds a job in) and ``bytes_per_job_rebuilt`` (the same for the rebuild).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _report

from wheel.checkpoint import Checkpoint, Durability, Identity
from wheel.checkpoint.owner_state import log_entry, log_records, snapshot_chunks
from wheel.engine.model import SHARD_COUNT
from wheel.engine.owner import Actions, Owner, OwnerConfig
from wheel.engine.profiles import profile_of, split_spec
from wheel.engine.records import NewJob
from wheel.engine.spec import Interval, JobSpec
from wheel.recovery import restore_owner
from wheel.store.sqlite import SQLiteStore

IDENTITY = Identity(cluster_id="bench", shard_set=f"0-{SHARD_COUNT - 1}")
HOUR = 3_600_000


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def build_store(path: Path, timers: int, now_ms: int) -> None:
    store = SQLiteStore(path, synchronous="off")
    store.migrate()
    batch = 50_000
    tenants = 10
    profiles = [
        profile_of(
            split_spec(
                JobSpec(
                    name="",
                    handler="bench",
                    tenant=f"tenant-{t}",
                    schedule=Interval(period_ms=HOUR, start_at_ms=0),
                )
            )[0]
        )
        for t in range(tenants)
    ]
    for start in range(0, timers, batch):
        news = []
        for i in range(start, min(timers, start + batch)):
            first = now_ms + HOUR + (i * 24 * HOUR) // timers
            spec = JobSpec(
                name=f"job-{i}",
                handler="bench",
                tenant=f"tenant-{i % tenants}",
                schedule=Interval(period_ms=HOUR, start_at_ms=first),
            )
            news.append(
                NewJob(
                    spec=spec,
                    created_at_ms=now_ms,
                    next_run_at=first,
                    profile=profiles[i % tenants],
                    param=first,
                )
            )
        store.import_jobs(news)
    store.close()


def _ready_to_dispatch(owner: Owner, now: int) -> None:
    """The first advance: the next minute's fires armed in the wheel."""
    owner.advance(now, Actions())
    assert owner.next_deadline() is not None


def child_rebuild(tmp: Path, timers: int, now: int, log_tail: int) -> dict[str, float]:
    """Rebuild from the store, then write a snapshot and a log tail."""
    store = SQLiteStore(tmp / "wheel.db")
    epochs = store.acquire_epochs(range(SHARD_COUNT), "bench")
    gc.collect()
    before = rss_bytes()
    t0 = time.perf_counter()
    rebuilt = restore_owner(store, None, epochs=epochs, config=OwnerConfig(), now_ms=now)
    owner = rebuilt.owner
    _ready_to_dispatch(owner, now)
    store_rebuild_s = time.perf_counter() - t0
    gc.collect()
    grown = rss_bytes() - before
    assert owner.job_count() == timers, owner.job_count()

    cp = Checkpoint.open(tmp / "checkpoint", IDENTITY, durability=Durability.SYNC)
    t0 = time.perf_counter()
    cp.write_snapshot(
        snapshot_chunks(
            sorted(owner.shards()),
            owner.snapshot_columns,
            lambda: owner.profiles.items,
            rebuilt.watermark,
        ),
        cp.last_seq(),
    )
    snapshot_s = time.perf_counter() - t0
    ids = owner.job_ids()
    tail = [ids[i % len(ids)] for i in range(log_tail)]
    logged: set[int] = set()
    t0 = time.perf_counter()
    for start in range(0, len(tail), 1000):
        records = log_records(
            tail[start : start + 1000],
            owner.image_of,
            None,
            profile_of=owner.profile,
            logged=logged,
        )
        cp.append([log_entry(records)])
    wal_appends_per_s = len(tail) / (time.perf_counter() - t0)
    cp.close()
    store.close()
    return {
        "store_rebuild_s": store_rebuild_s,
        "bytes_per_job_rebuilt": grown / timers,
        "snapshot_s": snapshot_s,
        "wal_appends_per_s": wal_appends_per_s,
    }


def child_restart(tmp: Path, timers: int, now: int) -> dict[str, float]:
    """Restart from the checkpoint, reconciled with the store."""
    store = SQLiteStore(tmp / "wheel.db")
    epochs = store.acquire_epochs(range(SHARD_COUNT), "bench")
    gc.collect()
    before = rss_bytes()
    t0 = time.perf_counter()
    cp = Checkpoint.open(tmp / "checkpoint", IDENTITY, durability=Durability.SYNC)
    restarted = restore_owner(store, cp, epochs=epochs, config=OwnerConfig(), now_ms=now)
    owner = restarted.owner
    _ready_to_dispatch(owner, now)
    checkpoint_restart_s = time.perf_counter() - t0
    assert restarted.source == "checkpoint", restarted.source
    cp.close()
    gc.collect()
    grown = rss_bytes() - before
    assert owner.job_count() == timers, owner.job_count()
    store.close()
    return {"checkpoint_restart_s": checkpoint_restart_s, "bytes_per_job": grown / timers}


def _in_child(step: str, tmp: Path, ns: argparse.Namespace, now: int) -> dict[str, float]:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--step",
            step,
            "--dir",
            str(tmp),
            "--timers",
            str(ns.timers),
            "--now",
            str(now),
            "--log-records",
            str(ns.log_records),
        ],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timers", type=int, default=1_000_000)
    parser.add_argument("--json", dest="json_path")
    parser.add_argument(
        "--log-records",
        type=int,
        default=100_000,
        help="log records appended after the snapshot (replayed on restart)",
    )
    parser.add_argument("--step", choices=["rebuild", "restart"], help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--now", type=int, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.step is not None:
        tmp = Path(ns.dir)
        if ns.step == "rebuild":
            out = child_rebuild(tmp, ns.timers, ns.now, ns.log_records)
        else:
            out = child_restart(tmp, ns.timers, ns.now)
        print(json.dumps(out))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="wheel-recovery-"))
    try:
        now = int(time.time() * 1000)
        t0 = time.perf_counter()
        build_store(tmp / "wheel.db", ns.timers, now)
        print(
            f"store of {ns.timers} jobs built in {time.perf_counter() - t0:.1f}s", file=sys.stderr
        )
        rebuilt = _in_child("rebuild", tmp, ns, now)
        restarted = _in_child("restart", tmp, ns, now)
        result = {
            "timers": ns.timers,
            "checkpoint_restart_s": round(restarted["checkpoint_restart_s"], 3),
            "store_rebuild_s": round(rebuilt["store_rebuild_s"], 3),
            "speedup": round(rebuilt["store_rebuild_s"] / restarted["checkpoint_restart_s"], 2),
            "wal_appends_per_s": round(rebuilt["wal_appends_per_s"]),
            "snapshot_s": round(rebuilt["snapshot_s"], 3),
            "bytes_per_job": round(restarted["bytes_per_job"], 1),
            "bytes_per_job_rebuilt": round(rebuilt["bytes_per_job_rebuilt"], 1),
        }
        _report.emit(result, ns.json_path)
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
