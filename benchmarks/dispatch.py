"""Dispatch throughput benchmark: a real scheduler, real worker processes,
throughput and lateness of every intended fire.

    python benchmarks/dispatch.py --system wheel,poll,apscheduler --store sqlite \\
        --workers 2 --rate 500 --duration 20 --json out.json

Systems: ``wheel`` (``wheelctl serve`` + ``wheel.worker.Worker`` processes; with
``--nodes N`` a cluster of N nodes on PostgreSQL and one etcd, every worker
holding a stream to every node, jobs submitted through the first; on SQLite
at ``synchronous=NORMAL`` as ``poll`` runs), ``wheel-durable`` (the same at
wheel's own default durability: every SQLite commit fsynced), ``poll``
(the seed's polling scheduler, ``poll_scheduler.py``) and ``apscheduler``
(APScheduler 3 + SQLAlchemyJobStore, ``apscheduler_baseline.py``).

Jobs (one-shots at precise times and fixed-rate interval jobs) are submitted
before the measured window so that ``--rate`` fires per second come due over
``--duration`` seconds. Lag is measured against the intended time of every
fire, without coordinated omission: a fire not dispatched by the end of the
window plus ``--drain`` is counted in ``lost`` AND enters the lag percentiles
with its censored lag (end of run minus scheduled time), so dropping or
deferring work can never make a system look faster. ``--find-max`` ramps the
rate (doubling, then bisecting) to the highest one with p99 lag <= 1 s and
nothing lost.

``--history ROWS`` (wheel, one node) fills the store with that many finished
runs, and a fifth as many missed fires, all 40 days old, before the node
starts; given ``--serve-args "--retain 30d --retention-interval 2s"`` the node
purges them in the background while it dispatches, and the result says how
many rows went during the measured window (from the node's own
``wheel_retention_purged_rows_total``). A run without ``--history`` is the
baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h
import _report
from _cluster import LocalCluster

HERE = Path(__file__).resolve().parent
PY = sys.executable
DEFAULT_PG = os.environ.get("WHEEL_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
SYSTEMS = ("wheel", "wheel-durable", "poll", "apscheduler")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """What one measured run needs besides the system and the rate."""

    store: str  # sqlite | postgres
    workers: int
    duration_s: float
    drain_s: float
    recurring_fraction: float
    period_s: float
    poll_limit: int
    pg_dsn: str
    wheelctl: str
    capacity: int
    serve_args: str = ""
    # wheel: nodes of the cluster (1: one node, no etcd).
    nodes: int = 1
    # wheel cluster: each node's etcd lease, s.
    ttl_s: int = 5
    # wheel, one node: finished runs 40 days old put in the store first.
    history: int = 0


def _wait_line(proc: subprocess.Popen[str], prefix: str, timeout_s: float = 60) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"process exited before {prefix!r} (rc={proc.poll()})")
        if line.startswith(prefix):
            return line.strip()
    raise RuntimeError(f"timed out waiting for {prefix!r}")


def _stop(procs: list[subprocess.Popen[Any]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class PgSchema:
    """Our own schema in the benchmark database, dropped afterwards."""

    def __init__(self, dsn: str, tag: str) -> None:
        import psycopg

        self.admin = psycopg.connect(dsn, autocommit=True)
        self.name = f"wheel_bench_{secrets.token_hex(5)}"
        self.tag = tag
        self.admin.execute(f'CREATE SCHEMA "{self.name}"')
        sep = "&" if "?" in dsn else "?"
        self.dsn = f"{dsn}{sep}options=-csearch_path%3D{self.name}&application_name={tag}"

    def backend_pids(self) -> list[int]:
        rows = self.admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (self.tag,)
        ).fetchall()
        return [int(r[0]) for r in rows]

    def drop(self) -> None:
        self.admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND pid <> pg_backend_pid()",
            (self.tag,),
        )
        self.admin.execute(f'DROP SCHEMA "{self.name}" CASCADE')
        self.admin.close()


class Driver(Protocol):
    """One system under test: prepare the store, submit, launch, stop."""

    name: str
    submit_rate_hint: float  # jobs/s, to choose how far ahead the first fire lies

    def prepare(self) -> None: ...
    def submit(self, workload: h.Workload) -> dict[int, int] | None: ...
    def launch(self) -> list[int]: ...
    def stop(self) -> None: ...
    def teardown(self) -> None: ...


class _QueueDriver:
    """poll and apscheduler: a scheduler process feeding K queue workers."""

    name = ""
    submit_rate_hint = 20_000.0

    def __init__(self, cfg: RunConfig, tmp: Path, records: list[Path]) -> None:
        self.cfg = cfg
        self.tmp = tmp
        self.records = records
        self.procs: list[subprocess.Popen[Any]] = []
        self.schema: PgSchema | None = None
        self.url = ""

    def prepare(self) -> None:
        if self.cfg.store == "postgres":
            self.schema = PgSchema(self.cfg.pg_dsn, f"wheel-bench-{secrets.token_hex(4)}")
            self.url = self.schema.dsn
        else:
            self.url = f"sqlite:///{self.tmp / 'store.db'}"

    def scheduler_cmd(self) -> list[str]:
        raise NotImplementedError

    def launch(self) -> list[int]:
        # The scheduler's own log (APScheduler complains loudly once the workers hang
        # up at the end) goes to a file kept with the run's other artefacts.
        log = open(self.tmp / "scheduler.log", "wb")  # noqa: SIM115
        sched = subprocess.Popen(
            self.scheduler_cmd(), stdout=subprocess.PIPE, stderr=log, text=True, cwd=HERE
        )
        self.procs.append(sched)
        port = int(_wait_line(sched, "PORT").split()[1])
        for path in self.records:
            cmd = [PY, str(HERE / "bench_worker.py"), "--system", self.name]
            cmd += ["--connect", f"127.0.0.1:{port}", "--out", str(path), "--store", self.url]
            self.procs.append(subprocess.Popen(cmd, cwd=HERE))
        _wait_line(sched, "READY")
        return [p.pid for p in self.procs]

    def db_pids(self) -> list[int]:
        return self.schema.backend_pids() if self.schema else []

    def stop(self) -> None:
        _stop(self.procs[1:])  # workers first: they flush their records
        _stop(self.procs[:1])

    def teardown(self) -> None:
        if self.schema is not None:
            self.schema.drop()


class PollDriver(_QueueDriver):
    name = "poll"
    submit_rate_hint = 40_000.0

    def prepare(self) -> None:
        import poll_scheduler

        super().prepare()
        poll_scheduler.create_schema(self.url)

    def submit(self, workload: h.Workload) -> dict[int, int] | None:
        import poll_scheduler

        poll_scheduler.submit(self.url, workload)
        return None

    def scheduler_cmd(self) -> list[str]:
        return [
            PY, str(HERE / "poll_scheduler.py"), "--store", self.url,
            "--workers", str(self.cfg.workers), "--limit", str(self.cfg.poll_limit),
        ]  # fmt: skip


class ApsDriver(_QueueDriver):
    name = "apscheduler"
    submit_rate_hint = 4_000.0

    def submit(self, workload: h.Workload) -> dict[int, int] | None:
        import apscheduler_baseline

        apscheduler_baseline.submit(self.url, workload)
        return None

    def scheduler_cmd(self) -> list[str]:
        return [
            PY, str(HERE / "apscheduler_baseline.py"), "--store", self.url,
            "--workers", str(self.cfg.workers),
        ]  # fmt: skip


class WheelDriver:
    """``wheelctl serve`` (or a cluster of ``--nodes`` of them) with K
    ``wheel.worker.Worker`` processes; jobs over raw gRPC stubs."""

    name = "wheel"
    submit_rate_hint = 4_000.0

    def __init__(self, cfg: RunConfig, tmp: Path, records: list[Path]) -> None:
        self.cfg = cfg
        self.tmp = tmp
        self.records = records
        self.procs: list[subprocess.Popen[Any]] = []
        self.schema: PgSchema | None = None
        self.cluster: LocalCluster | None = None
        self.target = ""
        # The first this many of ``launch``'s pids are nodes; the rest workers.
        self.server_count = 1
        # The node's /metrics, served when it has history to purge.
        self.metrics = ""
        # SQLite at wheel's default durability (synchronous=FULL), not the
        # poll baseline's NORMAL; PostgreSQL is the same for both.
        self.durable = False

    def purged(self) -> float | None:
        """The rows the node's retention deleted so far (None: no history)."""
        if not self.metrics:
            return None
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.metrics, timeout=5) as resp:
            text = resp.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "wheel_retention_purged_rows_total":
                    return float(sample.value)
        return 0.0

    def prepare(self) -> None:
        if self.cfg.nodes > 1:
            self._prepare_cluster()
            return
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        data = self.tmp / "wheel"
        data.mkdir()
        if self.cfg.store == "postgres":
            self.schema = PgSchema(self.cfg.pg_dsn, f"wheel-bench-{secrets.token_hex(4)}")
            store = self.schema.dsn
        else:
            # The durability the poll baseline runs at (see poll_scheduler.py):
            # commits survive a process crash, the WAL is fsynced at checkpoints.
            # ``wheel-durable``: wheel's own default, every commit fsynced.
            store = f"sqlite:///{data / 'wheel.db'}"
            if not self.durable:
                store += "?synchronous=normal"
        port = _free_port()
        self.target = f"127.0.0.1:{port}"
        cmd = [self.cfg.wheelctl, "serve", "--data-dir", str(data), "--listen", self.target]
        cmd += ["--store", store, *shlex.split(self.cfg.serve_args)]
        if self.cfg.history:
            fill_history(store, self.cfg.history)
            self.metrics = f"http://127.0.0.1:{_free_port()}/metrics"
            cmd += ["--metrics-listen", self.metrics.removeprefix("http://").split("/")[0]]
        log = open(self.tmp / "wheel-serve.log", "wb")  # noqa: SIM115
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 30
        with grpc.insecure_channel(self.target) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while True:
                if self.procs[0].poll() is not None:
                    raise RuntimeError(f"wheelctl serve exited; see {self.tmp}/wheel-serve.log")
                try:
                    resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                    if resp.status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("wheelctl serve did not become SERVING in 30 s")
                time.sleep(0.2)
        self._start_workers([self.target])

    def _prepare_cluster(self) -> None:
        """etcd and ``nodes`` members on one PostgreSQL schema; jobs go in
        through the first node, workers hold a stream to each."""
        if self.cfg.store != "postgres":
            raise SystemExit("--nodes above 1 needs --store postgres: a cluster shares PostgreSQL")
        self.schema = PgSchema(self.cfg.pg_dsn, f"wheel-bench-{secrets.token_hex(4)}")
        self.cluster = LocalCluster(
            self.tmp / "wheel",
            self.schema.dsn,
            size=self.cfg.nodes,
            ttl_s=self.cfg.ttl_s,
            wheelctl=self.cfg.wheelctl,
            serve_args=self.cfg.serve_args,
        )
        self.cluster.start()
        self.procs += [n.proc for n in self.cluster.nodes if n.proc is not None]
        self.server_count = len(self.cluster.nodes)
        self.target = self.cluster.targets[0]
        self._start_workers(self.cluster.targets)

    def _start_workers(self, targets: list[str]) -> None:
        """Workers connect before anything is due."""
        for path in self.records:
            cmd = [PY, str(HERE / "bench_worker.py"), "--system", "wheel"]
            cmd += ["--connect", ",".join(targets), "--out", str(path)]
            cmd += ["--capacity", str(self.cfg.capacity)]
            self.procs.append(subprocess.Popen(cmd, cwd=HERE))

    def submit(self, workload: h.Workload) -> dict[int, int] | None:
        return submit_workload(self.target, workload)

    def launch(self) -> list[int]:
        time.sleep(0.5)
        return [p.pid for p in self.procs]

    def db_pids(self) -> list[int]:
        return self.schema.backend_pids() if self.schema else []

    def stop(self) -> None:
        _stop(self.procs[self.server_count :])
        _stop(self.procs[: self.server_count])
        if self.cluster is not None:
            self.cluster.stop()

    def teardown(self) -> None:
        if self.schema is not None:
            self.schema.drop()


