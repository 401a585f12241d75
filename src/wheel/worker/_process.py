"""Running a worker process: a ``Worker`` with its handlers until SIGTERM or
SIGINT, draining on the first signal (what ``wheelctl worker`` runs)."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from wheel._tls import ChannelSecurity
from wheel.worker._api import RunContext
from wheel.worker._worker import Worker

__all__ = ["run_worker"]

log = logging.getLogger("wheel.worker")


def run_worker(
    target: str | Sequence[str],
    handlers: Mapping[str, Callable[[RunContext], Any]],
    *,
    capacity: int = 16,
    worker_id: str | None = None,
    pools: Sequence[str] = ("default",),
    drain_timeout: float = 30.0,
    metrics_listen: str | None = None,
    security: ChannelSecurity | None = None,
    token: str | None = None,
) -> None:
    """Run a worker until SIGTERM/SIGINT (drain gracefully; a second signal stops now)."""
    worker = Worker(
        target,
        worker_id=worker_id,
        capacity=capacity,
        pools=pools,
        metrics_listen=metrics_listen,
        security=security,
        token=token,
    )
    for name, fn in handlers.items():
        worker.register(name, fn)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        draining: list[asyncio.Task[None]] = []

        def on_signal() -> None:
            if draining:
                worker.stop()
            else:
                log.info("draining (up to %.0f s); signal again to stop now", drain_timeout)
                draining.append(loop.create_task(worker.drain(drain_timeout)))

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        try:
            await worker.run()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            for t in draining:
                t.cancel()
            await asyncio.gather(*draining, return_exceptions=True)

    asyncio.run(main())
