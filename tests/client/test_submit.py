"""``Client.submit`` and ``submit_many`` against a real node: each kind of
schedule comes back as the typed ``Job`` it was given as, idempotency keys
return the earlier job, and every bad argument raises ``InvalidArgument``
naming its field, whether the client or the server finds it."""

from __future__ import annotations

import dataclasses
import functools
import pickle
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tests.conftest import utc_ms
from wheel.client import (
    At,
    CatchUp,
    CatchUpMode,
    Client,
    Cron,
    DstFold,
    DstGap,
    Every,
    Job,
    JobRequest,
    JobState,
    Overlap,
    OverlapPolicy,
    Retry,
)
from wheel.errors import AlreadyExists, InvalidArgument

HOUR = timedelta(hours=1)


def now() -> datetime:
    return datetime.now(UTC)


def test_a_cron_job_with_a_time_zone_and_every_policy_round_trips(client: Client) -> None:
    before = now()
    job = client.submit(
        name="report",
        handler="send_report",
        cron="0 */5 * * * *",
        tz="Europe/Paris",
        dst_gap="skip",
        dst_fold=DstFold.BOTH,
        payload={"report": "sales", "at": [1, 2]},
        catch_up=CatchUp(mode="run_all", window=timedelta(minutes=1), max_count=7),
        overlap=Overlap(policy=OverlapPolicy.ALLOW, max_concurrent=3),
        retry=Retry(max_attempts=4, initial_backoff=0.2, max_backoff=5, multiplier=3),
        timeout=45,
        jitter=timedelta(milliseconds=250),
        at_most_once=True,
        pool="reports",
        tenant="acme",
    )
    assert isinstance(job, Job)
    assert job.created and job.state is JobState.ACTIVE
    assert (job.name, job.handler, job.tenant, job.pool) == (
        "report",
        "send_report",
        "acme",
        "reports",
    )
    assert job.schedule == Cron(
        expr="0 */5 * * * *", tz="Europe/Paris", dst_gap=DstGap.SKIP, dst_fold=DstFold.BOTH
    )
    assert job.payload == b'{"at":[1,2],"report":"sales"}'
    assert job.catch_up == CatchUp(
        mode=CatchUpMode.RUN_ALL, window=timedelta(seconds=60), max_count=7
    )
    assert job.overlap == Overlap(policy=OverlapPolicy.ALLOW, max_concurrent=3, max_buffered=100)
    assert job.retry == Retry(
        max_attempts=4,
        initial_backoff=timedelta(milliseconds=200),
        max_backoff=timedelta(seconds=5),
        multiplier=3.0,
    )
    assert (job.timeout, job.jitter, job.at_most_once) == (
        timedelta(seconds=45),
        timedelta(milliseconds=250),
        True,
    )
    assert 0 <= job.shard < 256 and job.recent_runs == []
    second = timedelta(seconds=1)  # the node's clock is a few ms off ours
    assert before - second <= job.created_at <= job.updated_at <= now() + second
    # Times come back aware, in UTC: every five minutes, give or take the jitter.
    assert job.next_fire is not None and job.next_fire.tzinfo is UTC
    assert job.next_fires[0] == job.next_fire > before
    gaps = [b - a for a, b in zip(job.next_fires, job.next_fires[1:], strict=False)]
    assert len(gaps) == 4
    assert all(abs(g - timedelta(minutes=5)) <= timedelta(milliseconds=250) for g in gaps)
    # What get reads back is what submit answered, but for ``created``.
    assert dataclasses.replace(client.get(job.job_id), created=True) == job


