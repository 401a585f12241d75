"""Local checkpoint of a shard owner's state: an LMDB write-ahead log plus snapshots."""

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
from wheel.checkpoint.wal import FORMAT_VERSION, Checkpoint, Durability, Identity, Recovery
from wheel.errors import CheckpointError

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "Durability",
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
