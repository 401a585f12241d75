"""The Store contract for signing secrets (schema 16), run against SQLite,
PostgreSQL and the reference model alike (the ``store`` fixture)."""

from __future__ import annotations

import pytest

from wheel.errors import NotFound
from wheel.store.base import Seal, SecretRecord, Store

HOUR_MS = 3_600_000


def sealed(text: str) -> tuple[Seal, list[int]]:
    """A seal that records the versions it was asked for (the store picks
    the version; the seal binds it)."""
    asked: list[int] = []

    def seal(version: int) -> tuple[str, bytes]:
        asked.append(version)
        return "key-a", f"{text}@{version}".encode()

    return seal, asked


def names(records: list[SecretRecord]) -> list[tuple[str, str, int]]:
    return [(r.tenant, r.name, r.version) for r in records]


def test_set_creates_version_1_sealed_for_that_version(store: Store) -> None:
    seal, asked = sealed("k1")
    record = store.set_secret("acme", "hook", seal, 1_000)
    assert asked == [1]
    assert record == SecretRecord(
        tenant="acme",
        name="hook",
        version=1,
        key_id="key-a",
        ciphertext=b"k1@1",
        created_at_ms=1_000,
    )
    assert store.list_secrets(2_000) == [record]


def test_set_again_replaces_every_version_with_the_next_number(store: Store) -> None:
    store.set_secret("acme", "hook", sealed("k1")[0], 1_000)
    store.rotate_secret("acme", "hook", sealed("k2")[0], 2_000, HOUR_MS)
    seal, asked = sealed("k3")
    record = store.set_secret("acme", "hook", seal, 3_000)
    # Never a number a node may still cache for another key.
    assert asked == [3] and record.version == 3
    assert store.list_secrets(4_000) == [record]


def test_rotate_adds_a_version_and_retires_the_older_after_the_overlap(store: Store) -> None:
    first = store.set_secret("acme", "hook", sealed("k1")[0], 1_000)
    second = store.rotate_secret("acme", "hook", sealed("k2")[0], 5_000, 10_000)
    assert second.version == 2 and second.retires_at_ms is None
    during = store.list_secrets(14_999, "acme")
    assert names(during) == [("acme", "hook", 1), ("acme", "hook", 2)]
    assert during[0].retires_at_ms == 15_000 and during[0].ciphertext == first.ciphertext
    assert store.list_secrets(15_000) == [second]
    # Seen retired, it was deleted: not even a read "before" finds it again.
    assert store.list_secrets(14_000) == [second]


def test_a_second_rotation_keeps_an_earlier_retirement(store: Store) -> None:
    store.set_secret("acme", "hook", sealed("k1")[0], 1_000)
    store.rotate_secret("acme", "hook", sealed("k2")[0], 2_000, 5_000)
    store.rotate_secret("acme", "hook", sealed("k3")[0], 3_000, HOUR_MS)
    by_version = {r.version: r.retires_at_ms for r in store.list_secrets(3_500)}
    assert by_version == {1: 7_000, 2: 3_000 + HOUR_MS, 3: None}


def test_rotate_of_a_missing_secret_is_not_found(store: Store) -> None:
    store.set_secret("other", "hook", sealed("k1")[0], 1_000)
    with pytest.raises(NotFound, match="hook"):
        store.rotate_secret("acme", "hook", sealed("k2")[0], 2_000, HOUR_MS)


def test_tenants_hold_secrets_apart(store: Store) -> None:
    store.set_secret("acme", "hook", sealed("a")[0], 1_000)
    store.set_secret("zeta", "hook", sealed("z")[0], 1_000)
    store.set_secret("acme", "alpha", sealed("b")[0], 1_000)
    assert names(store.list_secrets(2_000)) == [
        ("acme", "alpha", 1),
        ("acme", "hook", 1),
        ("zeta", "hook", 1),
    ]
    assert names(store.list_secrets(2_000, "zeta")) == [("zeta", "hook", 1)]
    assert store.delete_secret("acme", "hook") == 1
    assert names(store.list_secrets(2_000)) == [("acme", "alpha", 1), ("zeta", "hook", 1)]


def test_delete_removes_every_version_and_counts_them(store: Store) -> None:
    store.set_secret("acme", "hook", sealed("k1")[0], 1_000)
    store.rotate_secret("acme", "hook", sealed("k2")[0], 2_000, HOUR_MS)
    assert store.delete_secret("acme", "hook") == 2
    assert store.list_secrets(3_000) == []
    assert store.delete_secret("acme", "hook") == 0
    # Made again, it starts over.
    assert store.set_secret("acme", "hook", sealed("k3")[0], 4_000).version == 1


def test_ciphertext_round_trips_any_bytes(store: Store) -> None:
    blob = bytes(range(256))
    store.set_secret("acme", "hook", lambda v: ("key-b", blob), 1_000)
    (record,) = store.list_secrets(2_000)
    assert record.ciphertext == blob and record.key_id == "key-b"
