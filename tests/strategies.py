"""Hypothesis strategies shared by the property tests: job specs as the wire
carries them, valid and malformed, every field at and past its edges."""

from __future__ import annotations

import math
import time
from datetime import date
from typing import Any

from hypothesis import strategies as st

from wheel.engine.calendars import Calendar, CalendarDays, parse_calendar
from wheel.engine.spec import DEFAULT_LIMITS as L
from wheel.rpc._common import MAX_IDEMPOTENCY_KEY
from wheel.rpc.v1 import job_service_pb2, jobs_pb2

I32 = 2**31 - 1
I64 = 2**63 - 1
# Every top-level JobSpec field UpdateJob may name (and one it may not).
UPDATABLE = (
    "name", "handler", "payload", "schedule", "jitter_ms", "catch_up", "overlap", "retry",
    "timeout_ms", "side_effect", "pool", "priority", "active_from_ms", "active_until_ms",
    "max_fires",
)  # fmt: skip


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def edges(low: int, high: int, *, bits: int = 64) -> st.SearchStrategy[int]:
    """A bounded integer field: its bounds, one past each, zero, the wire's
    extremes, and anything between."""
    top = 2 ** (bits - 1) - 1
    return st.one_of(
        st.sampled_from(sorted({low - 1, low, low + 1, 0, high - 1, high, high + 1, -1})),
        st.sampled_from([-top - 1, top]),
        st.integers(low, high),
    ).filter(lambda v: -top - 1 <= v <= top)


def text(limit: int) -> st.SearchStrategy[str]:
    """A text field: empty, ordinary, odd characters, at and over its limit."""
    return st.one_of(
        st.just(""),
        st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12),
        st.sampled_from(["a", "job-1", " ", "tab\tname", "ünï", "🙂", "x\x00y", "../x", "a/b"]),
        st.sampled_from(["n" * limit, "n" * (limit + 1), "é" * limit]),
    )


def enum(values: int) -> st.SearchStrategy[Any]:
    """A proto3 enum field (open on the wire): each value, and unknown numbers."""
    return st.one_of(known(values), st.sampled_from([values, 99, -1, I32]))


def known(values: int) -> st.SearchStrategy[Any]:
    """A proto3 enum field's known values (0: unspecified, the default)."""
    return st.integers(0, values - 1)


CRON_EXPRS = [
    "* * * * *", "*/5 * * * * *", "0 2 * * 1-5", "0 0 31 2 *", "@daily", "@hourly", "@reboot",
    "", " ", "* * *", "* * * * * * *", "61 * * * *", "H * * * *", "R * * * *", "0 0 L * *",
    "0 0 * * 5#3", "0 0 15W * *", "*/0 * * * *", "1-0 * * * *", "a b c d e", "0 0 * * MON",
    "* * * * * 2099", "\x00 * * * *", "0 0 29 2 *", "x" * 201, "-1 * * * *", "0 0 * 13 *",
]  # fmt: skip
ZONES = [
    "", "UTC", "Asia/Tokyo", "Europe/London", "America/New_York", "Etc/GMT+12", "localtime",
    "Nowhere/City", "../../etc/passwd", "utc", "Europe/London\x00", "+09:00", "/", "." * 300,
    "posix/Asia/Tokyo", "right/UTC", "posixrules", "Factory", "EST5EDT",
]  # fmt: skip


@st.composite
def schedules(draw: st.DrawFn) -> jobs_pb2.Schedule | None:
    kind = draw(st.sampled_from(["once", "cron", "interval", "none", "empty"]))
    # Times near now are drawn as offsets: a strategy's bounds must not move.
    near = st.integers(-3_600_000, L.max_horizon_ms).map(lambda off: now_ms() + off)
    if kind == "none":
        return None
    if kind == "empty":  # set, but none of its kinds
        return jobs_pb2.Schedule()
    if kind == "once":
        at = draw(st.one_of(near, edges(0, 2**53)))
        return jobs_pb2.Schedule(once=jobs_pb2.OnceSchedule(at_ms=at))
    if kind == "cron":
        return jobs_pb2.Schedule(
            cron=jobs_pb2.CronSchedule(
                expr=draw(st.sampled_from(CRON_EXPRS)),
                time_zone=draw(st.sampled_from(ZONES)),
                dst_gap=draw(enum(3)),
                dst_fold=draw(enum(3)),
            )
        )
    start = draw(
        st.one_of(st.just(0), st.integers(-86_400_000, 86_400_000).map(lambda o: now_ms() + o))
    )
    return jobs_pb2.Schedule(
        interval=jobs_pb2.IntervalSchedule(
            period_ms=draw(edges(1, L.max_horizon_ms)),
            mode=draw(enum(3)),
            start_at_ms=draw(st.one_of(st.just(start), edges(0, 2**53))),
        )
    )


