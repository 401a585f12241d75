"""The built-in handler ``http``: each run of a job with an HTTP target is one
request to its URL (``wheelctl worker --http``, ``Worker(http=True)``).

A run's payload is a serialized ``HttpCall`` (the target and the body). The
node signed the request when it handed the run out: the assignment's
``signed_headers`` go out as they are, so the worker never holds a secret;
an assignment with ``sign_error`` is not sent at all (retryable). Each
request carries the job's headers, ``Idempotency-Key`` (the fire's key, the
same on each attempt), ``Wheel-Fence``, ``Wheel-Attempt`` and
``Wheel-Scheduled-For``.

Outcomes by status (``outcome_of_status``): 2xx succeeded; 408, 429 and 5xx
retryable, a ``Retry-After`` giving the least wait before the next attempt;
any other 4xx failed for good unless the target says ``retry_4xx``; a 3xx
failed for good naming its Location unless the target follows redirects (at
most ``MAX_REDIRECTS``, each hop's address checked again, 303 becoming GET).
No response: a connection error or a timeout is retryable.

Safe by default: the host's addresses are resolved here and one that is
loopback, private, link-local (the cloud metadata address too), shared,
multicast, reserved or unspecified is refused (failed for good) unless the
worker allows private targets; the connection goes to the checked address
itself, never to a second resolution of the name. At most ``BODY_LIMIT``
bytes of a response are read.

Cheap per run: a target is parsed once (the request line and its fixed
headers kept as bytes, by the serialized target), connections are kept alive and at most
``connections_per_origin`` are open to one (scheme, host, port) (requests
beyond wait their turn, their timeout running), and a host's resolved
addresses are kept ``ADDRESS_TTL_S`` for the connections opened meanwhile.
"""

from __future__ import annotations

import asyncio
import collections
import math
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError

from wheel.rpc.v1 import jobs_pb2
from wheel.worker import _tracing as spans
from wheel.worker._httpclient import (
    DEFAULT_CONNECTIONS_PER_ORIGIN,
    BadResponse,
    Connection,
    Disconnected,
    Pool,
    Response,
)
from wheel.worker._httptarget import (
    ADDRESS_CACHE_SIZE,
    ADDRESS_TTL_S,
    BODY_LIMIT,
    EXCERPT_BYTES,
    FAILED,
    HANDLER,
    KEPT_HEADERS,
    MAX_KEPT_HEADER_CHARS,
    MAX_REDIRECTS,
    PRIVATE_HINT,
    REDIRECTS,
    RETRYABLE,
    SUCCEEDED,
    TARGET_CACHE_SIZE,
    BadTarget,
    Finish,
    NoConnection,
    Refused,
    _Early,
    _error_result,
    _json_str,
    _ms_since,
    _phrase,
    _scheduled_for,
    _Target,
    outcome_of_status,
    refusal,
    retry_after_ms,
)

if TYPE_CHECKING:
    from wheel.worker._runs import Run

__all__ = [
    "BODY_LIMIT",
    "EXCERPT_BYTES",
    "HANDLER",
    "MAX_REDIRECTS",
    "Finish",
    "HttpExecutor",
    "outcome_of_status",
    "refusal",
    "retry_after_ms",
]

# Called once when a run's request ended.
Done = Callable[["Run", Finish], object]


