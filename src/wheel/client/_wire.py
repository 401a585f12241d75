"""Protobuf requests and responses <-> the client's values, for both clients.

``Client`` and ``AsyncClient`` only move messages: every request is built and
every response read here, once. Specs go through the engine's ``JobSpec`` and
``wheel.rpc.convert``; states go through convert's tables, so the protobuf
spelling of each value is written in one place in the project.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Final, TypeVar

import grpc  # type: ignore[import-untyped, unused-ignore]
from google.protobuf.descriptor import FieldDescriptor

from wheel import http_targets
from wheel.client._pages import Pages
from wheel.client._specs import (
    JobArgs,
    JobRequest,
    UpdateArgs,
    catch_up_of,
    encoded,
    http_of,
    job_spec,
    opened,
    overlap_of,
    request_of,
    request_spec,
    retry_of,
    schedule_of,
)
from wheel.client._time import When, span, time_ms, utc, utc_or_none
from wheel.client._values import (
    Alert,
    AlertKind,
    Alerts,
    Backfill,
    InFlight,
    InFlightRun,
    Job,
    JobState,
    JobUpdate,
    LagMinute,
    Member,
    Membership,
    MissedReason,
    NodeStatus,
    Run,
    RunState,
    ShardRelease,
    ShardStatus,
    Status,
    Trigger,
    UnservedHandler,
    WorkerStatus,
    choice,
)
from wheel.codec import PayloadCodec
from wheel.engine import model
from wheel.engine.spec import Interval, JobSpec, SideEffect
from wheel.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    WheelError,
)
from wheel.rpc import convert
from wheel.rpc.v1 import admin_service_pb2 as admin
from wheel.rpc.v1 import cluster_pb2, jobs_pb2
from wheel.rpc.v1 import job_service_pb2 as js
from wheel.runresult import parse_result

DEFAULT_TARGET = "127.0.0.1:50051"

# -- errors -------------------------------------------------------------------------

_BY_CODE: dict[Any, Callable[[str], WheelError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
}


def error_from_rpc(exc: grpc.RpcError) -> WheelError:
    """The ``WheelError`` for a failed call (sync or ``grpc.aio``); the server's
    message is kept as is.

    INVALID_ARGUMENT details of the form ``"field: reason"`` (how the server
    renders ``InvalidArgument``) become ``InvalidArgument(field, reason)``.
    Codes without a wheel error of their own (UNAVAILABLE, DEADLINE_EXCEEDED,
    INTERNAL...) become a plain ``WheelError`` whose message starts with the
    code's name.
    """
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    return error_of(
        code() if callable(code) else grpc.StatusCode.UNKNOWN,
        (details() if callable(details) else None) or "",
    )


def is_unavailable(exc: grpc.RpcError) -> bool:
    """Whether a failed call may be tried on another node: UNAVAILABLE, which
    a node also answers for a shard it does not own (NOT_OWNER)."""
    code = getattr(exc, "code", None)
    return callable(code) and code() == grpc.StatusCode.UNAVAILABLE


def unreachable(
    address: str, cause: grpc.RpcError | None = None, *, tls: bool = False
) -> WheelError:
    """The failure of a call whose channel to ``address`` did not connect:
    gRPC's last error, and what to check when that looks like TLS."""
    details = getattr(cause, "details", None)
    last = (details() if callable(details) else None) or ""
    last = last.rpartition("last error: ")[2]
    message = f"cannot connect to {address}" + (f" ({last})" if last else "")
    if "CERTIFICATE_VERIFY_FAILED" in last or "andshake" in last:
        message += (
            "; TLS: the node's certificate is not signed by the CA given here (--tls-ca,"
            " WHEEL_TLS_CA) or does not name this address"
        )
    elif last.endswith("Socket closed"):
        message += (
            "; a node serving TLS closes a plaintext connection (give --tls-ca)"
            if not tls
            else "; a node with mutual TLS closes a connection without a client certificate"
            " its --client-ca signed (--tls-cert and --tls-key, WHEEL_TLS_CERT and WHEEL_TLS_KEY)"
        )
    return error_of(grpc.StatusCode.UNAVAILABLE, message)


