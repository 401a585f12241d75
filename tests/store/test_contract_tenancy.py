"""The Store contract for tokens and tenant quotas (schema 6), run against
SQLite, PostgreSQL and the reference model alike (the ``store`` fixture)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.store.conftest import interval_job
from wheel.errors import AlreadyExists, NotFound
from wheel.store._schema import PG_MIGRATIONS, SQLITE_MIGRATIONS
from wheel.store.base import (
    SHARD_COUNT,
    FireClaim,
    JobState,
    Store,
    TenantQuota,
    TokenRecord,
    shard_of,
)
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
        text = " ".join(dict(migrations)[6])
        assert "auth_tokens" in text and "tenant_quotas" in text


def test_a_store_at_schema_5_migrates_keeping_its_jobs(tmp_path: Path) -> None:
    """A job written before profiles (schema 5: no profile, the payload in its
    spec) reads back whole, loads through its spec, and a claim still reads
    its payload."""
    from wheel.store.sqlite import SQLiteStore

    old = SQLiteStore(tmp_path / "old.db")
    old._migrations = [m for m in SQLITE_MIGRATIONS if m[0] <= 5]
    old.migrate()
    assert old.schema_version() == 5
    old.close()
    new = interval_job()
    with sqlite3.connect(tmp_path / "old.db") as db:  # as schema 5's code wrote a job
        db.execute(
            "INSERT INTO jobs (job_id, shard, tenant, name, state, next_run_at, one_shot,"
            " idempotency_key, created_at_ms, updated_at_ms, change_seq)"
            " VALUES (7, ?, 'acme', 'report', 'active', 60000, 0, NULL, 1000, 1000, 1)",
            (shard_of(7),),
        )
        db.execute("INSERT INTO job_specs (job_id, spec) VALUES (7, ?)", (new.spec.to_json(),))
    store = open_store(f"sqlite:///{tmp_path}/old.db")
    try:
        assert store.schema_version() == max(v for v, _ in SQLITE_MIGRATIONS)  # type: ignore[attr-defined]
        job = store.get_job(7)
        assert job.spec == new.spec and job.next_run_at == 60_000
        assert store.list_tokens() == []
        load = store.load_shards(range(SHARD_COUNT), packed=True)
        assert [j.job_id for j in load.jobs] == [7]  # no profile: read from its spec
        assert load.packed is not None and not len(load.packed)
        [out] = store.claim_fires(
            [
                FireClaim(
                    job_id=7,
                    scheduled_for=60_000,
                    attempt=0,
                    fence=1,
                    dispatched_at_ms=60_000,
                    expected_next_run_at=60_000,
                    new_next_run_at=120_000,
                    payload=True,
                )
            ]
        )
        assert out.payload == new.spec.payload and out.advanced
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
