"""Clients given several node addresses, against a real node on loopback: a
call goes to the next address while one is unavailable, and only what is safe
to repeat is repeated (a submit finds the job its first attempt made; a trigger
that may have been received is not sent again). Between the client and the
node stand real gRPC proxies that can lose every answer after passing the call
on, as a node that dies mid-call would."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import grpc
import pytest

from testkit.services import free_port
from tests.rpc.test_api import InProcessServer
from wheel.client import AsyncClient, Client, JobRequest, Member, Membership
from wheel.engine.model import SHARD_COUNT, shard_of
from wheel.errors import InvalidArgument, WheelError
from wheel.rpc.targets import targets_of
from wheel.rpc.v1 import (
    admin_service_pb2_grpc,
    cluster_pb2,
    job_service_pb2_grpc,
)

HOUR = timedelta(hours=1)


class Proxy(job_service_pb2_grpc.JobServiceServicer):
    """Passes JobService calls on to a real node and counts them by method;
    with ``lose_answers`` the caller then gets UNAVAILABLE instead of the
    answer: the call took effect, and the caller cannot know it."""

    def __init__(self, target: str, *, lose_answers: bool) -> None:
        self.channel = grpc.insecure_channel(target)
        self.node = job_service_pb2_grpc.JobServiceStub(self.channel)
        self.lose_answers = lose_answers
        self.calls: collections.Counter[str] = collections.Counter()

    def _pass(self, method: str, request: Any, context: grpc.ServicerContext) -> Any:
        self.calls[method] += 1
        answer = getattr(self.node, method)(request, timeout=10)
        if self.lose_answers:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the node went away before answering")
        return answer

    def SubmitJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._pass("SubmitJob", request, context)

    def SubmitJobs(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._pass("SubmitJobs", request, context)

    def TriggerJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._pass("TriggerJob", request, context)

    def GetJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._pass("GetJob", request, context)


@contextlib.contextmanager
def proxy(node: InProcessServer, *, lose_answers: bool) -> Iterator[tuple[Proxy, str]]:
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    svc = Proxy(node.target, lose_answers=lose_answers)
    job_service_pb2_grpc.add_JobServiceServicer_to_server(svc, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield svc, f"127.0.0.1:{port}"
    finally:
        server.stop(None).wait()
        svc.channel.close()


def dead() -> str:
    return f"127.0.0.1:{free_port()}"


def names(client: Client, tenant: str) -> list[tuple[str, int]]:
    return sorted((j.name, j.job_id) for j in client.jobs(tenant=tenant))


def test_addresses_come_as_a_list_or_comma_separated_each_once() -> None:
    assert targets_of("a:1") == ["a:1"]
    assert targets_of(" a:1, b:2 ,a:1,") == ["a:1", "b:2"]
    assert targets_of(["a:1", "b:2,c:3"]) == ["a:1", "b:2", "c:3"]
    nothing: str | list[str]
    for nothing in ("", " , ", []):
        with pytest.raises(InvalidArgument):
            targets_of(nothing)
    assert Client("a:1,b:2").targets == ("a:1", "b:2")


def test_a_client_given_a_dead_address_first_and_a_live_one_second_succeeds(
    node: InProcessServer,
) -> None:
    with Client(f"{dead()},{node.target}", timeout=10) as client:
        job = client.submit(name="second", handler="h", at=HOUR, tenant="nodes-dead")
        assert client.get(job.job_id).name == "second"
        assert client.cancel(job.job_id).job_id == job.job_id
        assert client.trigger(client.submit(name="t", handler="h", at=HOUR).job_id)

    async def go() -> None:
        async with AsyncClient([dead(), node.target], timeout=10) as client:
            job = await client.submit(name="async", handler="h", at=HOUR, tenant="nodes-dead")
            assert (await client.get(job.job_id)).name == "async"
            assert await client.trigger(job.job_id)

    asyncio.run(go())


def test_a_submit_retried_after_unavailable_creates_one_job(node: InProcessServer) -> None:
    tenant = "nodes-once"
    with proxy(node, lose_answers=True) as (lossy, lossy_target):
        # A fresh client each time: a client keeps to the node that answered last.
        targets = [lossy_target, node.target]
        with Client(targets, timeout=10) as client:
            job = client.submit(name="once", handler="h", at=HOUR, tenant=tenant)
        # The first attempt made the job; the retry on the live node found it.
        assert lossy.calls["SubmitJob"] == 1
        assert job.created
        requests = [JobRequest(name=f"many-{i}", handler="h", at=HOUR, tenant=tenant)
                    for i in range(3)]  # fmt: skip
        with Client(targets, timeout=10) as client:
            many = client.submit_many(requests)
        assert lossy.calls["SubmitJobs"] == 1
        assert all(not isinstance(j, WheelError) and j.created for j in many)

        async def go() -> int:
            async with AsyncClient(targets, timeout=10) as aclient:
                made = await aclient.submit(name="async", handler="h", at=HOUR, tenant=tenant)
                return made.job_id

        async_id = asyncio.run(go())
        assert lossy.calls["SubmitJob"] == 2
    made = [("once", job.job_id), ("async", async_id)]
    made += [(j.name, j.job_id) for j in many if not isinstance(j, WheelError)]
    with Client(node.target) as client:
        assert names(client, tenant) == sorted(made)


def test_a_trigger_that_may_have_been_received_is_not_sent_again(node: InProcessServer) -> None:
    with Client(node.target) as client:
        job = client.submit(name="trigger-once", handler="h", at=HOUR, tenant="nodes-trigger")
    with (
        proxy(node, lose_answers=True) as (lossy, lossy_target),
        proxy(node, lose_answers=False) as (honest, honest_target),
        Client([lossy_target, honest_target], timeout=10) as client,
    ):
        with pytest.raises(WheelError) as info:
            client.trigger(job.job_id)
        assert str(info.value).startswith("UNAVAILABLE")
        assert (lossy.calls["TriggerJob"], honest.calls["TriggerJob"]) == (1, 0)


def test_a_trigger_goes_to_the_next_address_when_the_first_never_connected(
    node: InProcessServer,
) -> None:
    with Client(node.target) as client:
        job = client.submit(name="trigger-next", handler="h", at=HOUR, tenant="nodes-trigger")
    with (
        proxy(node, lose_answers=False) as (honest, honest_target),
        Client([dead(), honest_target], timeout=10) as client,
    ):
        assert client.trigger(job.job_id).job_id == job.job_id
        assert honest.calls["TriggerJob"] == 1


class ScriptedAdmin(admin_service_pb2_grpc.AdminServiceServicer):
    def GetMembership(self, request: Any, context: grpc.ServicerContext) -> Any:
        owners = ["a" if s % 2 == 0 else "b" for s in range(SHARD_COUNT)]
        owners[7] = ""
        return cluster_pb2.Membership(
            members=[
                cluster_pb2.Member(node_id="a", address="10.0.0.1:50051"),
                cluster_pb2.Member(node_id="b", address="10.0.0.2:50051"),
            ],
            shard_owners=owners,
            version=42,
        )


def test_membership_names_the_members_and_the_owner_of_every_shard() -> None:
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    admin_service_pb2_grpc.add_AdminServiceServicer_to_server(ScriptedAdmin(), server)
    target = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    try:
        with Client([dead(), target], timeout=5) as client:
            view = client.membership()

        async def go() -> Membership:
            async with AsyncClient(target, timeout=5) as aclient:
                return await aclient.membership()

        assert asyncio.run(go()) == view
    finally:
        server.stop(None).wait()
    a = Member(node_id="a", address="10.0.0.1:50051")
    b = Member(node_id="b", address="10.0.0.2:50051")
    assert (view.members, view.version, len(view.shard_owners)) == ([a, b], 42, SHARD_COUNT)
    jobs = {shard_of(j): j for j in range(1, 5_000)}
    assert view.owner_of(jobs[0]) == a
    assert view.owner_of(jobs[1]) == b
    assert view.owner_of(jobs[7]) is None
