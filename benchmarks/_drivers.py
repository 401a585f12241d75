"""The systems the dispatch benchmark drives, each behind one ``Driver``:
wheel (one node or a cluster, its workers), the seed's poller and
APScheduler (a scheduler process feeding queue workers), and how a run is
configured. Also what other benchmarks borrow: job submission over gRPC,
the PostgreSQL schema a run lives in, and history put in a store."""

from __future__ import annotations

import os
import secrets
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import _harness as h
from _cluster import LocalCluster, free_port

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
    # wheel: the node's tick, ms (None: the node's default).
    tick_ms: int | None = None
    # poll: ms from one poll's start to the next (the seed's 500 by default).
    poll_interval_ms: int = 500
    # Above 0: the run's jobs are this many one-shots all due at the
    # window's start (a burst), not ``rate`` fires a second.
    burst: int = 0


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
            "--poll-interval-ms", str(self.cfg.poll_interval_ms),
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
        # Serve /metrics even without history (``metrics`` says where).
        self.with_metrics = False

    def make_store(self, data: Path) -> str:
        """The one node's store: a schema of its own on PostgreSQL, a file
        in ``data`` on SQLite; its URL. Subclasses fill it first."""
        if self.cfg.store == "postgres":
            self.schema = PgSchema(self.cfg.pg_dsn, f"wheel-bench-{secrets.token_hex(4)}")
            return self.schema.dsn
        # The durability the poll baseline runs at (see poll_scheduler.py):
        # commits survive a process crash, the WAL is fsynced at checkpoints.
        # ``wheel-durable``: wheel's own default, every commit fsynced.
        store = f"sqlite:///{data / 'wheel.db'}"
        return store if self.durable else store + "?synchronous=normal"

    def serve_args(self) -> str:
        """``--serve-args``, and the tick when one was given."""
        if self.cfg.tick_ms is None:
            return self.cfg.serve_args
        return f"{self.cfg.serve_args} --tick-ms {self.cfg.tick_ms}"

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
        store = self.make_store(data)
        port = free_port()
        self.target = f"127.0.0.1:{port}"
        cmd = [self.cfg.wheelctl, "serve", "--data-dir", str(data), "--listen", self.target]
        cmd += ["--store", store, *shlex.split(self.serve_args())]
        if self.cfg.history:
            fill_history(store, self.cfg.history)
        if self.cfg.history or self.with_metrics:
            self.metrics = f"http://127.0.0.1:{free_port()}/metrics"
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
            serve_args=self.serve_args(),
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
