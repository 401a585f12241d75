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
"""

from __future__ import annotations

import asyncio
import email.utils
import ipaddress
import json
import socket
import time
import urllib.parse
from http import HTTPStatus
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError

import wheel
from wheel.rpc.v1 import jobs_pb2
from wheel.rpc.v1 import worker_service_pb2 as pb
from wheel.worker._httpclient import BadResponse, Connection, Disconnected, Pool, Response

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

HANDLER = "http"
DEFAULT_TIMEOUT_MS = 30_000
# What is read of a response at most; what a run's result keeps of it.
BODY_LIMIT = 65_536
EXCERPT_BYTES = 4_096
MAX_REDIRECTS = 5
MAX_URL_CHARS = 2_048
# A Retry-After beyond this is taken as this (the node still waits at least
# its own backoff).
MAX_RETRY_AFTER_MS = 24 * 3600 * 1000
USER_AGENT = f"wheel/{wheel.__version__}"
# The response headers a run's result keeps.
KEPT_HEADERS = frozenset(
    ("content-type", "content-length", "retry-after", "location", "x-request-id", "request-id")
)
# Of each, at most this much: a result stays far below its 64 KiB.
MAX_KEPT_HEADER_CHARS = 1_000
# Headers the executor sets itself: a job's own are dropped.
OWN_HEADERS = frozenset(
    (
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "idempotency-key",
        "wheel-fence",
        "wheel-attempt",
        "wheel-scheduled-for",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    )
)
RETRYABLE_4XX = frozenset((408, 429))
REDIRECTS = frozenset((301, 302, 303, 307, 308))
_URL_SAFE = "/?#[]@!$&'()*+,;=:%~"
PRIVATE_HINT = "run the worker with --allow-private-targets"
# Parsed targets by payload: a job's runs share one.
TARGET_CACHE_SIZE = 1_024

SUCCEEDED = pb.OUTCOME_SUCCEEDED
FAILED = pb.OUTCOME_FAILED
RETRYABLE = pb.OUTCOME_RETRYABLE

# How a run ended: outcome, error, result (JSON object text), retry_after_ms.
Finish = tuple["pb.Outcome", str, str, int]


class BadTarget(Exception):
    """A payload that is no usable HTTP target: the run fails for good."""


class Refused(Exception):
    """The target's address is not allowed: the run fails for good."""


class NoConnection(Exception):
    """No connection could be made (resolution or connect failed): retryable."""


class _Target:
    """A target ready to send: where to connect, and the request's fixed part."""

    __slots__ = (
        "body",
        "follow",
        "head",
        "head_only",
        "headers",
        "host",
        "ip",
        "key",
        "method",
        "port",
        "retry_4xx",
        "timeout_s",
        "url",
    )

    def __init__(
        self,
        url: str,
        method: str,
        headers: list[tuple[str, str]],
        body: bytes,
        timeout_ms: int,
        retry_4xx: bool,
        follow: bool,
    ) -> None:
        if len(url) > MAX_URL_CHARS:
            raise BadTarget(f"url: {len(url)} characters, over {MAX_URL_CHARS}")
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise BadTarget(f"url: {exc}") from None
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise BadTarget(f"url: scheme {scheme or '(none)'!r}; give http or https")
        host = parts.hostname or ""
        if not host:
            raise BadTarget(f"url: {url[:100]!r} has no host")
        if parts.username is not None or parts.password is not None:
            raise BadTarget("url: credentials in the URL; send them in a header instead")
        if not host.isascii():
            try:
                host = host.encode("idna").decode("ascii")
            except UnicodeError:
                raise BadTarget(f"url: host {host!r} is not a valid name") from None
        default_port = 443 if scheme == "https" else 80
        port = port or default_port
        try:
            ip: str | None = str(ipaddress.ip_address(host))
        except ValueError:
            ip = None
        host_header = f"[{host}]" if ip is not None and ":" in host else host
        if port != default_port:
            host_header += f":{port}"
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        # Spaces, controls and non-ASCII are percent-encoded; escapes given stay.
        target = urllib.parse.quote(target, safe=_URL_SAFE)
        method = (method or "POST").upper()
        if not method.isalpha() or not method.isascii():
            raise BadTarget(f"method: {method[:20]!r} is not an HTTP method")
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host_header}"]
        own_agent = False
        for name, value in headers:
            lower = name.lower()
            if lower in OWN_HEADERS:
                continue
            if (
                not name
                or any(c in name for c in ":\r\n\0 \t")
                or any(c in value for c in "\r\n\0")
            ):
                raise BadTarget(f"headers: {name[:40]!r} is not a valid header")
            own_agent = own_agent or lower == "user-agent"
            lines.append(f"{name}: {value}")
        if not own_agent:
            lines.append(f"User-Agent: {USER_AGENT}")
        self.url = url
        self.method = method
        self.headers = headers
        self.body = body
        self.host = host
        self.ip = ip
        self.port = port
        self.key = (scheme, host, port)
        self.head_only = method == "HEAD"
        # GET and HEAD without a body say nothing of one.
        length = (
            "" if method in ("GET", "HEAD") and not body else f"Content-Length: {len(body)}\r\n"
        )
        self.head = ("\r\n".join(lines) + "\r\n").encode("utf-8"), length.encode("ascii")
        self.timeout_s = (timeout_ms or DEFAULT_TIMEOUT_MS) / 1000
        self.retry_4xx = retry_4xx
        self.follow = follow

    @classmethod
    def of_call(cls, call: jobs_pb2.HttpCall) -> _Target:
        t = call.target
        if not t.url:
            raise BadTarget("the run's payload has no HTTP target (url is empty)")
        return cls(
            t.url,
            t.method,
            [(h.name, h.value) for h in t.headers],
            call.body,
            t.timeout_ms,
            t.retry_4xx,
            t.follow_redirects,
        )

    def redirected(self, location: str, status: int) -> _Target:
        url = urllib.parse.urljoin(self.url, location)
        get = status == 303 and self.method != "HEAD"
        return _Target(
            url,
            "GET" if get else self.method,
            self.headers,
            b"" if get else self.body,
            int(self.timeout_s * 1000),
            self.retry_4xx,
            self.follow,
        )


