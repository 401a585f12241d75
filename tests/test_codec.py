"""``wheel.codec``: the AES-GCM codec and its key files."""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wheel.codec import (
    MAGIC,
    AesGcmCodec,
    CodecError,
    KeyFileError,
    PayloadCodec,
    describe,
    envelope_key,
    new_key,
)

K1, K2 = secrets.token_bytes(32), secrets.token_bytes(32)


@given(st.binary(max_size=4096))
def test_decode_gives_back_what_encode_was_given(data: bytes) -> None:
    codec = AesGcmCodec({"k1": K1}, "k1")
    sealed = codec.encode(data)
    assert codec.decode(sealed) == data
    assert envelope_key(sealed) == "k1"
    head = MAGIC + b"k1:"
    assert sealed.startswith(head)
    if len(data) >= 8:  # the sealed part is no copy of the plaintext
        assert data not in sealed[len(head) :]


def test_each_encoding_is_fresh_and_the_codec_is_a_payload_codec() -> None:
    codec = AesGcmCodec({"k1": K1}, "k1")
    assert codec.encode(b"same") != codec.encode(b"same")
    assert isinstance(codec, PayloadCodec)
    assert "k1" in repr(codec) and K1.hex() not in repr(codec)


def test_a_rotated_key_file_still_opens_payloads_of_the_keys_it_keeps() -> None:
    old = AesGcmCodec({"k1": K1}, "k1")
    rotated = AesGcmCodec({"k1": K1, "k2": K2}, "k2")
    sealed_old = old.encode(b"before")
    assert rotated.decode(sealed_old) == b"before"
    assert envelope_key(rotated.encode(b"after")) == "k2"
    with pytest.raises(CodecError, match=r"encrypted with key .k2.*holds k1"):
        old.decode(rotated.encode(b"after"))


def test_altered_bytes_or_a_swapped_key_id_do_not_open() -> None:
    codec = AesGcmCodec({"k1": K1, "k2": K1}, "k1")  # the same key under two ids
    sealed = bytearray(codec.encode(b"payload"))
    sealed[-1] ^= 1
    with pytest.raises(CodecError, match="does not open"):
        codec.decode(bytes(sealed))
    # The id is authenticated: relabelling k1's envelope as k2 fails.
    relabelled = codec.encode(b"payload").replace(MAGIC + b"k1:", MAGIC + b"k2:", 1)
    with pytest.raises(CodecError, match="key 'k2' but does not open"):
        codec.decode(relabelled)
    with pytest.raises(CodecError, match="cut short"):
        codec.decode(MAGIC + b"k1:abc")


def test_a_payload_without_an_envelope_passes_through() -> None:
    codec = AesGcmCodec({"k1": K1}, "k1")
    for plain in (b"", b'{"a": 1}', b"wheel-aesgcm1:", b"wheel-aesgcm1:bad id!:x"):
        assert codec.decode(plain) == plain
        assert describe(plain) is None
    assert describe(codec.encode(b"x")) == "encrypted, key k1"


def test_new_key_makes_a_private_file_and_extends_it(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    assert new_key(path) == "k1"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    first = AesGcmCodec.from_file(path)
    sealed = first.encode(b"kept")
    assert new_key(path) == "k2"
    assert new_key(path, "2027-01") == "2027-01"
    body = json.loads(path.read_text())
    assert body["current"] == "2027-01" and set(body["keys"]) == {"k1", "k2", "2027-01"}
    again = AesGcmCodec.from_file(path)
    assert again.decode(sealed) == b"kept" and again.current == "2027-01"
    with pytest.raises(KeyFileError, match="already in"):
        new_key(path, "k1")
    with pytest.raises(KeyFileError, match="is not 1 to 64"):
        new_key(path, "no spaces")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not JSON"),
        ("[]", "not {"),
        ('{"keys": {"k1": "AAAA"}}', "current:"),
        ('{"current": "k1", "keys": {}}', "keys: an object"),
        ('{"current": "k1", "keys": {"k1": "%%%"}}', "keys.k1: not valid base64"),
        ('{"current": "k1", "keys": {"k1": "AAAA"}}', "keys.k1: 3 bytes; a key is 32"),
        ('{"current": "k9", "keys": {"k1": "%s"}}', "current: 'k9' is not one of the keys"),
    ],
)
def test_a_bad_key_file_is_refused_naming_what_is_wrong(
    tmp_path: Path, text: str, message: str
) -> None:
    import base64

    path = tmp_path / "keys.json"
    path.write_text(text.replace("%s", base64.b64encode(K1).decode()) if "%s" in text else text)
    with pytest.raises(KeyFileError, match=message):
        AesGcmCodec.from_file(path)
    with pytest.raises(KeyFileError, match="No such file"):
        AesGcmCodec.from_file(tmp_path / "absent.json")
