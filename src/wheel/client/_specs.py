"""What a submit asks for (``JobRequest``), and the mapping between the
client's values and the engine's ``JobSpec`` in both directions.

The client goes through ``JobSpec`` so that ``wheel.rpc.convert`` stays the one
place that knows the protobuf spelling of a spec and the defaults its zeros
stand for. Checks here are the ones only the client can make: the Python
types given, exactly one schedule, options that belong to another kind of
schedule, and zeros the wire would silently read as "the default". Limits,
cron syntax and time zones are the server's to check (its errors name the
wire field, e.g. ``spec.schedule.cron.expr``), so a client never refuses what
its server would accept.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from enum import StrEnum
from typing import Any, TypedDict, TypeVar

from wheel import http_targets
from wheel.client._time import (
    Duration,
    When,
    as_duration,
    duration,
    millis,
    span,
    time_ms,
    utc,
)
from wheel.client._values import (
    At,
    CatchUp,
    CatchUpMode,
    Cron,
    DstFold,
    DstGap,
    Every,
    HttpTarget,
    Overlap,
    OverlapPolicy,
    Retry,
    Schedule,
    choice,
)
from wheel.codec import CodecError, PayloadCodec
from wheel.engine import spec as engine
from wheel.errors import InvalidArgument
from wheel.rpc.v1 import jobs_pb2

__all__ = [
    "JobArgs",
    "JobRequest",
    "Payload",
    "catch_up_of",
    "http_of",
    "job_spec",
    "overlap_of",
    "request_of",
    "retry_of",
    "schedule_of",
    "wire_target",
]

# Bytes as they are, text as UTF-8, anything else as compact JSON with sorted
# keys (the same value always makes the same bytes: an idempotent retry of a
# submit must send the same body).
Payload = bytes | str | dict[str, Any] | list[Any] | int | float | bool

_Enum = TypeVar("_Enum", bound=StrEnum)

# The engine's defaults for what a spec leaves out.
_SPEC = engine.JobSpec(name="", handler="", schedule=engine.Once(at_ms=0))
_CATCH_UP, _OVERLAP, _RETRY = CatchUp(), Overlap(), Retry()


class _Checked:
    """A request's room for the spec it was checked with, which a submit
    sends as it is: a bulk submit made each job's spec twice, a third of its
    client's time. None where ``at`` is a time from the send, resolved then.
    A slot, not a field: no keyword, no part of the request's value."""

    __slots__ = ("_checked",)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRequest(_Checked):
    """One job to submit: the keywords of ``Client.submit``, as a value.

    Give exactly one schedule: ``cron`` (with ``tz``, ``dst_gap`` and
    ``dst_fold``), ``every`` (with ``start``, default a period from when the
    node receives it, and ``fixed_delay``: the next fire a period after the
    previous run ends) or ``at`` (a time, or a ``timedelta`` from when it is
    sent; give a time where a retry must be idempotent). Times are ``datetime``
    values (naive means UTC) or epoch seconds; durations are ``timedelta``
    values or seconds. ``catch_up``, ``overlap`` and ``retry`` take their
    policy value, or a mode, a policy name and a number of attempts. Give
    ``handler`` (a Python handler's name) or ``http`` (an ``HttpTarget``, whose
    request's body is ``payload``). ``priority``, 0 (first) to 9 (last),
    default 5, orders the due runs of a pool whose workers are short. A
    recurring schedule may be bounded: no fire before ``active_from``, none
    after ``active_until``, at most ``max_fires`` fires (run or recorded
    missed); the job completes once its bound is reached. A request is
    checked when it is made: a bad one raises ``InvalidArgument`` naming the
    keyword.
    """

    name: str
    # The handler a worker runs; none with ``http`` (which implies "http").
    handler: str = ""
    cron: str | None = None
    every: Duration | None = None
    at: When | timedelta | None = None
    tz: str = "UTC"
    dst_gap: DstGap | str = DstGap.FIRE_AT_TRANSITION
    dst_fold: DstFold | str = DstFold.FIRST
    start: When | None = None
    fixed_delay: bool = False
    payload: Payload = b""
    # An HTTP target instead of a handler; ``payload`` is then its body.
    http: HttpTarget | None = None
    catch_up: CatchUp | str = _CATCH_UP
    overlap: Overlap | str = _OVERLAP
    retry: Retry | int = _RETRY
    jitter: Duration = timedelta(milliseconds=_SPEC.jitter_ms)
    timeout: Duration = timedelta(milliseconds=_SPEC.timeout_ms)
    at_most_once: bool = False
    pool: str = _SPEC.pool
    # 0 (runs first) to 9 (runs last) when the pool's workers are short.
    priority: int = _SPEC.priority
    tenant: str = _SPEC.tenant
    # Calendars of the tenant whose days the job does not fire on (each
    # such fire is recorded missed, reason "calendar").
    skip_calendars: Sequence[str] = ()
    # The limit its runs count against (``Client.set_limit``; "": none).
    concurrency_key: str = ""
    # The same key and body return the job the first submit made (``created``
    # False); the same key with another body is ``AlreadyExists``.
    idempotency_key: str | None = None
    # Bounds of a recurring schedule (None, 0: none).
    active_from: When | None = None
    active_until: When | None = None
    max_fires: int = 0

    def __post_init__(self) -> None:
        # Refuse a bad request where it is made, not later where it is sent.
        spec = job_spec(self, now_ms=0)
        # Kept where the send cannot change it (see ``_Checked``).
        object.__setattr__(self, "_checked", None if isinstance(self.at, timedelta) else spec)


