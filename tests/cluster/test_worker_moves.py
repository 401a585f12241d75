"""A worker of several nodes under load on all of them: the runs it holds
from all nodes together stay within its capacity."""

from __future__ import annotations

import asyncio
import collections
import json
import threading
from pathlib import Path

import pytest

from tests.cluster.harness import HANDLER, Cluster, now_ms, utc
from tests.conftest import EtcdServer
from tests.e2e.procs import wait_for
from wheel.client import Client, JobRequest
from wheel.engine.model import shard_of
from wheel.worker import RunContext, Worker

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.etcd]


def _submit(target: str, count: int, *, due_in_ms: int, payload: dict[str, object]) -> list[int]:
    """``count`` one-shots due ``due_in_ms`` from now; their job ids."""
    at = utc(now_ms() + due_in_ms)
    requests = [
        JobRequest(
            name=f"once-{i}",
            handler=HANDLER,
            at=at,
            payload=json.dumps(payload).encode(),
            idempotency_key=f"once-{i}",
        )
        for i in range(count)
    ]
    with Client(target, timeout=5.0) as client:
        results = client.submit_many(requests)
    return [r.job_id for r in results]  # type: ignore[union-attr]


def test_a_worker_of_three_nodes_holds_at_most_its_capacity_from_all_of_them(
    tmp_path: Path, etcd_server: EtcdServer, pg_dsn: str
) -> None:
    capacity = 4
    cluster = Cluster(tmp_path, etcd_server, pg_dsn, size=3, workers=0)
    worker = Worker(cluster.targets, worker_id="global", capacity=capacity, reconnect_initial=0.05)
    peak = [0]
    by_node: dict[str, int] = collections.Counter()
    ran: list[int] = []

    async def scripted(ctx: RunContext) -> None:
        ran.append(ctx.job_id)
        await asyncio.sleep(0.2)

    worker.register(HANDLER, scripted)

    async def main() -> None:
        async def sample() -> None:
            while True:
                peak[0] = max(peak[0], worker.held)
                for link in worker._links:
                    by_node[link.node_id] = max(by_node[link.node_id], len(link.held))
                await asyncio.sleep(0.002)

        sampler = asyncio.create_task(sample())
        try:
            await worker.run()
        finally:
            sampler.cancel()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    try:
        cluster.start()
        thread.start()
        wait_for(lambda: worker.connected == 3, 20, "the worker to link to every node")
        jobs = _submit(cluster.targets[0], 90, due_in_ms=1_000, payload={})
        owners = cluster.ownership().holder_epochs()
        per_node = collections.Counter(owners[shard_of(j)][0] for j in jobs)
        assert len(per_node) == 3, f"work due on every node: {per_node}"

        def done() -> set[int]:
            runs = cluster.truth.executions()
            return {e.job_id for e in runs if e.state == "succeeded"}

        wait_for(lambda: set(jobs) <= done(), 60, "every fire to succeed")
    finally:
        worker.stop()
        thread.join(10)
        cluster.stop()
    assert sorted(collections.Counter(ran).values()) == [1] * len(jobs)
    assert peak[0] <= capacity, f"held {peak[0]} runs at once, capacity {capacity}"
    # Every node had runs held by the worker at some point: none was starved.
    assert sum(1 for n in by_node.values() if n > 0) == 3, by_node
