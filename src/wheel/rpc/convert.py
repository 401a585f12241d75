"""Protobuf messages <-> the engine's values.

The proto keeps proto3's "zero means unset" convention; the defaults each zero
stands for are written in ``jobs.proto`` and applied here, in one place, so
the engine only ever sees complete ``JobSpec`` values. Unknown enum numbers
(proto3 enums are open) are rejected with ``InvalidArgument`` naming the
field. Cron syntax is deliberately not checked here: the engine's schedule
compiler owns that.

Some specs have no proto spelling because zero means "default" on the wire:
``Retry.initial_backoff_ms == 0``, ``CatchUp.window_ms == 0`` (as opposed to
``None``) and ``Interval.start_at_ms == 0``. ``spec_to_proto`` writes them
as zero, which reads back as the default.

Attempts are 1-based on the wire (the first attempt of a fire is attempt 1,
as users of other schedulers expect) and 0-based in the engine and the store
(``UNIQUE (job_id, scheduled_for, attempt)`` and the rows of existing
databases keep their numbers): ``wire_attempt`` is the one translation, made
where a run leaves for a client or a worker. Nothing reads an attempt from
the wire.
"""

from __future__ import annotations

import functools
import zoneinfo
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from wheel import http_targets
from wheel.engine.model import JobState, RunState, idempotency_key
from wheel.engine.records import ExecutionRecord, JobRecord, MissedFire
from wheel.engine.spec import (
    DEFAULT_PRIORITY,
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
    Schedule,
    SideEffect,
)
from wheel.errors import InvalidArgument
from wheel.rpc.v1 import jobs_pb2

__all__ = [
    "JOB_STATE_FROM_PROTO",
    "JOB_STATE_TO_PROTO",
    "RUN_STATE_FROM_PROTO",
    "RUN_STATE_TO_PROTO",
    "RunFilter",
    "job_state_from_proto",
    "job_state_to_proto",
    "job_to_proto",
    "missed_to_proto",
    "priority_of",
    "run_filter_from_proto",
    "run_state_from_proto",
    "run_state_to_proto",
    "run_to_proto",
    "spec_from_proto",
    "spec_to_proto",
    "wire_attempt",
]

_E = TypeVar("_E")
_P = TypeVar("_P", bound=int)

# -- enum tables (UNSPECIFIED maps to the documented default) ------------------------

_CATCH_UP_MODE: dict[jobs_pb2.CatchUpMode, CatchUpMode] = {
    jobs_pb2.CATCH_UP_MODE_UNSPECIFIED: CatchUpMode.RUN_LATEST_ONLY,
    jobs_pb2.CATCH_UP_MODE_RUN_LATEST_ONLY: CatchUpMode.RUN_LATEST_ONLY,
    jobs_pb2.CATCH_UP_MODE_RUN_ALL: CatchUpMode.RUN_ALL,
    jobs_pb2.CATCH_UP_MODE_SKIP: CatchUpMode.SKIP,
}
_OVERLAP_POLICY: dict[jobs_pb2.OverlapPolicy, OverlapPolicy] = {
    jobs_pb2.OVERLAP_POLICY_UNSPECIFIED: OverlapPolicy.SKIP,
    jobs_pb2.OVERLAP_POLICY_SKIP: OverlapPolicy.SKIP,
    jobs_pb2.OVERLAP_POLICY_BUFFER_ONE: OverlapPolicy.BUFFER_ONE,
    jobs_pb2.OVERLAP_POLICY_BUFFER_ALL: OverlapPolicy.BUFFER_ALL,
    jobs_pb2.OVERLAP_POLICY_ALLOW: OverlapPolicy.ALLOW,
}
_SIDE_EFFECT: dict[jobs_pb2.SideEffect, SideEffect] = {
    jobs_pb2.SIDE_EFFECT_UNSPECIFIED: SideEffect.IDEMPOTENT,
    jobs_pb2.SIDE_EFFECT_IDEMPOTENT: SideEffect.IDEMPOTENT,
    jobs_pb2.SIDE_EFFECT_AT_MOST_ONCE: SideEffect.AT_MOST_ONCE,
}
_INTERVAL_MODE: dict[jobs_pb2.IntervalMode, IntervalMode] = {
    jobs_pb2.INTERVAL_MODE_UNSPECIFIED: IntervalMode.FIXED_RATE,
    jobs_pb2.INTERVAL_MODE_FIXED_RATE: IntervalMode.FIXED_RATE,
    jobs_pb2.INTERVAL_MODE_FIXED_DELAY: IntervalMode.FIXED_DELAY,
}
_DST_GAP: dict[jobs_pb2.DstGap, DstGap] = {
    jobs_pb2.DST_GAP_UNSPECIFIED: DstGap.FIRE_AT_TRANSITION,
    jobs_pb2.DST_GAP_FIRE_AT_TRANSITION: DstGap.FIRE_AT_TRANSITION,
    jobs_pb2.DST_GAP_SKIP: DstGap.SKIP,
}
_DST_FOLD: dict[jobs_pb2.DstFold, DstFold] = {
    jobs_pb2.DST_FOLD_UNSPECIFIED: DstFold.FIRST,
    jobs_pb2.DST_FOLD_FIRST: DstFold.FIRST,
    jobs_pb2.DST_FOLD_BOTH: DstFold.BOTH,
}


