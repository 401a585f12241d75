"""The client's values: what ``Client`` and ``AsyncClient`` take and return.

Frozen dataclasses and string enums owned by ``wheel.client``, so that code
using the SDK never depends on the engine's types or on protobuf messages.
Times are aware UTC ``datetime`` values, durations are ``timedelta`` values.
The enums' values are the scheduler's own words, as ``wheelctl`` prints them.

The policy values (``CatchUp``, ``Overlap``, ``Retry``) are also what users
pass in; their constructors take durations as ``timedelta`` or seconds and
keep ``timedelta``, and refuse at once what the wire could not carry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Generic, TypeVar

from wheel.client._time import Duration, duration
from wheel.engine import spec as _engine
from wheel.engine.model import shard_of
from wheel.errors import InvalidArgument
from wheel.runresult import summary

__all__ = [
    "At",
    "Backfill",
    "CatchUp",
    "CatchUpMode",
    "Cron",
    "DstFold",
    "DstGap",
    "Every",
    "HttpTarget",
    "Job",
    "JobState",
    "JobUpdate",
    "Member",
    "Membership",
    "MissedReason",
    "NodeStatus",
    "Overlap",
    "OverlapPolicy",
    "Retry",
    "Run",
    "RunState",
    "Schedule",
    "ShardRelease",
    "ShardStatus",
    "Status",
    "Trigger",
    "UnservedHandler",
    "WorkerStatus",
]

_E = TypeVar("_E", bound=StrEnum)


# -- words ------------------------------------------------------------------------


class JobState(StrEnum):
    """A job's state. A one-shot whose fire was claimed schedules nothing
    more, and its state says how the fire ended: ``RUNNING`` while a run or
    a retry of it is owed, then ``COMPLETED`` (it succeeded) or ``FAILED``
    (dead-lettered, or an at_most_once run's outcome unknown; a redrive
    that succeeds makes it ``COMPLETED``)."""

    ACTIVE = "active"
    PAUSED = "paused"
    CANCELLED = "cancelled"
    # A one-shot whose fire succeeded.
    COMPLETED = "completed"
    # A one-shot whose fire was claimed and has not ended for good yet.
    RUNNING = "running"
    # A one-shot whose fire was dead-lettered (or ended unknown).
    FAILED = "failed"


class RunState(StrEnum):
    """The state of one execution (one attempt of one fire), or ``MISSED`` for
    a fire the job's policy did not run (see ``Run.missed_reason``)."""

    DISPATCHED = "dispatched"  # handed to a worker; grace lease
    RUNNING = "running"  # acked by the worker; full lease
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # this attempt failed; a retry may follow as attempt + 1
    TIMED_OUT = "timed_out"
    LOST = "lost"  # the lease lapsed; a new attempt re-dispatches the fire
    DEAD_LETTERED = "dead_lettered"  # failed on its last attempt
    UNKNOWN = "unknown"  # an at_most_once run whose lease was lost
    CANCELLED = "cancelled"  # the job was cancelled while this run was in flight
    MISSED = "missed"  # not an execution: a fire that did not run


class MissedReason(StrEnum):
    OUTSIDE_WINDOW = "outside_window"  # later than the catch-up window allows
    OVER_CAP = "over_cap"  # run_all past max_count: collapsed to the latest
    SKIPPED = "skipped"  # catch-up mode skip
    COLLAPSED = "collapsed"  # run_latest_only ran a later fire instead
    PAUSED = "paused"  # came due while the job was paused
    OVERLAP = "overlap"  # came due while a previous run was still going
    DST_GAP = "dst_gap"  # the wall time did not exist and the policy skips it
    CANCELLED = "cancelled"  # queued or buffered when the job was cancelled
    CALENDAR = "calendar"  # on a day of a calendar the job skips


