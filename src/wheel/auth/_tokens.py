"""Bearer tokens: how they are made, written, parsed and checked.

A token reads ``wheel_<id>_<secret>``: ``id`` is 12 hex digits naming it
(what ``wheelctl token list`` shows and ``revoke`` takes), ``secret`` is 32
random bytes from ``secrets`` in hex. The store keeps the id and the SHA-256
of the secret's bytes, never the secret: a copy of the database grants
nothing. A 256-bit random secret needs no salt or slow hash (nothing to
guess from a dictionary); the comparison is constant-time anyway.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from wheel.errors import InvalidArgument, Unauthenticated
from wheel.store.base import TokenRecord

__all__ = [
    "ADMIN",
    "JOBS_READ",
    "JOBS_WRITE",
    "OPERATOR",
    "SCOPES",
    "WORKER",
    "Minted",
    "check_secret",
    "mint",
    "parse",
    "tenant_pool",
]

JOBS_READ = "jobs:read"
JOBS_WRITE = "jobs:write"
WORKER = "worker"
ADMIN = "admin"
SCOPES = (JOBS_READ, JOBS_WRITE, WORKER, ADMIN)
# The tenant of an operator's token: it acts for every tenant.
OPERATOR = "*"

_PREFIX = "wheel"
_ID_HEX = 12
_SECRET_HEX = 64
MAX_TENANT = 100
MAX_LABEL = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class Minted:
    """A new token: the bearer string (shown once) and its stored record."""

    token: str
    record: TokenRecord


def _hash(secret_hex: str) -> str:
    return hashlib.sha256(bytes.fromhex(secret_hex)).hexdigest()


def tenant_pool(pool: str) -> str | None:
    """The tenant a pool belongs to (``TENANT/...``), or None for a shared pool."""
    owner, slash, _ = pool.partition("/")
    return owner if slash else None


def mint(
    *,
    tenant: str,
    scopes: list[str] | tuple[str, ...],
    now_ms: int,
    ttl_ms: int = 0,
    worker_id: str = "",
    pools: list[str] | tuple[str, ...] = (),
    label: str = "",
) -> Minted:
    """A new token after checking its fields (``InvalidArgument`` names the
    one that is wrong)."""
    if not tenant or len(tenant) > MAX_TENANT:
        raise InvalidArgument("tenant", f"must be 1 to {MAX_TENANT} characters ('*': operator)")
    if tenant != OPERATOR and ("*" in tenant or "/" in tenant):
        raise InvalidArgument("tenant", f"{tenant!r}: '*' and '/' are not allowed in a tenant")
    wanted = tuple(dict.fromkeys(scopes))
    if not wanted:
        raise InvalidArgument("scopes", f"give at least one of {', '.join(SCOPES)}")
    for scope in wanted:
        if scope not in SCOPES:
            raise InvalidArgument("scopes", f"{scope!r} is not one of {', '.join(SCOPES)}")
    if ADMIN in wanted and tenant != OPERATOR:
        raise InvalidArgument("scopes", "admin is for operator tokens (tenant '*') only")
    if ttl_ms < 0:
        raise InvalidArgument("ttl", f"{ttl_ms} ms is negative")
    if len(label) > MAX_LABEL:
        raise InvalidArgument("label", f"longer than {MAX_LABEL} characters")
    bound_pools: tuple[str, ...] = ()
    if WORKER in wanted:
        if not worker_id:
            raise InvalidArgument("worker_id", "a token with scope worker is bound to a worker id")
        bound_pools = tuple(dict.fromkeys(pools)) or ("default",)
        for pool in bound_pools:
            if not pool:
                raise InvalidArgument("pools", "a pool name must not be empty")
            if tenant != OPERATOR and tenant_pool(pool) != tenant:
                raise InvalidArgument(
                    "pools",
                    f"{pool!r}: a worker token of tenant {tenant!r} serves only pools"
                    f" named '{tenant}/...'",
                )
    elif worker_id or pools:
        raise InvalidArgument("worker_id", "only a token with scope worker takes a worker id")
    token_id = secrets.token_hex(_ID_HEX // 2)
    secret = secrets.token_hex(_SECRET_HEX // 2)
    record = TokenRecord(
        token_id=token_id,
        secret_hash=_hash(secret),
        tenant=tenant,
        scopes=wanted,
        worker_id=worker_id or None,
        pools=bound_pools,
        label=label,
        created_at_ms=now_ms,
        expires_at_ms=now_ms + ttl_ms if ttl_ms else None,
    )
    return Minted(token=f"{_PREFIX}_{token_id}_{secret}", record=record)


def parse(token: str) -> tuple[str, str]:
    """(token id, secret) of a bearer token; ``Unauthenticated`` if it is not
    one this scheme makes."""
    prefix, _, rest = token.partition("_")
    token_id, _, secret = rest.partition("_")
    if (
        prefix != _PREFIX
        or len(token_id) != _ID_HEX
        or len(secret) != _SECRET_HEX
        or not _is_hex(token_id)
        or not _is_hex(secret)
    ):
        raise Unauthenticated("authorization: not a wheel bearer token")
    return token_id, secret


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def check_secret(record: TokenRecord, secret: str) -> bool:
    """Whether ``secret`` is the one ``record`` was minted with (constant time)."""
    return hmac.compare_digest(_hash(secret), record.secret_hash)