def _invert(table: Mapping[_P, _E], unspecified: _P) -> dict[_E, _P]:
    return {v: k for k, v in table.items() if k != unspecified}


_CATCH_UP_MODE_TO = _invert(_CATCH_UP_MODE, jobs_pb2.CATCH_UP_MODE_UNSPECIFIED)
_OVERLAP_POLICY_TO = _invert(_OVERLAP_POLICY, jobs_pb2.OVERLAP_POLICY_UNSPECIFIED)
_SIDE_EFFECT_TO = _invert(_SIDE_EFFECT, jobs_pb2.SIDE_EFFECT_UNSPECIFIED)
_INTERVAL_MODE_TO = _invert(_INTERVAL_MODE, jobs_pb2.INTERVAL_MODE_UNSPECIFIED)
_DST_GAP_TO = _invert(_DST_GAP, jobs_pb2.DST_GAP_UNSPECIFIED)
_DST_FOLD_TO = _invert(_DST_FOLD, jobs_pb2.DST_FOLD_UNSPECIFIED)

JOB_STATE_TO_PROTO: Mapping[JobState, jobs_pb2.JobState] = {
    JobState.ACTIVE: jobs_pb2.JOB_STATE_ACTIVE,
    JobState.PAUSED: jobs_pb2.JOB_STATE_PAUSED,
    JobState.CANCELLED: jobs_pb2.JOB_STATE_CANCELLED,
    JobState.COMPLETED: jobs_pb2.JOB_STATE_COMPLETED,
    JobState.RUNNING: jobs_pb2.JOB_STATE_RUNNING,
    JobState.FAILED: jobs_pb2.JOB_STATE_FAILED,
}
JOB_STATE_FROM_PROTO: Mapping[int, JobState] = {v: k for k, v in JOB_STATE_TO_PROTO.items()}

RUN_STATE_TO_PROTO: Mapping[RunState, jobs_pb2.RunState] = {
    RunState.DISPATCHED: jobs_pb2.RUN_STATE_DISPATCHED,
    RunState.RUNNING: jobs_pb2.RUN_STATE_RUNNING,
    RunState.SUCCEEDED: jobs_pb2.RUN_STATE_SUCCEEDED,
    RunState.FAILED: jobs_pb2.RUN_STATE_FAILED,
    RunState.TIMED_OUT: jobs_pb2.RUN_STATE_TIMED_OUT,
    RunState.LOST: jobs_pb2.RUN_STATE_LOST,
    RunState.DEAD_LETTERED: jobs_pb2.RUN_STATE_DEAD_LETTERED,
    RunState.UNKNOWN: jobs_pb2.RUN_STATE_UNKNOWN,
    RunState.CANCELLED: jobs_pb2.RUN_STATE_CANCELLED,
}
# RUN_STATE_MISSED has no engine RunState: a missed fire is not an execution.
RUN_STATE_FROM_PROTO: Mapping[int, RunState] = {v: k for k, v in RUN_STATE_TO_PROTO.items()}


