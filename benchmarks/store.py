"""Store benchmark: claimed fires per second and completions per second.

    python benchmarks/store.py --backend sqlite --batch 1000 --json out.json
    python benchmarks/store.py --backend postgres --batch 1,100,1000
    python benchmarks/store.py --backend sqlite --batch 1000 --result-bytes 200

Loads realistic interval jobs (100k by default), then claims one fire of each
job per round (insert execution + schedule CAS, the dispatch hot path) in
batches of N, and completes the claimed runs in batches of N. Both go through
``write_batch`` as an owner of all 256 shards writes them, with its epochs, so
the store's epoch check is part of what is measured. The baseline
is batch size 1 measured in the same run; ``speedup_vs_batch1`` is the ratio.
With ``--result-bytes N`` every completion carries a run result (a JSON
object of N bytes), as an HTTP target's or a handler's run does.
``completion_cpu_us`` is this process's CPU a completion: on SQLite the
whole write, steadier than the rate when the machine is busy.
PostgreSQL runs in its own schema of the ``test`` database, dropped afterwards.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import _report

from wheel.engine.spec import Interval, JobSpec
from wheel.store.base import SHARD_COUNT, Completion, FireClaim, NewJob, RunState, WriteBatch

PG_DSN = os.environ.get("WHEEL_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
PERIOD_MS = 60_000
START_MS = 1_800_000_000_000


def load_jobs(store: Any, count: int) -> list[int]:
    news = [
        NewJob(
            spec=JobSpec(
                name=f"report-{i}",
                handler="reports.build",
                tenant=f"tenant-{i % 50}",
                payload=b'{"customer": %d}' % i,
                schedule=Interval(period_ms=PERIOD_MS, start_at_ms=START_MS),
            ),
            created_at_ms=START_MS - 1000,
            next_run_at=START_MS,
        )
        for i in range(count)
    ]
    ids: list[int] = []
    for k in range(0, count, 10_000):
        ids += store.import_jobs(news[k : k + 10_000])
    return ids


def measure(
    store: Any,
    epochs: dict[int, int],
    next_fire: dict[int, int],
    batch: int,
    fires: int,
    round_no: int,
    result: str | None = None,
) -> dict[str, Any]:
    """Claim the next fire of ``fires`` jobs in batches of ``batch``, then
    complete the runs, as an owner holding ``epochs``; ``next_fire`` tracks
    each job's schedule."""
    ids = list(next_fire)[:fires]
    fence_base = (round_no + 1) << 32
    claims = [
        FireClaim(
            job_id=j,
            scheduled_for=next_fire[j],
            attempt=0,
            fence=fence_base + k,
            dispatched_at_ms=next_fire[j] + 5,
            expected_next_run_at=next_fire[j],
            new_next_run_at=next_fire[j] + PERIOD_MS,
        )
        for k, j in enumerate(ids)
    ]
    for j in ids:
        next_fire[j] += PERIOD_MS
    chunks = [claims[k : k + batch] for k in range(0, len(claims), batch)]
    t0 = time.perf_counter()
    outcomes = []
    for chunk in chunks:
        outcomes += store.write_batch(WriteBatch(claims=chunk, epochs=epochs)).claims
    claim_s = time.perf_counter() - t0
    won = sum(o.run_id is not None for o in outcomes)
    advanced = sum(o.advanced for o in outcomes)
    if won != len(claims) or advanced != len(claims):
        raise SystemExit(f"benchmark invariant broken: {won=} {advanced=} of {len(claims)}")
    completions = [
        Completion(
            run_id=o.run_id,
            fence=o.claim.fence,
            state=RunState.SUCCEEDED,
            finished_at_ms=o.claim.scheduled_for + 1000,
            worker_id="w1",
            result=result,
        )
        for o in outcomes
        if o.run_id is not None
    ]
    chunks_c = [completions[k : k + batch] for k in range(0, len(completions), batch)]
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    applied = 0
    for chunk_c in chunks_c:
        done = store.write_batch(WriteBatch(completions=chunk_c, epochs=epochs))
        applied += sum(r.applied for r in done.completions)
    complete_s = time.perf_counter() - t0
    complete_cpu_s = time.process_time() - cpu0
    if applied != len(completions):
        raise SystemExit(f"benchmark invariant broken: {applied=} of {len(completions)}")
    return {
        "batch": batch,
        "fires": len(claims),
        "claims_per_s": round(len(claims) / claim_s),
        "completions_per_s": round(len(completions) / complete_s),
        # This process's CPU a completion (SQLite's whole write; on
        # PostgreSQL the client's part only): steadier than the rate on a
        # busy machine.
        "completion_cpu_us": round(complete_cpu_s / len(completions) * 1e6, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--batch", default="1,100,1000", help="batch size(s), comma separated")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--json", dest="json_path", help="also write the JSON here")
    parser.add_argument(
        "--synchronous", default="full", help="SQLite synchronous pragma (full, normal)"
    )
    parser.add_argument("--dsn", default=PG_DSN)
    parser.add_argument(
        "--result-bytes",
        type=int,
        default=0,
        help="each completion carries a result of about this many bytes (0: none)",
    )
    args = parser.parse_args(argv)
    run_result = None
    if args.result_bytes > 0:
        run_result = '{"value": "' + "x" * max(args.result_bytes - 13, 0) + '"}'
    batches = [int(b) for b in args.batch.split(",") if b.strip()]

    with tempfile.TemporaryDirectory(prefix="wheel-bench-") as tmp:
        store: Any
        schema = ""
        if args.backend == "sqlite":
            from wheel.store.sqlite import SQLiteStore

            store = SQLiteStore(Path(tmp) / "bench.db", synchronous=args.synchronous)
        else:
            import psycopg

            from wheel.store.postgres import PostgresStore

            schema = f"wheel_bench_{secrets.token_hex(4)}"
            with psycopg.connect(args.dsn, autocommit=True) as admin:
                admin.execute(f'CREATE SCHEMA "{schema}"')
            sep = "&" if "?" in args.dsn else "?"
            store = PostgresStore(f"{args.dsn}{sep}options=-csearch_path%3D{schema}")
        try:
            store.migrate()
            epochs = store.acquire_epochs(range(SHARD_COUNT), "bench")
            t0 = time.perf_counter()
            ids = load_jobs(store, args.jobs)
            load_s = time.perf_counter() - t0
            runs = []
            next_fire = dict.fromkeys(ids, START_MS)
            for round_no, batch in enumerate(sorted(batches)):
                # Batch 1 pays one commit (fsync) per fire: measure fewer fires.
                fires = min(len(ids), 2_000 if batch == 1 else max(20_000, batch * 100))
                runs.append(measure(store, epochs, next_fire, batch, fires, round_no, run_result))
        finally:
            store.close()
            if schema:
                import psycopg

                with psycopg.connect(args.dsn, autocommit=True) as admin:
                    admin.execute(f'DROP SCHEMA "{schema}" CASCADE')

    base = next((r for r in runs if r["batch"] == 1), None)
    for r in runs:
        if base is not None:
            r["claims_speedup_vs_batch1"] = round(r["claims_per_s"] / base["claims_per_s"], 1)
            r["completions_speedup_vs_batch1"] = round(
                r["completions_per_s"] / base["completions_per_s"], 1
            )
    top = max(runs, key=lambda r: r["batch"])
    result: dict[str, Any] = {
        "backend": args.backend,
        "jobs": args.jobs,
        "result_bytes": len(run_result) if run_result else 0,
        "jobs_loaded_per_s": round(args.jobs / load_s),
        **top,
        "runs": runs,
    }
    _report.emit(result, args.json_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
