"""JobService over real gRPC on loopback: every bad request gets the status code
and a message naming the field (and the limit), and leaves the server's state
exactly as it was; every call works on the happy path."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from wheel.app import AppConfig, running
from wheel.engine.model import JobState
from wheel.engine.owner import OwnerConfig
from wheel.engine.spec import DEFAULT_LIMITS
from wheel.node import Node, NodeConfig
from wheel.rpc._common import MAX_MESSAGE_BYTES
from wheel.rpc.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    job_service_pb2,
    job_service_pb2_grpc,
    jobs_pb2,
)
from wheel.store.open import open_store
from wheel.worker import Permanent, RunContext, Worker

# -- a real node and gRPC server on an event loop in a thread ---------------------------


class InProcessServer:
    """A node's process (``wheel.app.running``) on its own asyncio loop in a
    thread, SQLite on disk, listening on a loopback port: real gRPC, no
    subprocess start-up cost."""

    def __init__(
        self,
        data_dir: Path,
        owner: OwnerConfig | None = None,
        *,
        store: str | None = None,
        **node_config: Any,
    ) -> None:
        """``store``: its URL (default: SQLite in ``data_dir``)."""
        self.data_dir = data_dir
        self.store = store
        self.owner = owner or OwnerConfig()
        self.node_config = node_config
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.node: Node | None = None
        self.server: Any = None
        self.port = 0
        self._stack = contextlib.AsyncExitStack()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> InProcessServer:
        self.thread.start()
        self.run(self._start(), timeout=30)
        return self

    async def _start(self) -> None:
        config = AppConfig(
            store_url=self.store or f"sqlite:///{self.data_dir / 'wheel.db'}",
            node=NodeConfig(owner=self.owner, **self.node_config),
            listen="127.0.0.1:0",
            drain_s=0.5,
        )
        app = await self._stack.enter_async_context(running(config))
        self.node, self.server, self.port = app.node, app.server, app.port

    def run(self, coro: Any, timeout: float = 10) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def call(self, fn: Callable[[], Any], timeout: float = 10) -> Any:
        """Run ``fn`` on the server's loop (the only thread that touches the owner)."""

        async def wrapper() -> Any:
            return fn()

        return self.run(wrapper(), timeout)

    def stop(self) -> None:
        try:
            self.run(self._stack.aclose(), timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


class WorkerThread:
    """The worker SDK on its own loop in a thread, connected over loopback."""

    def __init__(
        self,
        target: str,
        worker_id: str,
        *,
        options: Mapping[str, Any] | None = None,
        **handlers: Callable[[RunContext], Any],
    ):
        """``options``: more (or other) ``Worker`` keywords."""
        kw: dict[str, Any] = {"capacity": 8, "reconnect_initial": 0.05, "reconnect_max": 0.3}
        self.worker = Worker(target, worker_id=worker_id, **{**kw, **(options or {})})
        for name, fn in handlers.items():
            self.worker.register(name, fn)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.worker.run()), daemon=True)

    def __enter__(self) -> Worker:
        self.thread.start()
        wait_for(lambda: self.worker.connected, 10, "the worker to connect")
        return self.worker

    def __exit__(self, *exc: object) -> None:
        self.worker.stop()
        self.thread.join(10)


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.02
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Api:
    server: InProcessServer
    channel: grpc.Channel
    jobs: job_service_pb2_grpc.JobServiceStub
    admin: admin_service_pb2_grpc.AdminServiceStub


@contextlib.contextmanager
def connect(server: InProcessServer) -> Iterator[Api]:
    channel = grpc.insecure_channel(server.target)
    try:
        yield Api(
            server,
            channel,
            job_service_pb2_grpc.JobServiceStub(channel),
            admin_service_pb2_grpc.AdminServiceStub(channel),
        )
    finally:
        channel.close()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    server = InProcessServer(tmp_path).start()
    try:
        with connect(server) as a:
            yield a
    finally:
        server.stop()


# -- helpers ------------------------------------------------------------------------------

HOUR_MS = 3_600_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def spec(**kw: Any) -> jobs_pb2.JobSpec:
    """A valid spec: a one-shot an hour from now, unless ``kw`` says otherwise."""
    msg = jobs_pb2.JobSpec(name="job", handler="h")
    msg.schedule.once.at_ms = now_ms() + HOUR_MS
    for key, value in kw.items():
        if key == "schedule":
            msg.schedule.CopyFrom(value)
        else:
            target: Any = msg
            *path, last = key.split("__")
            for part in path:
                target = getattr(target, part)
            if isinstance(value, list | bytes) or not hasattr(getattr(target, last), "CopyFrom"):
                setattr(target, last, value)
            else:
                getattr(target, last).CopyFrom(value)
    return msg


def once(at_ms: int) -> jobs_pb2.Schedule:
    return jobs_pb2.Schedule(once=jobs_pb2.OnceSchedule(at_ms=at_ms))


def cron(expr: str, tz: str = "", **kw: Any) -> jobs_pb2.Schedule:
    return jobs_pb2.Schedule(cron=jobs_pb2.CronSchedule(expr=expr, time_zone=tz, **kw))


def every(period_ms: int, start_at_ms: int = 0, **kw: Any) -> jobs_pb2.Schedule:
    return jobs_pb2.Schedule(
        interval=jobs_pb2.IntervalSchedule(period_ms=period_ms, start_at_ms=start_at_ms, **kw)
    )


def submit(api: Api, msg: jobs_pb2.JobSpec, key: str = "") -> job_service_pb2.SubmitJobResponse:
    return api.jobs.SubmitJob(  # type: ignore[no-any-return]
        job_service_pb2.SubmitJobRequest(spec=msg, idempotency_key=key), timeout=10
    )


def all_runs(api: Api, job_id: int, page_size: int = 0, **kw: Any) -> list[jobs_pb2.Run]:
    out: list[jobs_pb2.Run] = []
    token = ""
    while True:
        resp = api.jobs.ListRuns(
            job_service_pb2.ListRunsRequest(
                job_id=job_id, page_size=page_size, page_token=token, **kw
            ),
            timeout=10,
        )
        out.extend(resp.runs)
        token = resp.next_page_token
        if not token:
            return out


def all_jobs(api: Api, page_size: int = 0, **kw: Any) -> list[jobs_pb2.Job]:
    out: list[jobs_pb2.Job] = []
    token = ""
    while True:
        resp = api.jobs.ListJobs(
            job_service_pb2.ListJobsRequest(page_size=page_size, page_token=token, **kw),
            timeout=10,
        )
        out.extend(resp.jobs)
        token = resp.next_page_token
        if not token:
            return out


