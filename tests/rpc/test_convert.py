"""Protobuf <-> engine values: defaults, round trips and field-named rejections."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wheel.engine.model import JobState, MissedReason, RunState, idempotency_key
from wheel.engine.records import ExecutionRecord, JobRecord, MissedFire
from wheel.engine.spec import (
    CatchUp,
    CatchUpMode,
    Cron,
    DstFold,
    DstGap,
    Interval,
    IntervalMode,
    JobSpec,
    Once,
    Overlap,
    OverlapPolicy,
    Retry,
    SideEffect,
)
from wheel.errors import (
    InvalidArgument,
    LimitExceeded,
)
from wheel.rpc import convert
from wheel.rpc.v1 import (
    jobs_pb2,
)

NOW = 1_700_000_000_000

# Valid names: no NUL, which a spec refuses (PostgreSQL's text holds none).
names = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs"], exclude_characters="\0"),
    min_size=1,
    max_size=20,
)
schedules = st.one_of(
    st.builds(Once, at_ms=st.integers(0, 2**53)),
    st.builds(
        Cron,
        expr=st.sampled_from(["* * * * *", "0 */5 * * * *", "not even cron"]),
        time_zone=st.sampled_from(["UTC", "Europe/Berlin", "America/New_York"]),
        dst_gap=st.sampled_from(DstGap),
        dst_fold=st.sampled_from(DstFold),
    ),
    st.builds(
        Interval,
        period_ms=st.integers(1, 10**9),
        mode=st.sampled_from(IntervalMode),
        start_at_ms=st.integers(1, 2**53),
    ),
)


@st.composite
def retries(draw: st.DrawFn) -> Retry:
    initial = draw(st.integers(1, 10**6))
    return Retry(
        max_attempts=draw(st.integers(1, 100)),
        initial_backoff_ms=initial,
        max_backoff_ms=draw(st.integers(initial, 7 * 24 * 3600 * 1000)),
        multiplier=draw(st.floats(1.0, 100.0)),
    )


specs = st.builds(
    JobSpec,
    name=names,
    handler=names,
    schedule=schedules,
    tenant=names,
    payload=st.binary(max_size=64),
    jitter_ms=st.integers(0, 24 * 3600 * 1000),
    catch_up=st.builds(
        CatchUp,
        mode=st.sampled_from(CatchUpMode),
        window_ms=st.none() | st.integers(1, 10**10),
        max_count=st.integers(1, 100_000),
    ),
    overlap=st.builds(
        Overlap,
        policy=st.sampled_from(OverlapPolicy),
        max_concurrent=st.integers(1, 10_000),
        max_buffered=st.integers(1, 100_000),
    ),
    retry=retries(),
    timeout_ms=st.integers(1, 7 * 24 * 3600 * 1000),
    side_effect=st.sampled_from(SideEffect),
    pool=names,
)


@settings(deadline=None, max_examples=200)
@given(specs)
def test_spec_round_trips_through_proto(spec: JobSpec) -> None:
    wire = convert.spec_to_proto(spec).SerializeToString()
    assert convert.spec_from_proto(jobs_pb2.JobSpec.FromString(wire), now_ms=NOW) == spec


def _minimal(**schedule: Any) -> jobs_pb2.JobSpec:
    return jobs_pb2.JobSpec(name="n", handler="h", schedule=jobs_pb2.Schedule(**schedule))


def test_zero_fields_take_the_documented_defaults() -> None:
    spec = convert.spec_from_proto(
        _minimal(cron=jobs_pb2.CronSchedule(expr="*/5 * * * *")), now_ms=NOW
    )
    assert spec == JobSpec(
        name="n",
        handler="h",
        schedule=Cron(expr="*/5 * * * *"),
        tenant="default",
        pool="default",
        catch_up=CatchUp(mode=CatchUpMode.RUN_LATEST_ONLY, window_ms=None, max_count=100),
        overlap=Overlap(policy=OverlapPolicy.SKIP, max_concurrent=1, max_buffered=100),
        retry=Retry(
            max_attempts=5, initial_backoff_ms=1_000, max_backoff_ms=300_000, multiplier=2.0
        ),
        timeout_ms=300_000,
        side_effect=SideEffect.IDEMPOTENT,
    )
    assert spec.schedule == Cron(
        expr="*/5 * * * *",
        time_zone="UTC",
        dst_gap=DstGap.FIRE_AT_TRANSITION,
        dst_fold=DstFold.FIRST,
    )


def test_interval_without_start_fires_first_one_period_after_now() -> None:
    spec = convert.spec_from_proto(
        _minimal(interval=jobs_pb2.IntervalSchedule(period_ms=60_000)), now_ms=NOW
    )
    assert spec.schedule == Interval(
        period_ms=60_000, mode=IntervalMode.FIXED_RATE, start_at_ms=NOW + 60_000
    )
    explicit = convert.spec_from_proto(
        _minimal(interval=jobs_pb2.IntervalSchedule(period_ms=60_000, start_at_ms=5)), now_ms=NOW
    )
    assert isinstance(explicit.schedule, Interval)
    assert explicit.schedule.start_at_ms == 5


def test_cron_syntax_is_left_to_the_schedule_compiler() -> None:
    spec = convert.spec_from_proto(_minimal(cron=jobs_pb2.CronSchedule(expr="nope")), now_ms=NOW)
    assert spec.schedule == Cron(expr="nope")


def test_missing_schedule_is_rejected_naming_the_field() -> None:
    with pytest.raises(InvalidArgument) as info:
        convert.spec_from_proto(jobs_pb2.JobSpec(name="n", handler="h"), now_ms=NOW)
    assert info.value.field == "spec.schedule"
    with pytest.raises(InvalidArgument) as info:
        convert.spec_from_proto(_minimal(), now_ms=NOW)
    assert info.value.field == "spec.schedule"


def _set(path: str, value: int) -> jobs_pb2.JobSpec:
    msg = _minimal(cron=jobs_pb2.CronSchedule(expr="* * * * *"))
    *parents, leaf = path.split(".")
    target = msg
    for p in parents:
        target = getattr(target, p)
    setattr(target, leaf, value)
    return msg


@pytest.mark.parametrize(
    "path",
    [
        "catch_up.mode",
        "overlap.policy",
        "side_effect",
        "schedule.cron.dst_gap",
        "schedule.cron.dst_fold",
    ],
)
def test_unknown_enum_value_is_rejected_naming_the_field(path: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        convert.spec_from_proto(_set(path, 99), now_ms=NOW)
    assert info.value.field == f"spec.{path}"
    assert "99" in str(info.value)


def test_unknown_interval_mode_is_rejected_naming_the_field() -> None:
    msg = _minimal(interval=jobs_pb2.IntervalSchedule(period_ms=10, mode=7))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument) as info:
        convert.spec_from_proto(msg, now_ms=NOW)
    assert info.value.field == "spec.schedule.interval.mode"


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("name", "", "spec.name"),
        ("handler", "", "spec.handler"),
        ("timeout_ms", -1, "spec.timeout_ms"),
        ("jitter_ms", -5, "spec.jitter_ms"),
        ("retry.max_attempts", 1000, "spec.retry.max_attempts"),
        ("retry.multiplier", 0.5, "spec.retry.multiplier"),
        ("retry.max_backoff_ms", 10, "spec.retry.max_backoff_ms"),
        ("catch_up.window_ms", -1, "spec.catch_up.window_ms"),
        ("catch_up.max_count", -3, "spec.catch_up.max_count"),
        ("overlap.max_concurrent", -1, "spec.overlap.max_concurrent"),
        ("payload", b"x" * (256 * 1024 + 1), "spec.payload"),
    ],
)
def test_spec_is_validated_after_defaults(path: str, value: object, field: str) -> None:
    msg = _minimal(cron=jobs_pb2.CronSchedule(expr="* * * * *"))
    *parents, leaf = path.split(".")
    target = msg
    for p in parents:
        target = getattr(target, p)
    setattr(target, leaf, value)
    with pytest.raises(InvalidArgument) as info:
        convert.spec_from_proto(msg, now_ms=NOW)
    assert info.value.field == field
    if field == "spec.payload":
        assert isinstance(info.value, LimitExceeded)


def test_negative_interval_period_is_rejected() -> None:
    msg = _minimal(interval=jobs_pb2.IntervalSchedule(period_ms=-10))
    with pytest.raises(InvalidArgument) as info:
        convert.spec_from_proto(msg, now_ms=NOW)
    assert info.value.field == "spec.schedule.interval.period_ms"


def test_job_states_map_both_ways() -> None:
    for state in JobState:
        value = convert.job_state_to_proto(state)
        assert value != jobs_pb2.JOB_STATE_UNSPECIFIED
        assert jobs_pb2.JobState.Name(value) == f"JOB_STATE_{state.name}"
        assert convert.job_state_from_proto(value) is state
    assert convert.job_state_from_proto(jobs_pb2.JOB_STATE_UNSPECIFIED) is None
    with pytest.raises(InvalidArgument) as info:
        convert.job_state_from_proto(42, field="state")
    assert info.value.field == "state"


def test_run_states_map_both_ways_and_missed_is_not_an_execution() -> None:
    for state in RunState:
        value = convert.run_state_to_proto(state)
        assert jobs_pb2.RunState.Name(value) == f"RUN_STATE_{state.name}"
        assert convert.run_state_from_proto(value) is state
    for bad in (jobs_pb2.RUN_STATE_UNSPECIFIED, jobs_pb2.RUN_STATE_MISSED, 77):
        with pytest.raises(InvalidArgument):
            convert.run_state_from_proto(bad)


def test_run_filter_reads_states_and_missed() -> None:
    everything = convert.run_filter_from_proto([])
    assert everything.states == frozenset(RunState)
    assert everything.missed
    f = convert.run_filter_from_proto([jobs_pb2.RUN_STATE_FAILED, jobs_pb2.RUN_STATE_MISSED])
    assert f.states == {RunState.FAILED}
    assert f.missed
    assert not convert.run_filter_from_proto([jobs_pb2.RUN_STATE_LOST]).missed
    with pytest.raises(InvalidArgument) as info:
        convert.run_filter_from_proto([123])
    assert info.value.field == "states"


def test_job_record_to_proto() -> None:
    spec = JobSpec(name="n", handler="h", schedule=Once(at_ms=NOW + 1000))
    record = JobRecord(
        job_id=7,
        shard=3,
        spec=spec,
        state=JobState.PAUSED,
        next_run_at=None,
        created_at_ms=NOW,
        updated_at_ms=NOW + 5,
    )
    run = jobs_pb2.Run(run_id=1, job_id=7)
    job = convert.job_to_proto(record, next_fires_ms=[1, 2], recent_runs=[run])
    assert job.job_id == 7
    assert job.shard == 3
    assert job.state == jobs_pb2.JOB_STATE_PAUSED
    assert (job.created_at_ms, job.updated_at_ms) == (NOW, NOW + 5)
    assert job.next_fire_ms == 0
    assert list(job.next_fires_ms) == [1, 2]
    assert list(job.recent_runs) == [run]
    assert convert.spec_from_proto(job.spec, now_ms=0) == spec
    scheduled = convert.job_to_proto(
        JobRecord(
            job_id=7,
            shard=3,
            spec=spec,
            state=JobState.ACTIVE,
            next_run_at=NOW + 1000,
            created_at_ms=NOW,
            updated_at_ms=NOW,
        )
    )
    assert scheduled.next_fire_ms == NOW + 1000


def test_execution_record_to_run() -> None:
    done = ExecutionRecord(
        run_id=11,
        job_id=7,
        scheduled_for=NOW,
        attempt=2,
        state=RunState.DEAD_LETTERED,
        fence=2**40,
        worker_id="w1",
        dispatched_at_ms=NOW + 1,
        started_at_ms=NOW + 2,
        finished_at_ms=NOW + 3,
        error="boom",
    )
    run = convert.run_to_proto(done)
    # The store's third attempt (0-based 2) is attempt 3 on the wire.
    assert (run.run_id, run.job_id, run.scheduled_for_ms, run.attempt) == (11, 7, NOW, 3)
    assert run.state == jobs_pb2.RUN_STATE_DEAD_LETTERED
    assert run.fence == 2**40
    assert run.worker_id == "w1"
    assert (run.dispatched_at_ms, run.started_at_ms, run.finished_at_ms) == (
        NOW + 1,
        NOW + 2,
        NOW + 3,
    )
    assert run.error == "boom"
    assert run.idempotency_key == idempotency_key(7, NOW)
    assert run.missed_reason == ""
    pending = convert.run_to_proto(
        ExecutionRecord(
            run_id=12,
            job_id=7,
            scheduled_for=NOW,
            attempt=1,
            state=RunState.DISPATCHED,
            fence=1,
            worker_id=None,
            dispatched_at_ms=NOW,
            started_at_ms=None,
            finished_at_ms=None,
            error=None,
        )
    )
    assert (pending.worker_id, pending.started_at_ms, pending.finished_at_ms, pending.error) == (
        "",
        0,
        0,
        "",
    )
    # Attempts of the same fire share the key: it is derived from the fire.
    assert pending.idempotency_key == run.idempotency_key


def test_missed_fire_to_run() -> None:
    run = convert.missed_to_proto(
        MissedFire(job_id=7, scheduled_for=NOW, reason=MissedReason.OVERLAP, recorded_at_ms=NOW + 9)
    )
    assert run.run_id == 0
    assert run.state == jobs_pb2.RUN_STATE_MISSED
    assert run.missed_reason == "overlap"
    assert run.scheduled_for_ms == NOW
    assert run.finished_at_ms == NOW + 9
    assert run.idempotency_key == idempotency_key(7, NOW)
