"""The checkpoint codec round-trips what the owner packs, and rejects what it cannot."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wheel.checkpoint import codec

I64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
U64 = st.integers(min_value=0, max_value=2**64 - 1)
KIND = st.integers(min_value=0, max_value=255)
FIELD = st.one_of(I64, st.binary(max_size=64), st.text(max_size=32), st.none())

fast = settings(deadline=None, max_examples=150)


@fast
@given(st.lists(I64, max_size=200))
def test_i64s_round_trip(values: list[int]) -> None:
    packed = codec.pack_i64s(values)
    assert len(packed) == 8 * len(values)
    assert codec.unpack_i64s(packed) == values


@fast
@given(st.lists(U64, max_size=200))
def test_u64s_round_trip(values: list[int]) -> None:
    assert codec.unpack_u64s(codec.pack_u64s(values)) == values


def test_packed_ints_are_little_endian_and_portable() -> None:
    assert codec.pack_i64s([1, -1]) == b"\x01" + b"\x00" * 7 + b"\xff" * 8


@fast
@given(KIND, st.lists(I64, max_size=24))
def test_int_record_round_trip(kind: int, fields: list[int]) -> None:
    data = codec.encode_record(kind, *fields)
    assert len(data) == 1 + 8 * len(fields)
    assert codec.record_kind(data) == kind
    assert codec.decode_record(data) == (kind, tuple(fields))


@fast
@given(KIND, st.lists(FIELD, max_size=12))
def test_mixed_record_round_trip(kind: int, fields: list[codec.Field]) -> None:
    data = codec.encode_fields(kind, *fields)
    assert codec.record_kind(data) == kind
    assert codec.decode_fields(data) == (kind, tuple(fields))


@fast
@given(st.lists(st.binary(max_size=100), max_size=50))
def test_frame_round_trip(records: list[bytes]) -> None:
    assert codec.unframe(codec.frame(records)) == records


@fast
@given(KIND, st.lists(FIELD, min_size=1, max_size=8), st.data())
def test_truncated_mixed_record_never_decodes_silently_wrong(
    kind: int, fields: list[codec.Field], data: st.DataObject
) -> None:
    encoded = codec.encode_fields(kind, *fields)
    cut = data.draw(st.integers(min_value=1, max_value=len(encoded) - 1))
    try:
        decoded = codec.decode_fields(encoded[:cut])
    except ValueError:
        return
    # A cut exactly at a field boundary is a valid, shorter record: a prefix.
    assert decoded[0] == kind
    assert list(decoded[1]) == fields[: len(decoded[1])]


def test_out_of_range_values_raise_value_error() -> None:
    with pytest.raises(ValueError):
        codec.pack_i64s([2**63])
    with pytest.raises(ValueError):
        codec.pack_u64s([-1])
    with pytest.raises(ValueError):
        codec.encode_record(256, 1)
    with pytest.raises(ValueError):
        codec.encode_record(1, 2**64)
    with pytest.raises(ValueError):
        codec.encode_fields(1, 2**63)
    with pytest.raises(TypeError):
        codec.encode_fields(1, 1.5)  # type: ignore[arg-type]


def test_malformed_inputs_raise_value_error() -> None:
    with pytest.raises(ValueError):
        codec.unpack_i64s(b"1234567")
    with pytest.raises(ValueError):
        codec.decode_record(b"\x01" + b"\x00" * 7)
    with pytest.raises(ValueError):
        codec.decode_record(b"")
    with pytest.raises(ValueError):
        codec.decode_fields(b"\x01z")
    with pytest.raises(ValueError):
        codec.decode_fields(b"\x01b\xff\x00\x00\x00ab")
    with pytest.raises(ValueError):
        codec.unframe(b"\x05\x00\x00\x00abc")
    with pytest.raises(ValueError):
        codec.unframe(b"\x05\x00")


def test_record_writer_collects_one_batch_at_a_time() -> None:
    w = codec.RecordWriter()
    w.add(1, 10, 20)
    w.add_fields(2, "job-1", b"\x00", None, 7)
    w.add_raw(b"\x03")
    assert len(w) == 3
    batch = w.take()
    assert len(w) == 0
    assert codec.decode_record(batch[0]) == (1, (10, 20))
    assert codec.decode_fields(batch[1]) == (2, ("job-1", b"\x00", None, 7))
    assert batch[2] == b"\x03"
    assert w.take() == []
