"""etcd stops for twice the lease TTL under load: every node goes quiet by its
own clock (safety over liveness), and once etcd is back they take the shards
again under new epochs with no fire lost or run twice."""

from __future__ import annotations

import pytest

from testkit.cluster import SAFETY_MARGIN_S, TTL_S, Cluster, Load, now_ms, wait_every_fire_resolved
from testkit.procs import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.etcd]


def test_an_etcd_outage_of_twice_the_ttl_stops_dispatch_and_loses_nothing(
    cluster: Cluster,
) -> None:
    truth = cluster.truth
    ids = {n.node_id for n in cluster.nodes}
    load = Load(targets=lambda: [n.target for n in cluster.nodes], rate=20, intervals=20)
    load.start()
    try:
        wait_for(lambda: len(truth.executions()) >= 40, 20, "the load to be running", 0.3)
        before = cluster.ownership().holder_epochs()
        down_ms = now_ms()
        cluster.etcd.stop()
        # Every node's last keepalive went out before etcd stopped.
        quiet_ms = down_ms + round((TTL_S - SAFETY_MARGIN_S) * 1000)
        wait_for(
            lambda: (own := cluster.ownership()).views.keys() == ids and not any(own.held.values()),
            TTL_S + 2,
            "every node to let go of its shards",
            0.1,
        )
        # The outage lasts twice the TTL: a wait for time itself, not for a result.
        wait_for(lambda: now_ms() >= down_ms + 2 * TTL_S * 1000, 2 * TTL_S + 1, "2 x TTL")
        up_ms = now_ms()
        cluster.etcd.start()

        own = cluster.wait_settled(live=cluster.nodes, timeout=TTL_S + 15)
        after = own.holder_epochs()
        assert all(after[s][1] > before[s][1] for s in after)
        wait_for(
            lambda: sum(1 for e in truth.executions() if e.dispatched_at_ms > up_ms) >= 40,
            15,
            "dispatch to resume",
            0.3,
        )
    finally:
        end_ms = load.stop()
    runs = truth.executions()
    # Nothing was dispatched between the nodes' deadlines and etcd's return.
    quiet = [e for e in runs if quiet_ms < e.dispatched_at_ms < up_ms]
    assert quiet == [], quiet[:5]
    wait_every_fire_resolved(truth, load.snapshot(), end_ms, timeout=30)
    assert truth.double_successes() == []
    assert truth.missed_and_run() == []
