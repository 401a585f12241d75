"""Shared fixtures: real PostgreSQL and etcd for the tests that claim to use them.

Under ``CI=true`` a missing service fails the test; elsewhere it is skipped.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO

import pytest

from tests.pki import Pki, make_pki

PG_DSN = os.environ.get("WHEEL_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


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


def service_missing(what: str) -> None:
    """Fail under CI (a service test must never be silently skipped), else skip."""
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true", pytrace=False)
    pytest.skip(f"{what} not available")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


class EtcdServer:
    """``tls``: (certificate, key, CA) to serve clients over TLS and require
    client certificates that CA signed."""

    def __init__(self, data_dir: Path, *, tls: tuple[Path, Path, Path] | None = None) -> None:
        self.client_port = free_port()
        self.peer_port = free_port()
        self.data_dir = data_dir
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            service_missing("the etcd binary (Debian package etcd-server)")
            raise AssertionError("unreachable")
        client = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.client_port}"
        tls = []
        if self.tls is not None:
            cert, key, ca = self.tls
            tls = [f"--cert-file={cert}", f"--key-file={key}", f"--trusted-ca-file={ca}"]
            tls.append("--client-cert-auth")
        peer = f"http://127.0.0.1:{self.peer_port}"
        self._log = open(self.data_dir.parent / "etcd.log", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                binary,
                "--name=wheel-test",
                f"--data-dir={self.data_dir}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=wheel-test={peer}",
                "--initial-cluster-state=new",
                *tls,
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.client_port), timeout=0.2):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("etcd exited at start") from None
                time.sleep(0.05)
        raise RuntimeError("etcd did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
            self._print_slow_spells()

    def _print_slow_spells(self) -> None:
        """etcd's own word on being slow (a late fsync or apply, a revoke that
        failed): printed, so that a test failing on a lease that lapsed late
        shows it beside the failure."""
        log = self.data_dir.parent / "etcd.log"
        with contextlib.suppress(OSError):
            for line in log.read_text(errors="replace").splitlines():
                if any(s in line for s in _ETCD_SLOW):
                    print(f"etcd: {line}")


_ETCD_SLOW = ("took too long", "sync duration", "failed to revoke", "slow fdatasync")


# etcd keeps its data in memory where it can: in a deployment it has a disk of
# its own, here it shares one with PostgreSQL, SQLite and LMDB under a busy
# suite. A lease revoke waits on etcd's WAL fsync, and a revoke that does not
# finish in time is retried by etcd only 3 s later: on a shared disk a killed
# node's shards were seen to move 3.3 s past its TTL.
_ETCD_DIR = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


@contextlib.contextmanager
def running_etcd(*, tls: tuple[Path, Path, Path] | None = None) -> Iterator[EtcdServer]:
    """Our own etcd process on free loopback ports in a temp dir (in memory
    where the machine has one); ``tls`` as ``EtcdServer``'s."""
    with tempfile.TemporaryDirectory(prefix="wheel-etcd-", dir=_ETCD_DIR) as tmp:
        server = EtcdServer(Path(tmp) / "data", tls=tls)
        server.start()
        try:
            yield server
        finally:
            server.stop()


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