def _enum(table: Mapping[_P, _E], value: int, field: str) -> _E:
    try:
        return table[value]  # type: ignore[index]
    except KeyError:
        raise InvalidArgument(field, f"unknown enum value {value}") from None


def _or(value: _E, zero: _E, default: _E) -> _E:
    return default if value == zero else value


# -- specs ----------------------------------------------------------------------


# Whether a tenant has a calendar of that name (the node's ``knows_calendar``).
CalendarKnown = Callable[[str, str], bool]


def spec_from_proto(
    msg: jobs_pb2.JobSpec,
    *,
    now_ms: int,
    sent: bool = False,
    target_sent: bool | None = None,
    secret_sent: bool | None = None,
    secret_known: http_targets.SecretKnown | None = None,
    calendar_known: CalendarKnown | None = None,
) -> JobSpec:
    """A validated ``JobSpec`` from a ``jobs_pb2.JobSpec``, with the proto's defaults.

    ``now_ms`` anchors an interval whose ``start_at_ms`` is 0 (first fire at
    now + period). Raises ``InvalidArgument`` naming the first bad field.
    ``sent``: a spec a caller sent (a submit, an update, a preview), whose
    time zone must be an IANA name (``_iana_zone``); a spec read back is
    taken as the node stored it. ``target_sent`` (default: ``sent``): its
    HTTP target is checked as ``wheel.http_targets`` says, and a handler
    "http" without one refused; ``secret_sent`` (default: ``target_sent``):
    its signing secret is checked too, against ``secret_known`` when given.
    A job with a target has handler "http" and the ``HttpCall`` of its
    target and body as its payload. ``calendar_known``: each calendar it
    skips must be one of its tenant's (the node's cache of the store's).
    """
    tenant = msg.tenant or "default"
    timeout_ms = _or(msg.timeout_ms, 0, 300_000)
    handler, payload = msg.handler, bytes(msg.payload)
    check = sent if target_sent is None else target_sent
    if msg.HasField("http"):
        if handler not in ("", http_targets.HANDLER):
            raise InvalidArgument(
                "spec.handler",
                f"a job with an HTTP target (spec.http) has handler {http_targets.HANDLER!r}"
                f" or none, not {handler[:200]!r}",
            )
        target = msg.http
        if check:
            target = http_targets.normalised_target(
                target,
                tenant=tenant,
                job_timeout_ms=max(timeout_ms, 1),
                check_secret=check if secret_sent is None else secret_sent,
                secret_known=secret_known,
            )
        handler, payload = http_targets.HANDLER, http_targets.call_payload(target, payload)
    elif check and handler == http_targets.HANDLER:
        raise InvalidArgument(
            "spec.handler",
            f"{http_targets.HANDLER!r} is reserved for jobs with an HTTP target (spec.http)",
        )
    catch_up, overlap, retry = _policies(msg)
    spec = JobSpec(
        name=msg.name,
        handler=handler,
        tenant=tenant,
        payload=payload,
        schedule=_schedule_from_proto(msg, now_ms, sent),
        jitter_ms=msg.jitter_ms,
        catch_up=catch_up,
        overlap=overlap,
        retry=retry,
        timeout_ms=timeout_ms,
        side_effect=_enum(_SIDE_EFFECT, msg.side_effect, "spec.side_effect"),
        pool=msg.pool or "default",
        priority=priority_of(msg),
        skip_calendars=tuple(msg.skip_calendars),
        active_from_ms=msg.active_from_ms,
        active_until_ms=msg.active_until_ms,
        max_fires=msg.max_fires,
        concurrency_key=msg.concurrency_key,
    )
    spec.validate()
    if calendar_known is not None:
        for i, name in enumerate(spec.skip_calendars):
            if not calendar_known(tenant, name):
                raise InvalidArgument(
                    f"spec.skip_calendars[{i}]",
                    f"tenant {tenant!r} has no calendar {name!r} (wheelctl calendar set)",
                )
    return spec


