"""A real node and gRPC server on loopback (SQLite in a temporary directory),
shared by the tests of a module; each test uses names and tenants of its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.rpc.test_api import InProcessServer
from wheel.client import Client


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    server = InProcessServer(tmp_path_factory.mktemp("client")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def client(node: InProcessServer) -> Iterator[Client]:
    with Client(node.target, timeout=10) as c:
        yield c
