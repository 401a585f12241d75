"""A real node for the operations tests: the node's process
(``wheel.app.running``: the node, its gRPC server and its ``/metrics``
endpoint) on an event loop in a thread, on the store URL given (SQLite on
disk or PostgreSQL), and helpers to scrape and to hold a gRPC health
check."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Self

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from wheel.app import AppConfig, Hooks, running
from wheel.auth import DEFAULT_RECHECK_S
from wheel.coord.base import Coordinator
from wheel.metrics import MetricsServer
from wheel.node import Node, NodeConfig
from wheel.store.base import Store


class LiveNode:
    """A node serving gRPC and ``/metrics`` on loopback ports."""

    def __init__(
        self,
        store_url: str,
        config: NodeConfig,
        *,
        coordinator: Callable[[Store], Coordinator] | None = None,
        auth: bool = False,
        recheck_s: float = DEFAULT_RECHECK_S,
    ) -> None:
        """``auth``: every call needs a token, re-checked every ``recheck_s``."""
        self.store_url = store_url
        self.config = config
        self._app_config = AppConfig(
            store_url=store_url,
            node=config,
            listen="127.0.0.1:0",
            metrics_listen="127.0.0.1:0",
            auth=auth,
            auth_recheck_s=recheck_s,
            drain_s=0.5,
        )
        self._hooks = Hooks(coordinator=coordinator)
        self._stack = contextlib.AsyncExitStack()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.node: Node | None = None
        self.server: Any = None
        self.metrics: MetricsServer | None = None
        self.port = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        assert self.metrics is not None
        return f"http://127.0.0.1:{self.metrics.port}/metrics"

    def start(self) -> Self:
        self.thread.start()
        self.run(self._start(), timeout=30)
        return self

    async def _start(self) -> None:
        app = await self._stack.enter_async_context(running(self._app_config, self._hooks))
        self.node, self.server, self.port = app.node, app.server, app.port
        self.metrics = app.metrics

    def run(self, coro: Any, timeout: float = 10) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def call(self, fn: Callable[[], Any], timeout: float = 10) -> Any:
        """Run ``fn`` on the node's loop (the only thread that touches the owner)."""

        async def wrapper() -> Any:
            return fn()

        return self.run(wrapper(), timeout)

    def stop(self) -> None:
        try:
            self.run(self._stack.aclose(), timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def scrape(url: str) -> dict[str, float]:
    """Every sample of ``/metrics`` by its name and labels, as Prometheus
    would read it: ``'wheel_fires_total'``,
    ``'wheel_claims_total{result="won"}'``."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def health(target: str, service: str = "") -> int:
    """The health status a standard gRPC health check gets for ``service``."""
    with grpc.insecure_channel(target) as channel:
        resp = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
        return int(resp.status)


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Relay:
    """A TCP relay in front of a server that a test can cut: every
    connection through it is closed at once and new ones are refused, as
    when the server's host goes away; ``restore`` lets connections through
    again on the same port."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        probe = socket.create_server(("127.0.0.1", 0))
        self.port = int(probe.getsockname()[1])
        probe.close()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            socks, self._socks = self._socks, []
        if listener is not None:
            # shutdown wakes an accept() blocked on it: close alone leaves
            # the socket listening until that accept returns.
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    close = cut

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                down, _ = listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                down.close()
                continue
            with self._lock:
                # A connection accepted just as the relay was cut must not
                # outlive the cut (a pool reconnecting then kept a working
                # connection, and the store never looked unreachable).
                alive = self._listener is listener
                if alive:
                    self._socks += [down, up]
            if not alive:
                down.close()
                up.close()
                return
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := src.recv(1 << 16):
                dst.sendall(chunk)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def relay_to(dsn: str) -> Iterator[tuple[Relay, str]]:
    """A relay in front of ``dsn``'s server, and the DSN through it."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(dsn)
    relay = Relay((parts.hostname or "127.0.0.1", parts.port or 5432))
    netloc = parts.netloc.rsplit("@", 1)
    netloc[-1] = f"127.0.0.1:{relay.port}"
    try:
        yield relay, urlunsplit(parts._replace(netloc="@".join(netloc)))
    finally:
        relay.close()
