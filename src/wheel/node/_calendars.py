"""Calendars on a node: written and read through here by AdminService, and
handed to the owner, which holds each once and skips its jobs' fires on
their days (``wheel.engine.owner._calendars``).

Every node reads the calendars from the store before it dispatches (at
start, before its loop runs or its first shard is gained), every
``REFRESH_S`` after, and at once after a change made through it: a change
made through another member of a cluster reaches this node's jobs within
``REFRESH_S``. A submit naming a calendar this node does not know reads the
store again first (at most one read at a time), so a calendar made through
another node a moment ago is known to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence

from wheel.engine.calendars import Calendar, CalendarDays
from wheel.engine.driver import Driver
from wheel.errors import StoreError
from wheel.node._changes import InThread
from wheel.node._values import Clock
from wheel.store.base import CalendarRecord, CalendarStore

log = logging.getLogger("wheel.node")

REFRESH_S = 5.0


class Calendars:
    """The calendars of a node: the store's, and the set of names known."""

    def __init__(
        self,
        store: CalendarStore,
        clock: Clock,
        *,
        in_thread: InThread,
        driver: Callable[[], Driver | None],
        wake: Callable[[], None],
    ) -> None:
        self._store = store
        self._clock = clock
        self._in_thread = in_thread
        self._driver = driver
        self._wake = wake
        self._calendars: dict[tuple[str, str], Calendar] = {}
        self._task: asyncio.Task[None] | None = None
        self._refreshing: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="wheel-calendars")

    async def stop(self) -> None:
        for task in (self._task, self._refreshing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            await self._refresh_logged()

    async def _refresh_logged(self) -> None:
        try:
            await self.refresh()
        except StoreError as exc:
            log.warning("reading calendars failed: %s", exc)
        except Exception:  # a bug here must not stop the refresh for good
            log.exception("reading calendars failed")

    async def refresh(self) -> None:
        """Read every calendar from the store and hand them to the owner."""
        self.apply(await self._in_thread(self._store.list_calendars, None))

    def apply(self, records: Sequence[CalendarRecord]) -> None:
        calendars: dict[tuple[str, str], Calendar] = {}
        for r in records:
            try:
                calendars[(r.tenant, r.name)] = Calendar.from_json(r.body)
            except (ValueError, KeyError, TypeError):
                log.error("calendar %r of tenant %r is unreadable; skipped", r.name, r.tenant)
        self._calendars = calendars
        driver = self._driver()
        if driver is not None:
            moved = driver.set_calendars(calendars, self._clock.now_ms())
            if moved:
                log.info("calendars changed: %d jobs re-armed", moved)
            self._wake()

    def days(self, tenant: str, names: Sequence[str]) -> CalendarDays | None:
        held = [c for c in (self._calendars.get((tenant, n)) for n in names) if c is not None]
        return CalendarDays.of(held) if held else None

    def knows(self, tenant: str, name: str) -> bool:
        """The calendar is in the store as last read."""
        return (tenant, name) in self._calendars

    async def learn(self, wanted: Iterable[tuple[str, str]]) -> None:
        """Read the store again when one of ``wanted`` is not known (once,
        sharing a read already under way)."""
        if all(self.knows(t, n) for t, n in wanted):
            return
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(
                self._refresh_logged(), name="wheel-calendars-learn"
            )
        await asyncio.shield(self._refreshing)

    # -- AdminService's calls ------------------------------------------------------------

    async def set(self, tenant: str, name: str, calendar: Calendar) -> CalendarRecord:
        """Create the calendar or replace its days; the owner re-arms the
        jobs that skip it before this returns."""
        record = await self._in_thread(
            self._store.set_calendar, tenant, name, calendar.to_json(), self._clock.now_ms()
        )
        await self._refresh_logged()
        return record

    async def get(self, tenant: str, name: str) -> CalendarRecord | None:
        return await self._in_thread(self._store.get_calendar, tenant, name)

    async def list(self, tenant: str | None) -> list[CalendarRecord]:
        return await self._in_thread(self._store.list_calendars, tenant)

    async def delete(self, tenant: str, name: str) -> bool:
        deleted = await self._in_thread(self._store.delete_calendar, tenant, name)
        await self._refresh_logged()
        return deleted