def test_an_every_job_with_fixed_delay_round_trips(client: Client) -> None:
    start = datetime(2031, 5, 6, 7, 8, 9, 123_000)  # naive: UTC
    job = client.submit(
        name="poll",
        handler="poll",
        every=timedelta(seconds=90),
        fixed_delay=True,
        start=start,
        catch_up="skip",
        overlap="buffer_one",
        retry=2,
    )
    assert job.schedule == Every(
        period=timedelta(seconds=90), start=start.replace(tzinfo=UTC), fixed_delay=True
    )
    assert job.next_fire == start.replace(tzinfo=UTC)
    assert job.catch_up.mode is CatchUpMode.SKIP
    assert job.overlap.policy is OverlapPolicy.BUFFER_ONE
    assert job.retry == Retry(max_attempts=2)
    assert (job.timeout, job.at_most_once) == (timedelta(minutes=5), False)

    # Without a start, the first fire is a period after the node received it;
    # a start in epoch seconds is exact to the millisecond.
    before = now()
    rate = client.submit(name="rate", handler="poll", every=2.5)
    assert isinstance(rate.schedule, Every) and not rate.schedule.fixed_delay
    assert rate.schedule.period == timedelta(seconds=2.5)
    received = rate.schedule.start - timedelta(seconds=2.5)
    # The node's clock is the wall clock at its start plus monotonic time since:
    # a few ms off this process's wall clock.
    assert before - timedelta(milliseconds=50) <= received <= now() + timedelta(milliseconds=50)
    exact = client.submit(name="exact", handler="poll", every=60, start=1_956_000_000.125)
    assert isinstance(exact.schedule, Every)
    assert exact.schedule.start == utc_ms(1_956_000_000_125)


