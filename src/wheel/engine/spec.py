"""Job specifications: what a user submits, as frozen values.

These are the engine's words for a job. The gRPC layer converts protobuf
messages to them, the store persists them as JSON (``to_json``/``from_json``),
and the shard owner compiles their schedules. Times are integer milliseconds
since the Unix epoch; durations are integer milliseconds.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from wheel.errors import InvalidArgument, LimitExceeded


class CatchUpMode(StrEnum):
    RUN_LATEST_ONLY = "run_latest_only"
    RUN_ALL = "run_all"
    SKIP = "skip"


class OverlapPolicy(StrEnum):
    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    BUFFER_ALL = "buffer_all"
    ALLOW = "allow"


class SideEffect(StrEnum):
    IDEMPOTENT = "idempotent"
    AT_MOST_ONCE = "at_most_once"


class IntervalMode(StrEnum):
    FIXED_RATE = "fixed_rate"
    FIXED_DELAY = "fixed_delay"


class DstGap(StrEnum):
    """What a cron schedule does with a wall time that does not exist."""

    FIRE_AT_TRANSITION = "fire_at_transition"
    SKIP = "skip"


class DstFold(StrEnum):
    """What a cron schedule does with a wall time that happens twice."""

    FIRST = "first"
    BOTH = "both"


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class Once:
    at_ms: int

    # Spelled out: a one-shot's schedule is built each time its job wakes
    # (see wheel.engine.records.FireClaim).
    def __init__(self, *, at_ms: int) -> None:
        object.__setattr__(self, "at_ms", at_ms)


@dataclass(frozen=True, slots=True, kw_only=True)
class Cron:
    expr: str
    time_zone: str = "UTC"
    dst_gap: DstGap = DstGap.FIRE_AT_TRANSITION
    dst_fold: DstFold = DstFold.FIRST


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    period_ms: int
    mode: IntervalMode = IntervalMode.FIXED_RATE
    # First fire; fixed_rate fires at start_at_ms + k * period_ms.
    start_at_ms: int = 0


Schedule = Once | Cron | Interval


@dataclass(frozen=True, slots=True, kw_only=True)
class CatchUp:
    mode: CatchUpMode = CatchUpMode.RUN_LATEST_ONLY
    # How late a fire may still run; None means no limit.
    window_ms: int | None = None
    # run_all collapses to the latest fire past this many overdue fires.
    max_count: int = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class Overlap:
    policy: OverlapPolicy = OverlapPolicy.SKIP
    # allow: at most this many concurrent runs of the job.
    max_concurrent: int = 1
    # buffer_all: at most this many fires waiting behind a running one.
    max_buffered: int = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class Retry:
    max_attempts: int = 5
    initial_backoff_ms: int = 1_000
    max_backoff_ms: int = 300_000
    multiplier: float = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Request limits; every message that rejects a value states the limit."""

    max_name_len: int = 200
    max_handler_len: int = 200
    max_tenant_len: int = 100
    max_pool_len: int = 100
    max_concurrency_key_len: int = 100
    max_payload_bytes: int = 256 * 1024
    max_timeout_ms: int = 7 * 24 * 3600 * 1000
    max_attempts: int = 100
    max_jitter_ms: int = 24 * 3600 * 1000
    # A schedule whose first fire is further ahead than this is rejected.
    max_horizon_ms: int = 10 * 366 * 24 * 3600 * 1000
    max_catch_up_count: int = 100_000
    max_backfill_fires: int = 10_000
    max_skip_calendars: int = 16
    max_calendar_name_len: int = 200
    # A bounded schedule's last fire is found by counting its fires.
    max_fires: int = 100_000


DEFAULT_LIMITS = Limits()