def state_of(api: Api) -> tuple[Any, ...]:
    """Everything a client can see: jobs, each job's runs and missed fires, and
    the node's counters."""
    jobs = all_jobs(api)
    runs = {j.job_id: all_runs(api, j.job_id) for j in jobs}
    details = {
        j.job_id: api.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=j.job_id), timeout=10)
        for j in jobs
    }
    st = api.admin.GetClusterStatus(admin_service_pb2.GetClusterStatusRequest(), timeout=10)
    counters = (
        st.jobs,
        st.pending_timers,
        st.in_flight,
        st.backlog,
        st.dispatched_total,
    )
    return jobs, runs, details, counters


RUN_STATE = {v: k.removeprefix("RUN_STATE_").lower() for k, v in jobs_pb2.RunState.items()}


# -- the table of bad requests -------------------------------------------------------------


@dataclass(frozen=True)
class Fixed:
    """Jobs the table's requests refer to."""

    active: int
    paused: int
    cancelled: int
    every_second: int
    tenant: str
    key: str


@pytest.fixture(scope="module")
def table_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Fixed]]:
    server = InProcessServer(tmp_path_factory.mktemp("api-table")).start()
    try:
        with connect(server) as api:
            t = now_ms()
            active = submit(api, spec(name="active", tenant="t1"), key="k1").job.job_id
            paused = submit(api, spec(name="paused", schedule=every(60_000))).job.job_id
            api.jobs.PauseJob(job_service_pb2.JobRef(job_id=paused), timeout=10)
            cancelled = submit(api, spec(name="cancelled")).job.job_id
            api.jobs.CancelJob(job_service_pb2.JobRef(job_id=cancelled), timeout=10)
            every_second = submit(api, spec(name="cron", schedule=cron("* * * * * *"))).job.job_id
            # No worker is connected, so the cron job's fires pile up; pause it
            # so the state stays still while the table runs.
            api.jobs.PauseJob(job_service_pb2.JobRef(job_id=every_second), timeout=10)
            # A past one-shot with catch-up "skip": a missed record in the history.
            skipped = submit(
                api,
                spec(
                    name="skipped",
                    schedule=once(t - 60_000),
                    catch_up=jobs_pb2.CatchUp(mode=jobs_pb2.CATCH_UP_MODE_SKIP),
                ),
            ).job.job_id
            wait_for(lambda: all_runs(api, skipped), 10, "the skipped fire to be recorded")
            # Let the node's periodic re-read of changed jobs pass, so the
            # table compares a state at rest.
            before = state_of(api)
            while True:
                time.sleep(1.2)
                after = state_of(api)
                if after == before:
                    break
                before = after
            yield (
                api,
                Fixed(
                    active=active,
                    paused=paused,
                    cancelled=cancelled,
                    every_second=every_second,
                    tenant="t1",
                    key="k1",
                ),
            )
    finally:
        server.stop()


Row = tuple[str, str, Callable[[Fixed], Any], grpc.StatusCode, list[str]]
INVALID = grpc.StatusCode.INVALID_ARGUMENT
L = DEFAULT_LIMITS
UNKNOWN_JOB = 987_654_321


def _submit(**kw: Any) -> Callable[[Fixed], Any]:
    key = kw.pop("key", "")
    return lambda f: job_service_pb2.SubmitJobRequest(spec=spec(**kw), idempotency_key=key)


def _ref(pick: Callable[[Fixed], int]) -> Callable[[Fixed], Any]:
    return lambda f: job_service_pb2.JobRef(job_id=pick(f))


