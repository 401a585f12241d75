"""Fault injection over a real cluster, a seeded nemesis and an independent
checker.

    python benchmarks/chaos.py --duration 300 --seed 1 --json out/chaos.json

The system under test is the cluster of the cluster tests
(``testkit/cluster.py``): our own etcd, a fresh PostgreSQL schema,
three ``wheelctl serve --cluster`` nodes, each reaching PostgreSQL and etcd
through a relay of its own that can hold or cut traffic, and four worker
processes with a stream to every node. The load is steady and mixed: one-shots
every second, interval jobs, cron jobs with a seconds field, some of them
``at_most_once``; handlers that succeed, fail (retryable, permanent), sleep past
their lease or past their timeout, or end their own process right after their
effect (``testkit/e2e_handlers.py: chaos``).

The nemesis is one ``random.Random(seed)``: it plans the whole fault schedule
before the run (the same seed, the same schedule: ``--plan`` prints it), and
the run performs it: SIGKILL (then a restart) or SIGSTOP/SIGCONT of a node
or a worker; PostgreSQL stopped (fast or immediate) and started again, or our
backends terminated; etcd killed or stopped and started again; a node cut off
from etcd or from PostgreSQL (its relay holds traffic; healing either lets it
through or resets the connections); a node's clock stepped (the node's
``--clock-skew-file`` test hook and SIGUSR1); a node's data directory, a
tiny tmpfs, filled. Dead workers and nodes that the nemesis did not kill are
restarted too (a handler's ``os._exit``), and counted.

After ``--duration`` seconds the faults stop and everything is healed: every
process alive, every relay open, every clock true. The load stops; the run
waits until every fire due by then is settled (or ``--drain`` seconds pass),
then past every lease and grace, and the checker (``testkit/promises.py``) judges the
handlers' own effect log and fenced resource against the store's executions
and missed fires.

JSON keys: ``duration_s``, ``seed``, ``faults`` (performed, by kind),
``fires``, ``lost``, ``early``, ``duplicates``, ``stale_fence_accepted``,
``missed_without_reason``, ``max_late_s``, and more: ``fires_run``,
``unknown`` (at_most_once runs whose outcome is unknown), ``late_p99_s``,
``dead_lettered``, ``missed`` (by reason), ``effects_repeated`` (fires whose
handler finished its effect more than once: at-least-once at work),
``node_exits`` / ``worker_exits`` (processes that died without the nemesis),
``jobs``. A violation exits 1 after printing the seed and the history of each
fire involved (executions, missed records, effects, resource writes).
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _report
import psycopg
from _drivers import DEFAULT_PG, PgSchema

from testkit.cluster import GRACE_MS, LEASE_MS, Cluster, ClusterNode, utc
from testkit.e2e_handlers import effects as read_effects
from testkit.promises import Missed, PlannedJob, ResourceWrite, Run, check, history, summary
from testkit.services import EtcdServer
from wheel.client import Client, JobRequest, Retry
from wheel.errors import WheelError

# -- the fault schedule -------------------------------------------------------------------

# Kind -> (weight, shortest, longest hold in seconds).
KINDS: dict[str, tuple[int, float, float]] = {
    "node_kill": (3, 0.5, 6.0),
    "node_pause": (3, 0.3, 8.0),
    "worker_kill": (3, 0.0, 3.0),
    "worker_pause": (3, 0.5, 8.0),
    "pg_restart": (1, 0.0, 2.0),
    "pg_terminate": (2, 0.0, 0.0),
    "etcd_restart": (1, 0.5, 5.0),
    "node_cut_etcd": (2, 0.5, 8.0),
    "node_cut_pg": (2, 0.5, 8.0),
    "clock_step": (2, 3.0, 15.0),
    "disk_full": (1, 3.0, 10.0),
}
# Kinds that take a node out of service: one node at a time, so two of three
# nodes are always meant to be up (the others may overlap with them).
NODE_OUTAGES = frozenset({"node_kill", "node_pause", "node_cut_etcd", "node_cut_pg"})
MAX_SKEW_MS = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    at_s: float  # after the fault window opens
    kind: str
    target: str  # a node id, a worker id, "postgres" or "etcd"
    hold_s: float
    detail: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in sorted(self.detail.items()))
        return f"{self.at_s:8.2f}s {self.kind:<13} {self.target:<8} {self.hold_s:5.2f}s {extra}"


def plan_faults(
    seed: int,
    duration_s: float,
    fault_every_s: float,
    kinds: Sequence[str],
    nodes: Sequence[str],
    workers: Sequence[str],
) -> list[Fault]:
    """The whole fault schedule, from ``random.Random(seed)`` alone: faults
    arrive at exponential intervals of mean ``fault_every_s``; each occupies
    its target until it heals, one node outage at a time, at most half the
    workers down at once, and one PostgreSQL and one etcd fault at a time."""
    rng = random.Random(seed)
    busy: dict[str, float] = {}  # occupied key -> free from
    plan: list[Fault] = []
    weights = [KINDS[k][0] for k in kinds]
    t = rng.expovariate(1 / fault_every_s)
    while t < duration_s:
        kind = rng.choices(list(kinds), weights)[0]
        _, lo, hi = KINDS[kind]
        hold = round(rng.uniform(lo, hi), 3)
        candidates, keys = _targets(kind, nodes, workers)
        free = [c for c in candidates if busy.get(keys(c), 0.0) <= t]
        if kind in NODE_OUTAGES and any(busy.get(f"out:{n}", 0.0) > t for n in nodes):
            free = []
        if kind.startswith("worker"):
            down = sum(1 for w in workers if busy.get(f"out:{w}", 0.0) > t)
            if down >= max(1, len(workers) // 2):
                free = []
        if free:
            target = rng.choice(free)
            detail: dict[str, Any] = {}
            if kind in ("node_cut_etcd", "node_cut_pg"):
                detail["reset"] = rng.random() < 0.5
            elif kind == "pg_restart":
                detail["mode"] = rng.choice(["fast", "immediate"])
            elif kind == "etcd_restart":
                detail["signal"] = rng.choice(["SIGKILL", "SIGTERM"])
            elif kind == "clock_step":
                magnitude = rng.randint(500, MAX_SKEW_MS)
                detail["skew_ms"] = magnitude if rng.random() < 0.5 else -magnitude
            plan.append(
                Fault(at_s=round(t, 3), kind=kind, target=target, hold_s=hold, detail=detail)
            )
            # Taken until it heals, plus a second for the target to come back.
            busy[keys(target)] = t + hold + 1.0
        t += rng.expovariate(1 / fault_every_s)
    return plan


def _targets(
    kind: str, nodes: Sequence[str], workers: Sequence[str]
) -> tuple[list[str], Callable[[str], str]]:
    if kind.startswith("node_"):
        return list(nodes), lambda n: f"out:{n}"
    if kind == "clock_step":
        return list(nodes), lambda n: f"clock:{n}"
    if kind == "disk_full":
        return list(nodes), lambda n: f"disk:{n}"
    if kind.startswith("worker"):
        return list(workers), lambda w: f"out:{w}"
    if kind.startswith("pg"):
        return ["postgres"], lambda _: "postgres"
    return ["etcd"], lambda _: "etcd"


# -- the system's services ---------------------------------------------------------------


class Postgres:
    """The machine's PostgreSQL cluster, which the nemesis stops and starts
    (as root, through pg_ctlcluster), and our schema's backends in it."""

    def __init__(self, dsn: str, tag: str) -> None:
        self.dsn = dsn
        self.tag = tag
        self.cluster = _pg_cluster(urlsplit(dsn).port or 5432)

    @property
    def restartable(self) -> bool:
        return self.cluster is not None and os.geteuid() == 0

    def _ctl(self, *args: str) -> None:
        assert self.cluster is not None
        version, name = self.cluster
        cmd = ["pg_ctlcluster", "--skip-systemctl-redirect", version, name, *args]
        subprocess.run(cmd, check=False, capture_output=True, timeout=120)

    def stop(self, mode: str) -> None:
        self._ctl("stop", "-m", mode)

    def start(self) -> None:
        self._ctl("start")

    def up(self) -> bool:
        try:
            with psycopg.connect(self.dsn, connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def terminate_ours(self) -> int:
        with psycopg.connect(self.dsn, connect_timeout=5, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s AND pid <> pg_backend_pid()",
                (self.tag,),
            ).fetchall()
        return len(rows)


def _pg_cluster(port: int) -> tuple[str, str] | None:
    """(version, name) of the local PostgreSQL cluster on ``port``, if
    pg_ctlcluster runs it: a run given a cluster of its own (``--pg-dsn``)
    restarts that one and leaves the machine's others alone."""
    if shutil.which("pg_lsclusters") is None:
        return None
    out = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] == str(port):
            return parts[0], parts[1]
    return None


