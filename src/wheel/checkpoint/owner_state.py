"""How a shard owner's state is written into the checkpoint.

The owner keeps its jobs as packed rows (``wheel.engine.jobtable``): an id,
the nominal time of the next fire, when it is due, the schedule parameter, a
profile and flags. The checkpoint keeps the same rows.

The log holds row images, not operations: each record is the whole current
row of one job, a tombstone for a job that left, a profile's body (logged
once, before the first row that names it), the store watermark, or the
store's change mark as the batch committed (``Store.change_mark``: a
restore finds the store lost commits the log saw when its mark is lower).
Replaying rows in log order is idempotent -- the last row of a job wins --
so a snapshot may be *fuzzy*: written from a live owner while it keeps
changing, as long as replay starts at the sequence number the log had when
the snapshot began. Every change after that point is in the log.

A snapshot is one chunk per shard holding its rows column by column (the
owner's arrays, copied as they are: ten million jobs are written and read
back at memory speed, with no per-job work), the profiles those rows number,
and the watermark.

In-flight runs and their leases are not kept here: the store has every
in-flight execution with its fence, and a restarted owner gives them a fresh
lease (workers renew and so adopt them). What is slow to rebuild from the
store is the job set, and that is what this module makes fast.

Layouts (little-endian): a row ``<BqqqqqB`` (kind, job id, next fire, due,
parameter, profile id, flags); a tombstone, a watermark and a mark ``<Bq``; a profile
``<BIqI`` (kind, its number in this snapshot or 0 in the log, profile id,
body length) + the body; a shard ``<BHI`` (kind, shard, rows) + its ids,
next fires, dues and parameters (8 bytes each), profile numbers (4) and
flags (1). A log entry holds one store batch's records laid end to end.
Records of an older layout (per-job spec images) are refused: such a
checkpoint is rebuilt from the store.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from wheel.checkpoint.wal import Recovery
from wheel.engine.jobtable import GONE, NEVER, NO_FIRE, Columns, merged, shards_of
from wheel.engine.owner import PackedJob
from wheel.engine.profiles import Profile, template_of_body
from wheel.errors import CheckpointError

KIND_GONE = 2
KIND_WATERMARK = 3
KIND_ROW = 5
KIND_PROFILE = 6
KIND_SHARD = 7
KIND_HELD = 8
KIND_MARK = 9

_ROW = struct.Struct("<BqqqqqB")
_GONE = struct.Struct("<Bq")
_WATERMARK = struct.Struct("<Bq")
_PROFILE = struct.Struct("<BIqI")
_SHARD = struct.Struct("<BHI")
_HELD = struct.Struct("<B32s")  # a bit per shard
# Bytes a row takes in a shard chunk: four int64 columns, an int32, a byte.
_SHARD_ROW = 8 * 4 + 4 + 1


def encode_row(job: PackedJob) -> bytes:
    return _ROW.pack(KIND_ROW, job.job_id, job.nxt, job.due, job.param, job.profile_id, job.flags)


def encode_gone(job_id: int) -> bytes:
    return _GONE.pack(KIND_GONE, job_id)


def encode_watermark(watermark: int) -> bytes:
    return _WATERMARK.pack(KIND_WATERMARK, watermark)


def encode_mark(mark: int) -> bytes:
    """The store's change mark once the batch whose records these are
    committed (``Store.change_mark``)."""
    return _WATERMARK.pack(KIND_MARK, mark)


def encode_held(shards: Iterable[int]) -> bytes:
    """The shards the owner holds from here on: the watermarks after this
    record say how current their rows are (``OwnerState.as_of``)."""
    bits = 0
    for s in shards:
        bits |= 1 << s
    return _HELD.pack(KIND_HELD, bits.to_bytes(32, "little"))


def encode_profile(profile: Profile, number: int = 0) -> bytes:
    body = profile.body.encode()
    return _PROFILE.pack(KIND_PROFILE, number, profile.profile_id, len(body)) + body


def encode_shard(shard: int, rows: Columns) -> bytes:
    """A shard's rows, column by column (``prof`` numbers this snapshot's
    profiles)."""
    return b"".join(
        (
            _SHARD.pack(KIND_SHARD, shard, len(rows)),
            rows.ids.astype("<i8").tobytes(),
            rows.nxt.astype("<i8").tobytes(),
            rows.due.astype("<i8").tobytes(),
            rows.param.astype("<i8").tobytes(),
            rows.prof.astype("<i4").tobytes(),
            rows.flags.astype(np.uint8).tobytes(),
        )
    )


def _decode_shard(data: bytes, pos: int) -> tuple[int, Columns, int]:
    _, shard, n = _SHARD.unpack_from(data, pos)
    pos += _SHARD.size
    if pos + n * _SHARD_ROW > len(data):
        raise CheckpointError(f"shard {shard}'s rows run past the end of their chunk")

    def i8(at: int) -> npt.NDArray[np.int64]:
        return np.frombuffer(data, dtype="<i8", count=n, offset=at).astype(np.int64)

    ids, nxt, due, param = i8(pos), i8(pos + 8 * n), i8(pos + 16 * n), i8(pos + 24 * n)
    pos += 32 * n
    prof = np.frombuffer(data, dtype="<i4", count=n, offset=pos).astype(np.int32)
    pos += 4 * n
    flags = np.frombuffer(data, dtype=np.uint8, count=n, offset=pos).copy()
    pos += n
    return shard, Columns(ids, nxt, due, param, prof, flags), pos


class LogRows:
    """The rows the log wrote after the snapshot, in log order, as columns of
    machine integers (a tombstone: flags ``GONE``): a restart replays
    hundreds of thousands, which as Python objects would outlive the replay
    in the heap."""

    __slots__ = ("due", "flags", "ids", "nxt", "param", "pids")

    def __init__(self) -> None:
        self.ids = array("q")
        self.nxt = array("q")
        self.due = array("q")
        self.param = array("q")
        self.pids = array("q")
        self.flags = array("B")

    def __len__(self) -> int:
        return len(self.ids)

    def __bool__(self) -> bool:
        return bool(self.ids)

    def add(self, job_id: int, nxt: int, due: int, param: int, pid: int, flags: int) -> None:
        self.ids.append(job_id)
        self.nxt.append(nxt)
        self.due.append(due)
        self.param.append(param)
        self.pids.append(pid)
        self.flags.append(flags)

    def gone(self, job_id: int) -> None:
        self.add(job_id, NO_FIRE, NEVER, 0, 0, GONE)

    def last(self, job_id: int) -> PackedJob | None:
        """The job's last row (None: none, or a tombstone)."""
        for i in range(len(self.ids) - 1, -1, -1):
            if self.ids[i] == job_id:
                if self.flags[i] & GONE:
                    return None
                return PackedJob(
                    job_id, self.nxt[i], self.due[i], self.param[i], self.pids[i], self.flags[i]
                )
        return None

    def columns(self, number: Mapping[int, int]) -> tuple[Columns, npt.NDArray[np.intp]]:
        """All rows as columns in log order (``prof`` by ``number``: profile
        id -> its place), and each row's shard."""
        ids = np.array(self.ids, dtype=np.int64)
        pids = np.array(self.pids, dtype=np.int64)
        flags = np.array(self.flags, dtype=np.uint8)
        prof = np.zeros(len(ids), dtype=np.int32)
        live = (flags & GONE) == 0
        if live.any():
            unique, inverse = np.unique(pids[live], return_inverse=True)
            lookup = np.array([number[int(p)] for p in unique], dtype=np.int32)
            prof[live] = lookup[inverse]
        cols = Columns(
            ids,
            np.array(self.nxt, dtype=np.int64),
            np.array(self.due, dtype=np.int64),
            np.array(self.param, dtype=np.int64),
            prof,
            flags,
        )
        return cols, shards_of(ids)