BAD_REQUESTS: list[Row] = [
    # SubmitJob: the spec, field by field.
    ("no spec", "SubmitJob", lambda f: job_service_pb2.SubmitJobRequest(), INVALID, ["spec"]),
    ("empty name", "SubmitJob", _submit(name=""), INVALID, ["spec.name", "empty"]),
    (
        "name too long",
        "SubmitJob",
        _submit(name="n" * (L.max_name_len + 1)),
        INVALID,
        ["spec.name", str(L.max_name_len)],
    ),
    ("empty handler", "SubmitJob", _submit(handler=""), INVALID, ["spec.handler", "empty"]),
    (
        "handler too long",
        "SubmitJob",
        _submit(handler="h" * (L.max_handler_len + 1)),
        INVALID,
        ["spec.handler", str(L.max_handler_len)],
    ),
    (
        "tenant too long",
        "SubmitJob",
        _submit(tenant="t" * (L.max_tenant_len + 1)),
        INVALID,
        ["spec.tenant", str(L.max_tenant_len)],
    ),
    (
        "pool too long",
        "SubmitJob",
        _submit(pool="p" * (L.max_pool_len + 1)),
        INVALID,
        ["spec.pool", str(L.max_pool_len)],
    ),
    (
        "payload over the limit",
        "SubmitJob",
        _submit(payload=b"x" * (L.max_payload_bytes + 1)),
        INVALID,
        ["spec.payload", str(L.max_payload_bytes)],
    ),
    (
        "message over the gRPC limit",
        "SubmitJob",
        _submit(payload=b"x" * (65 * 1024 * 1024)),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        [str(MAX_MESSAGE_BYTES)],
    ),
    (
        "no schedule",
        "SubmitJob",
        lambda f: job_service_pb2.SubmitJobRequest(spec=jobs_pb2.JobSpec(name="n", handler="h")),
        INVALID,
        ["spec.schedule", "once, cron or interval"],
    ),
    (
        "negative one-shot time",
        "SubmitJob",
        _submit(schedule=once(-5)),
        INVALID,
        ["spec.schedule.once.at_ms"],
    ),
    (
        "one-shot beyond the horizon",
        "SubmitJob",
        lambda f: job_service_pb2.SubmitJobRequest(
            spec=spec(schedule=once(now_ms() + L.max_horizon_ms + HOUR_MS))
        ),
        INVALID,
        ["spec.schedule.once.at_ms", str(L.max_horizon_ms)],
    ),
    (
        "interval start beyond the horizon",
        "SubmitJob",
        lambda f: job_service_pb2.SubmitJobRequest(
            spec=spec(schedule=every(1000, now_ms() + L.max_horizon_ms + HOUR_MS))
        ),
        INVALID,
        ["spec.schedule.interval.start_at_ms", str(L.max_horizon_ms)],
    ),
    (
        "zero interval",
        "SubmitJob",
        _submit(schedule=every(0)),
        INVALID,
        ["spec.schedule.interval.period_ms"],
    ),
    (
        "negative interval",
        "SubmitJob",
        _submit(schedule=every(-1000)),
        INVALID,
        ["spec.schedule.interval.period_ms"],
    ),
    (
        "interval over the horizon",
        "SubmitJob",
        _submit(schedule=every(L.max_horizon_ms + 1)),
        INVALID,
        ["spec.schedule.interval.period_ms", str(L.max_horizon_ms)],
    ),
    (
        "unknown interval mode",
        "SubmitJob",
        _submit(schedule=every(1000, mode=9)),
        INVALID,
        ["spec.schedule.interval.mode", "9"],
    ),
    (
        "cron syntax",
        "SubmitJob",
        _submit(schedule=cron("61 * * * *")),
        INVALID,
        ["spec.schedule.cron.expr"],
    ),
    (
        "cron with too many fields",
        "SubmitJob",
        _submit(schedule=cron("* * * * * * * *")),
        INVALID,
        ["spec.schedule.cron.expr"],
    ),
    (
        "cron that never fires",
        "SubmitJob",
        _submit(schedule=cron("0 0 30 2 *")),
        INVALID,
        ["spec.schedule.cron.expr", "never"],
    ),
    (
        "cron too long",
        "SubmitJob",
        _submit(schedule=cron("0 " + ",".join(["1"] * 150) + " * * *")),
        INVALID,
        ["spec.schedule.cron.expr", "200"],
    ),
    (
        "unknown time zone",
        "SubmitJob",
        _submit(schedule=cron("* * * * *", tz="Mars/Olympus_Mons")),
        INVALID,
        ["spec.schedule.cron.time_zone", "Mars/Olympus_Mons"],
    ),
    (
        "unknown dst_gap",
        "SubmitJob",
        _submit(schedule=cron("* * * * *", dst_gap=7)),
        INVALID,
        ["spec.schedule.cron.dst_gap", "7"],
    ),
    (
        "unknown dst_fold",
        "SubmitJob",
        _submit(schedule=cron("* * * * *", dst_fold=7)),
        INVALID,
        ["spec.schedule.cron.dst_fold", "7"],
    ),
    (
        "negative jitter",
        "SubmitJob",
        _submit(jitter_ms=-1),
        INVALID,
        ["spec.jitter_ms"],
    ),
    (
        "jitter over the limit",
        "SubmitJob",
        _submit(jitter_ms=L.max_jitter_ms + 1),
        INVALID,
        ["spec.jitter_ms", str(L.max_jitter_ms)],
    ),
    (
        "negative timeout",
        "SubmitJob",
        _submit(timeout_ms=-1),
        INVALID,
        ["spec.timeout_ms"],
    ),
    (
        "timeout over the limit",
        "SubmitJob",
        _submit(timeout_ms=L.max_timeout_ms + 1),
        INVALID,
        ["spec.timeout_ms", str(L.max_timeout_ms)],
    ),
    (
        "unknown catch-up mode",
        "SubmitJob",
        _submit(catch_up=jobs_pb2.CatchUp(mode=42)),  # type: ignore[arg-type]
        INVALID,
        ["spec.catch_up.mode", "42"],
    ),
    (
        "negative catch-up window",
        "SubmitJob",
        _submit(catch_up=jobs_pb2.CatchUp(window_ms=-1)),
        INVALID,
        ["spec.catch_up.window_ms"],
    ),
    (
        "catch-up count over the limit",
        "SubmitJob",
        _submit(catch_up=jobs_pb2.CatchUp(max_count=L.max_catch_up_count + 1)),
        INVALID,
        ["spec.catch_up.max_count", str(L.max_catch_up_count)],
    ),
    (
        "unknown overlap policy",
        "SubmitJob",
        _submit(overlap=jobs_pb2.Overlap(policy=17)),  # type: ignore[arg-type]
        INVALID,
        ["spec.overlap.policy", "17"],
    ),
    (
        "negative max_concurrent",
        "SubmitJob",
        _submit(overlap=jobs_pb2.Overlap(max_concurrent=-2)),
        INVALID,
        ["spec.overlap.max_concurrent"],
    ),
    (
        "negative max_buffered",
        "SubmitJob",
        _submit(overlap=jobs_pb2.Overlap(max_buffered=-2)),
        INVALID,
        ["spec.overlap.max_buffered"],
    ),
    (
        "attempts over the limit",
        "SubmitJob",
        _submit(retry=jobs_pb2.RetryPolicy(max_attempts=L.max_attempts + 1)),
        INVALID,
        ["spec.retry.max_attempts", str(L.max_attempts)],
    ),
    (
        "negative attempts",
        "SubmitJob",
        _submit(retry=jobs_pb2.RetryPolicy(max_attempts=-1)),
        INVALID,
        ["spec.retry.max_attempts"],
    ),
    (
        "multiplier below one",
        "SubmitJob",
        _submit(retry=jobs_pb2.RetryPolicy(multiplier=0.5)),
        INVALID,
        ["spec.retry.multiplier"],
    ),
    (
        "max backoff below initial",
        "SubmitJob",
        _submit(retry=jobs_pb2.RetryPolicy(initial_backoff_ms=5000, max_backoff_ms=10)),
        INVALID,
        ["spec.retry.max_backoff_ms"],
    ),
    (
        "unknown side-effect class",
        "SubmitJob",
        _submit(side_effect=5),
        INVALID,
        ["spec.side_effect", "5"],
    ),
    (
        "idempotency key too long",
        "SubmitJob",
        _submit(key="k" * 201),
        INVALID,
        ["idempotency_key", "200"],
    ),
    (
        "idempotency key reused with another body",
        "SubmitJob",
        lambda f: job_service_pb2.SubmitJobRequest(
            spec=spec(name="another body", tenant=f.tenant), idempotency_key=f.key
        ),
        grpc.StatusCode.ALREADY_EXISTS,
        ["idempotency key", "k1", "different"],
    ),
    # GetJob
    (
        "get job 0",
        "GetJob",
        lambda f: job_service_pb2.GetJobRequest(job_id=0),
        INVALID,
        ["job_id"],
    ),
    (
        "get a negative job id",
        "GetJob",
        lambda f: job_service_pb2.GetJobRequest(job_id=-3),
        INVALID,
        ["job_id"],
    ),
    (
        "get an unknown job",
        "GetJob",
        lambda f: job_service_pb2.GetJobRequest(job_id=UNKNOWN_JOB),
        grpc.StatusCode.NOT_FOUND,
        [str(UNKNOWN_JOB)],
    ),
    (
        "too many next fires",
        "GetJob",
        lambda f: job_service_pb2.GetJobRequest(job_id=f.active, next_fires=101),
        INVALID,
        ["next_fires", "100"],
    ),
    (
        "negative recent runs",
        "GetJob",
        lambda f: job_service_pb2.GetJobRequest(job_id=f.active, recent_runs=-1),
        INVALID,
        ["recent_runs", "100"],
    ),
    # ListJobs
    (
        "list page too large",
        "ListJobs",
        lambda f: job_service_pb2.ListJobsRequest(page_size=1001),
        INVALID,
        ["page_size", "1000"],
    ),
    (
        "list negative page",
        "ListJobs",
        lambda f: job_service_pb2.ListJobsRequest(page_size=-1),
        INVALID,
        ["page_size"],
    ),
    (
        "list forged token",
        "ListJobs",
        lambda f: job_service_pb2.ListJobsRequest(page_token="not-a-token"),
        INVALID,
        ["page_token"],
    ),
    (
        "list negative token",
        "ListJobs",
        lambda f: job_service_pb2.ListJobsRequest(page_token="-7"),
        INVALID,
        ["page_token"],
    ),
    (
        "list unknown state",
        "ListJobs",
        lambda f: job_service_pb2.ListJobsRequest(state=99),  # type: ignore[arg-type]
        INVALID,
        ["state", "99"],
    ),
    # Cancel / pause / resume / trigger
    *[
        (f"{m} job 0", m, _ref(lambda f: 0), INVALID, ["job_id"])
        for m in ("CancelJob", "PauseJob", "ResumeJob", "TriggerJob")
    ],
    *[
        (f"{m} unknown job", m, _ref(lambda f: UNKNOWN_JOB), grpc.StatusCode.NOT_FOUND, [])
        for m in ("CancelJob", "PauseJob", "ResumeJob", "TriggerJob")
    ],
    (
        "pause a cancelled job",
        "PauseJob",
        _ref(lambda f: f.cancelled),
        grpc.StatusCode.FAILED_PRECONDITION,
        ["cancelled"],
    ),
    (
        "resume a cancelled job",
        "ResumeJob",
        _ref(lambda f: f.cancelled),
        grpc.StatusCode.FAILED_PRECONDITION,
        ["cancelled"],
    ),
    (
        "trigger a paused job",
        "TriggerJob",
        _ref(lambda f: f.paused),
        grpc.StatusCode.FAILED_PRECONDITION,
        ["paused"],
    ),
    (
        "trigger a cancelled job",
        "TriggerJob",
        _ref(lambda f: f.cancelled),
        grpc.StatusCode.FAILED_PRECONDITION,
        ["cancelled"],
    ),
    # BackfillJob
    (
        "backfill an empty range",
        "BackfillJob",
        lambda f: job_service_pb2.BackfillJobRequest(
            job_id=f.active, from_ms=now_ms() - 1000, to_ms=now_ms() - 1000
        ),
        INVALID,
        ["to_ms", "from_ms"],
    ),
    (
        "backfill the future",
        "BackfillJob",
        lambda f: job_service_pb2.BackfillJobRequest(
            job_id=f.active, from_ms=now_ms() - 1000, to_ms=now_ms() + HOUR_MS
        ),
        INVALID,
        ["to_ms"],
    ),
    (
        "backfill from before the epoch",
        "BackfillJob",
        lambda f: job_service_pb2.BackfillJobRequest(
            job_id=f.active, from_ms=-(2**62), to_ms=now_ms() - 1000
        ),
        INVALID,
        ["from_ms"],
    ),
    (
        "backfill job 0",
        "BackfillJob",
        lambda f: job_service_pb2.BackfillJobRequest(job_id=0, from_ms=1, to_ms=2),
        INVALID,
        ["job_id"],
    ),
    (
        "backfill an unknown job",
        "BackfillJob",
        lambda f: job_service_pb2.BackfillJobRequest(job_id=UNKNOWN_JOB, from_ms=1, to_ms=2),
        grpc.StatusCode.NOT_FOUND,
        [],
    ),
    (
        "backfill a paused job",
        "BackfillJob",
        lambda f: job_service_pb2.BackfillJobRequest(
            job_id=f.paused, from_ms=now_ms() - HOUR_MS, to_ms=now_ms() - 1000
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        ["paused"],
    ),
    (
        "backfill too many fires",
        "BackfillJob",
        lambda f: job_service_pb2.BackfillJobRequest(
            job_id=f.every_second, from_ms=now_ms() - 3 * HOUR_MS, to_ms=now_ms() - 1000
        ),
        grpc.StatusCode.RESOURCE_EXHAUSTED,  # the limit is checked before the job's state
        [str(L.max_backfill_fires)],
    ),
    # ListRuns
    (
        "runs of job 0",
        "ListRuns",
        lambda f: job_service_pb2.ListRunsRequest(job_id=0),
        INVALID,
        ["job_id"],
    ),
    (
        "runs of an unknown job",
        "ListRuns",
        lambda f: job_service_pb2.ListRunsRequest(job_id=UNKNOWN_JOB),
        grpc.StatusCode.NOT_FOUND,
        [],
    ),
    (
        "runs page too large",
        "ListRuns",
        lambda f: job_service_pb2.ListRunsRequest(job_id=f.active, page_size=5000),
        INVALID,
        ["page_size", "1000"],
    ),
    (
        "runs forged token",
        "ListRuns",
        lambda f: job_service_pb2.ListRunsRequest(job_id=f.active, page_token="1:2:3"),
        INVALID,
        ["page_token"],
    ),
    (
        "runs negative token",
        "ListRuns",
        lambda f: job_service_pb2.ListRunsRequest(job_id=f.active, page_token="-1:-1"),
        INVALID,
        ["page_token"],
    ),
    (
        "runs unknown state filter",
        "ListRuns",
        lambda f: job_service_pb2.ListRunsRequest(job_id=f.active, states=[55]),  # type: ignore[list-item]
        INVALID,
        ["states", "55"],
    ),
    # UpdateJob: an unknown job, a bad spec (named like a submit's), a finished job.
    (
        "update of an unknown job",
        "UpdateJob",
        lambda f: job_service_pb2.UpdateJobRequest(
            job_id=UNKNOWN_JOB, spec=spec(schedule=cron("* * * * *")), fields=["schedule"]
        ),
        grpc.StatusCode.NOT_FOUND,
        [str(UNKNOWN_JOB)],
    ),
    (
        "update to a bad cron",
        "UpdateJob",
        lambda f: job_service_pb2.UpdateJobRequest(
            job_id=f.active, spec=spec(schedule=cron("61 * * * *")), fields=["schedule"]
        ),
        INVALID,
        ["spec.schedule.cron.expr"],
    ),
    (
        "update to a bad time zone",
        "UpdateJob",
        lambda f: job_service_pb2.UpdateJobRequest(
            job_id=f.paused, spec=spec(schedule=cron("* * * * *", "Mars/Olympus")), fields=[]
        ),
        INVALID,
        ["spec.schedule.cron.time_zone"],
    ),
    (
        "update to an empty name",
        "UpdateJob",
        lambda f: job_service_pb2.UpdateJobRequest(job_id=f.active, spec=spec(name="")),
        INVALID,
        ["spec.name"],
    ),
    (
        "update of an unknown field",
        "UpdateJob",
        lambda f: job_service_pb2.UpdateJobRequest(job_id=f.active, spec=spec(), fields=["tenant"]),
        INVALID,
        ["fields", "tenant"],
    ),
    (
        "update of a cancelled job",
        "UpdateJob",
        lambda f: job_service_pb2.UpdateJobRequest(
            job_id=f.cancelled, spec=spec(name="again"), fields=["name"]
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        ["cancelled"],
    ),
    (
        "update of job 0",
        "UpdateJob",
        lambda f: job_service_pb2.UpdateJobRequest(job_id=0, spec=spec()),
        INVALID,
        ["job_id"],
    ),
    (
        "updates of an unknown job",
        "ListJobUpdates",
        lambda f: job_service_pb2.ListJobUpdatesRequest(job_id=UNKNOWN_JOB),
        grpc.StatusCode.NOT_FOUND,
        [],
    ),
    # PreviewSchedule
    (
        "preview of nothing",
        "PreviewSchedule",
        lambda f: job_service_pb2.PreviewScheduleRequest(count=3),
        INVALID,
        ["source"],
    ),
    (
        "preview of a bad cron",
        "PreviewSchedule",
        lambda f: job_service_pb2.PreviewScheduleRequest(schedule=cron("* * *")),
        INVALID,
        ["spec.schedule.cron.expr"],
    ),
    (
        "preview of too many fires",
        "PreviewSchedule",
        lambda f: job_service_pb2.PreviewScheduleRequest(job_id=f.active, count=5000),
        INVALID,
        ["count", "1000"],
    ),
    (
        "preview of an unknown job",
        "PreviewSchedule",
        lambda f: job_service_pb2.PreviewScheduleRequest(job_id=UNKNOWN_JOB),
        grpc.StatusCode.NOT_FOUND,
        [],
    ),
    # Dead letters
    (
        "dead letters of an unknown job",
        "ListDeadLetters",
        lambda f: job_service_pb2.ListDeadLettersRequest(job_id=UNKNOWN_JOB),
        grpc.StatusCode.NOT_FOUND,
        [],
    ),
    (
        "dead letters forged token",
        "ListDeadLetters",
        lambda f: job_service_pb2.ListDeadLettersRequest(page_token="x"),
        INVALID,
        ["page_token"],
    ),
    (
        "redrive of an unknown job",
        "RedriveDeadLetters",
        lambda f: job_service_pb2.RedriveDeadLettersRequest(job_id=UNKNOWN_JOB),
        grpc.StatusCode.NOT_FOUND,
        [],
    ),
    (
        "redrive of an unknown run",
        "RedriveDeadLetters",
        lambda f: job_service_pb2.RedriveDeadLettersRequest(job_id=f.active, run_id=UNKNOWN_JOB),
        grpc.StatusCode.NOT_FOUND,
        [str(UNKNOWN_JOB)],
    ),
]


@pytest.mark.parametrize(
    ("method", "make", "code", "fragments"),
    [pytest.param(*row[1:], id=row[0]) for row in BAD_REQUESTS],
)
def test_a_bad_request_gets_its_status_and_changes_nothing(
    table_api: tuple[Api, Fixed],
    method: str,
    make: Callable[[Fixed], Any],
    code: grpc.StatusCode,
    fragments: list[str],
) -> None:
    api, fixed = table_api
    before = state_of(api)
    with pytest.raises(grpc.RpcError) as info:
        getattr(api.jobs, method)(make(fixed), timeout=10)
    err = info.value
    assert err.code() == code, err.details()
    for fragment in fragments:
        assert fragment in err.details(), (fragment, err.details())
    assert state_of(api) == before


def test_backfill_over_the_fire_limit_is_resource_exhausted_and_changes_nothing(
    api: Api,
) -> None:
    job = submit(api, spec(schedule=cron("* * * * * *"))).job.job_id
    before = all_runs(api, job)
    t = now_ms()
    with pytest.raises(grpc.RpcError) as info:
        api.jobs.BackfillJob(
            job_service_pb2.BackfillJobRequest(job_id=job, from_ms=t - 3 * HOUR_MS, to_ms=t - 1),
            timeout=10,
        )
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(L.max_backfill_fires) in info.value.details()
    assert all_runs(api, job) == before


def test_bad_requests_do_not_disturb_another_client(api: Api) -> None:
    """A client sending garbage as fast as it can; another submits and reads."""
    stop = threading.Event()
    errors: list[grpc.StatusCode] = []

    def abuse() -> None:
        with grpc.insecure_channel(api.server.target) as ch:
            stub = job_service_pb2_grpc.JobServiceStub(ch)
            while not stop.is_set():
                try:
                    stub.SubmitJob(job_service_pb2.SubmitJobRequest(spec=spec(name="")), timeout=5)
                except grpc.RpcError as exc:
                    errors.append(exc.code())

    threads = [threading.Thread(target=abuse) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        ids = [submit(api, spec(name=f"good-{i}")).job.job_id for i in range(20)]
        assert len(set(ids)) == 20
        for job_id in ids:
            got = api.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=job_id), timeout=10)
            assert got.spec.name.startswith("good-")
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert errors and set(errors) == {grpc.StatusCode.INVALID_ARGUMENT}
    assert {j.spec.name for j in all_jobs(api)} == {f"good-{i}" for i in range(20)}


# -- the happy path of every call ----------------------------------------------------------


def test_submit_every_kind_of_job_and_read_it_back(api: Api) -> None:
    t = now_ms()
    full = spec(
        name="full",
        tenant="acme",
        handler="report",
        payload=b"\x00\x01payload",
        schedule=cron("0 */5 * * * *", tz="Europe/Paris"),
        jitter_ms=250,
        catch_up=jobs_pb2.CatchUp(
            mode=jobs_pb2.CATCH_UP_MODE_RUN_ALL, window_ms=60_000, max_count=7
        ),
        overlap=jobs_pb2.Overlap(policy=jobs_pb2.OVERLAP_POLICY_ALLOW, max_concurrent=3),
        retry=jobs_pb2.RetryPolicy(
            max_attempts=4, initial_backoff_ms=200, max_backoff_ms=5000, multiplier=3.0
        ),
        timeout_ms=45_000,
        side_effect=jobs_pb2.SIDE_EFFECT_AT_MOST_ONCE,
        pool="reports",
    )
    resp = submit(api, full, key="report-1")
    assert resp.created
    job = resp.job
    assert job.state == jobs_pb2.JOB_STATE_ACTIVE
    for name in ("name", "tenant", "handler", "payload", "jitter_ms", "timeout_ms", "pool"):
        assert getattr(job.spec, name) == getattr(full, name), name
    assert job.spec.side_effect == jobs_pb2.SIDE_EFFECT_AT_MOST_ONCE
    assert job.spec.catch_up == full.catch_up
    assert job.spec.overlap.policy == jobs_pb2.OVERLAP_POLICY_ALLOW
    assert job.spec.overlap.max_concurrent == 3
    assert job.spec.retry == full.retry
    assert job.spec.schedule.cron.time_zone == "Europe/Paris"
    # The same key and body: the same job, not a second one.
    again = submit(api, full, key="report-1")
    assert not again.created and again.job.job_id == job.job_id
    # The same key in another tenant is another job.
    other = jobs_pb2.JobSpec()
    other.CopyFrom(full)
    other.tenant = "other"
    assert submit(api, other, key="report-1").job.job_id != job.job_id

    got = api.jobs.GetJob(
        job_service_pb2.GetJobRequest(job_id=job.job_id, next_fires=12), timeout=10
    )
    assert len(got.next_fires_ms) == 12
    assert got.next_fires_ms == sorted(got.next_fires_ms)
    assert all(f > t for f in got.next_fires_ms)
    # Every five minutes, give or take the jitter of 250 ms.
    gaps = [b - a for a, b in zip(got.next_fires_ms, got.next_fires_ms[1:], strict=False)]
    assert all(abs(g - 300_000) <= 250 for g in gaps), gaps

    one = submit(api, spec(name="once", schedule=once(t + HOUR_MS))).job
    assert one.next_fire_ms == t + HOUR_MS
    assert list(
        api.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=one.job_id), timeout=10).next_fires_ms
    ) == [t + HOUR_MS]
    interval = submit(
        api,
        spec(
            name="interval",
            schedule=every(90_000, t + 10_000, mode=jobs_pb2.INTERVAL_MODE_FIXED_RATE),
        ),
    ).job
    fires = api.jobs.GetJob(
        job_service_pb2.GetJobRequest(job_id=interval.job_id, next_fires=3), timeout=10
    ).next_fires_ms
    assert list(fires) == [t + 10_000, t + 100_000, t + 190_000]


