"""The built-in ``http`` handler: a worker run with ``http=True`` sends the
requests of runs whose payload is an ``HttpCall`` to a real HTTP server on
loopback, and reports outcome, result and Retry-After to a scripted node
over real gRPC (``tests.worker.scripted``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any

import pytest
import standardwebhooks
from aiohttp import web

from testkit.services import free_port
from tests.worker.scripted import Conn, assign, assignment, node, running, scenario
from wheel import webhooks
from wheel.errors import InvalidArgument
from wheel.rpc.v1 import jobs_pb2
from wheel.rpc.v1 import worker_service_pb2 as pb
from wheel.worker import Worker
from wheel.worker._http import (
    EXCERPT_BYTES,
    outcome_of_status,
    refusal,
    retry_after_ms,
)

# -- a real HTTP server on loopback ----------------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    peer: Any


Route = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Receiver:
    url: str
    routes: dict[str, Route]
    seen: list[Seen] = field(default_factory=list)

    def on(self, path: str, route: Route) -> str:
        self.routes[path] = route
        return self.url + path


async def _ok(request: web.Request) -> web.StreamResponse:
    return web.Response(text="fine", headers={"X-Request-Id": "r-1", "X-Other": "dropped"})


@contextlib.asynccontextmanager
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver("", {"/ok": _ok})

    async def dispatch(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        rec.seen.append(Seen(request.method, request.path_qs, dict(request.headers), body, peer))
        route = rec.routes.get(request.path)
        if route is None:
            return web.Response(status=404, text="no such route")
        return await route(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", dispatch)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    rec.url = f"http://127.0.0.1:{port}"
    try:
        yield rec
    finally:
        await runner.cleanup()


# -- a worker with the executor, fed by a scripted node --------------------------------


def call(url: str, body: bytes = b"", **target: Any) -> bytes:
    headers = target.pop("headers", {})
    t = jobs_pb2.HttpTarget(url=url, **target)
    for name, value in headers.items():
        t.headers.add(name=name, value=value)
    payload: bytes = jobs_pb2.HttpCall(target=t, body=body).SerializeToString()
    return payload


@dataclass
class Executor:
    conn: Conn
    worker: Worker
    next_id: int = 1

    async def run(
        self, payload: bytes, *, timeout: float = 10.0, **kw: Any
    ) -> tuple[pb.Completion, dict[str, Any]]:
        """One run of ``payload`` (more Assignment fields in ``kw``); its
        completion and its result parsed."""
        run_id = self.next_id
        self.next_id += 1
        kw.setdefault("idempotency_key", f"fire-{run_id}")
        assign(self.conn, assignment(run_id, "http", payload=payload, **kw))
        async with asyncio.timeout(timeout):
            while run_id not in (done := self.conn.completions()):
                await asyncio.sleep(0.005)
        c = done[run_id]
        return c, json.loads(c.result_json) if c.result_json else {}


@contextlib.asynccontextmanager
async def executor(
    *, allow_private: bool = True, capacity: int = 64, connections: int = 64
) -> AsyncIterator[Executor]:
    async with node() as (svc, target):
        w = Worker(
            target,
            http=True,
            allow_private_targets=allow_private,
            capacity=capacity,
            http_connections_per_origin=connections,
        )
        async with running(w):
            conn, hello = await svc.accept()
            assert list(hello.handlers) == ["http"]
            yield Executor(conn, w)


# -- outcomes by status ----------------------------------------------------------------


def test_a_2xx_succeeds_with_the_status_headers_and_body_excerpt_as_its_result() -> None:
    async def go() -> None:
        async with receiver() as rec, executor() as ex:
            c, result = await ex.run(
                call(rec.url + "/ok?x=1", b'{"a": 1}', headers={"X-Team": "blue"}),
                attempt=3,
                fence=4242,
                scheduled_for_ms=1_796_558_400_123,
            )
        assert c.outcome == pb.OUTCOME_SUCCEEDED, c.error
        assert c.error == "" and c.retry_after_ms == 0
        assert result["http_status"] == 200
        assert result["response_excerpt"] == "fine"
        assert result["response_headers"] == {
            "content-type": "text/plain; charset=utf-8",
            "content-length": "4",
            "x-request-id": "r-1",
        }
        assert 0 <= result["duration_ms"] < 5_000
        (seen,) = rec.seen
        assert (seen.method, seen.path, seen.body) == ("POST", "/ok?x=1", b'{"a": 1}')
        h = seen.headers
        assert h["X-Team"] == "blue"
        assert h["Idempotency-Key"] == "fire-1"
        assert h["Wheel-Fence"] == "4242"
        assert h["Wheel-Attempt"] == "3"
        assert h["Wheel-Scheduled-For"] == "2026-12-06T12:00:00.123Z"
        assert h["Content-Length"] == "8"
        assert h["User-Agent"].startswith("wheel/")
        assert "webhook-signature" not in {k.lower() for k in h}

    scenario(go)


def test_status_5xx_408_and_429_are_retryable_and_other_4xx_fail_for_good() -> None:
    async def go() -> None:
        async def status(request: web.Request) -> web.StreamResponse:
            return web.Response(status=int(request.query["s"]), text="nope")

        async with receiver() as rec, executor() as ex:
            url = rec.on("/status", status)
            got = {}
            for s in (503, 500, 408, 429, 404, 400, 410):
                c, result = await ex.run(call(f"{url}?s={s}"))
                got[s] = (c.outcome, c.error, result["http_status"])
            c, _ = await ex.run(call(f"{url}?s=404", retry_4xx=True))
            retried_404 = c.outcome
            c, _ = await ex.run(call(f"{url}?s=503", method="GET"))
        R, F = pb.OUTCOME_RETRYABLE, pb.OUTCOME_FAILED
        assert got == {
            503: (R, "HTTP 503 Service Unavailable", 503),
            500: (R, "HTTP 500 Internal Server Error", 500),
            408: (R, "HTTP 408 Request Timeout", 408),
            429: (R, "HTTP 429 Too Many Requests", 429),
            404: (F, "HTTP 404 Not Found", 404),
            400: (F, "HTTP 400 Bad Request", 400),
            410: (F, "HTTP 410 Gone", 410),
        }
        assert retried_404 == R
        assert rec.seen[-1].method == "GET" and "Content-Length" not in rec.seen[-1].headers

    scenario(go)


def test_retry_after_in_seconds_or_as_an_http_date_sets_the_least_wait() -> None:
    async def go() -> None:
        async def busy(request: web.Request) -> web.StreamResponse:
            return web.Response(status=429, headers={"Retry-After": request.query["ra"]})

        async with receiver() as rec, executor() as ex:
            url = rec.on("/busy", busy)
            c, result = await ex.run(call(f"{url}?ra=2"))
            assert c.outcome == pb.OUTCOME_RETRYABLE
            assert c.retry_after_ms == 2_000
            assert c.error == "HTTP 429 Too Many Requests (Retry-After 2 s)"
            assert result["response_headers"]["retry-after"] == "2"
            date = formatdate(time.time() + 30, usegmt=True)
            c, _ = await ex.run(call(f"{url}?ra={urllib.parse.quote(date)}"))
            assert 28_000 <= c.retry_after_ms <= 30_000, c.retry_after_ms

    scenario(go)


def test_retry_after_parsing() -> None:
    now = 1_800_000_000.0
    assert retry_after_ms("120", now) == 120_000
    assert retry_after_ms(" 0 ", now) == 0
    assert retry_after_ms(formatdate(now + 10, usegmt=True), now) == 10_000
    assert retry_after_ms(formatdate(now - 10, usegmt=True), now) == 0
    assert retry_after_ms("soon", now) == 0
    assert retry_after_ms("-5", now) == 0
    assert retry_after_ms(None, now) == 0
    assert retry_after_ms("99999999999", now) == 24 * 3600 * 1000


def test_outcome_of_each_status_class() -> None:
    R, F, S = pb.OUTCOME_RETRYABLE, pb.OUTCOME_FAILED, pb.OUTCOME_SUCCEEDED
    assert [outcome_of_status(s, False) for s in (200, 204, 299)] == [S, S, S]
    assert [outcome_of_status(s, False) for s in (301, 404, 408, 429, 500, 599)] == [
        F,
        F,
        R,
        R,
        R,
        R,
    ]
    assert outcome_of_status(404, True) == R
    assert outcome_of_status(302, True) == F


def test_a_redirect_fails_naming_its_location_unless_the_job_follows_redirects() -> None:
    async def go() -> None:
        async def moved(request: web.Request) -> web.StreamResponse:
            return web.Response(status=int(request.query["s"]), headers={"Location": "/ok"})

        async def loop_(request: web.Request) -> web.StreamResponse:
            return web.Response(status=307, headers={"Location": "/loop"})

        async with receiver() as rec, executor() as ex:
            url = rec.on("/moved", moved)
            c, result = await ex.run(call(f"{url}?s=302"))
            assert c.outcome == pb.OUTCOME_FAILED
            assert c.error == (
                "HTTP 302 Found: redirected to /ok (the job does not follow redirects)"
            )
            assert result["response_headers"]["location"] == "/ok"
            n = len(rec.seen)
            c, result = await ex.run(call(f"{url}?s=303", b"data", follow_redirects=True))
            assert c.outcome == pb.OUTCOME_SUCCEEDED, c.error
            assert result["redirects"] == 1 and result["url"] == rec.url + "/ok"
            # 303: the next hop is a GET without the body.
            assert [(s.method, s.path, s.body) for s in rec.seen[n:]] == [
                ("POST", "/moved?s=303", b"data"),
                ("GET", "/ok", b""),
            ]
            n = len(rec.seen)
            await ex.run(call(f"{url}?s=307", b"data", follow_redirects=True))
            assert [(s.method, s.body) for s in rec.seen[n:]] == [("POST", b"data")] * 2
            rec.on("/loop", loop_)
            c, _ = await ex.run(call(rec.url + "/loop", follow_redirects=True))
            assert c.outcome == pb.OUTCOME_FAILED
            assert c.error.endswith("redirected to /loop (after 5 redirects)"), c.error

    scenario(go)


# -- no response -----------------------------------------------------------------------


def test_a_hung_endpoint_times_out_retryable_within_the_targets_timeout() -> None:
    async def go() -> None:
        hang = asyncio.Event()

        async def hung(request: web.Request) -> web.StreamResponse:
            await hang.wait()
            return web.Response()

        async with receiver() as rec, executor() as ex:
            url = rec.on("/hung", hung)
            # On a new connection, then on one kept alive from an earlier run.
            for first in (None, rec.url + "/ok"):
                if first is not None:
                    c, _ = await ex.run(call(first))
                    assert c.outcome == pb.OUTCOME_SUCCEEDED
                t0 = time.monotonic()
                c, result = await ex.run(call(url, timeout_ms=300))
                took = time.monotonic() - t0
                assert c.outcome == pb.OUTCOME_RETRYABLE
                assert c.error == "timed out after 0.3 s"
                assert result["error"] == c.error and 250 <= result["duration_ms"] < 2_000
                assert 0.25 < took < 2.0
            # The timed-out connections were dropped, not reused.
            c, _ = await ex.run(call(rec.url + "/ok"))
            assert c.outcome == pb.OUTCOME_SUCCEEDED
            hang.set()

    scenario(go)


def test_a_refused_connection_is_retryable_and_names_the_address() -> None:
    async def go() -> None:
        port = free_port()  # a port nobody listens on
        async with executor() as ex:
            c, result = await ex.run(call(f"http://127.0.0.1:{port}/x"))
        assert c.outcome == pb.OUTCOME_RETRYABLE
        assert c.error == f"connect to 127.0.0.1:{port} refused"
        assert set(result) == {"error", "duration_ms"}

    scenario(go)


def test_a_sign_error_sends_nothing_and_is_retryable() -> None:
    async def go() -> None:
        async with receiver() as rec, executor() as ex:
            c, result = await ex.run(
                call(rec.url + "/ok"), sign_error="secret 'hooks' of tenant 'a' is unknown"
            )
        assert c.outcome == pb.OUTCOME_RETRYABLE
        assert c.error == (
            "not sent: the request could not be signed: secret 'hooks' of tenant 'a' is unknown"
        )
        assert result["error"] == c.error
        assert rec.seen == []

    scenario(go)


def test_a_payload_that_is_no_target_fails_for_good() -> None:
    async def go() -> None:
        async with executor() as ex:
            c1, _ = await ex.run(b"\xff\xff not a message")
            c2, _ = await ex.run(call("ftp://example.com/x"))
            c3, _ = await ex.run(call("http://example.com/x", headers={"X-A": "1\r\nX-B: 2"}))
        assert c1.outcome == c2.outcome == c3.outcome == pb.OUTCOME_FAILED
        assert "not an HttpCall" in c1.error
        assert c2.error == "bad HTTP target: url: scheme 'ftp'; give http or https"
        assert c3.error == "bad HTTP target: headers: 'X-A' is not a valid header"

    scenario(go)


# -- private targets -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "a loopback"),
        ("::1", "a loopback"),
        ("10.0.0.5", "a private"),
        ("172.16.3.4", "a private"),
        ("192.168.1.1", "a private"),
        ("fd12::1", "a private"),
        ("169.254.169.254", "a link-local"),
        ("fe80::1", "a link-local"),
        ("0.0.0.0", "an unspecified"),
        ("::", "an unspecified"),
        ("224.0.0.1", "a multicast"),
        ("ff02::1", "a multicast"),
        ("100.64.0.1", "a shared (carrier-grade NAT)"),
        ("240.0.0.1", "a reserved"),
        ("::ffff:127.0.0.1", "a loopback"),
        ("::ffff:10.1.2.3", "a private"),
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
    ],
)
def test_which_addresses_are_refused(address: str, why: str | None) -> None:
    assert refusal(address) == why


def test_loopback_is_refused_without_allow_private_targets_also_behind_a_name() -> None:
    async def go() -> None:
        async with receiver() as rec, executor(allow_private=False) as ex:
            port = rec.url.rsplit(":", 1)[1]
            c1, r1 = await ex.run(call(rec.url + "/ok"))
            c2, _ = await ex.run(call(f"http://localhost:{port}/ok"))
            c3, _ = await ex.run(call("http://169.254.169.254/latest/meta-data/"))
        assert c1.outcome == c2.outcome == c3.outcome == pb.OUTCOME_FAILED
        hint = "run the worker with --allow-private-targets"
        assert c1.error == f"refused: 127.0.0.1 is a loopback address; {hint}"
        assert c2.error.startswith("refused: localhost resolves to "), c2.error
        assert c2.error.endswith(f", a loopback address; {hint}"), c2.error
        assert c3.error == f"refused: 169.254.169.254 is a link-local address; {hint}"
        assert r1["error"] == c1.error
        assert rec.seen == []

    scenario(go)


# -- bodies and connections ------------------------------------------------------------


def test_a_huge_body_is_cut_at_the_limit_and_its_connection_dropped() -> None:
    async def go() -> None:
        written = [0]
        total = 64 * 1024 * 1024

        async def huge(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"Content-Length": str(total)})
            await resp.prepare(request)
            chunk = b"x" * 65_536
            with contextlib.suppress(ConnectionError):
                while written[0] < total:
                    await resp.write(chunk)
                    written[0] += len(chunk)
            return resp

        async with receiver() as rec, executor() as ex:
            url = rec.on("/huge", huge)
            c, result = await ex.run(call(url))
            await asyncio.sleep(0.2)
        assert c.outcome == pb.OUTCOME_SUCCEEDED
        assert result["response_excerpt"] == "x" * EXCERPT_BYTES
        assert result["excerpt_truncated"] is True
        # The worker stopped reading: the server could not send it all.
        assert written[0] < total

    scenario(go)


def test_chunked_responses_are_read_and_the_excerpt_is_the_first_4_kib() -> None:
    async def go() -> None:
        async def chunked(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for i in range(10):
                await resp.write(str(i).encode() * 1000)
            await resp.write_eof()
            return resp

        async def small(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            await resp.write("caf\u00e9 ".encode())
            await resp.write(b"\xff ok")
            await resp.write_eof()
            return resp

        async with receiver() as rec, executor() as ex:
            c, result = await ex.run(call(rec.on("/chunked", chunked)))
            c2, result2 = await ex.run(call(rec.on("/small", small)))
            c3, _ = await ex.run(call(rec.url + "/ok"))
        assert c.outcome == c2.outcome == c3.outcome == pb.OUTCOME_SUCCEEDED
        assert (
            result["response_excerpt"]
            == "0" * 1000 + "1" * 1000 + "2" * 1000 + "3" * 1000 + "4" * 96
        )
        assert result["excerpt_truncated"] is True
        assert result2["response_excerpt"] == "caf\u00e9 \ufffd ok"
        assert "excerpt_truncated" not in result2
        # The connection was kept after the chunked bodies.
        assert len({s.peer for s in rec.seen}) == 1

    scenario(go)


def test_many_requests_reuse_one_kept_alive_connection() -> None:
    async def go() -> None:
        async with receiver() as rec, executor() as ex:
            for _ in range(20):
                c, _ = await ex.run(call(rec.url + "/ok"))
                assert c.outcome == pb.OUTCOME_SUCCEEDED
            assert ex.worker._http is not None
            opened = ex.worker._http.pool.opened
        assert len(rec.seen) == 20
        assert len({s.peer for s in rec.seen}) == 1
        assert opened == 1

    scenario(go)


def test_requests_in_flight_at_once_each_get_a_connection() -> None:
    async def go() -> None:
        arrived = 0
        release = asyncio.Event()

        async def slow(request: web.Request) -> web.StreamResponse:
            nonlocal arrived
            arrived += 1
            await release.wait()
            return web.Response(text="done")

        async with receiver() as rec, executor(capacity=16) as ex:
            url = rec.on("/slow", slow)
            runs = [asyncio.create_task(ex.run(call(url))) for _ in range(10)]
            async with asyncio.timeout(5):
                while arrived < 10:
                    await asyncio.sleep(0.01)
            release.set()
            done = await asyncio.gather(*runs)
        assert all(c.outcome == pb.OUTCOME_SUCCEEDED for c, _ in done)
        assert len({s.peer for s in rec.seen}) == 10

    scenario(go)


def test_runs_of_one_target_with_bodies_of_their_own_share_its_parsing() -> None:
    async def go() -> None:
        async with receiver() as rec, executor() as ex:
            for body in (b"one", b"", b"three", b"one"):
                c, _ = await ex.run(call(rec.url + "/ok", body=body, headers={"X-Job": "a"}))
                assert c.outcome == pb.OUTCOME_SUCCEEDED
            c, _ = await ex.run(call(rec.url + "/ok", body=b"get", method="GET"))
            assert c.outcome == pb.OUTCOME_SUCCEEDED
            assert ex.worker._http is not None
            parsed = len(ex.worker._http._targets)
        assert [s.body for s in rec.seen] == [b"one", b"", b"three", b"one", b"get"]
        assert [s.headers.get("Content-Length") for s in rec.seen] == ["3", "0", "5", "3", "3"]
        assert all(s.headers["X-Job"] == "a" for s in rec.seen[:4])
        assert parsed == 2

    scenario(go)


def test_requests_beyond_the_connection_cap_wait_their_turn_and_all_complete() -> None:
    async def go() -> None:
        in_flight = 0
        most = 0
        arrived = 0
        release = asyncio.Event()

        async def slow(request: web.Request) -> web.StreamResponse:
            nonlocal in_flight, most, arrived
            in_flight += 1
            arrived += 1
            most = max(most, in_flight)
            try:
                await release.wait()
                await asyncio.sleep(0.01)
            finally:
                in_flight -= 1
            return web.Response(text="done")

        async with receiver() as rec, executor(capacity=32, connections=3) as ex:
            url = rec.on("/slow", slow)
            runs = [asyncio.create_task(ex.run(call(url))) for _ in range(20)]
            async with asyncio.timeout(5):
                while arrived < 3:
                    await asyncio.sleep(0.01)
            # The rest wait for a connection rather than open one of their own.
            await asyncio.sleep(0.2)
            assert arrived == 3
            release.set()
            done = await asyncio.gather(*runs)
            assert ex.worker._http is not None
            pool = ex.worker._http.pool
            opened = pool.opened
            assert pool.open_count(("http", "127.0.0.1", int(rec.url.rsplit(":", 1)[1]))) <= 3
        assert all(c.outcome == pb.OUTCOME_SUCCEEDED for c, _ in done), [c.error for c, _ in done]
        assert len(rec.seen) == 20
        assert most == 3
        assert opened == 3
        assert len({s.peer for s in rec.seen}) == 3

    scenario(go)


def test_a_request_waiting_for_a_connection_times_out_within_its_own_timeout() -> None:
    async def go() -> None:
        release = asyncio.Event()

        async def hang(request: web.Request) -> web.StreamResponse:
            await release.wait()
            return web.Response(text="late")

        async with receiver() as rec, executor(connections=1) as ex:
            url = rec.on("/hang", hang)
            held = asyncio.create_task(ex.run(call(url, timeout_ms=10_000), timeout=15))
            async with asyncio.timeout(5):
                while not rec.seen:
                    await asyncio.sleep(0.01)
            t0 = time.monotonic()
            c, _ = await ex.run(call(rec.url + "/ok", timeout_ms=300))
            waited = time.monotonic() - t0
            assert c.outcome == pb.OUTCOME_RETRYABLE
            assert "timed out after 0.3 s" in c.error
            assert 0.25 <= waited < 3.0
            # The connection, freed, serves the next request.
            release.set()
            first, _ = await held
            assert first.outcome == pb.OUTCOME_SUCCEEDED
            c, _ = await ex.run(call(rec.url + "/ok"))
            assert c.outcome == pb.OUTCOME_SUCCEEDED
        assert [s.path for s in rec.seen] == ["/hang", "/ok"]

    scenario(go)


def test_a_connection_that_failed_to_open_gives_its_room_back() -> None:
    async def go() -> None:
        port = free_port()
        async with executor(connections=1) as ex:
            for _ in range(3):
                c, _ = await ex.run(call(f"http://127.0.0.1:{port}/x", timeout_ms=2_000))
                assert c.outcome == pb.OUTCOME_RETRYABLE
                assert "refused" in c.error
            assert ex.worker._http is not None
            assert ex.worker._http.pool.open_count(("http", "127.0.0.1", port)) == 0

    scenario(go)


# -- signatures ------------------------------------------------------------------------


def test_signed_headers_go_out_unchanged_and_verify_with_standardwebhooks() -> None:
    async def go() -> None:
        secret = webhooks.new_secret()
        key = webhooks.parse_secret(secret)
        body = b'{"report": "daily"}'
        stamp = int(time.time())
        signed = webhooks.signed_headers([key], "fire-77", stamp, body)
        async with receiver() as rec, executor() as ex:
            c, _ = await ex.run(
                call(rec.url + "/ok", body),
                idempotency_key="fire-77",
                signed_headers=[jobs_pb2.HttpHeader(name=n, value=v) for n, v in signed],
            )
        assert c.outcome == pb.OUTCOME_SUCCEEDED, c.error
        (seen,) = rec.seen
        for name, value in signed:
            assert seen.headers[name] == value
        assert seen.headers["Idempotency-Key"] == "fire-77"
        verified = standardwebhooks.Webhook(secret).verify(seen.body, seen.headers)
        assert verified == {"report": "daily"}

    scenario(go)


# -- the worker ------------------------------------------------------------------------


def test_http_is_no_name_for_a_python_handler() -> None:
    w = Worker("127.0.0.1:1")
    with pytest.raises(InvalidArgument, match="built-in HTTP executor"):
        w.register("http", lambda ctx: None)
    both = Worker("127.0.0.1:1", http=True)
    both.register("report", lambda ctx: None)
    assert both.handler_names == ["http", "report"]
    assert list(both.handlers) == ["report"]


def test_wheelctl_worker_http_sends_requests_and_says_so_in_hello() -> None:
    async def go() -> None:
        async with receiver() as rec, node() as (svc, target):
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "wheel",
                "worker",
                "--http",
                "--allow-private-targets",
                "--target",
                target,
                "--worker-id",
                "proc",
            )
            try:
                conn, hello = await svc.accept()
                assert (hello.worker_id, list(hello.handlers)) == ("proc", ["http"])
                assign(conn, assignment(1, "http", payload=call(rec.url + "/ok")))
                done = await conn.completed(1)
                assert done[1].outcome == pb.OUTCOME_SUCCEEDED, done[1].error
                assert json.loads(done[1].result_json)["http_status"] == 200
            finally:
                proc.kill()
                await proc.wait()
        assert len(rec.seen) == 1

    scenario(go)


def test_wheelctl_worker_needs_handlers_or_http() -> None:
    for args, says in (
        ([], "or --http"),
        (["--allow-private-targets", "m:f"], "--allow-private-targets needs --http"),
    ):
        out = subprocess.run(
            [sys.executable, "-m", "wheel", "worker", "--target", "127.0.0.1:1", *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode != 0
        assert says in out.stderr, out.stderr