@dataclass(slots=True)
class OwnerState:
    """What a checkpoint restores: each shard's rows as the snapshot has
    them (``prof`` numbering ``numbering``), the rows the log wrote after it,
    every profile body by id, and the store watermark the rows reflect."""

    shards: dict[int, Columns] = field(default_factory=dict)
    numbering: dict[int, int] = field(default_factory=dict)  # number -> profile id
    bodies: dict[int, str] = field(default_factory=dict)  # profile id -> body
    log: LogRows = field(default_factory=LogRows)
    watermark: int = 0
    # Records replayed from the log after the snapshot: how far it has grown.
    log_records: int = 0
    # The shards held as of the last ``KIND_HELD`` record, and for each shard
    # ever held, the last watermark logged while it was: its rows reflect
    # every store change up to there (a node in a cluster that gains the
    # shard again reads only the changes since).
    held: set[int] = field(default_factory=set)
    as_of: dict[int, int] = field(default_factory=dict)
    # The highest change mark of the store logged (0: none): the store had
    # committed at least this far when the rows were written.
    store_mark: int = 0

    def restorable(self) -> dict[int, int]:
        """The shards whose rows this state holds whole, each with the
        watermark they are current up to: those of the snapshot (a shard held
        in the log but missing from the snapshot -- lost while it was written,
        or gained since -- has only the rows logged after it)."""
        return {s: w for s, w in self.as_of.items() if s in self.shards}

    def check_mark(self, store_mark: int) -> None:
        """Refuse rows ahead of the record of truth: the store's change mark
        now (``Store.change_mark``) is below the one logged, so the store lost
        commits these rows reflect (fires claimed, schedules moved) and a
        restore from them would skip what the store still owes."""
        if store_mark < self.store_mark:
            raise CheckpointError(
                f"the store's change mark is {store_mark}, below the {self.store_mark} this "
                "checkpoint logged: the store lost commits the checkpoint saw (a power loss "
                "with commits not fsynced, or a database restored from a backup)"
            )

    def job_count(self) -> int:
        """At most this many jobs (rows of the snapshot and of the log)."""
        return sum(len(c) for c in self.shards.values()) + len(self.log)