HISTORY_AGE_MS = 40 * 86_400_000
HISTORY_RUNS_PER_JOB = 10_000


def fill_history(url: str, rows: int) -> None:
    """``rows`` finished runs and ``rows // 5`` missed fires, 40 days old, on
    cancelled jobs of their own (nothing of them is armed), written through
    the store's own calls, ``HISTORY_RUNS_PER_JOB`` a transaction."""
    from wheel.engine.model import JobState, MissedReason, RunState
    from wheel.engine.records import Completion, FireClaim, MissedFire, NewJob
    from wheel.engine.spec import Interval, JobSpec
    from wheel.store.open import open_store

    t0 = time.monotonic()
    old = h.now_ms() - HISTORY_AGE_MS
    store = open_store(url)
    try:
        done = 0
        while done < rows:
            n = min(HISTORY_RUNS_PER_JOB, rows - done)
            spec = JobSpec(
                name=f"history-{done}", handler="bench", schedule=Interval(period_ms=1_000)
            )
            job, _ = store.submit_job(NewJob(spec=spec, created_at_ms=old, next_run_at=None))
            store.set_job_state(job.job_id, JobState.CANCELLED, next_run_at=None, now_ms=old)
            claims = [
                FireClaim(
                    job_id=job.job_id,
                    scheduled_for=old + i * 1_000,
                    attempt=0,
                    fence=i + 1,
                    dispatched_at_ms=old + i * 1_000,
                    advance=False,
                )
                for i in range(n)
            ]
            outs = store.claim_fires(claims)
            store.complete_runs(
                [
                    Completion(
                        run_id=o.run_id,
                        fence=c.fence,
                        state=RunState.SUCCEEDED,
                        finished_at_ms=c.scheduled_for + 50,
                        worker_id="history",
                    )
                    for o, c in zip(outs, claims, strict=True)
                    if o.run_id is not None
                ]
            )
            store.record_missed(
                [
                    MissedFire(
                        job_id=job.job_id,
                        scheduled_for=c.scheduled_for + 500,
                        reason=MissedReason.OVERLAP,
                        recorded_at_ms=c.scheduled_for + 500,
                    )
                    for c in claims[::5]
                ]
            )
            done += n
    finally:
        store.close()
    print(
        f"history: {rows} finished runs and {rows // 5} missed fires in"
        f" {time.monotonic() - t0:.1f}s",
        file=sys.stderr,
    )