def mount_tmpfs(path: Path, size: str = "512k") -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    cmd = ["mount", "-t", "tmpfs", "-o", f"size={size}", "wheel-chaos", str(path)]
    return subprocess.run(cmd, capture_output=True).returncode == 0


def umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path) -> int:
    """Write into ``path`` until the disk is full; the bytes written."""
    written = 0
    with contextlib.suppress(OSError), open(path / "fill", "wb") as f:
        while True:
            f.write(b"\0" * 65536)
            f.flush()
            written += 65536
    return written


# -- the load ---------------------------------------------------------------------------

RETRY = Retry(
    max_attempts=3, initial_backoff=timedelta(milliseconds=300), max_backoff=timedelta(seconds=1.5)
)
# What a handler does, by name: (payload, timeout).
BEHAVIOURS: dict[str, tuple[dict[str, Any], float]] = {
    "ok": ({"sleep_s": 0.1}, 20.0),
    "slow": ({"sleep_s": 4.0}, 20.0),  # past the lease (renewed) of LEASE_MS
    "timeout": ({"sleep_s": 4.0}, 1.5),  # past its timeout on every attempt
    "retry": ({"fail": 1}, 20.0),
    "retry_twice": ({"fail": 2}, 20.0),
    "permanent": ({"permanent": True}, 20.0),
    "crash": ({"crash": 1}, 20.0),  # the first attempt ends its worker
}
ONE_SHOT_MIX = {
    "ok": 70, "slow": 6, "timeout": 3, "retry": 7, "retry_twice": 3, "permanent": 4, "crash": 3,
}  # fmt: skip
# Recurring jobs: (kind, period s or cron seconds, behaviour, at_most_once).
RECURRING: list[tuple[str, Any, str, bool]] = [
    ("interval", 1, "ok", False),
    ("interval", 1, "ok", True),
    ("interval", 2, "ok", False),
    ("interval", 2, "slow", False),
    ("interval", 2, "retry", False),
    ("interval", 3, "ok", False),
    ("interval", 3, "slow", True),
    ("interval", 5, "permanent", False),
    ("interval", 5, "retry_twice", False),
    ("interval", 7, "crash", False),
    ("cron", "*/2", "ok", False),
    ("cron", "*/3", "ok", True),
    ("cron", "*/5", "retry", False),
    ("cron", "0,15,30,45", "slow", False),
    ("cron", "7,37", "ok", False),
]