class AlertKind(StrEnum):
    """What an alert is about. The first four are conditions a node reports
    as firing while they hold (``Alerts.firing``); the others are events."""

    REAPER_PAUSED = "reaper_paused"  # re-dispatch of lost runs paused: the fleet is busy or empty
    NO_WORKER = "no_worker"  # work waits for a handler no connected worker serves
    STORE_UNREACHABLE = "store_unreachable"
    LAG_SLO = "lag_slo"  # dispatch lag p99 over its objective
    CATCH_UP_CAPPED = "catch_up_capped"  # run_all past its cap collapsed to the latest
    DEAD_LETTERED = "dead_lettered"  # a fire failed its last attempt
    OUTCOME_UNKNOWN = "outcome_unknown"  # an at_most_once run lost its lease


class CatchUpMode(StrEnum):
    """Which overdue fires run after downtime."""

    RUN_LATEST_ONLY = "run_latest_only"
    RUN_ALL = "run_all"
    SKIP = "skip"


class OverlapPolicy(StrEnum):
    """What a fire does that comes due while the job's previous run is going."""

    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    BUFFER_ALL = "buffer_all"
    ALLOW = "allow"


class DstGap(StrEnum):
    """What a cron schedule does with a wall time that does not exist."""

    FIRE_AT_TRANSITION = "fire_at_transition"
    SKIP = "skip"


class DstFold(StrEnum):
    """What a cron schedule does with a wall time that happens twice."""

    FIRST = "first"
    BOTH = "both"


def choice(enum: type[_E], value: object, field: str) -> _E:
    """``value`` as a member of ``enum``, or ``InvalidArgument`` listing the members."""
    if isinstance(value, str):
        try:
            return enum(value)
        except ValueError:
            pass
    allowed = ", ".join(m.value for m in enum)
    raise InvalidArgument(field, f"{value!r} is not one of {allowed}")


# These counts are int32 on the wire: a bigger one cannot be sent at all.
_INT32_MAX = 2**31 - 1


def _at_least_one(value: object, field: str) -> int:
    # Zero on the wire means "the default": a zero here would be silently replaced.
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgument(field, f"must be a whole number >= 1, got {value!r}")
    if value > _INT32_MAX:
        raise InvalidArgument(field, f"{value} is over {_INT32_MAX}, the most the wire carries")
    return value


# -- schedules ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Cron:
    """Fires at the times a cron expression names, in an IANA time zone."""

    expr: str
    tz: str
    dst_gap: DstGap
    dst_fold: DstFold


@dataclass(frozen=True, slots=True, kw_only=True)
class Every:
    """Fires every ``period`` from ``start``; with ``fixed_delay`` the next fire
    is a period after the previous run finished instead."""

    period: timedelta
    start: datetime
    fixed_delay: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class At:
    """Fires once."""

    time: datetime


Schedule = Cron | Every | At


# -- policies (given and returned) ---------------------------------------------------

# The engine's defaults, so the client states each of them in one place only.
_CATCH_UP = _engine.CatchUp()
_OVERLAP = _engine.Overlap()
_RETRY = _engine.Retry()


@dataclass(frozen=True, slots=True, init=False)
class CatchUp:
    """Which fires run after downtime: ``mode``; how late a fire may still run,
    ``window`` (None: no limit); and with ``run_all``, past how many overdue
    fires it collapses to the latest, ``max_count``."""

    mode: CatchUpMode
    window: timedelta | None
    max_count: int

    def __init__(
        self,
        *,
        mode: CatchUpMode | str = CatchUpMode.RUN_LATEST_ONLY,
        window: Duration | None = None,
        max_count: int = _CATCH_UP.max_count,
    ) -> None:
        # The wire reads a zero window as "no limit": refuse it rather than widen it.
        kept = None if window is None else duration(window, "catch_up.window", positive=True)
        object.__setattr__(self, "mode", choice(CatchUpMode, mode, "catch_up.mode"))
        object.__setattr__(self, "window", kept)
        object.__setattr__(self, "max_count", _at_least_one(max_count, "catch_up.max_count"))


