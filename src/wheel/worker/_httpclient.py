"""A lean HTTP/1.1 client on ``asyncio.Protocol``, for the HTTP executor.

One request at a time per connection, connections kept alive and pooled per
(scheme, host, port). It reads the status line and headers (at most
``MAX_HEAD_BYTES`` and ``MAX_HEADERS``), then a body framed by
Content-Length, chunked transfer coding or the connection's close, keeping
at most ``body_limit`` bytes of it: past that the response ends there and
the connection is closed rather than read further, so a response never
makes the worker hold more than the limit.

Why not aiohttp's ``ClientSession``: it costs several times the CPU per
request (``benchmarks/http_client.py`` measures both), and one worker
process must send thousands of requests a second. This client does only
what the executor needs: the caller gives the address to connect to (it
resolved and checked it) and the request's bytes, and a callback that gets
the ``Response`` or the error: no task and no future per request.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "MAX_HEADERS",
    "MAX_HEAD_BYTES",
    "BadResponse",
    "Connection",
    "Disconnected",
    "OnResponse",
    "Pool",
    "Response",
]

MAX_HEAD_BYTES = 65_536
MAX_HEADERS = 100
# An idle connection older than this is closed instead of reused (servers
# commonly close theirs after 5 to 75 s; the race is kept rare).
IDLE_S = 4.0
# Idle connections kept per (scheme, host, port).
MAX_IDLE_PER_KEY = 512

# Parser states.
_HEAD = 0
_LENGTH = 1  # Content-Length body
_CHUNK_SIZE = 2
_CHUNK_DATA = 3
_CHUNK_CRLF = 4
_TRAILERS = 5
_TO_CLOSE = 6  # body until the connection closes
_DONE = 7


# What a request's callback gets: the response, or None and the error.
OnResponse = Callable[["Response | None", "Exception | None"], Any]


class BadResponse(Exception):
    """The server's bytes are not an HTTP/1.1 response this client reads."""


class Disconnected(Exception):
    """The connection closed before a whole response came. ``any_bytes``:
    whether any of the response had come (if not, on a reused connection,
    the server may just have closed it while idle)."""

    def __init__(self, message: str, *, any_bytes: bool) -> None:
        super().__init__(message)
        self.any_bytes = any_bytes


