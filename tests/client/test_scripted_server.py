"""The client SDKs over a scripted JobService and AdminService on real gRPC:
what a real node will not answer on demand (every error status code, a store
that is down, status rows the node does not fill yet) and exactly what each
call puts in its request."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import grpc
import pytest

from testkit.services import free_port
from tests.conftest import utc_ms
from wheel.client import (
    AsyncClient,
    Client,
    Cron,
    DstFold,
    DstGap,
    JobState,
    RunState,
    Status,
    UnservedHandler,
    WorkerStatus,
)
from wheel.engine.spec import Cron as EngineCron
from wheel.engine.spec import JobSpec, Once
from wheel.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    WheelError,
)
from wheel.rpc import convert
from wheel.rpc.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    job_service_pb2,
    job_service_pb2_grpc,
    jobs_pb2,
)

NOW = 1_700_000_000_000

_ERRORS = {
    404: (grpc.StatusCode.NOT_FOUND, "job 404 not found", NotFound),
    409: (grpc.StatusCode.ALREADY_EXISTS, "key reused with another body", AlreadyExists),
    429: (grpc.StatusCode.RESOURCE_EXHAUSTED, "backfill over 10000 fires", ResourceExhausted),
    412: (grpc.StatusCode.FAILED_PRECONDITION, "job is cancelled", FailedPrecondition),
    400: (grpc.StatusCode.INVALID_ARGUMENT, "spec.retry.multiplier: must be between", None),
    503: (grpc.StatusCode.UNAVAILABLE, "store down", None),
}

_SPEC = convert.spec_to_proto(JobSpec(name="j", handler="h", schedule=Once(at_ms=NOW)))


def _job(job_id: int, state: int = jobs_pb2.JOB_STATE_ACTIVE) -> jobs_pb2.Job:
    return jobs_pb2.Job(job_id=job_id, spec=_SPEC, state=state)  # type: ignore[arg-type]


class ScriptedJobs(
    job_service_pb2_grpc.JobServiceServicer, admin_service_pb2_grpc.AdminServiceServicer
):
    """Jobs 1..250 exist; some ids answer with an error status instead."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    def _fail_for(self, job_id: int, context: grpc.ServicerContext) -> None:
        if job_id in _ERRORS:
            code, details, _ = _ERRORS[job_id]
            context.abort(code, details)

    def SubmitJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.requests.append(request)
        if request.spec.name == "bad":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "spec.name: must not be empty")
        job = jobs_pb2.Job(job_id=1, spec=request.spec, state=jobs_pb2.JOB_STATE_ACTIVE)
        return job_service_pb2.SubmitJobResponse(
            job=job, created=request.idempotency_key != "again"
        )

    def GetJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.requests.append(request)
        self._fail_for(request.job_id, context)
        return _job(request.job_id)

    def ListJobs(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.requests.append(request)
        start = int(request.page_token or 0)
        end = min(250, start + request.page_size)
        return job_service_pb2.ListJobsResponse(
            jobs=[_job(i + 1) for i in range(start, end)],
            next_page_token=str(end) if end < 250 else "",
        )

    def CancelJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._fail_for(request.job_id, context)
        return _job(request.job_id, jobs_pb2.JOB_STATE_CANCELLED)

    def PauseJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        return _job(request.job_id, jobs_pb2.JOB_STATE_PAUSED)

    def ResumeJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        return _job(request.job_id, jobs_pb2.JOB_STATE_ACTIVE)

    def TriggerJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        return job_service_pb2.TriggerJobResponse(job_id=request.job_id, scheduled_for_ms=5)

    def BackfillJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.requests.append(request)
        self._fail_for(request.job_id, context)
        return job_service_pb2.BackfillJobResponse(
            scheduled=2, scheduled_for_ms=[request.from_ms, request.to_ms - 1]
        )

    def ListRuns(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.requests.append(request)
        start = int(request.page_token or 0)
        end = min(7, start + request.page_size)
        return job_service_pb2.ListRunsResponse(
            runs=[
                jobs_pb2.Run(run_id=100 - i, state=jobs_pb2.RUN_STATE_SUCCEEDED)
                for i in range(start, end)
            ],
            next_page_token=str(end) if end < 7 else "",
        )

    def GetClusterStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        shards = [admin_service_pb2.ShardStatus(shard=3)] if request.include_shards else []
        return admin_service_pb2.ClusterStatus(
            node_id="n1",
            jobs=250,
            shards=shards,
            workers=2,
            dispatch_lag_p99_ms=12.5,
            worker_list=[
                admin_service_pb2.WorkerStatus(
                    worker_id="w-a", capacity=8, held=3, pools=["default"], handlers=["a", "b"]
                ),
                admin_service_pb2.WorkerStatus(
                    worker_id="w-b", capacity=4, pools=["gpu"], draining=True, silent=True
                ),
            ],
            unserved=[admin_service_pb2.UnservedHandler(pool="gpu", handler="train", waiting=9)],
        )


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[ScriptedJobs, str]]:
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    svc = ScriptedJobs()
    job_service_pb2_grpc.add_JobServiceServicer_to_server(svc, server)
    admin_service_pb2_grpc.add_AdminServiceServicer_to_server(svc, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield svc, f"127.0.0.1:{port}"
    finally:
        server.stop(None).wait()


@pytest.fixture
def client(scripted: tuple[ScriptedJobs, str]) -> Iterator[Client]:
    with Client(scripted[1], timeout=5) as c:
        yield c


def test_client_submits_the_spec_and_reports_created(
    scripted: tuple[ScriptedJobs, str], client: Client
) -> None:
    svc, _ = scripted
    job = client.submit(
        name="n", handler="h", cron="* * * * *", payload=b"\x00", idempotency_key="k1"
    )
    assert job.created
    assert svc.requests[-1].idempotency_key == "k1"
    sent = JobSpec(name="n", handler="h", schedule=EngineCron(expr="* * * * *"), payload=b"\x00")
    assert convert.spec_from_proto(svc.requests[-1].spec, now_ms=NOW) == sent
    # The node answered with the spec it was sent: it reads back as given.
    assert (job.name, job.handler, job.payload) == ("n", "h", b"\x00")
    assert job.schedule == Cron(
        expr="* * * * *", tz="UTC", dst_gap=DstGap.FIRE_AT_TRANSITION, dst_fold=DstFold.FIRST
    )
    again = client.submit(name="n", handler="h", cron="* * * * *", idempotency_key="again")
    assert not again.created


def test_client_follows_page_tokens(scripted: tuple[ScriptedJobs, str], client: Client) -> None:
    svc, _ = scripted
    svc.requests.clear()
    ids = [j.job_id for j in client.jobs(tenant="t", state=JobState.PAUSED, page_size=100)]
    assert ids == list(range(1, 251))
    assert [r.page_token for r in svc.requests] == ["", "100", "200"]
    assert {(r.tenant, r.state) for r in svc.requests} == {("t", jobs_pb2.JOB_STATE_PAUSED)}
    svc.requests.clear()
    runs = list(client.runs(9, states=[RunState.FAILED, "missed"], page_size=3))
    assert [r.run_id for r in runs] == [100, 99, 98, 97, 96, 95, 94]
    assert len(svc.requests) == 3
    assert list(svc.requests[0].states) == [jobs_pb2.RUN_STATE_FAILED, jobs_pb2.RUN_STATE_MISSED]
    svc.requests.clear()
    assert len(list(client.jobs())) == 250
    assert svc.requests[0].state == jobs_pb2.JOB_STATE_UNSPECIFIED


def test_client_job_actions(scripted: tuple[ScriptedJobs, str], client: Client) -> None:
    svc, _ = scripted
    assert client.get(3, next_fires=2, recent_runs=4).job_id == 3
    assert (svc.requests[-1].next_fires, svc.requests[-1].recent_runs) == (2, 4)
    assert client.cancel(3).state is JobState.CANCELLED
    assert client.pause(3).state is JobState.PAUSED
    assert client.resume(3).state is JobState.ACTIVE
    assert client.trigger(3).scheduled_for == utc_ms(5)
    back = client.backfill(3, utc_ms(10), utc_ms(20))
    assert (svc.requests[-1].from_ms, svc.requests[-1].to_ms) == (10, 20)
    assert back.scheduled_for == [utc_ms(10), utc_ms(19)]
    assert client.status().node_id == "n1"
    assert not client.status().shards
    assert [s.shard for s in client.status(include_shards=True).shards] == [3]


def test_status_maps_each_worker_row_and_each_unserved_handler(client: Client) -> None:
    status = client.status()
    assert isinstance(status, Status)
    assert (status.workers, status.dispatch_lag_p99) == (2, timedelta(milliseconds=12.5))
    assert status.worker_list == [
        WorkerStatus(
            worker_id="w-a",
            capacity=8,
            held=3,
            pools=["default"],
            handlers=["a", "b"],
            draining=False,
            silent=False,
        ),
        WorkerStatus(
            worker_id="w-b",
            capacity=4,
            held=0,
            pools=["gpu"],
            handlers=[],
            draining=True,
            silent=True,
        ),
    ]
    assert status.unserved == [UnservedHandler(pool="gpu", handler="train", waiting=9)]


def _check_error(err: WheelError, job_id: int) -> None:
    code, details, cls = _ERRORS[job_id]
    assert isinstance(err.__cause__, grpc.RpcError)
    if cls is not None:
        assert type(err) is cls
        assert str(err) == details
    elif code == grpc.StatusCode.INVALID_ARGUMENT:
        assert isinstance(err, InvalidArgument)
        assert err.field == "spec.retry.multiplier"
        assert str(err) == details
    else:
        assert type(err) is WheelError
        assert str(err) == f"{code.name}: {details}"


def _timeout(job_id: int) -> float:
    """UNAVAILABLE is tried again until the call's timeout, then raised as it
    came: a short timeout keeps that case quick."""
    return 0.3 if _ERRORS[job_id][0] == grpc.StatusCode.UNAVAILABLE else 5


def _gets(svc: ScriptedJobs, job_id: int) -> int:
    return sum(
        isinstance(r, job_service_pb2.GetJobRequest) and r.job_id == job_id for r in svc.requests
    )


@pytest.mark.parametrize("job_id", sorted(_ERRORS))
def test_client_raises_status_codes_as_wheel_errors(
    scripted: tuple[ScriptedJobs, str], job_id: int
) -> None:
    svc, target = scripted
    with Client(target, timeout=_timeout(job_id)) as client:
        calls: list[Callable[[], object]] = [
            lambda: client.get(job_id),
            lambda: client.backfill(job_id, 0, 0.001),
        ]
        before = _gets(svc, job_id)
        for call in calls:
            with pytest.raises(WheelError) as info:
                call()
            _check_error(info.value, job_id)
    asked = _gets(svc, job_id) - before
    assert asked > 1 if job_id == 503 else asked == 1


@pytest.mark.parametrize("job_id", sorted(_ERRORS))
def test_async_client_raises_status_codes_as_wheel_errors(
    scripted: tuple[ScriptedJobs, str], job_id: int
) -> None:
    async def calls() -> list[WheelError]:
        out = []
        async with AsyncClient(scripted[1], timeout=_timeout(job_id)) as client:
            for call in (lambda: client.get(job_id), lambda: client.backfill(job_id, 0, 0.001)):
                try:
                    await call()
                except WheelError as exc:
                    out.append(exc)
        return out

    errors = asyncio.run(calls())
    assert len(errors) == 2
    for err in errors:
        _check_error(err, job_id)


def test_client_invalid_argument_keeps_the_field(client: Client) -> None:
    with pytest.raises(InvalidArgument) as info:
        client.submit(name="bad", handler="h", at=0.001)
    assert info.value.field == "spec.name"
    assert info.value.reason == "must not be empty"


def test_client_reports_an_unreachable_node_as_unavailable() -> None:
    with (
        Client(f"127.0.0.1:{free_port()}", timeout=0.5) as client,
        pytest.raises(WheelError) as info,
    ):
        client.status()
    assert str(info.value).startswith("UNAVAILABLE")
