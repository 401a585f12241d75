"""Concurrency keys over real gRPC on a node's process: AdminService's
limit calls (bad values named), a submit naming a key without a limit
refused, and runs of a key held to its limit on a raw worker stream, the
one waiting handed out once the other ends."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import prometheus_client
import pytest

from testkit.procs import wait_for
from tests.rpc.test_api import Api, InProcessServer, connect, now_ms, once, spec, submit
from tests.rpc.test_protocol_abuse import RawWorker, ack, complete, states
from wheel.cli import main
from wheel.engine.owner import OwnerConfig
from wheel.rpc._common import MAX_RETURNED_RUNS
from wheel.rpc.v1 import admin_service_pb2 as admin
from wheel.rpc.v1 import job_service_pb2
from wheel.rpc.v1 import worker_service_pb2 as pb


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    server = InProcessServer(tmp_path).start()
    try:
        with connect(server) as a:
            yield a
    finally:
        server.stop()


def set_limit(api: Api, key: str, **kw: int) -> admin.LimitInfo:
    request = admin.SetLimitRequest(key=key)
    for name, value in kw.items():
        setattr(request, name, value)
    return api.admin.SetLimit(request, timeout=10)  # type: ignore[no-any-return]


def limits(api: Api) -> dict[str, admin.LimitInfo]:
    resp = api.admin.ListLimits(admin.ListLimitsRequest(), timeout=10)
    return {x.key: x for x in resp.limits}


def refused(call: object, field: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert field in (info.value.details() or "")


def test_set_list_and_delete_a_limit(api: Api) -> None:
    made = set_limit(api, "db", max_concurrent=3, rate=10, rate_period_ms=60_000)
    assert (made.tenant, made.key, made.max_concurrent, made.rate, made.burst) == (
        "default", "db", 3, 10, 10,
    )  # fmt: skip
    assert made.rate_period_ms == 60_000 and made.in_flight == 0
    assert list(limits(api)) == ["db"]
    gone = api.admin.DeleteLimit(admin.DeleteLimitRequest(key="db"), timeout=10)
    assert gone.deleted == 1
    assert limits(api) == {}


def test_bad_limits_are_invalid_argument_naming_the_field(api: Api) -> None:
    refused(lambda: set_limit(api, "db", max_concurrent=-1), "max_concurrent")
    refused(lambda: set_limit(api, "db"), "max_concurrent")
    refused(lambda: set_limit(api, "db", rate=5, rate_period_ms=5_000), "rate_period_ms")
    refused(lambda: set_limit(api, "db", max_concurrent=1, burst=4), "burst")
    refused(lambda: set_limit(api, "a key", max_concurrent=1), "key")


def test_a_job_may_name_only_a_key_with_a_limit(api: Api) -> None:
    refused(lambda: submit(api, spec(concurrency_key="db")), "spec.concurrency_key")
    set_limit(api, "db", max_concurrent=1)
    job = submit(api, spec(concurrency_key="db")).job
    assert job.spec.concurrency_key == "db"
    other = submit(api, spec(name="plain")).job
    update = job_service_pb2.UpdateJobRequest(
        job_id=other.job_id, spec=spec(concurrency_key="nope"), fields=["concurrency_key"]
    )
    refused(lambda: api.jobs.UpdateJob(update, timeout=10), "spec.concurrency_key")
    update.spec.concurrency_key = "db"
    assert api.jobs.UpdateJob(update, timeout=10).job.spec.concurrency_key == "db"


def test_runs_of_a_key_wait_for_a_permit_and_go_when_one_ends(api: Api) -> None:
    set_limit(api, "db", max_concurrent=1)
    worker = RawWorker(api.server.target, "w1", capacity=5)
    try:
        due = now_ms() + 300
        for name in ("a", "b"):
            submit(api, spec(name=name, schedule=once(due), concurrency_key="db"))
        [first] = worker.expect("assignments").assignments.assignments
        worker.send(ack((first.run_id, first.fence)))
        seen = limits(api)["db"]
        assert (seen.in_flight, seen.waiting) == (1, 1)
        worker.send(complete(first.run_id, first.fence))
        [second] = worker.expect("assignments", timeout=10).assignments.assignments
        assert second.job_id != first.job_id
        assert limits(api)["db"].waiting == 0
        assert "wheel_limit_wait_seconds_count 1.0" in scrape(api)
        wait_for(
            lambda: 'wheel_limit_in_flight{key="db",tenant="default"} 1.0' in scrape(api),
            10,
            "the metrics to read the limit again",
        )
        assert 'wheel_limit_waiting{key="db",tenant="default"} 0.0' in scrape(api)
    finally:
        worker.close()


def test_a_returned_run_s_permit_goes_back_and_the_waiting_fire_goes_out(api: Api) -> None:
    """A worker's ``Returned`` (its handler returned, its own node's stream
    down; here any node will do, so this one): the permit comes back at
    once, the waiting fire goes out while the first run is still in flight,
    and that run's completion later gives nothing back twice. (Which runs
    may be given back, by fence and worker: the store's contract tests.)"""
    set_limit(api, "db", max_concurrent=1)
    worker = RawWorker(api.server.target, "w1", capacity=5)
    try:
        due = now_ms() + 300
        for name in ("a", "b"):
            submit(api, spec(name=name, schedule=once(due), concurrency_key="db"))
        [first] = worker.expect("assignments").assignments.assignments
        worker.send(ack((first.run_id, first.fence)))
        wait_for(lambda: states(api, first.job_id) == [(1, "running")], 10, "the ack's start")
        worker.send(returned((first.run_id, first.fence)))
        [second] = worker.expect("assignments", timeout=10).assignments.assignments
        assert second.job_id != first.job_id
        assert states(api, first.job_id) == [(1, "running")]
        assert limits(api)["db"].in_flight == 1  # the second run's
        worker.send(complete(first.run_id, first.fence))
        wait_for(lambda: states(api, first.job_id) == [(1, "succeeded")], 10, "the first's end")
        assert limits(api)["db"].in_flight == 1
        worker.send(complete(second.run_id, second.fence))
        wait_for(lambda: limits(api)["db"].in_flight == 0, 10, "the second's permit back")
    finally:
        worker.close()