MULTIPLIERS = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 2.0, 100.0, 0.5, 100.5, math.nan, math.inf, -math.inf]),
    st.floats(allow_nan=True, allow_infinity=True),
)
VALID_CRONS = ["* * * * *", "*/5 * * * * *", "0 2 * * 1-5", "@daily", "0 0 * * MON", "30 1 * * *"]
VALID_ZONES = ["", "UTC", "Asia/Tokyo", "Europe/London", "America/New_York", "Etc/GMT+12"]


@st.composite
def valid_schedules(draw: st.DrawFn) -> jobs_pb2.Schedule:
    kind = draw(st.sampled_from(["once", "cron", "interval"]))
    if kind == "once":
        at = draw(st.integers(-3_600_000, 365 * 86_400_000).map(lambda off: now_ms() + off))
        return jobs_pb2.Schedule(once=jobs_pb2.OnceSchedule(at_ms=at))
    if kind == "cron":
        return jobs_pb2.Schedule(
            cron=jobs_pb2.CronSchedule(
                expr=draw(st.sampled_from(VALID_CRONS)),
                time_zone=draw(st.sampled_from(VALID_ZONES)),
                dst_gap=draw(known(3)),
                dst_fold=draw(known(3)),
            )
        )
    start = draw(
        st.one_of(st.just(0), st.integers(-86_400_000, 86_400_000).map(lambda o: now_ms() + o))
    )
    return jobs_pb2.Schedule(
        interval=jobs_pb2.IntervalSchedule(
            period_ms=draw(st.integers(1_000, 30 * 86_400_000)),
            mode=draw(known(3)),
            start_at_ms=start,
        )
    )


@st.composite
def valid_specs(draw: st.DrawFn) -> jobs_pb2.JobSpec:
    """A JobSpec every node must accept (and read back as sent)."""
    name_chars = st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"])
    msg = jobs_pb2.JobSpec(
        name=draw(st.text(name_chars, min_size=1, max_size=40)),
        handler=draw(st.sampled_from(["h", "send_report", "a.b:c"])),
        tenant=draw(st.sampled_from(["", "default", "t1"])),
        pool=draw(st.sampled_from(["", "default", "gpu"])),
        payload=draw(st.binary(max_size=64)),
        jitter_ms=draw(st.one_of(st.just(0), st.integers(0, 60_000))),
        timeout_ms=draw(st.one_of(st.just(0), st.integers(1, L.max_timeout_ms))),
        side_effect=draw(known(3)),
    )
    msg.schedule.CopyFrom(draw(valid_schedules()))
    if draw(st.booleans()):
        msg.priority = draw(st.integers(0, 9))  # unset: 5
    if draw(st.booleans()):
        msg.catch_up.CopyFrom(
            jobs_pb2.CatchUp(
                mode=draw(known(4)),
                window_ms=draw(st.integers(0, L.max_horizon_ms)),
                max_count=draw(st.integers(0, L.max_catch_up_count)),
            )
        )
    if draw(st.booleans()):
        msg.overlap.CopyFrom(
            jobs_pb2.Overlap(
                policy=draw(known(5)),
                max_concurrent=draw(st.integers(0, 10_000)),
                max_buffered=draw(st.integers(0, 100_000)),
            )
        )
    if draw(st.booleans()):
        low = draw(st.integers(1, 600_000))
        msg.retry.CopyFrom(
            jobs_pb2.RetryPolicy(
                max_attempts=draw(st.integers(0, L.max_attempts)),
                initial_backoff_ms=low,
                max_backoff_ms=draw(st.integers(low, L.max_timeout_ms)),
                multiplier=draw(st.floats(1.0, 100.0)),
            )
        )
    return msg


def _set(path: str, value: Any) -> Any:
    """A change of one field of a spec, ``path`` dotted."""

    def apply(msg: jobs_pb2.JobSpec) -> None:
        *parents, last = path.split(".")
        target: Any = msg
        for part in parents:
            target = getattr(target, part)
        if hasattr(getattr(target, last), "CopyFrom"):
            getattr(target, last).CopyFrom(value)
        else:
            setattr(target, last, value)

    return apply


