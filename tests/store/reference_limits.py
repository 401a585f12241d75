"""The concurrency limits of the reference store (``ReferenceStore.limits``):
a part it holds, keeping each key's row as the SQL stores do, with their
bucket arithmetic (``wheel.store._limits``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from wheel.store._limits import MILLI, free_permits, refilled
from wheel.store._limits import _Row as LimitRow
from wheel.store.base import FireClaim, LimitRecord

Key = tuple[str, str]  # (tenant, concurrency key)


class _Run(Protocol):
    """What ``RefLimits.release`` reads and writes of a run's row."""

    job_id: int
    fence: int
    worker_id: str | None
    concurrency_key: str | None

    @property
    def state(self) -> Any: ...


class RefLimits:
    """Each key's limit and its permits; ``count`` gives a key's runs in
    flight as the store holds them (for a set and a recount)."""

    def __init__(self, count: Callable[[Key], int]) -> None:
        self.rows: dict[Key, tuple[LimitRecord, LimitRow]] = {}
        self._count = count

    def __getitem__(self, k: Key) -> tuple[LimitRecord, LimitRow]:
        return self.rows[k]

    def put(self, limit: LimitRecord, now_ms: int) -> LimitRecord:
        k = (limit.tenant, limit.key)
        burst = limit.burst or limit.rate
        old = self.rows.get(k)
        tokens = burst * MILLI if old is None else min(old[1].tokens_milli, burst * MILLI)
        period = limit.rate_period_ms or 1000
        row = LimitRow(
            limit.max_concurrent, limit.rate, period, burst, self._count(k), tokens, now_ms
        )
        self.rows[k] = (replace(limit, updated_at_ms=now_ms), row)
        return self._record(k, now_ms)

    def _record(self, k: Key, now_ms: int) -> LimitRecord:
        rec, row = self.rows[k]
        tokens = refilled(row, now_ms)[0] if row.rate > 0 and now_ms else row.tokens_milli
        return replace(
            rec,
            max_concurrent=row.max_concurrent,
            rate=row.rate,
            rate_period_ms=row.rate_period_ms,
            burst=row.burst,
            in_flight=row.in_flight,
            tokens=tokens / MILLI,
        )

    def read(self, tenant: str | None, now_ms: int) -> list[LimitRecord]:
        return [self._record(k, now_ms) for k in sorted(self.rows) if tenant in (None, k[0])]

    def delete(self, tenant: str, key: str) -> int:
        return 1 if self.rows.pop((tenant, key), None) is not None else 0

    def recount(self) -> int:
        changed = 0
        for k, (_, row) in self.rows.items():
            n = self._count(k)
            if row.in_flight != n:
                row.in_flight = n
                changed += 1
        return changed

    def waiting(self, claims: Sequence[FireClaim], now_ms: int) -> set[int]:
        """The indexes of the claims that get no permit (batch order)."""
        asked: dict[Key, list[int]] = defaultdict(list)
        for i, c in enumerate(claims):
            if c.concurrency_key and (c.tenant, c.concurrency_key) in self.rows:
                asked[(c.tenant, c.concurrency_key)].append(i)
        out: set[int] = set()
        for k, idx in asked.items():
            out.update(idx[free_permits(self.rows[k][1], now_ms) :])
        return out

    def take(self, tenant: str, key: str, now_ms: int) -> None:
        """A run of the key was inserted: its permit (and a token) taken."""
        limit = self.rows.get((tenant, key))
        if limit is not None:
            row = limit[1]
            row.in_flight += 1
            if row.rate > 0:
                tokens, row.refilled_at_ms = refilled(row, now_ms)
                row.tokens_milli = tokens - MILLI

    def give(self, tenant: str, key: str) -> None:
        """A run of the key left dispatched/running."""
        limit = self.rows.get((tenant, key))
        if limit is not None:
            limit[1].in_flight = max(0, limit[1].in_flight - 1)

    def release(
        self,
        runs: Mapping[int, _Run],
        tenants: Mapping[int, str],
        whose: Collection[str | None],
        returned: Sequence[tuple[int, int]],
        in_flight: Collection[Any],
    ) -> int:
        """``Store.release_returned``: the runs still in flight under their
        fence, acked by one of ``whose`` (None: by no worker yet), lose their
        key and give its permit back."""
        given = 0
        for run_id, fence in set(returned):
            ex = runs.get(run_id)
            if (
                ex is None
                or ex.fence != fence
                or ex.state not in in_flight
                or ex.concurrency_key is None
                or ex.worker_id not in whose
                or ex.job_id not in tenants
            ):
                continue
            self.give(tenants[ex.job_id], ex.concurrency_key)
            ex.concurrency_key = None
            given += 1
        return given