def error_of(code: Any, details: str) -> WheelError:
    """The ``WheelError`` for a status code and its details."""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        field, sep, reason = details.partition(": ")
        if sep and field and " " not in field:
            return InvalidArgument(field, reason)
        err = InvalidArgument("", details)
        err.args = (details,)
        return err
    make = _BY_CODE.get(code)
    if make is not None:
        return make(details)
    return WheelError(f"{code.name}: {details}" if details else code.name)


# -- requests ---------------------------------------------------------------------


def submit_request(
    request: JobRequest, codec: PayloadCodec | None = None
) -> tuple[js.SubmitJobRequest, bool]:
    """The request, and whether its idempotency key was generated here.

    A submit without a key gets one of its own, so that the same request sent
    again (to another node, or after an answer that was lost) finds the job
    the first attempt made instead of making a second. Built once per call:
    every attempt sends the same bytes, so the node sees the same body.
    ``codec``: the payload is encoded (``wheel.codec``) before it is sent."""
    _, msg, generated = _submit(encoded(request, codec))
    return msg, generated


def _submit(
    request: JobRequest, keys: Callable[[], str] | None = None
) -> tuple[JobSpec, js.SubmitJobRequest, bool]:
    """``submit_request``, with the spec it sends (``keys``: where a key
    comes from when the request has none; ``generated_key`` by default)."""
    # The wall clock resolves an ``at`` given as a ``timedelta`` from now.
    now_ms = time.time_ns() // 1_000_000
    key = request.idempotency_key
    spec = request_spec(request, now_ms=now_ms)
    msg = js.SubmitJobRequest(
        spec=convert.spec_to_proto(spec), idempotency_key=key or (keys or generated_key)()
    )
    return spec, msg, not key


def generated_key() -> str:
    """An idempotency key nobody else will send: 128 random bits."""
    return f"wheel-client-{secrets.token_hex(16)}"


class GeneratedKeys:
    """``generated_key`` for a bulk submit: the same 128 random bits a key,
    drawn from the system's source 256 keys at a time rather than once a key."""

    __slots__ = ("_at", "_hex")

    BITS_HEX: Final = 32  # hex digits a key
    AT_ONCE: Final = 256

    def __init__(self) -> None:
        self._hex = ""
        self._at = 0

    def __call__(self) -> str:
        at = self._at
        if at >= len(self._hex):
            self._hex = secrets.token_hex(16 * self.AT_ONCE)
            at = 0
        self._at = at + self.BITS_HEX
        return "wheel-client-" + self._hex[at : at + self.BITS_HEX]


@dataclass(frozen=True, slots=True, kw_only=True)
class Submits:
    """A bulk submit: the request for the items that are good, and per item
    the client's own error (None where the item was sent) and whether its
    idempotency key was generated here."""

    request: js.SubmitJobsRequest
    refused: list[WheelError | None]
    generated: list[bool]
    # The spec each good item sent: the node's lean answer leaves it out.
    specs: list[JobSpec | None]
    codec: PayloadCodec | None = None


def submit_many_request(
    jobs: Iterable[JobRequest | JobArgs], codec: PayloadCodec | None = None
) -> Submits:
    out = Submits(
        request=js.SubmitJobsRequest(lean=True), refused=[], generated=[], specs=[], codec=codec
    )
    keys = GeneratedKeys()
    for item in jobs:
        try:
            spec, request, generated = _submit(encoded(request_of(item), codec), keys)
        except WheelError as exc:
            out.refused.append(exc)
            out.generated.append(False)
            out.specs.append(None)
        else:
            out.request.jobs.append(request)
            out.refused.append(None)
            out.generated.append(generated)
            out.specs.append(spec)
    return out