@dataclass(frozen=True, slots=True, init=False)
class Overlap:
    """What a fire does while the job's previous run is going: ``policy``;
    with ``allow``, at most ``max_concurrent`` runs at once; with
    ``buffer_all``, at most ``max_buffered`` fires waiting."""

    policy: OverlapPolicy
    max_concurrent: int
    max_buffered: int

    def __init__(
        self,
        *,
        policy: OverlapPolicy | str = OverlapPolicy.SKIP,
        max_concurrent: int = _OVERLAP.max_concurrent,
        max_buffered: int = _OVERLAP.max_buffered,
    ) -> None:
        object.__setattr__(self, "policy", choice(OverlapPolicy, policy, "overlap.policy"))
        object.__setattr__(
            self, "max_concurrent", _at_least_one(max_concurrent, "overlap.max_concurrent")
        )
        object.__setattr__(
            self, "max_buffered", _at_least_one(max_buffered, "overlap.max_buffered")
        )


@dataclass(frozen=True, slots=True, init=False)
class Retry:
    """How a failed run is retried: up to ``max_attempts`` attempts in all
    (attempts 1 to ``max_attempts``); then the run is dead-lettered. The wait
    after attempt n fails is its backoff, ``min(max_backoff, initial_backoff *
    multiplier**(n-1))``, plus a jitter of up to a quarter of it: never less
    than the backoff, at most 1.25 times it (``max_backoff`` caps the backoff
    before the jitter)."""

    max_attempts: int
    initial_backoff: timedelta
    max_backoff: timedelta
    multiplier: float

    def __init__(
        self,
        *,
        max_attempts: int = _RETRY.max_attempts,
        initial_backoff: Duration = timedelta(milliseconds=_RETRY.initial_backoff_ms),
        max_backoff: Duration = timedelta(milliseconds=_RETRY.max_backoff_ms),
        multiplier: float = _RETRY.multiplier,
    ) -> None:
        if isinstance(multiplier, bool) or not isinstance(multiplier, int | float):
            raise InvalidArgument("retry.multiplier", f"expected a number, got {multiplier!r}")
        if multiplier <= 0:
            raise InvalidArgument("retry.multiplier", "must be > 0")
        object.__setattr__(self, "max_attempts", _at_least_one(max_attempts, "retry.max_attempts"))
        object.__setattr__(
            self,
            "initial_backoff",
            duration(initial_backoff, "retry.initial_backoff", positive=True),
        )
        object.__setattr__(
            self, "max_backoff", duration(max_backoff, "retry.max_backoff", positive=True)
        )
        object.__setattr__(self, "multiplier", float(multiplier))


@dataclass(frozen=True, slots=True, init=False)
class HttpTarget:
    """An HTTP target: each run of the job is one request to ``url``, made by
    a worker running the built-in executor (``wheelctl worker --http``); the
    job's payload is the request's body. ``headers``: a mapping or (name,
    value) pairs; ``timeout``: a ``timedelta`` or seconds (never longer than
    the job's timeout: the node cuts it to that); ``signing_secret``: the name
    of a secret of the job's tenant that signs every request (Standard
    Webhooks). A 4xx but 408 and 429 fails the run for good unless
    ``retry_4xx``; a 3xx fails it unless ``follow_redirects``. The node checks
    the rest (scheme, host, header names...) and names the field it refuses."""

    url: str
    method: str
    headers: dict[str, str]
    timeout: timedelta
    signing_secret: str | None
    retry_4xx: bool
    follow_redirects: bool

    def __init__(
        self,
        url: str,
        *,
        method: str = "POST",
        headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
        timeout: Duration = timedelta(seconds=30),
        signing_secret: str | None = None,
        retry_4xx: bool = False,
        follow_redirects: bool = False,
    ) -> None:
        for name, value in (("url", url), ("method", method)):
            if not isinstance(value, str):
                raise InvalidArgument(f"http.{name}", f"expected a string, got {value!r}")
        if signing_secret is not None and not isinstance(signing_secret, str):
            raise InvalidArgument(
                "http.signing_secret", f"expected a string, got {signing_secret!r}"
            )
        for name, flag in (("retry_4xx", retry_4xx), ("follow_redirects", follow_redirects)):
            if not isinstance(flag, bool):
                raise InvalidArgument(f"http.{name}", f"expected True or False, got {flag!r}")
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        kept: dict[str, str] = {}
        for pair in pairs:
            if (
                not isinstance(pair, tuple)
                or len(pair) != 2
                or not all(isinstance(p, str) for p in pair)
            ):
                raise InvalidArgument("http.headers", f"expected names and values, got {pair!r}")
            kept[pair[0]] = pair[1]
        object.__setattr__(self, "url", url)
        object.__setattr__(self, "method", method.upper() or "POST")
        object.__setattr__(self, "headers", kept)
        object.__setattr__(self, "timeout", duration(timeout, "http.timeout", positive=True))
        object.__setattr__(self, "signing_secret", signing_secret or None)
        object.__setattr__(self, "retry_4xx", retry_4xx)
        object.__setattr__(self, "follow_redirects", follow_redirects)


