"""``/metrics`` over HTTP (or HTTPS) on the running asyncio loop.

``prometheus_client.start_http_server`` serves from a thread of its own, so
its collectors would read the node's owner while the event loop changes it.
This server answers on the loop instead: a scrape collects between two
passes of the dispatch loop, like any other event. It speaks just enough
HTTP/1.1 for Prometheus and curl (GET or HEAD, one request per connection)
and negotiates the text or OpenMetrics format, and gzip, as the client's own
server does.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import os
from dataclasses import dataclass, field
from ssl import SSLContext

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from wheel.errors import InvalidArgument

log = logging.getLogger("wheel.metrics")

# A request's line and headers must arrive within this and fit in this.
REQUEST_TIMEOUT_S = 5.0
MAX_REQUEST_BYTES = 16 * 1024


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9100`` for IPv6; ``:9100`` for every address)
    -> (host, port)."""
    host, colon, port = listen.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65_535:
        raise InvalidArgument("metrics_listen", f"{listen!r} is not HOST:PORT")
    host = host.removeprefix("[").removesuffix("]")
    return host or "0.0.0.0", int(port)


class MetricsServer:
    """Serves ``registry`` at ``/metrics`` on the loop that calls ``start``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, listen: str, *, ssl: SSLContext | None = None) -> int:
        """Listen on ``HOST:PORT`` (port 0: any free one), over HTTPS with
        ``ssl``; returns the port."""
        host, port = parse_listen(listen)
        try:
            self._server = await asyncio.start_server(self._serve, host, port, ssl=ssl)
        except OSError as exc:  # in use (another node or worker there?), or not this host's
            why = os.strerror(exc.errno) if exc.errno else str(exc)
            raise InvalidArgument("metrics_listen", f"cannot listen on {listen}: {why}") from None
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            reply = self._answer(head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            reply = _Reply("400 Bad Request", b"bad request\n")
        except ConnectionError:
            writer.close()
            return
        except Exception:
            log.exception("collecting metrics failed")
            reply = _Reply("500 Internal Server Error", b"collection failed\n")
        headers = {"Content-Type": "text/plain; charset=utf-8", **reply.headers}
        lines = [f"HTTP/1.1 {reply.status}", f"Content-Length: {len(reply.body)}"]
        lines += ["Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if not reply.head_only:
            writer.write(reply.body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    def _answer(self, head: bytes) -> _Reply:
        """The reply to a request's line and headers."""
        if len(head) > MAX_REQUEST_BYTES:
            return _Reply("431 Request Header Fields Too Large", b"headers too large\n")
        request, *header_lines = head.decode("latin-1").split("\r\n")
        parts = request.split(" ")
        if len(parts) != 3:
            return _Reply("400 Bad Request", b"bad request line\n")
        method, target, _ = parts
        headers = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if method not in ("GET", "HEAD"):
            return _Reply("405 Method Not Allowed", b"GET or HEAD\n", {"Allow": "GET, HEAD"})
        path = target.split("?", 1)[0]
        if path == "/":
            return _Reply("200 OK", b"wheel: metrics at /metrics\n", head_only=method == "HEAD")
        if path != "/metrics":
            return _Reply("404 Not Found", b"not found: metrics are at /metrics\n")
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        body = encoder(self.registry)
        out = {"Content-Type": content_type}
        if gzip_accepted(headers.get("accept-encoding", "")):
            body = gzip.compress(body, compresslevel=1)
            out["Content-Encoding"] = "gzip"
        return _Reply("200 OK", body, out, head_only=method == "HEAD")


@dataclass(frozen=True, slots=True)
class _Reply:
    status: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    # HEAD: the headers of the GET, without its body.
    head_only: bool = False
