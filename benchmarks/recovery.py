"""Restart of a shard owner with N pending timers: from the LMDB checkpoint
(snapshot + log) against a rebuild from the store alone, in the same run.

    python benchmarks/recovery.py --timers 1000000 --json out.json

JSON keys: ``timers``, ``checkpoint_restart_s`` (open the checkpoint, replay
it, reconcile with the store: back to dispatching), ``store_rebuild_s`` (read
every job from SQLite and arm it; specs are parsed when a job is first
touched, as after a checkpoint), ``speedup`` (their ratio),
``wal_appends_per_s`` (job-image log records per second, batches of 1000,
fsync per batch) and ``snapshot_s``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import _report

from wheel.checkpoint import Checkpoint, Durability, Identity
from wheel.checkpoint.owner_state import log_records, snapshot_chunks
from wheel.engine.model import SHARD_COUNT
from wheel.engine.owner import OwnerConfig
from wheel.engine.records import NewJob
from wheel.engine.spec import Interval, JobSpec
from wheel.recovery import restore_owner
from wheel.store.sqlite import SQLiteStore

IDENTITY = Identity(cluster_id="bench", shard_set=f"0-{SHARD_COUNT - 1}")


def build_store(path: Path, timers: int, now_ms: int) -> SQLiteStore:
    store = SQLiteStore(path, synchronous="off")
    store.migrate()
    batch = 50_000
    for start in range(0, timers, batch):
        news = []
        for i in range(start, min(timers, start + batch)):
            # Hourly jobs whose first fires are spread over the coming hour:
            # nothing comes due while the benchmark runs.
            first = now_ms + 600_000 + (i * 3_600_000) // timers
            spec = JobSpec(
                name=f"job-{i}",
                handler="bench",
                tenant=f"tenant-{i % 10}",
                schedule=Interval(period_ms=3_600_000, start_at_ms=first),
            )
            news.append(NewJob(spec=spec, created_at_ms=now_ms, next_run_at=first))
        store.import_jobs(news)
    return store


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
    ns = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="wheel-recovery-"))
    try:
        now = int(time.time() * 1000)
        t0 = time.perf_counter()
        store = build_store(tmp / "wheel.db", ns.timers, now)
        print(
            f"store of {ns.timers} jobs built in {time.perf_counter() - t0:.1f}s", file=sys.stderr
        )
        epochs = store.acquire_epochs(range(SHARD_COUNT), "bench")
        config = OwnerConfig()

        # 1. Rebuild from the store alone.
        rebuilt = restore_owner(store, None, epochs=epochs, config=config, now_ms=now)
        store_rebuild_s = rebuilt.seconds
        owner = rebuilt.owner
        assert owner.job_count() == ns.timers and len(owner.wheel) == ns.timers

        # 2. Write a checkpoint: a snapshot, then a log tail of job images.
        cp = Checkpoint.open(tmp / "checkpoint", IDENTITY, durability=Durability.SYNC)
        t0 = time.perf_counter()
        cp.write_snapshot(
            snapshot_chunks(
                owner.job_ids(),
                owner.image_of,
                rebuilt.watermark,
                record_of=owner.dormant_record,
            ),
            cp.last_seq(),
        )
        snapshot_s = time.perf_counter() - t0
        ids = owner.job_ids()
        tail = [ids[i % len(ids)] for i in range(ns.log_records)]
        t0 = time.perf_counter()
        for start in range(0, len(tail), 1000):
            cp.append(log_records(tail[start : start + 1000], owner.image_of, None))
        wal_appends_per_s = len(tail) / (time.perf_counter() - t0)
        cp.close()
        del owner, rebuilt

        # 3. Restart from the checkpoint, reconciled with the store.
        t0 = time.perf_counter()
        cp = Checkpoint.open(tmp / "checkpoint", IDENTITY, durability=Durability.SYNC)
        restarted = restore_owner(store, cp, epochs=epochs, config=config, now_ms=now)
        checkpoint_restart_s = time.perf_counter() - t0
        assert restarted.source == "checkpoint", restarted.source
        owner = restarted.owner
        assert owner.job_count() == ns.timers and len(owner.wheel) == ns.timers
        assert owner.next_deadline() is not None
        cp.close()
        store.close()

        result = {
            "timers": ns.timers,
            "checkpoint_restart_s": round(checkpoint_restart_s, 3),
            "store_rebuild_s": round(store_rebuild_s, 3),
            "speedup": round(store_rebuild_s / checkpoint_restart_s, 2),
            "wal_appends_per_s": round(wal_appends_per_s),
            "snapshot_s": round(snapshot_s, 3),
        }
        _report.emit(result, ns.json_path)
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