def submit_many_results(
    submits: Submits, resp: js.SubmitJobsResponse | None
) -> list[Job | WheelError]:
    """Each item's job or error, in the order the items were given (``resp`` is
    None when no item was good enough to send)."""
    answers = iter(resp.results if resp is not None else ())
    out: list[Job | WheelError] = []
    for mine, generated, spec in zip(
        submits.refused, submits.generated, submits.specs, strict=True
    ):
        if mine is not None:
            out.append(mine)
            continue
        r = next(answers)
        if r.error_code:
            code = grpc.StatusCode.__members__.get(r.error_code, grpc.StatusCode.UNKNOWN)
            out.append(error_of(code, r.error_message))
            continue
        msg, created = r.response.job, r.response.created or generated
        if msg.HasField("spec") or spec is None:
            out.append(job_of(msg, created=created, codec=submits.codec))
            continue
        # A lean answer: the spec is the one sent, an interval sent without a
        # start beginning at its first fire, a target as the node keeps it
        # (its method upper-cased, its timeout resolved).
        spec = http_targets.stored_spec(spec, check_secret=False)
        s = spec.schedule
        if isinstance(s, Interval) and not s.start_at_ms and msg.next_fire_ms:
            spec = replace(spec, schedule=replace(s, start_at_ms=msg.next_fire_ms))
        out.append(job_from(spec, msg, created=created, codec=submits.codec))
    return out


# The JobSpec field each keyword of ``Client.update`` changes.
_UPDATE_FIELDS = {
    "name": "name",
    "handler": "handler",
    "payload": "payload",
    "http": "http",
    **dict.fromkeys(
        ("cron", "every", "at", "tz", "dst_gap", "dst_fold", "start", "fixed_delay"), "schedule"
    ),
    "catch_up": "catch_up",
    "overlap": "overlap",
    "retry": "retry",
    "jitter": "jitter_ms",
    "timeout": "timeout_ms",
    "at_most_once": "side_effect",
    "pool": "pool",
    "priority": "priority",
    "skip_calendars": "skip_calendars",
    "active_from": "active_from_ms",
    "active_until": "active_until_ms",
    "max_fires": "max_fires",
    "concurrency_key": "concurrency_key",
}


def update_request(
    job_id: int, idempotency_key: str | None, changes: UpdateArgs, codec: PayloadCodec | None = None
) -> js.UpdateJobRequest:
    """The request for ``Client.update``: the fields named, checked here as
    a submit's are (naming the keyword), under a key of its own unless one
    is given, so that a retry elsewhere is the same update."""
    if not changes:
        raise InvalidArgument("changes", "give at least one field to change")
    for key in changes:
        if key not in _UPDATE_FIELDS:
            raise InvalidArgument(str(key), "is not a field of a job to update")
    named = sorted({_UPDATE_FIELDS[k] for k in changes})
    args: dict[str, Any] = {"name": "-", "handler": "-", **changes}
    if args.get("http") is not None and "handler" not in changes:
        args["handler"] = ""  # a target implies its handler
    if "schedule" not in named:
        args["every"] = timedelta(minutes=1)  # stands in for the schedule kept
    spec = request_spec(encoded(JobRequest(**args), codec), now_ms=time.time_ns() // 1_000_000)
    return build(
        js.UpdateJobRequest,
        job_id=job_id,
        spec=convert.spec_to_proto(spec),
        fields=named,
        idempotency_key=idempotency_key or generated_key(),
    )


def job_update_of(msg: js.JobUpdate) -> JobUpdate:
    def job(spec: jobs_pb2.JobSpec) -> Job:
        return job_of(jobs_pb2.Job(job_id=msg.job_id, spec=spec, state=jobs_pb2.JOB_STATE_ACTIVE))

    return JobUpdate(
        job_id=msg.job_id,
        version=msg.version,
        updated_at=utc(msg.updated_at_ms),
        updated_by=msg.updated_by,
        before=job(msg.old_spec),
        after=job(msg.new_spec),
        payload_changed=msg.payload_changed,
        idempotency_key=msg.idempotency_key,
    )


def update_pages(job_id: int, page_size: int) -> Pages[JobUpdate]:
    return Pages(
        request=lambda token: build(
            js.ListJobUpdatesRequest, job_id=job_id, page_size=page_size, page_token=token
        ),
        items=lambda resp: [job_update_of(u) for u in resp.updates],
    )


def preview_request(
    job_id: int | None,
    schedule: Mapping[str, Any],
    start_from: When | None,
    count: int,
    skip_calendars: Sequence[str] = (),
) -> js.PreviewScheduleRequest:
    """``Client.preview``'s request: a job's schedule, or one given by the
    schedule keywords of a submit (``cron=``, ``tz=``, ``every=``...), with
    its bounds (``active_from=``, ``active_until=``, ``max_fires=``)."""
    from_ms = 0 if start_from is None else time_ms(start_from, "start_from")
    if job_id is not None:
        if schedule:
            raise InvalidArgument("job_id", "give a job or a schedule, not both")
        if skip_calendars:
            raise InvalidArgument("skip_calendars", "a job's preview skips its own calendars")
        return build(js.PreviewScheduleRequest, job_id=job_id, from_ms=from_ms, count=count)
    spec = job_spec(
        JobRequest(name="-", handler="-", **schedule), now_ms=time.time_ns() // 1_000_000
    )
    msg = convert.spec_to_proto(spec)
    if spec.bounded or spec.active_from_ms:
        bounds = jobs_pb2.JobSpec(
            schedule=msg.schedule,
            active_from_ms=spec.active_from_ms,
            active_until_ms=spec.active_until_ms,
            max_fires=spec.max_fires,
        )
        return build(
            js.PreviewScheduleRequest,
            spec=bounds,
            from_ms=from_ms,
            count=count,
            skip_calendars=list(skip_calendars),
        )
    return build(
        js.PreviewScheduleRequest,
        schedule=msg.schedule,
        from_ms=from_ms,
        count=count,
        skip_calendars=list(skip_calendars),
    )


def dead_letter_pages(job_id: int | None, page_size: int) -> Pages[Run]:
    return Pages(
        request=lambda token: build(
            js.ListDeadLettersRequest, job_id=job_id or 0, page_size=page_size, page_token=token
        ),
        items=lambda resp: [run_of(r) for r in resp.runs],
    )


def redrive_request(
    job_id: int, run_id: int | None, page_token: str = ""
) -> js.RedriveDeadLettersRequest:
    """One call of ``Client.redrive``: ``page_token``, the previous answer's
    ``next_page_token``, for the older dead letters a node's bound left."""
    return build(
        js.RedriveDeadLettersRequest, job_id=job_id, run_id=run_id or 0, page_token=page_token
    )


_M = TypeVar("_M")
# The integer fields' wire ranges, by protobuf field type.
_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
}