# The policies and cron schedules that the jobs of a bulk submit share, made
# once each and kept (they are immutable): a bulk submit's jobs mostly differ
# in name, payload and start only, and building these field by field was a
# third of a submit's conversion. Cleared when full, so odd values sent
# once cannot grow it without bound.
_SHARED_MAX = 4_096
_Policies = tuple[CatchUp, Overlap, Retry]
_policies_made: dict[tuple[int | float, ...], _Policies] = {}
_crons_made: dict[tuple[str, str, int, int, bool], Cron] = {}


def _policies(msg: jobs_pb2.JobSpec) -> _Policies:
    """The spec's catch-up, overlap and retry policies, with the proto's defaults."""
    c, o, r = msg.catch_up, msg.overlap, msg.retry
    key = (
        c.mode, c.window_ms, c.max_count,
        o.policy, o.max_concurrent, o.max_buffered,
        r.max_attempts, r.initial_backoff_ms, r.max_backoff_ms, r.multiplier,
    )  # fmt: skip
    made = _policies_made.get(key)
    if made is not None:
        return made
    made = (
        CatchUp(
            mode=_enum(_CATCH_UP_MODE, c.mode, "spec.catch_up.mode"),
            window_ms=c.window_ms or None,
            max_count=_or(c.max_count, 0, 100),
        ),
        Overlap(
            policy=_enum(_OVERLAP_POLICY, o.policy, "spec.overlap.policy"),
            max_concurrent=_or(o.max_concurrent, 0, 1),
            max_buffered=_or(o.max_buffered, 0, 100),
        ),
        Retry(
            max_attempts=_or(r.max_attempts, 0, 5),
            initial_backoff_ms=_or(r.initial_backoff_ms, 0, 1_000),
            max_backoff_ms=_or(r.max_backoff_ms, 0, 300_000),
            multiplier=_or(r.multiplier, 0.0, 2.0),
        ),
    )
    if len(_policies_made) >= _SHARED_MAX:
        _policies_made.clear()
    _policies_made[key] = made
    return made


def _cron_from_proto(c: jobs_pb2.CronSchedule, sent: bool) -> Cron:
    key = (c.expr, c.time_zone, c.dst_gap, c.dst_fold, sent)
    made = _crons_made.get(key)
    if made is not None:
        return made
    made = Cron(
        expr=c.expr,
        time_zone=_iana_zone(c.time_zone or "UTC") if sent else c.time_zone or "UTC",
        dst_gap=_enum(_DST_GAP, c.dst_gap, "spec.schedule.cron.dst_gap"),
        dst_fold=_enum(_DST_FOLD, c.dst_fold, "spec.schedule.cron.dst_fold"),
    )
    if len(_crons_made) >= _SHARED_MAX:
        _crons_made.clear()
    _crons_made[key] = made
    return made


def priority_of(msg: jobs_pb2.JobSpec) -> int:
    """A spec message's priority: unset is the default (5), not 0."""
    return msg.priority if msg.HasField("priority") else DEFAULT_PRIORITY


