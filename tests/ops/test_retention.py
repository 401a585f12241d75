"""A node purges finished history past its retention horizon in the
background, on SQLite and on PostgreSQL: finished runs and missed fires
older than ``retain_ms`` go, younger ones stay, and the rows deleted are
counted in its metrics."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.ops._node import LiveNode, scrape
from tests.rpc.test_api import wait_for
from wheel.engine.model import MissedReason, RunState
from wheel.engine.records import Completion, FireClaim, MissedFire, NewJob
from wheel.engine.spec import Interval, JobSpec
from wheel.node import NodeConfig
from wheel.store.open import open_store

DAY_MS = 86_400_000


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'wheel.db'}"
    return str(request.getfixturevalue("pg_dsn"))


def history(url: str, now_ms: int) -> tuple[int, set[int], set[int]]:
    """A job with 24 finished runs, one every 2.5 days back to 57.5 days
    ago, and as many missed fires; returns the job, and the fires of the runs
    and of the missed fires younger than 30 days."""
    store = open_store(url)
    try:
        spec = JobSpec(name="old", handler="h", schedule=Interval(period_ms=DAY_MS))
        job, _ = store.submit_job(
            NewJob(spec=spec, created_at_ms=now_ms - 61 * DAY_MS, next_run_at=now_ms + DAY_MS)
        )
        ages = [int(2.5 * DAY_MS * k) for k in range(24)]  # 0 .. 57.5 days
        fires = [now_ms - age - 1_000 for age in ages]
        outs = store.claim_fires(
            [
                FireClaim(
                    job_id=job.job_id,
                    scheduled_for=fire,
                    attempt=0,
                    fence=k,
                    dispatched_at_ms=fire,
                    advance=False,
                )
                for k, fire in enumerate(fires, start=1)
            ]
        )
        store.complete_runs(
            [
                Completion(
                    run_id=out.run_id,
                    fence=k,
                    state=RunState.SUCCEEDED,
                    finished_at_ms=fire + 500,
                )
                for k, (out, fire) in enumerate(zip(outs, fires, strict=True), start=1)
                if out.run_id is not None
            ]
        )
        store.record_missed(
            [
                MissedFire(
                    job_id=job.job_id,
                    scheduled_for=fire - 7,
                    reason=MissedReason.SKIPPED,
                    recorded_at_ms=fire,
                )
                for fire in fires
            ]
        )
    finally:
        store.close()
    young = {f for f in fires if f + 500 >= now_ms - 30 * DAY_MS}
    return job.job_id, young, {f - 7 for f in fires if f >= now_ms - 30 * DAY_MS}


def test_a_node_purges_history_past_its_horizon_in_the_background(store_url: str) -> None:
    now = time.time_ns() // 1_000_000
    job_id, young_runs, young_missed = history(store_url, now)
    assert 0 < len(young_runs) < 24 and 0 < len(young_missed) < 24
    config = NodeConfig(
        retain_ms=30 * DAY_MS,
        retention_first_s=0.05,
        retention_interval_s=3600,
        retention_batch=5,
        retention_share=0.5,
    )
    with LiveNode(store_url, config) as live:
        wait_for(
            lambda: scrape(live.metrics_url)["wheel_retention_passes_total"] >= 1,
            15,
            "a retention pass",
        )
        node = live.node
        assert node is not None
        runs, missed = live.run(
            node.list_history(job_id, before_run_id=None, before_scheduled_for=None, limit=100)
        )
        purged = scrape(live.metrics_url)["wheel_retention_purged_rows_total"]
    assert {r.scheduled_for for r in runs} == young_runs
    assert {m.scheduled_for for m in missed} == young_missed
    assert purged == (24 - len(young_runs)) + (24 - len(young_missed))