def build(cls: Callable[..., _M], **fields: Any) -> _M:
    """``cls(**fields)``, a request message; an integer its field's wire type
    cannot carry (a job id past int64, a limit past int32) is refused naming
    the field, where protobuf raises a bare ValueError."""
    try:
        return cls(**fields)
    except ValueError:
        by_name = cls.DESCRIPTOR.fields_by_name  # type: ignore[attr-defined]
        for name, value in fields.items():
            fd = by_name.get(name)
            if fd is None or not isinstance(value, int) or isinstance(value, bool):
                continue
            low, high = _RANGES.get(fd.type, (value, value))
            if not low <= value <= high:
                raise InvalidArgument(name, f"{value} is outside [{low}, {high}]") from None
        raise


def job_ref(job_id: int) -> js.JobRef:
    return build(js.JobRef, job_id=job_id)


def run_ref(run_id: int) -> js.GetRunRequest:
    return build(js.GetRunRequest, run_id=run_id)


def get_request(job_id: int, next_fires: int, recent_runs: int) -> js.GetJobRequest:
    return build(js.GetJobRequest, job_id=job_id, next_fires=next_fires, recent_runs=recent_runs)


def backfill_request(job_id: int, start: When, end: When) -> js.BackfillJobRequest:
    return build(
        js.BackfillJobRequest,
        job_id=job_id,
        from_ms=time_ms(start, "start"),
        to_ms=time_ms(end, "end"),
    )


def status_request(include_shards: bool) -> admin.GetClusterStatusRequest:
    return admin.GetClusterStatusRequest(include_shards=include_shards)


def membership_request() -> admin.GetMembershipRequest:
    return admin.GetMembershipRequest()


def alerts_request(since: When | None, limit: int) -> admin.ListAlertsRequest:
    if limit < 0:
        raise InvalidArgument("limit", f"{limit} is negative")
    since_ms = 0 if since is None else max(0, time_ms(since, "since"))
    return build(admin.ListAlertsRequest, since_ms=since_ms, limit=limit)


def _alert_kind(value: str) -> AlertKind | str:
    """A kind this client knows, or the word of one a newer node added."""
    try:
        return AlertKind(value)
    except ValueError:
        return value