def test_an_idempotent_retry_of_an_interval_without_a_start_returns_the_same_job(
    api: Api,
) -> None:
    """``start_at_ms`` 0 means "now + period" on the server; a client retrying
    the identical request must get the job it already created."""
    msg = spec(name="every", schedule=every(60_000))
    first = submit(api, msg, key="every-1")
    time.sleep(0.01)
    again = submit(api, msg, key="every-1")
    assert first.created and not again.created
    assert again.job.job_id == first.job.job_id
    # A different body under the same key is still a conflict.
    with pytest.raises(grpc.RpcError) as err:
        submit(api, spec(name="every", schedule=every(30_000)), key="every-1")
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS


def test_list_jobs_pages_and_filters(api: Api) -> None:
    made: dict[str, list[int]] = {"a": [], "b": []}
    for i in range(7):
        tenant = "a" if i % 2 == 0 else "b"
        made[tenant].append(submit(api, spec(name=f"j{i}", tenant=tenant)).job.job_id)
    api.jobs.PauseJob(job_service_pb2.JobRef(job_id=made["a"][0]), timeout=10)

    first = api.jobs.ListJobs(job_service_pb2.ListJobsRequest(page_size=3), timeout=10)
    assert len(first.jobs) == 3 and first.next_page_token
    paged = all_jobs(api, page_size=3)
    assert [j.job_id for j in paged] == sorted(made["a"] + made["b"])
    assert [j.job_id for j in all_jobs(api, page_size=2, tenant="a")] == made["a"]
    paused = all_jobs(api, state=jobs_pb2.JOB_STATE_PAUSED)
    assert [j.job_id for j in paused] == [made["a"][0]]
    active_b = all_jobs(api, tenant="b", state=jobs_pb2.JOB_STATE_ACTIVE, page_size=1)
    assert [j.job_id for j in active_b] == made["b"]
    assert all_jobs(api, tenant="nobody") == []


