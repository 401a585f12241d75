"""A node of a cluster keeps a checkpoint, and a node restarted takes its
shards back from it and the store's changes since its stop (the store
wins), not from the store alone: what changed through the other nodes while
it was down holds, and nothing it held is lost."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from testkit.cluster import TTL_S, Cluster, ClusterNode, held_jobs, now_ms
from testkit.procs import wait_for
from wheel.client import Job, JobRequest
from wheel.engine.model import shard_of

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.etcd]


def test_a_restarted_node_takes_its_shards_back_from_its_checkpoint(cluster: Cluster) -> None:
    entry = cluster.nodes[0]
    victim = cluster.nodes[2]
    later = datetime.now(UTC) + timedelta(days=3)
    idle = [
        JobRequest(name=f"idle-{i}", handler="record", every=timedelta(days=1), start=later)
        for i in range(3_000)
    ]
    made = [j for j in entry.client().submit_many(idle) if isinstance(j, Job)]
    assert len(made) == 3_000
    mine = set(cluster.ownership().held[victim.node_id])
    # A job of the victim's shards that fires every second, to be paused
    # while the victim is down.
    ticking: Job | None = None
    while ticking is None:
        job = entry.client().submit(name="tick", handler="record", every=timedelta(seconds=1))
        if shard_of(job.job_id) in mine:
            ticking = job
    wait_for(lambda: held_jobs(cluster.nodes) == 3_001, 30, "the owners to hold all")
    # The victim's log has taken the rows by the time a snapshot runs: stop
    # it once its checkpoint holds them (SIGTERM: it hands its shards over).
    wait_for(lambda: _snapshot_logged(victim), 30, "the victim's snapshot")
    others = [n for n in cluster.nodes if n is not victim]
    victim.stop()
    cluster.wait_settled(live=others, timeout=TTL_S + 10)

    entry.client().pause(ticking.job_id)
    paused_at = now_ms()
    while True:  # a new job of the victim's shards, made while it is down
        born = entry.client().submit(name="born", handler="record", every=timedelta(seconds=1))
        if shard_of(born.job_id) in mine:
            break
        entry.client().cancel(born.job_id)

    victim.start()
    cluster.wait_settled(live=cluster.nodes, timeout=TTL_S + 15)
    log = (victim.data_dir.parent / f"server-{victim.starts}.log").read_text()
    assert "from its checkpoint" in log, log[-2_000:]
    # Every job is held once, the victim's among them.
    wait_for(lambda: held_jobs(cluster.nodes) == 3_002, 30, "every job held again")
    # What changed while it was down holds: the paused job does not fire
    # again, the new one does (on the victim).
    started = now_ms()
    wait_for(
        lambda: any(
            e.job_id == born.job_id and e.dispatched_at_ms > started
            for e in cluster.truth.executions(mine)
        ),
        20,
        "the job made while the victim was down to fire",
    )
    late = [
        e
        for e in cluster.truth.executions(mine)
        if e.job_id == ticking.job_id and e.dispatched_at_ms > paused_at + 1_000
    ]
    assert late == []


def _snapshot_logged(node: ClusterNode) -> bool:
    log = node.data_dir.parent / f"server-{node.starts}.log"
    return "snapshot of" in log.read_text()
