"""Three nodes share the 256 shards, and a job fires on its shard's owner
whichever node it was submitted through."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.cluster.harness import HANDLER, PAYLOAD, Cluster, now_ms, utc
from tests.e2e.e2e_handlers import events
from tests.e2e.procs import wait_for
from wheel.client import JobRequest
from wheel.engine.model import SHARD_COUNT, shard_of

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.etcd]

JOBS = 1_000


def test_three_nodes_split_the_shards_disjointly_and_agree_on_it(cluster: Cluster) -> None:
    own = cluster.ownership()
    ids = {n.node_id for n in cluster.nodes}
    assert own.settled_on(ids), own
    assert own.disjoint_and_whole()
    # Every node names all three members and the same owner for every shard.
    views = list(own.views.values())
    assert all(view == views[0] for view in views)
    assert set(views[0]) == set(range(SHARD_COUNT))
    # Each holds a share, none all or nothing (rendezvous: about a third each).
    shares = Counter(views[0].values())
    assert set(shares) == ids and all(40 <= n <= 130 for n in shares.values()), shares
    # The store was fenced by the same owners at the same epochs.
    fenced = cluster.truth.shard_epochs()
    assert {s: (node, epoch) for s, (epoch, node) in fenced.items()} == own.holder_epochs()


def test_a_thousand_jobs_submitted_through_one_node_each_fire_once_on_their_owner(
    cluster: Cluster,
) -> None:
    own = cluster.ownership()
    holders = own.holder_epochs()  # shard -> (node, epoch)
    entry = cluster.nodes[0]
    at = now_ms() + 2_000
    requests = [
        JobRequest(
            name=f"once-{i}",
            handler=HANDLER,
            # Spread over a second: the three owners fire theirs side by side.
            at=utc(at + i % 1000),
            payload=PAYLOAD,
        )
        for i in range(JOBS)
    ]
    results = entry.client().submit_many(requests)
    job_ids = [r.job_id for r in results if not isinstance(r, Exception)]
    assert len(job_ids) == JOBS, [r for r in results if isinstance(r, Exception)][:3]
    # Most jobs belong to shards the entry node does not own.
    foreign = [j for j in job_ids if holders[shard_of(j)][0] != entry.node_id]
    assert len(foreign) > JOBS // 2

    truth = cluster.truth
    wait_for(
        lambda: sum(e.state == "succeeded" for e in truth.executions()) >= JOBS,
        30,
        f"{JOBS} succeeded runs",
        0.5,
    )
    runs = truth.executions()
    by_job: dict[int, list[tuple[int, str, int]]] = {}
    for e in runs:
        by_job.setdefault(e.job_id, []).append((e.attempt, e.state, e.fence))
    assert set(by_job) == set(job_ids)
    once = [j for j, rs in by_job.items() if len(rs) == 1 and rs[0][:2] == (0, "succeeded")]
    assert len(once) == JOBS, {j: rs for j, rs in by_job.items() if j not in set(once)}

    # Fired on the owner: each run's fence carries the epoch its shard's
    # owner holds it under, and no other node holds that epoch of that shard.
    fired_by: Counter[str] = Counter()
    for e in runs:
        node, epoch = holders[e.shard]
        assert e.epoch == epoch, (e, node, epoch)
        fired_by[node] += 1
    expected = Counter(holders[shard_of(j)][0] for j in job_ids)
    assert fired_by == expected
    assert len(fired_by) == 3

    # The workers ran each fire exactly once, with the fence the owner issued.
    wait_for(lambda: len(_ends(cluster)) >= JOBS, 10, "the handlers' end events")
    ends = _ends(cluster)
    assert Counter(j for j, _ in ends) == Counter(job_ids)
    assert {(j, f) for j, f in ends} == {(e.job_id, e.fence) for e in runs}

    # Ownership did not move meanwhile: the holders are those we judged by.
    assert cluster.ownership().holder_epochs() == holders


def _ends(cluster: Cluster) -> list[tuple[int, int]]:
    return [
        (ev["job"], ev["fence"])
        for ev in events(cluster.out)
        if ev["event"] == "end" and ev["outcome"] == "succeeded"
    ]
