"""``MetricsServer`` over a real socket: ``/metrics`` in the text format (or
OpenMetrics, or gzip, when asked), HEAD without a body, and a plain answer
for anything else; collection runs on the loop that serves."""

from __future__ import annotations

import asyncio
import gzip
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from wheel.errors import InvalidArgument
from wheel.metrics import MetricsServer, parse_listen


class LoopThread(Collector):
    """Reports the thread it is collected on."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        self.threads.append(threading.get_ident())
        yield GaugeMetricFamily("test_collected", "1", value=1)


async def request(port: int, raw: bytes) -> tuple[str, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return status, headers, body


def get(path: str, *extra: str, method: str = "GET") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: x", *extra, "", ""]
    return "\r\n".join(lines).encode()


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("test_things_total", "things", registry=registry).inc(3)
    return registry


def test_metrics_are_collected_on_the_serving_loop(registry: CollectorRegistry) -> None:
    collector = LoopThread()
    registry.register(collector)

    async def scenario() -> tuple[str, dict[str, str], bytes]:
        server = MetricsServer(registry)
        port = await server.start("127.0.0.1:0")
        try:
            return await request(port, get("/metrics"))
        finally:
            await server.stop()

    status, headers, body = asyncio.run(scenario())
    assert status == "HTTP/1.1 200 OK"
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    assert int(headers["content-length"]) == len(body)
    assert b"test_things_total 3.0" in body and b"test_collected 1.0" in body
    assert collector.threads == [threading.get_ident()]


def test_openmetrics_gzip_and_head_are_answered_as_asked(registry: CollectorRegistry) -> None:
    asyncio.run(_formats(registry))


async def _formats(registry: CollectorRegistry) -> None:
    server = MetricsServer(registry)
    port = await server.start("127.0.0.1:0")
    try:
        _, headers, body = await request(
            port, get("/metrics", "Accept: application/openmetrics-text; version=1.0.0")
        )
        assert headers["content-type"].startswith("application/openmetrics-text")
        assert body.endswith(b"# EOF\n")
        _, headers, body = await request(port, get("/metrics", "Accept-Encoding: gzip"))
        assert headers["content-encoding"] == "gzip"
        assert b"test_things_total 3.0" in gzip.decompress(body)
        status, headers, body = await request(port, get("/metrics", method="HEAD"))
        assert status.endswith("200 OK") and int(headers["content-length"]) > 0
        assert body == b""
    finally:
        await server.stop()


def test_other_paths_methods_and_garbage_get_an_error_status(
    registry: CollectorRegistry,
) -> None:
    asyncio.run(_errors(registry))


async def _errors(registry: CollectorRegistry) -> None:
    server = MetricsServer(registry)
    port = await server.start("127.0.0.1:0")
    try:
        assert (await request(port, get("/nope")))[0].endswith("404 Not Found")
        assert (await request(port, get("/metrics", method="POST")))[0].endswith(
            "405 Method Not Allowed"
        )
        assert (await request(port, b"nonsense\r\n\r\n"))[0].endswith("400 Bad Request")
        assert (await request(port, get("/")))[0].endswith("200 OK")
    finally:
        await server.stop()


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("127.0.0.1:9100", ("127.0.0.1", 9100)),
        (":9100", ("0.0.0.0", 9100)),
        ("[::1]:0", ("::1", 0)),
    ],
)
def test_listen_addresses_parse(listen: str, expected: tuple[str, int]) -> None:
    assert parse_listen(listen) == expected


@pytest.mark.parametrize("listen", ["9100", "host:", "host:port", "host:70000"])
def test_bad_listen_addresses_are_refused(listen: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_listen(listen)