def _schedule_from_proto(msg: jobs_pb2.JobSpec, now_ms: int, sent: bool) -> Schedule:
    kind = msg.schedule.WhichOneof("kind") if msg.HasField("schedule") else None
    if kind == "once":
        return Once(at_ms=msg.schedule.once.at_ms)
    if kind == "cron":
        return _cron_from_proto(msg.schedule.cron, sent)
    if kind == "interval":
        i = msg.schedule.interval
        # No start given: the first fire a period from now, or at the start
        # of the active range if that is later.
        start = i.start_at_ms or max(now_ms + i.period_ms, msg.active_from_ms)
        return Interval(
            period_ms=i.period_ms,
            mode=_enum(_INTERVAL_MODE, i.mode, "spec.schedule.interval.mode"),
            start_at_ms=start,
        )
    raise InvalidArgument("spec.schedule", "one of once, cron or interval is required")


@functools.cache
def _iana_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def _iana_zone(name: str) -> str:
    """An IANA zone name, as every node knows it. ZoneInfo also opens other
    files of the system's zoneinfo directory (``posix/Asia/Tokyo``,
    ``right/UTC``, ``posixrules``): a job named so fires on this node and
    fails to compile on a node whose zones come from the tzdata package."""
    if name not in _iana_zones():
        raise InvalidArgument("spec.schedule.cron.time_zone", f"unknown IANA time zone {name!r}")
    return name


def spec_to_proto(spec: JobSpec) -> jobs_pb2.JobSpec:
    """The ``jobs_pb2.JobSpec`` for a spec, every enum spelled out explicitly;
    a job with an HTTP target shows it as ``http``, its body as ``payload``."""
    call = http_targets.call_of(spec.payload) if spec.handler == http_targets.HANDLER else None
    msg = jobs_pb2.JobSpec(
        name=spec.name,
        tenant=spec.tenant,
        handler=spec.handler,
        payload=spec.payload if call is None else call.body,
        jitter_ms=spec.jitter_ms,
        timeout_ms=spec.timeout_ms,
        side_effect=_SIDE_EFFECT_TO[spec.side_effect],
        pool=spec.pool,
        skip_calendars=spec.skip_calendars,
        active_from_ms=spec.active_from_ms,
        active_until_ms=spec.active_until_ms,
        max_fires=spec.max_fires,
        concurrency_key=spec.concurrency_key,
        catch_up=jobs_pb2.CatchUp(
            mode=_CATCH_UP_MODE_TO[spec.catch_up.mode],
            window_ms=spec.catch_up.window_ms or 0,
            max_count=spec.catch_up.max_count,
        ),
        overlap=jobs_pb2.Overlap(
            policy=_OVERLAP_POLICY_TO[spec.overlap.policy],
            max_concurrent=spec.overlap.max_concurrent,
            max_buffered=spec.overlap.max_buffered,
        ),
        retry=jobs_pb2.RetryPolicy(
            max_attempts=spec.retry.max_attempts,
            initial_backoff_ms=spec.retry.initial_backoff_ms,
            max_backoff_ms=spec.retry.max_backoff_ms,
            multiplier=spec.retry.multiplier,
        ),
    )
    if call is not None:
        msg.http.CopyFrom(call.target)
    s = spec.schedule
    if isinstance(s, Once):
        msg.schedule.once.at_ms = s.at_ms
    elif isinstance(s, Cron):
        msg.schedule.cron.CopyFrom(
            jobs_pb2.CronSchedule(
                expr=s.expr,
                time_zone=s.time_zone,
                dst_gap=_DST_GAP_TO[s.dst_gap],
                dst_fold=_DST_FOLD_TO[s.dst_fold],
            )
        )
    else:
        msg.schedule.interval.CopyFrom(
            jobs_pb2.IntervalSchedule(
                period_ms=s.period_ms, mode=_INTERVAL_MODE_TO[s.mode], start_at_ms=s.start_at_ms
            )
        )
    if spec.priority != DEFAULT_PRIORITY:
        # Left unset at the default: a spec's wire bytes (the body hash of an
        # idempotent submit) stay what they were before priorities.
        msg.priority = spec.priority
    return msg