class Response:
    """A response: its status, reason, headers (names lower-cased, in their
    order), at most ``body_limit`` bytes of its body, and whether more came."""

    __slots__ = ("body", "headers", "reason", "status", "truncated")

    def __init__(
        self, status: int, reason: str, headers: list[tuple[str, str]], body: bytes, truncated: bool
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.body = body
        self.truncated = truncated

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


class Connection(asyncio.Protocol):
    """One connection: send a request, get its response (``request``)."""

    def __init__(self, key: tuple[str, str, int], body_limit: int) -> None:
        self.key = key
        self.body_limit = body_limit
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.closed = False
        self.idle_since = 0.0
        self._on_response: OnResponse | None = None
        self._buf = bytearray()
        self._state = _DONE
        self._no_body = False
        self._remaining = 0
        self._keep = True
        self._status = 0
        self._reason = ""
        self._headers: list[tuple[str, str]] = []
        self._body = bytearray()
        self._truncated = False
        self._any = False

    # -- asyncio.Protocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._on_response is None:
            # Bytes nobody asked for: the connection is not reusable.
            self.close()
            return
        self._any = True
        self._buf += data
        try:
            self._parse()
        except BadResponse as exc:
            self._fail(exc)
            self.close()

    def eof_received(self) -> bool | None:
        if self._state == _TO_CLOSE:
            self._end(False)
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._state == _TO_CLOSE:
            self._end(False)
        elif self._on_response is not None:
            why = f": {exc}" if exc else ""
            self._fail(Disconnected(f"the server closed the connection{why}", any_bytes=self._any))

    # -- use ------------------------------------------------------------------------

    def request(self, data: bytes, head_only: bool, on_response: OnResponse) -> None:
        """Send ``data`` (a whole request); ``on_response`` is called once,
        from the loop's I/O callbacks, with the response or the error."""
        assert self.transport is not None and self._on_response is None
        self._on_response = on_response
        self._state = _HEAD
        self._no_body = head_only
        self._any = False
        self._body = bytearray()
        self._truncated = False
        self.transport.write(data)

    def fetch(self, data: bytes, head_only: bool) -> asyncio.Future[Response]:
        """``request`` for a coroutine: a future of the response."""
        waiter: asyncio.Future[Response] = self.loop.create_future()

        def settle(resp: Response | None, exc: Exception | None) -> None:
            if waiter.done():
                return
            if exc is not None:
                waiter.set_exception(exc)
            elif resp is not None:
                waiter.set_result(resp)

        self.request(data, head_only, settle)
        return waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort() if self._on_response is not None else self.transport.close()

    def abandon(self) -> None:
        """The caller stopped waiting (timeout, cancel): the connection's
        state is unknown, so it is closed; its callback is not called."""
        self._on_response = None
        self._state = _DONE
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # -- parsing --------------------------------------------------------------------

    def _parse(self) -> None:
        buf = self._buf
        while True:
            state = self._state
            if self._on_response is None:
                return  # ended (or abandoned): what follows is not this response's
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise BadResponse(f"response headers over {MAX_HEAD_BYTES} bytes")
                    return
                if end > MAX_HEAD_BYTES:
                    raise BadResponse(f"response headers over {MAX_HEAD_BYTES} bytes")
                head = bytes(buf[:end])
                del buf[: end + 4]
                self._on_head(head)
            elif state == _LENGTH:
                if not buf:
                    return
                take = min(len(buf), self._remaining)
                self._add_body(buf, take)
                self._remaining -= take
                if self._state == _DONE:
                    return  # over the limit: ended
                if self._remaining == 0:
                    self._end(self._keep)
                    return
            elif state == _CHUNK_SIZE:
                nl = buf.find(b"\r\n")
                if nl < 0:
                    if len(buf) > 1024:
                        raise BadResponse("a chunk size line over 1024 bytes")
                    return
                line = bytes(buf[:nl]).split(b";", 1)[0].strip()
                del buf[: nl + 2]
                try:
                    size = int(line, 16)
                except ValueError:
                    raise BadResponse(f"bad chunk size {line[:20]!r}") from None
                if size < 0:
                    raise BadResponse(f"bad chunk size {line[:20]!r}")
                if size == 0:
                    self._state = _TRAILERS
                else:
                    self._remaining = size
                    self._state = _CHUNK_DATA
            elif state == _CHUNK_DATA:
                if not buf:
                    return
                take = min(len(buf), self._remaining)
                self._add_body(buf, take)
                self._remaining -= take
                if self._state == _DONE:
                    return  # over the limit: ended
                if self._remaining == 0:
                    self._state = _CHUNK_CRLF
            elif state == _CHUNK_CRLF:
                if len(buf) < 2:
                    return
                if buf[:2] != b"\r\n":
                    raise BadResponse("a chunk not followed by CRLF")
                del buf[:2]
                self._state = _CHUNK_SIZE
            elif state == _TRAILERS:
                nl = buf.find(b"\r\n")
                if nl < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise BadResponse(f"trailers over {MAX_HEAD_BYTES} bytes")
                    return
                del buf[: nl + 2]
                if nl == 0:
                    self._end(self._keep)
                    return
            elif state == _TO_CLOSE:
                if buf:
                    self._add_body(buf, len(buf))
                return
            else:
                return

    def _on_head(self, head: bytes) -> None:
        # One decode for the whole head (latin-1 maps every byte), then str work.
        lines = head.decode("latin-1").split("\r\n")
        status_line = lines[0]
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise BadResponse(f"not an HTTP/1.x status line: {status_line[:60]!r}")
        try:
            status = int(parts[1])
        except ValueError:
            raise BadResponse(f"bad status code {parts[1][:10]!r}") from None
        if not 100 <= status <= 999:
            raise BadResponse(f"bad status code {status}")
        if len(lines) - 1 > MAX_HEADERS:
            raise BadResponse(f"over {MAX_HEADERS} response headers")
        if 100 <= status < 200 and status != 101:
            return  # an interim response (100 Continue, 103 Early Hints): the real one follows
        headers: list[tuple[str, str]] = []
        length = -1
        chunked = False
        keep = parts[0] == "HTTP/1.1"
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise BadResponse(f"a header line without ':': {line[:60]!r}")
            k = name.strip().lower()
            v = value.strip()
            headers.append((k, v))
            if k == "content-length":
                try:
                    length = int(v)
                except ValueError:
                    raise BadResponse(f"bad Content-Length {v[:20]!r}") from None
                if length < 0:
                    raise BadResponse(f"bad Content-Length {v[:20]!r}")
            elif k == "transfer-encoding":
                chunked = v.lower().endswith("chunked")
            elif k == "connection":
                tokens = v.lower()
                if "close" in tokens:
                    keep = False
                elif "keep-alive" in tokens:
                    keep = True
        self._status = status
        self._reason = parts[2] if len(parts) > 2 else ""
        self._headers = headers
        self._keep = keep
        if self._no_body or status in (101, 204, 304) or status < 200:
            self._end(keep and status != 101)
        elif chunked:
            self._state = _CHUNK_SIZE
        elif length >= 0:
            if length == 0:
                self._end(keep)
            else:
                self._remaining = length
                self._state = _LENGTH
        else:
            self._keep = False
            self._state = _TO_CLOSE

    def _add_body(self, buf: bytearray, n: int) -> None:
        room = self.body_limit - len(self._body)
        if n > room:
            self._body += buf[:room]
            self._truncated = True
            buf.clear()
            # The rest is not read: the connection goes.
            self._end(False)
            return
        self._body += buf[:n]
        del buf[:n]

    def _end(self, keep: bool) -> None:
        on_response = self._on_response
        self._on_response = None
        self._state = _DONE
        if not keep or self._buf:
            self.close()
        if on_response is not None:
            # It may send the next request on this connection at once.
            on_response(
                Response(
                    self._status, self._reason, self._headers, bytes(self._body), self._truncated
                ),
                None,
            )

    def _fail(self, exc: Exception) -> None:
        on_response = self._on_response
        self._on_response = None
        self._state = _DONE
        if on_response is not None:
            on_response(None, exc)


class Pool:
    """Idle connections by (scheme, host, port), reused newest first."""

    def __init__(self, body_limit: int, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self.body_limit = body_limit
        self._ssl = ssl_context
        self._idle: dict[tuple[str, str, int], collections.deque[Connection]] = {}
        # Taken and not put back yet: closed with the pool.
        self.busy: set[Connection] = set()
        self.opened = 0

    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def take(self, key: tuple[str, str, int]) -> Connection | None:
        """An idle connection to ``key`` still open, or None."""
        idle = self._idle.get(key)
        if not idle:
            return None
        horizon = time.monotonic() - IDLE_S
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            if conn.idle_since < horizon:
                conn.close()
                # The rest are older still.
                while idle:
                    idle.pop().close()
                return None
            self.busy.add(conn)
            return conn
        return None

    def put(self, conn: Connection) -> None:
        """Back from a request: kept for the next one if it is still open."""
        self.busy.discard(conn)
        if conn.closed:
            return
        conn.idle_since = time.monotonic()
        idle = self._idle.get(conn.key)
        if idle is None:
            idle = self._idle[conn.key] = collections.deque()
        if len(idle) >= MAX_IDLE_PER_KEY:
            idle.popleft().close()
        idle.append(conn)

    async def connect(self, key: tuple[str, str, int], address: str, timeout: float) -> Connection:
        """A new connection to ``address`` (already resolved and checked) for ``key``."""
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        limit = self.body_limit
        factory: Callable[[], Connection] = lambda: Connection(key, limit)  # noqa: E731
        sslctx = self.ssl_context() if scheme == "https" else None
        _, conn = await asyncio.wait_for(
            loop.create_connection(
                factory,
                host=address,
                port=port,
                ssl=sslctx,
                server_hostname=host if sslctx is not None else None,
            ),
            timeout,
        )
        self.opened += 1
        self.busy.add(conn)
        return conn

    def close(self) -> None:
        for idle in self._idle.values():
            while idle:
                idle.pop().close()
        self._idle.clear()
        for conn in list(self.busy):
            conn.abandon()
        self.busy.clear()
