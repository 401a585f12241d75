"""Concurrency keys and rate limits on a node: the limits' calls of
AdminService, the check that a job's key has a limit, and the repair of
every limit's count as the node starts.

The permits themselves never pass through here: a claim takes them in the
store (``wheel.store._limits``) and the owner keeps the claims that wait
(``wheel.engine.owner._keywaits``); this part only reads how many wait here,
and writes the one early release a worker can ask of any node: the permits
of runs whose handlers returned while their owner cannot be told
(``release_returned``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wheel.engine.driver import Driver
from wheel.engine.spec import limit_key
from wheel.errors import InvalidArgument
from wheel.node._changes import InThread
from wheel.node._values import Clock
from wheel.store.base import LimitRecord, LimitStore

log = logging.getLogger("wheel.node")

# How often a node reads the limits for its metrics and console.
REFRESH_S = 1.0
# Rate periods a limit may have: per second and per minute.
RATE_PERIODS_MS = (1_000, 60_000)
MAX_LIMIT = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitView:
    """A limit as an operator sees it: the store's record and the claims of
    its key waiting on this node."""

    limit: LimitRecord
    waiting: int


class Limits:
    """The limits' calls of a node."""

    def __init__(
        self,
        store: LimitStore,
        clock: Clock,
        *,
        in_thread: InThread,
        driver: Callable[[], Driver | None],
    ) -> None:
        self._store = store
        self._clock = clock
        self._in_thread = in_thread
        self._driver = driver
        # The limits as last read (every ``REFRESH_S``), for the metrics.
        self._seen: list[LimitRecord] = []
        self._task: asyncio.Task[None] | None = None
        self._releases: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="wheel-limits")

    async def stop(self) -> None:
        for release in list(self._releases):
            release.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self) -> None:
        while True:
            try:
                self._seen = await self._in_thread(
                    self._store.list_limits, None, self._clock.now_ms()
                )
            except Exception:  # a store away now: the metrics keep the last read
                log.debug("reading the limits failed", exc_info=True)
            await asyncio.sleep(REFRESH_S)

    def census(self) -> tuple[list[LimitRecord], dict[tuple[str, str], int]]:
        """The limits as last read, and the claims of each key waiting here."""
        return self._seen, self._waiting()

    async def repair(self) -> None:
        """Count every limit's runs in flight again (a node starting): a
        drift left by anything never outlives a restart."""
        changed = await self._in_thread(self._store.recount_limits)
        if changed:
            log.warning("%d concurrency limits counted again from the runs in flight", changed)

    def release_returned(
        self, worker_id: str, runs: Sequence[tuple[int, int]], *, acked_only: bool
    ) -> None:
        """Give back, in the background, the permits of ``runs`` (run id,
        fence) whose handlers returned on ``worker_id``, still in flight in
        the store (``LimitStore.release_returned``; ``acked_only``: only runs
        the store knows this worker holds). Nobody waits for it: a store
        that refuses leaves those permits to the runs' ends."""
        task = asyncio.create_task(self._release(worker_id, list(runs), acked_only))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, worker_id: str, runs: list[tuple[int, int]], acked: bool) -> None:
        release = functools.partial(self._store.release_returned, acked_only=acked)
        try:
            given = await self._in_thread(release, worker_id, runs)
        except Exception as exc:
            log.info("permits of %d returned runs left to their ends: %s", len(runs), exc)
            return
        if given:
            log.info(
                "gave back %d permits of runs that returned on %s, their owner not told yet",
                given,
                worker_id,
            )

    async def put(self, limit: LimitRecord) -> LimitView:
        """Create or replace a limit (checked here, naming the field)."""
        checked(limit)
        record = await self._in_thread(self._store.set_limit, limit, self._clock.now_ms())
        return LimitView(limit=record, waiting=self._waiting().get((limit.tenant, limit.key), 0))

    async def read(self, tenant: str | None) -> list[LimitView]:
        records = await self._in_thread(self._store.list_limits, tenant, self._clock.now_ms())
        waiting = self._waiting()
        return [LimitView(limit=r, waiting=waiting.get((r.tenant, r.key), 0)) for r in records]

    async def delete(self, tenant: str, key: str) -> int:
        return await self._in_thread(self._store.delete_limit, tenant, key)

    async def known(self, wanted: set[tuple[str, str]]) -> set[tuple[str, str]]:
        """Of ``wanted`` (tenant, key), those that have a limit: one store
        read per tenant asked about."""
        found: set[tuple[str, str]] = set()
        for tenant in {t for t, _ in wanted}:
            records = await self._in_thread(self._store.list_limits, tenant, 0)
            found.update((r.tenant, r.key) for r in records)
        return found & wanted

    def waiting(self) -> dict[tuple[str, str], int]:
        return self._waiting()

    def _waiting(self) -> dict[tuple[str, str], int]:
        driver = self._driver()
        return {} if driver is None else driver.limit_waiting()


def checked(limit: LimitRecord) -> LimitRecord:
    """``limit`` when its values make a limit, else ``InvalidArgument``
    naming the field."""
    limit_key("key", limit.key)
    if not 0 <= limit.max_concurrent <= MAX_LIMIT:
        raise InvalidArgument(
            "max_concurrent", f"{limit.max_concurrent} is outside [0, {MAX_LIMIT}]"
        )
    if not 0 <= limit.rate <= MAX_LIMIT:
        raise InvalidArgument("rate", f"{limit.rate} is outside [0, {MAX_LIMIT}]")
    if limit.rate and limit.rate_period_ms not in RATE_PERIODS_MS:
        raise InvalidArgument("rate_period_ms", "must be 1000 (per second) or 60000 (per minute)")
    if not 0 <= limit.burst <= MAX_LIMIT:
        raise InvalidArgument("burst", f"{limit.burst} is outside [0, {MAX_LIMIT}]")
    if limit.burst and not limit.rate:
        raise InvalidArgument("burst", "a burst needs a rate")
    if not (limit.max_concurrent or limit.rate):
        raise InvalidArgument("max_concurrent", "give max_concurrent or a rate (or both)")
    return limit