def test_an_at_job_given_a_timedelta_fires_that_long_after_the_submit(client: Client) -> None:
    before = now()
    job = client.submit(name="soon", handler="h", at=HOUR, payload="text")
    after = now()
    assert isinstance(job.schedule, At)
    assert before + HOUR - timedelta(milliseconds=1) <= job.schedule.time <= after + HOUR
    assert job.next_fire == job.schedule.time and job.next_fires == [job.schedule.time]
    assert job.payload == b"text"
    # An aware time in another zone names the same instant; epoch seconds work too.
    berlin = datetime(2031, 1, 1, 12, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    at_berlin = client.submit(name="berlin", handler="h", at=berlin)
    assert at_berlin.schedule == At(time=berlin) and at_berlin.next_fire == berlin
    assert at_berlin.next_fire is not None and at_berlin.next_fire.tzinfo is UTC
    epoch = client.submit(name="epoch", handler="h", at=1_956_000_000.5)
    assert epoch.schedule == At(time=utc_ms(1_956_000_000_500))


def test_a_request_made_ahead_keeps_a_relative_at_for_its_send_and_a_fixed_one_as_checked(
    client: Client,
) -> None:
    # A request keeps the spec it was checked with, and a bulk submit sends
    # that one, except where ``at`` is a time from the send: made now and
    # sent later, it fires an hour after the send, not the making.
    relative = JobRequest(name="later", handler="h", at=HOUR)
    fixed = JobRequest(name="fixed", handler="h", at=datetime(2031, 1, 1, tzinfo=UTC))
    time.sleep(0.2)  # time passing between the making and the send
    sent = now()
    later, at_fixed = client.submit_many([relative, fixed])
    assert isinstance(later, Job) and isinstance(later.schedule, At)
    assert later.schedule.time >= sent + HOUR - timedelta(milliseconds=1)
    assert isinstance(at_fixed, Job) and at_fixed.next_fire == datetime(2031, 1, 1, tzinfo=UTC)
    # The kept spec is no part of the request's value, and a copy that
    # lost it (pickled) is sent the same.
    assert fixed == dataclasses.replace(fixed) and "spec" not in repr(fixed)
    (copied,) = client.submit_many([pickle.loads(pickle.dumps(fixed))])
    assert isinstance(copied, Job) and copied.next_fire == at_fixed.next_fire


def test_an_idempotency_key_returns_the_earlier_job_with_created_false(client: Client) -> None:
    args: dict[str, Any] = {"name": "nightly", "handler": "h", "every": 60, "tenant": "idem"}
    first = client.submit(**args, idempotency_key="nightly-1")
    time.sleep(0.01)
    again = client.submit(**args, idempotency_key="nightly-1")
    assert first.created and not again.created
    assert again.job_id == first.job_id
    assert [j.job_id for j in client.jobs(tenant="idem")] == [first.job_id]
    with pytest.raises(AlreadyExists, match="nightly-1"):
        client.submit(**{**args, "every": 30}, idempotency_key="nightly-1")


# -- bad arguments --------------------------------------------------------------------

OK: dict[str, Any] = {"name": "bad", "handler": "h", "tenant": "bad-args"}

CLIENT_SIDE = [
    pytest.param({}, "schedule", "exactly one of", id="no schedule"),
    pytest.param({"cron": "* * * * *", "every": 5}, "schedule", "cron and every", id="two"),
    pytest.param({"every": 5, "tz": "Europe/Paris"}, "tz", "cron", id="tz without cron"),
    pytest.param({"at": HOUR, "dst_gap": "skip"}, "dst_gap", "cron", id="dst_gap without cron"),
    pytest.param({"at": HOUR, "fixed_delay": True}, "fixed_delay", "every", id="fixed_delay"),
    pytest.param({"cron": "* * * * *", "start": 5}, "start", "every", id="start without every"),
    pytest.param({"every": 5, "start": 0}, "start", "epoch", id="start at the epoch"),
    pytest.param({"every": 0}, "every", "1 ms", id="zero period"),
    pytest.param({"every": timedelta(seconds=-3)}, "every", "1 ms", id="negative period"),
    pytest.param({"every": "5s"}, "every", "timedelta or seconds", id="period as text"),
    pytest.param({"at": "tomorrow"}, "at", "datetime or epoch seconds", id="at as text"),
    pytest.param({"at": True}, "at", "bool", id="at as a bool"),
    pytest.param({"cron": "* * * * *", "dst_fold": "twice"}, "dst_fold", "first", id="dst_fold"),
    pytest.param({"cron": "* * * * *", "dst_gap": ["skip"]}, "dst_gap", "one of", id="gap list"),
    pytest.param({"every": [5]}, "every", "timedelta or seconds", id="period as a list"),
    pytest.param({"at": HOUR, "catch_up": "sometimes"}, "catch_up", "run_all", id="catch_up"),
    pytest.param({"at": HOUR, "catch_up": 3}, "catch_up", "CatchUp", id="catch_up type"),
    pytest.param({"at": HOUR, "overlap": "never"}, "overlap", "buffer_one", id="overlap"),
    pytest.param({"at": HOUR, "retry": 0}, "retry", ">= 1", id="no attempts"),
    pytest.param({"at": HOUR, "timeout": 0}, "timeout", "1 ms", id="zero timeout"),
    pytest.param({"at": HOUR, "jitter": -1}, "jitter", ">= 0", id="negative jitter"),
    pytest.param({"at": HOUR, "payload": object()}, "payload", "JSON", id="payload"),
    pytest.param({"at": HOUR, "payload": [float("nan")]}, "payload", "JSON", id="NaN"),
    pytest.param({"at": HOUR, "name": 7}, "name", "string", id="name type"),
    pytest.param({"at": HOUR, "at_most_once": "yes"}, "at_most_once", "True", id="flag"),
]


@pytest.mark.parametrize(("bad", "field", "fragment"), CLIENT_SIDE)
def test_a_bad_argument_is_refused_by_the_client_naming_it(
    client: Client, bad: dict[str, Any], field: str, fragment: str
) -> None:
    for attempt in (lambda: client.submit(**{**OK, **bad}), lambda: JobRequest(**{**OK, **bad})):
        with pytest.raises(InvalidArgument) as info:
            attempt()
        assert info.value.field == field
        assert fragment in str(info.value)
    # Nothing reached the node.
    assert list(client.jobs(tenant="bad-args")) == []


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: CatchUp(mode="latest"), "catch_up.mode"),
        (lambda: CatchUp(window=0), "catch_up.window"),
        (lambda: CatchUp(max_count=0), "catch_up.max_count"),
        (lambda: Overlap(policy="queue"), "overlap.policy"),
        (lambda: Overlap(max_concurrent=0), "overlap.max_concurrent"),
        (lambda: Overlap(max_buffered=-1), "overlap.max_buffered"),
        (lambda: Retry(max_attempts=0), "retry.max_attempts"),
        (lambda: Retry(initial_backoff=timedelta(0)), "retry.initial_backoff"),
        (lambda: Retry(max_backoff="1m"), "retry.max_backoff"),  # type: ignore[arg-type]
        (lambda: Retry(multiplier=0), "retry.multiplier"),
    ],
)
def test_a_policy_the_wire_cannot_carry_is_refused_when_made(make: Any, field: str) -> None:
    # Zero means "the default" on the wire: sent, it would silently become one.
    with pytest.raises(InvalidArgument) as info:
        make()
    assert info.value.field == field