def test_cancel_pause_resume_trigger_backfill_and_runs(api: Api) -> None:
    ran: list[tuple[int, int, bytes]] = []

    def ok(ctx: RunContext) -> None:
        ran.append((ctx.job_id, ctx.scheduled_for_ms, ctx.payload))

    def boom(ctx: RunContext) -> None:
        raise Permanent("no such report")

    with WorkerThread(api.server.target, "w-happy", ok=ok, boom=boom):
        t = now_ms()
        # A minutely job far from its next fire: trigger and backfill run it now.
        job = submit(
            api,
            spec(
                name="minutely",
                handler="ok",
                payload=b"p",
                schedule=every(60_000, t - 59_000 * 10 - 1),
            ),
        ).job.job_id
        trig = api.jobs.TriggerJob(job_service_pb2.JobRef(job_id=job), timeout=10)
        assert trig.job_id == job and trig.scheduled_for_ms >= t
        assert trig.idempotency_key == f"{job}:{trig.scheduled_for_ms}"
        wait_for(lambda: any(sf == trig.scheduled_for_ms for _, sf, _ in ran), 10, "trigger run")

        history = {r.scheduled_for_ms for r in all_runs(api, job)}
        start = t - 59_000 * 10 - 1
        back = api.jobs.BackfillJob(
            job_service_pb2.BackfillJobRequest(job_id=job, from_ms=start, to_ms=t), timeout=10
        )
        expected = [start + k * 60_000 for k in range(10) if start + k * 60_000 < t]
        assert back.scheduled + back.skipped_existing == len(expected)
        assert sorted(back.scheduled_for_ms) == sorted(set(expected) - history)
        wait_for(
            lambda: set(expected) <= {sf for _, sf, _ in ran}, 10, "every backfilled fire to run"
        )
        # Backfilling again schedules nothing: history deduplicates by fire.
        again = api.jobs.BackfillJob(
            job_service_pb2.BackfillJobRequest(job_id=job, from_ms=start, to_ms=t), timeout=10
        )
        assert again.scheduled == 0 and again.skipped_existing == len(expected)
        # A handler's return is seen here before its completion reaches the
        # store (a worker sends completions a few ms later, batched).
        runs = wait_for(
            lambda: (
                (rs := all_runs(api, job))
                and all(RUN_STATE[r.state] == "succeeded" for r in rs if r.run_id)
                and rs
            ),
            10,
            "every run to be recorded succeeded",
        )
        assert sorted(r.scheduled_for_ms for r in runs if r.run_id) == sorted(
            {sf for _, sf, _ in ran}
        )
        assert all(RUN_STATE[r.state] == "succeeded" for r in runs if r.run_id)
        assert all(r.idempotency_key == f"{job}:{r.scheduled_for_ms}" for r in runs)
        # Newest fire first (the trigger's fire, now, before the backfilled
        # older fires claimed after it), and the state filter works.
        places = [(r.scheduled_for_ms, r.attempt) for r in runs]
        assert places == sorted(places, reverse=True)
        assert all_runs(api, job, states=[jobs_pb2.RUN_STATE_FAILED]) == []
        # Paging with a page of 2 yields the same list.
        assert all_runs(api, job, page_size=2) == runs
        got = api.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=job, recent_runs=3), timeout=10)
        assert len(got.recent_runs) == 3

        # Pause: nothing fires; resume: from now, no burst.
        paused = api.jobs.PauseJob(job_service_pb2.JobRef(job_id=job), timeout=10)
        assert paused.state == jobs_pb2.JOB_STATE_PAUSED
        assert api.jobs.PauseJob(job_service_pb2.JobRef(job_id=job), timeout=10).state == (
            jobs_pb2.JOB_STATE_PAUSED
        )
        resumed = api.jobs.ResumeJob(job_service_pb2.JobRef(job_id=job), timeout=10)
        assert resumed.state == jobs_pb2.JOB_STATE_ACTIVE
        assert resumed.next_fire_ms > now_ms() - 1000

        # Dead letters and missed fires are listed with the runs.
        dead = submit(
            api,
            spec(
                name="dead",
                handler="boom",
                schedule=once(now_ms()),
                retry=jobs_pb2.RetryPolicy(max_attempts=2),
            ),
        ).job.job_id
        wait_for(
            lambda: [RUN_STATE[r.state] for r in all_runs(api, dead)] == ["dead_lettered"],
            10,
            "the dead letter",
        )
        assert "no such report" in all_runs(api, dead)[0].error
        dl = all_runs(api, dead, states=[jobs_pb2.RUN_STATE_DEAD_LETTERED])
        assert len(dl) == 1
        skipped = submit(
            api,
            spec(
                name="skipped",
                handler="ok",
                schedule=once(now_ms() - 60_000),
                catch_up=jobs_pb2.CatchUp(mode=jobs_pb2.CATCH_UP_MODE_SKIP),
            ),
        ).job.job_id
        missed = wait_for(lambda: all_runs(api, skipped), 10, "the skipped fire")
        assert [(RUN_STATE[r.state], r.missed_reason, r.run_id) for r in missed] == [
            ("missed", "skipped", 0)
        ]
        assert all_runs(api, skipped, states=[jobs_pb2.RUN_STATE_MISSED]) == missed
        assert all_runs(api, skipped, states=[jobs_pb2.RUN_STATE_SUCCEEDED]) == []

        # Cancel is idempotent.
        c1 = api.jobs.CancelJob(job_service_pb2.JobRef(job_id=job), timeout=10)
        c2 = api.jobs.CancelJob(job_service_pb2.JobRef(job_id=job), timeout=10)
        assert c1.state == c2.state == jobs_pb2.JOB_STATE_CANCELLED
        assert c2.next_fire_ms == 0


