"""Failover under load: a real cluster (one etcd, PostgreSQL, N ``wheelctl serve
--cluster`` nodes, worker processes with a stream to every node) dispatches a
steady ``--rate`` fires/s while a shard owner is SIGKILLed ``--kills`` times,
restarted each time, the cluster settling in between.

    python benchmarks/failover.py --nodes 3 --rate 200 --kills 3 --json out.json

The workload is dispatch.py's (one-shots and fixed-rate interval jobs, every
fire owed however late), submitted before the window through the first node.
JSON keys:

- ``nodes``, ``rate``, ``kills`` (performed), ``ttl_s`` (each node's etcd lease);
- ``failover_s_p50``, ``failover_s_max``: for each kill and each shard the
  killed node held that had a fire waiting (one came due between the kill and
  the survivors holding every shard), the time from the SIGKILL to the first
  dispatch of that shard by its new owner: the earliest ``dispatched_at_ms``
  of the shard's executions whose fence carries the new owner's epoch, read
  from PostgreSQL. A moved shard with nothing due meanwhile is not delayed by
  the failover and is left out (stderr says how many were measured);
- ``late_p99_ms``: p99 lag (worker receipt minus scheduled time) of the fires
  due in moved shards between each kill and the survivors holding every
  shard; a fire never received counts with its censored lag (run end minus
  scheduled), as in dispatch.py;
- ``lost``: fires never received by a worker by the end of the drain;
- ``duplicates``: handler runs beyond the first of a fire, as the workers saw
  them (dispatch.py's measure). A run whose completion died with its node is
  dispatched again once its grace lease lapses at the new owner: at-least-once
  at work, not a fault; stderr also gives the fires with two successes
  accepted by the store, which would be one.

``--jobs N`` loads N idle jobs (daily intervals, due in days) into the
cluster before the window, so that every load of a shard has that many jobs
behind it. Each killed node's restart is a planned move (its shards come
back to it while their current owners serve them), measured as such:

- ``jobs``;
- ``handover_unowned_s_max``: the longest time a shard moving back had no
  dispatching owner, from the nodes' own records on the cluster's one clock
  (the store's): from the moment its previous holder stopped dispatching it
  to the moment the restarted node began (``GetClusterStatus``: a shard's
  ``dispatching_since_ms``, and the ``released`` shards with their time);
- ``handover_unowned_poll_s_max``: the same seen from outside, an upper
  bound: from the last status answer of the previous holder that still held
  it (the time the question was sent) to the first answer of the restarted
  node that held it (the time the answer came), each node asked by its own
  thread every 20 ms;
- ``handover_late_max_ms``: the latest first receipt of a fire due in a
  moving shard, from the restart to a second after the cluster settled;
- ``duplicates_planned``: duplicates (as ``duplicates``) among the fires of
  those shards in those windows.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h
import _report
import numpy as np
from _cluster import LocalCluster, Node, stop_all
from _drivers import DEFAULT_PG, HERE, PY, PgSchema, submit_workload

from wheel.client import Client, JobRequest
from wheel.engine.model import shard_of

EPOCH_SHIFT = 32


@dataclass(frozen=True, slots=True, kw_only=True)
class Kill:
    """One SIGKILL: who, when, which shards it held and what became of them."""

    node_id: str
    kill_ms: int
    whole_ms: int  # the survivors hold every shard
    held: dict[int, int]  # shard -> the killed node's epoch
    new_epochs: dict[int, int]  # shard -> its new owner's epoch


def kill_one(cluster: LocalCluster, victim: Node) -> Kill:
    survivors = [n for n in cluster.nodes if n is not victim]
    held = cluster.held([victim])[victim.node_id]
    kill_ms = h.now_ms()
    victim.kill()
    cluster.wait_whole(survivors, cluster.ttl_s + 30)
    whole_ms = h.now_ms()
    after = cluster.held(survivors)
    new_epochs = {s: e for shards in after.values() for s, e in shards.items() if s in held}
    return Kill(
        node_id=victim.node_id, kill_ms=kill_ms, whole_ms=whole_ms, held=held, new_epochs=new_epochs
    )


@dataclass(slots=True)
class Move:
    """A restart as a planned move: which shards came back to the restarted
    node, from the start of the restart to a second after it settled, and
    the longest any of them had no holder."""

    node_id: str
    start_ms: int
    end_ms: int = 0
    shards: set[int] = field(default_factory=set)
    unowned_s: float = 0.0
    unowned_poll_s: float = 0.0


class Watch:
    """Each node asked for the shards it holds loaded every ``every_s`` by a
    thread of its own: (sent ms, answered ms, node id, shards held)."""

    def __init__(self, nodes: list[Node], every_s: float = 0.02) -> None:
        self.seen: list[tuple[int, int, str, frozenset[int]]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._ask, args=(node, every_s), daemon=True) for node in nodes
        ]
        for thread in self._threads:
            thread.start()

    def _ask(self, node: Node, every_s: float) -> None:
        # One connection per node, kept while it answers: a connection set up
        # for every question would add its own latency to each answer (and so
        # to every gap measured). After a failure the next question opens a
        # new one, so a restarted node is asked at once, not after a backoff.
        from wheel.client import Client

        client: Client | None = None
        try:
            while not self._stop.wait(every_s):
                if not node.alive:
                    continue
                if client is None:
                    client = Client(node.target, timeout=2.0)
                sent = h.now_ms()
                got = node.held(client)
                if got is None:
                    client.close()
                    client = None
                    continue
                with self._lock:
                    self.seen.append((sent, h.now_ms(), node.node_id, frozenset(got[0])))
        finally:
            if client is not None:
                client.close()

    def stop(self) -> list[tuple[int, int, str, frozenset[int]]]:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        return sorted(self.seen)


def planned_move(cluster: LocalCluster, victim: Node, ttl_s: int) -> Move:
    """Restart ``victim`` (its shards went to the others when it was
    killed) and time its shards' way back."""
    before = cluster.held([n for n in cluster.nodes if n is not victim])
    move = Move(node_id=victim.node_id, start_ms=h.now_ms())
    watch = Watch(cluster.nodes)
    try:
        cluster.restart(victim)
        cluster.wait_settled(cluster.nodes, ttl_s + 30)
        time.sleep(1.0)
    finally:
        seen = watch.stop()
    move.end_ms = h.now_ms()
    mine = cluster.held([victim]).get(victim.node_id, {})
    holder = {s: (n, epoch) for n, shards in before.items() for s, epoch in shards.items()}
    move.shards = {s for s in mine if s in holder}
    records = {n.node_id: n.switches() for n in cluster.nodes}
    gaps, polled = [], []
    for shard in move.shards:
        old, epoch = holder[shard]
        new_records, old_records = records[victim.node_id], records[old]
        began = new_records[0].get(shard) if new_records is not None else None
        stopped = old_records[1].get((shard, epoch)) if old_records is not None else None
        if began is None or stopped is None:
            # Not on record (a node that did not answer): the whole move.
            print(f"warning: shard {shard}'s switch is not on record", file=sys.stderr)
            began, stopped = move.end_ms, move.start_ms
        gaps.append(max(0, began - stopped) / 1000)
        last_old = max(
            (sent for sent, _, n, held in seen if n == old and shard in held),
            default=move.start_ms,
        )
        first_new = min(
            (got for _, got, n, held in seen if n == victim.node_id and shard in held),
            default=move.end_ms,
        )
        polled.append(max(0, first_new - last_old) / 1000)
    move.unowned_s = max(gaps, default=0.0)
    move.unowned_poll_s = max(polled, default=0.0)
    return move


