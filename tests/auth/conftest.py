"""A real node and gRPC server with ``--auth`` (in process, on SQLite or a
real PostgreSQL), and tokens of several tenants minted into its store."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.ops._node import LiveNode
from wheel.auth import ADMIN, JOBS_READ, JOBS_WRITE, OPERATOR, WORKER, metadata_of, mint
from wheel.engine.owner import OwnerConfig
from wheel.node import NodeConfig
from wheel.rpc.v1 import (
    admin_service_pb2_grpc,
    job_service_pb2_grpc,
    node_service_pb2_grpc,
    worker_service_pb2_grpc,
)

# Short, so the tests of revocation on open streams wait little.
RECHECK_S = 0.3


class AuthServer(LiveNode):
    """A node's process with ``auth`` on its own loop in a thread."""

    def __init__(self, store_url: str, owner: OwnerConfig | None = None) -> None:
        config = NodeConfig(owner=owner or OwnerConfig(), checkpoint_dir=None)
        super().__init__(store_url, config, auth=True, recheck_s=RECHECK_S)

    def mint(self, tenant: str, *scopes: str, **kw: Any) -> str:
        """A new token straight into the store; returns the bearer string."""
        assert self.node is not None
        minted = mint(tenant=tenant, scopes=list(scopes), now_ms=self.node.now_ms(), **kw)
        self.node.store.create_token(minted.record)
        return minted.token


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