def bench_spec(j: h.WorkloadJob) -> Any:
    """The ``JobSpec`` (proto) of one workload job: handler ``bench``, its
    schedule, and terms under which every fire runs however late."""
    from wheel.rpc.v1 import jobs_pb2

    if j.period_ms:
        schedule = jobs_pb2.Schedule(
            interval=jobs_pb2.IntervalSchedule(
                period_ms=j.period_ms,
                mode=jobs_pb2.INTERVAL_MODE_FIXED_RATE,
                start_at_ms=j.first_ms,
            )
        )
    else:
        schedule = jobs_pb2.Schedule(once=jobs_pb2.OnceSchedule(at_ms=j.first_ms))
    return jobs_pb2.JobSpec(
        name=f"bench-{j.index}",
        handler="bench",
        schedule=schedule,
        # Every fire must run however late (no catch-up drops, no overlap
        # skips): the same at-least-once terms the baselines are held to.
        catch_up=jobs_pb2.CatchUp(
            mode=jobs_pb2.CATCH_UP_MODE_RUN_ALL, window_ms=0, max_count=100_000
        ),
        overlap=jobs_pb2.Overlap(policy=jobs_pb2.OVERLAP_POLICY_ALLOW, max_concurrent=1000),
    )


def submit_workload(
    target: str, workload: h.Workload, spec_of: Callable[[h.WorkloadJob], Any] = bench_spec
) -> dict[int, int]:
    """Submit every job of ``workload`` through the node at ``target`` (bulk
    SubmitJobs), each as ``spec_of`` makes it; the server's job id -> the
    workload's job index."""
    import grpc

    from wheel.rpc.v1 import job_service_pb2, job_service_pb2_grpc

    index: dict[int, int] = {}
    options = [("grpc.max_send_message_length", 64 << 20)]
    with grpc.insecure_channel(target, options=options) as ch:
        stub = job_service_pb2_grpc.JobServiceStub(ch)
        pending: list[tuple[list[int], Any]] = []
        chunk: list[tuple[int, Any]] = []

        def send() -> None:
            # Bulk submission (SubmitJobs): one call and one store
            # transaction per few thousand jobs.
            if chunk:
                req = job_service_pb2.SubmitJobsRequest(jobs=[r for _, r in chunk])
                pending.append(([i for i, _ in chunk], stub.SubmitJobs.future(req, timeout=120)))
                chunk.clear()

        def drain(keep: int) -> None:
            while len(pending) > keep:
                ids, fut = pending.pop(0)
                for i, r in zip(ids, fut.result().results, strict=True):
                    if r.error_code:
                        raise RuntimeError(f"submit failed: {r.error_code} {r.error_message}")
                    index[int(r.response.job.job_id)] = i

        for j in workload.jobs:
            req = job_service_pb2.SubmitJobRequest(spec=spec_of(j), idempotency_key=f"b{j.index}")
            chunk.append((j.index, req))
            if len(chunk) >= 2_000:
                send()
                drain(4)
        send()
        drain(0)
    return index


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DurableWheelDriver(WheelDriver):
    """wheel at its own default durability: on SQLite every commit fsynced
    (``synchronous=FULL``), as the checkpoint's log is in both."""

    name = "wheel-durable"

    def __init__(self, cfg: RunConfig, tmp: Path, records: list[Path]) -> None:
        super().__init__(cfg, tmp, records)
        self.durable = True