SERVER_SIDE = [
    pytest.param({"cron": "61 * * * *"}, "spec.schedule.cron.expr", id="cron syntax"),
    pytest.param(
        {"cron": "* * * * *", "tz": "Mars/Olympus_Mons"},
        "spec.schedule.cron.time_zone",
        id="time zone",
    ),
    pytest.param({"at": HOUR, "name": ""}, "spec.name", id="empty name"),
    pytest.param({"at": HOUR, "retry": 1000}, "spec.retry.max_attempts", id="attempts"),
    pytest.param(
        {"at": HOUR, "retry": Retry(initial_backoff=5, max_backoff=1)},
        "spec.retry.max_backoff_ms",
        id="backoffs",
    ),
    pytest.param({"at": HOUR, "retry": Retry(multiplier=0.5)}, "spec.retry.multiplier", id="mul"),
    pytest.param({"at": -5}, "spec.schedule.once.at_ms", id="before the epoch"),
    pytest.param({"every": timedelta(days=5000)}, "spec.schedule.interval.period_ms", id="period"),
    pytest.param({"at": HOUR, "timeout": timedelta(days=8)}, "spec.timeout_ms", id="timeout"),
    pytest.param({"at": HOUR, "idempotency_key": "k" * 201}, "idempotency_key", id="key"),
]


