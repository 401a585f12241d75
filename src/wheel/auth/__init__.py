"""Authenticated tenants and workers: bearer tokens (stored hashed), the
scopes they carry, and the server interceptor that checks them.

- A token carries a tenant (``*``: an operator, acting for every tenant),
  scopes (``jobs:read``, ``jobs:write``, ``worker``, ``admin``) and an
  optional expiry; a worker token is bound to a worker id and pools.
- The tenant of a call comes from its token, never from the request: a
  tenant's request naming another tenant acts for its own tenant all the same,
  and another tenant's jobs and runs answer NOT_FOUND.
- Missing or bad credentials get UNAUTHENTICATED; a scope, worker id or pool
  the credential lacks gets PERMISSION_DENIED.
"""

import os

from wheel.auth._authority import (
    AUTHORIZATION,
    DEFAULT_RECHECK_S,
    Authenticator,
    Principal,
    bearer,
)
from wheel.auth._interceptor import AuthInterceptor, scope_of
from wheel.auth._tokens import (
    ADMIN,
    JOBS_READ,
    JOBS_WRITE,
    OPERATOR,
    SCOPES,
    WORKER,
    Minted,
    mint,
    parse,
    tenant_pool,
)

__all__ = [
    "ADMIN",
    "AUTHORIZATION",
    "DEFAULT_RECHECK_S",
    "JOBS_READ",
    "JOBS_WRITE",
    "OPERATOR",
    "SCOPES",
    "TOKEN_ENV",
    "WORKER",
    "AuthInterceptor",
    "Authenticator",
    "Minted",
    "Principal",
    "bearer",
    "call_metadata",
    "metadata_of",
    "mint",
    "parse",
    "scope_of",
    "tenant_pool",
]


# Where the SDKs and wheelctl find a bearer token when none is given.
TOKEN_ENV = "WHEEL_TOKEN"


def metadata_of(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries ``token`` (none without one)."""
    return ((AUTHORIZATION, f"Bearer {token}"),) if token else ()


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata every call of an SDK carries: ``authorization: Bearer
    <token>`` for ``token``, else for $WHEEL_TOKEN; nothing when neither is
    set (a node without ``--auth``)."""
    token = token if token is not None else os.environ.get(TOKEN_ENV)
    return metadata_of(token.strip() if token else None)
