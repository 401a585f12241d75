"""How a shard owner's state is written into the checkpoint.

The log holds row images, not operations: each record is the whole current
image of one job (its spec as stored, paused, the earliest fire not yet
claimed and when that fire is due), a tombstone for a job that left, or the
store watermark. Replaying images in log order is idempotent -- the last image
of a job wins -- so a snapshot may be *fuzzy*: written from a live owner while
it keeps changing, as long as replay starts at the sequence number the log had
when the snapshot began. Every change after that point is in the log.

Most changes move a schedule and leave the spec alone (every fire moves its
job's next fire): those are *move* records, the image without the spec, and
replay keeps the spec of the job's last full image. A job's first record in
the log after it arrives (or its spec changes) is a full image, and a snapshot
holds full images only, so a move always finds one before it; one that does
not makes the checkpoint unusable (the store rebuilds the owner), never a
job without a spec.

In-flight runs and their leases are not kept here: the store has every
in-flight execution with its fence, and a restarted owner gives them a fresh
lease (workers renew and so adopt them). What is slow to rebuild from the
store is the job set, and that is what this module makes fast.

Records are fixed-layout structs (``<BqBqqI`` + spec bytes) rather than tagged
fields: a restart decodes a million of them. A log entry holds one store
batch's records laid end to end, as a snapshot chunk holds its jobs': one
checksum, one key and one B-tree insert a batch instead of one a job (at
18,000 dispatches/s the per-record appends were 3% of the node's time).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from wheel.checkpoint.wal import Recovery
from wheel.engine.owner import JobImage
from wheel.errors import CheckpointError

KIND_JOB = 1
KIND_GONE = 2
KIND_WATERMARK = 3
KIND_MOVE = 4

_NONE = -(1 << 63)
_JOB = struct.Struct("<BqBqqI")
_GONE = struct.Struct("<Bq")
_WATERMARK = struct.Struct("<Bq")
_MOVE = struct.Struct("<BqBqq")  # the head of _JOB: all of the image but its spec
_KIND_JOB_BYTE = bytes((KIND_JOB,))


def encode_job(job_id: int, image: JobImage) -> bytes:
    return encode_job_fields(job_id, image.spec_json, image.paused, image.store_next, image.due_at)


def encode_job_fields(
    job_id: int, spec_json: bytes, paused: bool, store_next: int | None, due_at: int | None
) -> bytes:
    """``encode_job`` of an image not built as a ``JobImage`` (a million store
    rows at a restart)."""
    return (
        _JOB.pack(
            KIND_JOB,
            job_id,
            paused,
            _NONE if store_next is None else store_next,
            _NONE if due_at is None else due_at,
            len(spec_json),
        )
        + spec_json
    )


def encode_move(job_id: int, image: JobImage) -> bytes:
    return _MOVE.pack(
        KIND_MOVE,
        job_id,
        image.paused,
        _NONE if image.store_next is None else image.store_next,
        _NONE if image.due_at is None else image.due_at,
    )


def encode_gone(job_id: int) -> bytes:
    return _GONE.pack(KIND_GONE, job_id)


def encode_watermark(watermark: int) -> bytes:
    return _WATERMARK.pack(KIND_WATERMARK, watermark)


@dataclass(slots=True)
class OwnerState:
    """What a checkpoint restores: for each job, when its earliest unclaimed
    fire is due and its encoded image (decoded lazily by ``decode_image``),
    and the store watermark."""

    images: dict[int, tuple[int | None, bytes]] = field(default_factory=dict)
    watermark: int = 0
    # Records replayed from the log after the snapshot: how far it has grown.
    log_records: int = 0


def decode_image(raw: object) -> JobImage:
    """A job image from its record (the owner calls this when it wakes a job)."""
    assert isinstance(raw, bytes)
    _, _job_id, paused, store_next, due_at, n = _JOB.unpack_from(raw, 0)
    return JobImage(
        spec_json=raw[_JOB.size : _JOB.size + n],
        paused=bool(paused),
        store_next=None if store_next == _NONE else store_next,
        due_at=None if due_at == _NONE else due_at,
    )


def apply_records(state: OwnerState, data: bytes) -> int:
    """Apply records laid end to end (a log entry, a snapshot chunk, or a
    single record); return how many."""
    images = state.images
    mv = data  # bytes: indexing and slicing bytes is cheaper than a memoryview
    end = len(mv)
    pos = 0
    job_size = _JOB.size
    unpack_job = _JOB.unpack_from
    count = 0
    try:
        while pos < end:
            count += 1
            kind = mv[pos]
            if kind == KIND_JOB:
                _, job_id, _paused, _store_next, due_at, n = unpack_job(mv, pos)
                stop = pos + job_size + n
                if stop > end:
                    raise CheckpointError("job image runs past the end of its record")
                images[job_id] = (None if due_at == _NONE else due_at, mv[pos:stop])
                pos = stop
            elif kind == KIND_MOVE:
                _, job_id, _paused, _store_next, due_at = _MOVE.unpack_from(mv, pos)
                known = images.get(job_id)
                if known is None:
                    raise CheckpointError(f"move of job {job_id} before any image of it")
                # A full image again: the move's head, the last image's spec.
                raw = _KIND_JOB_BYTE + mv[pos + 1 : pos + _MOVE.size] + known[1][_MOVE.size :]
                images[job_id] = (None if due_at == _NONE else due_at, raw)
                pos += _MOVE.size
            elif kind == KIND_GONE:
                images.pop(_GONE.unpack_from(mv, pos)[1], None)
                pos += _GONE.size
            elif kind == KIND_WATERMARK:
                state.watermark = _WATERMARK.unpack_from(mv, pos)[1]
                pos += _WATERMARK.size
            else:
                raise CheckpointError(f"unknown owner record kind {kind}")
    except struct.error as exc:
        raise CheckpointError(f"malformed owner record: {exc}") from exc
    return count


def log_entry(records: Sequence[bytes]) -> bytes:
    """One batch's records as one log entry (``recover_state`` splits it)."""
    return b"".join(records)