def corruptions() -> st.SearchStrategy[Any]:
    """One field of a spec set to a value at or past its edge, of the wrong
    kind, or unknown: some of them still valid."""
    i32 = {"bits": 32}
    return st.one_of(
        text(L.max_name_len).map(lambda v: _set("name", v)),
        text(L.max_handler_len).map(lambda v: _set("handler", v)),
        text(L.max_tenant_len).map(lambda v: _set("tenant", v)),
        text(L.max_pool_len).map(lambda v: _set("pool", v)),
        st.sampled_from([b"x" * L.max_payload_bytes, b"x" * (L.max_payload_bytes + 1)]).map(
            lambda v: _set("payload", v)
        ),
        schedules().map(
            lambda v: _set("schedule", v) if v is not None else (lambda m: m.ClearField("schedule"))
        ),
        edges(0, L.max_jitter_ms).map(lambda v: _set("jitter_ms", v)),
        edges(1, L.max_timeout_ms).map(lambda v: _set("timeout_ms", v)),
        enum(3).map(lambda v: _set("side_effect", v)),
        enum(4).map(lambda v: _set("catch_up.mode", v)),
        edges(0, L.max_horizon_ms).map(lambda v: _set("catch_up.window_ms", v)),
        edges(1, L.max_catch_up_count, **i32).map(lambda v: _set("catch_up.max_count", v)),
        enum(5).map(lambda v: _set("overlap.policy", v)),
        edges(1, 10_000, **i32).map(lambda v: _set("overlap.max_concurrent", v)),
        edges(1, 100_000, **i32).map(lambda v: _set("overlap.max_buffered", v)),
        edges(1, L.max_attempts, **i32).map(lambda v: _set("retry.max_attempts", v)),
        edges(0, L.max_timeout_ms).map(lambda v: _set("retry.initial_backoff_ms", v)),
        edges(0, L.max_timeout_ms).map(lambda v: _set("retry.max_backoff_ms", v)),
        MULTIPLIERS.map(lambda v: _set("retry.multiplier", v)),
        edges(0, 9, **i32).map(lambda v: _set("priority", v)),
    )


@st.composite
def specs(draw: st.DrawFn) -> jobs_pb2.JobSpec:
    """A JobSpec as a client may send it: a valid one with none, one or a
    few of its fields at or past their edges."""
    msg = draw(valid_specs())
    for change in draw(st.lists(corruptions(), max_size=3)):
        change(msg)
    return msg


def keys() -> st.SearchStrategy[str]:
    """Idempotency keys: none, a few that repeat across examples, at and over the limit."""
    return st.one_of(
        st.just(""),
        st.sampled_from(["k1", "k2", "k3", "k\0"]),
        st.sampled_from(["k" * MAX_IDEMPOTENCY_KEY, "k" * (MAX_IDEMPOTENCY_KEY + 1)]),
    )


@st.composite
def submit_requests(draw: st.DrawFn) -> job_service_pb2.SubmitJobRequest:
    req = job_service_pb2.SubmitJobRequest(idempotency_key=draw(keys()))
    if draw(st.integers(0, 19)):  # now and then no spec at all
        req.spec.CopyFrom(draw(specs()))
    return req


def update_fields() -> st.SearchStrategy[list[str]]:
    """UpdateJob's field names: empty (every one), some, or with one it
    does not take."""
    some = st.lists(st.sampled_from(UPDATABLE), max_size=4)
    odd = st.sampled_from([[], ["tenant"], ["bogus"], [""]])
    return st.tuples(some, st.integers(0, 9), odd).map(lambda t: t[0] + (t[2] if t[1] < 2 else []))


def proto_copy(msg: Any) -> Any:
    out = type(msg)()
    out.CopyFrom(msg)
    return out


# -- calendars --------------------------------------------------------------------

CALENDAR_ZONES = st.sampled_from(["UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata"])
CALENDAR_CRONS = st.sampled_from(
    ["*/7 * * * *", "0 */3 * * *", "30 2 * * *", "0 0 * * 1-5", "15 1 1 * *"]
)


@st.composite
def calendar_days(draw: st.DrawFn) -> tuple[Calendar, CalendarDays]:
    """A calendar of a few dates, ranges and weekdays around December 2026,
    and its days."""
    base = date(2026, 12, 1).toordinal()
    picked = draw(st.sets(st.integers(0, 40), max_size=12))
    spans = draw(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 4)), max_size=3))
    weekdays = draw(st.sets(st.sampled_from(["mon", "wed", "sat", "sun"]), max_size=2))
    dates = [date.fromordinal(base + d).isoformat() for d in picked]
    ranges = [
        (date.fromordinal(base + a).isoformat(), date.fromordinal(base + a + n).isoformat())
        for a, n in spans
    ]
    if not dates and not ranges and not weekdays:
        dates = [date.fromordinal(base + 3).isoformat()]
    cal = parse_calendar(dates, ranges, sorted(weekdays))
    return cal, cal.days()


@st.composite
def schedule_bounds(draw: st.DrawFn, start: int) -> tuple[int, int, int]:
    """Bounds of a recurring schedule around ``start`` (ms): active from,
    active until and max fires, each unset (0) or set."""
    day = 86_400_000
    low = draw(st.one_of(st.just(0), st.integers(start - day, start + 2 * day)))
    high = draw(st.one_of(st.just(0), st.integers(max(low, start) + 1, start + 4 * day)))
    fires = draw(st.one_of(st.just(0), st.integers(1, 50)))
    return low, high, fires