def test_list_runs_pages_through_runs_and_newer_missed_fires_without_losing_any(
    api: Api,
) -> None:
    """Runs first, then missed fires newer than all of them: every page size
    lists every item exactly once, in the same order as one big page."""
    job = submit(api, spec(name="cron", handler="ok", schedule=cron("* * * * * *"))).job.job_id
    with WorkerThread(api.server.target, "w-pages", ok=lambda ctx: None):
        wait_for(lambda: sum(r.run_id > 0 for r in all_runs(api, job)) >= 3, 10, "three runs")
    # No worker now: the next fire waits and the ones after it are skipped
    # (overlap). They are recorded missed once the waiting fire is claimed and
    # the schedule moves past them, so a worker comes back for that.
    time.sleep(5)
    with WorkerThread(api.server.target, "w-pages-2", ok=lambda ctx: None):
        wait_for(
            lambda: sum(r.run_id == 0 for r in all_runs(api, job)) >= 3, 10, "three missed fires"
        )
        api.jobs.PauseJob(job_service_pb2.JobRef(job_id=job), timeout=10)
        # A run handed out before the pause ends on its own time (its
        # completion is written with the node's next batch): the pages are
        # read once none is in flight, its worker still there to end it.
        in_flight = (jobs_pb2.RUN_STATE_DISPATCHED, jobs_pb2.RUN_STATE_RUNNING)
        wait_for(
            lambda: not any(r.state in in_flight for r in all_runs(api, job)),
            10,
            "no run in flight",
        )
    full = all_runs(api, job, page_size=1000)
    assert full[0].run_id == 0 and full[-1].run_id > 0
    keys = [(r.run_id, r.scheduled_for_ms) for r in full]
    assert len(set(keys)) == len(keys)
    for size in (1, 2, 3, 5):
        assert all_runs(api, job, page_size=size) == full, size