# -- what calls return -----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One execution (one attempt of one fire), or a missed fire: ``run_id`` 0,
    state ``missed``, ``missed_reason`` set and ``finished_at`` when the miss
    was recorded. ``idempotency_key`` is the same on every attempt of a fire.
    ``attempt`` counts from 1 (0 for a missed fire, which ran no attempt).
    ``result`` is what the run left, None for none: an HTTP target's
    ``http_status``, ``duration_ms``, ``response_headers`` and
    ``response_excerpt`` (or ``error``), a Python handler's ``value``."""

    run_id: int
    job_id: int
    scheduled_for: datetime
    attempt: int
    state: RunState
    fence: int
    worker_id: str | None
    dispatched_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    missed_reason: MissedReason | None
    idempotency_key: str
    result: dict[str, Any] | None = None

    def result_summary(self, width: int = 40) -> str:
        """The result in a few words for a table: ``http 503 12ms`` for an
        HTTP target, the value (cut to ``width``) for a handler; empty for
        none."""
        return summary(self.result, width)


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A job as the node has it. ``next_fires`` and ``recent_runs`` are filled
    by ``get`` (and the first few fires by submit, cancel, pause and resume);
    ``created`` is True only in the answer to the submit that created it."""

    job_id: int
    name: str
    handler: str
    tenant: str
    pool: str
    state: JobState
    schedule: Schedule
    payload: bytes
    next_fire: datetime | None
    next_fires: list[datetime]
    created_at: datetime
    updated_at: datetime
    shard: int
    created: bool
    recent_runs: list[Run]
    catch_up: CatchUp
    overlap: Overlap
    retry: Retry
    timeout: timedelta
    jitter: timedelta
    at_most_once: bool
    # Its HTTP target (handler "http"; ``payload`` is the request's body).
    http: HttpTarget | None = None
    # 0 (runs first) to 9 (runs last) when its pool's workers are short.
    priority: int = 5
    # Calendars whose days it does not fire on.
    skip_calendars: tuple[str, ...] = ()
    # Bounds of its schedule (None, 0: none): no fire before ``active_from``,
    # none after ``active_until``, at most ``max_fires`` fires.
    active_from: datetime | None = None
    active_until: datetime | None = None
    max_fires: int = 0
    # The concurrency key whose limit its runs count against ("": none).
    concurrency_key: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Trigger:
    """The out-of-band fire ``trigger`` scheduled."""

    job_id: int
    scheduled_for: datetime
    idempotency_key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Backfill:
    """What ``backfill`` scheduled, and how many fires of the range were
    already in the job's history (run or missed) and were left alone."""

    scheduled: int
    skipped_existing: int
    scheduled_for: list[datetime]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeStatus:
    node_id: str
    address: str
    shards_owned: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardStatus:
    """A shard as a node sees it: its ``owner`` in the node's view, and
    the ``epoch`` the node holds it under and since when it dispatches it
    (0 and None: the node does not hold it)."""

    shard: int
    owner: str
    epoch: int
    jobs: int
    in_flight: int
    dispatching_since: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardRelease:
    """A shard a node stopped dispatching: it held it under ``epoch`` until
    ``at``. With its next holder's ``ShardStatus.dispatching_since``, how
    long the shard had no dispatching owner in a move."""

    shard: int
    epoch: int
    at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerStatus:
    """A connected worker: runs it takes at once (``capacity``) and holds now
    (``held``), its pools, and the handlers it registered (empty: any).
    ``draining`` takes no new work; ``silent`` let a lease lapse and gets no
    new work until it speaks again."""

    worker_id: str
    capacity: int
    held: int
    pools: list[str]
    handlers: list[str]
    draining: bool
    silent: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class UnservedHandler:
    """Work waiting because no connected worker of ``pool`` runs ``handler``."""

    pool: str
    handler: str
    waiting: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Status:
    """What a node reports about itself and the cluster. ``shards`` is filled
    only when asked for; ``backlog`` counts fires due but not yet handed to a
    worker, ``overdue_backlog`` the late ones among them."""

    node_id: str
    nodes: list[NodeStatus]
    shards: list[ShardStatus]
    jobs: int
    pending_timers: int
    in_flight: int
    backlog: int
    overdue_backlog: int
    workers: int
    worker_capacity: int
    dispatch_lag_p50: timedelta
    dispatch_lag_p99: timedelta
    dispatched_total: int
    completed_total: int
    missed_total: int
    dead_lettered_total: int
    reaper_paused: bool
    worker_list: list[WorkerStatus]
    unserved: list[UnservedHandler]
    # Alert kinds whose condition holds now (see ``Client.alerts``).
    alerts_firing: list[AlertKind | str]
    # With the shard rows: the shards this node stopped dispatching lately.
    released: list[ShardRelease] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class Alert:
    """An alert a node raised: when, what kind (a plain word for a kind this
    client does not know yet), what happened, and the job and run it is
    about (None when it is not about one)."""

    at: datetime
    kind: AlertKind | str
    message: str
    node_id: str
    job_id: int | None
    run_id: int | None
    fence: int | None
    worker_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Alerts:
    """A node's alerts since a time, oldest first, and the condition kinds
    that hold now."""

    alerts: list[Alert]
    firing: list[AlertKind | str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    """A node of the cluster and the address clients and workers reach it at."""

    node_id: str
    address: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Membership:
    """The cluster as one node sees it: the members, and the node owning each
    of the 256 shards (``shard_owners[shard]``, "" while a shard has none).
    ``version`` grows with every change across the cluster; a single node
    outside a cluster answers 0 and itself owning every shard."""

    members: list[Member]
    shard_owners: list[str]
    version: int

    def owner_of(self, job_id: int) -> Member | None:
        """The member owning ``job_id``'s shard now (None: no owner, or one
        that is not a member any more)."""
        shard = shard_of(job_id)
        owner = self.shard_owners[shard] if shard < len(self.shard_owners) else ""
        return next((m for m in self.members if owner and m.node_id == owner), None)


_Item = TypeVar("_Item")


@dataclass(frozen=True, slots=True, kw_only=True)
class Page(Generic[_Item]):
    """One page of a list call: its items, and the token of the next page
    ("" on the last), to pass back as ``page_token``."""

    items: list[_Item]
    next_page_token: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LagMinute:
    """One minute of a node's dispatch lag: runs handed out, and their lag's
    p50 and p99 (read off the lag histogram's buckets) and max."""

    minute: datetime
    count: int
    p50: timedelta
    p99: timedelta
    max: timedelta


@dataclass(frozen=True, slots=True, kw_only=True)
class InFlightRun:
    """A run a node's owner holds now: claimed, handed out or running.
    ``phase`` is the owner's word for where it is (claiming, ready,
    dispatched, running, ending); ``worker_id`` None until handed out;
    ``node_id`` the member that holds it; ``attempt`` counts from 1."""

    run_id: int
    job_id: int
    scheduled_for: datetime
    attempt: int
    fence: int
    worker_id: str | None
    phase: str
    node_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class InFlight:
    """Some of the runs the cluster's members hold (the lowest run ids), how
    many they hold in all, and the members that did not answer (their runs
    are not counted)."""

    runs: list[InFlightRun]
    total: int
    unreachable: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobUpdate:
    """One recorded update of a job's spec (``Client.job_updates``): its
    version (1 for the first), when and by whom (the caller's tenant and
    token with auth on), and the job before and after (without payloads;
    ``payload_changed`` says whether it changed)."""

    job_id: int
    version: int
    updated_at: datetime
    updated_by: str
    before: Job
    after: Job
    payload_changed: bool
    idempotency_key: str
