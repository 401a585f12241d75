"""The Store contract for calendars (schema 18), run against SQLite,
PostgreSQL and the reference model alike (the ``store`` fixture)."""

from __future__ import annotations

from wheel.store._schema import PG_MIGRATIONS, SQLITE_MIGRATIONS
from wheel.store.base import CalendarRecord, Store

BODY = '{"dates":["2026-12-25"],"ranges":[],"weekdays":[]}'
WEEKEND = '{"dates":[],"ranges":[],"weekdays":["sat","sun"]}'


def test_schema_18_adds_calendars_on_both_backends() -> None:
    for migrations in (SQLITE_MIGRATIONS, PG_MIGRATIONS):
        assert "CREATE TABLE calendars" in " ".join(dict(migrations)[18])


def test_set_creates_version_1_and_get_reads_it(store: Store) -> None:
    record = store.set_calendar("acme", "holidays", BODY, 1_000)
    assert record == CalendarRecord(
        tenant="acme", name="holidays", body=BODY, version=1, updated_at_ms=1_000
    )
    assert store.get_calendar("acme", "holidays") == record
    assert store.get_calendar("other", "holidays") is None
    assert store.get_calendar("acme", "nope") is None


def test_set_again_replaces_the_days_and_counts_the_version_up(store: Store) -> None:
    store.set_calendar("acme", "holidays", BODY, 1_000)
    again = store.set_calendar("acme", "holidays", WEEKEND, 2_000)
    assert (again.body, again.version, again.updated_at_ms) == (WEEKEND, 2, 2_000)
    assert store.get_calendar("acme", "holidays") == again


def test_list_is_by_tenant_and_name_and_filters_by_tenant(store: Store) -> None:
    store.set_calendar("zeta", "a", BODY, 1)
    store.set_calendar("acme", "weekend", WEEKEND, 2)
    store.set_calendar("acme", "holidays", BODY, 3)
    every = [(r.tenant, r.name) for r in store.list_calendars()]
    assert every == [("acme", "holidays"), ("acme", "weekend"), ("zeta", "a")]
    assert [r.name for r in store.list_calendars("acme")] == ["holidays", "weekend"]
    assert store.list_calendars("nobody") == []


def test_delete_removes_one_calendar_of_one_tenant(store: Store) -> None:
    store.set_calendar("acme", "holidays", BODY, 1)
    store.set_calendar("zeta", "holidays", BODY, 1)
    assert store.delete_calendar("acme", "holidays") is True
    assert store.delete_calendar("acme", "holidays") is False
    assert [(r.tenant, r.name) for r in store.list_calendars()] == [("zeta", "holidays")]
    # Set again after a delete: a new calendar, from version 1.
    assert store.set_calendar("acme", "holidays", BODY, 5).version == 1
