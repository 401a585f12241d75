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


def test_a_run_that_returns_while_its_owner_is_dead_gives_its_permit_back_at_once(
    cluster: Cluster,
) -> None:
    """Two permits: a short run on one node and a long one on another hold
    them, a third fire waits. The short run's owner is SIGKILLed while it
    runs; when its handler returns, its worker cannot tell its owner, and
    another node gives its permit back at once. The waiting fire starts
    before the dead owner's run is ended in the store (by the shard's next
    owner, which gives nothing back again), and no more than two runs of
    the key ever overlap."""
    client = Client(cluster.targets, timeout=5.0)
    try:
        client.set_limit("pair", max_concurrent=2)
        later = utc(now_ms() + 3_600_000)
        kinds = {"short": 2.0, "long": 60.0, "tiny": 0.3}
        made = {
            kind: [
                client.submit(
                    name=f"{kind}-{i}",
                    handler=HANDLER,
                    at=later,
                    payload=json.dumps({"sleep_s": sleep}).encode(),
                    concurrency_key="pair",
                ).job_id
                for i in range(9)
            ]
            for kind, sleep in kinds.items()
        }
        held = cluster.ownership().held

        def owner(job: int) -> str:
            return next(n for n, shards in held.items() if shard_of(job) in shards)

        short, victim_id, long_, tiny = next(
            (s, owner(s), lj, t)
            for s in made["short"]
            for lj in made["long"]
            for t in made["tiny"]
            if owner(s) != owner(lj) and owner(s) != owner(t)
        )
        victim = cluster.node(victim_id)
        client.trigger(long_)
        client.trigger(short)

        def started(job: int) -> list[dict[str, Any]]:
            return [e for e in events(cluster.out) if e["job"] == job and e["event"] == "start"]

        wait_for(lambda: started(short) and started(long_), 20, "both runs to start", 0.1)
        client.trigger(tiny)
        wait_for(lambda: waiting_of(client, "pair") == 1, 10, "the third fire to wait", 0.1)
        victim.kill()
        wait_for(lambda: started(tiny), 20, "the waiting fire to start", 0.1)
        live = [n for n in cluster.nodes if n is not victim]
        cluster.wait_whole(live=live, timeout=TTL_S + 10)

        def ended_in_store() -> list[Any]:
            return [
                e
                for e in cluster.truth.executions()
                if e.job_id == short and e.state not in ("dispatched", "running")
            ]

        wait_for(ended_in_store, 30, "the dead owner's run to end in the store", 0.2)
        [run] = ended_in_store()
        [short_start] = started(short)
        assert run.run_id == short_start["run"] and run.state == "succeeded"
        # The waiting fire went before the shard's next owner ended the run.
        assert started(tiny)[0]["t"] * 1000 < run.finished_at_ms
        # Only the long run holds a permit now: nothing was given back twice.
        [limit] = [x for x in client.limits() if x.key == "pair"]
        assert limit.in_flight == 1
    finally:
        client.close()
    ours = {e.run_id for e in cluster.truth.executions() if e.job_id in (short, long_, tiny)}
    most, _ = max_overlap(events(cluster.out), ours)
    assert most <= 2
    assert [e for e in events(cluster.out) if e["job"] == short and e["event"] == "start"] == [
        short_start
    ]


def waiting_of(client: Client, key: str) -> int:
    return sum(x.waiting for x in client.limits() if x.key == key)
