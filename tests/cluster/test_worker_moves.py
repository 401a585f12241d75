"""A worker of several nodes across a shard move and under load on all of
them: a completion the killed node never confirmed reaches the shard's new
owner (so a fire that succeeded is not run again), and the runs the worker
holds from all nodes together stay within its capacity."""

from __future__ import annotations

import asyncio
import collections
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.cluster import HANDLER, TTL_S, Cluster, now_ms, utc
from testkit.e2e_handlers import events
from testkit.procs import wait_for
from testkit.services import EtcdServer
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


@pytest.fixture
def one_worker_cluster(tmp_path: Path, etcd_server: EtcdServer, pg_dsn: str) -> Iterator[Cluster]:
    """Three nodes and one worker process, so every run is that worker's."""
    c = Cluster(tmp_path, etcd_server, pg_dsn, size=3, workers=1)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def test_a_completion_sent_to_a_node_killed_before_confirming_it_is_not_run_again(
    one_worker_cluster: Cluster,
) -> None:
    cluster = one_worker_cluster
    victim, survivors = cluster.nodes[0], cluster.nodes[1:]
    held = cluster.ownership().held[victim.node_id]
    jobs = _submit(survivors[0].target, 60, due_in_ms=1_500, payload={"sleep_s": 1.0})
    mine = {j for j in jobs if shard_of(j) in held}
    assert len(mine) >= 5, "too few jobs landed on the victim's shards"

    def started() -> dict[int, int]:
        return collections.Counter(e["job"] for e in events(cluster.out) if e["event"] == "start")

    def ended() -> set[int]:
        return {e["job"] for e in events(cluster.out) if e["event"] == "end"}

    wait_for(lambda: mine <= set(started()), 20, "the victim's runs to start")
    # Its store stops answering: the completions reach it but are never
    # written, so it never confirms them. Then it dies with them.
    cluster.links[victim.node_id].hold()
    wait_for(lambda: mine <= ended(), 20, "the victim's runs to end")
    victim.kill()
    cluster.wait_whole(live=survivors, timeout=TTL_S + 20)

    def succeeded() -> set[int]:
        runs = cluster.truth.executions()
        return {e.job_id for e in runs if e.state == "succeeded" and e.job_id in mine}

    wait_for(lambda: succeeded() == mine, 30, "the victim's fires to be recorded succeeded")
    runs = [e for e in cluster.truth.executions() if e.job_id in mine]
    # Each fire ran once: one handler start, one execution, its first attempt.
    assert {j: n for j, n in started().items() if j in mine and n > 1} == {}
    assert sorted((e.job_id, e.attempt, e.state) for e in runs) == [
        (j, 1, "succeeded") for j in sorted(mine)
    ]


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
