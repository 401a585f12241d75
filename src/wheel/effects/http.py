"""An HTTP call that carries the fire's idempotency key.

A service that deduplicates by an ``Idempotency-Key`` header (Stripe's
convention, and the IETF draft's) then performs a fire's call once however
many attempts make it: every attempt of one fire sends the same key. wheel
cannot check that the service honours it; that is the service's promise.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from wheel.effects import Fenced, effect_key

__all__ = ["HEADER", "Response", "idempotency_headers", "request"]

HEADER = "Idempotency-Key"


@dataclass(frozen=True, slots=True, kw_only=True)
class Response:
    """What the service answered: status, headers and body (an error status
    too: the handler decides whether it is a retry or a failure)."""

    status: int
    headers: Mapping[str, str]
    body: bytes


def idempotency_headers(
    run: Fenced | str, headers: Mapping[str, str] | None = None, *, name: str | None = None
) -> dict[str, str]:
    """``headers`` with the run's key as ``Idempotency-Key``: for any HTTP
    client (``name`` as in ``wheel.effects.effect_key``)."""
    out = dict(headers or {})
    out[HEADER] = effect_key(run, name)
    return out


def request(
    method: str,
    url: str,
    run: Fenced | str,
    *,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    name: str | None = None,
    timeout: float = 30.0,
) -> Response:
    """Send one request with the run's ``Idempotency-Key`` (standard library
    only). A network failure raises ``OSError`` (``urllib.error.URLError``)."""
    req = urllib.request.Request(
        url,
        data=body,
        method=method.upper(),
        headers=idempotency_headers(run, headers, name=name),
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Response(status=resp.status, headers=dict(resp.headers), body=resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return Response(status=exc.code, headers=dict(exc.headers), body=exc.read())