def load_idle(targets: list[str], jobs: int, nodes: list[Node]) -> float:
    """Submit ``jobs`` idle jobs (daily, first due in two days) in batches of
    5,000 from two threads, and wait until the owners hold them all; the
    seconds it took."""
    start = datetime.now(UTC) + timedelta(days=2)
    batches = [range(at, min(jobs, at + 5_000)) for at in range(0, jobs, 5_000)]
    lock = threading.Lock()
    failures: list[BaseException] = []

    def submit(n: int) -> None:
        with Client(targets[n % len(targets)], timeout=120.0) as client:
            while True:
                with lock:
                    if not batches or failures:
                        return
                    part = batches.pop()
                try:
                    client.submit_many(
                        JobRequest(
                            name=f"idle-{i}",
                            handler="idle",
                            every=timedelta(days=1),
                            start=start + timedelta(seconds=i % 86_400),
                        )
                        for i in part
                    )
                except BaseException as exc:
                    with lock:
                        failures.append(exc)
                    return

    started = time.monotonic()
    threads = [threading.Thread(target=submit, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"loading idle jobs failed: {failures[0]!r}")

    def held() -> int:
        total = 0
        for node in nodes:
            try:
                with Client(node.target, timeout=5.0) as client:
                    total += client.status().jobs
            except Exception:
                return -1
        return total

    deadline = time.monotonic() + 600
    while held() < jobs:
        if time.monotonic() > deadline:
            raise RuntimeError("the owners did not hold the idle jobs within 600 s")
        time.sleep(0.5)
    return time.monotonic() - started


def first_dispatches(dsn: str, kills: list[Kill]) -> dict[tuple[int, int], int]:
    """(shard, epoch) -> the earliest dispatched_at_ms of the shard's runs
    under that epoch, for the moved shards' new epochs."""
    import psycopg

    wanted = sorted({(s, e) for k in kills for s, e in k.new_epochs.items()})
    if not wanted:
        return {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT j.shard, e.fence >> %s, min(e.dispatched_at_ms)"
            " FROM executions AS e JOIN jobs AS j ON j.job_id = e.job_id"
            " WHERE (j.shard, e.fence >> %s) IN (SELECT * FROM unnest(%s::int[], %s::bigint[]))"
            " GROUP BY 1, 2",
            (EPOCH_SHIFT, EPOCH_SHIFT, [s for s, _ in wanted], [e for _, e in wanted]),
        ).fetchall()
    return {(int(r[0]), int(r[1])): int(r[2]) for r in rows}


def double_successes(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM executions WHERE state = 'succeeded'"
            " GROUP BY job_id, scheduled_for HAVING count(*) > 1) AS d"
        ).fetchone()
    return int(row[0]) if row else 0


def measure(
    workload: h.Workload,
    job_index: dict[int, int],
    records: np.ndarray,
    kills: list[Kill],
    firsts: dict[tuple[int, int], int],
    end_ms: int,
) -> tuple[list[float], list[float], int]:
    """(failover seconds per measured shard, lag ms per fire due in a moved
    shard during a failover, shards moved)."""
    exp_idx, exp_ms = workload.fires()
    job_of_index = {i: j for j, i in job_index.items()}
    shard_of_index = {i: shard_of(j) for i, j in job_of_index.items()}
    exp_shard = np.fromiter((shard_of_index[int(i)] for i in exp_idx), np.int64, len(exp_idx))

    # First receipt of each fire by a worker, keyed like the workload's fires.
    rec_idx = np.fromiter(
        (job_index.get(int(j), 0) for j in records["job"]), np.int64, len(records)
    )
    keys = h.fire_keys(rec_idx, records["sched"], workload.start_ms)
    first_recv: dict[int, int] = {}
    for key, recv in zip(keys.tolist(), records["recv"].tolist(), strict=True):
        if key not in first_recv or recv < first_recv[key]:
            first_recv[key] = recv
    exp_keys = h.fire_keys(exp_idx, exp_ms, workload.start_ms)

    failover_s: list[float] = []
    lags: list[float] = []
    moved = 0
    for k in kills:
        moved += len(k.held)
        during = (exp_ms >= k.kill_ms) & (exp_ms <= k.whole_ms)
        in_moved = np.isin(exp_shard, list(k.held))
        waiting = set(exp_shard[during & in_moved].tolist())
        for shard in sorted(waiting):
            first = firsts.get((shard, k.new_epochs.get(shard, -1)))
            # Never dispatched by its new owner: as late as the run's end.
            failover_s.append(((first if first is not None else end_ms) - k.kill_ms) / 1000)
        for key, sched in zip(
            exp_keys[during & in_moved].tolist(), exp_ms[during & in_moved].tolist(), strict=True
        ):
            recv = first_recv.get(key)
            lags.append(float((recv if recv is not None and recv <= end_ms else end_ms) - sched))
    return failover_s, lags, moved


def measure_moves(
    workload: h.Workload, job_index: dict[int, int], records: np.ndarray, moves: list[Move]
) -> tuple[list[float], int]:
    """(lag ms of each fire due in a moving shard during its move, the
    duplicates among those fires)."""
    if not moves or not len(records):
        return [], 0
    shard_of_job = {j: shard_of(j) for j in job_index}
    rec_shard = np.fromiter(
        (shard_of_job.get(int(j), -1) for j in records["job"]), np.int64, len(records)
    )
    lags: list[float] = []
    duplicates = 0
    for move in moves:
        inside = (
            np.isin(rec_shard, list(move.shards))
            & (records["sched"] >= move.start_ms)
            & (records["sched"] <= move.end_ms)
        )
        part = records[inside]
        if not len(part):
            continue
        part = part[np.lexsort((part["recv"], part["sched"], part["job"]))]
        job, sched = part["job"], part["sched"]
        first = np.r_[True, (job[1:] != job[:-1]) | (sched[1:] != sched[:-1])]
        lags.extend((part["recv"][first] - sched[first]).astype(float).tolist())
        done = part["done"] > 0
        if done.any():
            pairs = np.stack([job[done], sched[done]], axis=1)
            _, counts = np.unique(pairs, axis=0, return_counts=True)
            duplicates += int((counts - 1).sum())
    return lags, duplicates


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="wheel-failover-"))
    schema = PgSchema(args.pg_dsn, f"wheel-failover-{tmp.name[-8:]}")
    cluster = LocalCluster(
        tmp / "cluster",
        schema.dsn,
        size=args.nodes,
        ttl_s=args.ttl,
        wheelctl=args.wheelctl,
        serve_args=args.serve_args,
    )
    workers: list[subprocess.Popen[bytes]] = []
    try:
        cluster.start()
        if args.jobs:
            took = load_idle(cluster.targets, args.jobs, cluster.nodes)
            print(f"{args.jobs} idle jobs loaded and held in {took:.1f} s", file=sys.stderr)
        paths = [tmp / f"worker{i}.rec" for i in range(args.workers)]
        for path in paths:
            cmd = [PY, str(HERE / "bench_worker.py"), "--system", "wheel"]
            cmd += ["--connect", ",".join(cluster.targets), "--out", str(path)]
            cmd += ["--capacity", str(args.capacity)]
            workers.append(subprocess.Popen(cmd, cwd=HERE))
        # Steady load before, between and after the kills; a cycle is a kill,
        # the move, the restart and the settling that follows.
        cycle_s = args.ttl + 10 + args.settle
        duration_s = args.settle + args.kills * cycle_s + args.settle
        jobs = round(args.rate * duration_s)
        lead_ms = 3_000 + round(1_000 * jobs / 4_000)
        workload = h.Workload.build(
            rate=args.rate,
            duration_s=duration_s,
            start_ms=h.now_ms() + lead_ms,
            recurring_fraction=args.recurring_fraction,
            period_s=args.period,
        )
        job_index = submit_workload(cluster.targets[0], workload)
        print(
            f"{len(workload.jobs)} jobs, {args.rate:g} fires/s over {duration_s:.0f} s;"
            f" {args.kills} kills, ttl {args.ttl} s",
            file=sys.stderr,
        )
        time.sleep(max(0.0, (workload.start_ms - h.now_ms()) / 1000))

        kills: list[Kill] = []
        moves: list[Move] = []
        for k in range(args.kills):
            time.sleep(args.settle)
            if h.now_ms() + (args.ttl + 3) * 1000 > workload.end_ms:
                print(f"warning: the window ended after {k} kills", file=sys.stderr)
                break
            victim = cluster.nodes[k % len(cluster.nodes)]
            kill = kill_one(cluster, victim)
            kills.append(kill)
            print(
                f"kill {k + 1}: {victim.node_id} held {len(kill.held)} shards; the others"
                f" held all {(kill.whole_ms - kill.kill_ms) / 1000:.2f} s later",
                file=sys.stderr,
            )
            move = planned_move(cluster, victim, args.ttl)
            moves.append(move)
            print(
                f"restart {k + 1}: {len(move.shards)} shards back to {victim.node_id}, each"
                f" without an owner for at most {move.unowned_s:.3f} s"
                f" (seen from outside: {move.unowned_poll_s:.2f} s)",
                file=sys.stderr,
            )

        # Drain: until every fire reached a worker, or --drain after the window.
        reader = h.RecordReader(paths)
        progress = h.Progress("failover", workload, job_index)
        hard_end = workload.end_ms + round(args.drain * 1000)
        while True:
            time.sleep(0.2)
            now = h.now_ms()
            progress.feed(reader.poll())
            progress.show(now)
            if (progress.all_dispatched and now >= workload.end_ms + 600) or now >= hard_end:
                break
        end_ms = h.now_ms()
        progress.done()
        stop_all(workers)
        reader.poll()
        records = reader.all()
        analysis = h.analyse(workload, records, job_index=job_index, end_ms=end_ms)
        firsts = first_dispatches(schema.dsn, kills)
        failover_s, lags, moved = measure(workload, job_index, records, kills, firsts, end_ms)
        move_lags, move_duplicates = measure_moves(workload, job_index, records, moves)
        doubled = double_successes(schema.dsn)
    finally:
        stop_all(workers)
        cluster.stop()
        schema.drop()
    print(
        f"{len(failover_s)} of {moved} moved shards had a fire waiting; {len(lags)} fires came"
        f" due in them during failovers; {doubled} fires with two successes in the store",
        file=sys.stderr,
    )
    return {
        "nodes": args.nodes,
        "rate": args.rate,
        "kills": len(kills),
        "ttl_s": args.ttl,
        "failover_s_p50": round(h.pct(np.array(failover_s), 50), 3),
        "failover_s_max": round(max(failover_s, default=0.0), 3),
        "late_p99_ms": h.pct(np.array(lags), 99),
        "lost": analysis.lost,
        "duplicates": analysis.duplicates,
        "jobs": args.jobs,
        "handover_unowned_s_max": round(max((m.unowned_s for m in moves), default=0.0), 3),
        "handover_unowned_poll_s_max": round(
            max((m.unowned_poll_s for m in moves), default=0.0), 3
        ),
        "handover_late_max_ms": max(move_lags, default=0.0),
        "duplicates_planned": move_duplicates,
    }


