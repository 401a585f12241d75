"""Who is calling: a bearer token from gRPC metadata checked against the
store, with a short cache.

A node reads a token's record from the store on first sight and again once
the copy it holds is ``recheck_s`` old; an open worker stream reads it
afresh every ``recheck_s`` (and checks at the token's expiry itself). So a
token revoked through any node, or past its expiry, is refused by every node
within ``recheck_s`` plus one store read, on new calls and on open streams
alike. A revoke made through a node takes effect on that node's new calls at
once.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from wheel.auth._tokens import OPERATOR, check_secret, parse
from wheel.errors import NotFound, Unauthenticated
from wheel.store.base import TokenRecord

AUTHORIZATION = "authorization"
# The bound on how long a revoked or expired token keeps working: every
# cached token record is read again from the store once it is this old.
DEFAULT_RECHECK_S = 5.0
# Unknown token ids are remembered too (a flood of made-up tokens must not
# turn into a flood of store reads), up to this many entries in all.
MAX_CACHED = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    """The caller a valid token stands for."""

    token_id: str
    tenant: str
    scopes: frozenset[str]
    worker_id: str | None = None
    pools: tuple[str, ...] = ()
    expires_at_ms: int | None = None

    @property
    def operator(self) -> bool:
        """Acts for every tenant (tenant ``*``)."""
        return self.tenant == OPERATOR

    def sees(self, tenant: str) -> bool:
        """Whether the caller may see and touch ``tenant``'s jobs and runs."""
        return self.tenant == OPERATOR or self.tenant == tenant


def bearer(metadata: Sequence[tuple[str, Any]] | None) -> str:
    """The token of an ``authorization: Bearer <token>`` entry."""
    for key, value in metadata or ():
        if key == AUTHORIZATION:
            text = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, token = text.strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthenticated("authorization: expected 'Bearer <token>'")
            return token.strip()
    raise Unauthenticated("authorization: missing bearer token")


class Authenticator:
    """Checks bearer tokens against the store by the node's clock
    (``now_ms``); ``get_token`` reads a token's record (``NotFound``: no such
    token) without blocking the event loop."""

    def __init__(
        self,
        get_token: Callable[[str], Awaitable[TokenRecord]],
        *,
        now_ms: Callable[[], int],
        recheck_s: float = DEFAULT_RECHECK_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._get_token = get_token
        self._now_ms = now_ms
        self.recheck_s = recheck_s
        self._monotonic = monotonic
        # token id -> (record or None when unknown, when it was read).
        self._cache: dict[str, tuple[TokenRecord | None, float]] = {}
        # The bearer string of a call that passed -> its caller, and when its
        # record was read: the hot path (every call is checked twice, by the
        # interceptor and by its handler) without parsing or hashing again.
        self._passed: dict[str, tuple[Principal, float]] = {}

    async def _record(self, token_id: str, *, fresh: bool = False) -> TokenRecord | None:
        now = self._monotonic()
        hit = self._cache.get(token_id)
        if hit is not None and not fresh and now - hit[1] < self.recheck_s:
            return hit[0]

        record: TokenRecord | None
        try:
            record = await self._get_token(token_id)
        except NotFound:
            record = None
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()
            self._passed.clear()
        self._cache[token_id] = (record, now)
        return record

    def forget(self, token_id: str) -> None:
        """Drop the cached record (the token was revoked through this node)."""
        self._cache.pop(token_id, None)
        for text, (principal, _) in list(self._passed.items()):
            if principal.token_id == token_id:
                del self._passed[text]

    def _valid(self, record: TokenRecord | None) -> TokenRecord:
        if record is None:
            raise Unauthenticated("authorization: unknown token")
        if record.revoked_at_ms is not None:
            raise Unauthenticated(f"authorization: token {record.token_id} was revoked")
        if record.expires_at_ms is not None and self._now_ms() >= record.expires_at_ms:
            raise Unauthenticated(f"authorization: token {record.token_id} has expired")
        return record

    async def authenticate(self, metadata: Sequence[tuple[str, Any]] | None) -> Principal:
        """The caller of a call with this metadata; ``Unauthenticated`` when
        it has no valid bearer token."""
        text = bearer(metadata)
        hit = self._passed.get(text)
        if hit is not None:
            principal, read_at = hit
            expires = principal.expires_at_ms
            if self._monotonic() - read_at < self.recheck_s and (
                expires is None or self._now_ms() < expires
            ):
                return principal
        token_id, secret = parse(text)
        record = await self._record(token_id)
        if record is None or not check_secret(record, secret):
            raise Unauthenticated("authorization: unknown token")
        record = self._valid(record)
        principal = Principal(
            token_id=record.token_id,
            tenant=record.tenant,
            scopes=frozenset(record.scopes),
            worker_id=record.worker_id,
            pools=record.pools,
            expires_at_ms=record.expires_at_ms,
        )
        read_at = self._cache.get(token_id, (None, self._monotonic()))[1]
        if len(self._passed) >= MAX_CACHED:
            self._passed.clear()
        self._passed[text] = (principal, read_at)
        return principal

    async def recheck(self, principal: Principal) -> None:
        """For an open stream, every ``recheck_s``: ``Unauthenticated`` once
        the caller's token is revoked, expired or gone, as the store says now
        (one read a stream each time: a primary-key lookup)."""
        self._valid(await self._record(principal.token_id, fresh=True))

    def seconds_to_recheck(self, principal: Principal) -> float:
        """How long an open stream may wait before its next ``recheck``: the
        re-check interval, or less when the token expires sooner."""
        wait = self.recheck_s
        if principal.expires_at_ms is not None:
            wait = min(wait, max(0.0, (principal.expires_at_ms - self._now_ms()) / 1000))
        return wait
