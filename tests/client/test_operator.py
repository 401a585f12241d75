"""The operator's calls through ``Client`` and ``AsyncClient`` against a real
node and worker: ``update`` (its keywords checked as a submit's), the record
of updates, ``preview``, ``dead_letters`` and ``redrive``."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from tests.rpc.test_api import InProcessServer, WorkerThread, wait_for
from wheel.client import AsyncClient, Client, Cron, Every, RunState
from wheel.errors import InvalidArgument, NotFound
from wheel.worker import Permanent, RunContext


def test_update_changes_only_the_fields_given_and_is_recorded(client: Client) -> None:
    job = client.submit(name="c-upd", handler="h", cron="0 3 * * *", payload=b"one")
    after = client.update(job.job_id, cron="*/10 * * * *", tz="Europe/Berlin", payload=b"two")
    assert after.job_id == job.job_id and after.name == "c-upd" and after.payload == b"two"
    assert isinstance(after.schedule, Cron)
    assert (after.schedule.expr, after.schedule.tz) == ("*/10 * * * *", "Europe/Berlin")
    assert after.next_fires and all(f.minute % 10 == 0 for f in after.next_fires)
    renamed = client.update(job.job_id, name="c-upd-2", idempotency_key="rename")
    assert renamed.schedule == after.schedule and renamed.name == "c-upd-2"
    assert client.update(job.job_id, name="c-upd-2", idempotency_key="rename") == renamed
    updates = list(client.job_updates(job.job_id))
    assert [u.version for u in updates] == [2, 1]
    assert updates[1].before.schedule == job.schedule
    assert updates[1].after.schedule == after.schedule and updates[1].payload_changed
    assert updates[0].before.name == "c-upd" and updates[0].after.name == "c-upd-2"


def test_update_refuses_bad_keywords_naming_them(client: Client) -> None:
    job = client.submit(name="c-upd-bad", handler="h", every=timedelta(minutes=5))
    with pytest.raises(InvalidArgument, match="tenant"):
        client.update(job.job_id, tenant="other")  # type: ignore[call-arg]
    with pytest.raises(InvalidArgument, match="changes"):
        client.update(job.job_id)
    with pytest.raises(InvalidArgument, match="cron"):
        client.update(job.job_id, cron="not a cron")
    with pytest.raises(NotFound):
        client.update(987_654_321, name="x")
    kept = client.get(job.job_id)
    assert isinstance(kept.schedule, Every) and kept.schedule == job.schedule
    assert kept.name == "c-upd-bad"


def test_preview_of_a_schedule_and_of_a_job(client: Client) -> None:
    start = datetime(2027, 3, 13, tzinfo=UTC)
    fires = client.preview(cron="30 2 * * *", tz="America/New_York", start_from=start, count=2)
    assert fires == [
        datetime(2027, 3, 13, 7, 30, tzinfo=UTC),
        datetime(2027, 3, 14, 7, 0, tzinfo=UTC),  # 02:30 does not exist: at the transition
    ]
    skip = client.preview(
        cron="30 2 * * *", tz="America/New_York", dst_gap="skip", start_from=start, count=2
    )
    assert skip == [
        datetime(2027, 3, 13, 7, 30, tzinfo=UTC),
        datetime(2027, 3, 15, 6, 30, tzinfo=UTC),
    ]
    job = client.submit(name="c-preview", handler="h", cron="0 * * * *")
    assert client.preview(job.job_id, count=5) == client.get(job.job_id).next_fires


def test_dead_letters_and_redrive_through_both_clients(node: InProcessServer) -> None:
    failed_once: set[int] = set()

    def flaky(ctx: RunContext) -> None:
        if ctx.scheduled_for_ms not in failed_once:
            failed_once.add(ctx.scheduled_for_ms)
            raise Permanent("first time fails")

    with WorkerThread(node.target, "w-c-dlq", c_flaky=flaky), Client(node.target) as client:
        job = client.submit(name="c-dlq", handler="c_flaky", cron="0 0 1 1 *")
        fire = client.trigger(job.job_id).scheduled_for
        [letter] = wait_for(lambda: client.dead_letters(job.job_id), 10, "the dead letter")
        assert letter.state is RunState.DEAD_LETTERED and letter.scheduled_for == fire
        assert letter.run_id in {r.run_id for r in client.dead_letters()}

        async def through_async() -> list[int]:
            async with AsyncClient(node.target) as aclient:
                assert [r.run_id for r in await aclient.dead_letters(job.job_id)] == [letter.run_id]
                return [r.attempt for r in await aclient.redrive(job.job_id)]

        assert asyncio.run(through_async()) == [letter.attempt + 1]
        wait_for(
            lambda: any(r.state is RunState.SUCCEEDED for r in client.runs(job.job_id)),
            10,
            "the redriven run",
        )
        assert client.dead_letters(job.job_id) == []
        assert client.redrive(job.job_id, run_id=letter.run_id) == []