class _RequiredJobArgs(TypedDict):
    # Required keys in a base of their own: ``Required[...]`` in a string
    # annotation (``from __future__ import annotations``) is not seen at run
    # time by Python 3.11's TypedDict.
    name: str


class JobArgs(_RequiredJobArgs, total=False):
    """The keywords of ``Client.submit``, or one item of ``submit_many``: the
    fields of ``JobRequest``, which documents them (``handler`` or ``http``
    is required)."""

    handler: str
    http: HttpTarget | None
    cron: str | None
    every: Duration | None
    at: When | timedelta | None
    tz: str
    dst_gap: DstGap | str
    dst_fold: DstFold | str
    start: When | None
    fixed_delay: bool
    payload: Payload
    catch_up: CatchUp | str
    overlap: Overlap | str
    retry: Retry | int
    jitter: Duration
    timeout: Duration
    at_most_once: bool
    pool: str
    priority: int
    tenant: str
    skip_calendars: Sequence[str]
    idempotency_key: str | None
    active_from: When | None
    active_until: When | None
    max_fires: int
    concurrency_key: str


class UpdateArgs(TypedDict, total=False):
    """The keywords of ``Client.update``: the fields of ``JobRequest`` to
    change (``JobRequest`` documents them), every one but ``tenant``. Any
    schedule keyword (``cron``, ``every``, ``at``, ``tz``...) replaces the
    whole schedule."""

    name: str
    handler: str
    # A target replaces the job's (or moves a job with a Python handler onto
    # it); None moves a job off its target, with ``handler`` given too.
    http: HttpTarget | None
    cron: str | None
    every: Duration | None
    at: When | timedelta | None
    tz: str
    dst_gap: DstGap | str
    dst_fold: DstFold | str
    start: When | None
    fixed_delay: bool
    payload: Payload
    catch_up: CatchUp | str
    overlap: Overlap | str
    retry: Retry | int
    jitter: Duration
    timeout: Duration
    at_most_once: bool
    pool: str
    priority: int
    skip_calendars: Sequence[str]
    # None clears a bound (0 for max_fires).
    active_from: When | None
    active_until: When | None
    max_fires: int
    concurrency_key: str


# -- client -> engine -------------------------------------------------------------


def request_of(item: JobRequest | Mapping[str, Any]) -> JobRequest:
    """A ``JobRequest`` from itself or from a dict of its fields: a dict from a
    file or a form is refused naming the key, not with a ``TypeError``."""
    if isinstance(item, JobRequest):
        return item
    known = {f.name for f in fields(JobRequest)}
    for key in item:
        if key not in known:
            raise InvalidArgument(str(key), "is not a field of a job to submit")
    if "name" not in item:
        raise InvalidArgument("name", "is required")
    if "handler" not in item and item.get("http") is None:
        raise InvalidArgument("handler", "is required (or http, an HTTP target)")
    return JobRequest(**item)


def request_spec(request: JobRequest, *, now_ms: int) -> engine.JobSpec:
    """``job_spec``, made once: the spec the request was checked with where
    ``now_ms`` does not change it."""
    made = getattr(request, "_checked", None)  # unset in a copy made by pickling
    return made if isinstance(made, engine.JobSpec) else job_spec(request, now_ms=now_ms)


