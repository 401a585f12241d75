"""The store fixtures: every contract test runs on SQLite, on a real PostgreSQL,
and on the in-memory reference model the simulator uses."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.store.reference import ReferenceStore
from wheel.engine.spec import Interval, JobSpec, Once
from wheel.store.base import NewJob, Store
from wheel.store.open import open_store


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres), "reference"]
)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def app_name() -> str:
    """PostgreSQL application_name of this test's store connections (the kill
    switch of the connection-loss tests targets exactly these)."""
    return f"wheel_store_test_{secrets.token_hex(4)}"


@pytest.fixture
def store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest, app_name: str) -> str:
    if backend == "reference":
        pytest.skip("the reference store lives in this process: no URL opens it again")
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    dsn = str(request.getfixturevalue("pg_dsn"))
    return f"{dsn}&application_name={app_name}&retries=20"


@pytest.fixture
def store(backend: str, request: pytest.FixtureRequest) -> Iterator[Store]:
    if backend == "reference":
        yield ReferenceStore()
        return
    s = open_store(str(request.getfixturevalue("store_url")))
    try:
        yield s
    finally:
        s.close()


def interval_job(
    name: str = "report",
    *,
    tenant: str = "acme",
    period_ms: int = 60_000,
    next_run_at: int | None = 60_000,
    key: str | None = None,
    created_at_ms: int = 1_000,
) -> NewJob:
    return NewJob(
        spec=JobSpec(
            name=name,
            handler="reports.build",
            tenant=tenant,
            payload=b"\x00payload",
            schedule=Interval(period_ms=period_ms),
        ),
        created_at_ms=created_at_ms,
        next_run_at=next_run_at,
        idempotency_key=key,
    )


DAY_MS = 86_400_000


def idle_jobs(count: int, now_ms: int, *, soon: int = 0) -> list[NewJob]:
    """``count`` daily jobs first due two days after ``now_ms``, then
    ``soon`` more due within seconds of it (``soon{i}`` at ``now_ms + i`` s)."""
    later = [
        interval_job(f"idle{i}", period_ms=DAY_MS, next_run_at=now_ms + 2 * DAY_MS + i)
        for i in range(count)
    ]
    return later + [interval_job(f"soon{i}", next_run_at=now_ms + 1_000 * i) for i in range(soon)]


def once_job(at_ms: int = 50_000, *, tenant: str = "acme") -> NewJob:
    return NewJob(
        spec=JobSpec(name="once", handler="h", tenant=tenant, schedule=Once(at_ms=at_ms)),
        created_at_ms=1_000,
        next_run_at=at_ms,
    )
