"""A webhook receiver on loopback: the endpoint the HTTP targets' tests and
their benchmark send runs to.

Every request is verified with the Standard Webhooks reference library
(``standardwebhooks``), not with wheel's own signing code, so a request
that verifies here verifies with any receiver built on that library. What
each path answers is scripted (``Receiver.script``): a status, headers, a
delay longer than the caller's timeout, or a hold until the test lets go;
once a path's script is used up it answers 200.

Two ways to run it:

- in the test's process, on a thread of its own (``with Receiver(...) as
  rx``): every request is kept whole (``rx.requests()``);
- as a process of its own (``python -m testkit.webhook_receiver
  --secret-file F``, which prints ``PORT n`` once it listens), for the
  benchmark: it keeps a tally instead (``GET /_receiver/tally``), so
  that its own CPU can be told apart from the node's and the worker's.

In a process it serves with a lean HTTP/1.1 protocol of its own (keep-alive,
Content-Length bodies, every path answered 200) unless told ``--server
aiohttp``: aiohttp's server cost 200-300 µs of CPU a request on the
benchmark's two-core machine, against about 100 µs, and at 2,000 requests a
second it was the slowest process of the run, so that the lag measured was
the receiver's (p99 393 ms against 44 ms, with 1,519 connections opened
against 72, the same wheel). The verdicts are the same either way: both
verify with the reference library.

Paths under ``/_receiver/`` are the receiver's own and are never recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

# Requests longer than this are refused (413): no test or benchmark sends more.
MAX_BODY = 1 << 20
# A held request waits at most this long for ``release``.
MAX_HOLD_S = 60.0
OWN = "/_receiver/"


@dataclass(frozen=True, slots=True, kw_only=True)
class Reply:
    """What a path answers to one request."""

    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b"ok"
    # Wait this long before answering (longer than the caller's timeout: a
    # hung endpoint).
    delay_s: float = 0.0
    # Wait for ``Receiver.release`` (or the client to go away) before answering.
    hold: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Received:
    """One request as it arrived, and whether its signature verified."""

    path: str
    method: str
    # Names lower-cased; a repeated header keeps its last value.
    headers: dict[str, str]
    body: bytes
    received_ms: int
    # The client's port: requests on one keep-alive connection share it.
    peer_port: int
    verified: bool
    # Why it did not verify ("" when it did).
    verify_error: str

    @property
    def webhook_id(self) -> str:
        return self.headers.get("webhook-id", "")

    @property
    def timestamp_s(self) -> int:
        return int(self.headers.get("webhook-timestamp", "0") or 0)

    @property
    def fence(self) -> int:
        return int(self.headers.get("wheel-fence", "0") or 0)

    @property
    def attempt(self) -> int:
        return int(self.headers.get("wheel-attempt", "0") or 0)

    @property
    def scheduled_for_ms(self) -> int:
        """``Wheel-Scheduled-For`` in ms since the epoch (0: absent)."""
        return rfc3339_ms(self.headers.get("wheel-scheduled-for", ""))


def rfc3339_ms(text: str) -> int:
    """An RFC 3339 time (``2026-12-06T12:00:00.123Z``) in ms since the epoch;
    0 when it is empty or not such a time."""
    if not text:
        return 0
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return 0
    if t.tzinfo is None:
        return 0
    return round(t.timestamp() * 1000)


@dataclass(slots=True)
class Tally:
    """What the benchmark needs of every request, in little memory: counts,
    the ids seen, and (fire, scheduled ms, received ms) of each verified
    request. A fire is the integer ``"fire"`` of a JSON body, 0 without one."""

    requests: int = 0
    verified: int = 0
    bad_signatures: int = 0
    duplicates: int = 0
    seen: set[str] = field(default_factory=set)
    peers: set[int] = field(default_factory=set)
    records: list[tuple[int, int, int]] = field(default_factory=list)
    # The first few verification errors, to say what went wrong.
    errors: collections.Counter[str] = field(default_factory=collections.Counter)

    def add(self, r: Received) -> None:
        self.requests += 1
        self.peers.add(r.peer_port)
        if not r.verified:
            self.bad_signatures += 1
            if len(self.errors) < 20:
                self.errors[r.verify_error] += 1
            return
        self.verified += 1
        if r.webhook_id in self.seen:
            self.duplicates += 1
        else:
            self.seen.add(r.webhook_id)
        self.records.append((fire_of(r.body), r.scheduled_for_ms, r.received_ms))

    def summary(self, *, records: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": self.requests,
            "verified": self.verified,
            "bad_signatures": self.bad_signatures,
            "duplicates": self.duplicates,
            "unique_ids": len(self.seen),
            "connections": len(self.peers),
            "errors": dict(self.errors),
        }
        if records:
            out["records"] = self.records
        return out


def fire_of(body: bytes) -> int:
    if not body.startswith(b"{"):
        return 0
    try:
        value = json.loads(body).get("fire", 0)
    except (ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) else 0


class Receiver:
    """An aiohttp server on 127.0.0.1 that verifies, records and answers
    every request as its path's script says (200 once the script is used)."""

    def __init__(self, secrets: Iterable[str] = (), *, keep: bool = True, port: int = 0) -> None:
        """``secrets``: the ``whsec_`` values a signature may be made with (any
        one verifying is enough); ``keep``: keep every request whole (else
        only the tally)."""
        self._webhooks = [Webhook(s) for s in secrets]
        self._keep = keep
        self._want_port = port
        self._scripts: dict[str, collections.deque[Reply]] = {}
        self._received: list[Received] = []
        self.tally = Tally()
        self._cond = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._release: asyncio.Event | None = None
        self.port = 0

    # -- set-up --------------------------------------------------------------------

    def add_secret(self, secret: str) -> None:
        """Accept signatures made with this ``whsec_`` secret too."""
        self._webhooks = [*self._webhooks, Webhook(secret)]

    def script(self, path: str, *replies: Reply) -> None:
        """``path``'s next answers, in order; after them, 200."""
        with self._cond:
            self._scripts.setdefault(path, collections.deque()).extend(replies)

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def release(self) -> None:
        """Let every held request (and any held later) answer."""
        loop, event = self._loop, self._release
        if loop is not None and event is not None:
            loop.call_soon_threadsafe(event.set)

    # -- what arrived ----------------------------------------------------------------

    def requests(self, path: str | None = None) -> list[Received]:
        with self._cond:
            return [r for r in self._received if path is None or r.path == path]

    def wait_requests(self, path: str | None, count: int, timeout: float) -> list[Received]:
        """The first ``count`` requests to ``path`` (any path: None), once
        they have arrived; AssertionError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                got = [r for r in self._received if path is None or r.path == path]
                if len(got) >= count:
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"{len(got)} of {count} requests to {path or 'any path'} after {timeout} s"
                    )
                self._cond.wait(left)

    # -- serving ---------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_get(OWN + "tally", self._tally)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def serve(self) -> None:
        """Listen (in the running loop) until ``close``."""
        self._loop = asyncio.get_running_loop()
        self._release = asyncio.Event()
        # Quiet: an access log line per request costs the benchmark's receiver.
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self._want_port, backlog=1024)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def close(self) -> None:
        if self._release is not None:
            self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def start(self) -> Receiver:
        """Serve on a thread of its own; returns once it listens."""
        ready = threading.Event()
        failed: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(self.serve())
            except BaseException as exc:  # pragma: no cover - reported to start()
                failed.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.close())
            loop.close()

        self._thread = threading.Thread(target=main, name="webhook-receiver", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failed:
            raise failed[0]
        if not self.port:
            raise RuntimeError("the webhook receiver did not start")
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- handlers ----------------------------------------------------------------------

    def _verify(self, body: bytes, headers: dict[str, str]) -> str:
        """'' when one of the secrets verifies the request, else why not."""
        if not self._webhooks:
            return "the receiver has no secret"
        error = ""
        for webhook in self._webhooks:
            try:
                webhook.verify(body, headers, json_parse=False)
            except WebhookVerificationError as exc:
                error = str(exc) or type(exc).__name__
            else:
                return ""
        return error

    def _record(
        self, path: str, method: str, headers: dict[str, str], body: bytes, peer_port: int
    ) -> Reply:
        """Verify and note one request (``headers`` lower-cased); its reply."""
        received_ms = time.time_ns() // 1_000_000
        error = self._verify(body, headers)
        r = Received(
            path=path,
            method=method,
            headers=headers,
            body=body,
            received_ms=received_ms,
            peer_port=peer_port,
            verified=not error,
            verify_error=error,
        )
        with self._cond:
            self.tally.add(r)
            if self._keep:
                self._received.append(r)
            script = self._scripts.get(path)
            reply = script.popleft() if script else Reply()
            self._cond.notify_all()
        return reply

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        peer = request.transport.get_extra_info("peername") if request.transport else None
        reply = self._record(
            request.path, request.method, headers, body, int(peer[1]) if peer else 0
        )
        if reply.hold and self._release is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._release.wait(), MAX_HOLD_S)
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        return web.Response(status=reply.status, headers=dict(reply.headers), body=reply.body)

    async def _tally(self, request: web.Request) -> web.Response:
        return web.json_response(self.tally_answer(request.query.get("records") == "1"))

    def tally_answer(self, records: bool) -> dict[str, Any]:
        with self._cond:
            return self.tally.summary(records=records)

    async def serve_lean(self) -> asyncio.Server:
        """Listen with ``LeanProtocol`` (in the running loop); its server."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: LeanProtocol(self), "127.0.0.1", self._want_port, backlog=1024
        )
        self.port = int(server.sockets[0].getsockname()[1])
        return server