def recover_state(recovery: Recovery) -> OwnerState:
    state = OwnerState()
    for chunk in recovery.snapshot or ():
        apply_records(state, chunk)
    for _seq, entry in recovery.records:
        state.log_records += apply_records(state, entry)
    return state


def log_records(
    dirty: Iterable[int],
    image_of: Callable[[int], JobImage | None],
    watermark: int | None,
    *,
    full: Container[int] | None = None,
) -> list[bytes]:
    """The log records for jobs whose image changed (and a new watermark):
    a full image for the jobs in ``full`` (all of them when it is None),
    whose spec the log may not hold yet, a move for the others."""
    out = []
    for job_id in dirty:
        image = image_of(job_id)
        if image is None:
            out.append(encode_gone(job_id))
        elif full is None or job_id in full:
            out.append(encode_job(job_id, image))
        else:
            out.append(encode_move(job_id, image))
    if watermark is not None:
        out.append(encode_watermark(watermark))
    return out


def snapshot_chunks(
    job_ids: Sequence[int],
    image_of: Callable[[int], JobImage | None],
    watermark: int,
    per_chunk: int = 20_000,
    *,
    record_of: Callable[[int], object] | None = None,
) -> Iterator[bytes]:
    """A fuzzy snapshot, chunk by chunk (see the module docstring).
    ``record_of`` gives a job's record as it stands in this encoding, if it
    has one (a job not touched since a restart): copied, not decoded and
    encoded again."""
    yield encode_watermark(watermark)
    for start in range(0, len(job_ids), per_chunk):
        parts = []
        for job_id in job_ids[start : start + per_chunk]:
            if record_of is not None:
                record = record_of(job_id)
                if isinstance(record, bytes):
                    parts.append(record)
                    continue
            image = image_of(job_id)
            if image is not None:
                parts.append(encode_job(job_id, image))
        if parts:
            yield b"".join(parts)