def test_a_returned_message_naming_too_many_runs_is_refused_and_the_stream_goes_on(
    api: Api,
) -> None:
    set_limit(api, "db", max_concurrent=1)
    worker = RawWorker(api.server.target, "w1", capacity=5)
    try:
        submit(api, spec(name="a", schedule=once(now_ms() + 300), concurrency_key="db"))
        [first] = worker.expect("assignments").assignments.assignments
        worker.send(ack((first.run_id, first.fence)))
        worker.send(returned(*[(first.run_id, first.fence)] * (MAX_RETURNED_RUNS + 1)))
        err = worker.expect("error", timeout=10).error
        assert err.code == "INVALID_ARGUMENT" and err.message.startswith("returned.runs:")
        assert limits(api)["db"].in_flight == 1  # nothing given back
        worker.send(complete(first.run_id, first.fence))
        wait_for(lambda: states(api, first.job_id) == [(1, "succeeded")], 10, "the run's end")
        wait_for(lambda: limits(api)["db"].in_flight == 0, 10, "its permit back")
    finally:
        worker.close()


HAND_OFF_TICK_MS = 1_000


def test_a_permit_freed_here_goes_to_the_run_waiting_here_without_waiting_for_the_tick(
    tmp_path: Path,
) -> None:
    """The loop goes round at most once a tick while work keeps coming; a
    run of a key ending while a claim of that key waits here is not held to
    it: the permit would be idle until the next tick. Each run's end below
    comes right after a round that wrote (its start), so the tick has most
    of its second to go, and the next run must go out long before that.
    (The poll is a minute: only the end's hand-off can send the claim.)"""
    server = InProcessServer(
        tmp_path, OwnerConfig(limit_poll_ms=60_000), tick_ms=HAND_OFF_TICK_MS
    ).start()
    assert server.node is not None
    worker = None
    try:
        with connect(server) as api:
            set_limit(api, "db", max_concurrent=1)
            due = now_ms() + 500
            jobs = {
                submit(api, spec(name=n, schedule=once(due), concurrency_key="db")).job.job_id
                for n in ("a", "b", "c")
            }
            worker = RawWorker(server.target, "w1", capacity=5)
            [run] = worker.expect("assignments").assignments.assignments
            seen = {run.job_id}
            waits: list[float] = []
            for _ in range(2):
                worker.send(ack((run.run_id, run.fence)))
                started = functools.partial(
                    lambda j: states(api, j) == [(1, "running")], run.job_id
                )
                wait_for(started, 10, "the ack's start", interval=0.01)
                t0 = time.monotonic()
                worker.send(complete(run.run_id, run.fence))
                [run] = worker.expect("assignments", timeout=10).assignments.assignments
                waits.append(time.monotonic() - t0)
                seen.add(run.job_id)
            stall_s = server.node.loop_stall_max_s()
        assert seen == jobs
        assert all(w < HAND_OFF_TICK_MS / 3000 + stall_s for w in waits), (waits, stall_s)
    finally:
        if worker is not None:
            worker.close()
        server.stop()


def returned(*refs: tuple[int, int]) -> pb.WorkerMessage:
    return pb.WorkerMessage(
        returned=pb.Returned(runs=[pb.RunRef(run_id=r, fence=f) for r, f in refs])
    )


def scrape(api: Api) -> str:
    assert api.server.node is not None
    return prometheus_client.generate_latest(api.server.node.metrics.registry).decode()


def test_wheelctl_limit_set_list_delete_and_submit_with_a_key(
    api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    target = ["--target", api.server.target]
    assert main(["limit", "set", "db", "--max-concurrent", "2", "--rate", "5/s", *target]) == 0
    assert "db" in capsys.readouterr().out
    assert main(["limit", "set", "api", "--rate", "30/m", "--burst", "3", *target]) == 0
    capsys.readouterr()
    assert main(["limit", "list", "--json", *target]) == 0
    listed = {x["key"]: x for x in json.loads(capsys.readouterr().out)}
    assert listed["db"] == {
        "tenant": "default", "key": "db", "max_concurrent": 2, "rate": 5,
        "rate_period_ms": 1000, "burst": 5, "in_flight": 0, "waiting": 0,
    }  # fmt: skip
    assert (listed["api"]["rate_period_ms"], listed["api"]["burst"]) == (60_000, 3)
    args = ["submit", "--name", "n", "--handler", "h", "--at", "+1h", "--json", *target]
    assert main([*args, "--concurrency-key", "db"]) == 0
    job_id = str(json.loads(capsys.readouterr().out)["job_id"])
    assert main(["job", job_id, "--json", *target]) == 0
    assert json.loads(capsys.readouterr().out)["concurrency_key"] == "db"
    assert main(["update", job_id, "--concurrency-key", "api", "--json", *target]) == 0
    assert json.loads(capsys.readouterr().out)["concurrency_key"] == "api"
    assert main(["limit", "set", "db", "--rate", "five", *target]) != 0
    assert "rate" in capsys.readouterr().err
    assert main(["limit", "delete", "db", *target]) == 0
    assert main(["limit", "delete", "db", *target]) == 1
