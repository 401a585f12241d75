"""Open a store from a URL.

``sqlite:///relative/path.db`` and ``sqlite:////absolute/path.db`` (the
SQLAlchemy convention: what follows the third slash is the path), with
optional ``?synchronous=normal`` and ``?busy_timeout_ms=N``;
``sqlite:///:memory:`` for a throwaway store. ``postgresql://...`` (or
``postgres://``) is passed to libpq as is, except for wheel's own query
parameters ``pool_min``, ``pool_max``, ``retries`` (tries of an operation
whose connection is lost), ``pool_timeout_ms`` (how long each try waits for a
connection; 10 s) and ``idle_tx_timeout_ms`` (how long the server lets a
batch transaction holding its shards' epochs wait on the node; 0: no limit).
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from wheel.errors import InvalidArgument
from wheel.store.base import Store

__all__ = ["libpq_dsn", "open_store"]

_PG_OWN = {"pool_min", "pool_max", "retries", "pool_timeout_ms", "idle_tx_timeout_ms"}


def _int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise InvalidArgument("store_url", f"{name} must be an integer, got {value!r}") from None


def libpq_dsn(url: str) -> str | None:
    """A PostgreSQL store URL without wheel's own query parameters, as libpq
    takes it (None for a store that is not PostgreSQL)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        return None
    rest = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in _PG_OWN]
    return urlunsplit(parts._replace(query=urlencode(rest)))


def open_store(url: str, *, migrate: bool = True) -> Store:
    """A migrated store for ``url`` (``migrate=False`` skips the migrations)."""
    parts = urlsplit(url)
    store: Store
    if parts.scheme == "sqlite":
        from wheel.store.sqlite import SQLiteStore

        if parts.netloc:
            raise InvalidArgument("store_url", "sqlite URLs look like sqlite:///path/to/file.db")
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path:
            raise InvalidArgument("store_url", "sqlite URL has no path")
        query = dict(parse_qsl(parts.query))
        unknown = set(query) - {"synchronous", "busy_timeout_ms"}
        if unknown:
            raise InvalidArgument("store_url", f"unknown sqlite options {sorted(unknown)}")
        store = SQLiteStore(
            path,
            synchronous=query.get("synchronous", "full"),
            busy_timeout_ms=_int("busy_timeout_ms", query.get("busy_timeout_ms", "10000")),
        )
    elif parts.scheme in ("postgresql", "postgres"):
        from wheel.store.postgres import PostgresStore
        from wheel.store.postgres._store import IDLE_IN_TRANSACTION_TIMEOUT_MS

        pairs = parse_qsl(parts.query, keep_blank_values=True)
        own = {k: v for k, v in pairs if k in _PG_OWN}
        rest = [(k, v) for k, v in pairs if k not in _PG_OWN]
        dsn = urlunsplit(parts._replace(query=urlencode(rest)))
        store = PostgresStore(
            dsn,
            min_size=_int("pool_min", own.get("pool_min", "1")),
            max_size=_int("pool_max", own.get("pool_max", "4")),
            retries=_int("retries", own.get("retries", "8")),
            pool_timeout_s=_int("pool_timeout_ms", own.get("pool_timeout_ms", "10000")) / 1000,
            idle_in_transaction_timeout_ms=_int(
                "idle_tx_timeout_ms",
                own.get("idle_tx_timeout_ms", str(IDLE_IN_TRANSACTION_TIMEOUT_MS)),
            ),
        )
    else:
        raise InvalidArgument("store_url", f"unsupported store URL scheme {parts.scheme!r}")
    if migrate:
        try:
            store.migrate()
        except BaseException:
            store.close()
            raise
    return store
