"""A worker's ``/metrics`` (``Worker(metrics_listen=...)``), scraped over
HTTP while it runs against a real node: runs by outcome, the handler
duration histogram by handler, the streams and slots."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from tests.ops._node import LiveNode, scrape
from tests.rpc.test_api import wait_for
from wheel.client import Client
from wheel.errors import InvalidArgument
from wheel.node import NodeConfig
from wheel.worker import Permanent, RunContext, Worker


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveNode]:
    with LiveNode(f"sqlite:///{tmp_path / 'wheel.db'}", NodeConfig(retain_ms=None)) as node:
        yield node


def test_a_workers_metrics_count_its_runs_by_outcome_and_time_its_handlers(
    live: LiveNode,
) -> None:
    def ok(ctx: RunContext) -> None:
        time.sleep(0.02)

    async def fail(ctx: RunContext) -> None:
        raise Permanent("no")

    worker = Worker(live.target, worker_id="wm", capacity=3, metrics_listen="127.0.0.1:0")
    worker.register("ok", ok)
    worker.register("fail", fail)
    thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
    thread.start()
    try:
        wait_for(lambda: worker.connected and worker.metrics_port, 10, "the worker to connect")
        url = f"http://127.0.0.1:{worker.metrics_port}/metrics"
        first = scrape(url)
        assert first["wheel_worker_streams_connected"] == 1
        assert first["wheel_worker_capacity_runs"] == 3
        with Client(live.target) as client:
            for handler in ("ok", "ok", "fail"):
                client.submit(name=handler, handler=handler, at=timedelta(milliseconds=20), retry=1)
        wait_for(
            lambda: (
                scrape(url).get('wheel_worker_runs_total{outcome="failed"}') == 1
                and scrape(url).get('wheel_worker_runs_total{outcome="succeeded"}') == 2
            ),
            10,
            "the three runs",
        )
        out = scrape(url)
    finally:
        worker.stop()
        thread.join(10)
    assert out["wheel_worker_runs_received_total"] == 3
    ok_runs = 'wheel_worker_handler_duration_seconds_count{handler="ok",outcome="succeeded"}'
    assert out[ok_runs] == 2
    ok_time = 'wheel_worker_handler_duration_seconds_sum{handler="ok",outcome="succeeded"}'
    assert out[ok_time] >= 0.04
    fail_runs = 'wheel_worker_handler_duration_seconds_count{handler="fail",outcome="failed"}'
    assert out[fail_runs] == 1
    assert out["wheel_worker_executing_runs"] == 0


def test_a_bad_metrics_address_is_refused_when_the_worker_is_made() -> None:
    with pytest.raises(InvalidArgument):
        Worker("127.0.0.1:1", metrics_listen="nowhere")
