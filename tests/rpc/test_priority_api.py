"""A job's priority over real gRPC: submitted, read back, changed by an
update, refused out of 0..9 naming the field, and through the Python client;
and a node whose one worker is short hands out the priority-0 runs first."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from tests.rpc.test_api import (
    Api,
    InProcessServer,
    WorkerThread,
    connect,
    now_ms,
    once,
    spec,
    submit,
    wait_for,
)
from wheel.client import Client
from wheel.engine.owner import OwnerConfig
from wheel.errors import InvalidArgument
from wheel.rpc.v1 import job_service_pb2, jobs_pb2
from wheel.worker import RunContext


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    server = InProcessServer(
        tmp_path_factory.mktemp("priority"), OwnerConfig(priority_aging_ms=60_000)
    ).start()
    try:
        with connect(server) as a:
            yield a
    finally:
        server.stop()


def get(api: Api, job_id: int) -> jobs_pb2.Job:
    request = job_service_pb2.GetJobRequest(job_id=job_id)
    return api.jobs.GetJob(request, timeout=10)  # type: ignore[no-any-return]


def test_a_priority_is_kept_and_an_unset_one_reads_as_the_default(api: Api) -> None:
    urgent = submit(api, spec(name="urgent", priority=0)).job
    plain = submit(api, spec(name="plain")).job
    assert get(api, urgent.job_id).spec.priority == 0
    got = get(api, plain.job_id).spec
    assert not got.HasField("priority")  # unset: 5, and the wire bytes of old
    assert submit(api, spec(name="five", priority=5)).job.spec.HasField("priority") is False


@pytest.mark.parametrize("bad", [-1, 10, 1_000])
def test_a_priority_outside_0_to_9_is_invalid_argument_naming_the_field(api: Api, bad: int) -> None:
    with pytest.raises(grpc.RpcError) as err:
        submit(api, spec(name="bad", priority=bad))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.priority" in (err.value.details() or "")


def test_an_update_changes_the_priority_and_unset_sets_it_back_to_5(api: Api) -> None:
    job = submit(api, spec(name="moved", priority=9)).job
    req = job_service_pb2.UpdateJobRequest(
        job_id=job.job_id, spec=spec(priority=1), fields=["priority"]
    )
    after = api.jobs.UpdateJob(req, timeout=10).job
    assert after.spec.priority == 1 and after.spec.name == "moved"
    back = job_service_pb2.UpdateJobRequest(job_id=job.job_id, spec=spec(), fields=["priority"])
    assert not api.jobs.UpdateJob(back, timeout=10).job.spec.HasField("priority")
    bad = job_service_pb2.UpdateJobRequest(
        job_id=job.job_id, spec=spec(priority=12), fields=["priority"]
    )
    with pytest.raises(grpc.RpcError) as err:
        api.jobs.UpdateJob(bad, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.priority" in (err.value.details() or "")


def test_the_client_submits_reads_and_updates_a_priority(api: Api) -> None:
    with Client(api.server.target) as client:
        job = client.submit(name="c", handler="h", every=60, priority=2)
        assert job.priority == 2 and client.get(job.job_id).priority == 2
        assert client.update(job.job_id, priority=7).priority == 7
        assert client.submit(name="d", handler="h", every=60).priority == 5
        with pytest.raises(InvalidArgument, match="priority"):
            client.submit(name="e", handler="h", every=60, priority=10)


def test_with_one_worker_slot_the_priority_0_runs_go_first(api: Api) -> None:
    started: list[str] = []
    gate = threading.Event()

    def run(ctx: RunContext) -> None:
        started.append(ctx.payload.decode())
        if not gate.is_set():
            gate.wait(10)  # the first run holds the slot while the rest come due
        time.sleep(0.02)

    at = now_ms() + 300
    names = ["first"] + [f"p9-{i}" for i in range(4)] + [f"p0-{i}" for i in range(3)]
    with WorkerThread(api.server.target, "w-prio", options={"capacity": 1}, ordered=run):
        submit(api, spec(name="first", handler="ordered", payload=b"first", schedule=once(at)))
        wait_for(lambda: started, 10, "the first run")
        for name in names[1:]:
            priority = 0 if name.startswith("p0") else 9
            msg = spec(
                name=name,
                handler="ordered",
                payload=name.encode(),
                schedule=once(now_ms()),
                priority=priority,
            )
            submit(api, msg)
        # Every one is due and waiting for the slot before it frees.
        node = api.server.node
        assert node is not None
        wait_for(
            lambda: api.server.call(lambda: node.status(percentiles=False).backlog) == 7,
            10,
            "the runs to wait for the slot",
        )
        gate.set()
        wait_for(lambda: len(started) == len(names), 20, "every run")
    assert [s[:2] for s in started[1:]] == ["p0"] * 3 + ["p9"] * 4
