"""Concurrency keys and rate limits across a real cluster (one etcd,
PostgreSQL, N ``wheelctl serve --cluster`` nodes, two worker processes with
a stream to every node), while shard owners are SIGKILLed and restarted.

    python benchmarks/limits.py --nodes 3 --jobs 40 --max-concurrent 5 --run-ms 200 \\
        --duration 30 --kills 3 --json out.json

Three groups of ``--jobs`` fixed-rate interval jobs each (period
``--period-ms``), every run holding ``--run-ms``: ``bound``, whose key allows
``--max-concurrent`` runs at once (the workload asks for more: jobs x run-ms
/ period); ``free``, whose key allows a million; ``plain``, with no key. With
``--rate N/s``, a fourth group ``rated`` whose key allows N starts a second
(``--burst``). The observer is independent of wheel: the handler
(``_limits_handler.py``) records its own start and end times, and every
figure but ``lost`` comes from those records alone. JSON keys:

- ``max_in_flight_observed``: the most runs of ``bound`` between their start
  and end at once, over the whole run (the limit: ``max_concurrent``);
- ``utilization``: the time-average of ``bound``'s runs at once over the
  window, divided by ``max_concurrent`` (its runs wait throughout: the
  workload asks for ``demand`` times the limit);
- ``throughput_ratio``: runs/s of ``free`` over runs/s of ``plain`` in the
  window: what a key that does not bind costs the same workload, same run;
- ``kills``: owner SIGKILLs performed, spread over the window, each node
  started again after its shards moved; ``worker_kills`` (``--worker-kills``):
  worker SIGKILLs, each worker started again at once (its runs ended with it,
  as the observer counts them; wheel holds their permits until their leases
  lapse);
- ``lost``: fires due in the window (less ``--grace-s`` at its end) that the
  store no longer owes (before the job's ``next_run_at``) with neither a run
  nor a missed record (a fire still waiting for a permit is owed, not lost);
- ``duplicates``: runs beyond the first of a fire, by the handlers' records
  (at-least-once after a kill: a run whose completion died with its owner);
- ``missed``: fires of ``bound`` recorded missed (overlap: a fire of a job
  whose previous fire still waits or runs is skipped, its policy's default);
- ``permits``: where the permits' time in the window went, as shares of
  ``max_concurrent`` permits over it, from the store's runs of ``bound``
  (claimed, ended, and whether a worker gave the permit back first) set
  beside the handlers' records: ``held``, of which ``before_start`` (claimed,
  its handler not started yet), ``after_end`` (its handler ended, its end not
  in the store yet) and ``after_end_late`` (of that, a second or more late:
  an owner SIGKILLed); ``free``: held by no run. ``held - before_start -
  after_end`` is ``utilization``, give or take what the clocks disagree;
- ``rate_max_starts_1s``, ``rate_starts_per_s`` (with ``--rate``): the most
  starts of ``rated`` in any one-second window, and its starts a second over
  the window; ``rate_max_claims_1s``: the most claims of its runs (each took
  a token) in any one-second window, by the store's ``dispatched_at_ms``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# This folder's modules, and the sources beside it (which the nodes and
# workers run too).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _report
from _cluster import LocalCluster, stop_all

from wheel.client import Client, JobRequest
from wheel.engine.model import shard_of

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable
DEFAULT_PG = os.environ.get("WHEEL_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
GROUPS = ("bound", "free", "plain")


@dataclass(frozen=True, slots=True)
class Record:
    job: int
    run: int
    fire: int
    start: float
    end: float


def read_records(path: Path, killed: dict[int, float], stopped: float) -> list[Record]:
    """The runs as their handlers recorded them; a run started and never
    ended ended when its worker was killed (``killed``: pid -> when), or at
    ``stopped`` when its worker ran on to the end."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    starts: dict[int, dict[str, Any]] = {}
    ends: dict[int, float] = {}
    for line in lines:
        if line.strip():
            d = json.loads(line)
            if d["kind"] == "start":
                starts[d["run"]] = d
            else:
                ends[d["run"]] = d["t"]
    return [
        Record(d["job"], run, d["fire"], d["t"], ends.get(run, killed.get(d["pid"], stopped)))
        for run, d in starts.items()
    ]


def overlap_curve(records: list[Record]) -> list[tuple[float, int]]:
    """(time, runs at once from then on), ends before starts at one instant."""
    marks = sorted([(r.start, 1) for r in records] + [(r.end, -1) for r in records])
    out, now = [], 0
    for t, step in marks:
        now += step
        out.append((t, now))
    return out


