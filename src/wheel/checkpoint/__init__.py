"""Local checkpoint of a shard owner's state: an LMDB write-ahead log plus snapshots.

Restart, with the store as the fallback for every doubt::

    try:
        cp = Checkpoint.open(path, identity)
    except CheckpointError:  # the files cannot even be opened safely
        log.error(...)
        Checkpoint.destroy(path)
        cp = Checkpoint.open(path, identity)
        state = None  # rebuild from the store
    else:
        try:
            rec = cp.recover()  # snapshot chunks, then (seq, record) after it
        except CheckpointError:  # corrupt, foreign identity, unknown format
            log.error(...)
            cp.reset()
            state = None  # rebuild from the store
    ...
    cp.append(batch)  # before releasing the batch's effects
    cp.write_snapshot(chunks, upto_seq)  # when cp.log_bytes() or log_records() is large
"""

from wheel.checkpoint._files import Durability, DutyCycle
from wheel.checkpoint.codec import (
    Field,
    RecordWriter,
    decode_fields,
    decode_record,
    encode_fields,
    encode_record,
    frame,
    pack_i64s,
    pack_u64s,
    record_kind,
    unframe,
    unpack_i64s,
    unpack_u64s,
)
from wheel.checkpoint.wal import FORMAT_VERSION, Checkpoint, Identity, Recovery
from wheel.errors import CheckpointError

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "Durability",
    "DutyCycle",
    "Field",
    "Identity",
    "RecordWriter",
    "Recovery",
    "decode_fields",
    "decode_record",
    "encode_fields",
    "encode_record",
    "frame",
    "pack_i64s",
    "pack_u64s",
    "record_kind",
    "unframe",
    "unpack_i64s",
    "unpack_u64s",
]
