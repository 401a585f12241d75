"""The shard owner's local checkpoint: an LMDB write-ahead log plus snapshots.

The checkpoint only makes restarts fast; the store stays the record of truth.
So every doubt about the files becomes ``CheckpointError`` and the caller
rebuilds from the store (loudly) and calls ``reset()`` (or ``destroy()`` when
``open()`` itself failed). The layer is generic: it stores opaque byte records
and opaque snapshot chunks (``wheel.checkpoint.codec`` helps encode them).

One LMDB environment (a directory holding ``data.mdb`` and ``lock.mdb``) with
three named databases:

- ``meta``: ``format`` (u32), ``identity`` (JSON), ``snapshot`` (a pointer:
  snapshot id, the seq it covers, piece and chunk counts, with its own CRC).
- ``log``: key = big-endian u64 seq, so cursor order is seq order; value =
  ``version:u8 crc32:u32 len:u32`` + payload. The CRC covers key and payload.
- ``snap``: key = big-endian ``snapshot id:u64 piece:u32``; value =
  ``version:u8 crc32:u32 len:u32 flags:u8`` + at most 256 KiB of a chunk
  (flag 1 marks a chunk's last piece). Big chunks are split so no LMDB value
  is huge, and rejoined on recovery.

``append`` is one write transaction per batch (group commit): a batch is in the
log entirely or not at all. ``write_snapshot`` writes pieces under a new
snapshot id in several short transactions, flips the pointer in one small
transaction, then deletes the covered log records and the old snapshot in
short batches; a crash at any step leaves either the old or the new snapshot
current, and leftovers are ignored and cleaned up by the next snapshot.

Durability (what a crash can cost):

- ``SYNC`` (default): fsync on every commit. An acknowledged append survives a
  process crash and a power loss.
- ``ASYNC``: no fsync on commit (LMDB ``sync=False, metasync=False``); the OS
  writes pages back on its own schedule, and ``write_snapshot``/``close``
  flush. A process crash loses nothing (the pages are in the OS cache); a power
  loss or kernel crash loses the recent appends and can leave the file
  inconsistent. An ``unclean`` marker file is kept while such a session is
  open; if it is found at ``open()``, the whole file is structurally verified
  (``lmdb.verify``, ~60 MB/s) before LMDB touches it, and damage becomes
  ``CheckpointError``.
- ``NONE``: ``writemap`` + no sync (+ ``map_async``): fastest, same crash
  exposure as ``ASYNC`` plus stray writes through the map can corrupt the file.
  For tests and benchmarks only.

Disk usage: LMDB never shrinks ``data.mdb``. After a snapshot truncates the
log, the freed pages are reused, so the file stops growing at roughly the
high-water mark of (snapshot x 2 + log between snapshots). ``log_bytes``,
``snapshot_bytes``, ``file_bytes`` and ``map_size`` expose the numbers. The map
(address space, not disk) doubles whenever a transaction hits ``MDB_MAP_FULL``,
up to ``max_map_size`` if given, beyond which writes raise ``CheckpointError``.

Threads and processes: ``append``, ``recover``, ``reset`` and ``close`` come
from one thread at a time; ``write_snapshot`` may run in another thread
concurrently with appends (each write transaction is short, and LMDB runs one
writer at a time). An environment must not be opened twice in one process
(LMDB's locks are per process): ``open()`` refuses a second open of the same
path with ``CheckpointError``; close the first one. Another process must not
open it either while this one has it open.

A truncated or damaged ``data.mdb`` could crash the process inside LMDB (its
pages are read through mmap, a page past the end of the file raises SIGBUS).
``open()`` therefore reads both meta pages itself first and, if the file is
shorter than the committed meta says, verifies the file offline before
opening it; damage is reported as ``CheckpointError``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import lmdb

from wheel.checkpoint._files import (
    Durability,
    _check_data_file,
    _env_flags,
    _write_marker,
)
from wheel.errors import CheckpointError, InvalidArgument

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "Durability",
    "Identity",
    "Recovery",
]

log = logging.getLogger("wheel.checkpoint")

FORMAT_VERSION = 1
"""Version of the layout described in the module docstring."""

_T = TypeVar("_T")

MiB = 1 << 20
_MIN_MAP_SIZE = 64 * 1024  # smaller maps cannot even hold the three named databases
_PIECE_BYTES = 256 * 1024  # largest snapshot value
_SNAPSHOT_TXN_BYTES = 4 * MiB  # snapshot bytes written per write transaction
_DELETE_BATCH = 20_000  # keys deleted per write transaction when truncating

_RECORD_VERSION = 1
_KEY = struct.Struct(">Q")
_REC_HDR = struct.Struct(">BII")  # version, crc32(key + payload), payload length
_PIECE_KEY = struct.Struct(">QI")  # snapshot id, piece index
_PIECE_HDR = struct.Struct(">BIIB")  # version, crc32(key + data), data length, flags
_PIECE_LAST = 1  # flags: this piece ends a chunk
_POINTER = struct.Struct(">QQIIQ")  # snapshot id, upto seq, pieces, chunks, total bytes
_CRC = struct.Struct(">I")
_FORMAT = struct.Struct(">I")

_META_FORMAT = b"format"
_META_IDENTITY = b"identity"
_META_SNAPSHOT = b"snapshot"

_UNCLEAN = "unclean"  # marker file: a non-SYNC session is (or was, if found at open) running

# Paths open in this process; LMDB forbids a second open of the same environment.
_open_paths: set[Path] = set()
_open_paths_lock = threading.Lock()


@dataclass(frozen=True, slots=True, kw_only=True)
class Identity:
    """Whose checkpoint this is; a checkpoint written for another identity is never used."""

    cluster_id: str
    shard_set: str  # e.g. "0-255"

    def __post_init__(self) -> None:
        if not self.cluster_id:
            raise InvalidArgument("cluster_id", "must not be empty")
        if not self.shard_set:
            raise InvalidArgument("shard_set", "must not be empty")

    def _encode(self) -> bytes:
        return json.dumps(
            {"cluster_id": self.cluster_id, "shard_set": self.shard_set}, sort_keys=True
        ).encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    """What ``recover()`` found: the snapshot's chunks, then the log records after it."""

    snapshot: list[bytes] | None  # None: no snapshot was ever written (or since reset)
    snapshot_seq: int  # last seq the snapshot covers; 0 without a snapshot
    records: list[tuple[int, bytes]]  # (seq, payload) after snapshot_seq, in seq order
    warnings: list[str]  # e.g. a torn final record that was dropped


