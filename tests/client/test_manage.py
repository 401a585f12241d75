"""Managing jobs with ``Client`` against a real node and a real worker: lists
page through, states change, trigger and backfill run fires, runs and missed
fires come back as typed ``Run`` values, and ``status`` reads the node."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.conftest import epoch_ms
from tests.rpc.test_api import InProcessServer, WorkerThread, wait_for
from wheel.client import (
    At,
    Backfill,
    Client,
    JobState,
    MissedReason,
    NodeStatus,
    Run,
    RunState,
    ShardStatus,
    Status,
    Trigger,
    WorkerStatus,
)
from wheel.errors import FailedPrecondition, InvalidArgument, NotFound
from wheel.worker import RunContext

MINUTE = timedelta(minutes=1)


def now() -> datetime:
    return datetime.now(UTC)


def test_jobs_pages_through_a_tenant_and_filters_by_state(client: Client) -> None:
    made: dict[str, list[int]] = {"list-a": [], "list-b": []}
    for i in range(7):
        tenant = "list-a" if i % 2 == 0 else "list-b"
        made[tenant].append(
            client.submit(name=f"j{i}", handler="h", at=MINUTE, tenant=tenant).job_id
        )
    client.pause(made["list-a"][0])

    assert [j.job_id for j in client.jobs(tenant="list-a", page_size=2)] == made["list-a"]
    assert [j.job_id for j in client.jobs(tenant="list-b", page_size=1)] == made["list-b"]
    paused = list(client.jobs(tenant="list-a", state="paused"))
    assert [(j.job_id, j.state) for j in paused] == [(made["list-a"][0], JobState.PAUSED)]
    active = client.jobs(tenant="list-a", state=JobState.ACTIVE, page_size=1)
    assert [j.job_id for j in active] == made["list-a"][1:]
    everyone = {j.job_id for j in client.jobs(page_size=3)}
    assert set(made["list-a"] + made["list-b"]) <= everyone
    assert list(client.jobs(tenant="nobody")) == []
    # A bad filter is refused when the call is made, not at the first item.
    with pytest.raises(InvalidArgument) as info:
        client.jobs(state="sleeping")
    assert info.value.field == "state"


def test_trigger_backfill_runs_pause_resume_and_cancel(
    node: InProcessServer, client: Client
) -> None:
    ran: list[datetime] = []

    def ok(ctx: RunContext) -> None:
        ran.append(datetime.fromtimestamp(ctx.scheduled_for_ms / 1000, UTC))

    with WorkerThread(node.target, "w-client", ok=ok):
        t = now()
        start = (t - 10 * MINUTE).replace(microsecond=0)
        # Minutely from ten minutes ago, far from its next fire: trigger and
        # backfill run fires now.
        job = client.submit(name="minutely", handler="ok", every=MINUTE, start=start).job_id

        trig = client.trigger(job)
        assert isinstance(trig, Trigger) and trig.job_id == job
        assert trig.scheduled_for >= t - timedelta(milliseconds=50)  # the node's clock
        assert trig.idempotency_key == f"{job}:{epoch_ms(trig.scheduled_for)}"
        wait_for(lambda: trig.scheduled_for in ran, 10, "the triggered run")

        back = client.backfill(job, start, t)
        assert isinstance(back, Backfill)
        expected = [start + k * MINUTE for k in range(11) if start + k * MINUTE < t]
        assert back.scheduled == len(back.scheduled_for)
        assert back.scheduled + back.skipped_existing == len(expected)
        assert set(back.scheduled_for) <= set(expected) and back.scheduled > 0
        wait_for(lambda: set(expected) <= set(ran), 10, "every backfilled fire to run")
        again = client.backfill(job, start.timestamp(), t.timestamp())
        assert (again.scheduled, again.skipped_existing) == (0, len(expected))
        wait_for(
            lambda: all(r.state is RunState.SUCCEEDED for r in client.runs(job) if r.run_id),
            10,
            "every run to succeed",
        )

        runs = list(client.runs(job))
        executions = [r for r in runs if r.run_id]
        assert all(isinstance(r, Run) for r in runs)
        assert sorted(r.scheduled_for for r in executions) == sorted(set(ran))
        # Newest fire first: the trigger's, then the backfilled ones claimed after it.
        places = [(r.scheduled_for, r.attempt) for r in executions]
        assert places == sorted(places, reverse=True)
        for r in executions:
            assert (r.worker_id, r.error, r.missed_reason, r.attempt) == ("w-client", None, None, 1)
            assert r.fence > 0 and r.idempotency_key == f"{job}:{epoch_ms(r.scheduled_for)}"
            assert r.dispatched_at is not None and r.finished_at is not None
            assert r.scheduled_for.tzinfo is UTC and r.dispatched_at <= r.finished_at
        # Paging with a page of 2 lists the same runs, and the filters work.
        assert list(client.runs(job, page_size=2)) == runs
        assert list(client.runs(job, states=["failed", RunState.DEAD_LETTERED])) == []
        assert list(client.runs(job, states=[RunState.SUCCEEDED])) == executions
        assert list(client.runs(job, states="succeeded")) == executions
        assert list(client.runs(job, states=[RunState.MISSED])) == []
        got = client.get(job, recent_runs=3, next_fires=2)
        assert got.recent_runs == executions[:3] and len(got.next_fires) == 2

        paused = client.pause(job)
        assert paused.state is JobState.PAUSED
        assert client.pause(job).state is JobState.PAUSED
        with pytest.raises(FailedPrecondition, match="paused"):
            client.trigger(job)
        resumed = client.resume(job)
        assert resumed.state is JobState.ACTIVE
        assert resumed.next_fire is not None and resumed.next_fire > now() - timedelta(seconds=1)
        cancelled = client.cancel(job)
        assert (cancelled.state, cancelled.next_fire) == (JobState.CANCELLED, None)
        assert client.cancel(job).state is JobState.CANCELLED  # idempotent

        # A fire the policy does not run is listed as a missed run, with its reason.
        skipped = client.submit(name="skipped", handler="ok", at=now() - MINUTE, catch_up="skip")
        missed = wait_for(lambda: list(client.runs(skipped.job_id)), 10, "the skipped fire")
        assert [(m.state, m.missed_reason, m.run_id) for m in missed] == [
            (RunState.MISSED, MissedReason.SKIPPED, 0)
        ]
        assert isinstance(skipped.schedule, At)
        assert missed[0].scheduled_for == skipped.schedule.time
        assert missed[0].finished_at is not None and missed[0].dispatched_at is None
        assert list(client.runs(skipped.job_id, states=[RunState.MISSED])) == missed
        assert list(client.runs(skipped.job_id, states=[RunState.SUCCEEDED])) == []


def test_unknown_jobs_are_not_found(client: Client) -> None:
    for call in (
        lambda: client.get(987_654_321),
        lambda: client.pause(987_654_321),
        lambda: list(client.runs(987_654_321)),
    ):
        with pytest.raises(NotFound):
            call()
    with pytest.raises(InvalidArgument) as info:
        client.get(0)
    assert info.value.field == "job_id"


def test_status_reads_the_node_its_shards_and_its_workers(
    node: InProcessServer, client: Client
) -> None:
    with WorkerThread(node.target, "w-status", ok=lambda ctx: None):
        st = client.status()
    assert isinstance(st, Status) and st.node_id == "node-1"
    assert st.nodes == [NodeStatus(node_id="node-1", address="", shards_owned=256)]
    assert st.shards == []
    assert st.workers >= 1 and st.worker_capacity >= 8
    # One row per worker, with the handlers it registered.
    [row] = [w for w in st.worker_list if w.worker_id == "w-status"]
    assert isinstance(row, WorkerStatus)
    assert (row.capacity, list(row.pools), list(row.handlers)) == (8, ["default"], ["ok"])
    assert len(st.worker_list) == st.workers
    assert isinstance(st.dispatch_lag_p99, timedelta) and st.dispatch_lag_p99 >= st.dispatch_lag_p50
    assert min(st.backlog, st.overdue_backlog, st.dispatched_total, st.missed_total) >= 0
    assert st.reaper_paused is False
    shards = client.status(include_shards=True).shards
    assert [s.shard for s in shards] == list(range(256))
    assert all(isinstance(s, ShardStatus) and s.owner == "node-1" for s in shards)