def average_over(curve: list[tuple[float, int]], t0: float, t1: float) -> float:
    """The time-average of the curve's level over [t0, t1]."""
    area, level, last = 0.0, 0, t0
    for t, after in curve:
        if t > t0:
            area += level * (min(t, t1) - last)
            last = min(t, t1)
        if t >= t1:
            break
        level = after
    area += level * max(0.0, t1 - last)
    return area / (t1 - t0)


def most_in_a_second(starts: list[float]) -> int:
    starts = sorted(starts)
    most, lo = 0, 0
    for hi, t in enumerate(starts):
        while t - starts[lo] >= 1.0:
            lo += 1
        most = max(most, hi - lo + 1)
    return most


def parse_rate(text: str) -> tuple[int, int]:
    """``N/s`` or ``N/m``: (starts, period ms)."""
    n, _, unit = text.partition("/")
    return int(n), 1000 if unit == "s" else 60_000


def submit_groups(
    client: Client, args: argparse.Namespace, first_ms: int
) -> tuple[dict[str, list[int]], dict[int, int]]:
    """The groups' jobs by group, and each job's first fire (ms)."""
    period = args.period_ms
    groups = [*GROUPS, "rated"] if args.rate else list(GROUPS)
    out: dict[str, list[int]] = {}
    firsts: dict[int, int] = {}
    for g, group in enumerate(groups):
        # Phases spread over the period, and the groups' apart.
        starts = [
            first_ms + ((i * len(groups) + g) * period) // (args.jobs * len(groups))
            for i in range(args.jobs)
        ]
        requests = [
            JobRequest(
                name=f"{group}-{i}",
                handler="hold",
                every=timedelta(milliseconds=period),
                start=datetime.fromtimestamp(at / 1000, UTC),
                payload=str(args.run_ms).encode(),
                concurrency_key="" if group == "plain" else group,
                idempotency_key=f"{group}-{i}",
            )
            for i, at in enumerate(starts)
        ]
        made = client.submit_many(requests)
        bad = [j for j in made if isinstance(j, Exception)]
        if bad:
            raise RuntimeError(f"{group}: {bad[:3]}")
        out[group] = [j.job_id for j in made if not isinstance(j, Exception)]
        firsts.update(zip(out[group], starts, strict=True))
    return out, firsts


def unresolved(dsn: str, jobs: dict[int, int], period: int, t0_ms: int, t1_ms: int) -> int:
    """Fires due in [t0, t1) of ``jobs`` (job -> its first fire) that the
    store has passed (before the job's ``next_run_at``: it owes them no
    more) with neither a run nor a missed record. A fire at or after
    ``next_run_at`` is still owed (waiting for a permit, say), not lost."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        ran = set(conn.execute("SELECT job_id, scheduled_for FROM executions").fetchall())
        ran |= set(conn.execute("SELECT job_id, scheduled_for FROM missed_fires").fetchall())
        owed_from: dict[int, int | None] = dict(
            conn.execute(
                "SELECT job_id, next_run_at FROM jobs WHERE job_id = ANY(%s)", (list(jobs),)
            ).fetchall()
        )
    lost = 0
    for job, first in jobs.items():
        upto = min(t1_ms, owed_from.get(job) or t1_ms)
        k = max(0, -(-(t0_ms - first) // period))
        while first + k * period < upto:
            if (job, first + k * period) not in ran:
                lost += 1
            k += 1
    return lost


def dispatch_times(dsn: str, jobs: list[int]) -> list[float]:
    """When each run of ``jobs`` was claimed (its permit or token taken), s."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT dispatched_at_ms FROM executions WHERE job_id = ANY(%s)", (jobs,)
        ).fetchall()
    return [int(r[0]) / 1000 for r in rows]


