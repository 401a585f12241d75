"""The node's overview over a real SQLite store: buckets that closed are
read once and kept, an open bucket is read on every call, and the counts
match a fresh read of the store whatever the calls in between."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.store.conftest import interval_job
from tests.store.test_contract_overview import end, fire
from wheel.node._overview import KEEP_MS, SETTLE_MS, Overview
from wheel.store.base import OutcomeCount, RunState
from wheel.store.sqlite import SQLiteStore

T = TypeVar("T")
MINUTE = 60_000
HOUR = 60 * MINUTE


class Clock:
    def __init__(self, now_ms: int) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now


class CountingStore(SQLiteStore):
    """The SQLite store, recording from where each count was read."""

    reads: list[int]

    def outcome_counts(self, **kw: Any) -> list[OutcomeCount]:
        self.reads.append(kw["since_ms"])
        return super().outcome_counts(**kw)


async def directly(fn: Callable[..., T], /, *args: object) -> T:
    return fn(*args)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = CountingStore(tmp_path / "store.db")
    s.reads = []
    s.migrate()
    yield s
    s.close()


def test_closed_buckets_are_read_once_and_new_runs_still_show(store: Any) -> None:
    asyncio.run(closed_buckets_are_read_once(store))


async def closed_buckets_are_read_once(store: Any) -> None:
    job, _ = store.submit_job(interval_job())
    t0 = 1_000 * HOUR
    for k in range(30):  # a run ending each minute of the half hour before t0
        run = fire(store, job.job_id, t0 - (30 - k) * MINUTE)
        end(store, run, RunState.SUCCEEDED, started=run, finished=t0 - (30 - k) * MINUTE + 10)
    clock = Clock(t0)
    overview = Overview(store, clock, in_thread=directly)  # type: ignore[arg-type]

    first = await overview.run_overview(tenant=None, window_ms=HOUR, bucket_ms=MINUTE)
    assert sum(c.count for c in first.runs) == 30
    assert store.reads == [first.since_ms]

    clock.now += 5_000
    again = await overview.run_overview(tenant=None, window_ms=HOUR, bucket_ms=MINUTE)
    assert again.runs == first.runs
    # Only from the first bucket not yet closed.
    assert store.reads[-1] == (t0 - SETTLE_MS) // MINUTE * MINUTE

    late = fire(store, job.job_id, t0 + 1)
    end(store, late, RunState.FAILED, started=t0 + 2, finished=t0 + 6_000)
    clock.now += 5_000
    after = await overview.run_overview(tenant=None, window_ms=HOUR, bucket_ms=MINUTE)
    fresh = store.outcome_counts(since_ms=after.since_ms, bucket_ms=MINUTE)
    assert after.runs == fresh
    assert [c.outcome for c in after.runs if c.bucket_ms == t0] == ["failed"]

    # Another tenant's window is kept apart; and kept counts expire.
    none = await overview.run_overview(tenant="globex", window_ms=HOUR, bucket_ms=MINUTE)
    assert none.runs == []
    clock.now += KEEP_MS + 1
    store.reads.clear()
    await overview.run_overview(tenant=None, window_ms=HOUR, bucket_ms=MINUTE)
    assert store.reads == [(clock.now - HOUR) // MINUTE * MINUTE]
