"""Permits handed across nodes: on PostgreSQL, a node hears at once that a
run of a concurrency key ended elsewhere with the key at its limit.

A key's waiting claims are sent again when a run of the key ends on their
own owner, and every ``limit_poll_ms`` otherwise
(``wheel.engine.owner._keywaits``): a permit freed on another node stayed
idle until the poll and the tick after it. Since schema 26 the store's
release (the trigger that takes a run's key off its limit) notifies
``PERMITS_CHANNEL`` in the releasing transaction when the limit was full,
so the notice is delivered at its commit, when the permit is there to take.
This task holds its own connection, LISTENs, and passes each notice of its
own schema (the channel is the database's: other schemas' stores share it)
to ``freed(tenant, key)``, which kicks the key's claims waiting on this
node. Nothing is sent while a key does not bind (the trigger does not
notify then), and a notice for a key nobody waits for here costs a set
look-up.

A lost notice (the connection down, a reconnect) costs what it cost before:
the claims wait for the next poll. The task reconnects with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable

import psycopg

from wheel._retry import Backoff
from wheel.store._schema import PERMITS_CHANNEL

log = logging.getLogger("wheel.node")

__all__ = ["PermitListener", "parse_notice"]

LISTEN_BACKOFF = Backoff(initial=0.1, max=5.0)


def parse_notice(payload: str, schema: str) -> tuple[str, str] | None:
    """(tenant, key) of a notice of ``schema``; None for another schema's or
    one that does not parse."""
    try:
        got = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(got, list) or len(got) != 3 or got[0] != schema:
        return None
    tenant, key = got[1], got[2]
    if not isinstance(tenant, str) or not isinstance(key, str):
        return None
    return tenant, key


class PermitListener:
    """The task that LISTENs for permits freed in the store at ``dsn`` (the
    node's own store) and tells ``freed``."""

    __slots__ = ("_dsn", "_freed", "_task", "listening", "name")

    def __init__(self, dsn: str, freed: Callable[[str, str], None], *, name: str = "") -> None:
        self._dsn = dsn
        self._freed = freed
        self._task: asyncio.Task[None] | None = None
        self.name = name or "wheel-permits"
        # Set while LISTENing (tests wait for it).
        self.listening = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="wheel-permits-listen")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _listen(self) -> None:
        delays = LISTEN_BACKOFF.delays()
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True, connect_timeout=5, application_name=self.name
                )
                async with conn:
                    row = await (await conn.execute("SELECT current_schema()")).fetchone()
                    schema = str(row[0]) if row is not None else ""
                    await conn.execute(f"LISTEN {PERMITS_CHANNEL}")
                    delays.reset()
                    self.listening.set()
                    async for notice in conn.notifies():
                        freed = parse_notice(notice.payload, schema)
                        if freed is not None:
                            self._freed(*freed)
            except psycopg.Error as exc:
                self.listening.clear()
                backoff = delays.wait()
                log.warning("permit listener: %s; reconnecting in %.1fs", exc, backoff)
            except Exception:  # a bug here must not end the listening for good
                self.listening.clear()
                backoff = delays.wait()
                log.exception("permit listener failed; reconnecting in %.1fs", backoff)
            else:
                self.listening.clear()
                backoff = delays.wait()
            await asyncio.sleep(backoff)
