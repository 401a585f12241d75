"""Services the tests and the benchmarks start for themselves: free ports,
and etcd. Under ``CI=true`` a missing service fails the test; elsewhere it
is skipped."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def service_missing(what: str) -> None:
    """Fail under CI (a service test must never be silently skipped), else skip."""
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true", pytrace=False)
    pytest.skip(f"{what} not available")


# Ports handed out come from below the kernel's ephemeral range (32768 and
# up on Linux), which is where ``bind(("", 0))`` and every outgoing
# connection take theirs: a port asked of the kernel and then closed can be
# handed to another process's connection, or to another test run's node,
# before the process it was for binds it. Each process claims a block of
# ports by an exclusive lock on a file named after the block (released when
# the process ends, however it ends) and hands its ports out once each, so
# the test runs side by side never pick the same port.
PORTS_FROM, PORTS_TO, PORTS_A_BLOCK = 10_000, 32_000, 500


class _PortBlocks:
    def __init__(self) -> None:
        self._fresh()

    def _fresh(self) -> None:
        """No block yet, for this process (a forked child claims its own)."""
        self._pid = os.getpid()
        self._locks: list[int] = []  # each holds its block
        self._ports: Iterator[int] = iter(())

    def _claim(self) -> Iterator[int]:
        where = Path(tempfile.gettempdir()) / "wheel-test-ports"
        where.mkdir(exist_ok=True)
        for start in range(PORTS_FROM, PORTS_TO, PORTS_A_BLOCK):
            # A bare descriptor, held open while the process lives: the block
            # is ours until it ends, however it ends.
            lock = os.open(where / f"{start}.lock", os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(lock)
                continue
            self._locks.append(lock)
            return iter(range(start, start + PORTS_A_BLOCK))
        raise RuntimeError(f"every block of test ports in {PORTS_FROM}-{PORTS_TO} is claimed")

    def take(self) -> int:
        if os.getpid() != self._pid:
            self._fresh()
        while True:
            port = next(self._ports, None)
            if port is None:
                self._ports = self._claim()
                continue
            with socket.socket() as s:  # something outside the tests may hold it
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port


_blocks = _PortBlocks()


def free_port() -> int:
    """A loopback port nothing listens on, which no other caller of this
    function, in this process or another, gets while this process lives."""
    return _blocks.take()


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
