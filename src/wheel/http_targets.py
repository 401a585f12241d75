"""HTTP targets: how a job's ``HttpTarget`` is checked, and how it is kept.

The engine and the store know nothing of HTTP targets. A job with a target
has the handler ``"http"``, and its stored payload is the serialized
``HttpCall{target, body}`` (``body``: the payload the caller gave). The node
hands that payload out as ``Assignment.payload`` and the worker's executor
parses it with ``call_of``. The conversion happens at the edges, all through
this module: the node's API (``wheel.rpc.convert``), the outbox (its rows and
its relay), the import and the update history.

The checks made when a target is sent (``normalised_target``):

- ``url``: scheme http or https, a host, a valid port, at most 2048
  characters, no spaces or control characters, and no credentials
  (``user:pass@host``: they would show in every listing of the job; send an
  ``Authorization`` header instead).
- ``method``: one of ``METHODS``, upper-cased; empty means POST.
- ``headers``: names are HTTP tokens, values hold no CR, LF or NUL, at most
  64 of them and 8 KiB in all, and none of ``RESERVED_HEADERS`` (those the
  executor sets on every request).
- ``timeout_ms``: 0 means 30 s; never longer than the job's own timeout (a
  longer one is cut to it: the job's timeout would end the run first anyway).
- ``signing_secret``: a secret's name (letters, digits, ``.``, ``_`` and
  ``-``, at most 128) that the job's tenant has, where the caller can tell
  (``secret_known``: the node's cache of its secrets).

A literal address that is loopback, private or link-local is not refused
here: workers run with ``--allow-private-targets`` may call it, and every
executor checks the address it resolves when it sends.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from urllib.parse import urlsplit

from google.protobuf.message import DecodeError

from wheel.engine.model import HTTP_HANDLER
from wheel.engine.spec import JobSpec
from wheel.errors import InvalidArgument
from wheel.rpc.v1 import jobs_pb2

__all__ = [
    "DEFAULT_TIMEOUT_MS",
    "HANDLER",
    "MAX_HEADERS",
    "MAX_HEADER_BYTES",
    "MAX_URL_LEN",
    "METHODS",
    "RESERVED_HEADERS",
    "SecretKnown",
    "body_of",
    "call_of",
    "call_payload",
    "history_spec",
    "normalised_target",
    "stored_spec",
    "target_of",
]

# The handler of every job with an HTTP target: no Python handler may take it.
HANDLER = HTTP_HANDLER
DEFAULT_TIMEOUT_MS = 30_000
MAX_URL_LEN = 2048
MAX_HEADERS = 64
# Names and values together, as sent.
MAX_HEADER_BYTES = 8 * 1024
METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
# The executor sets these on every request: a job may not set them itself.
RESERVED_HEADERS = frozenset(
    {
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "idempotency-key",
        "wheel-fence",
        "wheel-attempt",
        "wheel-scheduled-for",
        "traceparent",
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
    }
)
# RFC 9110's token.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_SECRET_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
_BAD_URL_CHARS = re.compile(r"[\x00-\x20\x7f]")
_BAD_VALUE_CHARS = re.compile(r"[\r\n\x00]")


# Whether a tenant has a signing secret of that name: (tenant, name) -> bool.
SecretKnown = Callable[[str, str], bool]


def normalised_target(
    target: jobs_pb2.HttpTarget,
    *,
    tenant: str,
    job_timeout_ms: int,
    field: str = "spec.http",
    check_secret: bool = True,
    secret_known: SecretKnown | None = None,
) -> jobs_pb2.HttpTarget:
    """The target as it is kept, checked (the module's docstring lists the
    rules): method upper-cased, timeout resolved. Raises ``InvalidArgument``
    naming the field (``spec.http.url``...). ``check_secret``: refuse a
    signing secret ``secret_known`` does not know (not for a target an update
    keeps: a secret deleted since must not block a change of the job's name)."""
    url = _url(target.url, f"{field}.url")
    method = (target.method or "POST").upper()
    if method not in METHODS:
        raise InvalidArgument(
            f"{field}.method", f"{target.method!r} is not one of {', '.join(sorted(METHODS))}"
        )
    headers = _headers(target.headers, f"{field}.headers")
    if target.timeout_ms < 0:
        raise InvalidArgument(f"{field}.timeout_ms", f"{target.timeout_ms} is negative")
    timeout_ms = min(target.timeout_ms or DEFAULT_TIMEOUT_MS, job_timeout_ms)
    secret = target.signing_secret
    if secret:
        if not _SECRET_NAME.fullmatch(secret):
            raise InvalidArgument(
                f"{field}.signing_secret",
                f"{secret[:140]!r} is not a secret's name (letters, digits, '.', '_' and '-',"
                " at most 128)",
            )
        if check_secret and secret_known is not None and not secret_known(tenant, secret):
            raise InvalidArgument(
                f"{field}.signing_secret",
                f"tenant {tenant!r} has no signing secret {secret!r}"
                f" (make one: wheelctl secret set {secret} --generate)",
            )
    return jobs_pb2.HttpTarget(
        url=url,
        method=method,
        headers=headers,
        timeout_ms=timeout_ms,
        signing_secret=secret,
        retry_4xx=target.retry_4xx,
        follow_redirects=target.follow_redirects,
    )


def _url(url: str, field: str) -> str:
    if not url:
        raise InvalidArgument(field, "is required")
    if len(url) > MAX_URL_LEN:
        raise InvalidArgument(field, f"{len(url)} characters is over the limit of {MAX_URL_LEN}")
    if _BAD_URL_CHARS.search(url):
        raise InvalidArgument(field, "holds a space or a control character")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- a port out of range or not a number raises here
    except ValueError as exc:
        raise InvalidArgument(field, f"is not a URL ({exc})") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise InvalidArgument(field, f"scheme {parts.scheme!r} is not http or https")
    if "@" in parts.netloc:
        raise InvalidArgument(
            field, "holds credentials (user:password@); send an Authorization header instead"
        )
    if not parts.hostname:
        raise InvalidArgument(field, "has no host")
    return url


def _headers(headers: Iterable[jobs_pb2.HttpHeader], field: str) -> list[jobs_pb2.HttpHeader]:
    items = list(headers)
    if len(items) > MAX_HEADERS:
        raise InvalidArgument(field, f"{len(items)} headers is over the limit of {MAX_HEADERS}")
    out: list[jobs_pb2.HttpHeader] = []
    size = 0
    for i, h in enumerate(items):
        if not _TOKEN.fullmatch(h.name):
            raise InvalidArgument(f"{field}[{i}].name", f"{h.name[:100]!r} is not a header name")
        if h.name.lower() in RESERVED_HEADERS:
            raise InvalidArgument(
                f"{field}[{i}].name", f"{h.name!r} is set by the executor on every request"
            )
        if _BAD_VALUE_CHARS.search(h.value):
            raise InvalidArgument(f"{field}[{i}].value", "holds CR, LF or NUL")
        size += len(h.name.encode()) + len(h.value.encode())
        out.append(jobs_pb2.HttpHeader(name=h.name, value=h.value))
    if size > MAX_HEADER_BYTES:
        raise InvalidArgument(field, f"{size} bytes is over the limit of {MAX_HEADER_BYTES}")
    return out


# -- kept as the payload --------------------------------------------------------


def call_payload(target: jobs_pb2.HttpTarget, body: bytes) -> bytes:
    """The stored payload of a job with this target and body."""
    out: bytes = jobs_pb2.HttpCall(target=target, body=body).SerializeToString(deterministic=True)
    return out


def call_of(payload: bytes) -> jobs_pb2.HttpCall | None:
    """The call a payload of a job with the handler ``"http"`` holds, or None
    when it holds none (not an ``HttpCall``, or one without a target, as the
    update history keeps a spec from before targets were kept there)."""
    call = jobs_pb2.HttpCall()
    try:
        call.ParseFromString(payload)
    except DecodeError:
        return None
    return call if call.HasField("target") else None


def target_of(spec: JobSpec) -> jobs_pb2.HttpTarget | None:
    """A job's target, or None for a job with a Python handler."""
    if spec.handler != HANDLER:
        return None
    call = call_of(spec.payload)
    return None if call is None else call.target


def body_of(spec: JobSpec) -> bytes:
    """What a job's runs get as their body (a target's) or payload."""
    if spec.handler != HANDLER:
        return spec.payload
    call = call_of(spec.payload)
    return spec.payload if call is None else call.body


def stored_spec(spec: JobSpec, *, check_secret: bool = True) -> JobSpec:
    """A spec with handler ``"http"`` from a source that is not the node's
    API (an outbox row), checked and normalised as a submit's; any other spec
    as it is. Raises ``InvalidArgument`` naming the field. ``check_secret``:
    see ``normalised_target``."""
    if spec.handler != HANDLER:
        return spec
    call = call_of(spec.payload)
    if call is None:
        raise InvalidArgument(
            "spec.handler", f"{HANDLER!r} is reserved for jobs with an HTTP target (spec.http)"
        )
    target = normalised_target(
        call.target,
        tenant=spec.tenant,
        job_timeout_ms=spec.timeout_ms,
        check_secret=check_secret,
    )
    return replace(spec, payload=call_payload(target, call.body))


def history_spec(spec: JobSpec) -> JobSpec:
    """A spec as an update's history keeps it: without its payload, but with
    its HTTP target (so that the history shows a target's change)."""
    target = target_of(spec)
    return replace(spec, payload=b"" if target is None else call_payload(target, b""))