def cron_seconds(field_text: str) -> tuple[int, ...]:
    """The seconds of a minute a ``*/N`` or ``a,b,c`` seconds field names
    (worked out here, not by wheel's schedule code)."""
    if field_text.startswith("*/"):
        return tuple(range(0, 60, int(field_text[2:])))
    return tuple(sorted(int(s) for s in field_text.split(",")))


class Load:
    """Submits the recurring jobs, then ``rate`` one-shots a second (each due
    one to four seconds after it is sent) through any node that answers. A
    batch not acknowledged is sent again with the same keys until it is: a
    job counts (is owed its fires) once acknowledged."""

    def __init__(self, targets: Sequence[str], rng: random.Random, rate: float) -> None:
        self.client = Client(list(targets), timeout=3.0)
        self.rng = rng
        self.rate = rate
        self.jobs: dict[int, PlannedJob] = {}
        self.unacknowledged = 0
        self._pending: list[tuple[list[JobRequest], list[PlannedJob]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-load", daemon=True)
        self._seq = 0

    def _request(
        self, name: str, behaviour: str, at_most_once: bool, **schedule: Any
    ) -> JobRequest:
        payload, timeout = BEHAVIOURS[behaviour]
        return JobRequest(
            name=name,
            handler="chaos",
            payload=json.dumps(payload).encode(),
            retry=RETRY,
            timeout=timedelta(seconds=timeout),
            at_most_once=at_most_once,
            idempotency_key=name,
            **schedule,
        )

    def start(self) -> None:
        now = int(time.time() * 1000)
        requests, plans = [], []
        for i, (kind, every, behaviour, amo) in enumerate(RECURRING):
            name = f"{kind}-{i}-{behaviour}{'-amo' if amo else ''}"
            if kind == "interval":
                first = now + 3_000 + self.rng.randrange(1_000)
                requests.append(
                    self._request(
                        name, behaviour, amo, every=timedelta(seconds=every), start=utc(first)
                    )
                )
                plans.append(
                    PlannedJob(
                        job_id=0,
                        kind=kind,
                        at_most_once=amo,
                        first_ms=first,
                        period_ms=every * 1000,
                        behaviour=behaviour,
                    )
                )
            else:
                requests.append(self._request(name, behaviour, amo, cron=f"{every} * * * * *"))
                plans.append(
                    PlannedJob(
                        job_id=0,
                        kind=kind,
                        at_most_once=amo,
                        seconds=cron_seconds(every),
                        behaviour=behaviour,
                    )
                )
        deadline = time.monotonic() + 60
        while not self._submit(requests, plans):
            if time.monotonic() > deadline:
                raise RuntimeError("the recurring jobs were not acknowledged within 60 s")
            time.sleep(0.5)
        self._thread.start()

    def stop(self) -> None:
        """Stop sending new jobs; send what is unacknowledged until it is (or
        30 s pass)."""
        self._stop.set()
        self._thread.join(60)
        deadline = time.monotonic() + 30
        while self._pending and time.monotonic() < deadline:
            self._retry_pending()
            time.sleep(0.5)
        self.unacknowledged = sum(len(r) for r, _ in self._pending)
        self.client.close()

    def _run(self) -> None:
        owed = 0.0
        while not self._stop.wait(0.25):
            self._retry_pending()
            owed += self.rate * 0.25
            count, owed = int(owed), owed - int(owed)
            requests, plans = [], []
            for _ in range(count):
                self._seq += 1
                behaviour = self.rng.choices(list(ONE_SHOT_MIX), list(ONE_SHOT_MIX.values()))[0]
                amo = self.rng.random() < 0.1
                at = int(time.time() * 1000) + self.rng.randrange(1_000, 4_000)
                name = f"once-{self._seq}-{behaviour}{'-amo' if amo else ''}"
                requests.append(self._request(name, behaviour, amo, at=utc(at)))
                plans.append(
                    PlannedJob(
                        job_id=0, kind="once", at_most_once=amo, first_ms=at, behaviour=behaviour
                    )
                )
            if requests and not self._submit(requests, plans):
                self._pending.append((requests, plans))

    def _retry_pending(self) -> None:
        pending, self._pending = self._pending, []
        for requests, plans in pending:
            if not self._submit(requests, plans):
                self._pending.append((requests, plans))

    def _submit(self, requests: list[JobRequest], plans: list[PlannedJob]) -> bool:
        try:
            results = self.client.submit_many(requests)
        except WheelError:
            return False
        acked_ms = int(time.time() * 1000)
        retry: list[tuple[JobRequest, PlannedJob]] = []
        for request, plan, result in zip(requests, plans, results, strict=True):
            if isinstance(result, WheelError):
                retry.append((request, plan))
                continue
            # A cron job's first fire follows the clock of the node that took
            # it: judge its fires from a second after the acknowledgement.
            from_ms = acked_ms + 1_000 if plan.kind == "cron" else 0
            self.jobs[result.job_id] = PlannedJob(
                **{**asdict(plan), "job_id": result.job_id, "from_ms": from_ms}
            )
        if retry:
            self._pending.append(([r for r, _ in retry], [p for _, p in retry]))
        return True


# -- the nemesis -------------------------------------------------------------------------


class Nemesis:
    """Performs a fault plan against a running cluster, keeps every process
    the plan does not hold down alive, and heals everything at the end."""

    def __init__(
        self,
        cluster: Cluster,
        etcd: EtcdServer,
        pg: Postgres,
        skew_files: dict[str, Path],
        disks: dict[str, Path],
        log: Callable[[str], None],
    ) -> None:
        self.cluster = cluster
        self.etcd = etcd
        self.pg = pg
        self.skew_files = skew_files
        self.disks = disks
        self.log = log
        self.performed: Counter[str] = Counter()
        self.node_exits = 0
        self.worker_exits = 0
        self.held_down: set[str] = set()  # processes a fault keeps down
        self._lock = threading.Lock()
        self._stop = threading.Event()  # the fault window is over
        self._done = threading.Event()  # the judging starts: supervise no more
        self._threads: list[threading.Thread] = []
        self._supervisor = threading.Thread(target=self._supervise, daemon=True)

    def run(self, plan: Sequence[Fault], window_start: float, duration_s: float) -> None:
        """Perform ``plan`` from ``window_start`` (monotonic) for ``duration_s``."""
        self._supervisor.start()
        queue = [(f.at_s, i, f) for i, f in enumerate(plan)]
        heapq.heapify(queue)
        end = window_start + duration_s
        while queue:
            at_s, _, fault = heapq.heappop(queue)
            if self._stop.wait(max(0.0, window_start + at_s - time.monotonic())):
                break
            if time.monotonic() >= end:
                break
            thread = threading.Thread(target=self._perform, args=(fault,), daemon=True)
            thread.start()
            self._threads.append(thread)
        self._stop.wait(max(0.0, end - time.monotonic()))

    def heal(self) -> None:
        """End every fault now and bring every process and relay back."""
        self._stop.set()
        for thread in self._threads:
            thread.join(120)
        for link in self.cluster.all_links():
            link.release()
        if self.pg.restartable and not self.pg.up():
            self.pg.start()
        if self.etcd.proc is None or self.etcd.proc.poll() is not None:
            self.etcd.start()
        for node_id, path in self.skew_files.items():
            path.write_text("0")
            reload_skew(self.cluster.node(node_id))
        with self._lock:
            for node in self.cluster.nodes:
                if node.alive:
                    node.signal(signal.SIGCONT)
                else:
                    node.spawn()
            for worker in self.cluster.workers:
                if worker.alive:
                    worker.proc.send_signal(signal.SIGCONT)
                else:
                    worker.restart()
            self.held_down.clear()

    def stop_supervising(self) -> None:
        self._stop.set()
        self._done.set()
        if self._supervisor.is_alive():
            self._supervisor.join(10)

    def _supervise(self) -> None:
        """Restart what died without the nemesis (a handler's os._exit, a
        node that exited) through the fault window and the drain after it:
        the workload's crashing handlers go on ending workers once the faults
        are over, and a fleet left to die would hold every fire back."""
        while not self._done.wait(0.2):
            with self._lock:
                for worker in self.cluster.workers:
                    if worker.worker_id not in self.held_down and not worker.alive:
                        self.worker_exits += 1
                        worker.restart()
                for node in self.cluster.nodes:
                    if node.node_id not in self.held_down and not node.alive:
                        self.node_exits += 1
                        assert node.proc is not None
                        self.log(f"{node.node_id} exited by itself ({node.proc.returncode})")
                        node.spawn()

    def _hold(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _perform(self, f: Fault) -> None:
        self.log(f.describe())
        self.performed[f.kind] += 1
        try:
            getattr(self, f"_{f.kind}")(f)
        except Exception as exc:  # one failed fault must not end the run
            self.log(f"fault {f.kind} on {f.target} failed: {exc!r}")

    def _node(self, f: Fault) -> ClusterNode:
        return self.cluster.node(f.target)

    def _node_kill(self, f: Fault) -> None:
        node = self._node(f)
        with self._lock:
            self.held_down.add(node.node_id)
            if node.alive:
                node.kill()
        self._hold(f.hold_s)
        with self._lock:
            self.held_down.discard(node.node_id)
            if not node.alive:
                node.spawn()

    def _node_pause(self, f: Fault) -> None:
        node = self._node(f)
        if not node.alive:
            return
        node.signal(signal.SIGSTOP)
        self._hold(f.hold_s)
        if node.alive:
            node.signal(signal.SIGCONT)

    def _worker(self, f: Fault) -> Any:
        return next(w for w in self.cluster.workers if w.worker_id == f.target)

    def _worker_kill(self, f: Fault) -> None:
        worker = self._worker(f)
        with self._lock:
            self.held_down.add(worker.worker_id)
            if worker.alive:
                worker.proc.kill()
                worker.proc.wait(10)
        self._hold(f.hold_s)
        with self._lock:
            self.held_down.discard(worker.worker_id)
            if not worker.alive:
                worker.restart()

    def _worker_pause(self, f: Fault) -> None:
        worker = self._worker(f)
        if not worker.alive:
            return
        worker.proc.send_signal(signal.SIGSTOP)
        self._hold(f.hold_s)
        if worker.alive:
            worker.proc.send_signal(signal.SIGCONT)

    def _pg_restart(self, f: Fault) -> None:
        self.pg.stop(f.detail["mode"])
        self._hold(f.hold_s)
        self.pg.start()

    def _pg_terminate(self, f: Fault) -> None:
        self.pg.terminate_ours()

    def _etcd_restart(self, f: Fault) -> None:
        proc = self.etcd.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(getattr(signal, f.detail["signal"]))
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._hold(f.hold_s)
        self.etcd.start()

    def _cut(self, f: Fault, links: dict[str, Any]) -> None:
        link = links[f.target]
        link.cut()
        self._hold(f.hold_s)
        link.heal(reset=bool(f.detail.get("reset")))

    def _node_cut_etcd(self, f: Fault) -> None:
        self._cut(f, self.cluster.etcd_links)

    def _node_cut_pg(self, f: Fault) -> None:
        self._cut(f, self.cluster.links)

    def _clock_step(self, f: Fault) -> None:
        node = self._node(f)
        self.skew_files[node.node_id].write_text(str(f.detail["skew_ms"]))
        reload_skew(node)
        self._hold(f.hold_s)
        self.skew_files[node.node_id].write_text("0")
        reload_skew(node)

    def _disk_full(self, f: Fault) -> None:
        disk = self.disks[f.target]
        fill(disk)
        self._hold(f.hold_s)
        with contextlib.suppress(FileNotFoundError):
            (disk / "fill").unlink()


# -- reading what happened -----------------------------------------------------------------


def store_history(dsn: str) -> tuple[list[Run], list[Missed]]:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        runs = [
            Run(
                run_id=r[0],
                job_id=r[1],
                scheduled_for=r[2],
                attempt=r[3],
                state=r[4],
                fence=r[5],
                worker_id=r[6],
                dispatched_at_ms=r[7],
                finished_at_ms=r[8],
                error=r[9],
            )
            for r in conn.execute(
                # Attempts as the handlers' effect lines carry them (from 1);
                # the store numbers them from 0.
                "SELECT run_id, job_id, scheduled_for, attempt + 1, state, fence, worker_id,"
                " dispatched_at_ms, finished_at_ms, error FROM executions"
            )
        ]
        missed = [
            Missed(job_id=r[0], scheduled_for=r[1], reason=r[2], recorded_at_ms=r[3])
            for r in conn.execute(
                "SELECT job_id, scheduled_for, reason, recorded_at_ms FROM missed_fires"
            )
        ]
    return runs, missed


def resource_writes(out: Path) -> list[ResourceWrite]:
    import sqlite3

    path = Path(f"{out}.jobs.db")
    if not path.exists():
        return []
    db = sqlite3.connect(path, timeout=30)
    try:
        rows = db.execute("SELECT seq, job, key, fence, run, accepted FROM job_writes").fetchall()
    finally:
        db.close()
    return [
        ResourceWrite(seq=r[0], job_id=r[1], key=r[2], fence=r[3], run_id=r[4], accepted=bool(r[5]))
        for r in rows
    ]


class EpochWatch:
    """Which node held which (shard, epoch), from the nodes' status every
    half second: a run's fence names its epoch, this names the node."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.holders: dict[tuple[int, int], str] = {}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._watch, args=(n,), daemon=True) for n in cluster.nodes
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self, node: ClusterNode) -> None:
        while not self._stop.wait(0.5):
            if not node.alive:
                continue
            status = node.status()
            if status is None:
                continue
            for s in status.shards:
                if s.epoch:
                    self.holders[(s.shard, s.epoch)] = node.node_id


# -- the run -----------------------------------------------------------------------------


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def run(args: argparse.Namespace) -> tuple[dict[str, Any], bool]:
    started = time.monotonic()
    kinds = [k for k in args.faults.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise SystemExit(f"unknown fault kinds: {sorted(unknown)}")
    nodes = [f"node-{chr(97 + i)}" for i in range(3)]
    workers = [f"w{i + 1}" for i in range(args.workers)]
    tmp = Path(tempfile.mkdtemp(prefix="wheel-chaos-"))
    log_file = open(tmp / "nemesis.log", "a")  # noqa: SIM115 - closed below

    def log(text: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {text}"
        log_file.write(line + "\n")
        log_file.flush()
        if args.verbose:
            print(line, file=sys.stderr)

    tag = f"wheel-chaos-{tmp.name[-8:]}"
    schema = PgSchema(args.pg_dsn, tag)
    pg = Postgres(schema.dsn, tag)
    disks: dict[str, Path] = {}
    if "pg_restart" in kinds and not pg.restartable:
        print("pg_restart needs root and pg_ctlcluster: left out", file=sys.stderr)
        kinds.remove("pg_restart")
    if "disk_full" in kinds:
        for node_id in nodes:
            if mount_tmpfs(tmp / "cluster" / node_id / "data"):
                disks[node_id] = tmp / "cluster" / node_id / "data"
        if len(disks) < len(nodes):
            print("disk_full needs root and mount: left out", file=sys.stderr)
            kinds.remove("disk_full")
    plan = plan_faults(args.seed, args.duration, args.fault_every, kinds, nodes, workers)
    (tmp / "plan.txt").write_text("".join(f.describe() + "\n" for f in plan))

    skew_files = {n: tmp / f"skew-{n}" for n in nodes}
    for path in skew_files.values():
        path.write_text("0")
    etcd = EtcdServer(tmp / "etcd" / "data")
    (tmp / "etcd").mkdir(parents=True, exist_ok=True)
    cluster = Cluster(
        tmp / "cluster",
        etcd,
        schema.dsn,
        size=3,
        workers=args.workers,
        name="chaos",
        etcd_links=True,
        node_flags=lambda n: ("--clock-skew-file", str(skew_files[n])),
        worker_capacity=args.capacity,
    )
    nemesis = Nemesis(cluster, etcd, pg, skew_files, disks, log)
    watch = EpochWatch(cluster)
    load: Load | None = None
    ok = False
    try:
        etcd.start()
        cluster.start()
        watch.start()
        load = Load(cluster.targets, random.Random(f"load-{args.seed}"), args.rate)
        load.start()
        print(
            f"chaos: seed {args.seed}, {len(plan)} faults planned over {args.duration:g} s"
            f" ({', '.join(kinds)}); run dir {tmp}",
            file=sys.stderr,
        )
        nemesis.run(plan, time.monotonic(), args.duration)
        nemesis.heal()
        load.stop()
        stop_ms = int(time.time() * 1000)
        # Every one-shot sent was due at most four seconds after it was sent.
        end_ms = stop_ms + 4_000
        settled = wait_until(lambda: cluster_whole(cluster), 90)
        log(f"faults over; cluster {'settled' if settled else 'NOT settled'}")
        jobs = list(load.jobs.values())

        def resolved() -> bool:
            if int(time.time() * 1000) < end_ms:
                return False
            runs, missed = store_history(schema.dsn)
            return not check(jobs, runs, missed, [], [], end_ms=end_ms).lost

        drained = wait_until(resolved, args.drain, 1.0)
        # Past every lease, grace and retry backoff: late completions of
        # zombies land (or are refused) before the judging.
        time.sleep((LEASE_MS + GRACE_MS) / 1000 + RETRY.max_backoff.total_seconds() + 1)
        log(f"drain {'complete' if drained else 'timed out'}")
        watch.stop()
        runs, missed = store_history(schema.dsn)
        effects = read_effects(cluster.out)
        writes = resource_writes(cluster.out)
        verdict = check(
            jobs,
            runs,
            missed,
            effects,
            writes,
            end_ms=end_ms,
            overlap_tolerance_ms=MAX_SKEW_MS + 2_000 if "clock_step" in kinds else 2_000,
        )
        result: dict[str, Any] = {
            "duration_s": args.duration,
            "seed": args.seed,
            "faults": dict(sorted(nemesis.performed.items())),
            **summary(verdict),
            "fault_count": sum(nemesis.performed.values()),
            "node_exits": nemesis.node_exits,
            "worker_exits": nemesis.worker_exits,
            "jobs": len(jobs),
            "unacknowledged_jobs": load.unacknowledged,
            "runs": len(runs),
            "wall_s": round(time.monotonic() - started, 1),
        }
        violations = {k: n for k, n in verdict.violations().items() if n}
        ok = not violations
        if not ok:
            involved = verdict.fires_involved()
            report = {
                "seed": args.seed,
                "violations": violations,
                "promises_broken": {
                    f"{p.value}. {p.name.lower()}": n for p, n in verdict.by_promise().items() if n
                },
                "early": verdict.early,
                "stale_fence_accepted": verdict.stale_fence_accepted,
                "missed_without_reason": verdict.missed_without_reason,
                "success_with_refused_effect": verdict.success_with_refused_effect,
                "epoch_holders": {f"{s}:{e}": n for (s, e), n in sorted(watch.holders.items())},
                "fires": history(involved, runs, missed, effects, writes),
            }
            failures = tmp / "failures.json"
            failures.write_text(json.dumps(report, indent=1, default=str))
            # The whole record of truth and the plan of jobs, to look further.
            (tmp / "store.json").write_text(
                json.dumps(
                    {
                        "executions": [asdict(r) for r in runs],
                        "missed": [asdict(m) for m in missed],
                        "jobs": [j.to_json() for j in jobs],
                        "end_ms": end_ms,
                    }
                )
            )
            print(f"\nchaos FAILED with seed {args.seed}: {violations}", file=sys.stderr)
            broken = ", ".join(str(p.value) for p, n in verdict.by_promise().items() if n)
            print(f"promises broken (docs/design.md): {broken}", file=sys.stderr)
            print(f"the fault plan: {tmp / 'plan.txt'}; every fire involved: {failures}",
                  file=sys.stderr)  # fmt: skip
            for fire in report["fires"][:10]:
                print(json.dumps(fire, default=str), file=sys.stderr)
            for item in verdict.early[:10]:
                holder = watch.holders.get(
                    (shard_of_job(item["job"]), int(item["fence"]) >> 32), "?"
                )
                print(f"early by {item['early_ms']} ms from {holder}: {item}", file=sys.stderr)
        return result, ok
    finally:
        watch.stop()
        nemesis.stop_supervising()
        cluster.stop()
        etcd.stop()
        for disk in disks.values():
            umount(disk)
        with contextlib.suppress(psycopg.Error):
            if not pg.up() and pg.restartable:
                pg.start()
            schema.admin = psycopg.connect(args.pg_dsn, autocommit=True)
            schema.drop()
        log_file.close()
        if ok and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"run dir kept: {tmp}", file=sys.stderr)


def shard_of_job(job_id: int) -> int:
    from wheel.engine.model import shard_of

    return shard_of(job_id)


def reload_skew(node: ClusterNode) -> None:
    """Have ``node`` read its skew file again (SIGUSR1). A process still
    starting is waited for: until ``serve`` ignores or handles SIGUSR1, the
    signal's default action would end it."""
    deadline = time.monotonic() + 15
    while node.alive and not node.past_start() and time.monotonic() < deadline:
        time.sleep(0.05)
    if node.alive:
        node.signal(signal.SIGUSR1)


def cluster_whole(cluster: Cluster) -> bool:
    """Every node alive and answering, and all 256 shards held once between them."""
    if not all(n.alive for n in cluster.nodes):
        return False
    return cluster.ownership().whole_on({n.node_id for n in cluster.nodes})


def main(argv: list[str] | None = None) -> int:
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every child process.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of faults")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fault-every", type=float, default=1.5, help="mean seconds between faults")
    p.add_argument("--faults", default=",".join(KINDS), help="kinds, comma-separated")
    p.add_argument("--rate", type=float, default=4.0, help="one-shots submitted per second")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--capacity", type=int, default=16, help="runs per worker at once")
    p.add_argument("--drain", type=float, default=120.0, help="longest wait for fires to settle")
    p.add_argument("--pg-dsn", default=DEFAULT_PG)
    p.add_argument("--json", type=Path, help="write the result here")
    p.add_argument("--plan", action="store_true", help="print the fault plan and exit")
    p.add_argument("--keep", action="store_true", help="keep the run dir even on success")
    p.add_argument("-v", "--verbose", action="store_true", help="log each fault to stderr")
    args = p.parse_args(argv)
    if args.plan:
        nodes = [f"node-{chr(97 + i)}" for i in range(3)]
        workers = [f"w{i + 1}" for i in range(args.workers)]
        kinds = [k for k in args.faults.split(",") if k]
        for f in plan_faults(args.seed, args.duration, args.fault_every, kinds, nodes, workers):
            print(f.describe())
        return 0
    result, ok = run(args)
    _report.emit(result, args.json)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
