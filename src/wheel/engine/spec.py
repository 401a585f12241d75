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


DEFAULT_LIMITS = Limits()


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
        }
        if self.concurrency_key:
            d["concurrency_key"] = self.concurrency_key
        return d

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
            concurrency_key=d.get("concurrency_key", ""),
        )

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        """The spec of stored JSON; it keeps that text as its own."""
        spec = cls.from_dict(json.loads(text))
        object.__setattr__(spec, "_json", text)
        return spec


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
