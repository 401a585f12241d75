"""Benchmark: wheel's TimerWheel against a heapq timer queue with lazy cancellation.

    python benchmarks/engine.py                       # 1,000,000 and 10,000,000 timers
    python benchmarks/engine.py --timers 100000       # a quick run
    python benchmarks/engine.py --timers 1000000 --json out.json

The baseline is what asyncio and trio do: a binary heap of (deadline, seq, id)
entries, a dict id -> seq of the live ones (cancel pops it; a popped entry whose
seq no longer matches is skipped), and asyncio's clean-up rule (rebuild the heap
once cancelled entries are more than half of it).

Measured at each N, each structure fresh for each phase:

- insert: N single `add` calls (ids in order, deadlines uniform over the spread).
  `insert_batch_per_s`: the same through `add_many` / heap extend + heapify.
- cancel: cancel all N, in random order (`cancel_fifo_per_s`: in insertion order).
- expire: advance a clock in --step-ms steps across all N deadlines; fired timers
  per second. `expire_per_s`: deadlines --density per ms (100/ms: the design's
  100x dispatch rate), the load at which expiry throughput matters.
  `expire_sparse_per_s`: the same N spread over --spread-ms (an hour), so most
  steps fire a timer or two and per-advance overhead dominates.
- mixed: leases on a running clock. N timers arrive evenly over --mixed-span-ms,
  each with deadline arrival + --lease-ms; 90% are cancelled at a uniform time
  before their deadline, the rest expire. ops = adds + cancels + fires.
- bytes_per_timer: tracemalloc's count of the memory the structure allocates
  holding N timers, built by single adds. The ids and deadlines are ints the
  caller already holds (as the shard owner does): they are not counted.
  `bytes_per_timer_incl_ints` adds the size of one id and one deadline int
  object, what it costs when the structure holds the only reference to them.
- dict_pop_floor: a bare dict.pop loop over the same ids, in the same orders:
  the floor under any cancel by id (random order is bound by cache misses).

Rates are per CPU second of this process (time.process_time), so a busy shared
machine skews them less; the garbage collector stays on, as in a real process.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import platform
import random
import sys
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import _report

from wheel.engine.timerwheel import TimerWheel

T0 = 1_700_000_000_000  # epoch ms: deadlines are absolute, like the shard owner's
ID0 = 1 << 40  # 64-bit ids, issued in order like the store's


class HeapTimers:
    """heapq with lazy cancellation: the asyncio/trio timer queue, same API as the wheel."""

    __slots__ = ("_cancelled", "_heap", "_live", "_now", "_seq")

    def __init__(self, now_ms: int = 0) -> None:
        self._now = now_ms
        self._heap: list[tuple[int, int, int]] = []
        self._live: dict[int, int] = {}  # id -> seq of its live heap entry
        self._seq = 0
        self._cancelled = 0  # heap entries whose id is no longer live with that seq

    def __len__(self) -> int:
        return len(self._live)

    def add(self, timer_id: int, deadline_ms: int) -> None:
        self._seq = seq = self._seq + 1
        if timer_id in self._live:
            self._cancelled += 1
        self._live[timer_id] = seq
        heapq.heappush(self._heap, (deadline_ms, seq, timer_id))

    def add_many(self, ids: list[int], deadlines: list[int]) -> None:
        seq = self._seq
        live = self._live
        entries = []
        for timer_id, d in zip(ids, deadlines, strict=True):
            seq += 1
            if timer_id in live:
                self._cancelled += 1
            live[timer_id] = seq
            entries.append((d, seq, timer_id))
        self._seq = seq
        self._heap += entries
        heapq.heapify(self._heap)

    def cancel(self, timer_id: int) -> bool:
        if self._live.pop(timer_id, None) is None:
            return False
        self._cancelled += 1
        return True

    def advance(self, now_ms: int) -> list[int]:
        if now_ms < self._now:
            return []
        self._now = now_ms
        heap = self._heap
        live = self._live
        if self._cancelled > 100 and self._cancelled * 2 > len(heap):
            heap[:] = [e for e in heap if live.get(e[2]) == e[1]]
            heapq.heapify(heap)
            self._cancelled = 0
        fired: list[int] = []
        pop = heapq.heappop
        while heap and heap[0][0] <= now_ms:
            _, seq, timer_id = pop(heap)
            if live.get(timer_id) == seq:
                del live[timer_id]
                fired.append(timer_id)
            else:
                self._cancelled -= 1
        return fired


Factory = Callable[[int], Any]
STRUCTURES: dict[str, Factory] = {"wheel": TimerWheel, "heapq": HeapTimers}


def _cpu(fn: Callable[[], object]) -> float:
    t = time.process_time()
    fn()
    return max(time.process_time() - t, 1e-9)


def _build(factory: Factory, ids: list[int], deadlines: list[int]) -> Any:
    s = factory(T0)
    s.add_many(ids, deadlines)
    return s


def bench_insert(factory: Factory, ids: list[int], deadlines: list[int]) -> float:
    s = factory(T0)
    add = s.add

    def run() -> None:
        for i, d in zip(ids, deadlines, strict=True):
            add(i, d)

    dt = _cpu(run)
    assert len(s) == len(ids)
    return len(ids) / dt


def bench_insert_batch(factory: Factory, ids: list[int], deadlines: list[int]) -> float:
    s = factory(T0)
    dt = _cpu(lambda: s.add_many(ids, deadlines))
    assert len(s) == len(ids)
    return len(ids) / dt


def bench_cancel(factory: Factory, ids: list[int], deadlines: list[int], order: list[int]) -> float:
    s = _build(factory, ids, deadlines)
    cancel = s.cancel

    def run() -> None:
        for i in order:
            cancel(i)

    dt = _cpu(run)
    assert len(s) == 0
    return len(order) / dt


def bench_expire(
    factory: Factory, ids: list[int], deadlines: list[int], spread: int, step: int
) -> float:
    s = _build(factory, ids, deadlines)
    advance = s.advance
    count = 0

    def run() -> None:
        nonlocal count
        n = 0
        for now in range(T0, T0 + spread + step, step):
            n += len(advance(now))
        count = n

    dt = _cpu(run)
    assert count == len(ids), (count, len(ids))
    return count / dt


def lease_schedule(
    n: int, span: int, lease: int, step: int, seed: int
) -> tuple[list[list[int]], list[list[int]], int]:
    """Per clock step: the ids added (deadline = step time + lease) and cancelled."""
    rng = random.Random(seed)
    steps = span // step + lease // step + 2
    adds: list[list[int]] = [[] for _ in range(steps)]
    cancels: list[list[int]] = [[] for _ in range(steps)]
    per_step = n / (span // step)
    for k in range(n):
        s = int(k / per_step)
        adds[s].append(ID0 + k)
        if rng.random() < 0.9:  # completed before its lease ran out
            c = s + 1 + int(rng.random() * (lease // step - 1))
            cancels[c].append(ID0 + k)
    return adds, cancels, steps


def bench_mixed(
    factory: Factory,
    schedule: tuple[list[list[int]], list[list[int]], int],
    lease: int,
    step: int,
    n: int,
) -> float:
    adds, cancels, steps = schedule
    s = factory(T0)
    add, cancel, advance = s.add, s.cancel, s.advance
    ops = 0

    def run() -> None:
        nonlocal ops
        cancelled = fired = 0
        now = T0
        for k in range(steps):
            now = T0 + k * step
            deadline = now + lease
            for i in adds[k]:
                add(i, deadline)
            for i in cancels[k]:
                cancelled += cancel(i)
            fired += len(advance(now))
        fired += len(advance(now + lease))
        assert cancelled + fired == n, (cancelled, fired, n)
        ops = n + cancelled + fired

    dt = _cpu(run)
    return ops / dt


def bench_bytes(factory: Factory, ids: list[int], deadlines: list[int]) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        s = factory(T0)
        add = s.add
        for i, d in zip(ids, deadlines, strict=True):
            add(i, d)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(s) == len(ids)
    del s
    return (after - before) / len(ids)


def int_bytes(ids: list[int], deadlines: list[int]) -> float:
    """What a fresh id and a fresh deadline int object cost, on average."""
    n = len(ids)
    return (sum(map(sys.getsizeof, ids)) + sum(map(sys.getsizeof, deadlines))) / n


def bench_dict_pop(ids: list[int], deadlines: list[int], order: list[int]) -> float:
    """The floor under any cancel by id: a bare dict.pop loop in the same order."""
    d = dict(zip(ids, deadlines, strict=True))
    pop = d.pop

    def run() -> None:
        for i in order:
            pop(i, None)

    return len(order) / _cpu(run)


def run_one(n: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    ids = list(range(ID0, ID0 + n))
    deadlines = [T0 + rng.randrange(1, args.spread_ms + 1) for _ in range(n)]
    dense_spread = max(n // args.density, 1)
    dense = [T0 + rng.randrange(1, dense_spread + 1) for _ in range(n)]
    shuffled = ids[:]
    rng.shuffle(shuffled)
    schedule = lease_schedule(n, args.mixed_span_ms, args.lease_ms, args.step_ms, args.seed)
    step = args.step_ms
    result: dict[str, Any] = {"timers": n}
    for name, f in STRUCTURES.items():
        phases: list[tuple[str, Callable[[], float]]] = [
            ("insert_per_s", partial(bench_insert, f, ids, deadlines)),
            ("insert_batch_per_s", partial(bench_insert_batch, f, ids, deadlines)),
            ("cancel_per_s", partial(bench_cancel, f, ids, deadlines, shuffled)),
            ("cancel_fifo_per_s", partial(bench_cancel, f, ids, deadlines, ids)),
            ("expire_per_s", partial(bench_expire, f, ids, dense, dense_spread, step)),
            ("expire_sparse_per_s", partial(bench_expire, f, ids, deadlines, args.spread_ms, step)),
            ("mixed_ops_per_s", partial(bench_mixed, f, schedule, args.lease_ms, step, n)),
            ("bytes_per_timer", partial(bench_bytes, f, ids, deadlines)),
        ]
        r: dict[str, float] = {}
        for key, fn in phases:
            if key in args.skip:
                continue
            t = time.perf_counter()
            value = max(fn() for _ in range(args.repeat)) if key.endswith("_per_s") else fn()
            r[key] = round(value, 1)
            gc.collect()
            took = time.perf_counter() - t
            print(f"  N={n:>10,} {name:5} {key:26} {value:>14,.1f}  ({took:.1f}s)", file=sys.stderr)
        if "bytes_per_timer" in r:
            # Both structures hold exactly one reference to each id and deadline.
            extra = int_bytes(ids, deadlines)
            r["bytes_per_timer_incl_ints"] = round(r["bytes_per_timer"] + extra, 1)
        result[name] = r
    w, h = result["wheel"], result["heapq"]
    result["ratios"] = {k: round(w[k] / h[k], 2) for k in w}
    # Reference points, not a structure: cancel is a dict.pop at heart.
    result["dict_pop_floor"] = {
        "random_per_s": round(bench_dict_pop(ids, deadlines, shuffled), 1),
        "fifo_per_s": round(bench_dict_pop(ids, deadlines, ids), 1),
    }
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--timers",
        type=int,
        action="append",
        help="number of timers (repeatable; default 1,000,000 and 10,000,000)",
    )
    p.add_argument("--json", type=Path, help="also write the JSON here")
    p.add_argument(
        "--spread-ms",
        type=int,
        default=3_600_000,
        help="insert, cancel, expire_sparse, bytes: deadlines over this span",
    )
    p.add_argument(
        "--density",
        type=int,
        default=100,
        help="expire: timers due per ms (100/ms is the design's 100x dispatch rate)",
    )
    p.add_argument("--step-ms", type=int, default=10, help="clock step while expiring")
    p.add_argument("--lease-ms", type=int, default=60_000, help="mixed: lease length")
    p.add_argument(
        "--mixed-span-ms", type=int, default=600_000, help="mixed: arrivals over this span"
    )
    p.add_argument("--repeat", type=int, default=1, help="best of this many runs per rate")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="KEY",
        help="leave out a measurement, e.g. expire_sparse_per_s (repeatable)",
    )
    args = p.parse_args(argv)
    sizes = args.timers or [1_000_000, 10_000_000]
    runs = []
    for n in sizes:
        print(f"N = {n:,}", file=sys.stderr)
        runs.append(run_one(n, args))
        gc.collect()
    largest = max(runs, key=lambda r: r["timers"])
    out: dict[str, Any] = {
        "config": {
            "spread_ms": args.spread_ms,
            "expire_density_per_ms": args.density,
            "step_ms": args.step_ms,
            "lease_ms": args.lease_ms,
            "mixed_span_ms": args.mixed_span_ms,
            "cancel_fraction_mixed": 0.9,
            "clock": "process_time",
            "python": platform.python_version(),
            "machine": platform.machine(),
        },
        "runs": runs,
        "timers": largest["timers"],
        "wheel": largest["wheel"],
        "heapq": largest["heapq"],
        "ratios": largest["ratios"],
    }
    _report.emit(out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
