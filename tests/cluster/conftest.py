"""The cluster fixtures: a real three-node cluster (``testkit.cluster``), fresh per
test, or one per module for tests that leave it as they found it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.cluster import Cluster
from testkit.services import EtcdServer


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: EtcdServer, pg_dsn: str) -> Iterator[Cluster]:
    """One etcd, one fresh PostgreSQL schema, three nodes, two workers."""
    c = Cluster(tmp_path, etcd_server, pg_dsn, size=3, workers=2)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def shared_cluster(
    tmp_path_factory: pytest.TempPathFactory, module_etcd_server: EtcdServer, module_pg_dsn: str
) -> Iterator[Cluster]:
    """``cluster``, one for a module's tests: for tests that stop, kill, cut
    off or restart nothing, and judge only their own jobs' runs (another
    test's jobs may be in the store and the workers' events)."""
    c = Cluster(tmp_path_factory.mktemp("cluster"), module_etcd_server, module_pg_dsn)
    try:
        c.start()
        yield c
    finally:
        c.stop()
