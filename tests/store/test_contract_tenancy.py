"""The Store contract for tokens and tenant quotas (schema 6), run against
SQLite, PostgreSQL and the reference model alike (the ``store`` fixture)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.store.conftest import interval_job
from wheel.errors import AlreadyExists, NotFound
from wheel.store._schema import PG_MIGRATIONS, SQLITE_MIGRATIONS
from wheel.store.base import JobState, Store, TenantQuota, TokenRecord
from wheel.store.open import open_store


def token(token_id: str = "t1", **changes: object) -> TokenRecord:
    fields: dict[str, object] = {
        "token_id": token_id,
        "secret_hash": "ab" * 32,
        "tenant": "acme",
        "scopes": ("jobs:read", "jobs:write"),
        "created_at_ms": 1_000,
    }
    fields.update(changes)
    return TokenRecord(**fields)  # type: ignore[arg-type]


def test_schema_6_adds_tokens_and_quotas_on_both_backends() -> None:
    for migrations in (SQLITE_MIGRATIONS, PG_MIGRATIONS):
        version, statements = migrations[-1]
        assert version == 6
        text = " ".join(statements)
        assert "auth_tokens" in text and "tenant_quotas" in text


def test_a_store_at_schema_5_migrates_to_6_keeping_its_jobs(tmp_path: Path) -> None:
    from wheel.store.sqlite import SQLiteStore

    old = SQLiteStore(tmp_path / "old.db")
    old._migrations = SQLITE_MIGRATIONS[:-1]
    old.migrate()
    assert old.schema_version() == 5
    job, _ = old.submit_job(interval_job())
    old.close()
    store = open_store(f"sqlite:///{tmp_path}/old.db")
    try:
        assert store.schema_version() == 6  # type: ignore[attr-defined]
        assert store.get_job(job.job_id) == job
        assert store.list_tokens() == []
    finally:
        store.close()


def test_a_token_round_trips_with_every_field(store: Store) -> None:
    worker = token(
        "w1",
        tenant="*",
        scopes=("worker",),
        worker_id="worker-7",
        pools=("default", "gpu"),
        label="fleet",
        expires_at_ms=9_000,
    )
    store.create_token(worker)
    store.create_token(token("t2", created_at_ms=2_000))
    assert store.get_token("w1") == worker
    assert [t.token_id for t in store.list_tokens()] == ["w1", "t2"]


def test_creating_a_token_twice_with_other_fields_is_already_exists(store: Store) -> None:
    store.create_token(token())
    store.create_token(token())  # the same row again (a retry): no error
    with pytest.raises(AlreadyExists):
        store.create_token(token(tenant="other"))
    assert store.get_token("t1").tenant == "acme"


def test_unknown_token_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        store.get_token("nope")
    with pytest.raises(NotFound):
        store.revoke_token("nope", 5_000)


def test_revoking_keeps_the_first_revocation_time(store: Store) -> None:
    store.create_token(token())
    assert store.revoke_token("t1", 5_000).revoked_at_ms == 5_000
    assert store.revoke_token("t1", 7_000).revoked_at_ms == 5_000
    assert store.get_token("t1").revoked_at_ms == 5_000


def test_tenant_quotas_are_replaced_whole(store: Store) -> None:
    assert store.list_tenant_quotas() == []
    first = TenantQuota(
        tenant="acme",
        max_jobs=10,
        submits_per_s=2.5,
        fires_per_s=4.0,
        max_in_flight=3,
        updated_at_ms=1,
    )
    assert store.set_tenant_quota(first) == first
    store.set_tenant_quota(TenantQuota(tenant="beta", max_jobs=1, updated_at_ms=1))
    second = TenantQuota(tenant="acme", fires_per_s=1.0, updated_at_ms=2)
    assert store.set_tenant_quota(second) == second
    assert store.list_tenant_quotas() == [
        second,
        TenantQuota(tenant="beta", max_jobs=1, updated_at_ms=1),
    ]


def test_count_jobs_counts_a_tenants_active_and_paused_jobs(store: Store) -> None:
    a = [store.submit_job(interval_job(f"a{i}", tenant="acme"))[0] for i in range(3)]
    store.submit_job(interval_job("b", tenant="beta"))
    store.set_job_state(a[1].job_id, JobState.PAUSED, next_run_at=None, now_ms=2_000)
    store.set_job_state(a[2].job_id, JobState.CANCELLED, next_run_at=None, now_ms=2_000)
    assert store.count_jobs("acme") == 2
    assert store.count_jobs("beta") == 1
    assert store.count_jobs("nobody") == 0
