"""The executor's HTTP/1.1 client against raw asyncio servers on loopback
that write exactly the bytes a test gives: framing by Content-Length, by
chunks and by the connection's close, bytes split anywhere, interim
responses, bounds on headers, broken responses, and a kept-alive
connection the server closed while it was idle."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from tests.worker.scripted import scenario
from tests.worker.test_http import call, executor
from wheel.rpc.v1 import worker_service_pb2 as pb

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw(serve: Serve) -> AsyncIterator[tuple[str, list[int]]]:
    """A server running ``serve`` on each connection; its URL and the count
    of connections it took."""
    conns = [0]

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        conns[0] += 1
        try:
            await serve(r, w)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/x", conns
    finally:
        server.close()


async def read_request(r: asyncio.StreamReader) -> bytes:
    head = await r.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await r.readexactly(length)
    return head


def replies(*pieces: bytes, delay: float = 0.01, keep: bool = False) -> Serve:
    """Answer each request with ``pieces``, written one by one with a pause
    between (so the client gets them as separate reads)."""

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await read_request(r)
            for piece in pieces:
                w.write(piece)
                await w.drain()
                await asyncio.sleep(delay)
            if not keep:
                return

    return serve


def test_bodies_framed_each_way_and_split_anywhere_are_read_whole() -> None:
    async def go() -> None:
        cases = {
            "length": replies(b"HTTP/1.1 200 OK\r\nContent-Le", b"ngth: 5\r\n\r\nhe", b"llo"),
            "chunked": replies(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhe",
                b"l\r\n2;ext=1\r\nlo\r\n0\r\nTrailer: x\r\n\r\n",
            ),
            "to_close": replies(b"HTTP/1.1 200 OK\r\n\r\nhel", b"lo"),
            "interim": replies(
                b"HTTP/1.1 100 Continue\r\n\r\n",
                b"HTTP/1.1 201 Created\r\nContent-Length: 5\r\n\r\nhello",
            ),
            "http10": replies(b"HTTP/1.0 200 OK\r\n\r\nhello"),
        }
        async with executor() as ex:
            for name, serve in cases.items():
                async with raw(serve) as (url, _):
                    c, result = await ex.run(call(url))
                assert c.outcome == pb.OUTCOME_SUCCEEDED, (name, c.error)
                assert result["response_excerpt"] == "hello", name

    scenario(go)


def test_kept_alive_connections_are_reused_and_one_closed_while_idle_is_replaced() -> None:
    async def go() -> None:
        ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

        async def close_on_the_second(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            # The first connection answers one request, then takes the next
            # and closes without a word, as a server whose idle timeout ran
            # out just as the request came; the next connections answer all.
            first = conns[0] == 1
            while True:
                await read_request(r)
                if first and seen[0] == 1:
                    seen[0] += 1
                    return
                seen[0] += 1
                w.write(ok)
                await w.drain()

        seen = [0]

        async with executor() as ex:
            async with raw(replies(ok, keep=True)) as (url, conns):
                for _ in range(5):
                    c, _ = await ex.run(call(url))
                    assert c.outcome == pb.OUTCOME_SUCCEEDED
                assert conns[0] == 1
            async with raw(close_on_the_second) as (url, conns):
                for _ in range(3):
                    c, _ = await ex.run(call(url))
                    assert c.outcome == pb.OUTCOME_SUCCEEDED, c.error
                # The second request went again on a new connection, once.
                assert (conns[0], seen[0]) == (2, 4)

    scenario(go)


def test_broken_responses_are_retryable_errors_that_say_what_was_wrong() -> None:
    async def go() -> None:
        cases = {
            "not http": (replies(b"SSH-2.0-OpenSSH\r\n\r\n"), "not an HTTP/1.x status line"),
            "bad length": (
                replies(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"),
                "bad Content-Length 'x'",
            ),
            "bad chunk": (
                replies(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
                "bad chunk size b'zz'",
            ),
            "huge head": (
                replies(b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n"),
                "response headers over 65536 bytes",
            ),
            "many headers": (
                replies(b"HTTP/1.1 200 OK\r\n" + b"X: 1\r\n" * 101 + b"\r\n"),
                "over 100 response headers",
            ),
            "cut short": (
                replies(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"),
                "the server closed the connection",
            ),
            "silent close": (replies(), "the server closed the connection"),
        }
        async with executor() as ex:
            for name, (serve, says) in cases.items():
                async with raw(serve) as (url, _):
                    c, result = await ex.run(call(url))
                assert c.outcome == pb.OUTCOME_RETRYABLE, name
                assert result["error"] == c.error
                assert c.error.startswith("127.0.0.1:"), (name, c.error)
                assert says in c.error, (name, c.error)

    scenario(go)