# -- states -----------------------------------------------------------------------


def job_state_to_proto(state: JobState) -> jobs_pb2.JobState:
    return JOB_STATE_TO_PROTO[state]


def job_state_from_proto(value: int, *, field: str = "state") -> JobState | None:
    """None for JOB_STATE_UNSPECIFIED (a filter meaning "any state")."""
    if value == jobs_pb2.JOB_STATE_UNSPECIFIED:
        return None
    return _enum(JOB_STATE_FROM_PROTO, value, field)


def run_state_to_proto(state: RunState) -> jobs_pb2.RunState:
    return RUN_STATE_TO_PROTO[state]


def run_state_from_proto(value: int, *, field: str = "state") -> RunState:
    """An execution state; UNSPECIFIED and MISSED are not executions and are rejected."""
    return _enum(RUN_STATE_FROM_PROTO, value, field)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFilter:
    """What ListRuns asked for: these execution states, and missed fires or not."""

    states: frozenset[RunState]
    missed: bool


def run_filter_from_proto(values: Iterable[int], *, field: str = "states") -> RunFilter:
    """An empty filter means every execution state and the missed fires."""
    values = list(values)
    if not values:
        return RunFilter(states=frozenset(RunState), missed=True)
    states: set[RunState] = set()
    missed = False
    for v in values:
        if v == jobs_pb2.RUN_STATE_MISSED:
            missed = True
        else:
            states.add(_enum(RUN_STATE_FROM_PROTO, v, field))
    return RunFilter(states=frozenset(states), missed=missed)


# -- records ----------------------------------------------------------------------


def job_to_proto(
    record: JobRecord,
    *,
    next_fires_ms: Sequence[int] = (),
    recent_runs: Sequence[jobs_pb2.Run] = (),
) -> jobs_pb2.Job:
    """A ``jobs_pb2.Job``; ``next_fire_ms`` is 0 when nothing is scheduled."""
    return jobs_pb2.Job(
        job_id=record.job_id,
        spec=spec_to_proto(record.spec),
        state=JOB_STATE_TO_PROTO[record.state],
        shard=record.shard,
        created_at_ms=record.created_at_ms,
        updated_at_ms=record.updated_at_ms,
        next_fire_ms=record.next_run_at or 0,
        next_fires_ms=list(next_fires_ms),
        recent_runs=list(recent_runs),
    )


def wire_attempt(stored: int) -> int:
    """The attempt a client or a worker sees (1 for a fire's first) for the
    engine's and the store's 0-based ``stored``."""
    return stored + 1


def run_to_proto(record: ExecutionRecord) -> jobs_pb2.Run:
    """A ``jobs_pb2.Run`` for one execution (one attempt of one fire)."""
    return jobs_pb2.Run(
        run_id=record.run_id,
        job_id=record.job_id,
        scheduled_for_ms=record.scheduled_for,
        attempt=wire_attempt(record.attempt),
        state=RUN_STATE_TO_PROTO[record.state],
        fence=record.fence,
        worker_id=record.worker_id or "",
        dispatched_at_ms=record.dispatched_at_ms,
        started_at_ms=record.started_at_ms or 0,
        finished_at_ms=record.finished_at_ms or 0,
        error=record.error or "",
        idempotency_key=idempotency_key(record.job_id, record.scheduled_for),
        result_json=record.result or "",
    )


def missed_to_proto(m: MissedFire) -> jobs_pb2.Run:
    """A missed fire as a ``Run`` (run_id 0, state MISSED); finished_at_ms is
    when the miss was recorded."""
    return jobs_pb2.Run(
        run_id=0,
        job_id=m.job_id,
        scheduled_for_ms=m.scheduled_for,
        state=jobs_pb2.RUN_STATE_MISSED,
        finished_at_ms=m.recorded_at_ms,
        missed_reason=m.reason.value,
        idempotency_key=idempotency_key(m.job_id, m.scheduled_for),
    )
