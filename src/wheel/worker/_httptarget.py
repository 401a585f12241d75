"""What the executor of HTTP targets knows before it sends: a target parsed
and checked (``_Target``), the addresses it may reach (``refusal``), and how
a response ends a run (``outcome_of_status``, ``retry_after_ms``). Nothing
here does I/O; ``wheel.worker._http`` sends.
"""

from __future__ import annotations

import email.utils
import ipaddress
import json
import time
import urllib.parse
from http import HTTPStatus

import wheel
from wheel.rpc.v1 import jobs_pb2
from wheel.rpc.v1 import worker_service_pb2 as pb
from wheel.runresult import MAX_RETRY_AFTER_MS

HANDLER = "http"
DEFAULT_TIMEOUT_MS = 30_000
# What is read of a response at most; what a run's result keeps of it.
BODY_LIMIT = 65_536
EXCERPT_BYTES = 4_096
MAX_REDIRECTS = 5
MAX_URL_CHARS = 2_048
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
# Parsed targets by their serialized HttpTarget: runs of one target share one.
TARGET_CACHE_SIZE = 1_024
# How long a host's resolved addresses are used for new connections, and for
# how many hosts at most.
ADDRESS_TTL_S = 30.0
ADDRESS_CACHE_SIZE = 1_024

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


class _Early(Exception):
    """A run ended before any request was sent."""

    def __init__(self, outcome: pb.Outcome, error: str) -> None:
        super().__init__(error)
        self.outcome = outcome
        self.error = error

    def finish(self, started: float) -> Finish:
        return self.outcome, self.error, _error_result(self.error, started), 0


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
        "sized",
        "tail",
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
        self.sized = method not in ("GET", "HEAD")
        self.head = ("\r\n".join(lines) + "\r\n").encode("utf-8")
        self.tail = self._tail(body)
        self.timeout_s = (timeout_ms or DEFAULT_TIMEOUT_MS) / 1000
        self.retry_4xx = retry_4xx
        self.follow = follow

    def _tail(self, body: bytes) -> bytes:
        """What follows the run's own lines: the length, the blank line, the body."""
        if body or self.sized:
            return b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
        return b"\r\n"

    def with_body(self, body: bytes) -> _Target:
        """This target with ``body``: what was parsed and checked is shared."""
        if body == self.body:
            return self
        other = _Target.__new__(_Target)
        other.url = self.url
        other.method = self.method
        other.headers = self.headers
        other.host = self.host
        other.ip = self.ip
        other.port = self.port
        other.key = self.key
        other.head_only = self.head_only
        other.sized = self.sized
        other.head = self.head
        other.timeout_s = self.timeout_s
        other.retry_4xx = self.retry_4xx
        other.follow = self.follow
        other.body = body
        other.tail = self._tail(body)
        return other

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

    def request(self, lines: bytes) -> bytes:
        """The whole request, with a run's own header ``lines``."""
        return self.head + lines + self.tail

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


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""
