"""Permits freed on one node heard by the others (``wheel.node._permits``):
a release that takes a key off a full limit notifies at its commit, on a
real PostgreSQL, the listener of the same schema hears it on a connection
of its own, and nothing else is heard (a release under the limit, a limit
that does not bind, another schema's release)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

from tests.conftest import fresh_schema
from tests.store.test_contract_limits import end, jobs, keyed_claim
from wheel.engine.model import RunState
from wheel.node._permits import PermitListener, parse_notice
from wheel.store.base import ClaimOutcome, LimitRecord, Store
from wheel.store.open import libpq_dsn, open_store

pytestmark = pytest.mark.postgres


def claim(store: Store, ids: Sequence[int], key: str) -> list[ClaimOutcome]:
    outs = store.claim_fires([keyed_claim(j, 60_000, key=key) for j in ids])
    assert all(o.run_id is not None for o in outs)
    return outs


def test_a_notice_names_its_schema_tenant_and_key() -> None:
    assert parse_notice('["s1", "acme", "db"]', "s1") == ("acme", "db")
    assert parse_notice('["s2", "acme", "db"]', "s1") is None
    assert parse_notice("not json", "s1") is None
    assert parse_notice('["s1", "acme"]', "s1") is None


def test_a_release_at_the_limit_is_heard_by_the_listener_of_its_schema_alone(
    pg_dsn: str,
) -> None:
    heard: list[tuple[str, str]] = []
    with fresh_schema() as other_dsn:
        store, other = open_store(pg_dsn), open_store(other_dsn)
        try:
            for s in (store, other):
                s.set_limit(LimitRecord(tenant="acme", key="db", max_concurrent=2), 1_000)
                s.set_limit(LimitRecord(tenant="acme", key="wide", max_concurrent=100), 1_000)
                s.set_limit(LimitRecord(tenant="acme", key="last", max_concurrent=1), 1_000)
            full = claim(store, jobs(store, 2, "db"), "db")
            wide = claim(store, jobs(store, 2, "wide"), "wide")
            last = claim(store, jobs(store, 1, "last"), "last")
            elsewhere = claim(other, jobs(other, 2, "db"), "db")

            async def go() -> None:
                dsn = libpq_dsn(pg_dsn)
                assert dsn is not None
                listener = PermitListener(dsn, lambda t, k: heard.append((t, k)))
                listener.start()
                try:
                    await asyncio.wait_for(listener.listening.wait(), 10)
                    # The first of a full limit's runs ends: heard.
                    await asyncio.to_thread(end, store, full[:1], RunState.SUCCEEDED)
                    deadline = time.monotonic() + 10
                    while not heard and time.monotonic() < deadline:
                        await asyncio.sleep(0.01)
                    assert heard == [("acme", "db")]
                    # Under the limit, a limit that does not bind, another
                    # schema's full limit: not heard. Then one more that is,
                    # which arrives after them (notices come in commit order).
                    await asyncio.to_thread(end, store, full[1:], RunState.FAILED)
                    await asyncio.to_thread(end, store, wide, RunState.SUCCEEDED)
                    await asyncio.to_thread(end, other, elsewhere[:1], RunState.SUCCEEDED)
                    await asyncio.to_thread(end, store, last, RunState.SUCCEEDED)
                    deadline = time.monotonic() + 10
                    while len(heard) < 2 and time.monotonic() < deadline:
                        await asyncio.sleep(0.01)
                    await asyncio.sleep(0.2)  # anything else would be here by now
                finally:
                    await listener.stop()

            asyncio.run(go())
            assert heard == [("acme", "db"), ("acme", "last")]
            assert [x.in_flight for x in store.list_limits("acme")] == [0, 0, 0]
        finally:
            store.close()
            other.close()