class LeanProtocol(asyncio.Protocol):
    """HTTP/1.1 as the HTTP executor speaks it, and no more: requests with a
    Content-Length body (or none), kept alive, answered in order; every path
    as the receiver's script says, at once (no delays or holds: those are
    the aiohttp server's). A request it cannot read (a chunked body, a head
    over 64 KiB) gets a 400 and the connection is closed."""

    MAX_HEAD = 65_536

    def __init__(self, receiver: Receiver) -> None:
        self._receiver = receiver
        self._buf = b""
        self._peer_port = 0
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self._peer_port = int(peer[1]) if peer else 0

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        close = False
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                close = len(buf) > self.MAX_HEAD
                if close:
                    out.append(_answer(400, (), b"request head too large", close=True))
                break
            lines = buf[:end].decode("latin-1").split("\r\n")
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            try:
                method, target, _ = lines[0].split(" ", 2)
                length = int(headers.get("content-length", "0"))
            except ValueError:
                length = -1
            if length < 0 or "transfer-encoding" in headers:
                out.append(_answer(400, (), b"give a Content-Length body", close=True))
                close = True
                break
            if len(buf) < end + 4 + length:
                break
            body = buf[end + 4 : end + 4 + length]
            buf = buf[end + 4 + length :]
            path, _, query = target.partition("?")
            if path == OWN + "tally":
                answer = json.dumps(self._receiver.tally_answer("records=1" in query)).encode()
                out.append(_answer(200, (("Content-Type", "application/json"),), answer))
            else:
                reply = self._receiver._record(path, method, headers, body, self._peer_port)
                out.append(_answer(reply.status, reply.headers, reply.body))
            if headers.get("connection", "").lower() == "close":
                close = True
                break
        self._buf = b"" if close else buf
        if self._transport is not None:
            if out:
                self._transport.write(b"".join(out))
            if close:
                self._transport.close()


