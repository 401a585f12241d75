"""``AsyncClient`` against a real node over ``grpc.aio``: the core flow of
``Client`` (submit each kind, idempotency, lists that page, state changes,
trigger, backfill, runs, status) awaited, and errors as ``WheelError``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import pytest

from testkit.services import free_port
from tests.rpc.test_api import InProcessServer
from wheel.client import (
    AsyncClient,
    At,
    Cron,
    DstFold,
    DstGap,
    Every,
    Job,
    JobRequest,
    JobState,
    MissedReason,
    RunState,
)
from wheel.errors import FailedPrecondition, InvalidArgument, NotFound, WheelError

T = TypeVar("T")
MINUTE = timedelta(minutes=1)


async def collect(items: AsyncIterator[T]) -> list[T]:
    return [item async for item in items]


async def flow(target: str) -> None:
    async with AsyncClient(target, timeout=10) as client:
        cron = await client.submit(
            name="cron", handler="h", cron="0 3 * * *", tz="Asia/Tokyo", tenant="aio"
        )
        assert cron.created and cron.schedule == Cron(
            expr="0 3 * * *",
            tz="Asia/Tokyo",
            dst_gap=DstGap.FIRE_AT_TRANSITION,
            dst_fold=DstFold.FIRST,
        )
        every = await client.submit(
            name="every", handler="h", every=30, fixed_delay=True, tenant="aio", idempotency_key="e"
        )
        assert isinstance(every.schedule, Every) and every.schedule.fixed_delay
        again = await client.submit(
            name="every", handler="h", every=30, fixed_delay=True, tenant="aio", idempotency_key="e"
        )
        assert (again.job_id, again.created) == (every.job_id, False)
        before = datetime.now(UTC)
        soon = await client.submit(name="at", handler="h", at=MINUTE, tenant="aio")
        assert isinstance(soon.schedule, At)
        assert before + MINUTE - timedelta(milliseconds=1) <= soon.schedule.time
        many = await client.submit_many(
            [JobRequest(name="m1", handler="h", at=MINUTE, tenant="aio"), {"name": "m2"}],
        )
        assert isinstance(many[0], Job) and isinstance(many[1], InvalidArgument)
        assert many[1].field == "handler"

        ids = [cron.job_id, every.job_id, soon.job_id, many[0].job_id]
        listed = await collect(client.jobs(tenant="aio", page_size=1))
        assert [j.job_id for j in listed] == ids
        assert (await client.get(cron.job_id)).next_fire == cron.next_fire

        assert (await client.pause(every.job_id)).state is JobState.PAUSED
        with pytest.raises(FailedPrecondition):
            await client.trigger(every.job_id)
        paused = await collect(client.jobs(tenant="aio", state=JobState.PAUSED))
        assert [j.job_id for j in paused] == [every.job_id]
        assert (await client.resume(every.job_id)).state is JobState.ACTIVE
        trig = await client.trigger(every.job_id)
        assert trig.job_id == every.job_id and trig.scheduled_for.tzinfo is UTC
        start = datetime.now(UTC) - 10 * MINUTE
        back = await client.backfill(cron.job_id, start - timedelta(days=2), start)
        assert back.scheduled + back.skipped_existing == 2 == len(back.scheduled_for)
        assert (await client.cancel(soon.job_id)).state is JobState.CANCELLED

        skipped = await client.submit(
            name="skipped", handler="h", at=datetime.now(UTC) - MINUTE, catch_up="skip"
        )
        for _ in range(200):
            missed = await collect(client.runs(skipped.job_id, states=[RunState.MISSED]))
            if missed:
                break
            await asyncio.sleep(0.05)
        assert [(m.state, m.missed_reason) for m in missed] == [
            (RunState.MISSED, MissedReason.SKIPPED)
        ]
        for _ in range(200):  # the trigger's run, claimed with no worker to take it
            held = await collect(client.runs(trig.job_id, states=[RunState.DISPATCHED]))
            if held:
                break
            await asyncio.sleep(0.05)
        [run] = held
        one = await client.get_run(run.run_id)
        assert (one.run_id, one.job_id, one.state, one.result) == (
            run.run_id,
            every.job_id,
            RunState.DISPATCHED,
            None,
        )
        with pytest.raises(NotFound):
            await client.get_run(987_654_321)

        status = await client.status(include_shards=True)
        assert status.node_id == "node-1" and len(status.shards) == 256
        assert status.jobs >= len(ids)

        with pytest.raises(NotFound):
            await client.get(987_654_321)
        with pytest.raises(InvalidArgument) as info:
            await client.submit(name="x", handler="h", cron="61 * * * *")
        assert info.value.field == "spec.schedule.cron.expr"
        with pytest.raises(InvalidArgument) as info:
            await client.submit(name="x", handler="h")
        assert info.value.field == "schedule"


def test_the_async_client_runs_the_core_flow(node: InProcessServer) -> None:
    asyncio.run(flow(node.target))


def test_the_async_client_reports_an_unreachable_node_as_unavailable() -> None:
    async def call() -> None:
        async with AsyncClient(f"127.0.0.1:{free_port()}", timeout=0.5) as client:
            await client.status()

    with pytest.raises(WheelError) as info:
        asyncio.run(call())
    assert type(info.value) is WheelError
    assert str(info.value).startswith("UNAVAILABLE")
