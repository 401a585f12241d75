"""A node's ``/metrics``, scraped over HTTP from a real node (SQLite, real
gRPC, real workers): counters move as fires, claims, dispatches and run
endings happen; a killed worker's lease expiry and the re-dispatch that
follows show up; alerts are listed with their time, counted and logged with
their ids."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from tests.ops._node import LiveNode, scrape
from tests.rpc.test_api import WorkerThread, wait_for
from wheel.client import AlertKind, Client
from wheel.engine.owner import OwnerConfig
from wheel.logs import JsonFormatter
from wheel.node import NodeConfig
from wheel.worker import Permanent, RunContext

HERE = Path(__file__).resolve().parent


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveNode]:
    config = NodeConfig(
        owner=OwnerConfig(grace_lease_ms=800, lease_ms=1_500),
        retain_ms=None,
        min_interval_ms=0,  # a job of 200 ms overlaps its own runs
    )
    with LiveNode(f"sqlite:///{tmp_path / 'wheel.db'}", config) as node:
        yield node


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """What wheel logs meanwhile, one JSON object a line."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("wheel")
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.INFO
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def records(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def moved(url: str, name: str, by: float, before: dict[str, float], timeout: float = 10) -> None:
    """Wait until sample ``name`` grew by ``by`` from ``before``."""
    start = before.get(name, 0.0)
    wait_for(
        lambda: scrape(url).get(name, 0.0) - start >= by,
        timeout,
        f"{name} to grow by {by} from {start}",
    )


def test_a_fire_moves_its_counters_the_lag_histogram_and_the_worker_gauges(
    live: LiveNode,
) -> None:
    url = live.metrics_url
    with WorkerThread(live.target, "w1", report=lambda ctx: None), Client(live.target) as client:
        before = scrape(url)
        assert before["wheel_workers_connected"] == 1
        assert before['wheel_worker_capacity{worker="w1"}'] == 8
        assert before['wheel_worker_credit{worker="w1"}'] == 8
        assert before["wheel_shards_owned"] == 256
        assert before['wheel_shard_epoch{shard="17"}'] >= 1
        client.submit(name="once", handler="report", at=timedelta(milliseconds=100))
        done = 'wheel_run_completions_total{outcome="succeeded"}'
        moved(url, done, 1, before)
        after = scrape(url)
    assert after["wheel_fires_total"] - before["wheel_fires_total"] == 1
    won = 'wheel_claims_total{result="won"}'
    assert after[won] - before[won] == 1
    assert after["wheel_dispatches_total"] - before["wheel_dispatches_total"] == 1
    assert (
        after["wheel_dispatch_lag_seconds_count"] - before["wheel_dispatch_lag_seconds_count"] == 1
    )
    assert (
        after['wheel_dispatch_lag_seconds_bucket{le="+Inf"}']
        == after["wheel_dispatch_lag_seconds_count"]
    )
    assert after["wheel_store_batch_seconds_count"] > before["wheel_store_batch_seconds_count"]
    assert after["wheel_jobs"] == 0  # a one-shot that ran is done
    assert after["wheel_runs_in_flight"] == 0 and after["wheel_backlog"] == 0
    assert after["wheel_store_up"] == 1 and after["wheel_dispatching"] == 1


def test_missed_fires_are_counted_by_their_reason(live: LiveNode) -> None:
    url = live.metrics_url

    def slow(ctx: RunContext) -> None:
        time.sleep(0.6)

    with WorkerThread(live.target, "w1", slow=slow), Client(live.target) as client:
        before = scrape(url)
        job = client.submit(
            name="tight", handler="slow", every=timedelta(milliseconds=200), overlap="skip"
        )
        moved(url, 'wheel_missed_fires_total{reason="overlap"}', 1, before)
        client.cancel(job.job_id)


def test_a_killed_workers_lease_expiry_and_the_redispatch_show_up(
    live: LiveNode, tmp_path: Path, json_log: io.StringIO
) -> None:
    url = live.metrics_url
    env = dict(os.environ, PYTHONPATH=f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    args = ["worker", "--target", live.target, "--worker-id", "doomed", "hang=ops_handlers:hang"]
    with open(tmp_path / "worker.log", "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "wheel", *args],
            env=env,
            stdout=out,
            stderr=out,
        )
    try:
        with Client(live.target) as client:
            wait_for(lambda: client.status().workers == 1, 15, "the worker to connect")
            before = scrape(url)
            job = client.submit(name="held", handler="hang", at=timedelta(milliseconds=50))
            moved(url, "wheel_runs_in_flight", 1, before)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            moved(url, "wheel_lease_expiries_total", 1, before)
            # The store applies the lost attempt a batch later.
            moved(url, 'wheel_run_completions_total{outcome="lost"}', 1, before)
            # No worker left: re-dispatch waits, and says why.
            wait_for(
                lambda: scrape(url)['wheel_alerts_firing{kind="reaper_paused"}'] == 1,
                10,
                "the reaper's circuit breaker",
            )
            with WorkerThread(live.target, "rescuer", hang=lambda ctx: None):
                moved(url, "wheel_redispatches_total", 1, before)
                moved(url, 'wheel_run_completions_total{outcome="succeeded"}', 1, before)
            alerts = client.alerts()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    after = scrape(url)
    assert after['wheel_alerts_firing{kind="reaper_paused"}'] == 0
    assert after['wheel_alerts_total{kind="reaper_paused"}'] >= 1
    assert AlertKind.REAPER_PAUSED in [a.kind for a in alerts.alerts]
    [expired] = [r for r in records(json_log) if "lease expired" in str(r["message"])]
    assert expired["job_id"] == job.job_id and expired["worker"] == "doomed"
    assert {"run_id", "fence", "shard"} <= expired.keys()


def test_a_dead_letter_is_an_alert_listed_counted_and_logged_with_its_ids(
    live: LiveNode, json_log: io.StringIO
) -> None:
    url = live.metrics_url

    def fail(ctx: RunContext) -> None:
        raise Permanent("no good")

    with WorkerThread(live.target, "w1", fail=fail), Client(live.target) as client:
        before = scrape(url)
        started = client.alerts().alerts
        job = client.submit(name="doomed", handler="fail", at=timedelta(milliseconds=50), retry=1)
        moved(url, 'wheel_alerts_total{kind="dead_lettered"}', 1, before)
        out = client.alerts(since=time.time() - 60)
        status = client.status()
    assert scrape(url)['wheel_run_completions_total{outcome="dead_lettered"}'] >= 1
    [alert] = [a for a in out.alerts if a not in started]
    assert alert.kind is AlertKind.DEAD_LETTERED and alert.job_id == job.job_id
    assert alert.run_id is not None and alert.fence is not None and alert.worker_id == "w1"
    assert abs(alert.at.timestamp() - time.time()) < 30
    assert out.firing == [] and status.alerts_firing == []
    [logged] = [r for r in records(json_log) if r.get("alert") == "dead_lettered"]
    assert logged["level"] == "WARNING" and logged["logger"] == "wheel.node"
    assert (logged["job_id"], logged["run_id"], logged["fence"], logged["worker"]) == (
        job.job_id,
        alert.run_id,
        alert.fence,
        "w1",
    )
    assert isinstance(logged["shard"], int)


def test_late_dispatches_breach_the_lag_objective_and_it_clears_after(tmp_path: Path) -> None:
    config = NodeConfig(
        # All four late runs in before the objective is judged: submits one by
        # one could otherwise straddle a check and be judged three of three.
        lag_slo_min_samples=4,
        lag_slo_window_s=1.5,
        health_interval_s=0.1,
        retain_ms=None,
    )
    with (
        LiveNode(f"sqlite:///{tmp_path / 'wheel.db'}", config) as live,
        WorkerThread(live.target, "w1", h=lambda ctx: None),
        Client(live.target) as client,
    ):
        url = live.metrics_url
        # One-shots whose time passed 3 s ago: due at once, each 3 s late.
        for i in range(4):
            client.submit(name=f"late-{i}", handler="h", at=time.time() - 3)
        wait_for(lambda: scrape(url)['wheel_alerts_firing{kind="lag_slo"}'] == 1, 10, "the breach")
        out = client.alerts()
        assert out.firing == [AlertKind.LAG_SLO]
        [alert] = out.alerts
        assert alert.kind is AlertKind.LAG_SLO and "4 of 4 runs" in alert.message
        late = scrape(url)
        slow = (
            late["wheel_dispatch_lag_seconds_count"]
            - late['wheel_dispatch_lag_seconds_bucket{le="2.5"}']
        )
        assert slow == 4
        # Nothing late since: once the window passes it, the objective holds.
        wait_for(lambda: client.alerts().firing == [], 10, "the breach to clear")
        assert scrape(url)['wheel_alerts_total{kind="lag_slo"}'] == 1


def test_a_stalled_loop_shows_in_the_stall_metrics(live: LiveNode, json_log: io.StringIO) -> None:
    url = live.metrics_url
    before = scrape(url)
    live.call(lambda: time.sleep(0.3))  # holds the node's loop as a long load would
    wait_for(
        lambda: scrape(url).get("wheel_loop_stall_max_seconds", 0.0) >= 0.25,
        10,
        "the stall's length",
    )
    after = scrape(url)
    assert after["wheel_loop_stall_seconds_count"] > before.get("wheel_loop_stall_seconds_count", 0)
    assert after['wheel_loop_stall_seconds_bucket{le="+Inf"}'] > 0
    assert any(
        str(r["message"]).startswith("the event loop stalled for ") for r in records(json_log)
    )
    # Traced only when asked (--trace-stalls).
    assert not any(
        str(r["message"]).startswith("the event loop stood still") for r in records(json_log)
    )


def hold_the_loop_on_the_cpu(seconds: float) -> None:
    """Spin until this thread has had ``seconds`` of CPU."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def hold_the_loop_asleep(seconds: float) -> None:
    time.sleep(seconds)


def test_a_traced_stall_is_logged_with_where_the_loop_stood_and_how_it_spent_the_time(
    tmp_path: Path, json_log: io.StringIO
) -> None:
    config = NodeConfig(retain_ms=None, trace_stalls_s=0.1)

    def traced(culprit: str) -> str:
        def found() -> str | None:
            for r in records(json_log):
                message = str(r["message"])
                if message.startswith("the event loop stood still") and culprit in message:
                    return message
            return None

        wait_for(lambda: found() is not None, 10, f"a stall trace naming {culprit}")
        message = found()
        assert message is not None
        return message

    with LiveNode(f"sqlite:///{tmp_path / 'wheel.db'}", config) as live:
        live.call(lambda: hold_the_loop_on_the_cpu(0.4))
        busy = traced("hold_the_loop_on_the_cpu")
        live.call(lambda: hold_the_loop_asleep(0.4))
        asleep = traced("hold_the_loop_asleep")
    assert "test_node_metrics.py" in busy
    stood = int(re.match(r"the event loop stood still for (\d+) ms", busy)[1])  # type: ignore[index]
    assert stood >= 350
    if sys.platform == "linux":  # the kernel's account of the loop thread
        on_cpu = int(re.search(r"on a CPU (\d+) ms", busy)[1])  # type: ignore[index]
        assert on_cpu >= 300
        slept = int(re.search(r"asleep \(the GIL, a lock\) (\d+) ms", asleep)[1])  # type: ignore[index]
        assert slept >= 300
        assert int(re.search(r"on a CPU (\d+) ms", asleep)[1]) < 100  # type: ignore[index]