def _answer(
    status: int, headers: Iterable[tuple[str, str]], body: bytes, *, close: bool = False
) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    head = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}"]
    head += [f"{name}: {value}" for name, value in headers]
    if close:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def fetch_tally(port: int, *, records: bool = False, timeout: float = 30) -> dict[str, Any]:
    """The tally of a receiver process listening on ``port``."""
    import urllib.request

    url = f"http://127.0.0.1:{port}{OWN}tally?records={int(records)}"
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        out: dict[str, Any] = json.loads(resp.read())
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--secret-file",
        type=Path,
        action="append",
        default=[],
        help="a file holding a whsec_ secret that signs requests (again for more)",
    )
    p.add_argument("--port", type=int, default=0, help="the port to listen on (0: any free one)")
    p.add_argument(
        "--server",
        choices=["lean", "aiohttp"],
        default="lean",
        help="the HTTP/1.1 server: a lean protocol of its own (the default) or aiohttp's",
    )
    ns = p.parse_args(argv)
    secrets = [f.read_text().strip() for f in ns.secret_file]
    receiver = Receiver(secrets, keep=False, port=ns.port)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if ns.server == "aiohttp":
            await receiver.serve()
        else:
            server = await receiver.serve_lean()
        print(f"PORT {receiver.port}", flush=True)
        await stop.wait()
        if ns.server == "aiohttp":
            await receiver.close()
        else:
            server.close()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
