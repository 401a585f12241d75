"""Shards that move: planned moves are prepared (a node leaving on SIGTERM
waits until the members taking its shards have loaded them, and a node
joining loads its shards before it becomes a member), and unplanned ones
load due first. Under steady fires on every shard, with enough idle jobs
that a load takes time: across a planned move no fire of a moving shard is
late by more than a second, none runs twice and none is lost; after a
SIGKILL the moved shards dispatch within the lease TTL and a second, and
every job is held again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from testkit.cluster import (
    TTL_S,
    Cluster,
    ClusterNode,
    Execution,
    Load,
    Ownership,
    held_jobs,
    now_ms,
    wait_every_fire_resolved,
)
from testkit.procs import wait_for
from wheel.client import Client, Job, JobRequest

pytestmark = [pytest.mark.slow, pytest.mark.timed, pytest.mark.postgres, pytest.mark.etcd]

IDLE_JOBS = 10_000
# A fire counts as late past this (the bound for a planned move).
LATE_MS = 1_000


def _late(executions: list[Execution], since_ms: int) -> list[tuple[int, int, int]]:
    """(job, fire, ms late) of first attempts due since ``since_ms`` that
    were claimed more than ``LATE_MS`` after they were due."""
    return [
        (e.job_id, e.scheduled_for, e.dispatched_at_ms - e.scheduled_for)
        for e in executions
        if e.attempt == 1
        and e.scheduled_for >= since_ms
        and e.dispatched_at_ms - e.scheduled_for > LATE_MS
    ]


def _gaps(before: Ownership, nodes: list[ClusterNode], shards: set[int]) -> dict[int, int]:
    """Shard -> ms it had no dispatching owner while it moved from its
    holder in ``before`` to its holder now, from the nodes' own records: the
    old holder's release of the epoch it held, the new one's dispatching
    since (negative: they overlapped, and the store refused the old one)."""
    old = before.holder_epochs()
    released: dict[tuple[str, int, int], int] = {}
    since: dict[int, tuple[str, int]] = {}
    for node in nodes:
        status = node.status()
        assert status is not None, f"{node.node_id} did not answer"
        for r in status.released:
            released[node.node_id, r.shard, r.epoch] = round(r.at.timestamp() * 1000)
        for row in status.shards:
            if row.dispatching_since is not None and row.shard in shards:
                since[row.shard] = (node.node_id, round(row.dispatching_since.timestamp() * 1000))
    assert since.keys() == shards, "a moved shard is not dispatched"
    return {
        s: at - released[old[s][0], s, old[s][1]]
        for s, (holder, at) in sorted(since.items())
        if holder != old[s][0]
    }


def _moves_said(cluster: Cluster) -> str:
    """What every life of every node logged about shards moving and about
    trouble (the node's own account of a late fire, for a failure message)."""
    words = ("took on", "handed over", "gained", "hand-off", "refused", "stall", "WARNING")
    worker_words = ("moved", "stray", "reports to", "connected to", "member", "stream", "WARNING")
    out: list[str] = []
    for node in cluster.nodes:
        for log in sorted(node.data_dir.parent.glob("server-*.log")):
            lines = log.read_text(errors="replace").splitlines()
            said = [line for line in lines if any(w in line for w in words)]
            out.append(f"--- {node.node_id} {log.name}")
            out.extend(said[-25:])
    for worker in cluster.workers:
        lines = worker.log_path.read_text(errors="replace").splitlines()
        out.append(f"--- {worker.worker_id}")
        out.extend([line for line in lines if any(w in line for w in worker_words)][-25:])
    return "\n".join(out)


def _doubled(executions: list[Execution], since_ms: int) -> list[tuple[int, int, int]]:
    """(job, fire, attempt) of every re-dispatch of a fire due since ``since_ms``."""
    return [
        (e.job_id, e.scheduled_for, e.attempt)
        for e in executions
        if e.attempt > 1 and e.scheduled_for >= since_ms
    ]


def test_a_sigterm_and_a_join_move_shards_with_no_late_double_or_lost_fire(
    cluster: Cluster,
) -> None:
    truth = cluster.truth
    _load_idle(cluster.nodes[0])
    victim = cluster.nodes[2]
    down: set[str] = set()
    # A fire a second on about half the shards, spread over the second.
    load = Load(
        targets=lambda: [n.target for n in cluster.nodes if n.node_id not in down],
        rate=0,
        intervals=128,
    )
    load.start()
    try:
        wait_for(lambda: len(truth.executions()) >= 256, 20, "the fires to run", 0.3)
        moving = set(cluster.ownership().held[victim.node_id])

        # SIGTERM: the others load its shards while it serves them.
        left_at = now_ms()
        down.add(victim.node_id)
        victim.stop()
        others = [n for n in cluster.nodes if n is not victim]
        after_leave = cluster.wait_whole(live=others, timeout=TTL_S + 10)
        log = (victim.data_dir.parent / f"server-{victim.starts}.log").read_text()
        assert "hand-off prepared" in log, log[-3_000:]
        wait_for(lambda: now_ms() > left_at + 4_000, 10, "fires after the leave")
        leave = truth.executions(moving)
        late = _late(leave, left_at)
        assert late == [], f"fires late across the leave: {late}\n{_moves_said(cluster)}"

        # A join: it loads its shards before it becomes a member.
        joined_at = now_ms()
        victim.start()
        down.discard(victim.node_id)
        cluster.wait_whole(live=cluster.nodes, timeout=TTL_S + 20)
        log = (victim.data_dir.parent / f"server-{victim.starts}.log").read_text()
        assert "for a planned move" in log, log[-3_000:]
        # Each shard switched at one point: its old holder stopped, and the
        # joiner began, within the bound of each other.
        gaps = _gaps(after_leave, cluster.nodes, moving)
        print(f"join: no dispatching owner for at most {max(gaps.values())} ms")
        assert max(gaps.values()) <= LATE_MS, gaps
        wait_for(lambda: now_ms() > joined_at + 4_000, 30, "fires after the join")
        join = truth.executions(moving)
        late = _late(join, joined_at)
        assert late == [], f"fires late across the join: {late}\n{_moves_said(cluster)}"
    finally:
        end_ms = load.stop()
    wait_every_fire_resolved(truth, load.snapshot(), end_ms, timeout=30)
    assert _doubled(truth.executions(moving), left_at) == []
    assert truth.double_successes() == []
    assert truth.missed_and_run() == []


def test_a_sigkill_moves_shards_due_first_and_every_job_is_held_again(cluster: Cluster) -> None:
    """An unplanned move: the survivors fence the dead node's shards and load
    first the jobs due soon, dispatch them, and load the rest behind. The
    moved shards' fires go on within the lease TTL and a second, and once
    the rest is in every job is held again, once."""
    truth = cluster.truth
    _load_idle(cluster.nodes[0])
    victim = cluster.nodes[2]
    others = [n for n in cluster.nodes if n is not victim]
    load = Load(targets=lambda: [n.target for n in others], rate=0, intervals=128)
    load.start()
    try:
        wait_for(lambda: len(truth.executions()) >= 256, 20, "the fires to run", 0.3)
        moving = set(cluster.ownership().held[victim.node_id])
        killed_at = now_ms()
        victim.kill()
        cluster.wait_whole(live=others, timeout=TTL_S + 10)
        logs = "".join((n.data_dir.parent / f"server-{n.starts}.log").read_text() for n in others)
        assert "from the store, due first" in logs, logs[-3_000:]
        wait_for(lambda: held_jobs(others) == IDLE_JOBS + 128, 30, "every job held again")
        logs = "".join((n.data_dir.parent / f"server-{n.starts}.log").read_text() for n in others)
        assert "loaded the rest of" in logs
        wait_for(lambda: now_ms() > killed_at + (TTL_S + 4) * 1_000, 20, "fires after the move")
        moved = truth.executions(moving)
        old = {e.epoch for e in moved if e.dispatched_at_ms < killed_at}
        first = min(e.dispatched_at_ms for e in moved if e.epoch not in old)
        assert first - killed_at <= (TTL_S + 1) * 1_000
    finally:
        end_ms = load.stop()
    wait_every_fire_resolved(truth, load.snapshot(), end_ms, timeout=30)
    assert truth.double_successes() == []


def _load_idle(entry: ClusterNode) -> None:
    """``IDLE_JOBS`` daily jobs first due in three days, through ``entry``."""
    later = datetime.now(UTC) + timedelta(days=3)
    # Not the node's own client (3 s, for status): on a loaded machine a bulk
    # submit of 5,000 took longer than that.
    with Client(entry.target, timeout=60.0, security=entry.security) as client:
        for at in range(0, IDLE_JOBS, 5_000):
            idle = [
                JobRequest(name=f"idle-{i}", handler="record", every=timedelta(days=1), start=later)
                for i in range(at, at + 5_000)
            ]
            assert all(isinstance(j, Job) for j in client.submit_many(idle))