def _expire(waiter: asyncio.Future[Response]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class HttpExecutor:
    """Sends runs' requests through one pool of kept-alive connections, at
    most ``connections_per_origin`` open to each (scheme, host, port)."""

    def __init__(
        self,
        *,
        allow_private: bool = False,
        body_limit: int = BODY_LIMIT,
        connections_per_origin: int = DEFAULT_CONNECTIONS_PER_ORIGIN,
    ) -> None:
        self.allow_private = allow_private
        self.pool = Pool(body_limit, limit=connections_per_origin)
        self.deadlines = _Deadlines()
        self._targets: dict[bytes, _Target] = {}
        # (host, port) -> (time.monotonic() until which they hold, addresses).
        self._addresses: dict[tuple[str, int], tuple[float, list[str]]] = {}

    def close(self) -> None:
        self.deadlines.close()
        self.pool.close()

    def _target(self, payload: bytes) -> _Target:
        """The run's target, parsed once per distinct target (runs of many
        jobs may share one, each with a body of its own)."""
        try:
            call = jobs_pb2.HttpCall.FromString(payload)
        except DecodeError:
            raise BadTarget("the run's payload is not an HttpCall (no HTTP target)") from None
        key = call.target.SerializeToString(deterministic=True)
        target = self._targets.get(key)
        if target is None:
            target = _Target.of_call(call)
            if len(self._targets) >= TARGET_CACHE_SIZE:
                self._targets.clear()
            self._targets[key] = target
        return target.with_body(call.body)

    def _prepare(self, run: Run) -> tuple[_Target, bytes, float]:
        """The run's target, the request's lines of this run, and its timeout
        in seconds; raises ``_Early`` for a run that is not sent at all."""
        ctx = run.ctx
        a = run.assignment
        if a is not None and a.sign_error:
            error = f"not sent: the request could not be signed: {a.sign_error}"
            raise _Early(RETRYABLE, error)
        try:
            target = self._target(ctx.payload)
        except BadTarget as exc:
            raise _Early(FAILED, f"bad HTTP target: {exc}") from None
        timeout = max(0.0, min(target.timeout_s, ctx.deadline - time.monotonic()))
        lines = (
            f"Idempotency-Key: {ctx.idempotency_key}\r\nWheel-Fence: {ctx.fence}\r\n"
            f"Wheel-Attempt: {ctx.attempt}\r\n"
            f"Wheel-Scheduled-For: {_scheduled_for(ctx.scheduled_for_ms)}\r\n"
        )
        if a is not None and a.signed_headers:
            lines += "".join([f"{h.name}: {h.value}\r\n" for h in a.signed_headers])
        if run.span is not None:
            lines += f"traceparent: {spans.header(run)}\r\n"
        return target, lines.encode("utf-8"), timeout

    def start(self, run: Run, done: Done) -> None:
        """Send ``run``'s request; ``done(run, finish)`` is called once when it
        ended, always later than this call. The common case, a kept-alive
        connection to the host at hand, costs no task and no future: the
        connection's callback ends the run; so does waiting for one when the
        host has all the connections it may have. Opening a connection
        (resolve, check, connect) and following redirects run as a task
        (``run.task``, which the runner may cancel)."""
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            target, lines, timeout = self._prepare(run)
        except _Early as early:
            loop.call_soon(done, run, early.finish(started))
            return
        pool = self.pool
        if target.follow:
            self.later(run, done, target, lines, timeout, started, fresh=False)
            return
        conn = pool.take(target.key)
        if conn is not None:
            _Exchange(self, run, done, target, lines, timeout, started).send(conn)
        elif pool.room(target.key):
            self.later(run, done, target, lines, timeout, started, fresh=False, room=True)
        else:
            _Exchange(self, run, done, target, lines, timeout, started).wait()

    def later(
        self,
        run: Run,
        done: Done,
        target: _Target,
        lines: bytes,
        timeout: float,
        started: float,
        *,
        fresh: bool,
        room: bool = False,
    ) -> None:
        """The request as a task (``run.task``): ``done`` is called once
        however it ends, also if it is cancelled before it began (and the
        room counted for it, if ``room``, is given back then)."""
        entered: list[bool] = []
        task = asyncio.get_running_loop().create_task(
            self._later(
                run, done, target, lines, timeout, started, fresh=fresh, room=room, entered=entered
            )
        )
        run.task = task

        def unentered(_: asyncio.Task[None]) -> None:
            if entered:
                return
            if room:
                self.pool.unopened(target.key)
            done(run, _CANCELLED)

        task.add_done_callback(unentered)

    async def _later(
        self,
        run: Run,
        done: Done,
        target: _Target,
        lines: bytes,
        timeout: float,
        started: float,
        *,
        fresh: bool,
        room: bool,
        entered: list[bool],
    ) -> None:
        entered.append(True)
        finish: Finish = _CANCELLED
        try:
            finish = await self._exchange(target, lines, timeout, started, fresh=fresh, room=room)
        finally:
            done(run, finish)

    async def execute(self, run: Run) -> Finish:
        """One attempt as a coroutine: the request, and how the run ended."""
        started = time.perf_counter()
        try:
            target, lines, timeout = self._prepare(run)
        except _Early as early:
            return early.finish(started)
        return await self._exchange(target, lines, timeout, started, fresh=False)

    async def _exchange(
        self,
        target: _Target,
        lines: bytes,
        timeout: float,
        started: float,
        *,
        fresh: bool,
        room: bool = False,
    ) -> Finish:
        """The request (and the redirects it follows); ``room``: a connection
        to ``target``'s origin is counted for it already, to be opened."""
        deadline = asyncio.get_running_loop().time() + timeout
        hops = 0
        try:
            while True:
                data = target.request(lines)
                resp = await self._send(target, data, deadline, fresh=fresh, room=room)
                room = False
                status = resp.status
                if status in REDIRECTS and target.follow and hops < MAX_REDIRECTS:
                    location = resp.header("location")
                    if location:
                        hops += 1
                        target = target.redirected(location, status)
                        continue
                break
        except _FAILURES as exc:
            return self._failure(exc, target, timeout, started)
        return self._finish(resp, target, started, hops)

    @staticmethod
    def _failure(exc: Exception, target: _Target, timeout: float, started: float) -> Finish:
        """How a request that got no (whole) response ended."""
        outcome = RETRYABLE
        if isinstance(exc, BadTarget):
            outcome, error = FAILED, f"bad redirect: {exc}"
        elif isinstance(exc, Refused):
            outcome, error = FAILED, str(exc)
        elif isinstance(exc, TimeoutError):
            error = f"timed out after {timeout:.1f} s"
        elif isinstance(exc, NoConnection):
            error = str(exc)
        else:
            error = f"{target.host}:{target.port}: {exc}"
        return outcome, error, _error_result(error, started), 0

    def _finish(self, resp: Response, target: _Target, started: float, hops: int) -> Finish:
        status = resp.status
        outcome = outcome_of_status(status, target.retry_4xx)
        body = resp.body
        # The result's JSON written out directly: it is made for every run,
        # and json.dumps of the dict costs several times this.
        kept = ",".join(
            [
                f"{_json_str(k)}:{_json_str(v[:MAX_KEPT_HEADER_CHARS])}"
                for k, v in resp.headers
                if k in KEPT_HEADERS
            ]
        )
        excerpt = _json_str(body[:EXCERPT_BYTES].decode("utf-8", errors="replace"))
        result = (
            f'{{"http_status":{status},"duration_ms":{_ms_since(started)},'
            f'"response_headers":{{{kept}}},"response_excerpt":{excerpt}'
        )
        if len(body) > EXCERPT_BYTES or resp.truncated:
            result += ',"excerpt_truncated":true'
        if hops:
            result += f',"redirects":{hops},"url":{_json_str(target.url)}'
        result += "}"
        if outcome == SUCCEEDED:
            return outcome, "", result, 0
        reason = resp.reason[:100] or _phrase(status)
        error = f"HTTP {status} {reason}".rstrip()
        wait = 0
        if 300 <= status < 400:
            location = resp.header("location")
            if location:
                error += f": redirected to {location[:500]}"
                if target.follow:
                    error += f" (after {MAX_REDIRECTS} redirects)"
                else:
                    error += " (the job does not follow redirects)"
        elif outcome == RETRYABLE:
            wait = retry_after_ms(resp.header("retry-after"), time.time())
            if wait:
                error += f" (Retry-After {wait / 1000:g} s)"
        return outcome, error, result, wait

    async def _send(
        self, target: _Target, data: bytes, deadline: float, *, fresh: bool, room: bool
    ) -> Response:
        """One request on a kept-alive connection (unless ``fresh``: not an
        idle one), a new one, or the next one free; ``room``: a new one,
        counted already."""
        if room:
            conn, reused = await self._open(target, deadline), False
        else:
            conn, reused = await self._connection(target, deadline, idle=not fresh)
        try:
            return await self._fetch(conn, data, target.head_only, deadline)
        except Disconnected as exc:
            if not reused or exc.any_bytes:
                raise
        # A kept-alive connection the server closed while it was idle: once
        # more on another, not an idle one (it may have closed those too).
        conn, _ = await self._connection(target, deadline, idle=False)
        return await self._fetch(conn, data, target.head_only, deadline)

    async def _connection(
        self, target: _Target, deadline: float, *, idle: bool
    ) -> tuple[Connection, bool]:
        """A connection for ``target`` and whether it served a request
        before: an idle one (if ``idle``), a new one if its origin has room,
        else the next one put back or room freed, waiting for it until
        ``deadline`` at most."""
        conn = await self.pool.acquire(target.key, deadline, idle=idle)
        if conn is not None:
            return conn, True
        return await self._open(target, deadline), False

    async def _fetch(
        self, conn: Connection, data: bytes, head_only: bool, deadline: float
    ) -> Response:
        waiter = conn.fetch(data, head_only)
        timer = conn.loop.call_at(deadline, _expire, waiter)
        try:
            return await waiter
        except BaseException:
            conn.abandon()
            raise
        finally:
            timer.cancel()
            self.pool.put(conn)

    async def _open(self, target: _Target, deadline: float) -> Connection:
        """A new connection to a checked address of ``target``'s host, in
        the room its origin counted for it: given back if none is made."""
        try:
            return await self._connect(target, deadline)
        except BaseException:
            self.pool.unopened(target.key)
            raise

    async def _resolve(self, target: _Target, deadline: float) -> list[str]:
        """``target``'s host's addresses, resolved again after ``ADDRESS_TTL_S``."""
        host, port = target.host, target.port
        if target.ip is not None:
            return [target.ip]
        now = time.monotonic()
        known = self._addresses.get((host, port))
        if known is not None and known[0] > now:
            return known[1]
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, port, type=socket.SOCK_STREAM),
                max(0.0, deadline - loop.time()),
            )
        except socket.gaierror as exc:
            raise NoConnection(f"cannot resolve {host}: {exc.strerror or exc}") from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if len(self._addresses) >= ADDRESS_CACHE_SIZE:
            self._addresses.clear()
        self._addresses[(host, port)] = (now + ADDRESS_TTL_S, addresses)
        return addresses

    async def _connect(self, target: _Target, deadline: float) -> Connection:
        loop = asyncio.get_running_loop()
        host, port = target.host, target.port
        addresses = await self._resolve(target, deadline)
        if not self.allow_private:
            allowed = [addr for addr in addresses if refusal(addr) is None]
            if not allowed:
                first = addresses[0]
                what = refusal(first)
                if target.ip is not None:
                    raise Refused(f"refused: {host} is {what} address; {PRIVATE_HINT}")
                raise Refused(
                    f"refused: {host} resolves to {first}, {what} address; {PRIVATE_HINT}"
                )
            addresses = allowed
        last: OSError | None = None
        for addr in addresses:
            try:
                return await self.pool.connect(target.key, addr, max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise
            except OSError as exc:
                last = exc
                shown = f"[{addr}]" if ":" in addr else addr
                where = f"{shown}:{port}"
        assert last is not None
        if isinstance(last, ConnectionRefusedError):
            raise NoConnection(f"connect to {where} refused")
        raise NoConnection(f"connect to {where} failed: {last.strerror or last}")


_CANCELLED: Finish = (RETRYABLE, "request was cancelled", "", 0)
_FAILURES = (BadTarget, Refused, TimeoutError, NoConnection, Disconnected, BadResponse)


class _Exchange:
    """One request on a kept-alive connection, ended by the connection's
    callback or by its deadline (``HttpExecutor.start``). One whose origin
    has all its connections busy waits in the pool's queue (``wait``), its
    deadline running: it is sent on the first connection put back, or opens
    one (as a task) when room is freed."""

    __slots__ = (
        "conn",
        "deadline",
        "done",
        "executor",
        "lines",
        "run",
        "started",
        "target",
        "timeout",
    )

    def __init__(
        self,
        executor: HttpExecutor,
        run: Run,
        done: Done,
        target: _Target,
        lines: bytes,
        timeout: float,
        started: float,
    ) -> None:
        self.executor = executor
        self.run: Run | None = run
        self.done = done
        self.target = target
        self.lines = lines
        self.timeout = timeout
        self.started = started
        self.conn: Connection | None = None

    def send(self, conn: Connection) -> None:
        self.deadline = conn.loop.time() + self.timeout
        self._write(conn)
        self.executor.deadlines.add(self, conn.loop)

    def _write(self, conn: Connection) -> None:
        self.conn = conn
        conn.request(self.target.request(self.lines), self.target.head_only, self.on_response)

    def wait(self) -> None:
        loop = asyncio.get_running_loop()
        self.deadline = loop.time() + self.timeout
        self.executor.deadlines.add(self, loop)
        self.executor.pool.wait(self.target.key, self)

    # -- as a Waiter of the pool -----------------------------------------------------

    @property
    def live(self) -> bool:
        return self.run is not None

    def granted(self, conn: Connection | None) -> None:
        run = self.run
        assert run is not None
        if conn is not None:
            self._write(conn)
            return
        # Room for a new connection: opened by a task, in what is left of the
        # timeout; the deadline queue lets this one go.
        self.run = None
        executor = self.executor
        left = max(0.0, self.timeout - (time.perf_counter() - self.started))
        executor.later(
            run, self.done, self.target, self.lines, left, self.started, fresh=False, room=True
        )

    def on_response(self, resp: Response | None, exc: Exception | None) -> None:
        run = self.run
        if run is None:
            return
        self.run = None  # ended: its deadline passes unheeded
        executor = self.executor
        conn = self.conn
        assert conn is not None
        executor.deadlines.trim(self.timeout)
        executor.pool.put(conn)
        if resp is not None:
            finish = executor._finish(resp, self.target, self.started, 0)
        elif isinstance(exc, Disconnected) and not exc.any_bytes:
            # Closed while idle, just as the request went: once more on a new
            # connection, in what is left of the timeout.
            left = max(0.0, self.timeout - (time.perf_counter() - self.started))
            executor.later(run, self.done, self.target, self.lines, left, self.started, fresh=True)
            return
        else:
            assert exc is not None
            finish = executor._failure(exc, self.target, self.timeout, self.started)
        self.done(run, finish)

    def expire(self) -> None:
        run = self.run
        if run is None:
            return
        self.run = None
        conn = self.conn
        if conn is not None:
            conn.abandon()
            self.executor.pool.put(conn)
        # else it was still waiting for a connection: the pool skips it now
        self.done(
            run, self.executor._failure(TimeoutError(), self.target, self.timeout, self.started)
        )


class _Deadlines:
    """When requests time out, with one loop timer for all of them.

    Requests with the same timeout reach their deadlines in the order they
    were sent, so each timeout keeps a FIFO queue and only the queues' heads
    are ever looked at: adding is O(1), and there are no timer handles to
    make and cancel per request (which would also pile up, cancelled, in
    the loop's heap for as long as the timeout). A request that ends leaves
    its queue once every request sent before it has ended too; until then it
    stays, without its run.
    """

    def __init__(self) -> None:
        self._queues: dict[float, collections.deque[_Exchange]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf

    def add(self, exchange: _Exchange, loop: asyncio.AbstractEventLoop) -> None:
        queue = self._queues.get(exchange.timeout)
        if queue is None:
            queue = self._queues[exchange.timeout] = collections.deque()
        queue.append(exchange)
        if exchange.deadline < self._at:
            self._arm(loop, exchange.deadline)

    def trim(self, timeout: float) -> None:
        """Drop the ended requests at the head of ``timeout``'s queue:
        answered mostly in the order sent, requests leave it as they end."""
        queue = self._queues.get(timeout)
        while queue and queue[0].run is None:
            queue.popleft()

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._at = at
        self._timer = loop.call_at(at, self._due, loop)

    def _due(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._at = math.inf
        now = loop.time()
        expired = []
        earliest = math.inf
        for queue in self._queues.values():
            while queue and (queue[0].run is None or queue[0].deadline <= now):
                exchange = queue.popleft()
                if exchange.run is not None:
                    expired.append(exchange)
            if queue:
                earliest = min(earliest, queue[0].deadline)
        if earliest < math.inf:
            self._arm(loop, earliest)
        for exchange in expired:
            exchange.expire()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._queues.clear()
