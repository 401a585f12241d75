"""Scripted wheel nodes on real loopback gRPC servers, for the worker SDK's tests.

Each ``ScriptedNode`` records every message a worker sends on each Connect
stream and lets a test push Welcome / Assignments / Revokes / Results /
Membership / errors and drop the stream; it also answers
``AdminService.GetMembership`` with whatever ``membership`` it is given. Several
run at once to play a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc
import grpc.aio

from wheel.engine.model import SHARD_COUNT, shard_of
from wheel.rpc.v1 import admin_service_pb2_grpc, cluster_pb2
from wheel.rpc.v1 import worker_service_pb2 as pb
from wheel.rpc.v1 import worker_service_pb2_grpc as pb_grpc
from wheel.worker import Worker

DROP = object()


class Conn:
    """One Connect stream as the node sees it."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[pb.WorkerMessage | None] = asyncio.Queue()
        self.outbox: asyncio.Queue[Any] = asyncio.Queue()
        self.log: list[tuple[float, pb.WorkerMessage]] = []
        self.ended = False

    def send(self, **kind: Any) -> None:
        self.outbox.put_nowait(pb.ServerMessage(**kind))

    def drop(self) -> None:
        self.outbox.put_nowait(DROP)

    async def expect(self, kind: str, timeout: float = 5.0) -> Any:
        """The next message of ``kind`` (others are skipped but stay in ``log``)."""
        async with asyncio.timeout(timeout):
            while True:
                msg = await self.inbox.get()
                assert msg is not None, f"stream ended while waiting for {kind}"
                if msg.WhichOneof("kind") == kind:
                    return getattr(msg, kind)

    def sent(self, kind: str) -> list[Any]:
        return [getattr(m, kind) for _, m in self.log if m.WhichOneof("kind") == kind]

    def completions(self) -> dict[int, pb.Completion]:
        return {c.run_id: c for m in self.sent("complete") for c in m.completions}

    async def completed(self, n: int, timeout: float = 5.0) -> dict[int, pb.Completion]:
        async with asyncio.timeout(timeout):
            while len(self.completions()) < n:
                await asyncio.sleep(0.005)
        return self.completions()


class ScriptedNode(pb_grpc.WorkerServiceServicer, admin_service_pb2_grpc.AdminServiceServicer):
    def __init__(self, node_id: str = "node-1") -> None:
        self.node_id = node_id
        self.conns: asyncio.Queue[Conn] = asyncio.Queue()
        # What GetMembership answers (None: UNIMPLEMENTED, as an older node).
        self.membership: cluster_pb2.Membership | None = None
        self.membership_asked = 0

    async def Connect(self, request_iterator: Any, context: Any) -> None:
        conn = Conn()
        self.conns.put_nowait(conn)

        async def pump() -> None:
            async for m in request_iterator:
                conn.log.append((time.monotonic(), m))
                conn.inbox.put_nowait(m)

        reader = asyncio.create_task(pump())
        try:
            while True:
                getter = asyncio.create_task(conn.outbox.get())
                done, _ = await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    return
                out = getter.result()
                if out is DROP:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "dropped by the test")
                await context.write(out)
        finally:
            reader.cancel()
            conn.ended = True
            conn.inbox.put_nowait(None)

    async def GetMembership(self, request: Any, context: Any) -> cluster_pb2.Membership:
        self.membership_asked += 1
        if self.membership is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no membership here")
            raise AssertionError("unreachable")
        return self.membership

    async def accept(
        self,
        *,
        heartbeat_ms: int = 1_000,
        lease_ms: int = 60_000,
        membership: cluster_pb2.Membership | None = None,
        timeout: float = 5.0,
    ) -> tuple[Conn, pb.Hello]:
        """Welcome the next stream (with ``membership``, if given) once it says
        Hello; a stream the worker closed before its Hello is passed over."""
        while True:
            conn = await asyncio.wait_for(self.conns.get(), timeout)
            hello = await self.greet(
                conn, heartbeat_ms=heartbeat_ms, lease_ms=lease_ms, membership=membership
            )
            if hello is not None:
                return conn, hello

    async def greet(
        self,
        conn: Conn,
        *,
        heartbeat_ms: int = 1_000,
        lease_ms: int = 60_000,
        membership: cluster_pb2.Membership | None = None,
    ) -> pb.Hello | None:
        """Welcome ``conn`` once it says Hello (None: it ended first)."""
        first = await asyncio.wait_for(conn.inbox.get(), 5)
        if first is None:
            return None
        assert first.WhichOneof("kind") == "hello", "Hello must be the first message"
        conn.send(
            welcome=pb.Welcome(
                node_id=self.node_id,
                grace_lease_ms=5_000,
                lease_ms=lease_ms,
                heartbeat_interval_ms=heartbeat_ms,
                membership=membership,
            )
        )
        return first.hello


@contextlib.asynccontextmanager
async def nodes(*node_ids: str) -> AsyncIterator[list[tuple[ScriptedNode, str]]]:
    """One scripted node per id, each on its own loopback server."""
    servers = []
    out = []
    try:
        for node_id in node_ids:
            server = grpc.aio.server()
            svc = ScriptedNode(node_id)
            pb_grpc.add_WorkerServiceServicer_to_server(svc, server)
            admin_service_pb2_grpc.add_AdminServiceServicer_to_server(svc, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            servers.append(server)
            out.append((svc, f"127.0.0.1:{port}"))
        yield out
    finally:
        for server in servers:
            await server.stop(None)


@contextlib.asynccontextmanager
async def node() -> AsyncIterator[tuple[ScriptedNode, str]]:
    async with nodes("node-1") as [one]:
        yield one


def membership(
    version: int,
    members: Mapping[str, str],
    owner: Callable[[int], str] | str = "",
) -> cluster_pb2.Membership:
    """A membership of ``members`` (node id -> address) where ``owner`` owns
    every shard (a node id), or ``owner(shard)`` owns each."""
    owners = [owner(s) if callable(owner) else owner for s in range(SHARD_COUNT)]
    return cluster_pb2.Membership(
        version=version,
        members=[cluster_pb2.Member(node_id=n, address=a) for n, a in members.items()],
        shard_owners=owners,
    )


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(worker.run())
    try:
        yield task
    finally:
        worker.stop()
        await asyncio.wait_for(task, 5)


def scenario(fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(fn(), 20))


def assignment(
    run_id: int, handler: str, *, fence: int | None = None, timeout_ms: int = 10_000, **kw: Any
) -> pb.Assignment:
    """Run ``run_id`` of job ``run_id * 10`` (fence ``run_id + 1000`` unless given)."""
    return pb.Assignment(
        run_id=run_id,
        job_id=run_id * 10,
        handler=handler,
        fence=run_id + 1000 if fence is None else fence,
        timeout_ms=timeout_ms,
        attempt=kw.pop("attempt", 1),
        lease_ms=5_000,
        **kw,
    )


def shard(run_id: int) -> int:
    """The shard of the job ``assignment(run_id, ...)`` runs."""
    return shard_of(run_id * 10)


def assign(conn: Conn, *runs: pb.Assignment) -> None:
    conn.send(assignments=pb.Assignments(assignments=list(runs)))


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.005)


def refs(hb: pb.Heartbeat) -> set[tuple[int, int]]:
    return {(r.run_id, r.fence) for r in hb.runs}
