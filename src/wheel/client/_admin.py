"""Requests and answers of AdminService's token, tenant-quota,
signing-secret, calendar and limit calls, for ``Client`` (``wheelctl
token``, ``wheelctl tenant``, ``wheelctl secret``, ``wheelctl calendar`` and
``wheelctl limit``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from wheel.client._time import utc, utc_or_none
from wheel.rpc.v1 import admin_service_pb2 as admin


@dataclass(frozen=True, slots=True, kw_only=True)
class Token:
    """A bearer token as a node lists it: never its secret."""

    token_id: str
    # "*": an operator's, acting for every tenant.
    tenant: str
    scopes: tuple[str, ...]
    worker_id: str | None = None
    pools: tuple[str, ...] = ()
    label: str = ""
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantQuota:
    """A tenant's limits; None: no limit."""

    tenant: str
    max_jobs: int | None = None
    submits_per_s: float | None = None
    fires_per_s: float | None = None
    max_in_flight: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditEntry:
    """One administrative change from the audit trail: when, who (``token
    ID`` with auth on, else empty), for which tenant, from which address,
    which call (``action``) on what (``target``, and ``job_id`` where a
    job's), and what it changed (``details``)."""

    entry_id: int
    at: datetime
    actor: str
    tenant: str
    address: str
    action: str
    target: str
    job_id: int | None
    details: dict[str, Any]


def audit_of(msg: admin.AuditEntry) -> AuditEntry:
    return AuditEntry(
        entry_id=msg.entry_id,
        at=utc(msg.at_ms),
        actor=msg.actor,
        tenant=msg.tenant,
        address=msg.address,
        action=msg.action,
        target=msg.target,
        job_id=msg.job_id or None,
        details=json.loads(msg.details_json or "{}"),
    )


