"""The operator's calls over real gRPC with a real worker: a job's spec
updated in place (its id and history kept, the change recorded, idempotent by
key, a run in flight finishing under the old spec), schedule previews that
are the scheduler's own, and dead letters listed and redriven once."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import datetime

import grpc
import pytest

from tests.rpc.test_api import (
    Api,
    InProcessServer,
    WorkerThread,
    all_runs,
    connect,
    cron,
    every,
    now_ms,
    spec,
    submit,
    wait_for,
)
from wheel.client import Client
from wheel.errors import FailedPrecondition
from wheel.rpc.v1 import job_service_pb2, jobs_pb2
from wheel.worker import Permanent, RunContext


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """One node for the module: each test uses jobs of its own."""
    server = InProcessServer(tmp_path_factory.mktemp("operator")).start()
    try:
        with connect(server) as a:
            yield a
    finally:
        server.stop()


def update(
    api: Api, job_id: int, msg: jobs_pb2.JobSpec, *fields: str, key: str = ""
) -> job_service_pb2.UpdateJobResponse:
    return api.jobs.UpdateJob(  # type: ignore[no-any-return]
        job_service_pb2.UpdateJobRequest(
            job_id=job_id, spec=msg, fields=list(fields), idempotency_key=key
        ),
        timeout=10,
    )


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def test_update_changes_schedule_payload_and_policies_in_place_and_records_it(api: Api) -> None:
    job = submit(api, spec(name="nightly", schedule=cron("0 3 * * *"), payload=b"v1")).job
    changed = spec(
        name="hourly",
        schedule=cron("0 * * * *", "Europe/Paris"),
        payload=b"v2",
        retry=jobs_pb2.RetryPolicy(max_attempts=9),
    )
    answer = update(api, job.job_id, changed, "schedule", "payload", "retry", key="u1")
    assert answer.updated and answer.job.job_id == job.job_id
    after = answer.job.spec
    assert (
        after.schedule.cron.expr == "0 * * * *" and after.schedule.cron.time_zone == "Europe/Paris"
    )
    assert (after.payload, after.retry.max_attempts) == (b"v2", 9)
    assert after.name == "nightly"  # not among the fields named: kept
    # The next fires are the new schedule's, on the owner and in the store alike.
    hour = 3_600_000
    fires = list(answer.job.next_fires_ms)
    assert fires and all(f % hour == 0 for f in fires) and fires[0] - now_ms() <= hour
    got = api.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=job.job_id), timeout=10)
    assert got.spec == after and list(got.next_fires_ms) == fires and got.next_fire_ms == fires[0]
    # Recorded: when, old -> new, version.
    [record] = api.jobs.ListJobUpdates(
        job_service_pb2.ListJobUpdatesRequest(job_id=job.job_id), timeout=10
    ).updates
    assert record.version == 1 and record.payload_changed
    assert record.old_spec.schedule.cron.expr == "0 3 * * *"
    assert record.new_spec.schedule.cron.expr == "0 * * * *"
    assert abs(record.updated_at_ms - now_ms()) < 60_000 and record.idempotency_key == "u1"
    # The same key and body: the same answer, nothing recorded again.
    again = update(api, job.job_id, changed, "schedule", "payload", "retry", key="u1")
    assert not again.updated and again.update == answer.update and again.job.spec == after
    # The same key with another body: ALREADY_EXISTS, and the job is as it was.
    with pytest.raises(grpc.RpcError) as info:
        update(api, job.job_id, spec(name="other"), "name", key="u1")
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    second = update(api, job.job_id, spec(name="renamed"), "name")
    assert second.update.version == 2 and second.job.spec.name == "renamed"
    assert second.job.spec.schedule == after.schedule
    versions = api.jobs.ListJobUpdates(
        job_service_pb2.ListJobUpdatesRequest(job_id=job.job_id, page_size=1), timeout=10
    )
    assert [u.version for u in versions.updates] == [2] and versions.next_page_token == "2"


def test_an_update_on_a_version_read_before_another_update_is_refused_and_changes_nothing(
    api: Api,
) -> None:
    job = submit(api, spec(name="nightly", schedule=cron("0 3 * * *"))).job
    with Client(api.server.target) as client:
        newest = next(iter(client.job_updates(job.job_id, page_size=1)), None)
        assert newest is None  # version 0: never updated
        client.update(job.job_id, if_version=0, cron="0 4 * * *")
        with pytest.raises(FailedPrecondition, match=r"if_version.*version 1, not 0"):
            client.update(job.job_id, if_version=0, tz="Europe/Paris", cron="0 3 * * *")
        got = client.get(job.job_id)
        assert got.schedule.expr == "0 4 * * *" and got.schedule.tz == "UTC"  # type: ignore[union-attr]
        assert [u.version for u in client.job_updates(job.job_id)] == [1]
        after = client.update(job.job_id, if_version=1, tz="Europe/Paris", cron="0 4 * * *")
        assert after.schedule.tz == "Europe/Paris"  # type: ignore[union-attr]


def test_an_update_takes_effect_at_the_next_fire_and_a_run_in_flight_finishes_under_the_old_spec(
    api: Api,
) -> None:
    """Every second, changed while its first run is in flight to every other
    second with runs allowed to overlap: the run in flight ends under the
    old spec, and every fire of the new schedule from the change on runs,
    once, with the new spec; none is dropped or recorded missed."""
    release = threading.Event()
    seen: list[tuple[int, bytes, int]] = []

    async def slow(ctx: RunContext) -> None:
        seen.append((ctx.scheduled_for_ms, ctx.payload, ctx.timeout_ms))
        while ctx.scheduled_for_ms == seen[0][0] and not release.is_set():
            await asyncio.sleep(0.01)

    with WorkerThread(api.server.target, "w-update", slow=slow):
        job = submit(
            api,
            spec(name="every-second", handler="slow", payload=b"old", timeout_ms=30_000,
                 schedule=cron("* * * * * *")),
        ).job.job_id  # fmt: skip
        wait_for(lambda: seen, 10, "the first run to start")
        first_fire = seen[0][0]
        # While it runs (its next fires skipped: they would overlap it): a new
        # payload, a short timeout, a schedule of every other second, and
        # overlapping runs allowed. Its next fires follow the new schedule at
        # once, and run beside the one in flight.
        allow = jobs_pb2.Overlap(policy=jobs_pb2.OVERLAP_POLICY_ALLOW, max_concurrent=4)
        answer = update(
            api,
            job,
            spec(payload=b"new", timeout_ms=2_000, schedule=cron("*/2 * * * * *"), overlap=allow),
            "payload", "timeout_ms", "schedule", "overlap",
        )  # fmt: skip
        at = answer.update.updated_at_ms  # the owner's instant of the change
        fires = list(answer.job.next_fires_ms)
        assert fires and all(f % 2000 == 0 for f in fires) and fires[0] - at <= 2_000
        # The run in flight is not timed out by the new 2 s: it goes on under
        # its own 30 s, and ends as it would have.
        wait_for(lambda: now_ms() > fires[0] + 2_500, 10, "the new timeout to pass")
        release.set()
        wait_for(
            lambda: any(
                r.scheduled_for_ms == first_fire and r.state == jobs_pb2.RUN_STATE_SUCCEEDED
                for r in all_runs(api, job)
            ),
            10,
            "the run in flight to succeed",
        )
        wait_for(lambda: len(seen) >= 4, 10, "runs of the new schedule")
        api.jobs.PauseJob(job_service_pb2.JobRef(job_id=job), timeout=10)
        ended = {jobs_pb2.RUN_STATE_SUCCEEDED, jobs_pb2.RUN_STATE_MISSED}
        wait_for(
            lambda: all(r.state in ended for r in all_runs(api, job)), 10, "the last run to end"
        )
    assert seen[0] == (first_fire, b"old", 30_000)
    later = seen[1:]
    assert all(payload == b"new" and timeout == 2_000 for _, payload, timeout in later)
    history = all_runs(api, job)
    runs = [r for r in history if r.run_id]
    assert len({r.scheduled_for_ms for r in runs}) == len(runs), "a fire ran twice"
    assert all(r.attempt == 1 and r.state == jobs_pb2.RUN_STATE_SUCCEEDED for r in runs)
    # The new schedule's every fire from the change on ran, none dropped:
    # even seconds in a row from the first after the change to the last.
    new = sorted(r.scheduled_for_ms for r in runs if r.scheduled_for_ms > at)
    assert new == list(range(fires[0], new[-1] + 1, 2_000)) and len(new) >= 3
    assert sorted(sf for sf, _, _ in later) == new
    missed = [r for r in history if not r.run_id and at < r.scheduled_for_ms <= new[-1]]
    assert missed == []


def test_preview_is_the_schedules_own_across_a_dst_change(api: Api) -> None:
    def preview(**kw: object) -> list[int]:
        return list(
            api.jobs.PreviewSchedule(
                job_service_pb2.PreviewScheduleRequest(**kw),  # type: ignore[arg-type]
                timeout=10,
            ).fires_ms
        )

    # 02:30 does not exist in New York on 2027-03-14 (clocks go 02:00 -> 03:00).
    start = ms("2027-03-13T00:00:00+00:00")
    at_transition = preview(schedule=cron("30 2 * * *", "America/New_York"), from_ms=start, count=3)
    assert at_transition == [
        ms("2027-03-13T02:30:00-05:00"),
        ms("2027-03-14T03:00:00-04:00"),  # fired once, at the transition
        ms("2027-03-15T02:30:00-04:00"),
    ]
    skip = cron("30 2 * * *", "America/New_York", dst_gap=jobs_pb2.DST_GAP_SKIP)
    assert preview(schedule=skip, from_ms=start, count=2) == [
        ms("2027-03-13T02:30:00-05:00"),
        ms("2027-03-15T02:30:00-04:00"),
    ]
    # 01:30 comes twice on 2027-11-07: once by default, both with BOTH.
    fall = ms("2027-11-07T00:00:00-04:00")
    both = cron("30 1 * * *", "America/New_York", dst_fold=jobs_pb2.DST_FOLD_BOTH)
    assert preview(schedule=cron("30 1 * * *", "America/New_York"), from_ms=fall, count=1) == [
        ms("2027-11-07T01:30:00-04:00")
    ]
    assert preview(schedule=both, from_ms=fall, count=2) == [
        ms("2027-11-07T01:30:00-04:00"),
        ms("2027-11-07T01:30:00-05:00"),
    ]
    assert preview(schedule=every(60_000, start_at_ms=start), from_ms=start, count=2) == [
        start,
        start + 60_000,
    ]
    # A job's preview from now is what GetJob shows it will fire.
    job = submit(api, spec(schedule=cron("*/5 * * * *", "Asia/Kolkata"))).job
    got = api.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=job.job_id), timeout=10)
    assert preview(job_id=job.job_id, count=5) == list(got.next_fires_ms)


def test_a_dead_letter_redriven_runs_once_as_a_new_attempt_with_a_new_fence(api: Api) -> None:
    calls: list[tuple[int, int, int]] = []
    fail = threading.Event()
    fail.set()

    def flaky(ctx: RunContext) -> None:
        calls.append((ctx.scheduled_for_ms, ctx.attempt, ctx.fence))
        if fail.is_set():
            raise Permanent("downstream is down")

    with WorkerThread(api.server.target, "w-dlq", flaky=flaky):
        job = submit(api, spec(name="dlq", handler="flaky", schedule=cron("0 0 1 1 *"))).job.job_id
        fire = api.jobs.TriggerJob(job_service_pb2.JobRef(job_id=job), timeout=10).scheduled_for_ms

        def dead() -> list[jobs_pb2.Run]:
            return list(
                api.jobs.ListDeadLetters(
                    job_service_pb2.ListDeadLettersRequest(job_id=job), timeout=10
                ).runs
            )

        [letter] = wait_for(dead, 10, "the run to be dead-lettered")
        assert (letter.scheduled_for_ms, letter.state) == (fire, jobs_pb2.RUN_STATE_DEAD_LETTERED)
        every_job = api.jobs.ListDeadLetters(job_service_pb2.ListDeadLettersRequest(), timeout=10)
        assert letter.run_id in {r.run_id for r in every_job.runs}
        fail.clear()
        [new] = api.jobs.RedriveDeadLetters(
            job_service_pb2.RedriveDeadLettersRequest(job_id=job, run_id=letter.run_id), timeout=10
        ).runs
        assert new.scheduled_for_ms == fire and new.attempt == letter.attempt + 1
        assert new.fence > letter.fence and new.run_id != letter.run_id
        assert new.idempotency_key == letter.idempotency_key  # the fire's, every attempt
        wait_for(
            lambda: any(
                r.run_id == new.run_id and r.state == jobs_pb2.RUN_STATE_SUCCEEDED
                for r in all_runs(api, job)
            ),
            10,
            "the redriven run to succeed",
        )
        assert dead() == []
        # Redriving again finds no dead letter: nothing more runs.
        again = api.jobs.RedriveDeadLetters(
            job_service_pb2.RedriveDeadLettersRequest(job_id=job), timeout=10
        )
        assert list(again.runs) == [] and again.next_page_token == ""
        # A page token belongs to a whole job's redrive: not with one run.
        with pytest.raises(grpc.RpcError) as info:
            api.jobs.RedriveDeadLetters(
                job_service_pb2.RedriveDeadLettersRequest(
                    job_id=job, run_id=letter.run_id, page_token=str(letter.run_id)
                ),
                timeout=10,
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        wait_for(lambda: len(calls) >= 2, 5, "both calls")
    assert calls == [(fire, letter.attempt, letter.fence), (fire, new.attempt, new.fence)]
    runs = all_runs(api, job)
    assert sorted((r.attempt, r.state) for r in runs) == [
        (letter.attempt, jobs_pb2.RUN_STATE_DEAD_LETTERED),
        (new.attempt, jobs_pb2.RUN_STATE_SUCCEEDED),
    ]


def test_a_failed_one_shots_dead_letter_is_redriven_and_its_success_completes_it(
    api: Api,
) -> None:
    """Changed: a one-shot whose only fire was dead-lettered was shown
    COMPLETED; it is FAILED, and COMPLETED once a redrive of it succeeds."""
    calls: list[int] = []

    def once_flaky(ctx: RunContext) -> None:
        calls.append(ctx.attempt)
        if ctx.payload != b"fixed":
            raise Permanent("a bad payload")

    with WorkerThread(api.server.target, "w-dlq-once", once_flaky=once_flaky):
        t = now_ms()
        job = submit(
            api, spec(name="one-shot", handler="once_flaky", schedule=jobs_pb2.Schedule(
                once=jobs_pb2.OnceSchedule(at_ms=t + 200)))
        ).job.job_id  # fmt: skip
        req = job_service_pb2.ListDeadLettersRequest(job_id=job)
        wait_for(lambda: api.jobs.ListDeadLetters(req, timeout=10).runs, 10, "the dead letter")
        got = api.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=job), timeout=10)
        assert got.state == jobs_pb2.JOB_STATE_FAILED
        # Its schedule is over, but what its runs are given may be fixed.
        with pytest.raises(grpc.RpcError) as refused:
            update(api, job, spec(schedule=cron("* * * * *")), "schedule")
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        fixed = update(api, job, spec(payload=b"fixed"), "payload").job
        assert fixed.state == jobs_pb2.JOB_STATE_FAILED and fixed.spec.payload == b"fixed"
        [new] = api.jobs.RedriveDeadLetters(
            job_service_pb2.RedriveDeadLettersRequest(job_id=job), timeout=10
        ).runs
        wait_for(
            lambda: any(
                r.run_id == new.run_id and r.state == jobs_pb2.RUN_STATE_SUCCEEDED
                for r in all_runs(api, job)
            ),
            10,
            "the redriven run to succeed",
        )
    assert calls == [1, new.attempt] == [1, 2]
    assert api.jobs.ListDeadLetters(req, timeout=10).runs == []
    got = api.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=job), timeout=10)
    assert got.state == jobs_pb2.JOB_STATE_COMPLETED
    # A run that is not a dead letter cannot be redriven.
    with pytest.raises(grpc.RpcError) as info:
        api.jobs.RedriveDeadLetters(
            job_service_pb2.RedriveDeadLettersRequest(job_id=job, run_id=new.run_id), timeout=10
        )
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not dead-lettered" in (info.value.details() or "")
