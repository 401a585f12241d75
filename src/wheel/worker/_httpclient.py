"""A lean HTTP/1.1 client on ``asyncio.Protocol``, for the HTTP executor.

One request at a time per connection, connections kept alive and pooled per
(scheme, host, port), at most ``limit`` of them open per (scheme, host, port):
a request that finds none idle and no room for another waits its turn (FIFO)
for the next one put back or closed. It reads the status line and headers (at most
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
from typing import Any, Protocol

__all__ = [
    "MAX_HEADERS",
    "MAX_HEAD_BYTES",
    "BadResponse",
    "Connection",
    "Disconnected",
    "OnResponse",
    "Pool",
    "Response",
    "Waiter",
]

MAX_HEAD_BYTES = 65_536
MAX_HEADERS = 100
# An idle connection older than this is closed instead of reused (servers
# commonly close theirs after 5 to 75 s; the race is kept rare).
IDLE_S = 4.0
# Connections open at once per (scheme, host, port), busy or idle, by default.
DEFAULT_CONNECTIONS_PER_ORIGIN = 64

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

    def __init__(
        self,
        key: tuple[str, str, int],
        body_limit: int,
        on_gone: Callable[[Connection], object] | None = None,
    ) -> None:
        self.key = key
        self.body_limit = body_limit
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.closed = False
        # Told once when the connection closed, however it closed: its pool's
        # count of open connections.
        self.on_gone = on_gone
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
        self._gone()
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
        self._gone()
        if self.transport is not None:
            self.transport.abort() if self._on_response is not None else self.transport.close()

    def _gone(self) -> None:
        self.closed = True
        on_gone = self.on_gone
        if on_gone is not None:
            self.on_gone = None
            on_gone(self)

    def abandon(self) -> None:
        """The caller stopped waiting (timeout, cancel): the connection's
        state is unknown, so it is closed; its callback is not called."""
        self._on_response = None
        self._state = _DONE
        self._gone()
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


class Waiter(Protocol):
    """A request waiting for a connection (``Pool.wait``): ``granted`` is
    called once with a connection handed over, or with None when there is
    room to open one (the room is counted for it). One that stopped waiting
    (its timeout) says so with ``live`` False and is skipped."""

    @property
    def live(self) -> bool: ...

    def granted(self, conn: Connection | None) -> None: ...


class _FutureWaiter:
    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[Connection | None]) -> None:
        self.future = future

    @property
    def live(self) -> bool:
        return not self.future.done()

    def granted(self, conn: Connection | None) -> None:
        self.future.set_result(conn)


class Pool:
    """Connections by (scheme, host, port): idle ones reused newest first, at
    most ``limit`` open per key (busy, idle or being opened), and the
    requests waiting for one, first come first served.

    The count per key goes up when a connection is to be opened (``room`` or
    a ``Waiter`` granted None) and down when one closes, however it closed,
    or when opening one failed (``unopened``). A connection put back goes to
    the first live waiter of its key before it may idle; room freed goes to
    the first live waiter too, so a new request never overtakes a waiting one.
    """

    def __init__(
        self,
        body_limit: int,
        *,
        limit: int = DEFAULT_CONNECTIONS_PER_ORIGIN,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError(f"limit: {limit}; give at least 1 connection per origin")
        self.body_limit = body_limit
        self.limit = limit
        self._ssl = ssl_context
        self._idle: dict[tuple[str, str, int], collections.deque[Connection]] = {}
        self._open: dict[tuple[str, str, int], int] = {}
        self._waiters: dict[tuple[str, str, int], collections.deque[Waiter]] = {}
        # Taken and not put back yet: closed with the pool.
        self.busy: set[Connection] = set()
        self.opened = 0

    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def open_count(self, key: tuple[str, str, int]) -> int:
        """Connections to ``key`` open or being opened."""
        return self._open.get(key, 0)

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

    def room(self, key: tuple[str, str, int]) -> bool:
        """Whether a connection to ``key`` may be opened now (nobody waits for
        one and the key is under its limit); if so it is counted from now."""
        queue = self._waiters.get(key)
        if queue:
            # Ones that stopped waiting hold no place.
            while queue and not queue[0].live:
                queue.popleft()
            if queue:
                return False
        if self._open.get(key, 0) >= self.limit:
            return False
        self._open[key] = self._open.get(key, 0) + 1
        return True

    def wait(self, key: tuple[str, str, int], waiter: Waiter) -> None:
        """Queue ``waiter`` for the next connection or room for ``key``."""
        queue = self._waiters.get(key)
        if queue is None:
            queue = self._waiters[key] = collections.deque()
        queue.append(waiter)

    async def acquire(
        self, key: tuple[str, str, int], deadline: float, *, idle: bool = True
    ) -> Connection | None:
        """An idle connection (if ``idle``), or None with room counted to
        open one, or else the next connection put back or room freed,
        waiting until loop time ``deadline`` at most (then ``TimeoutError``)."""
        conn = self.take(key) if idle else None
        if conn is not None:
            return conn
        if self.room(key):
            return None
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Connection | None] = loop.create_future()
        self.wait(key, _FutureWaiter(future))
        timer = loop.call_at(deadline, _expire, future)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                # Granted just as it was cancelled: not to be lost.
                self._regrant(key, future.result())
            raise
        finally:
            timer.cancel()

    def _regrant(self, key: tuple[str, str, int], conn: Connection | None) -> None:
        if conn is not None:
            self.put(conn)
        else:
            self.unopened(key)

    def unopened(self, key: tuple[str, str, int]) -> None:
        """Room counted for ``key`` went unused (opening failed)."""
        self._open[key] -= 1
        self._next_room(key)

    def _next_waiter(self, key: tuple[str, str, int]) -> Waiter | None:
        queue = self._waiters.get(key)
        while queue:
            waiter = queue.popleft()
            if waiter.live:
                return waiter
        if queue is not None:
            del self._waiters[key]
        return None

    def _next_room(self, key: tuple[str, str, int]) -> None:
        if self._open.get(key, 0) >= self.limit:
            return
        waiter = self._next_waiter(key)
        if waiter is not None:
            self._open[key] += 1
            waiter.granted(None)

    def _gone(self, conn: Connection) -> None:
        self.busy.discard(conn)
        self._open[conn.key] -= 1
        self._next_room(conn.key)

    def put(self, conn: Connection) -> None:
        """Back from a request: to the first waiter, else kept for the next
        request if it is still open."""
        self.busy.discard(conn)
        if conn.closed:
            return
        waiter = self._next_waiter(conn.key)
        if waiter is not None:
            self.busy.add(conn)
            waiter.granted(conn)
            return
        conn.idle_since = time.monotonic()
        idle = self._idle.get(conn.key)
        if idle is None:
            idle = self._idle[conn.key] = collections.deque()
        idle.append(conn)

    async def connect(self, key: tuple[str, str, int], address: str, timeout: float) -> Connection:
        """A new connection to ``address`` (already resolved and checked) for
        ``key``, in room counted for it (``room``, ``acquire``): if this
        raises, the caller tries another address in that room or gives it
        back (``unopened``)."""
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
        if conn.closed:
            raise ConnectionResetError("the connection closed as soon as it was made")
        # Counted from here by its closing; until here by the caller, who
        # gives the room back (``unopened``) if no connection came of it.
        conn.on_gone = self._gone
        self.opened += 1
        self.busy.add(conn)
        return conn

    def close(self) -> None:
        self._waiters.clear()
        for idle in self._idle.values():
            while idle:
                idle.pop().close()
        self._idle.clear()
        for conn in list(self.busy):
            conn.abandon()
        self.busy.clear()


def _expire(future: asyncio.Future[Connection | None]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())