def apply_records(state: OwnerState, data: bytes, *, snapshot: bool = False) -> int:
    """Apply records laid end to end (a log entry, a snapshot chunk, or a
    single record); return how many."""
    end = len(data)
    pos = 0
    count = 0
    add = state.log.add
    unpack_row = _ROW.unpack_from
    try:
        while pos < end:
            count += 1
            kind = data[pos]
            if kind == KIND_ROW:
                _, job_id, nxt, due, param, pid, flags = unpack_row(data, pos)
                if pid not in state.bodies:
                    raise CheckpointError(f"row of job {job_id} names unknown profile {pid}")
                add(job_id, nxt, due, param, pid, flags)
                pos += _ROW.size
            elif kind == KIND_GONE:
                state.log.gone(_GONE.unpack_from(data, pos)[1])
                pos += _GONE.size
            elif kind == KIND_PROFILE:
                _, number, pid, n = _PROFILE.unpack_from(data, pos)
                pos += _PROFILE.size
                if pos + n > end:
                    raise CheckpointError("profile body runs past the end of its record")
                state.bodies[pid] = data[pos : pos + n].decode()
                if snapshot:
                    state.numbering[number] = pid
                pos += n
            elif kind == KIND_SHARD:
                shard, cols, pos = _decode_shard(data, pos)
                state.shards[shard] = cols
                # Whole as of the snapshot's watermark (its first record).
                state.as_of[shard] = state.watermark
            elif kind == KIND_WATERMARK:
                state.watermark = _WATERMARK.unpack_from(data, pos)[1]
                for shard in state.held:
                    state.as_of[shard] = state.watermark
                pos += _WATERMARK.size
            elif kind == KIND_MARK:
                state.store_mark = max(state.store_mark, _WATERMARK.unpack_from(data, pos)[1])
                pos += _WATERMARK.size
            elif kind == KIND_HELD:
                bits = int.from_bytes(_HELD.unpack_from(data, pos)[1], "little")
                state.held = {s for s in range(256) if bits >> s & 1}
                pos += _HELD.size
            else:
                raise CheckpointError(f"unknown owner record kind {kind}")
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"malformed owner record: {exc}") from exc
    return count


def log_entry(records: Sequence[bytes]) -> bytes:
    """One batch's records as one log entry (``recover_state`` splits it)."""
    return b"".join(records)