@dataclass(frozen=True, slots=True)
class _Pointer:
    snapshot_id: int
    upto_seq: int
    pieces: int
    chunks: int
    total_bytes: int

    def encode(self) -> bytes:
        body = _POINTER.pack(
            self.snapshot_id, self.upto_seq, self.pieces, self.chunks, self.total_bytes
        )
        return body + _CRC.pack(zlib.crc32(body))

    @staticmethod
    def decode(raw: bytes | memoryview) -> _Pointer:
        if len(raw) != _POINTER.size + _CRC.size:
            raise CheckpointError(f"snapshot pointer has {len(raw)} bytes, expected 32")
        body = bytes(raw[: _POINTER.size])
        if _CRC.unpack_from(raw, _POINTER.size)[0] != zlib.crc32(body):
            raise CheckpointError("snapshot pointer fails its checksum")
        return _Pointer(*_POINTER.unpack(body))


class Checkpoint:
    """An open checkpoint; create it with ``Checkpoint.open``."""

    def __init__(
        self,
        *,
        path: Path,
        env: lmdb.Environment,
        dbs: tuple[Any, Any, Any],
        identity: Identity,
        durability: Durability,
        max_map_size: int | None,
    ) -> None:
        self._path = path
        self._env = env
        self._meta, self._log, self._snap = dbs
        self._identity = identity
        self._durability = durability
        self._max_map_size = max_map_size
        # Held around every LMDB transaction, so the map can be resized safely
        # (LMDB requires no live transaction in the process for that).
        self._lock = threading.Lock()
        self._snapshot_lock = threading.Lock()
        self._problem: str | None = None  # set: unusable until reset()
        self._last_seq = 0
        self._closed = False

    # -- opening and closing --------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | Path,
        identity: Identity,
        *,
        durability: Durability = Durability.SYNC,
        initial_map_size: int = 64 * MiB,
        max_map_size: int | None = None,
    ) -> Checkpoint:
        """Open (creating if needed) the checkpoint in directory ``path``.

        A checkpoint of another identity or format opens, but ``recover`` and
        ``append`` raise CheckpointError until ``reset``. A file LMDB cannot
        safely open raises CheckpointError here; then ``destroy(path)``.
        """
        durability = Durability(durability)
        if initial_map_size < _MIN_MAP_SIZE:
            raise InvalidArgument("initial_map_size", f"must be at least {_MIN_MAP_SIZE}")
        if max_map_size is not None and max_map_size < initial_map_size:
            raise InvalidArgument("max_map_size", "must be at least initial_map_size")
        root = Path(path).resolve()
        with _open_paths_lock:
            if root in _open_paths:
                raise CheckpointError(f"checkpoint {root} is already open in this process")
            _open_paths.add(root)
        try:
            return cls._open(root, identity, durability, initial_map_size, max_map_size)
        except BaseException:
            with _open_paths_lock:
                _open_paths.discard(root)
            raise

    @classmethod
    def _open(
        cls,
        root: Path,
        identity: Identity,
        durability: Durability,
        initial_map_size: int,
        max_map_size: int | None,
    ) -> Checkpoint:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CheckpointError(f"cannot create checkpoint directory {root}: {e}") from e
        data = root / "data.mdb"
        unclean = root / _UNCLEAN
        if data.exists():
            _check_data_file(data, full=unclean.exists())
        if durability is not Durability.SYNC:
            _write_marker(unclean)
        try:
            env = lmdb.open(
                str(root),
                map_size=initial_map_size,
                subdir=True,
                max_dbs=4,
                lock=True,
                readahead=False,
                **_env_flags(durability),
            )
        except lmdb.Error as e:
            raise CheckpointError(f"cannot open LMDB checkpoint at {root}: {e}") from e
        try:
            env.reader_check()  # reader slots a killed process left would pin freed pages
            # DB handles are opened in a write transaction so a tiny map grows
            # like for any other write; the placeholders are replaced at once.
            cp = cls(
                path=root,
                env=env,
                dbs=(None, None, None),
                identity=identity,
                durability=durability,
                max_map_size=max_map_size,
            )

            def open_dbs(txn: lmdb.Transaction) -> tuple[Any, Any, Any]:
                return (
                    env.open_db(b"meta", txn=txn),
                    env.open_db(b"log", txn=txn),
                    env.open_db(b"snap", txn=txn),
                )

            cp._meta, cp._log, cp._snap = cp._write(open_dbs)
            cp._load()
            if durability is Durability.SYNC and unclean.exists():
                env.sync(True)  # pages a previous ASYNC session left unflushed
                unclean.unlink()
        except BaseException:
            env.close()
            raise
        return cp

    def close(self) -> None:
        """Flush (in ASYNC/NONE mode) and close; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            # Waits for a snapshot being written in another thread to finish.
            with self._snapshot_lock, self._lock:
                try:
                    if self._durability is not Durability.SYNC:
                        self._env.sync(True)
                        # Only once flushed: a marker left behind makes open() verify.
                        with contextlib.suppress(FileNotFoundError):
                            (self._path / _UNCLEAN).unlink()
                finally:
                    self._env.close()
        finally:
            with _open_paths_lock:
                _open_paths.discard(self._path)

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def destroy(path: str | Path) -> None:
        """Delete the checkpoint files in ``path`` (it must not be open in this process)."""
        root = Path(path).resolve()
        with _open_paths_lock:
            if root in _open_paths:
                raise CheckpointError(f"checkpoint {root} is open; close it before destroy()")
        for name in ("data.mdb", "lock.mdb", _UNCLEAN):
            with contextlib.suppress(FileNotFoundError):
                (root / name).unlink()

    # -- the log ---------------------------------------------------------------

    def append(self, records: Sequence[bytes]) -> int:
        """Append a batch in one write transaction (all or nothing); return its last seq."""
        self._check_usable()
        if not records:
            return self._last_seq
        first = self._last_seq + 1
        crc32 = zlib.crc32
        key = _KEY.pack
        hdr = _REC_HDR.pack
        items = []
        for seq, rec in enumerate(records, first):
            k = key(seq)
            items.append((k, hdr(_RECORD_VERSION, crc32(rec, crc32(k)), len(rec)) + rec))
        last = first + len(items) - 1

        def put(txn: lmdb.Transaction) -> None:
            _consumed, added = txn.cursor(db=self._log).putmulti(items, append=True)
            if added != len(items):
                raise CheckpointError(
                    f"log already holds seqs in {first}..{last}; the checkpoint is inconsistent"
                )

        self._write(put)
        self._last_seq = last
        return last

    def last_seq(self) -> int:
        """The seq of the last record appended (or covered by the snapshot)."""
        return self._last_seq

    def log_records(self) -> int:
        """Records in the log, including ones a snapshot covers but not yet truncated."""
        return self._stat(self._log)[0]

    def log_bytes(self) -> int:
        """Bytes of LMDB pages the log occupies."""
        return self._stat(self._log)[1]

    def snapshot_bytes(self) -> int:
        """Bytes of LMDB pages snapshots occupy (current plus any being written)."""
        return self._stat(self._snap)[1]

    def file_bytes(self) -> int:
        """Size of ``data.mdb`` on disk; it never shrinks, free pages are reused."""
        return (self._path / "data.mdb").stat().st_size

    def map_size(self) -> int:
        """The current LMDB map size (address space reserved, grows on demand)."""
        with self._lock:
            return self._env.info()["map_size"]

    # -- snapshots ------------------------------------------------------------

    def write_snapshot(
        self,
        chunks: Iterable[bytes],
        upto_seq: int,
        *,
        pause: Callable[[], None] | None = None,
    ) -> None:
        """Store a snapshot covering seqs <= ``upto_seq``, switch to it, truncate the log.

        Chunks are written in several short transactions under a new snapshot
        id; the switch is one small transaction; then covered log records and
        the old snapshot are deleted in batches. ``chunks`` is consumed outside
        any transaction. May run in another thread than ``append``. ``pause``
        (e.g. ``DutyCycle.pause``) is called after each chunk and each batch of
        deletes, outside any transaction, to leave the rest of the process
        its time.
        """
        with self._snapshot_lock:
            self._check_usable()
            if upto_seq < 0 or upto_seq > self._last_seq:
                raise InvalidArgument(
                    "upto_seq", f"{upto_seq} is outside 0..{self._last_seq} (the last seq)"
                )
            current_raw, top_id = self._read(self._snapshot_state)
            current = _Pointer.decode(current_raw) if current_raw is not None else None
            if current is not None and upto_seq < current.upto_seq:
                raise InvalidArgument(
                    "upto_seq",
                    f"{upto_seq} is older than the current snapshot's {current.upto_seq}",
                )
            keep = current.snapshot_id if current is not None else None
            self._delete_stale_snapshots(keep)
            new_id = max(top_id, keep or 0) + 1
            try:
                pointer = self._write_pieces(new_id, upto_seq, chunks, pause)

                def flip(txn: lmdb.Transaction) -> None:
                    if txn.get(_META_SNAPSHOT, db=self._meta) != current_raw:
                        raise CheckpointError("snapshot pointer changed while writing a snapshot")
                    txn.put(_META_SNAPSHOT, pointer.encode(), db=self._meta)

                self._write(flip)
            except BaseException:
                self._delete_range(
                    self._snap, _PIECE_KEY.pack(new_id, 0), _PIECE_KEY.pack(new_id + 1, 0)
                )
                raise
            self._delete_range(self._log, b"", _KEY.pack(upto_seq + 1), pause)
            if keep is not None:
                self._delete_range(
                    self._snap, _PIECE_KEY.pack(keep, 0), _PIECE_KEY.pack(keep + 1, 0), pause
                )
            if self._durability is not Durability.SYNC:
                self._env.sync(True)

    def _snapshot_state(self, txn: lmdb.Transaction) -> tuple[bytes | None, int]:
        raw = txn.get(_META_SNAPSHOT, db=self._meta)
        cur = txn.cursor(db=self._snap)
        top = _PIECE_KEY.unpack(cur.key())[0] if cur.last() else 0
        return (bytes(raw) if raw is not None else None), top

    def _delete_stale_snapshots(self, keep: int | None) -> None:
        """Remove pieces of snapshots that never became current (a crash mid-write)."""
        if keep is None:
            self._delete_range(self._snap, b"", None)
            return
        self._delete_range(self._snap, b"", _PIECE_KEY.pack(keep, 0))
        self._delete_range(self._snap, _PIECE_KEY.pack(keep + 1, 0), None)

    def _write_pieces(
        self,
        snapshot_id: int,
        upto_seq: int,
        chunks: Iterable[bytes],
        pause: Callable[[], None] | None = None,
    ) -> _Pointer:
        pending: list[tuple[bytes, bytes]] = []
        pending_bytes = 0
        piece = 0
        n_chunks = 0
        total = 0
        crc32 = zlib.crc32

        def flush(txn: lmdb.Transaction) -> None:
            txn.cursor(db=self._snap).putmulti(pending, append=True)

        for chunk in chunks:
            view = memoryview(chunk)
            n_chunks += 1
            total += len(view)
            offset = 0
            while True:
                part = bytes(view[offset : offset + _PIECE_BYTES])
                offset += len(part)
                flags = _PIECE_LAST if offset >= len(view) else 0
                k = _PIECE_KEY.pack(snapshot_id, piece)
                pending.append(
                    (k, _PIECE_HDR.pack(1, crc32(part, crc32(k)), len(part), flags) + part)
                )
                piece += 1
                pending_bytes += len(part) + 64
                if pending_bytes >= _SNAPSHOT_TXN_BYTES:
                    self._write(flush)
                    pending = []
                    pending_bytes = 0
                if flags:
                    break
            if pause is not None:
                pause()
        if pending:
            self._write(flush)
        return _Pointer(snapshot_id, upto_seq, piece, n_chunks, total)

    # -- recovery ------------------------------------------------------------

    def recover(self) -> Recovery:
        """Read the current snapshot and the log records after it.

        A torn final record is dropped (and deleted) with a warning; any other
        damage, a foreign identity or an unknown format raises CheckpointError
        and leaves the checkpoint unusable until ``reset()``.
        """
        self._check_usable()
        try:
            snapshot, snapshot_seq, records, torn = self._read(self._scan, buffers=True)
        except CheckpointError as e:
            self._problem = str(e)
            log.error("checkpoint %s is unusable: %s", self._path, e)
            raise
        warnings: list[str] = []
        if torn is not None:
            seq, why = torn
            msg = f"checkpoint {self._path}: dropped torn final log record {seq} ({why})"
            log.warning(msg)
            warnings.append(msg)
            self._write(lambda txn: txn.delete(_KEY.pack(seq), db=self._log))
        self._last_seq = records[-1][0] if records else snapshot_seq
        return Recovery(
            snapshot=snapshot, snapshot_seq=snapshot_seq, records=records, warnings=warnings
        )

    def _scan(
        self, txn: lmdb.Transaction
    ) -> tuple[list[bytes] | None, int, list[tuple[int, bytes]], tuple[int, str] | None]:
        raw = txn.get(_META_SNAPSHOT, db=self._meta)
        pointer = _Pointer.decode(raw) if raw is not None else None
        snapshot = self._read_snapshot(txn, pointer) if pointer is not None else None
        snapshot_seq = pointer.upto_seq if pointer is not None else 0

        records: list[tuple[int, bytes]] = []
        torn: tuple[int, str] | None = None
        cur = txn.cursor(db=self._log)
        expected = snapshot_seq + 1
        crc32 = zlib.crc32
        unpack_key = _KEY.unpack
        unpack_hdr = _REC_HDR.unpack_from
        hsize = _REC_HDR.size
        more = cur.set_range(_KEY.pack(expected))
        while more:
            k, v = cur.item()
            (seq,) = unpack_key(k)
            if seq != expected:
                raise CheckpointError(
                    f"log has a gap: expected seq {expected}, found {seq} "
                    f"(snapshot covers up to {snapshot_seq})"
                )
            # Buffers from a buffers=True cursor die when it moves: copy first.
            why = None
            if len(v) < hsize:
                why = f"header truncated to {len(v)} bytes"
            else:
                version, crc, length = unpack_hdr(v)
                payload = v[hsize:]
                if version != _RECORD_VERSION:
                    why = f"unknown record version {version}"
                elif len(payload) != length:
                    why = f"payload is {len(payload)} bytes, header says {length}"
                elif crc32(payload, crc32(k)) != crc:
                    why = "checksum mismatch"
                else:
                    records.append((seq, bytes(payload)))
            more = cur.next()
            if why is not None:
                if more:
                    raise CheckpointError(f"log record {seq} is corrupt ({why}) before the tail")
                torn = (seq, why)
                break
            expected += 1
        return snapshot, snapshot_seq, records, torn

    def _read_snapshot(self, txn: lmdb.Transaction, pointer: _Pointer) -> list[bytes]:
        chunks: list[bytes] = []
        parts: list[bytes] = []
        cur = txn.cursor(db=self._snap)
        crc32 = zlib.crc32
        hsize = _PIECE_HDR.size
        sid = pointer.snapshot_id
        more = cur.set_range(_PIECE_KEY.pack(sid, 0))
        for index in range(pointer.pieces):
            k = bytes(cur.key()) if more else b""
            if not more or _PIECE_KEY.unpack(k) != (sid, index):
                raise CheckpointError(
                    f"snapshot {sid} is missing piece {index} of {pointer.pieces}"
                )
            v = cur.value()
            if len(v) < hsize:
                raise CheckpointError(f"snapshot {sid} piece {index} is truncated")
            version, crc, length, flags = _PIECE_HDR.unpack_from(v)
            data = v[hsize:]
            if version != 1 or len(data) != length or crc32(data, crc32(k)) != crc:
                raise CheckpointError(f"snapshot {sid} piece {index} fails its checksum")
            parts.append(bytes(data))
            if flags & _PIECE_LAST:
                chunks.append(parts[0] if len(parts) == 1 else b"".join(parts))
                parts = []
            more = cur.next()
        if parts or len(chunks) != pointer.chunks:
            raise CheckpointError(
                f"snapshot {sid} has {len(chunks)} complete chunks, pointer says {pointer.chunks}"
            )
        if sum(map(len, chunks)) != pointer.total_bytes:
            raise CheckpointError(f"snapshot {sid} size differs from its pointer")
        return chunks

    # -- reset -----------------------------------------------------------------

    def reset(self) -> None:
        """Wipe log, snapshots and meta, and start fresh under this identity."""

        def wipe(txn: lmdb.Transaction) -> None:
            for db in (self._meta, self._log, self._snap):
                txn.drop(db, delete=False)
            self._init_meta(txn)

        self._write(wipe)
        self._problem = None
        self._last_seq = 0
        log.warning("checkpoint %s was reset", self._path)

    # -- internals -------------------------------------------------------------

    def _init_meta(self, txn: lmdb.Transaction) -> None:
        txn.put(_META_FORMAT, _FORMAT.pack(FORMAT_VERSION), db=self._meta)
        txn.put(_META_IDENTITY, self._identity._encode(), db=self._meta)

    def _load(self) -> None:
        """Read meta at open: initialise a fresh file, note any reason not to trust it."""

        def load(txn: lmdb.Transaction) -> str | None:
            fmt = txn.get(_META_FORMAT, db=self._meta)
            if fmt is None:
                if txn.stat(self._log)["entries"] or txn.stat(self._snap)["entries"]:
                    return "checkpoint has data but no format version"
                self._init_meta(txn)
                return None
            if len(fmt) != _FORMAT.size or _FORMAT.unpack(fmt)[0] != FORMAT_VERSION:
                return (
                    f"unknown checkpoint format {bytes(fmt)!r} (this build reads {FORMAT_VERSION})"
                )
            ident = txn.get(_META_IDENTITY, db=self._meta)
            if ident != self._identity._encode():
                return (
                    f"checkpoint belongs to {ident!r}, not {self._identity._encode()!r}"
                    if ident is not None
                    else "checkpoint has no identity"
                )
            return None

        self._problem = self._write(load)
        if self._problem is not None:
            log.error("checkpoint %s is unusable: %s", self._path, self._problem)
            return
        try:
            raw, _top = self._read(self._snapshot_state)
            upto = _Pointer.decode(raw).upto_seq if raw is not None else 0
        except CheckpointError as e:
            self._problem = str(e)
            return
        last_key = self._read(lambda txn: _last_key(txn, self._log))
        self._last_seq = max(upto, last_key)

    def _check_usable(self) -> None:
        if self._closed:
            raise CheckpointError(f"checkpoint {self._path} is closed")
        if self._problem is not None:
            raise CheckpointError(f"checkpoint {self._path} is unusable: {self._problem}")

    def _write(self, fn: Callable[[lmdb.Transaction], _T]) -> _T:
        """Run ``fn`` in one write transaction, growing the map and retrying when full."""
        with self._lock:
            while True:
                txn = self._env.begin(write=True)
                try:
                    result = fn(txn)
                    txn.commit()
                    return result
                except lmdb.MapFullError:
                    txn.abort()
                    self._grow()
                except lmdb.Error as e:
                    txn.abort()
                    raise CheckpointError(f"checkpoint {self._path}: {e}") from e
                except BaseException:
                    txn.abort()
                    raise

    def _read(self, fn: Callable[[lmdb.Transaction], _T], *, buffers: bool = False) -> _T:
        with self._lock:
            try:
                txn = self._env.begin(buffers=True) if buffers else self._env.begin()
                with txn:
                    return fn(txn)
            except lmdb.Error as e:
                raise CheckpointError(f"checkpoint {self._path}: {e}") from e

    def _grow(self) -> None:
        """Double the map (caller holds ``_lock``, so no transaction is live)."""
        current = self._env.info()["map_size"]
        target = current * 2
        if self._max_map_size is not None:
            if current >= self._max_map_size:
                raise CheckpointError(
                    f"checkpoint {self._path} is full at max_map_size={self._max_map_size}"
                )
            target = min(target, self._max_map_size)
        log.info("checkpoint %s: growing LMDB map %d -> %d bytes", self._path, current, target)
        self._env.set_mapsize(target)

    def _delete_range(
        self, db: Any, lo: bytes, hi: bytes | None, pause: Callable[[], None] | None = None
    ) -> None:
        """Delete keys in [lo, hi) in batches, each its own short transaction."""

        def step(txn: lmdb.Transaction) -> int:
            cur = txn.cursor(db=db)
            n = 0
            if not cur.set_range(lo):
                return 0
            while n < _DELETE_BATCH:
                k = bytes(cur.key())
                if not k or (hi is not None and k >= hi):
                    break
                cur.delete()
                n += 1
            return n

        while self._write(step) == _DELETE_BATCH:
            if pause is not None:
                pause()

    def _stat(self, db: Any) -> tuple[int, int]:
        """(entries, bytes of pages) of one named database."""

        def stat(txn: lmdb.Transaction) -> tuple[int, int]:
            st = txn.stat(db)
            pages = st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
            return st["entries"], pages * st["psize"]

        return self._read(stat)


def _last_key(txn: lmdb.Transaction, db: Any) -> int:
    cur = txn.cursor(db=db)
    return int(_KEY.unpack(cur.key())[0]) if cur.last() else 0