DRIVERS: dict[str, type[Any]] = {
    "wheel": WheelDriver,
    "wheel-durable": DurableWheelDriver,
    "poll": PollDriver,
    "apscheduler": ApsDriver,
}

# What each row's durability is (RESULTS.md says it per row).
DURABILITY = {
    ("wheel", "sqlite"): "SQLite synchronous=NORMAL (as poll), checkpoint fsync per batch",
    ("wheel-durable", "sqlite"): "wheel's default: SQLite synchronous=FULL, checkpoint fsync",
    ("poll", "sqlite"): "SQLite synchronous=NORMAL",
    ("apscheduler", "sqlite"): "SQLite (SQLAlchemy defaults)",
}


# Jobs/s each system's submission reached in this process: the next run's
# lead time (how far ahead the first fire lies) follows the machine, not a hint.
_SUBMIT_RATES: dict[str, float] = {}


def run_once(
    system: str, rate: float, cfg: RunConfig, *, label: str = ""
) -> tuple[dict[str, Any], h.Workload, h.Analysis]:
    """One measured run of one system at one offered rate. A run whose job
    submission ran into its window measured the submission, not dispatch:
    it is run again once, with the lead its submission rate asks for."""
    out = _run_once(system, rate, cfg, label=label)
    if out[0]["setup_overran_ms"]:
        print(f"[{system}] rerunning {rate:.0f}/s with a longer lead", file=sys.stderr)
        out = _run_once(system, rate, cfg, label=label)
    return out