def refusal(address: str) -> str | None:
    """Why ``address`` is no target without --allow-private-targets (None: it
    is a public unicast address)."""
    ip = ipaddress.ip_address(address.partition("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_unspecified:
        return "an unspecified"
    if ip.is_loopback:
        return "a loopback"
    if ip.is_link_local:
        return "a link-local"
    if ip.is_multicast:
        return "a multicast"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED:
        return "a shared (carrier-grade NAT)"
    if ip.is_reserved:
        return "a reserved"
    if ip.is_private:
        return "a private"
    if not ip.is_global:
        return "a non-public"
    return None


_SHARED = ipaddress.IPv4Network("100.64.0.0/10")


def outcome_of_status(status: int, retry_4xx: bool) -> pb.Outcome:
    if 200 <= status < 300:
        return SUCCEEDED
    if status >= 500 or status in RETRYABLE_4XX:
        return RETRYABLE
    if 400 <= status < 500:
        return RETRYABLE if retry_4xx else FAILED
    if 300 <= status < 400:
        return FAILED
    return RETRYABLE  # 1xx as a final answer, or beyond 599: the server misbehaves


def retry_after_ms(value: str | None, now_s: float) -> int:
    """A ``Retry-After`` (RFC 9110: delta-seconds or an HTTP-date) in ms from
    ``now_s`` (Unix seconds); 0 if absent, unreadable or past."""
    if not value:
        return 0
    value = value.strip()
    if value.isdigit():
        ms = int(value) * 1000
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return 0
        if when.tzinfo is None:  # "-0000": UTC by the RFC
            return 0
        ms = int((when.timestamp() - now_s) * 1000)
    return max(0, min(ms, MAX_RETRY_AFTER_MS))


def _scheduled_for(ms: int) -> str:
    """RFC 3339 UTC with milliseconds, e.g. 2026-12-06T12:00:00.000Z."""
    s, frac = divmod(ms, 1000)
    global _last_second, _last_second_text
    if s != _last_second:
        # Runs come due together: one formatting per second, not per run.
        _last_second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(s))
        _last_second = s
    return f"{_last_second_text}.{frac:03d}Z"


_last_second = -1
_last_second_text = ""
_json_str = json.encoder.encode_basestring_ascii


def _dump(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _error_result(error: str, started: float) -> str:
    return _dump({"error": error, "duration_ms": _ms_since(started)})


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


def _expire(waiter: asyncio.Future[Response]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class HttpExecutor:
    """Sends runs' requests through one pool of kept-alive connections."""

    def __init__(self, *, allow_private: bool = False, body_limit: int = BODY_LIMIT) -> None:
        self.allow_private = allow_private
        self.pool = Pool(body_limit)
        self._targets: dict[bytes, _Target] = {}

    def close(self) -> None:
        self.pool.close()

    def _target(self, payload: bytes) -> _Target:
        target = self._targets.get(payload)
        if target is not None:
            return target
        try:
            call = jobs_pb2.HttpCall.FromString(payload)
        except DecodeError:
            raise BadTarget("the run's payload is not an HttpCall (no HTTP target)") from None
        target = _Target.of_call(call)
        if len(self._targets) >= TARGET_CACHE_SIZE:
            self._targets.clear()
        self._targets[payload] = target
        return target

    async def execute(self, run: Run) -> Finish:
        """One attempt: the request, and how the run ended."""
        started = time.perf_counter()
        ctx = run.ctx
        a = run.assignment
        if a is not None and a.sign_error:
            error = f"not sent: the request could not be signed: {a.sign_error}"
            return RETRYABLE, error, _error_result(error, started), 0
        try:
            target = self._target(ctx.payload)
        except BadTarget as exc:
            error = f"bad HTTP target: {exc}"
            return FAILED, error, _error_result(error, started), 0
        timeout = max(0.0, min(target.timeout_s, ctx.deadline - time.monotonic()))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        fixed = (
            f"Idempotency-Key: {ctx.idempotency_key}\r\nWheel-Fence: {ctx.fence}\r\n"
            f"Wheel-Attempt: {ctx.attempt}\r\n"
            f"Wheel-Scheduled-For: {_scheduled_for(ctx.scheduled_for_ms)}\r\n"
        )
        if a is not None and a.signed_headers:
            fixed += "".join([f"{h.name}: {h.value}\r\n" for h in a.signed_headers])
        run_head = fixed.encode("utf-8")
        hops = 0
        try:
            while True:
                head, length = target.head
                data = b"".join((head, run_head, length, b"\r\n", target.body))
                resp = await self._send(target, data, deadline)
                status = resp.status
                if status in REDIRECTS and target.follow and hops < MAX_REDIRECTS:
                    location = resp.header("location")
                    if location:
                        hops += 1
                        target = target.redirected(location, status)
                        continue
                break
        except BadTarget as exc:
            error = f"bad redirect: {exc}"
            return FAILED, error, _error_result(error, started), 0
        except Refused as exc:
            error = str(exc)
            return FAILED, error, _error_result(error, started), 0
        except TimeoutError:
            error = f"timed out after {timeout:.1f} s"
            return RETRYABLE, error, _error_result(error, started), 0
        except NoConnection as exc:
            error = str(exc)
            return RETRYABLE, error, _error_result(error, started), 0
        except (Disconnected, BadResponse) as exc:
            error = f"{target.host}:{target.port}: {exc}"
            return RETRYABLE, error, _error_result(error, started), 0
        return self._finish(resp, target, started, hops)

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

    async def _send(self, target: _Target, data: bytes, deadline: float) -> Response:
        pool = self.pool
        conn = pool.take(target.key)
        reused = conn is not None
        if conn is None:
            conn = await self._open(target, deadline)
        waiter = conn.request(data, target.head_only)
        timer = conn.loop.call_at(deadline, _expire, waiter)
        try:
            resp = await waiter
        except Disconnected as exc:
            timer.cancel()
            if not reused or exc.any_bytes:
                raise
            # A kept-alive connection the server closed while it was idle:
            # once more on a new one.
            conn = await self._open(target, deadline)
            waiter = conn.request(data, target.head_only)
            timer = conn.loop.call_at(deadline, _expire, waiter)
            try:
                resp = await waiter
            except BaseException:
                conn.abandon()
                raise
            finally:
                timer.cancel()
        except BaseException:
            conn.abandon()
            timer.cancel()
            raise
        timer.cancel()
        pool.put(conn)
        return resp

    async def _open(self, target: _Target, deadline: float) -> Connection:
        """A new connection to a checked address of ``target``'s host."""
        loop = asyncio.get_running_loop()
        host, port = target.host, target.port
        if target.ip is not None:
            addresses = [target.ip]
        else:
            try:
                infos = await asyncio.wait_for(
                    loop.getaddrinfo(host, port, type=socket.SOCK_STREAM),
                    max(0.0, deadline - loop.time()),
                )
            except socket.gaierror as exc:
                raise NoConnection(f"cannot resolve {host}: {exc.strerror or exc}") from None
            addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
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


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""