def job_spec(request: JobRequest, *, now_ms: int) -> engine.JobSpec:
    """The engine's spec for a request; ``now_ms`` resolves an ``at`` given as
    a ``timedelta``. Raises ``InvalidArgument`` naming the keyword."""
    r = request
    handler, payload = _text(r.handler, "handler"), payload_bytes(r.payload)
    if r.http is not None:
        if handler not in ("", http_targets.HANDLER):
            raise InvalidArgument("handler", "give handler= or http=, not both")
        handler = http_targets.HANDLER
        payload = http_targets.call_payload(wire_target(r.http), payload)
    elif not handler:
        raise InvalidArgument("handler", "is required (or http=, an HTTP target)")
    elif handler == http_targets.HANDLER:
        raise InvalidArgument("handler", f"{handler!r} is reserved for HTTP targets: give http=")
    return engine.JobSpec(
        name=_text(r.name, "name"),
        handler=handler,
        schedule=_schedule(r, now_ms),
        tenant=_text(r.tenant, "tenant"),
        pool=_text(r.pool, "pool"),
        concurrency_key=_text(r.concurrency_key, "concurrency_key"),
        payload=payload,
        jitter_ms=_duration_ms(r.jitter, "jitter", False),
        catch_up=_engine_catch_up(_catch_up(r.catch_up)),
        overlap=_engine_overlap(_overlap(r.overlap)),
        retry=_engine_retry(_retry(r.retry)),
        timeout_ms=_duration_ms(r.timeout, "timeout", True),
        side_effect=(
            engine.SideEffect.AT_MOST_ONCE
            if _flag(r.at_most_once, "at_most_once")
            else engine.SideEffect.IDEMPOTENT
        ),
        priority=_priority(r.priority),
        skip_calendars=_names(r.skip_calendars, "skip_calendars"),
        active_from_ms=_bound_ms(r.active_from, "active_from"),
        active_until_ms=_bound_ms(r.active_until, "active_until"),
        max_fires=_count(r.max_fires, "max_fires"),
    )


def _names(value: object, field: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence | tuple | list):
        raise InvalidArgument(field, "must be a list of names")
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"{field}[{i}]", "must be a non-empty name")
    return tuple(value)


def _bound_ms(value: When | None, field: str) -> int:
    if value is None:
        return 0
    ms = time_ms(value, field)
    if ms <= 0:
        raise InvalidArgument(field, "must be after the epoch")
    return ms


def _count(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(field, f"expected a number >= 0, got {value!r}")
    return value


def wire_target(target: object) -> jobs_pb2.HttpTarget:
    """The protobuf spelling of a client's ``HttpTarget``."""
    if not isinstance(target, HttpTarget):
        raise InvalidArgument("http", f"expected an HttpTarget, got {type(target).__name__}")
    return jobs_pb2.HttpTarget(
        url=target.url,
        method=target.method,
        headers=[jobs_pb2.HttpHeader(name=k, value=v) for k, v in target.headers.items()],
        timeout_ms=millis(target.timeout),
        signing_secret=target.signing_secret or "",
        retry_4xx=target.retry_4xx,
        follow_redirects=target.follow_redirects,
    )


# The policies and durations of a bulk submit's jobs are nearly always the
# same few values: each is converted once (and the engine's value shared).


@functools.lru_cache(maxsize=256)
def _engine_catch_up(catch_up: CatchUp) -> engine.CatchUp:
    return engine.CatchUp(
        mode=engine.CatchUpMode(catch_up.mode),
        window_ms=None if catch_up.window is None else millis(catch_up.window),
        max_count=catch_up.max_count,
    )


@functools.lru_cache(maxsize=256)
def _engine_overlap(overlap: Overlap) -> engine.Overlap:
    return engine.Overlap(
        policy=engine.OverlapPolicy(overlap.policy),
        max_concurrent=overlap.max_concurrent,
        max_buffered=overlap.max_buffered,
    )


@functools.lru_cache(maxsize=256)
def _engine_retry(retry: Retry) -> engine.Retry:
    return engine.Retry(
        max_attempts=retry.max_attempts,
        initial_backoff_ms=millis(retry.initial_backoff),
        max_backoff_ms=millis(retry.max_backoff),
        multiplier=retry.multiplier,
    )


def _duration_ms(value: object, field: str, positive: bool) -> int:
    try:
        return _cached_ms(value, field, positive)
    except TypeError:  # not hashable: checked (and refused) uncached
        return millis(duration(value, field, positive=positive))


@functools.lru_cache(maxsize=256, typed=True)  # typed: True is not 1 here
def _cached_ms(value: object, field: str, positive: bool) -> int:
    return millis(duration(value, field, positive=positive))


def encoded(request: JobRequest, codec: PayloadCodec | None) -> JobRequest:
    """The request with its payload encoded by ``codec`` (``wheel.codec``);
    as it is without a codec, and for an HTTP target, whose body the node
    signs and the endpoint reads as given."""
    if codec is None or request.http is not None:
        return request
    return replace(request, payload=codec.encode(payload_bytes(request.payload)))


def opened(spec: engine.JobSpec, codec: PayloadCodec | None) -> bytes:
    """A stored job's payload (an HTTP target's body) for the application:
    decoded by ``codec`` where it can, else as stored."""
    body = http_targets.body_of(spec)
    if codec is None or spec.handler == http_targets.HANDLER:
        return body
    try:
        return codec.decode(body)
    except CodecError:
        return body


# The same value always makes the same bytes (see ``Payload``); one encoder,
# not one made per payload.
_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)