def test_submit_jobs_stores_a_batch_and_reports_each_bad_item_on_its_own(api: Api) -> None:
    taken_spec = spec(name="taken")
    taken = submit(api, taken_spec, key="k-taken").job.job_id
    req = job_service_pb2.SubmitJobsRequest(
        jobs=[
            job_service_pb2.SubmitJobRequest(spec=spec(name="a"), idempotency_key="k-a"),
            job_service_pb2.SubmitJobRequest(spec=spec(name="")),
            job_service_pb2.SubmitJobRequest(spec=spec(name="other"), idempotency_key="k-taken"),
            job_service_pb2.SubmitJobRequest(spec=taken_spec, idempotency_key="k-taken"),
            job_service_pb2.SubmitJobRequest(spec=spec(name="b", schedule=cron("61 * * * *"))),
        ]
    )
    results = api.jobs.SubmitJobs(req, timeout=10).results
    assert [r.error_code for r in results] == [
        "",
        "INVALID_ARGUMENT",
        "ALREADY_EXISTS",
        "",
        "INVALID_ARGUMENT",
    ]
    assert "spec.name" in results[1].error_message
    assert "spec.schedule.cron.expr" in results[4].error_message
    assert results[0].response.created and results[0].response.job.spec.name == "a"
    assert not results[3].response.created and results[3].response.job.job_id == taken
    names = sorted(j.spec.name for j in api.jobs.ListJobs(job_service_pb2.ListJobsRequest()).jobs)
    assert names == ["a", "taken"]

    too_many = job_service_pb2.SubmitJobsRequest(
        jobs=[job_service_pb2.SubmitJobRequest(spec=spec())] * 10_001
    )
    with pytest.raises(grpc.RpcError) as err:
        api.jobs.SubmitJobs(too_many, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "10000" in (err.value.details() or "")


def test_a_submit_batch_the_store_fails_unexpectedly_answers_and_the_next_one_works(
    api: Api,
) -> None:
    # Not a store error the node knows: every submit of the batch must still
    # get an answer (none waits forever), and later submits are stored.
    node = api.server.node
    assert node is not None
    real = node.store.submit_jobs

    def broken(news: Any) -> Any:
        raise RuntimeError("driver bug")

    node.store.submit_jobs = broken  # type: ignore[method-assign]
    req = job_service_pb2.SubmitJobsRequest(
        jobs=[job_service_pb2.SubmitJobRequest(spec=spec(name=f"n{i}")) for i in range(3)]
    )
    with pytest.raises(grpc.RpcError) as err:
        api.jobs.SubmitJobs(req, timeout=10)
    assert err.value.code() != grpc.StatusCode.DEADLINE_EXCEEDED
    with pytest.raises(grpc.RpcError) as err:
        submit(api, spec(name="alone"))
    assert err.value.code() != grpc.StatusCode.DEADLINE_EXCEEDED
    node.store.submit_jobs = real  # type: ignore[method-assign]
    assert submit(api, spec(name="after")).created


def test_a_busy_change_feed_is_read_page_after_page_not_a_page_an_interval(
    tmp_path: Path,
) -> None:
    # Pages of 4 and a read every 3 s: 40 jobs paused by another writer take
    # ten pages or more. Read a page an interval, the last pause would reach
    # the owner half a minute later; read back to back, within one interval.
    server = InProcessServer(tmp_path, changes_interval_s=3.0, changes_page=4).start()
    try:
        with connect(server) as api:
            hourly = every(HOUR_MS, now_ms() + HOUR_MS)
            ids = [submit(api, spec(name=f"j{i}", schedule=hourly)).job.job_id for i in range(40)]
        node = server.node
        assert node is not None
        other = open_store(f"sqlite:///{tmp_path / 'wheel.db'}")
        try:
            for job_id in ids:
                job = other.get_job(job_id)
                other.set_job_state(
                    job_id, JobState.PAUSED, next_run_at=job.next_run_at, now_ms=now_ms()
                )
        finally:
            other.close()

        def paused() -> int:
            owner = node._the_driver().owner
            return sum(
                1 for job_id in ids if (job := owner.book.job(job_id)) is not None and job.paused
            )

        wait_for(lambda: server.call(paused) == len(ids), 8, "every pause to reach the owner")
    finally:
        server.stop()


def test_fires_before_the_submit_are_not_owed_whatever_the_catch_up_mode(api: Api) -> None:
    """An interval whose start lies in the past, under run_all: the fires
    before the submit are neither run nor recorded missed (catch-up covers
    fires the job missed while it existed); the first fire owed is the first
    at or after the submit, on the start's grid; BackfillJob runs the earlier
    ones on request. A one-shot whose time has passed is owed: its one fire
    is the job."""
    ran: list[tuple[int, int]] = []

    def ok(ctx: RunContext) -> None:
        ran.append((ctx.job_id, ctx.scheduled_for_ms))

    with WorkerThread(api.server.target, "w-past", ok=ok):
        t = now_ms()
        start = t - 30_500
        job = submit(
            api,
            spec(
                handler="ok",
                schedule=every(1_000, start),
                catch_up=jobs_pb2.CatchUp(mode=jobs_pb2.CATCH_UP_MODE_RUN_ALL),
            ),
        ).job
        assert job.next_fire_ms >= t and (job.next_fire_ms - start) % 1_000 == 0
        assert job.next_fire_ms - t <= 1_000
        late = submit(api, spec(name="late", handler="ok", schedule=once(t - 5_000))).job
        wait_for(lambda: len({sf for j, sf in ran if j == job.job_id}) >= 2, 10, "two fires")
        wait_for(lambda: (late.job_id, t - 5_000) in ran, 10, "the past one-shot to run")
        history = all_runs(api, job.job_id)
        assert min(r.scheduled_for_ms for r in history) == job.next_fire_ms
        assert not [r for r in history if RUN_STATE[r.state] == "missed"]
        back = api.jobs.BackfillJob(
            job_service_pb2.BackfillJobRequest(job_id=job.job_id, from_ms=start, to_ms=t),
            timeout=10,
        )
        assert back.scheduled == 31
        assert sorted(back.scheduled_for_ms) == [start + k * 1_000 for k in range(31)]