def _run_once(
    system: str, rate: float, cfg: RunConfig, *, label: str = ""
) -> tuple[dict[str, Any], h.Workload, h.Analysis]:
    tmp = Path(tempfile.mkdtemp(prefix=f"wheel-bench-{system}-"))
    records = [tmp / f"worker{i}.rec" for i in range(cfg.workers)]
    driver = DRIVERS[system](cfg, tmp, records)
    try:
        driver.prepare()
        probe = h.Workload.build(
            rate=rate, duration_s=cfg.duration_s, start_ms=0,
            recurring_fraction=cfg.recurring_fraction, period_s=cfg.period_s,
        )  # fmt: skip
        submit_rate = min(driver.submit_rate_hint, _SUBMIT_RATES.get(system, float("inf")))
        lead_ms = 3000 + round(1500 * len(probe.jobs) / submit_rate)
        workload = h.Workload.build(
            rate=rate, duration_s=cfg.duration_s, start_ms=h.now_ms() + lead_ms,
            recurring_fraction=cfg.recurring_fraction, period_s=cfg.period_s,
        )  # fmt: skip
        submit_t0 = time.monotonic()
        job_index = driver.submit(workload)
        submitted_per_s = len(workload.jobs) / max(1e-9, time.monotonic() - submit_t0)
        _SUBMIT_RATES[system] = submitted_per_s
        pids = driver.launch()
        overran = max(0, h.now_ms() - (workload.start_ms - 200))
        if overran:
            print(f"warning: setup ran {overran} ms into the window", file=sys.stderr)
        time.sleep(max(0.0, (workload.start_ms - h.now_ms()) / 1000))
        purged0 = driver.purged() if system.startswith("wheel") else None
        cpu0 = h.cpu_total(pids)
        db0 = h.cpu_total(driver.db_pids())
        reader = h.RecordReader(records)
        progress = h.Progress(label or system, workload, job_index)
        hard_end = workload.end_ms + round(cfg.drain_s * 1000)
        all_at: int | None = None
        while True:
            time.sleep(0.2)
            now = h.now_ms()
            progress.feed(reader.poll())
            progress.show(now)
            if progress.all_dispatched and now >= workload.end_ms:
                all_at = all_at or now
                if now - all_at >= 600:  # room for late completions and duplicates
                    break
            if now >= hard_end:
                break
            if any(p.poll() is not None for p in getattr(driver, "procs", [])):
                raise RuntimeError(f"a {system} process exited during the run; see {tmp}")
        end_ms = h.now_ms()
        progress.show(end_ms, force=True)
        progress.done()
        purged1 = driver.purged() if system.startswith("wheel") else None
        cpu1 = h.cpu_total(pids)
        db_pids = driver.db_pids()
        db1 = h.cpu_total(db_pids)
        driver.stop()
        reader.poll()
        records_all = reader.all()
    finally:
        try:
            driver.stop()
        finally:
            driver.teardown()
    a = h.analyse(workload, records_all, job_index=job_index, end_ms=end_ms)
    cpu = sum(cpu1[p] - cpu0.get(p, 0.0) for p in cpu1)
    # The scheduler's processes come first: one, or every node of a cluster.
    server_pids = pids[: getattr(driver, "server_count", 1)]
    server_cpu = sum(cpu1.get(p, 0.0) - cpu0.get(p, 0.0) for p in server_pids)
    db_cpu = sum(db1[p] - db0.get(p, 0.0) for p in db1)
    per_k = 1000 / a.dispatched if a.dispatched else float("nan")
    result: dict[str, Any] = {
        "system": system,
        "store": cfg.store,
        "rate": rate,
        "dispatched_per_s": round(a.dispatched_per_s, 1),
        "completed_per_s": round(a.completed_per_s, 1),
        "lag_p50_ms": h.pct(a.lag_ms, 50),
        "lag_p99_ms": h.pct(a.lag_ms, 99),
        "lag_p999_ms": h.pct(a.lag_ms, 99.9),
        "lag_max_ms": float(a.lag_ms.max()) if len(a.lag_ms) else 0.0,
        "cpu_s_per_1k": round(cpu * per_k, 4),
        "lost": a.lost,
        "duplicates": a.duplicates,
        # Context for reading the figures above.
        "db_cpu_s_per_1k": round(db_cpu * per_k, 4) if cfg.store == "postgres" else 0.0,
        "server_cpu_s_per_1k": round(server_cpu * per_k, 4),
        "worker_cpu_s_per_1k": round((cpu - server_cpu) * per_k, 4),
        "expected_fires": a.expected,
        "dispatched": a.dispatched,
        "completed": a.completed,
        "jobs": len(workload.jobs),
        "workers": cfg.workers,
        "duration_s": cfg.duration_s,
        "setup_overran_ms": overran,
        "submitted_per_s": round(submitted_per_s),
    }
    if system == "poll":
        result["poll_limit"] = cfg.poll_limit
    if system.startswith("wheel"):
        result["nodes"] = cfg.nodes
    result["durability"] = DURABILITY.get((system, cfg.store), "PostgreSQL synchronous_commit=on")
    if purged0 is not None and purged1 is not None:
        result["history_rows"] = cfg.history + cfg.history // 5
        result["purged_before_window"] = purged0
        result["purged_in_window"] = purged1 - purged0
    if not os.environ.get("WHEEL_BENCH_KEEP"):
        shutil.rmtree(tmp, ignore_errors=True)
    return result, workload, a


