"""The ``cluster`` fixture: a real three-node cluster per test (see harness)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster
from tests.conftest import EtcdServer


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: EtcdServer, pg_dsn: str) -> Iterator[Cluster]:
    """One etcd, one fresh PostgreSQL schema, three nodes, two workers."""
    c = Cluster(tmp_path, etcd_server, pg_dsn, size=3, workers=2)
    try:
        c.start()
        yield c
    finally:
        c.stop()
