"""A real node and gRPC server with ``--auth`` (in process, on SQLite or a
real PostgreSQL), and tokens of several tenants minted into its store."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from wheel.auth import ADMIN, JOBS_READ, JOBS_WRITE, OPERATOR, WORKER, metadata_of, mint
from wheel.engine.owner import OwnerConfig
from wheel.node import Node, NodeConfig
from wheel.rpc.server import serve
from wheel.rpc.v1 import (
    admin_service_pb2_grpc,
    job_service_pb2_grpc,
    node_service_pb2_grpc,
    worker_service_pb2_grpc,
)
from wheel.store.open import open_store

# Short, so the tests of revocation on open streams wait little.
RECHECK_S = 0.3


class AuthServer:
    """``Node`` + ``serve(auth=True)`` on their own loop in a thread."""

    def __init__(self, store_url: str, owner: OwnerConfig | None = None) -> None:
        self.store_url = store_url
        self.owner = owner or OwnerConfig()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.node: Node | None = None
        self.server: Any = None
        self.port = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> AuthServer:
        self.thread.start()
        self.run(self._start(), timeout=60)
        return self

    async def _start(self) -> None:
        store = open_store(self.store_url)
        self.node = Node(store, NodeConfig(owner=self.owner, checkpoint_dir=None))
        await self.node.start()
        self.server, self.port = await serve(
            self.node, "127.0.0.1:0", auth=True, recheck_s=RECHECK_S
        )

    def run(self, coro: Any, timeout: float = 10) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def mint(self, tenant: str, *scopes: str, **kw: Any) -> str:
        """A new token straight into the store; returns the bearer string."""
        assert self.node is not None
        minted = mint(tenant=tenant, scopes=list(scopes), now_ms=self.node.now_ms(), **kw)
        self.node.store.create_token(minted.record)
        return minted.token

    def stop(self) -> None:
        async def _stop() -> None:
            if self.server is not None:
                await self.server.stop(grace=0.5)
            if self.node is not None:
                await self.node.stop()
                self.node.store.close()

        try:
            self.run(_stop(), timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@dataclass
class Stubs:
    channel: grpc.Channel
    jobs: job_service_pb2_grpc.JobServiceStub
    admin: admin_service_pb2_grpc.AdminServiceStub
    workers: worker_service_pb2_grpc.WorkerServiceStub
    nodes: node_service_pb2_grpc.NodeServiceStub


@dataclass
class Tokens:
    """A credential per role: tenants acme and beta, an operator, others."""

    acme_rw: str
    acme_read: str
    beta_rw: str
    operator: str
    acme_worker: str
    expired: str
    revoked: str


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/wheel.db"
    return str(request.getfixturevalue("pg_dsn"))


@pytest.fixture
def server(store_url: str) -> Iterator[AuthServer]:
    s = AuthServer(store_url).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def stubs(server: AuthServer) -> Iterator[Stubs]:
    channel = grpc.insecure_channel(server.target)
    try:
        yield Stubs(
            channel,
            job_service_pb2_grpc.JobServiceStub(channel),
            admin_service_pb2_grpc.AdminServiceStub(channel),
            worker_service_pb2_grpc.WorkerServiceStub(channel),
            node_service_pb2_grpc.NodeServiceStub(channel),
        )
    finally:
        channel.close()


@pytest.fixture
def tokens(server: AuthServer) -> Tokens:
    assert server.node is not None
    revoked = server.mint("acme", JOBS_READ, JOBS_WRITE)
    server.node.store.revoke_token(revoked.split("_")[1], server.node.now_ms())
    expired = mint(
        tenant="acme",
        scopes=[JOBS_READ, JOBS_WRITE],
        now_ms=server.node.now_ms() - 10_000,
        ttl_ms=1_000,
    )
    server.node.store.create_token(expired.record)
    return Tokens(
        acme_rw=server.mint("acme", JOBS_READ, JOBS_WRITE),
        acme_read=server.mint("acme", JOBS_READ),
        beta_rw=server.mint("beta", JOBS_READ, JOBS_WRITE),
        operator=server.mint(OPERATOR, JOBS_READ, JOBS_WRITE, ADMIN),
        acme_worker=server.mint("acme", WORKER, worker_id="acme-w1", pools=["acme/main"]),
        expired=expired.token,
        revoked=revoked,
    )


def md(token: str | None) -> tuple[tuple[str, str], ...]:
    return metadata_of(token)
