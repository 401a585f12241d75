"""Without ``--cluster`` a node is what it always was: one process owning all
256 shards, serving and dispatching on its own (a smoke test; tests/e2e has
the rest)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from testkit.cluster import HANDLER, PAYLOAD, ClusterWorker
from testkit.procs import ServerProc, wait_for
from wheel.client import Client, RunState
from wheel.engine.model import SHARD_COUNT

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def test_a_node_without_cluster_owns_every_shard_and_dispatches(
    tmp_path: Path, pg_dsn: str
) -> None:
    server = ServerProc(tmp_path / "data", store=pg_dsn, args=("--node-id", "solo"))
    server.start()
    worker = ClusterWorker([server.target], tmp_path / "runs", "w1")
    try:
        with Client(server.target) as client:
            status = client.status(include_shards=True)
            assert [(n.node_id, n.shards_owned) for n in status.nodes] == [("solo", SHARD_COUNT)]
            assert {s.shard for s in status.shards} == set(range(SHARD_COUNT))
            assert {s.owner for s in status.shards} == {"solo"}
            job = client.submit(
                name="smoke", handler=HANDLER, at=timedelta(milliseconds=300), payload=PAYLOAD
            )
            runs = wait_for(
                lambda: [r for r in client.runs(job.job_id) if r.state is RunState.SUCCEEDED],
                15,
                "the one-shot to succeed",
            )
            assert [(r.attempt, r.fence >> 32) for r in runs] == [
                (1, status.shards[job.shard].epoch)
            ]
    finally:
        worker.stop()
        server.stop()