def recover_state(recovery: Recovery, store_mark: int | None = None) -> OwnerState:
    """The state a checkpoint's snapshot and log hold; with ``store_mark``
    (the store's ``change_mark`` now), refused by ``OwnerState.check_mark``
    when the store is behind it."""
    state = OwnerState()
    for chunk in recovery.snapshot or ():
        apply_records(state, chunk, snapshot=True)
    for _seq, entry in recovery.records:
        state.log_records += apply_records(state, entry)
    if store_mark is not None:
        state.check_mark(store_mark)
    return state


def log_records(
    dirty: Iterable[int],
    image_of: Callable[[int], PackedJob | None],
    watermark: int | None,
    *,
    profile_of: Callable[[int], Profile | None],
    logged: set[int],
) -> list[bytes]:
    """The log records for jobs whose row changed (and a new watermark): a
    row for each job still held, a tombstone for each that left, and first
    the body of each profile those rows name that is not in ``logged`` yet
    (the profiles the log has since its snapshot; updated here)."""
    out = []
    for job_id in dirty:
        image = image_of(job_id)
        if image is None:
            out.append(encode_gone(job_id))
            continue
        if image.profile_id not in logged:
            profile = profile_of(image.profile_id)
            if profile is None:  # pragma: no cover - a held job's profile is held
                raise CheckpointError(f"job {job_id} names unknown profile {image.profile_id}")
            out.append(encode_profile(profile))
            logged.add(image.profile_id)
        out.append(encode_row(image))
    if watermark is not None:
        out.append(encode_watermark(watermark))
    return out


def snapshot_chunks(
    shards: Sequence[int],
    rows_of: Callable[[int], Columns | None],
    profiles: Callable[[], Sequence[Profile]],
    watermark: int,
    mark: int = 0,
) -> Iterator[bytes]:
    """A fuzzy snapshot, chunk by chunk (see the module docstring): the
    watermark, the store's change mark as last logged (``encode_mark``),
    the shards the log after it starts out holding (``encode_held``), each
    shard's rows (``rows_of``, with ``prof`` numbering
    the owner's profiles; None: no longer held), then every profile with its
    number, read last so that it covers every number a shard used."""
    yield encode_watermark(watermark) + encode_mark(mark) + encode_held(shards)
    for shard in shards:
        rows = rows_of(shard)
        if rows is not None:
            yield encode_shard(shard, rows)
    yield b"".join(encode_profile(p, number) for number, p in enumerate(profiles()))


@dataclass(frozen=True, slots=True, kw_only=True)
class Restored:
    """An ``OwnerState`` as an owner takes it on: each shard's rows with
    ``prof`` numbering ``profiles``."""

    packed: dict[int, Columns]
    profiles: list[Profile]


def restored_rows(state: OwnerState, shards: Iterable[int] | None = None) -> Restored:
    """The snapshot's rows with the log's written over them, for ``shards``
    (None: all)."""
    pids = [state.numbering[n] for n in sorted(state.numbering)]
    if sorted(state.numbering) != list(range(len(pids))):
        raise CheckpointError("the snapshot's profiles are not numbered 0..n-1")
    number = {pid: i for i, pid in enumerate(pids)}
    for pid in state.bodies:
        if pid not in number:
            number[pid] = len(pids)
            pids.append(pid)
    bodies = state.bodies
    profiles = [
        Profile(profile_id=pid, body=bodies[pid], template=template_of_body(bodies[pid]))
        for pid in pids
    ]
    wanted = None if shards is None else set(shards)
    logged, where = state.log.columns(number)
    # Each shard's log rows, in log order (a stable sort by shard).
    order = np.argsort(where, kind="stable")
    shard_order = where[order]
    cuts = np.flatnonzero(np.diff(shard_order)) + 1
    by_shard = {
        int(where[part[0]]): part
        for part in np.split(order, cuts) if len(part)
    }  # fmt: skip
    packed: dict[int, Columns] = {}
    for shard in set(state.shards) | set(by_shard):
        if wanted is not None and shard not in wanted:
            continue
        base = state.shards.get(shard, Columns.empty())
        if len(base) and int(base.prof.max(initial=-1)) >= len(state.numbering):
            raise CheckpointError(f"shard {shard} names a profile the snapshot does not have")
        rows = by_shard.get(shard)
        packed[shard] = base if rows is None else merged(base, logged.take(rows))
    return Restored(packed=packed, profiles=profiles)
