"""The audit trail of a node: administrative changes written to the store
as the API makes them, read back for ``ListAudit``, and purged with the
rest of the history by the retention pass."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from wheel.node._changes import InThread
from wheel.node._values import Clock
from wheel.store.base import AuditEntry, Store

log = logging.getLogger("wheel.node")


class Audit:
    """Writes and reads the store's audit trail off the event loop."""

    def __init__(self, store: Store, clock: Clock, *, in_thread: InThread) -> None:
        self._store = store
        self._clock = clock
        self._in_thread = in_thread

    async def record(self, entries: Sequence[AuditEntry]) -> bool:
        """Append ``entries``; False (and an error logged with what was not
        recorded) when the store refused: the change they describe is made
        already, so the caller's answer stands."""
        try:
            await self._in_thread(self._store.record_audit, entries)
        except Exception as exc:
            for e in entries:
                log.error(
                    "audit: could not record %s on %s by %s from %s: %s",
                    e.action,
                    e.target,
                    e.actor or "-",
                    e.address,
                    exc,
                )
            return False
        return True

    async def list(
        self,
        *,
        since_ms: int | None,
        job_id: int | None,
        tenant: str | None,
        before_id: int | None,
        limit: int,
    ) -> list[AuditEntry]:
        return await self._in_thread(
            lambda: self._store.list_audit(
                since_ms=since_ms,
                job_id=job_id,
                tenant=tenant,
                before_id=before_id,
                limit=limit,
            )
        )

    def now_ms(self) -> int:
        return self._clock.now_ms()