def alerts_of(msg: admin.ListAlertsResponse) -> Alerts:
    return Alerts(
        alerts=[
            Alert(
                at=utc(a.at_ms),
                kind=_alert_kind(a.kind),
                message=a.message,
                node_id=a.node_id,
                job_id=a.job_id or None,
                run_id=a.run_id or None,
                fence=a.fence or None,
                worker_id=a.worker_id or None,
            )
            for a in msg.alerts
        ],
        firing=[_alert_kind(k) for k in msg.firing],
    )


def job_pages(
    tenant: str | None, state: JobState | str | None, page_size: int, name_prefix: str = ""
) -> Pages[Job]:
    wire_state = (
        jobs_pb2.JOB_STATE_UNSPECIFIED
        if state is None
        else convert.job_state_to_proto(model.JobState(choice(JobState, state, "state")))
    )
    return Pages(
        request=lambda token: build(
            js.ListJobsRequest,
            tenant=tenant or "",
            state=wire_state,
            page_size=page_size,
            page_token=token,
            name_prefix=name_prefix,
        ),
        items=lambda resp: [job_of(j) for j in resp.jobs],
    )


def run_pages(job_id: int, states: Iterable[RunState | str], page_size: int) -> Pages[Run]:
    if isinstance(states, str):  # one state, not its letters
        states = (states,)
    wanted = [run_state_to_proto(choice(RunState, s, "states")) for s in states]
    return Pages(
        request=lambda token: build(
            js.ListRunsRequest, job_id=job_id, page_size=page_size, page_token=token, states=wanted
        ),
        items=lambda resp: [run_of(r) for r in resp.runs],
    )


# -- responses --------------------------------------------------------------------


def job_of(msg: jobs_pb2.Job, *, created: bool = False, codec: PayloadCodec | None = None) -> Job:
    """A ``Job`` from its message; ``created`` comes from a submit's answer."""
    return job_from(convert.spec_from_proto(msg.spec, now_ms=0), msg, created=created, codec=codec)


def job_from(
    spec: JobSpec, msg: jobs_pb2.Job, *, created: bool = False, codec: PayloadCodec | None = None
) -> Job:
    """A ``Job`` from its spec and the rest of its message; ``codec``: its
    payload decoded (left as it is where the codec cannot open it)."""
    state = convert.job_state_from_proto(msg.state)
    if state is None:
        raise WheelError(f"the node sent job {msg.job_id} without a state")
    return Job(
        job_id=msg.job_id,
        name=spec.name,
        handler=spec.handler,
        tenant=spec.tenant,
        pool=spec.pool,
        concurrency_key=spec.concurrency_key,
        state=JobState(state),
        schedule=schedule_of(spec.schedule),
        payload=opened(spec, codec),
        http=http_of(spec),
        next_fire=utc_or_none(msg.next_fire_ms),
        next_fires=[utc(ms) for ms in msg.next_fires_ms],
        created_at=utc(msg.created_at_ms),
        updated_at=utc(msg.updated_at_ms),
        shard=msg.shard,
        created=created,
        recent_runs=[run_of(r) for r in msg.recent_runs],
        catch_up=catch_up_of(spec.catch_up),
        overlap=overlap_of(spec.overlap),
        retry=retry_of(spec.retry),
        timeout=span(spec.timeout_ms),
        jitter=span(spec.jitter_ms),
        at_most_once=spec.side_effect is SideEffect.AT_MOST_ONCE,
        priority=spec.priority,
        skip_calendars=spec.skip_calendars,
        active_from=utc_or_none(spec.active_from_ms),
        active_until=utc_or_none(spec.active_until_ms),
        max_fires=spec.max_fires,
    )


def run_of(msg: jobs_pb2.Run) -> Run:
    return Run(
        run_id=msg.run_id,
        job_id=msg.job_id,
        scheduled_for=utc(msg.scheduled_for_ms),
        attempt=msg.attempt,
        state=run_state_of(msg.state),
        fence=msg.fence,
        worker_id=msg.worker_id or None,
        dispatched_at=utc_or_none(msg.dispatched_at_ms),
        started_at=utc_or_none(msg.started_at_ms),
        finished_at=utc_or_none(msg.finished_at_ms),
        error=msg.error or None,
        missed_reason=MissedReason(msg.missed_reason) if msg.missed_reason else None,
        idempotency_key=msg.idempotency_key,
        result=parse_result(msg.result_json),
    )


