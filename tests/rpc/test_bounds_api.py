"""Bounded schedules over real gRPC: bad bounds are INVALID_ARGUMENT naming
the field, preview shows the bounds, a job whose bound is reached completes
(and takes no later bound), and an update sets or clears them."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from tests.rpc.test_api import (
    Api,
    InProcessServer,
    WorkerThread,
    all_runs,
    connect,
    every,
    now_ms,
    spec,
    submit,
    wait_for,
)
from tests.rpc.test_operator_api import update
from wheel.rpc.v1 import job_service_pb2, jobs_pb2
from wheel.worker import RunContext

HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    server = InProcessServer(tmp_path_factory.mktemp("bounds"), min_interval_ms=100).start()
    try:
        with connect(server) as a:
            yield a
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"max_fires": 3}, "spec.max_fires"),  # on a one-shot
        ({"active_until_ms": now_ms() + HOUR_MS}, "spec.active_until_ms"),  # on a one-shot
        ({"schedule": every(60_000), "max_fires": -1}, "spec.max_fires"),
        ({"schedule": every(60_000), "active_from_ms": -1}, "spec.active_from_ms"),
        (
            {"schedule": every(60_000), "active_from_ms": 2 * HOUR_MS, "active_until_ms": HOUR_MS},
            "spec.active_until_ms",
        ),
        ({"schedule": every(60_000), "active_until_ms": 1_000}, "spec.active_until_ms"),
        (
            {"schedule": every(60_000, mode=jobs_pb2.INTERVAL_MODE_FIXED_DELAY), "max_fires": 2},
            "spec.max_fires",
        ),
    ],
)
def test_bad_bounds_are_invalid_argument_naming_the_field(
    api: Api, kw: dict[str, object], field: str
) -> None:
    with pytest.raises(grpc.RpcError) as e:
        submit(api, spec(**kw))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (e.value.details() or "")


def test_preview_and_next_fires_honour_the_bounds(api: Api) -> None:
    start = (now_ms() // 60_000 + 10) * 60_000
    bounded = jobs_pb2.JobSpec(
        schedule=every(60_000, start_at_ms=start),
        active_from_ms=start + 2 * 60_000,
        max_fires=3,
    )
    fires = api.jobs.PreviewSchedule(
        job_service_pb2.PreviewScheduleRequest(spec=bounded, count=10), timeout=10
    ).fires_ms
    assert list(fires) == [start + k * 60_000 for k in (2, 3, 4)]
    job = submit(api, spec(schedule=every(60_000, start_at_ms=start), max_fires=3)).job
    assert job.spec.max_fires == 3
    assert list(job.next_fires_ms)[:5] == [start + k * 60_000 for k in range(3)]
    by_job = api.jobs.PreviewSchedule(
        job_service_pb2.PreviewScheduleRequest(job_id=job.job_id, count=10), timeout=10
    ).fires_ms
    assert list(by_job) == [start + k * 60_000 for k in range(3)]


def test_an_update_sets_and_clears_bounds(api: Api) -> None:
    job = submit(api, spec(schedule=every(60_000))).job
    until = now_ms() + HOUR_MS
    msg = jobs_pb2.JobSpec(active_until_ms=until, max_fires=5)
    after = update(api, job.job_id, msg, "active_until_ms", "max_fires").job
    assert (after.spec.active_until_ms, after.spec.max_fires) == (until, 5)
    cleared = update(api, job.job_id, jobs_pb2.JobSpec(), "max_fires").job
    assert (cleared.spec.active_until_ms, cleared.spec.max_fires) == (until, 0)


def test_a_job_whose_max_fires_is_reached_completes_and_takes_no_later_bound(api: Api) -> None:
    ran: list[int] = []

    def count(ctx: RunContext) -> None:
        ran.append(ctx.scheduled_for_ms)

    server = api.server
    with WorkerThread(server.target, "bounds-w", bounded=count):
        msg = spec(handler="bounded", schedule=every(300), max_fires=3)
        job = submit(api, msg).job

        def state() -> int:
            got = api.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=job.job_id), timeout=10)
            return got.state  # type: ignore[no-any-return]

        wait_for(lambda: state() == jobs_pb2.JOB_STATE_COMPLETED, 20, "the job to complete")
    runs = all_runs(api, job.job_id)
    assert len(runs) == 3 and len(ran) == 3
    with pytest.raises(grpc.RpcError) as e:
        update(api, job.job_id, jobs_pb2.JobSpec(max_fires=10), "max_fires")
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "completed" in (e.value.details() or "")