def payload_bytes(value: object) -> bytes:
    """A payload's bytes (see ``Payload``)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    try:
        text = _JSON.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument("payload", f"not bytes, str or JSON-serializable: {exc}") from None
    return text.encode()


def _schedule(r: JobRequest, now_ms: int) -> engine.Schedule:
    cron, every, at = r.cron, r.every, r.at
    given = [k for k, v in (("cron", cron), ("every", every), ("at", at)) if v is not None]
    if len(given) != 1:
        got = f" (got {' and '.join(given)})" if given else ""
        raise InvalidArgument("schedule", f"give exactly one of cron=, every= or at={got}")
    # Options of another kind of schedule would be ignored without a word.
    if cron is None and (
        r.tz != "UTC" or r.dst_gap != DstGap.FIRE_AT_TRANSITION or r.dst_fold != DstFold.FIRST
    ):
        _misplaced(r, given[0])
    if every is None and (r.start is not None or r.fixed_delay is not False):
        _misplaced(r, given[0])
    if cron is not None:
        return engine.Cron(
            expr=_text(cron, "cron"),
            time_zone=_text(r.tz, "tz"),
            dst_gap=_engine_choice(r.dst_gap, DstGap, engine.DstGap, "dst_gap"),
            dst_fold=_engine_choice(r.dst_fold, DstFold, engine.DstFold, "dst_fold"),
        )
    if every is not None:
        start_ms = 0  # the wire's "a period after the node receives it"
        if r.start is not None:
            start_ms = time_ms(r.start, "start")
            if start_ms <= 0:
                raise InvalidArgument("start", "must be after the epoch")
        return engine.Interval(
            period_ms=_duration_ms(every, "every", True),
            mode=(
                engine.IntervalMode.FIXED_DELAY
                if _flag(r.fixed_delay, "fixed_delay")
                else engine.IntervalMode.FIXED_RATE
            ),
            start_at_ms=start_ms,
        )
    if isinstance(at, timedelta):
        return engine.Once(at_ms=now_ms + millis(as_duration(at, "at")))
    return engine.Once(at_ms=time_ms(at, "at"))


def _misplaced(r: JobRequest, kind: str) -> None:
    """Refuse the first option ``r`` sets that belongs to another kind of
    schedule than its ``kind``."""
    belongs = {
        "tz": ("cron", r.tz != "UTC"),
        "dst_gap": ("cron", r.dst_gap != DstGap.FIRE_AT_TRANSITION),
        "dst_fold": ("cron", r.dst_fold != DstFold.FIRST),
        "start": ("every", r.start is not None),
        "fixed_delay": ("every", r.fixed_delay is not False),
    }
    for field, (owner, set_here) in belongs.items():
        if set_here and kind != owner:
            raise InvalidArgument(field, f"goes with {owner}= only, not with {kind}=")


def _engine_choice(value: object, given: type[StrEnum], to: type[_Enum], field: str) -> _Enum:
    """``choice`` of ``given`` as the engine's ``to``: made once a name (a
    member is one too), anything else refused uncached (it may not hash)."""
    if isinstance(value, str):
        made: _Enum = _engine_named(value, given, to, field)  # the cache's type is not generic
        return made
    return to(choice(given, value, field))


@functools.lru_cache(maxsize=128)
def _engine_named(value: str, given: type[StrEnum], to: type[_Enum], field: str) -> _Enum:
    return to(choice(given, value, field))


# A policy given by name (or a number of attempts), made once: they are frozen.
@functools.lru_cache(maxsize=64)
def _catch_up_named(mode: str) -> CatchUp:
    return CatchUp(mode=choice(CatchUpMode, mode, "catch_up"))


@functools.lru_cache(maxsize=64)
def _overlap_named(policy: str) -> Overlap:
    return Overlap(policy=choice(OverlapPolicy, policy, "overlap"))


@functools.lru_cache(maxsize=64)
def _retry_of_attempts(attempts: int) -> Retry:
    return Retry(max_attempts=attempts)


def _catch_up(value: object) -> CatchUp:
    if isinstance(value, CatchUp):
        return value
    if isinstance(value, str):
        return _catch_up_named(value)
    raise InvalidArgument("catch_up", f"expected a CatchUp or a mode, got {type(value).__name__}")


def _overlap(value: object) -> Overlap:
    if isinstance(value, Overlap):
        return value
    if isinstance(value, str):
        return _overlap_named(value)
    raise InvalidArgument("overlap", f"expected an Overlap or a policy, got {type(value).__name__}")


def _retry(value: object) -> Retry:
    if isinstance(value, Retry):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return _retry_of_attempts(value)
    raise InvalidArgument("retry", f"expected a Retry or a number of attempts >= 1, got {value!r}")


def _text(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(field, f"expected a string, got {type(value).__name__}")
    return value


def _priority(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument("priority", f"expected a whole number 0..9, got {value!r}")
    if not engine.MIN_PRIORITY <= value <= engine.MAX_PRIORITY:
        raise InvalidArgument("priority", f"{value} is outside [0, 9]")
    return value


def _flag(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(field, f"expected True or False, got {value!r}")
    return value


# -- engine -> client -------------------------------------------------------------


def schedule_of(schedule: engine.Schedule) -> Schedule:
    """The client's description of a spec's schedule."""
    if isinstance(schedule, engine.Once):
        return At(time=utc(schedule.at_ms))
    if isinstance(schedule, engine.Cron):
        return _cron_of(schedule)
    return Every(
        period=span(schedule.period_ms),
        start=utc(schedule.start_at_ms),
        fixed_delay=schedule.mode is engine.IntervalMode.FIXED_DELAY,
    )


# Many jobs share a cron schedule (a bulk submit's answer holds thousands):
# frozen, so each is made once.
@functools.lru_cache(maxsize=1024)
def _cron_of(schedule: engine.Cron) -> Cron:
    return Cron(
        expr=schedule.expr,
        tz=schedule.time_zone,
        dst_gap=DstGap(schedule.dst_gap),
        dst_fold=DstFold(schedule.dst_fold),
    )


def http_of(spec: engine.JobSpec) -> HttpTarget | None:
    """A job's HTTP target as the client's value (None: a Python handler's)."""
    t = http_targets.target_of(spec)
    if t is None:
        return None
    return HttpTarget(
        t.url,
        method=t.method,
        headers=[(h.name, h.value) for h in t.headers],
        timeout=timedelta(milliseconds=t.timeout_ms or http_targets.DEFAULT_TIMEOUT_MS),
        signing_secret=t.signing_secret or None,
        retry_4xx=t.retry_4xx,
        follow_redirects=t.follow_redirects,
    )


# A job's policies mostly repeat (a bulk submit's answer holds thousands
# of jobs with the same ones); they are frozen, so each is made once.
@functools.lru_cache(maxsize=256)
def catch_up_of(c: engine.CatchUp) -> CatchUp:
    window = None if c.window_ms is None else timedelta(milliseconds=c.window_ms)
    return CatchUp(mode=CatchUpMode(c.mode), window=window, max_count=c.max_count)


@functools.lru_cache(maxsize=256)
def overlap_of(o: engine.Overlap) -> Overlap:
    return Overlap(
        policy=OverlapPolicy(o.policy), max_concurrent=o.max_concurrent, max_buffered=o.max_buffered
    )


@functools.lru_cache(maxsize=256)
def retry_of(r: engine.Retry) -> Retry:
    return Retry(
        max_attempts=r.max_attempts,
        initial_backoff=timedelta(milliseconds=r.initial_backoff_ms),
        max_backoff=timedelta(milliseconds=r.max_backoff_ms),
        multiplier=r.multiplier,
    )
