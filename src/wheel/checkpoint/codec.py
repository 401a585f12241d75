"""Compact binary encoding for what the shard owner puts in its checkpoint.

The checkpoint stores opaque bytes; these helpers are how the owner turns its
state into those bytes without pickle: fixed-width little-endian integers
(``struct``/``array``, so encoding is a C loop, not a Python one) and small
tagged records whose first byte is a kind the owner defines. Everything here
is pure and stateless.

Layouts (all little-endian):

- ``pack_i64s`` / ``pack_u64s``: 8 bytes per value, no header.
- ``encode_record(kind, *ints)``: ``kind:u8`` then ``n x i64``.
- ``encode_fields(kind, *fields)``: ``kind:u8`` then per field a tag byte:
  ``i`` + i64, ``b`` + ``len:u32`` + bytes, ``s`` + ``len:u32`` + UTF-8,
  ``n`` (None, no payload). ``bool`` encodes as an int.
- ``frame(records)``: ``len:u32`` + bytes per record, to pack many records
  into one snapshot chunk.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable, Sequence

__all__ = [
    "Field",
    "RecordWriter",
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

Field = int | bytes | str | None
"""A field of a tagged record: a signed 64-bit int, bytes, a str, or None."""

_SWAP = sys.byteorder != "little"
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_KIND = struct.Struct("<B")
_TAG_INT = ord("i")
_TAG_BYTES = ord("b")
_TAG_STR = ord("s")
_TAG_NONE = ord("n")

# One compiled Struct per arity: encode_record is on the owner's hot path.
_RECORD_STRUCTS: list[struct.Struct] = [struct.Struct("<B" + "q" * n) for n in range(17)]


def _record_struct(n: int) -> struct.Struct:
    if n < len(_RECORD_STRUCTS):
        return _RECORD_STRUCTS[n]
    return struct.Struct("<B" + "q" * n)


def _pack_array(code: str, values: Iterable[int]) -> bytes:
    try:
        a = array(code, values)
    except OverflowError as e:
        raise ValueError(f"value out of range for {code!r} array: {e}") from e
    if _SWAP:
        a.byteswap()
    return a.tobytes()


def _unpack_array(code: str, data: bytes | bytearray | memoryview) -> list[int]:
    if len(data) % 8:
        raise ValueError(f"packed 64-bit array has {len(data)} bytes, not a multiple of 8")
    a = array(code)
    a.frombytes(data)
    if _SWAP:
        a.byteswap()
    return a.tolist()


def pack_i64s(values: Iterable[int]) -> bytes:
    """Pack signed 64-bit ints, 8 bytes each; ValueError if one is out of range."""
    return _pack_array("q", values)


def unpack_i64s(data: bytes | bytearray | memoryview) -> list[int]:
    """Inverse of ``pack_i64s``."""
    return _unpack_array("q", data)


def pack_u64s(values: Iterable[int]) -> bytes:
    """Pack unsigned 64-bit ints, 8 bytes each; ValueError if one is out of range."""
    return _pack_array("Q", values)


def unpack_u64s(data: bytes | bytearray | memoryview) -> list[int]:
    """Inverse of ``pack_u64s``."""
    return _unpack_array("Q", data)


def encode_record(kind: int, *fields: int) -> bytes:
    """Encode a record of ``kind`` (0-255) with signed 64-bit int fields."""
    try:
        return _record_struct(len(fields)).pack(kind, *fields)
    except struct.error as e:
        raise ValueError(f"cannot encode record kind={kind!r} fields={fields!r}: {e}") from e


def decode_record(data: bytes | bytearray | memoryview) -> tuple[int, tuple[int, ...]]:
    """Inverse of ``encode_record``: ``(kind, fields)``."""
    n, rest = divmod(len(data) - 1, 8)
    if n < 0 or rest:
        raise ValueError(f"int record of {len(data)} bytes is not 1 + 8*n")
    kind, *fields = _record_struct(n).unpack(data)
    return kind, tuple(fields)


def record_kind(data: bytes | bytearray | memoryview) -> int:
    """The kind byte of a record written by either encoder."""
    return data[0]


def encode_fields(kind: int, *fields: Field) -> bytes:
    """Encode a record of ``kind`` (0-255) whose fields mix ints, bytes, str and None."""
    out = bytearray(_KIND.pack(kind))
    for f in fields:
        if isinstance(f, int):
            out.append(_TAG_INT)
            try:
                out += _I64.pack(f)
            except struct.error as e:
                raise ValueError(f"int field {f} does not fit in 64 bits") from e
        elif isinstance(f, bytes):
            out.append(_TAG_BYTES)
            out += _U32.pack(len(f))
            out += f
        elif isinstance(f, str):
            raw = f.encode()
            out.append(_TAG_STR)
            out += _U32.pack(len(raw))
            out += raw
        elif f is None:
            out.append(_TAG_NONE)
        else:
            raise TypeError(f"unsupported field type {type(f).__name__}")
    return bytes(out)


def decode_fields(data: bytes | bytearray | memoryview) -> tuple[int, tuple[Field, ...]]:
    """Inverse of ``encode_fields``: ``(kind, fields)``; ValueError if malformed."""
    mv = memoryview(data)
    end = len(mv)
    if end < 1:
        raise ValueError("empty record")
    kind = mv[0]
    fields: list[Field] = []
    pos = 1
    try:
        while pos < end:
            tag = mv[pos]
            pos += 1
            if tag == _TAG_INT:
                fields.append(_I64.unpack_from(mv, pos)[0])
                pos += 8
            elif tag in (_TAG_BYTES, _TAG_STR):
                (n,) = _U32.unpack_from(mv, pos)
                pos += 4
                if pos + n > end:
                    raise ValueError(f"field of {n} bytes runs past the end of the record")
                raw = bytes(mv[pos : pos + n])
                pos += n
                fields.append(raw if tag == _TAG_BYTES else raw.decode())
            elif tag == _TAG_NONE:
                fields.append(None)
            else:
                raise ValueError(f"unknown field tag {tag:#x} at offset {pos - 1}")
    except (struct.error, UnicodeDecodeError) as e:
        raise ValueError(f"malformed record: {e}") from e
    return kind, tuple(fields)


def frame(records: Iterable[bytes]) -> bytes:
    """Concatenate records, each prefixed by its u32 length (one snapshot chunk)."""
    out = bytearray()
    pack = _U32.pack
    for r in records:
        out += pack(len(r))
        out += r
    return bytes(out)


def unframe(data: bytes | bytearray | memoryview) -> list[bytes]:
    """Inverse of ``frame``; ValueError if the framing is cut short."""
    mv = memoryview(data)
    end = len(mv)
    out: list[bytes] = []
    pos = 0
    unpack = _U32.unpack_from
    while pos < end:
        if pos + 4 > end:
            raise ValueError("truncated length prefix")
        (n,) = unpack(mv, pos)
        pos += 4
        if pos + n > end:
            raise ValueError(f"record of {n} bytes runs past the end of the frame")
        out.append(bytes(mv[pos : pos + n]))
        pos += n
    return out


class RecordWriter:
    """Accumulates encoded records for one ``Checkpoint.append`` batch."""

    __slots__ = ("_records",)

    def __init__(self) -> None:
        self._records: list[bytes] = []

    def add(self, kind: int, *fields: int) -> None:
        """Append an int-only record (see ``encode_record``)."""
        self._records.append(encode_record(kind, *fields))

    def add_fields(self, kind: int, *fields: Field) -> None:
        """Append a mixed-field record (see ``encode_fields``)."""
        self._records.append(encode_fields(kind, *fields))

    def add_raw(self, record: bytes) -> None:
        """Append an already-encoded record."""
        self._records.append(record)

    def __len__(self) -> int:
        return len(self._records)

    def take(self) -> Sequence[bytes]:
        """Return the batch and start a new one."""
        batch, self._records = self._records, []
        return batch