@pytest.mark.parametrize(("bad", "field"), SERVER_SIDE)
def test_a_bad_argument_is_refused_by_the_server_naming_the_wire_field(
    client: Client, bad: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        client.submit(**{**OK, **bad})
    assert info.value.field == field
    assert list(client.jobs(tenant="bad-args")) == []


def test_a_payload_over_the_limit_is_refused_naming_the_field_and_the_limit(
    client: Client,
) -> None:
    with pytest.raises(InvalidArgument) as info:
        client.submit(**OK, at=HOUR, payload=b"x" * (256 * 1024 + 1))
    assert info.value.field == "spec.payload" and str(256 * 1024) in str(info.value)


def test_submit_many_answers_each_item_with_its_job_or_its_own_error(client: Client) -> None:
    taken = client.submit(name="taken", handler="h", at=HOUR, idempotency_key="many-taken")
    results = client.submit_many(
        [
            JobRequest(name="a", handler="h", cron="*/5 * * * *", tenant="many"),
            {"name": "", "handler": "h", "at": HOUR, "tenant": "many"},
            {"name": "no schedule", "handler": "h", "tenant": "many"},
            {"name": "no handler", "at": HOUR, "tenant": "many"},
            {"name": "typo", "handler": "h", "at": HOUR, "tennant": "many"},  # type: ignore[list-item]
            {"name": "other", "handler": "h", "at": HOUR, "idempotency_key": "many-taken"},
            {"name": "b", "handler": "h", "every": 30, "tenant": "many"},
        ]
    )
    assert [type(r).__name__ for r in results] == [
        "Job",
        "InvalidArgument",
        "InvalidArgument",
        "InvalidArgument",
        "InvalidArgument",
        "AlreadyExists",
        "Job",
    ]
    a, empty_name, no_schedule, no_handler, typo, key_reuse, b = results
    assert (
        isinstance(a, Job)
        and a.created
        and a.schedule
        == Cron(
            expr="*/5 * * * *", tz="UTC", dst_gap=DstGap.FIRE_AT_TRANSITION, dst_fold=DstFold.FIRST
        )
    )
    assert isinstance(empty_name, InvalidArgument) and empty_name.field == "spec.name"
    assert isinstance(no_schedule, InvalidArgument) and no_schedule.field == "schedule"
    assert isinstance(no_handler, InvalidArgument) and no_handler.field == "handler"
    assert isinstance(typo, InvalidArgument) and typo.field == "tennant"
    # The same key with another body: the earlier job stays as it was.
    assert isinstance(key_reuse, AlreadyExists) and "many-taken" in str(key_reuse)
    assert isinstance(b, Job) and b.created
    assert {j.name for j in client.jobs(tenant="many")} == {"a", "b"}
    again = client.submit_many(
        [{"name": "taken", "handler": "h", "at": taken.next_fire, "idempotency_key": "many-taken"}]
    )
    assert len(again) == 1 and isinstance(again[0], Job)
    assert again[0].job_id == taken.job_id and not again[0].created
    # Nothing good enough to send: no call, an error per item.
    only_bad = client.submit_many([{"name": "x", "handler": "h"}])
    assert len(only_bad) == 1 and isinstance(only_bad[0], InvalidArgument)


def test_a_bulk_submit_of_ten_thousand_creates_the_good_ones_once(client: Client) -> None:
    """10,000 jobs in one call with a few the node refuses: each good one is
    created (and answered whole, though the node's answer leaves the spec
    out), each bad one gets its own error, and the same call again creates
    nothing new."""
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(days=2)

    def item(i: int) -> JobRequest:
        job = functools.partial(
            JobRequest,
            name=f"bulk-{i}",
            handler="h",
            tenant="bulk",
            idempotency_key=f"bulk-{i}",
            payload={"i": i} if i % 2 else b"",
        )
        if i % 997 == 13:
            return job(cron="not a cron")
        if i % 997 == 14:
            return job(cron="0 3 * * *", tz="Mars/Olympus_Mons")
        if i % 3:
            return job(every=timedelta(hours=1), start=start + timedelta(seconds=i))
        return job(cron=f"{i % 60} 3 * * *", tz="Europe/London")

    items = [item(i) for i in range(10_000)]
    bad = {i for i in range(10_000) if i % 997 in (13, 14)}
    results = client.submit_many(items)  # within the client's default timeout
    assert len(results) == 10_000
    for i, r in enumerate(results):
        if i in bad:
            assert isinstance(r, InvalidArgument), (i, r)
            assert r.field in ("spec.schedule.cron.expr", "spec.schedule.cron.time_zone")
        else:
            assert isinstance(r, Job) and r.created and r.name == f"bulk-{i}", (i, r)
    one = results[1]
    assert isinstance(one, Job)
    assert one.payload == b'{"i":1}' and one.next_fire == start + timedelta(seconds=1)
    assert one.schedule == client.get(one.job_id).schedule
    made = {r.job_id for r in results if isinstance(r, Job)}
    assert len(made) == 10_000 - len(bad)
    again = client.submit_many(items)
    assert {r.job_id for r in again if isinstance(r, Job)} == made
    assert not any(isinstance(r, Job) and r.created for r in again)
    assert sum(1 for _ in client.jobs(tenant="bulk", page_size=1000)) == len(made)