def permit_spans(dsn: str, jobs: list[int]) -> dict[int, tuple[float, float | None, bool]]:
    """Each run of ``jobs``: when it took its permit (claimed), when the
    store ended it (None: still in flight), s, and whether its worker gave
    the permit back before that (its key taken off: its handler returned
    while its owner could not be told). Read from the store, to set beside
    the handlers' own records: where the permits' time went that no handler
    used."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT run_id, dispatched_at_ms, finished_at_ms, concurrency_key IS NULL"
            " FROM executions WHERE job_id = ANY(%s)",
            (jobs,),
        ).fetchall()
    return {
        int(run): (int(at) / 1000, None if end is None else int(end) / 1000, bool(early))
        for run, at, end, early in rows
    }


def permit_figures(
    spans: dict[int, tuple[float, float | None, bool]],
    records: list[Record],
    n: int,
    t0: float,
    t1: float,
    stopped: float,
) -> dict[str, float]:
    """Where the permits' time in [t0, t1] went, each a share of ``n``
    permits over the window: ``held`` (a run had it: claimed, not yet ended
    in the store), of which ``before_start`` (claimed, its handler not yet
    started) and ``after_end`` (its handler ended, the store not yet told,
    or it never ran), and of that ``after_end_late`` (by runs whose end
    reached the store more than a second after their handler's, or that
    never ran: an owner SIGKILLed, a lease lapsing); the rest was ``free``
    (no run had it, between an end and the next claim). A permit its worker
    gave back early is counted to its handler's end (the store does not
    time that release)."""

    def clip(a: float, b: float) -> float:
        return max(0.0, min(b, t1) - max(a, t0))

    ran = {r.run: r for r in records}
    held = before = after = late = 0.0
    for run, (at, end, early) in spans.items():
        r = ran.get(run)
        until = stopped if end is None else end
        if early and r is not None:
            until = min(until, r.end)  # given back about then: not timed, counted to it
        held += clip(at, until)
        if r is None:
            after += clip(at, until)
            late += clip(at, until)
            continue
        before += clip(at, min(r.start, until))
        after += clip(max(r.end, at), until)
        if until - r.end > 1.0:
            late += clip(max(r.end, at), until)
    whole = n * (t1 - t0)
    return {
        "held": round(held / whole, 3),
        "before_start": round(before / whole, 3),
        "after_end": round(after / whole, 3),
        "after_end_late": round(late / whole, 3),
        "free": round(1 - held / whole, 3),
    }


def missed_of(dsn: str, jobs: list[int]) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM missed_fires WHERE job_id = ANY(%s)", (jobs,)
        ).fetchone()
    return int(row[0]) if row else 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    from _drivers import PgSchema

    # The nodes and workers run the sources beside this file.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "src"), str(HERE), os.environ.get("PYTHONPATH", "")) if p
    )

    tmp = Path(tempfile.mkdtemp(prefix="wheel-limits-"))
    schema = PgSchema(args.pg_dsn, f"wheel-limits-{tmp.name[-8:]}")
    cluster = LocalCluster(
        tmp / "cluster",
        schema.dsn,
        size=args.nodes,
        ttl_s=args.ttl,
        wheelctl=args.wheelctl,
        serve_args=f"--lease-ms {args.lease_ms} --grace-lease-ms {min(2000, args.lease_ms)}",
    )
    records = tmp / "runs.jsonl"
    workers: list[subprocess.Popen[bytes]] = []
    groups: dict[str, list[int]] = {}
    kills = worker_kills = 0
    killed: dict[int, float] = {}
    try:
        cluster.start()
        with Client(cluster.targets, timeout=10.0) as client:
            client.set_limit("bound", max_concurrent=args.max_concurrent)
            client.set_limit("free", max_concurrent=1_000_000)
            if args.rate:
                rate, per_ms = parse_rate(args.rate)
                client.set_limit(
                    "rated",
                    rate=rate,
                    per=timedelta(milliseconds=per_ms),
                    burst=args.burst or None,
                )
            first_ms = int(time.time() * 1000) + 3_000
            groups, firsts = submit_groups(client, args, first_ms)
        env = dict(os.environ, WHEEL_BENCH_RECORDS=str(records))

        def worker(i: int) -> subprocess.Popen[bytes]:
            cmd = [PY, "-m", "wheel", "worker", "--target", ",".join(cluster.targets)]
            cmd += ["--worker-id", f"limits-w{i + 1}", "--capacity", str(args.capacity)]
            cmd += ["_limits_handler:hold"]
            with open(tmp / f"worker{i + 1}.log", "ab") as log:
                return subprocess.Popen(cmd, cwd=HERE, env=env, stdout=log, stderr=log)

        workers = [worker(i) for i in range(args.workers)]
        t0 = first_ms / 1000 + args.warmup_s
        t1 = t0 + args.duration
        time.sleep(max(0.0, t0 - time.time()))
        # Owner kills spread over the window, each of a node that owns bound
        # jobs; worker kills spread likewise, half a step apart from them.
        events = [
            (t0 + (k + 1) * args.duration / (args.kills + 1), "owner") for k in range(args.kills)
        ]
        step = args.duration / (args.worker_kills + 1)
        events += [(t0 + (k + 0.5) * step, "worker") for k in range(args.worker_kills)]
        for at, kind in sorted(events):
            time.sleep(max(0.0, at - time.time()))
            if kind == "worker":
                i = worker_kills % len(workers)
                workers[i].kill()
                killed[workers[i].pid] = time.time()
                workers[i].wait(10)
                worker_kills += 1
                workers[i] = worker(i)
                print(
                    f"worker kill {worker_kills}: limits-w{i + 1} killed and back", file=sys.stderr
                )
                continue
            k = kills
            held = cluster.held(cluster.nodes)
            owners = [
                n for n in cluster.nodes
                if any(shard_of(j) in held.get(n.node_id, {}) for j in groups["bound"])
            ]  # fmt: skip
            victim = owners[k % len(owners)] if owners else cluster.nodes[k % len(cluster.nodes)]
            victim.kill()
            kills += 1
            live = [n for n in cluster.nodes if n is not victim]
            cluster.wait_whole(live, args.ttl + 15)
            cluster.restart(victim)
            cluster.wait_settled(cluster.nodes, 60)
            print(f"kill {kills}: {victim.node_id} killed and back", file=sys.stderr)
        time.sleep(max(0.0, t1 - time.time()) + args.drain_s)
        stopped = time.time()
        lost = unresolved(
            schema.dsn, firsts, args.period_ms, round(t0 * 1000), round((t1 - args.grace_s) * 1000)
        )
        missed = missed_of(schema.dsn, groups["bound"])
        spans = permit_spans(schema.dsn, groups["bound"])
        claimed = dispatch_times(schema.dsn, groups.get("rated", []))
    finally:
        stop_all(workers)
        cluster.stop()
        schema.drop()
    got = read_records(records, killed, stopped)
    of = {g: set(ids) for g, ids in groups.items()}
    by = {g: [r for r in got if r.job in ids] for g, ids in of.items()}
    bound = overlap_curve(by["bound"])
    in_window = {g: sum(1 for r in rs if t0 <= r.start < t1) for g, rs in by.items()}
    fires: dict[tuple[int, int], int] = {}
    for r in got:
        fires[(r.job, r.fire)] = fires.get((r.job, r.fire), 0) + 1
    result: dict[str, Any] = {
        "nodes": args.nodes,
        "jobs": args.jobs,
        "max_concurrent": args.max_concurrent,
        "run_ms": args.run_ms,
        "period_ms": args.period_ms,
        "duration_s": args.duration,
        "demand": round(args.jobs * args.run_ms / args.period_ms / args.max_concurrent, 2),
        "max_in_flight_observed": max((level for _, level in bound), default=0),
        "utilization": round(average_over(bound, t0, t1) / args.max_concurrent, 3),
        "throughput_ratio": round(in_window["free"] / max(1, in_window["plain"]), 3),
        "runs_per_s": {g: round(n / args.duration, 2) for g, n in in_window.items()},
        "kills": kills,
        "worker_kills": worker_kills,
        "lost": lost,
        "duplicates": sum(n - 1 for n in fires.values() if n > 1),
        "missed": missed,
        "permits": permit_figures(spans, by["bound"], args.max_concurrent, t0, t1, stopped),
    }
    if args.rate:
        starts = [r.start for r in by["rated"]]
        result["rate_max_starts_1s"] = most_in_a_second(starts)
        result["rate_starts_per_s"] = round(in_window["rated"] / args.duration, 2)
        result["rate_max_claims_1s"] = most_in_a_second(claimed)
    return result


def main(argv: list[str] | None = None) -> int:
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every child process.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--jobs", type=int, default=40, help="jobs in each group")
    p.add_argument("--max-concurrent", type=int, default=5, help="bound's limit")
    p.add_argument("--run-ms", type=int, default=200, help="how long each run holds")
    p.add_argument("--period-ms", type=int, default=1000, help="each job's period")
    p.add_argument("--duration", type=float, default=30.0, help="the measured window, s")
    p.add_argument("--kills", type=int, default=0, help="owner SIGKILLs over the window")
    p.add_argument("--worker-kills", type=int, default=0, help="worker SIGKILLs over the window")
    p.add_argument("--rate", help="a fourth group, rated, with this rate: N/s or N/m")
    p.add_argument("--burst", type=int, default=0, help="rated's burst (default: its N)")
    p.add_argument("--warmup-s", type=float, default=3.0, help="after the first fire")
    p.add_argument("--drain-s", type=float, default=5.0, help="after the window")
    p.add_argument("--grace-s", type=float, default=3.0, help="fires this near the end: not owed")
    p.add_argument("--ttl", type=int, default=3, help="each node's etcd lease TTL, s")
    p.add_argument("--lease-ms", type=int, default=3000, help="a run's lease")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--capacity", type=int, default=200, help="runs per worker")
    p.add_argument("--pg-dsn", default=DEFAULT_PG)
    p.add_argument("--wheelctl", default=str(Path(PY).parent / "wheelctl"))
    p.add_argument("--json", type=Path, help="write the result here")
    args = p.parse_args(argv)
    if args.kills and args.nodes < 2:
        p.error("--kills needs --nodes 2 or more: a killed node's shards need somewhere to go")
    _report.emit(run(args), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
