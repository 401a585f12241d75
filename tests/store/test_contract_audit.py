"""The audit trail's store calls, on SQLite, PostgreSQL and the reference
model alike: appended entries read back newest first, filtered by time, job
and tenant, paged by id, and purged by age."""

from __future__ import annotations

import json

from wheel.store.base import AuditEntry, Store


def entry(at_ms: int, action: str, *, job_id: int | None = None, tenant: str = "t1") -> AuditEntry:
    return AuditEntry(
        at_ms=at_ms,
        actor="token t_1",
        tenant=tenant,
        address="ipv4:127.0.0.1:5000",
        action=action,
        target=f"job {job_id}" if job_id else "token t_2",
        details=json.dumps({"n": at_ms}),
        job_id=job_id,
    )


def test_entries_read_back_newest_first_with_their_fields(store: Store) -> None:
    store.record_audit([entry(1_000, "PauseJob", job_id=7), entry(2_000, "CreateToken")])
    store.record_audit([entry(3_000, "ResumeJob", job_id=7, tenant="t2")])
    got = store.list_audit()
    assert [e.action for e in got] == ["ResumeJob", "CreateToken", "PauseJob"]
    assert got[0].entry_id > got[1].entry_id > got[2].entry_id > 0
    paused = got[2]
    assert (paused.at_ms, paused.actor, paused.tenant, paused.address) == (
        1_000,
        "token t_1",
        "t1",
        "ipv4:127.0.0.1:5000",
    )
    assert (paused.target, paused.job_id, json.loads(paused.details)) == ("job 7", 7, {"n": 1_000})
    assert got[1].job_id is None
    store.record_audit([])  # nothing to write is no error


def test_filters_pages_and_purge(store: Store) -> None:
    store.record_audit([entry(t * 1_000, f"A{t}", job_id=t % 2 or None) for t in range(1, 11)])
    assert [e.action for e in store.list_audit(since_ms=8_000)] == ["A10", "A9", "A8"]
    assert [e.action for e in store.list_audit(job_id=1, limit=2)] == ["A9", "A7"]
    assert store.list_audit(tenant="t2") == []
    first = store.list_audit(limit=4)
    rest = store.list_audit(before_id=first[-1].entry_id, limit=100)
    assert [e.action for e in first + rest] == [f"A{t}" for t in range(10, 0, -1)]
    assert store.purge_audit(4_000) == 3
    assert [e.action for e in store.list_audit()][-1] == "A4"
    assert store.purge_audit(4_000) == 0
