"""Running a worker process: a ``Worker`` with its handlers until SIGTERM or
SIGINT, draining on the first signal (what ``wheelctl worker`` runs)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from wheel.codec import PayloadCodec
from wheel.tls import ChannelSecurity
from wheel.worker._api import RunContext
from wheel.worker._worker import Worker

__all__ = ["run_worker"]


def run_worker(
    target: str | Sequence[str],
    handlers: Mapping[str, Callable[[RunContext], Any]],
    *,
    capacity: int = 16,
    worker_id: str | None = None,
    pools: Sequence[str] = ("default",),
    drain_timeout: float = 30.0,
    reconnect_max: float = 2.0,
    metrics_listen: str | None = None,
    security: ChannelSecurity | None = None,
    token: str | None = None,
    http: bool = False,
    allow_private_targets: bool = False,
    codec: PayloadCodec | None = None,
) -> None:
    """Run a worker until SIGTERM/SIGINT (drain gracefully; a second signal stops
    now): ``Worker.run``'s own signal handling. ``http``: the built-in HTTP
    executor too (``Worker``'s ``http`` and ``allow_private_targets``);
    ``codec``: ``Worker``'s, payloads decoded for the handlers;
    ``reconnect_max``: ``Worker``'s, the longest wait between tries at a node."""
    worker = Worker(
        target,
        worker_id=worker_id,
        capacity=capacity,
        pools=pools,
        reconnect_max=reconnect_max,
        metrics_listen=metrics_listen,
        security=security,
        token=token,
        http=http,
        allow_private_targets=allow_private_targets,
        codec=codec,
    )
    for name, fn in handlers.items():
        worker.register(name, fn)

    asyncio.run(worker.run(drain_timeout=drain_timeout))
