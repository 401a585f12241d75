"""A node's change feed: the jobs changed in the store through other nodes
(or other writers) since it last read, applied to its owner.

The feed reads from a watermark, the store's change mark it has applied up
to. The node's own job writes are left out (it applied them as it wrote
them): their change markers are kept until the watermark passes them. Shards
gained while a read is on its way were loaded as of an older watermark: the
feed goes back there once the read returns, so that what changed since their
load is read too.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol, TypeVar

from wheel.engine.driver import Driver
from wheel.errors import StoreError
from wheel.node._values import Clock, NodeConfig
from wheel.store.base import Store

log = logging.getLogger("wheel.node")
T = TypeVar("T")


class InThread(Protocol):
    """Runs a blocking call off the event loop (``Node.in_thread``)."""

    def __call__(self, fn: Callable[..., T], /, *args: object) -> Awaitable[T]: ...


class ChangeFeed:
    """The change feed's watermark, the node's own changes, and its pace."""

    def __init__(
        self,
        config: NodeConfig,
        store: Store,
        clock: Clock,
        *,
        in_thread: InThread,
        failed: Callable[[], None],
    ) -> None:
        self._config = config
        self._store = store
        self._clock = clock
        # Runs a blocking store read off the event loop.
        self._in_thread = in_thread
        # Counts a failed read (the node's metrics).
        self._failed = failed
        self.watermark = 0
        # The watermark to go back to once the read on its way returns:
        # shards gained meanwhile were loaded as of it.
        self._rewind: int | None = None
        self._reading = False
        # Change markers of the node's own job writes: left out of the feed.
        self._own: set[int] = set()
        # When the next read is due (monotonic seconds).
        self._next_read = time.monotonic() + config.changes_interval_s

    def own(self, markers: Iterable[int]) -> None:
        """Changes the node made itself (applied as it made them)."""
        self._own.update(markers)

    def loaded_as_of(self, watermark: int) -> None:
        """Shards were loaded as of ``watermark``: read on from there."""
        if self._reading:
            self._rewind = watermark if self._rewind is None else min(self._rewind, watermark)
        else:
            self.watermark = min(self.watermark, watermark)

    def due(self) -> bool:
        """A read is due now (its interval passed, or a busy page left more)."""
        return time.monotonic() >= self._next_read

    async def read(self, driver: Driver, resync: set[int]) -> None:
        """Apply the jobs changed since the last read (and re-read
        ``resync``); the next read comes at once when the page was busy
        enough that more may be waiting, else after the interval."""
        busy = await self.read_page(driver, resync)
        self._next_read = time.monotonic() + (0.0 if busy else self._config.changes_interval_s)

    async def read_page(self, driver: Driver, resync: set[int]) -> bool:
        """One page of the feed (and ``resync`` re-read); True when the page
        was busy enough that more may be waiting."""
        store = self._store
        page = self._config.changes_page
        self._reading = True
        try:
            # Jobs as rows: an owner takes them on by profile, parsing no spec.
            reread = await self._in_thread(store.job_rows, resync) if resync else None
            changed = await self._in_thread(
                functools.partial(
                    store.changed_rows,
                    self.watermark,
                    list(driver.shards()),
                    page,
                    owner_moves=False,
                    exclude=frozenset(self._own),
                )
            )
            self.watermark = changed.watermark
            # A marker below the watermark is never reported again.
            self._own = {m for m in self._own if m >= self.watermark}
        except StoreError as exc:
            self._failed()
            log.warning("reading job changes failed: %s", exc)
            driver.reread(resync)  # read again next time
            return False
        finally:
            self._reading = False
            if self._rewind is not None:
                # Shards were gained while this read was on its way: read
                # again from where they were loaded.
                self.watermark = min(self.watermark, self._rewind)
                self._rewind = None
        now = self._clock.now_ms()
        if reread is not None:
            driver.apply_rows(reread, now)
        driver.apply_rows(changed, now)
        # A page can end short of the limit on a whole transaction (PostgreSQL).
        return 2 * (len(changed.rows) + len(changed.jobs)) >= page
