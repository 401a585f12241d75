"""The standard gRPC health service tells the truth: NOT_SERVING while the
store cannot be reached (PostgreSQL behind a relay that is cut) or while the
node holds no shard it may dispatch, per service name, and SERVING again once
that is over."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from tests.ops._node import NOT_SERVING, SERVING, LiveNode, health, relay_to, scrape
from tests.rpc.test_api import wait_for
from wheel.client import AlertKind, Client
from wheel.coord.local import LocalCoordinator
from wheel.node import Health, NodeConfig
from wheel.rpc._health import (
    ADMIN_SERVICE,
    JOB_SERVICE,
    NODE_SERVICE,
    WORKER_SERVICE,
    statuses,
)
from wheel.store.base import Store

ALL = ("", JOB_SERVICE, WORKER_SERVICE, ADMIN_SERVICE)


def fast_health() -> NodeConfig:
    return NodeConfig(health_interval_s=0.1, probe_after_s=0.3, probe_timeout_s=1.0, retain_ms=None)


def test_each_service_serves_on_what_it_needs() -> None:
    up = statuses(Health(store=True, dispatching=True))
    assert set(up.values()) == {SERVING}
    assert set(up) == {"", JOB_SERVICE, WORKER_SERVICE, ADMIN_SERVICE, NODE_SERVICE}
    between = statuses(Health(store=True, dispatching=False))
    assert between[JOB_SERVICE] == between[NODE_SERVICE] == SERVING
    assert between[""] == between[WORKER_SERVICE] == NOT_SERVING
    storeless = statuses(Health(store=False, dispatching=True))
    assert {k for k, v in storeless.items() if v == SERVING} == {ADMIN_SERVICE}


@pytest.mark.postgres
def test_health_goes_not_serving_while_postgresql_is_unreachable_and_back_after(
    pg_dsn: str,
) -> None:
    with relay_to(pg_dsn) as (relay, dsn), LiveNode(dsn, fast_health()) as live:
        target = live.target

        def statuses_now() -> dict[str, int]:
            return {s: health(target, s) for s in ALL}

        assert set(statuses_now().values()) == {SERVING}
        relay.cut()
        wait_for(lambda: health(target, JOB_SERVICE) == NOT_SERVING, 10, "NOT_SERVING")
        down = statuses_now()
        assert down == {
            "": NOT_SERVING,
            JOB_SERVICE: NOT_SERVING,
            WORKER_SERVICE: NOT_SERVING,
            ADMIN_SERVICE: SERVING,
        }
        metrics = scrape(live.metrics_url)
        assert metrics["wheel_store_up"] == 0
        assert metrics['wheel_alerts_firing{kind="store_unreachable"}'] == 1
        assert metrics['wheel_store_errors_total{op="probe"}'] >= 1
        with Client(target) as client:
            out = client.alerts()
            assert out.firing == [AlertKind.STORE_UNREACHABLE]
            # The health check may see the store gone a moment before the
            # node's own report of it raises the alert (a loaded machine).
            wait_for(
                lambda: [a.kind for a in client.alerts().alerts] == [AlertKind.STORE_UNREACHABLE],
                10,
                "the store_unreachable alert raised",
            )
        relay.restore()
        wait_for(lambda: set(statuses_now().values()) == {SERVING}, 15, "SERVING again")
        assert scrape(live.metrics_url)["wheel_store_up"] == 1
        with Client(target) as client:
            job = client.submit(name="after", handler="h", at=timedelta(hours=1))
            assert client.get(job.job_id).name == "after"
            assert client.alerts().firing == []


def test_a_node_holding_no_shard_serves_jobs_but_not_workers(tmp_path: Path) -> None:
    coordinators: list[LocalCoordinator] = []

    def coordinator(store: Store) -> LocalCoordinator:
        made = LocalCoordinator("node-1", store.acquire_epochs)
        coordinators.append(made)
        return made

    url = f"sqlite:///{tmp_path / 'wheel.db'}"
    with LiveNode(url, fast_health(), coordinator=coordinator) as live:
        target = live.target
        # A member serves workers once the shards it was given are loaded.
        wait_for(lambda: health(target, WORKER_SERVICE) == SERVING, 10, "shards loaded")
        assert {s: health(target, s) for s in ALL} == dict.fromkeys(ALL, SERVING)
        [local] = coordinators
        live.run(local.stop())  # every shard released: a member between holds
        wait_for(lambda: health(target, WORKER_SERVICE) == NOT_SERVING, 10, "no shards")
        assert health(target, "") == NOT_SERVING
        assert health(target, JOB_SERVICE) == SERVING
        assert scrape(live.metrics_url)["wheel_dispatching"] == 0
        live.run(local.start())
        wait_for(lambda: health(target, WORKER_SERVICE) == SERVING, 10, "shards again")
        assert health(target, "") == SERVING
