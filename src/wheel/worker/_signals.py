"""SIGTERM and SIGINT for a worker run on the main thread: the first drains
it, the second stops it (``Worker.run``'s ``handle_signals``)."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("wheel.worker")


class Drainable(Protocol):
    """What a signal does to a worker (``wheel.worker.Worker``)."""

    def stop(self) -> None: ...

    async def drain(self, timeout: float = 30.0) -> None: ...


def drain_on_signals(
    worker: Drainable, drain_timeout: float, drains: list[asyncio.Task[None]]
) -> Callable[[], None] | None:
    """Make SIGTERM and SIGINT drain ``worker`` (the drain's task goes to
    ``drains``), and a second one stop it. Returns what puts the signals'
    earlier handlers back (and cancels a drain still going), or None where
    signals cannot be handled: off the main thread, or on a loop without
    signal support (Windows' proactor)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    loop = asyncio.get_running_loop()
    sigs = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.getsignal(sig) for sig in sigs}

    def on_signal(sig: signal.Signals) -> None:
        if drains:
            log.info("%s again: stopping now", sig.name)
            worker.stop()
            return
        log.info("%s: draining (up to %.0f s); signal again to stop now", sig.name, drain_timeout)
        drains.append(loop.create_task(worker.drain(drain_timeout)))

    installed = []
    for sig in sigs:
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except (NotImplementedError, RuntimeError, ValueError):
            continue
        installed.append(sig)

    def restore() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)
            old = previous[sig]
            if old is not None:  # None: set outside Python, nothing to put back
                signal.signal(sig, old)
        for task in drains:
            task.cancel()

    return restore if installed else None