TIGHT_P99_MS = 100.0  # the dispatch target: p99 lag <= 100 ms
# find-max: steps after the 1 s search that bisect the 100 ms bar.
TIGHT_STEPS = 3


def tight_rates(steps: list[dict[str, Any]]) -> list[float]:
    """The rates of the steps that met the 100 ms bar (and the 1 s SLO)."""
    return [st["rate"] for st in steps if st["ok"] and st["lag_p99_ms"] <= TIGHT_P99_MS]


def next_tight_rate(steps: list[dict[str, Any]]) -> float | None:
    """The next rate to try for the 100 ms bar: between the highest step that
    met it and the lowest step above that one (which did not); None when
    there is no such pair or the two are within 15% of each other."""
    met = tight_rates(steps)
    if not met:
        return None
    lo = max(met)
    above = [st["rate"] for st in steps if st["rate"] > lo]
    if not above or min(above) / lo <= 1.15:
        return None
    return float(round((lo * min(above)) ** 0.5))


def sustains(result: dict[str, Any]) -> bool:
    """The seed's SLO: p99 dispatch lag <= 1 s, and nothing lost."""
    return bool(result["lag_p99_ms"] <= h.SLO_P99_MS and result["lost"] == 0)


def find_max(
    system: str, cfg: RunConfig, *, start_rate: float, max_time_s: float
) -> dict[str, Any]:
    """Double the rate until the SLO breaks, then bisect; bounded by
    ``max_time_s``. Then up to ``TIGHT_STEPS`` more steps bisect the 100 ms
    bar between the steps that met it and those that did not."""
    t0 = time.monotonic()
    steps: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    lo, hi = 0.0, float("inf")
    rate = start_rate
    last_step_s = 0.0

    def step(rate: float) -> tuple[dict[str, Any], bool]:
        res, _, _ = run_once(system, rate, cfg, label=f"{system} find-max")
        ok = sustains(res)
        steps.append({k: res[k] for k in ("rate", "dispatched_per_s", "lag_p99_ms", "lost")})
        steps[-1]["ok"] = ok
        print(
            f"  {system}/{cfg.store} rate={rate:g}/s -> p99={res['lag_p99_ms']:.0f} ms "
            f"lost={res['lost']} {'ok' if ok else 'FAIL'}",
            file=sys.stderr,
        )
        return res, ok

    while True:
        if steps and time.monotonic() - t0 + last_step_s * 1.2 > max_time_s:
            break
        s0 = time.monotonic()
        res, ok = step(rate)
        last_step_s = time.monotonic() - s0
        if ok:
            lo = rate
            best = res
        else:
            hi = rate
        if hi == float("inf"):
            rate = lo * 2
        elif hi / max(lo, 1e-9) <= 1.15 or (lo == 0 and hi <= start_rate / 8):
            break
        else:
            rate = round((lo * hi) ** 0.5) if lo else hi / 2
    for _ in range(TIGHT_STEPS):
        tight_rate = next_tight_rate(steps)
        if tight_rate is None:
            break
        res, ok = step(tight_rate)
        if ok and tight_rate > lo:
            lo, best = tight_rate, res
    out: dict[str, Any] = dict(best) if best else {"system": system, "store": cfg.store}
    out["max_sustained_per_s"] = lo
    # No step failed inside the time bound: the figure is a floor, not the ceiling.
    out["max_is_lower_bound"] = hi == float("inf")
    # The tighter bar, read off the same steps (the last ones searched for it).
    out["max_p99_100ms_per_s"] = max(tight_rates(steps), default=0.0)
    out["find_max_steps"] = steps
    out["step_duration_s"] = cfg.duration_s
    return out