def main(argv: list[str] | None = None) -> int:
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every child process.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--rate", type=float, default=200.0, help="fires per second coming due")
    p.add_argument("--kills", type=int, default=3, help="SIGKILLs of a shard owner")
    p.add_argument("--ttl", type=int, default=5, help="each node's etcd lease TTL, s")
    p.add_argument("--settle", type=float, default=3.0, help="steady load between events, s")
    p.add_argument("--drain", type=float, default=15.0, help="s after the window")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--capacity", type=int, default=10_000, help="runs per worker")
    p.add_argument("--recurring-fraction", type=float, default=0.5)
    p.add_argument("--period", type=float, default=2.0, help="interval jobs' period, s")
    p.add_argument("--jobs", type=int, default=0, help="idle jobs loaded before the window")
    p.add_argument("--pg-dsn", default=DEFAULT_PG)
    p.add_argument("--wheelctl", default=str(Path(PY).parent / "wheelctl"))
    p.add_argument("--serve-args", default="", help="extra flags for wheelctl serve")
    p.add_argument("--json", type=Path, help="write the result here")
    args = p.parse_args(argv)
    if args.nodes < 2:
        p.error("--nodes must be at least 2: a killed node's shards need somewhere to go")
    if args.ttl < 2:
        p.error("--ttl must be at least 2 (etcd's shortest lease)")
    _report.emit(run(args), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