def trigger_of(msg: js.TriggerJobResponse) -> Trigger:
    return Trigger(
        job_id=msg.job_id,
        scheduled_for=utc(msg.scheduled_for_ms),
        idempotency_key=msg.idempotency_key,
    )


def backfill_of(msg: js.BackfillJobResponse) -> Backfill:
    return Backfill(
        scheduled=msg.scheduled,
        skipped_existing=msg.skipped_existing,
        scheduled_for=[utc(ms) for ms in msg.scheduled_for_ms],
    )


def status_of(msg: admin.ClusterStatus) -> Status:
    return Status(
        node_id=msg.node_id,
        nodes=[
            NodeStatus(node_id=n.node_id, address=n.address, shards_owned=n.shards_owned)
            for n in msg.nodes
        ],
        shards=[
            ShardStatus(
                shard=s.shard,
                owner=s.owner,
                epoch=s.epoch,
                jobs=s.jobs,
                in_flight=s.in_flight,
                dispatching_since=utc(s.dispatching_since_ms) if s.dispatching_since_ms else None,
            )
            for s in msg.shards
        ],
        jobs=msg.jobs,
        pending_timers=msg.pending_timers,
        in_flight=msg.in_flight,
        backlog=msg.backlog,
        overdue_backlog=msg.overdue_backlog,
        workers=msg.workers,
        worker_capacity=msg.worker_capacity,
        dispatch_lag_p50=timedelta(milliseconds=msg.dispatch_lag_p50_ms),
        dispatch_lag_p99=timedelta(milliseconds=msg.dispatch_lag_p99_ms),
        dispatched_total=msg.dispatched_total,
        completed_total=msg.completed_total,
        missed_total=msg.missed_total,
        dead_lettered_total=msg.dead_lettered_total,
        reaper_paused=msg.reaper_paused,
        worker_list=[
            WorkerStatus(
                worker_id=w.worker_id,
                capacity=w.capacity,
                held=w.held,
                pools=list(w.pools),
                handlers=list(w.handlers),
                draining=w.draining,
                silent=w.silent,
            )
            for w in msg.worker_list
        ],
        unserved=[
            UnservedHandler(pool=u.pool, handler=u.handler, waiting=u.waiting) for u in msg.unserved
        ],
        alerts_firing=[_alert_kind(k) for k in msg.alerts_firing],
        released=[
            ShardRelease(shard=r.shard, epoch=r.epoch, at=utc(r.at_ms)) for r in msg.released
        ],
    )


def lag_history_of(msg: admin.LagHistory) -> list[LagMinute]:
    return [
        LagMinute(
            minute=utc(m.minute_ms),
            count=m.count,
            p50=timedelta(milliseconds=m.p50_ms),
            p99=timedelta(milliseconds=m.p99_ms),
            max=timedelta(milliseconds=m.max_ms),
        )
        for m in msg.minutes
    ]


def in_flight_of(msg: admin.ListInFlightResponse) -> InFlight:
    return InFlight(
        runs=[
            InFlightRun(
                run_id=r.run_id,
                job_id=r.job_id,
                scheduled_for=utc(r.scheduled_for_ms),
                attempt=r.attempt,
                fence=r.fence,
                worker_id=r.worker_id or None,
                phase=r.phase,
                node_id=r.node_id,
            )
            for r in msg.runs
        ],
        total=msg.total,
        unreachable=list(msg.unreachable),
    )


def membership_of(msg: cluster_pb2.Membership) -> Membership:
    return Membership(
        members=[Member(node_id=m.node_id, address=m.address) for m in msg.members],
        shard_owners=list(msg.shard_owners),
        version=msg.version,
    )


# -- run states: convert's table for executions, plus the missed fires ------------------


def run_state_of(value: int) -> RunState:
    if value == jobs_pb2.RUN_STATE_MISSED:
        return RunState.MISSED
    return RunState(convert.run_state_from_proto(value))


def run_state_to_proto(state: RunState) -> jobs_pb2.RunState:
    if state is RunState.MISSED:
        return jobs_pb2.RUN_STATE_MISSED
    return convert.run_state_to_proto(model.RunState(state))