def write_results(
    path: Path, argv: list[str], side: list[dict[str, Any]], maxes: list[dict[str, Any]],
    plots: list[Path],
) -> None:  # fmt: skip
    """RESULTS.md: the regenerating command, then the tables."""
    cmd = "python benchmarks/dispatch.py " + shlex.join(argv)
    lines = [
        "# wheel dispatch benchmark results",
        "",
        "Regenerate everything on this page (tables and plots) with ONE command:",
        "",
        "```",
        cmd,
        "```",
        "",
        f"Machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}. "
        "Lag = time a worker received the run minus its scheduled time, over EVERY intended "
        "fire: fires never dispatched by the end of the window + drain are `lost` and enter "
        "the percentiles with their censored lag (run end minus scheduled time). CPU = "
        "utime+stime from /proc of the scheduler/server and worker processes over the "
        "measured window; `db cpu` adds the PostgreSQL backends serving them. "
        "The poll baseline uses LIMIT 10,000 per poll (re-polls at once on a full batch).",
        "On SQLite, `wheel` and `poll` both run `synchronous=NORMAL` in WAL mode (a commit"
        " survives a process crash, not a power loss); `wheel-durable` is wheel at its own"
        " default, `synchronous=FULL` (every commit fsynced); the `durability` column says each"
        " row's. wheel's checkpoint log is fsynced per batch in both.",
        "",
    ]
    cols = [
        ("system", "system"), ("store", "store"), ("rate", "offered/s"),
        ("dispatched_per_s", "dispatched/s"), ("completed_per_s", "completed/s"),
        ("lag_p50_ms", "p50 ms"), ("lag_p99_ms", "p99 ms"), ("lag_p999_ms", "p99.9 ms"),
        ("lag_max_ms", "max ms"), ("cpu_s_per_1k", "cpu s/1k"),
        ("db_cpu_s_per_1k", "db cpu s/1k"), ("lost", "lost"), ("duplicates", "dup"),
        ("durability", "durability"),
    ]  # fmt: skip

    def table(rows: list[dict[str, Any]], extra: list[tuple[str, str]]) -> list[str]:
        cs = extra + cols
        out = ["| " + " | ".join(c[1] for c in cs) + " |", "|" + "---|" * len(cs)]
        for r in rows:
            cells = []
            for k, _ in cs:
                v = r.get(k, "-")
                cells.append(h.fmt_num(v) if isinstance(v, float | int) and k != "rate" else str(v))
            out.append("| " + " | ".join(cells) + " |")
        return out

    if side:
        lines += ["## Side by side at a fixed offered rate", ""]
        lines += table(side, [])
        lines.append("")
    if maxes:
        lines += [
            "## Highest sustained rate (p99 lag <= 1 s, nothing lost)",
            "",
            "`--find-max`: short steps per rate, doubling then bisecting, bounded time. "
            "The columns after the first show the step at that rate.",
            "",
        ]
        lines += table(
            maxes,
            [
                ("max_sustained_per_s", "max sustained/s"),
                ("max_p99_100ms_per_s", "max step with p99 <= 100 ms"),
            ],
        )
        lines.append("")
        lines += ["Steps:", ""]
        for m in maxes:
            steps = ", ".join(
                f"{s['rate']:g}/s p99={s['lag_p99_ms']:.0f}ms{'' if s['ok'] else ' FAIL'}"
                for s in m.get("find_max_steps", [])
            )
            floor = " (no step failed within the time bound: a lower bound)"
            lines.append(
                f"- {m['system']}/{m['store']}: {steps}"
                + (floor if m.get("max_is_lower_bound") else "")
            )
        lines.append("")
    if plots:
        lines += ["## Plots", ""]
        for p in plots:
            rel = os.path.relpath(p, path.parent)
            lines.append(f"![{p.stem}]({rel})")
        lines.append("")
    path.write_text("\n".join(lines))


