"""A concurrency key held across a real cluster: three nodes on PostgreSQL,
jobs of one key (max 3) spread over every node's shards, the handlers
recording their own start and end; an owner SIGKILLed mid-run and started
again. By the handlers' own clocks no more than 3 runs of the key ever
overlap, and nothing is lost: every run ends, and the key's count in the
store comes back to what is in flight."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from testkit.cluster import HANDLER, TTL_S, Cluster, now_ms, utc
from testkit.e2e_handlers import events
from testkit.procs import wait_for
from wheel.client import Client
from wheel.engine.model import shard_of

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.etcd]

MAX = 3
JOBS = 12


def max_overlap(evts: list[dict[str, Any]], runs: set[int]) -> tuple[int, int]:
    """The most runs of ``runs`` between their start and end at once, by the
    handlers' own records, and how many started without an end."""
    marks: list[tuple[float, int]] = []
    open_runs: set[int] = set()
    for e in evts:
        if e["run"] not in runs or e["event"] not in ("start", "end"):
            continue
        t = float(e["t"])
        if e["event"] == "start":
            marks.append((t, 1))
            open_runs.add(int(e["run"]))
        else:
            marks.append((t, -1))
            open_runs.discard(int(e["run"]))
    # Ends sort before starts at the same instant: a permit handed on.
    marks.sort()
    most = now = 0
    for _, step in marks:
        now += step
        most = max(most, now)
    return most, len(open_runs)


def test_a_key_holds_its_limit_across_nodes_and_an_owner_s_sigkill(cluster: Cluster) -> None:
    client = Client(cluster.targets[0], timeout=5.0)
    try:
        # Fires waiting on every member add up in one node's answer: one
        # run of "one" at a time, the others' fires wait where their jobs are.
        client.set_limit("one", max_concurrent=1)
        at = utc(now_ms() + 1_000)
        long_ones = [
            client.submit(
                name=f"long-{i}",
                handler=HANDLER,
                at=at,
                payload=json.dumps({"sleep_s": 30}).encode(),
                concurrency_key="one",
            ).job_id
            for i in range(JOBS)
        ]

        held = cluster.ownership().held
        spread = {n for n, shards in held.items() if any(shard_of(j) in shards for j in long_ones)}
        assert len(spread) >= 2, f"the jobs' shards are all on {spread}"

        def waiting_one() -> int:
            return next(x.waiting for x in client.limits() if x.key == "one")

        wait_for(lambda: waiting_one() == JOBS - 1, 20, "every fire of 'one' but one to wait", 0.2)
        for j in long_ones:
            client.cancel(j)
        client.set_limit("db", max_concurrent=MAX)
        first = now_ms() + 1_500
        jobs = [
            client.submit(
                name=f"keyed-{i}",
                handler=HANDLER,
                every=timedelta(seconds=1),
                start=utc(first + i * 80),
                payload=json.dumps({"sleep_s": 0.4}).encode(),
                concurrency_key="db",
            ).job_id
            for i in range(JOBS)
        ]
        held = cluster.ownership().held
        owners = {node for node, shards in held.items() if any(shard_of(j) in shards for j in jobs)}
        assert len(owners) >= 2, f"the jobs' shards are all on {owners}"
        victim = next(n for n in cluster.nodes if n.node_id in owners)

        def ended() -> int:
            return sum(1 for e in events(cluster.out) if e["event"] == "end")

        wait_for(lambda: ended() >= 15, 30, "runs of the key to end", 0.2)
        victim.kill()
        live = [n for n in cluster.nodes if n is not victim]
        cluster.wait_whole(live=live, timeout=TTL_S + 10)
        before = ended()
        wait_for(lambda: ended() >= before + 10, 30, "runs to go on after the kill", 0.2)
        victim.start()
        cluster.wait_settled(live=cluster.nodes, timeout=20)
        before = ended()
        wait_for(lambda: ended() >= before + 10, 30, "runs to go on after the restart", 0.2)
        for j in jobs:
            client.pause(j)

        def settled() -> bool:
            runs = [e for e in cluster.truth.executions() if e.job_id in jobs]
            return all(e.state not in ("dispatched", "running") for e in runs)

        wait_for(settled, 30, "every run of the key to end", 0.3)
        [limit] = [x for x in client.limits() if x.key == "db"]
        assert limit.in_flight == 0
    finally:
        client.close()
    ours = {e.run_id for e in cluster.truth.executions() if e.job_id in jobs}
    most, unended = max_overlap(events(cluster.out), ours)
    print(f"most runs of the key at once: {most} (limit {MAX}); {len(ours)} runs")
    assert most <= MAX
    assert unended == 0
    # Every job ran, on every owner it had.
    ran = {e.job_id for e in cluster.truth.executions() if e.state == "succeeded"}
    assert set(jobs) <= ran
