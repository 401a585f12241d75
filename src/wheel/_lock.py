"""One node per data directory: an exclusive ``flock`` on a lock file,
held for the life of the process that serves from it.

Two nodes on one data directory would write one SQLite file and one LMDB
checkpoint as if each were alone (two owners of every shard, each restoring
the other's half-written log). The kernel releases a ``flock`` when its
holder exits, however it exits, so a crashed node never leaves a stale lock
behind; the holder's pid is written into the file only to name it in the
refusal.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from wheel.errors import FailedPrecondition

__all__ = ["LOCK_NAME", "DirLock", "lock_data_dir", "lock_sqlite_file"]

LOCK_NAME = "node.lock"


class DirLock:
    """An exclusive lock held through an open file descriptor; ``release``
    (or the process's exit) lets it go."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _holder(fd: int) -> str:
    """The pid the holder wrote, as text ('' when unreadable)."""
    with contextlib.suppress(OSError):
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return text
    return ""


def lock_data_dir(data_dir: Path) -> DirLock:
    """Lock ``data_dir`` for this process, or refuse (``FailedPrecondition``,
    naming the directory and the pid that holds it) when another process
    holds it."""
    return _lock(
        data_dir / LOCK_NAME,
        f"data directory {data_dir}",
        "stop that node or give this one another --data-dir",
    )


def lock_sqlite_file(db: Path) -> DirLock:
    """The same for an SQLite store kept outside the data directory: a
    second node on the same file is refused as on the same directory."""
    return _lock(
        db.with_name(db.name + "." + LOCK_NAME),
        f"SQLite store {db}",
        "stop that node or give this one another --store",
    )


def _lock(path: Path, subject: str, hint: str) -> DirLock:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _holder(fd)
        os.close(fd)
        by = f"another node (pid {pid})" if pid else "another node"
        raise FailedPrecondition(
            f"{subject} is in use by {by}: one node at a time serves from it"
            f" (lock file {path}); {hint}"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return DirLock(path, fd)