def plots_dir(results: Path | None, plots: Path | None) -> Path:
    """Where the PNGs go: as told, else beside the results page they belong
    to, else the untracked output folder (a one-off run must not leave files
    among the tracked plots of RESULTS.md)."""
    if plots is not None:
        return plots
    return results.parent / "plots" if results is not None else HERE / "out" / "plots"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every child process.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--system", default="poll", help="wheel|wheel-durable|poll|apscheduler, comma-separated"
    )
    p.add_argument("--store", default="sqlite", help="sqlite|postgres, comma-separated")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rate", type=float, default=200.0, help="fires per second coming due")
    p.add_argument("--duration", type=float, default=20.0, help="measured window, seconds")
    p.add_argument("--drain", type=float, default=5.0, help="seconds after the window")
    p.add_argument("--json", type=Path, help="write the result(s) here")
    p.add_argument("--find-max", action="store_true", help="ramp to the max sustained rate")
    p.add_argument("--step-duration", type=float, default=10.0, help="find-max: per rate")
    p.add_argument("--start-rate", type=float, default=250.0, help="find-max: first rate")
    p.add_argument(
        "--max-time",
        type=float,
        default=300.0,
        help="find-max: s per system for the 1 s bar, then up to 3 steps for the 100 ms bar",
    )
    p.add_argument("--recurring-fraction", type=float, default=0.5)
    p.add_argument("--period", type=float, default=2.0, help="interval jobs' period, s")
    p.add_argument("--poll-limit", type=int, default=10_000, help="poll: LIMIT per claim")
    p.add_argument("--pg-dsn", default=DEFAULT_PG)
    p.add_argument("--wheelctl", default=str(Path(PY).parent / "wheelctl"))
    # The baselines' workers take whatever their queue frames carry. A wheel
    # worker holds a run from its claim to its completion (about 100 ms at
    # 20,000/s on PostgreSQL, two commits included): 1,000 a worker capped
    # two workers near 21,000/s, below what the scheduler sustains. Near the
    # top the claim waits behind a store batch or two of up to 300 ms, and
    # 4,000 a worker held the node back again: at 17,000/s offered on
    # PostgreSQL, 15,409 dispatched/s at p99 1,718 ms against 16,834 at
    # 345 ms with 10,000.
    p.add_argument("--capacity", type=int, default=10_000, help="wheel: runs per worker")
    p.add_argument("--serve-args", default="", help="wheel: extra flags for wheelctl serve")
    p.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="wheel: a cluster of this many nodes (above 1: PostgreSQL and a local etcd;"
        " workers hold a stream to every node)",
    )
    p.add_argument("--ttl", type=int, default=5, help="wheel cluster: etcd lease TTL, s")
    p.add_argument(
        "--history",
        type=int,
        default=0,
        help="wheel, one node: finished runs 40 days old (and a fifth as many missed\n"
        "fires) put in the store before the run, for the node's retention to purge",
    )
    p.add_argument("--results", type=Path, help="write RESULTS.md (and plots) here")
    p.add_argument(
        "--plots",
        type=Path,
        help="PNG directory (default: plots/ beside --results, else benchmarks/out/plots)",
    )
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    args.plots = plots_dir(args.results, args.plots)

    systems = [s.strip() for s in args.system.split(",") if s.strip()]
    stores = [s.strip() for s in args.store.split(",") if s.strip()]
    for s in systems:
        if s not in SYSTEMS:
            p.error(f"unknown system {s!r}")
    for st in stores:
        if st not in ("sqlite", "postgres"):
            p.error(f"unknown store {st!r}")
    if args.nodes < 1:
        p.error("--nodes must be at least 1")
    if args.nodes > 1 and any(s.startswith("wheel") for s in systems) and stores != ["postgres"]:
        p.error("--nodes above 1 runs wheel on PostgreSQL only: give --store postgres")

    side: list[dict[str, Any]] = []
    maxes: list[dict[str, Any]] = []
    plots: list[Path] = []
    for store in stores:
        cfg = RunConfig(
            store=store, workers=args.workers, duration_s=args.duration, drain_s=args.drain,
            recurring_fraction=args.recurring_fraction, period_s=args.period,
            poll_limit=args.poll_limit, pg_dsn=args.pg_dsn, wheelctl=args.wheelctl,
            capacity=args.capacity, serve_args=args.serve_args, nodes=args.nodes,
            ttl_s=args.ttl, history=args.history,
        )  # fmt: skip
        if not args.find_max or args.results:
            runs: list[tuple[str, h.Workload, h.Analysis]] = []
            for system in systems:
                res, w, a = run_once(system, args.rate, cfg)
                side.append(res)
                runs.append((system, w, a))
                print(json.dumps(res), file=sys.stderr)
            if not args.no_plots:
                plots += h.plot_results(runs, args.plots, f"{store}_{args.rate:g}")
        if args.find_max:
            step_cfg = RunConfig(**{**_fields(cfg), "duration_s": args.step_duration})
            for system in systems:
                m = find_max(system, step_cfg, start_rate=args.start_rate, max_time_s=args.max_time)
                maxes.append(m)
                print(
                    f"{system}/{store}: max_sustained_per_s={m['max_sustained_per_s']:g}"
                    f" max_p99_100ms_per_s={m['max_p99_100ms_per_s']:g}",
                    file=sys.stderr,
                )

    out: Any = maxes if args.find_max else side
    if len(out) == 1:
        out = out[0]
    # The results page first: it is what a long run is for. Output folders
    # may not exist yet on a fresh checkout (benchmarks/out is not tracked).
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        write_results(args.results, argv, side, maxes, plots)
    _report.emit(out, args.json)
    return 0


def _fields(cfg: RunConfig) -> dict[str, Any]:
    return {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}


if __name__ == "__main__":
    sys.exit(main())
