"""The checkpoint's files on disk: LMDB environment flags per durability, the
offline check of a data file, the marker of an unsynced session, and the
duty cycle a snapshot keeps to."""

from __future__ import annotations

import importlib
import os
import struct
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

from wheel.errors import CheckpointError, InvalidArgument


class Durability(StrEnum):
    """How hard a commit pushes to disk; see the module docstring for the risks."""

    SYNC = "sync"
    ASYNC = "async"
    NONE = "none"


def _env_flags(durability: Durability) -> dict[str, bool]:
    if durability is Durability.SYNC:
        return {"sync": True, "metasync": True, "writemap": False, "map_async": False}
    if durability is Durability.ASYNC:
        return {"sync": False, "metasync": False, "writemap": False, "map_async": False}
    return {"sync": False, "metasync": False, "writemap": True, "map_async": True}


def _lmdb_verify() -> Any:
    """py-lmdb's offline verifier module, or None on versions without it."""
    try:
        return importlib.import_module("lmdb.verify")
    except ImportError:
        return None


_MDB_MAGIC = 0xBEEFC0DE
_P_META = 0x08


def _check_data_file(data: Path, *, full: bool) -> None:
    """Refuse a data file LMDB could crash on, before LMDB maps it.

    Reads both meta pages (LMDB 0.9 and 1.0 layouts, 64-bit, native order) and
    checks the file is long enough for the committed one. If it is not, or if
    ``full`` (after an unclean non-SYNC session), the whole file is verified
    offline with ``lmdb.verify``. Raises CheckpointError with the reason.
    """
    size = data.stat().st_size
    if size == 0:
        raise CheckpointError(f"{data} is empty (truncated, or never written)")
    with data.open("rb") as f:
        head = f.read(64)
        hdrsz = next(
            (
                off
                for off in (16, 24)
                if len(head) >= off + 4 and struct.unpack_from("=I", head, off)[0] == _MDB_MAGIC
            ),
            None,
        )
        if hdrsz is None:
            raise CheckpointError(f"{data} is not an LMDB data file (no magic in its first page)")

        def meta(offset: int) -> tuple[int, int, int, int]:
            f.seek(offset)
            buf = f.read(hdrsz + 136)
            if len(buf) < hdrsz + 136:
                raise CheckpointError(f"{data} is truncated inside its meta pages ({size} bytes)")
            flags = struct.unpack_from("=H", buf, hdrsz - 6)[0]
            magic = struct.unpack_from("=I", buf, hdrsz)[0]
            if magic != _MDB_MAGIC or not flags & _P_META:
                raise CheckpointError(f"{data} has a damaged meta page at offset {offset}")
            m = hdrsz + 24  # mm_dbs[0]; its md_pad is the page size
            psize = struct.unpack_from("=I", buf, m)[0]
            last_pg, txnid = struct.unpack_from("=QQ", buf, m + 96)
            return psize, last_pg, txnid, magic

        psize, last0, txn0, _ = meta(0)
        if psize < 256 or psize & (psize - 1) or psize > 0x10000:
            raise CheckpointError(f"{data} has an implausible page size {psize}")
        _, last1, txn1, _ = meta(psize)
    last_pg = last1 if txn1 > txn0 else last0
    needed = (last_pg + 1) * psize
    if size >= needed and not full:
        return
    verifier = _lmdb_verify()
    if verifier is None:
        raise CheckpointError(
            f"{data} is {size} bytes but its committed meta needs {needed}: truncated"
        )
    try:
        problems: list[str] = verifier.verify(str(data.parent))
    except Exception as e:
        raise CheckpointError(f"{data} cannot be verified: {e}") from e
    if problems:
        shown = "; ".join(problems[:3])
        raise CheckpointError(f"{data} is damaged ({len(problems)} problem(s)): {shown}")


class DutyCycle:
    """Keeps background work to ``share`` of the wall time: ``pause()``,
    called between units of work, sleeps for as long as the work since the
    last pause took, times ``(1 - share) / share``.

    A snapshot encodes every job in Python on its own thread. Unpaced it took
    the GIL from the dispatch loop for seconds: with a snapshot every 100,000
    log records at 10,000 dispatches/s, p99 lag went to 1.5 s. Paced, it takes
    longer and the loop keeps its share; the log it truncates simply grows
    meanwhile (the snapshot is fuzzy, see wheel.checkpoint.owner_state)."""

    def __init__(
        self,
        share: float,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not 0 < share <= 1:
            raise InvalidArgument("share", f"{share} is outside (0, 1]")
        self._idle_per_busy = (1 - share) / share
        self._clock = clock
        self._sleep = sleep
        self._since = clock()

    def pause(self) -> None:
        worked = self._clock() - self._since
        if worked > 0 and self._idle_per_busy > 0:
            self._sleep(worked * self._idle_per_busy)
        self._since = self._clock()


def _write_marker(path: Path) -> None:
    """Create ``path`` durably (file and directory entry) before unsynced writes begin."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