# Priorities run from 0 (first) to 9 (last); unset is the middle.
MIN_PRIORITY, MAX_PRIORITY, DEFAULT_PRIORITY = 0, 9, 5


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    name: str
    handler: str
    schedule: Schedule
    tenant: str = "default"
    payload: bytes = b""
    jitter_ms: int = 0
    catch_up: CatchUp = field(default_factory=CatchUp)
    overlap: Overlap = field(default_factory=Overlap)
    retry: Retry = field(default_factory=Retry)
    timeout_ms: int = 300_000
    side_effect: SideEffect = SideEffect.IDEMPOTENT
    pool: str = "default"
    # Dispatch order when workers are short: 0 goes first, 9 last
    # (``wheel.engine.priority``); 5 is the default, so both ways are open.
    priority: int = DEFAULT_PRIORITY
    # Calendars (of the job's tenant) whose days the job does not fire on.
    skip_calendars: tuple[str, ...] = ()
    # Bounds of a recurring schedule (0: none each): no fire before
    # ``active_from_ms``, none after ``active_until_ms``, and at most
    # ``max_fires`` fires owed (run or recorded missed).
    active_from_ms: int = 0
    active_until_ms: int = 0
    max_fires: int = 0
    # The nominal time of the last fire ``max_fires`` leaves the job (0:
    # none, or a fixed-rate interval's that every fire from its start is
    # owed of, whose last fire its start and period say): its
    # ``max_fires``-th fire counted from its first owed one, fixed when the
    # job is stored (``wheel.engine.fires.with_last_fire``). Kept in the
    # store's JSON and the profile, never on the wire: fires of a schedule
    # known ahead are counted once, not per claim.
    last_fire_ms: int = 0
    # The limit the job's runs count against (``wheel.store._limits``); "":
    # none. Written to JSON only when set, so a spec without one keeps the
    # JSON, profile id and digests it always had.
    concurrency_key: str = ""
    # Its JSON once written or read: a spec is serialized for the store, the
    # idempotency digest and the checkpoint, and must not pay for it thrice.
    _json: str | None = field(default=None, init=False, repr=False, compare=False, hash=False)

    @property
    def recurring(self) -> bool:
        return not isinstance(self.schedule, Once)

    @property
    def schedule_ends(self) -> bool:
        """Whether the job's schedule can end, after which the job completes
        when its last fire's run has (the store's ``one_shot`` column): a
        one-shot's, or a bounded recurring one's."""
        return not self.recurring or self.bounded

    def ends_at_ms(self, schedule: Schedule | None = None) -> int:
        """The last instant a fire of ``schedule`` (default: the spec's own;
        a profile's template is given its job's) may have (0: none):
        ``active_until_ms`` or the last fire ``max_fires`` leaves, whichever
        is first."""
        s = self.schedule if schedule is None else schedule
        last = self.last_fire_ms
        if (
            self.max_fires
            and not last
            and isinstance(s, Interval)
            and s.mode is IntervalMode.FIXED_RATE
        ):
            last = self.last_fire_of_grid(s)
        # The smaller of the two that are set (asked at every wake of a job:
        # no list built for it).
        until = self.active_until_ms
        if last > 0 and (until <= 0 or last < until):
            return last
        return until if until > 0 else 0

    def last_fire_of_grid(self, s: Interval) -> int:
        """A fixed-rate interval's ``max_fires``-th fire from its start (or
        its first in the active range), every one of them owed."""
        first = s.start_at_ms
        if first < self.active_from_ms:
            steps = -(-(self.active_from_ms - first) // s.period_ms)
            first += steps * s.period_ms
        return first + (self.max_fires - 1) * s.period_ms

    @property
    def bounded(self) -> bool:
        """Whether bounds may end the schedule (``active_until_ms`` or
        ``max_fires``): the job then completes like a one-shot."""
        return self.active_until_ms > 0 or self.max_fires > 0

    def validate(self, limits: Limits = DEFAULT_LIMITS) -> None:
        """Raise ``InvalidArgument`` naming the first bad field."""
        _text("spec.name", self.name, limits.max_name_len)
        _text("spec.handler", self.handler, limits.max_handler_len)
        _text("spec.tenant", self.tenant, limits.max_tenant_len)
        _text("spec.pool", self.pool, limits.max_pool_len)
        if self.concurrency_key:
            limit_key("spec.concurrency_key", self.concurrency_key, limits)
        if len(self.payload) > limits.max_payload_bytes:
            raise LimitExceeded(
                "spec.payload",
                f"{len(self.payload)} bytes is over the limit of {limits.max_payload_bytes} bytes",
            )
        _bounded("spec.jitter_ms", self.jitter_ms, 0, limits.max_jitter_ms)
        _bounded("spec.timeout_ms", self.timeout_ms, 1, limits.max_timeout_ms)
        _bounded("spec.priority", self.priority, MIN_PRIORITY, MAX_PRIORITY)
        r = self.retry
        _bounded("spec.retry.max_attempts", r.max_attempts, 1, limits.max_attempts)
        _bounded("spec.retry.initial_backoff_ms", r.initial_backoff_ms, 0, limits.max_timeout_ms)
        _bounded(
            "spec.retry.max_backoff_ms",
            r.max_backoff_ms,
            r.initial_backoff_ms,
            limits.max_timeout_ms,
        )
        if not 1.0 <= r.multiplier <= 100.0:
            raise InvalidArgument("spec.retry.multiplier", "must be between 1.0 and 100.0")
        c = self.catch_up
        if c.window_ms is not None:
            _bounded("spec.catch_up.window_ms", c.window_ms, 0, limits.max_horizon_ms)
        _bounded("spec.catch_up.max_count", c.max_count, 1, limits.max_catch_up_count)
        o = self.overlap
        _bounded("spec.overlap.max_concurrent", o.max_concurrent, 1, 10_000)
        _bounded("spec.overlap.max_buffered", o.max_buffered, 1, 100_000)
        _skip_calendars(self.skip_calendars, limits)
        s = self.schedule
        if isinstance(s, Once):
            _bounded("spec.schedule.once.at_ms", s.at_ms, 0, 2**53)
        elif isinstance(s, Interval):
            _bounded("spec.schedule.interval.period_ms", s.period_ms, 1, limits.max_horizon_ms)
            _bounded("spec.schedule.interval.start_at_ms", s.start_at_ms, 0, 2**53)
        elif isinstance(s, Cron):
            if not s.expr.strip():
                raise InvalidArgument("spec.schedule.cron.expr", "must not be empty")
            if len(s.expr) > 200:
                raise LimitExceeded("spec.schedule.cron.expr", "longer than 200 characters")
        else:  # pragma: no cover - the type admits nothing else
            raise InvalidArgument("spec.schedule", "one of once, cron or interval is required")
        self._validate_bounds(limits)

    def _validate_bounds(self, limits: Limits) -> None:
        for name, value, high in (
            ("spec.active_from_ms", self.active_from_ms, 2**53),
            ("spec.active_until_ms", self.active_until_ms, 2**53),
            ("spec.max_fires", self.max_fires, limits.max_fires),
        ):
            _bounded(name, value, 0, high)
            if value and not self.recurring:
                raise InvalidArgument(name, "applies to recurring schedules only, not once")
        both = self.active_from_ms > 0 and self.active_until_ms > 0
        if both and self.active_until_ms <= self.active_from_ms:
            raise InvalidArgument(
                "spec.active_until_ms",
                f"{self.active_until_ms} must be after spec.active_from_ms {self.active_from_ms}",
            )
        s = self.schedule
        if self.max_fires and isinstance(s, Interval) and s.mode is IntervalMode.FIXED_DELAY:
            # Its fires are not known ahead (each counts from a completion).
            raise InvalidArgument(
                "spec.max_fires",
                "does not apply to fixed_delay intervals; bound one with spec.active_until_ms",
            )

    # -- JSON, as the store keeps it ------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        s = self.schedule
        sched: dict[str, Any]
        if isinstance(s, Once):
            sched = {"type": "once", "at_ms": s.at_ms}
        elif isinstance(s, Cron):
            sched = {
                "type": "cron",
                "expr": s.expr,
                "time_zone": s.time_zone,
                "dst_gap": s.dst_gap.value,
                "dst_fold": s.dst_fold.value,
            }
        else:
            sched = {
                "type": "interval",
                "period_ms": s.period_ms,
                "mode": s.mode.value,
                "start_at_ms": s.start_at_ms,
            }
        d: dict[str, Any] = {
            "name": self.name,
            "handler": self.handler,
            "tenant": self.tenant,
            "payload": base64.b64encode(self.payload).decode("ascii"),
            "schedule": sched,
            "jitter_ms": self.jitter_ms,
            "catch_up": {
                "mode": self.catch_up.mode.value,
                "window_ms": self.catch_up.window_ms,
                "max_count": self.catch_up.max_count,
            },
            "overlap": {
                "policy": self.overlap.policy.value,
                "max_concurrent": self.overlap.max_concurrent,
                "max_buffered": self.overlap.max_buffered,
            },
            "retry": {
                "max_attempts": self.retry.max_attempts,
                "initial_backoff_ms": self.retry.initial_backoff_ms,
                "max_backoff_ms": self.retry.max_backoff_ms,
                "multiplier": self.retry.multiplier,
            },
            "timeout_ms": self.timeout_ms,
            "side_effect": self.side_effect.value,
            "pool": self.pool,
            # Only where set: the JSON (and with it the profile ids and
            # idempotency digests) of unbounded jobs stays as it was.
            **{k: v for k, v in self._bounds() if v},
        }
        if self.priority != DEFAULT_PRIORITY:
            # Only when set: a job of the default priority keeps the JSON (and
            # the profile id and idempotency digest) it had before priorities.
            d["priority"] = self.priority
        if self.skip_calendars:
            # Only when set: the JSON (and so the profile ids and idempotency
            # digests) of jobs without calendars stays what it was.
            d["skip_calendars"] = list(self.skip_calendars)
        if self.concurrency_key:
            d["concurrency_key"] = self.concurrency_key
        return d

    def _bounds(self) -> tuple[tuple[str, int], ...]:
        return (
            ("active_from_ms", self.active_from_ms),
            ("active_until_ms", self.active_until_ms),
            ("max_fires", self.max_fires),
            ("last_fire_ms", self.last_fire_ms),
        )

    def to_json(self) -> str:
        text = self._json
        if text is None:
            text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
            object.__setattr__(self, "_json", text)
        return text

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobSpec:
        s = d["schedule"]
        schedule: Schedule
        if s["type"] == "once":
            schedule = Once(at_ms=int(s["at_ms"]))
        elif s["type"] == "cron":
            schedule = Cron(
                expr=s["expr"],
                time_zone=s["time_zone"],
                dst_gap=DstGap(s["dst_gap"]),
                dst_fold=DstFold(s["dst_fold"]),
            )
        else:
            schedule = Interval(
                period_ms=int(s["period_ms"]),
                mode=IntervalMode(s["mode"]),
                start_at_ms=int(s["start_at_ms"]),
            )
        c, o, r = d["catch_up"], d["overlap"], d["retry"]
        return cls(
            name=d["name"],
            handler=d["handler"],
            tenant=d["tenant"],
            payload=base64.b64decode(d["payload"]),
            schedule=schedule,
            jitter_ms=int(d["jitter_ms"]),
            catch_up=CatchUp(
                mode=CatchUpMode(c["mode"]), window_ms=c["window_ms"], max_count=c["max_count"]
            ),
            overlap=Overlap(
                policy=OverlapPolicy(o["policy"]),
                max_concurrent=o["max_concurrent"],
                max_buffered=o["max_buffered"],
            ),
            retry=Retry(
                max_attempts=r["max_attempts"],
                initial_backoff_ms=r["initial_backoff_ms"],
                max_backoff_ms=r["max_backoff_ms"],
                multiplier=float(r["multiplier"]),
            ),
            timeout_ms=int(d["timeout_ms"]),
            side_effect=SideEffect(d["side_effect"]),
            pool=d["pool"],
            priority=int(d.get("priority", DEFAULT_PRIORITY)),
            skip_calendars=tuple(d.get("skip_calendars", ())),
            active_from_ms=int(d.get("active_from_ms", 0)),
            active_until_ms=int(d.get("active_until_ms", 0)),
            max_fires=int(d.get("max_fires", 0)),
            last_fire_ms=int(d.get("last_fire_ms", 0)),
            concurrency_key=d.get("concurrency_key", ""),
        )

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        """The spec of stored JSON; it keeps that text as its own."""
        spec = cls.from_dict(json.loads(text))
        object.__setattr__(spec, "_json", text)
        return spec


def _skip_calendars(names: tuple[str, ...], limits: Limits) -> None:
    if len(names) > limits.max_skip_calendars:
        raise LimitExceeded(
            "spec.skip_calendars",
            f"{len(names)} calendars is over the limit of {limits.max_skip_calendars}",
        )
    seen: set[str] = set()
    for i, name in enumerate(names):
        field_name = f"spec.skip_calendars[{i}]"
        _text(field_name, name, limits.max_calendar_name_len)
        if name in seen:
            raise InvalidArgument(field_name, f"{name!r} is named twice")
        seen.add(name)


def limit_key(name: str, value: str, limits: Limits = DEFAULT_LIMITS) -> None:
    """A concurrency key's text rules (a pool name's, and no whitespace:
    the CLI and the console show keys bare)."""
    _text(name, value, limits.max_concurrency_key_len)
    if any(ch.isspace() for ch in value):
        raise InvalidArgument(name, "must not contain whitespace")


def _text(name: str, value: str, limit: int) -> None:
    if not value:
        raise InvalidArgument(name, "must not be empty")
    if len(value) > limit:
        raise LimitExceeded(name, f"{len(value)} characters is over the limit of {limit}")
    no_nul(name, value)


def no_nul(name: str, value: str) -> None:
    """PostgreSQL's text holds no NUL character (SQLite's does): refused here,
    a NUL failed the store's whole batch, the other submits in it too."""
    if "\0" in value:
        raise InvalidArgument(name, "must not contain a NUL character")


def _bounded(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise InvalidArgument(name, f"{value} is outside [{low}, {high}]")
