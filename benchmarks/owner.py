"""Benchmark: the shard owner's CPU per dispatch, driven in process.

    python benchmarks/owner.py                          # 20,000 fires/s for 5 s
    python benchmarks/owner.py --rate 20000 --seconds 5 --json out.json
    python benchmarks/owner.py --claim-ahead-ms 250   # a burst's fires claimed ahead (none here)
    python benchmarks/owner.py --claim-ahead-ms 250 --claim-ahead-min 1  # every fire ahead

What a node's event loop asks of ``wheel.engine.owner.Owner`` for each fire,
without the store, gRPC or a clock: half the fires from one-shots, half from
1 s interval jobs; each millisecond step fires the timers due, forms the
claims, answers them as a store that accepts everything, hands the runs to two
workers, and has the workers complete them at once (no ack: the SDK does not
ack a run that finished within its ack delay). Process CPU time is measured
around the drive only.

Baseline, in the same run: a timer-wheel round per fire (add, then fire by
advancing the clock) through ``TimerWheel`` itself. The machine's speed cancels
out of ``owner_per_timer_round``: how many timer rounds one dispatch costs.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import _report

from wheel.engine.model import SHARD_COUNT, JobState, shard_of
from wheel.engine.owner import Actions, Outcome, Owner, OwnerConfig
from wheel.engine.records import ClaimOutcome, CompletionOutcome, JobRecord
from wheel.engine.spec import Interval, JobSpec, Once
from wheel.engine.timerwheel import TimerWheel

T0 = 1_800_000_000_000


def build(
    rate: int, seconds: int, claim_ahead_ms: int = 0, claim_ahead_min: int | None = None
) -> Owner:
    config = OwnerConfig(claim_ahead_ms=claim_ahead_ms)
    if claim_ahead_min is not None:
        config = replace(config, claim_ahead_min=claim_ahead_min)
    owner = Owner(epochs=dict.fromkeys(range(SHARD_COUNT), 1), now_ms=T0, config=config)
    acts = Actions()
    start = T0 + 1_000
    n_once = rate * seconds // 2
    n_every = rate // 2  # each fires once a second
    jobs: list[tuple[JobSpec, int]] = []
    for i in range(n_once):
        at = start + i * 1_000 * seconds // n_once
        jobs.append((JobSpec(name="once", handler="h", schedule=Once(at_ms=at)), at))
    for i in range(n_every):
        first = start + i * 1_000 // n_every
        schedule = Interval(period_ms=1_000, start_at_ms=first)
        jobs.append((JobSpec(name="every", handler="h", schedule=schedule), first))
    for job_id, (spec, at) in enumerate(jobs, 1):
        record = JobRecord(
            job_id=job_id,
            shard=shard_of(job_id),
            spec=spec,
            state=JobState.ACTIVE,
            next_run_at=at,
            created_at_ms=T0,
            updated_at_ms=T0,
        )
        owner.upsert_job(record, T0, acts)
    owner.take_dirty()
    for w in ("w1", "w2"):
        owner.worker_hello(w, 5_000, ["default"], T0, acts)
    return owner


def drive(owner: Owner, seconds: int) -> tuple[int, float]:
    """Dispatches and the process CPU seconds they took."""
    acts = Actions()
    now = T0 + 1_000
    end = now + seconds * 1_000
    run_id = 0
    dispatched = 0
    cpu0 = time.process_time()
    while now < end:
        owner.advance(now, acts)
        work = acts.take_store_work()
        claimed = []
        for c in work.claims:
            run_id += 1
            claimed.append(ClaimOutcome(claim=c, run_id=run_id, advanced=c.advance))
        owner.take_dirty()
        done = [CompletionOutcome(run_id=c.run_id, applied=True) for c in work.completions]
        owner.on_completed(done, now, acts)
        owner.on_claimed(claimed, now, acts)
        for worker_id, assignments in acts.assignments.items():
            dispatched += len(assignments)
            ok = [(a.run_id, a.fence, Outcome.SUCCEEDED, "") for a in assignments]
            owner.worker_complete(worker_id, ok, now, acts)
        acts.assignments.clear()
        acts.results.clear()
        acts.lags.clear()
        now += 1
    return dispatched, time.process_time() - cpu0


def timer_rounds(n: int, per_ms: int) -> float:
    """CPU seconds for ``n`` timers added and fired, ``per_ms`` due each ms."""
    wheel = TimerWheel(T0)
    cpu0 = time.process_time()
    for i in range(n):
        wheel.add(i, T0 + 1 + i // per_ms)
    fired = 0
    now = T0
    while fired < n:
        now += 1
        fired += len(wheel.advance(now))
    return time.process_time() - cpu0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rate", type=int, default=20_000, help="fires per second")
    p.add_argument("--seconds", type=int, default=5, help="simulated seconds")
    p.add_argument(
        "--claim-ahead-ms",
        type=int,
        default=0,
        help="the owner's claim lead (``wheelctl serve --claim-ahead-ms``)",
    )
    p.add_argument(
        "--claim-ahead-min",
        type=int,
        default=OwnerConfig().claim_ahead_min,
        help="fires armed at one instant that make it a burst's, claimed ahead"
        " (``wheelctl serve --claim-ahead-min``; 1: every fire; this workload"
        " arms about ten an instant)",
    )
    p.add_argument("--json", type=Path, help="also write the JSON here")
    args = p.parse_args()
    owner = build(args.rate, args.seconds, args.claim_ahead_ms, args.claim_ahead_min)
    dispatched, cpu = drive(owner, args.seconds)
    baseline = timer_rounds(dispatched, max(1, args.rate // 1_000))
    per_dispatch = cpu / max(1, dispatched)
    per_round = baseline / max(1, dispatched)
    out: dict[str, Any] = {
        "rate": args.rate,
        "seconds": args.seconds,
        "claim_ahead_ms": args.claim_ahead_ms,
        "claim_ahead_min": args.claim_ahead_min,
        "dispatched": dispatched,
        "owner_us_per_dispatch": round(per_dispatch * 1e6, 2),
        "timer_round_us": round(per_round * 1e6, 3),
        "owner_per_timer_round": round(per_dispatch / per_round, 1) if per_round else None,
    }
    _report.emit(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
