"""A PostgreSQL server of a test's own (``initdb`` into a temporary
directory, on a free port): one the test may stop and start without touching
the machine's server that every other test uses."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from testkit.procs import wait_for
from testkit.services import free_port, service_missing


def _bindir() -> Path | None:
    """Where initdb and pg_ctl are: pg_config's answer, else Debian's newest
    server version's directory (pg_config comes with libpq-dev there)."""
    found = shutil.which("pg_config")
    if found is not None:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False)
        path = Path(out.stdout.strip())
        if (path / "initdb").exists():
            return path
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3])
    )
    return versions[-1].parent if versions else None


class OwnPostgres:
    """``initdb`` + ``pg_ctl`` as the ``postgres`` user when run as root."""

    def __init__(self) -> None:
        bindir = _bindir()
        if bindir is None:
            service_missing("initdb and pg_ctl (Debian package postgresql)")
            raise AssertionError("unreachable")
        self.bindir = bindir
        # Not under pytest's temporary directory: that one is the test
        # runner's alone (mode 700), and the server runs as another user.
        self.root = root = Path(tempfile.mkdtemp(prefix="wheel-test-pg-"))
        self.data = root / "pgdata"
        self.port = free_port()
        self.user: list[str] = []
        if os.geteuid() == 0:  # initdb refuses root
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                service_missing("a postgres user to run a test's own PostgreSQL server")
                raise AssertionError("unreachable") from None
            self.user = ["runuser", "-u", "postgres", "--"]
            os.chown(root, owner.pw_uid, owner.pw_gid)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        cmd = [*self.user, str(self.bindir / tool), *args]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = self.root / "postgres.log"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(log), "-o", options, "-w", "start")
        wait_for(self.up, 30, "the test's PostgreSQL to accept connections")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def up(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.dsn, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def remove(self) -> None:
        """Stop the server (if it runs) and delete its files."""
        subprocess.run(
            [
                *self.user,
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.data),
                "-m",
                "immediate",
                "stop",
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )
        shutil.rmtree(self.root, ignore_errors=True)