def audit_request(
    since_ms: int, job_id: int | None, tenant: str, page_size: int, page_token: str
) -> admin.ListAuditRequest:
    return admin.ListAuditRequest(
        since_ms=since_ms,
        job_id=job_id or 0,
        tenant=tenant,
        page_size=page_size,
        page_token=page_token,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Secret:
    """One version of a signing secret as a node lists it: never its value.
    ``retires_at``: None while it is the newest version; else when it stops
    signing. ``key_id``: the secrets key it is sealed under (its id)."""

    tenant: str
    name: str
    version: int
    created_at: datetime
    retires_at: datetime | None = None
    key_id: str = ""


def secret_of(msg: admin.SecretInfo) -> Secret:
    return Secret(
        tenant=msg.tenant,
        name=msg.name,
        version=msg.version,
        created_at=utc(msg.created_at_ms),
        retires_at=utc_or_none(msg.retires_at_ms),
        key_id=msg.key_id,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Calendar:
    """Days that jobs naming the calendar (``skip_calendars``) do not fire
    on: dates and inclusive ranges (each ``YYYY-MM-DD``, a job's local date)
    and weekdays (``mon`` .. ``sun``). ``version`` counts its changes."""

    tenant: str
    name: str
    dates: tuple[str, ...] = ()
    ranges: tuple[tuple[str, str], ...] = ()
    weekdays: tuple[str, ...] = ()
    version: int = 0
    updated_at: datetime | None = None


def calendar_of(msg: admin.Calendar) -> Calendar:
    return Calendar(
        tenant=msg.tenant,
        name=msg.name,
        dates=tuple(msg.dates),
        ranges=tuple((r.from_date, r.to_date) for r in msg.ranges),
        weekdays=tuple(msg.weekdays),
        version=msg.version,
        updated_at=utc_or_none(msg.updated_ms),
    )


def _day(value: date | str) -> str:
    return value.isoformat() if isinstance(value, date) else str(value)


def set_calendar_request(
    name: str,
    tenant: str,
    dates: Iterable[date | str],
    ranges: Iterable[tuple[date | str, date | str]],
    weekdays: Iterable[str],
) -> admin.SetCalendarRequest:
    return admin.SetCalendarRequest(
        calendar=admin.Calendar(
            tenant=tenant,
            name=name,
            dates=[_day(d) for d in dates],
            ranges=[admin.DateRange(from_date=_day(a), to_date=_day(b)) for a, b in ranges],
            weekdays=list(weekdays),
        )
    )


def _value(value: bytes | str | None) -> bytes:
    if value is None:
        return b""
    return value.encode() if isinstance(value, str) else bytes(value)


def set_secret_request(
    name: str, tenant: str, value: bytes | str | None, generate: bool
) -> admin.SetSecretRequest:
    return admin.SetSecretRequest(tenant=tenant, name=name, generate=generate, value=_value(value))


def rotate_secret_request(
    name: str,
    tenant: str,
    value: bytes | str | None,
    generate: bool | None,
    overlap: timedelta | None,
) -> admin.RotateSecretRequest:
    return admin.RotateSecretRequest(
        tenant=tenant,
        name=name,
        # A rotation without a value makes one.
        generate=value is None if generate is None else generate,
        value=_value(value),
        overlap_ms=0 if overlap is None else round(overlap.total_seconds() * 1000),
    )


def create_token_request(
    *,
    tenant: str,
    scopes: list[str],
    ttl: timedelta | None,
    worker_id: str,
    pools: list[str],
    label: str,
) -> admin.CreateTokenRequest:
    return admin.CreateTokenRequest(
        tenant=tenant,
        scopes=scopes,
        ttl_ms=0 if ttl is None else round(ttl.total_seconds() * 1000),
        worker_id=worker_id,
        pools=pools,
        label=label,
    )


def token_of(msg: admin.TokenInfo) -> Token:
    return Token(
        token_id=msg.token_id,
        tenant=msg.tenant,
        scopes=tuple(msg.scopes),
        worker_id=msg.worker_id or None,
        pools=tuple(msg.pools),
        label=msg.label,
        created_at=utc(msg.created_at_ms),
        expires_at=utc_or_none(msg.expires_at_ms),
        revoked_at=utc_or_none(msg.revoked_at_ms),
    )


def quota_request(q: TenantQuota) -> admin.TenantQuota:
    out = admin.TenantQuota(tenant=q.tenant)
    if q.max_jobs is not None:
        out.max_jobs = q.max_jobs
    if q.submits_per_s is not None:
        out.submits_per_s = q.submits_per_s
    if q.fires_per_s is not None:
        out.fires_per_s = q.fires_per_s
    if q.max_in_flight is not None:
        out.max_in_flight = q.max_in_flight
    return out


def quota_of(msg: admin.TenantQuota) -> TenantQuota:
    return TenantQuota(
        tenant=msg.tenant,
        max_jobs=msg.max_jobs if msg.HasField("max_jobs") else None,
        submits_per_s=msg.submits_per_s if msg.HasField("submits_per_s") else None,
        fires_per_s=msg.fires_per_s if msg.HasField("fires_per_s") else None,
        max_in_flight=msg.max_in_flight if msg.HasField("max_in_flight") else None,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Limit:
    """A concurrency key's limits as a node lists them: at most
    ``max_concurrent`` runs of its jobs in flight across the cluster (None:
    no such limit) and at most ``rate`` starts per ``per`` with ``burst`` at
    once (``rate`` None: no rate limit). ``in_flight``: its runs dispatched
    or running now, cluster-wide; ``waiting``: fires waiting for a permit on
    every member that answered."""

    tenant: str
    key: str
    max_concurrent: int | None = None
    rate: int | None = None
    per: timedelta = timedelta(seconds=1)
    burst: int | None = None
    in_flight: int = 0
    waiting: int = 0


def limit_of(msg: admin.LimitInfo) -> Limit:
    return Limit(
        tenant=msg.tenant,
        key=msg.key,
        max_concurrent=msg.max_concurrent or None,
        rate=msg.rate or None,
        per=timedelta(milliseconds=msg.rate_period_ms or 1000),
        burst=msg.burst or None,
        in_flight=msg.in_flight,
        waiting=msg.waiting,
    )


def set_limit_request(
    key: str,
    tenant: str,
    max_concurrent: int | None,
    rate: int | None,
    per: timedelta,
    burst: int | None,
) -> admin.SetLimitRequest:
    return admin.SetLimitRequest(
        tenant=tenant,
        key=key,
        max_concurrent=max_concurrent or 0,
        rate=rate or 0,
        rate_period_ms=round(per.total_seconds() * 1000),
        burst=burst or 0,
    )
