"""Every node restarted in turn under load (SIGTERM, then started again with
the same id and address): each hands its shards over as it stops, takes back
only its own share as it returns, and no fire is lost or run twice."""

from __future__ import annotations

import functools
import time

import pytest

from testkit.cluster import TTL_S, Cluster, ClusterNode, Load, wait_every_fire_resolved
from testkit.procs import wait_for
from wheel.coord.etcd import assign_shards
from wheel.engine.model import SHARD_COUNT

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.etcd]


def test_restarting_every_node_in_turn_under_load_loses_nothing_and_each_takes_its_share(
    cluster: Cluster,
) -> None:
    truth = cluster.truth
    ids = [n.node_id for n in cluster.nodes]
    shares = {node: sum(1 for o in assign_shards(ids).values() if o == node) for node in ids}
    down: set[str] = set()
    load = Load(
        targets=lambda: [n.target for n in cluster.nodes if n.node_id not in down],
        rate=20,
        intervals=20,
    )
    load.start()
    handed_over_s: dict[str, float] = {}
    try:
        wait_for(lambda: len(truth.executions()) >= 40, 20, "the load to be running", 0.3)
        for node in cluster.nodes:
            others = [n for n in cluster.nodes if n is not node]
            before = cluster.ownership().held[node.node_id]
            down.add(node.node_id)
            stopping = time.monotonic()
            node.stop()  # SIGTERM: hands its shards over before it exits
            cluster.wait_settled(live=others, timeout=TTL_S + 10)
            handed_over_s[node.node_id] = time.monotonic() - stopping

            node.start()
            down.discard(node.node_id)
            # While it joins, no view ever shows it holding more than its share.
            seen: list[int] = []
            wait_for(
                functools.partial(_joined, cluster, node, seen),
                TTL_S + 15,
                f"{node.node_id} to rejoin",
                0.05,
            )
            after = cluster.ownership().held[node.node_id]
            assert max(seen) <= shares[node.node_id] < SHARD_COUNT, (seen, shares)
            # Its share again (same id, same rendezvous weights), under newer epochs.
            assert set(after) == set(before)
            assert all(after[s] > before[s] for s in after)
        print(f"shards handed over after SIGTERM in {handed_over_s} s")
        # Every node runs work again under its new epochs.
        epochs = cluster.ownership().holder_epochs()
        wait_for(
            lambda: (
                {
                    epochs[e.shard][0]
                    for e in truth.executions()
                    if e.state == "succeeded" and epochs[e.shard][1] == e.epoch
                }
                == set(ids)
            ),
            15,
            "every node to run fires after the restarts",
            0.3,
        )
    finally:
        end_ms = load.stop()
    jobs = load.snapshot()
    assert load.refused == 0
    wait_every_fire_resolved(truth, jobs, end_ms, timeout=30)
    assert truth.double_successes() == []
    assert truth.missed_and_run() == []
    for share in shares.values():
        assert SHARD_COUNT // 3 - 40 <= share <= SHARD_COUNT // 3 + 40


def _joined(cluster: Cluster, node: ClusterNode, seen: list[int]) -> bool:
    """Whether the cluster settled with ``node`` back in; adds to ``seen``
    how many shards each answering node says ``node`` holds."""
    own = cluster.ownership()
    seen.append(len(own.held.get(node.node_id, {})))
    seen.extend(sum(1 for o in view.values() if o == node.node_id) for view in own.views.values())
    return own.settled_on({n.node_id for n in cluster.nodes})
