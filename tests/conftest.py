"""Shared fixtures: real PostgreSQL and etcd for the tests that claim to use them.

Under ``CI=true`` a missing service fails the test; elsewhere it is skipped.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from testkit.services import EtcdServer, running_etcd, service_missing
from tests.pki import Pki, make_pki

# psycopg_pool jitters a connection's lifetime with the random module's
# global generator, from its own threads: a pool opening a connection while
# Hypothesis draws an example moved the global state under the draw, which
# Hypothesis reports as a flaky strategy. The pool gets a generator of its own.
with contextlib.suppress(ImportError):
    import psycopg_pool.base

    psycopg_pool.base.random = random.Random().random  # type: ignore[attr-defined]

PG_DSN = os.environ.get("WHEEL_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def pytest_configure(config: pytest.Config) -> None:
    """Never test old code: a compiled module whose source changed since its
    build would run in its source's place."""
    if os.environ.get("WHEEL_PURE_PYTHON"):
        return
    from wheel._compiled import stale

    if old := stale():
        pytest.exit(
            f"compiled modules older than their sources: {', '.join(old)};"
            " run ./scripts/bootstrap.sh (or WHEEL_PURE_PYTHON=1 for the sources)",
            returncode=2,
        )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``WHEEL_TEST_SHARD=I/N`` keeps the I-th of N shards of what the
    markers selected (scripts/test.sh runs the real-process tests as shards
    side by side: they mostly wait on leases and restarts). A file's tests
    stay together (a directory's, where ``SHARD_TOGETHER`` says); they go to
    the shard with the fewest tests so far, largest first."""
    shard = os.environ.get("WHEEL_TEST_SHARD")
    if not shard:
        return
    index, _, count = shard.partition("/")
    mine, shards = int(index), int(count)
    by_group: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_group.setdefault(_shard_group(item), []).append(item)
    loads = [0] * shards
    kept: set[str] = set()
    for group, tests in sorted(by_group.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        target = loads.index(min(loads))
        loads[target] += len(tests)
        if target == mine:
            kept.add(group)
    deselected = [i for i in items if _shard_group(i) not in kept]
    items[:] = [i for i in items if _shard_group(i) in kept]
    config.hook.pytest_deselected(items=deselected)


# Directories whose files share a fixture too dear to make twice at once:
# ``tests/installed`` builds and installs the package (a compile of every
# compiled module) once for all its files.
SHARD_TOGETHER = ("tests/installed/",)


def _shard_group(item: pytest.Item) -> str:
    """What stays in one shard: the item's file, or its directory where
    ``SHARD_TOGETHER`` names it."""
    path = item.nodeid.split("::", 1)[0]
    return next((d for d in SHARD_TOGETHER if path.startswith(d)), path)


def epoch_ms(t: datetime) -> int:
    """Milliseconds since the epoch of a time the client returned (whole
    milliseconds, so the round trip through a float is exact)."""
    return round(t.timestamp() * 1000)


def utc_ms(ms: int) -> datetime:
    """The UTC time ``ms`` milliseconds after the epoch."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


@contextlib.contextmanager
def fresh_schema() -> Iterator[str]:
    """A DSN whose search_path is a fresh schema, dropped afterwards."""
    try:
        import psycopg

        admin = psycopg.connect(PG_DSN, autocommit=True, connect_timeout=3)
    except Exception as exc:
        service_missing(f"PostgreSQL at {PG_DSN} ({exc})")
        raise
    schema = f"wheel_test_{secrets.token_hex(6)}"
    with admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        sep = "&" if "?" in PG_DSN else "?"
        try:
            yield f"{PG_DSN}{sep}options=-csearch_path%3D{schema}"
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    """A DSN whose search_path is a fresh schema, dropped afterwards."""
    with fresh_schema() as dsn:
        yield dsn


@pytest.fixture(scope="module")
def module_pg_dsn() -> Iterator[str]:
    """``pg_dsn``, one schema for a module's tests: for tests that judge only
    the rows of their own jobs, or that share one cluster."""
    with fresh_schema() as dsn:
        yield dsn


@pytest.fixture
def etcd_server() -> Iterator[EtcdServer]:
    """Our own etcd process on free loopback ports in a temp dir."""
    with running_etcd() as server:
        yield server


@pytest.fixture(scope="module")
def module_etcd_server() -> Iterator[EtcdServer]:
    """``etcd_server``, one for a module's tests: each names a cluster (a key
    prefix) of its own, or they share one cluster."""
    with running_etcd() as server:
        yield server


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Two CAs and their certificates (``tests.pki``), made once per session."""
    made = make_pki(tmp_path_factory.mktemp("pki"))
    if made is None:
        service_missing("the openssl command")
        raise AssertionError("unreachable")
    return made
