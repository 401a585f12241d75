"""Payload codecs: a job's payload encrypted before it leaves the application.

A codec turns the bytes an application gives as a payload into the bytes
wheel keeps (``encode``), and back (``decode``) in the worker just before the
handler sees them. With ``Client(codec=...)`` (and ``wheel.outbox.submit``'s
``codec``) on the submitting side and ``Worker(codec=...)`` on the running
side, the node, the store, the checkpoint, the logs and the console only
ever hold what the codec made.

``AesGcmCodec`` is the one wheel ships: AES-256-GCM with a fresh 96-bit
nonce per payload, under one of several named keys. What it writes is an
envelope that says which key sealed it::

    b"wheel-aesgcm1:" key-id b":" nonce(12) ciphertext-and-tag

so keys rotate: a key file holds every key still in use and names the
``current`` one that new payloads are sealed with; a payload sealed with an
older key opens as long as the file still holds it. The key id is
authenticated with the payload (associated data), so an envelope's id
cannot be swapped for another.

A payload without the envelope is not encrypted (one submitted before the
codec was turned on, or by a client without it): ``decode`` gives it back
as it is, so switching encryption on needs no flag day. An envelope whose
key the codec lacks, or whose bytes were altered, is a ``CodecError`` naming
the key: the worker fails that run with it (and its retries may find a
worker that holds the key); it never crashes the worker.

HTTP targets are not encoded: the node signs a request's body at hand-out
(Standard Webhooks) and the endpoint reads it, so their bodies stay as
given (``wheel.client`` leaves them alone).

A custom codec is any object with ``encode(bytes) -> bytes`` and
``decode(bytes) -> bytes`` (``PayloadCodec``). A key file is JSON::

    {"current": "k1", "keys": {"k1": "<base64 of 32 random bytes>"}}

made and extended by ``wheelctl codec new-key FILE`` (``new_key``).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "MAGIC",
    "AesGcmCodec",
    "CodecError",
    "KeyFileError",
    "PayloadCodec",
    "describe",
    "envelope_key",
    "new_key",
]

MAGIC = b"wheel-aesgcm1:"
KEY_BYTES = 32
NONCE_BYTES = 12
# A key id: what a file names a key by, and what every envelope carries.
KEY_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_KEY_ID_BYTES = re.compile(rb"^[A-Za-z0-9._-]{1,64}$")


class CodecError(Exception):
    """A payload this codec cannot decode (an unknown key, altered bytes)."""


class KeyFileError(ValueError):
    """A key file that is not ``{"current": ID, "keys": {ID: base64}}``."""


@runtime_checkable
class PayloadCodec(Protocol):
    """What ``Client``, ``Worker`` and ``wheel.outbox.submit`` take as
    ``codec``: ``decode(encode(b)) == b`` for every payload ``b``."""

    def encode(self, data: bytes) -> bytes: ...

    def decode(self, data: bytes) -> bytes: ...


def describe(payload: bytes) -> str | None:
    """``"encrypted, key K"`` for an ``AesGcmCodec`` envelope, else None: what
    the node and the console may say of a payload without any key."""
    key_id = envelope_key(payload)
    return None if key_id is None else f"encrypted, key {key_id}"


def envelope_key(payload: bytes) -> str | None:
    """The id of the key an ``AesGcmCodec`` envelope was sealed with, or
    None for a payload that is not one."""
    if not payload.startswith(MAGIC):
        return None
    end = payload.find(b":", len(MAGIC))
    if end < 0:
        return None
    key_id = payload[len(MAGIC) : end]
    if not _KEY_ID_BYTES.match(key_id):
        return None
    return key_id.decode("ascii")


class AesGcmCodec:
    """AES-256-GCM under named keys; new payloads are sealed with ``current``."""

    __slots__ = ("_aead", "current")

    def __init__(self, keys: Mapping[str, bytes], current: str) -> None:
        if not keys:
            raise KeyFileError("keys: at least one key is needed")
        for key_id, key in keys.items():
            if not KEY_ID.match(key_id):
                raise KeyFileError(
                    f"keys: key id {key_id[:70]!r} is not 1 to 64 of A-Z a-z 0-9 . _ -"
                )
            if len(key) != KEY_BYTES:
                raise KeyFileError(f"keys.{key_id}: {len(key)} bytes; a key is {KEY_BYTES}")
        if current not in keys:
            raise KeyFileError(f"current: {current!r} is not one of the keys ({_ids(keys)})")
        self.current = current
        self._aead = {key_id: AESGCM(key) for key_id, key in keys.items()}

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> AesGcmCodec:
        """The codec of a key file (``KeyFileError`` naming what is wrong)."""
        current, keys = _read_key_file(Path(path))
        return cls(keys, current)

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._aead)

    def encode(self, data: bytes) -> bytes:
        head = MAGIC + self.current.encode("ascii") + b":"
        nonce = secrets.token_bytes(NONCE_BYTES)
        return head + nonce + self._aead[self.current].encrypt(nonce, bytes(data), head)

    def decode(self, data: bytes) -> bytes:
        data = bytes(data)
        key_id = envelope_key(data)
        if key_id is None:
            return data  # not encrypted: submitted without a codec
        aead = self._aead.get(key_id)
        if aead is None:
            raise CodecError(
                f"payload: encrypted with key {key_id!r}, which this codec does not hold"
                f" (it holds {', '.join(self._aead)})"
            )
        start = len(MAGIC) + len(key_id) + 1
        head, nonce = data[:start], data[start : start + NONCE_BYTES]
        if len(nonce) < NONCE_BYTES:
            raise CodecError(f"payload: an envelope of key {key_id!r} cut short")
        try:
            return aead.decrypt(nonce, data[start + NONCE_BYTES :], head)
        except InvalidTag:
            raise CodecError(
                f"payload: encrypted with key {key_id!r} but does not open under it"
                " (altered, or a different key of the same id)"
            ) from None

    def __repr__(self) -> str:  # never the keys
        return f"AesGcmCodec(current={self.current!r}, keys=[{', '.join(self._aead)}])"


def new_key(path: str | os.PathLike[str], key_id: str | None = None) -> str:
    """Add a new random key to the key file at ``path`` (made if absent, with
    mode 0600) and make it current; the keys already there stay, so payloads
    sealed with them still open. Returns the new key's id (``key_id``, or
    ``k1``, ``k2``, ... the first free)."""
    p = Path(path)
    keys: dict[str, bytes] = {}
    if p.exists():
        _, keys = _read_key_file(p)
    if key_id is None:
        n = len(keys) + 1
        while f"k{n}" in keys:
            n += 1
        key_id = f"k{n}"
    if not KEY_ID.match(key_id):
        raise KeyFileError(f"key id {key_id[:70]!r} is not 1 to 64 of A-Z a-z 0-9 . _ -")
    if key_id in keys:
        raise KeyFileError(f"key id {key_id!r} is already in {p}")
    keys[key_id] = secrets.token_bytes(KEY_BYTES)
    body = {
        "current": key_id,
        "keys": {k: base64.b64encode(v).decode("ascii") for k, v in keys.items()},
    }
    text = json.dumps(body, indent=2) + "\n"
    # Written beside and renamed over: a crash leaves the old file or the new.
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return key_id


def _read_key_file(p: Path) -> tuple[str, dict[str, bytes]]:
    try:
        body = json.loads(p.read_text())
    except OSError as exc:
        raise KeyFileError(f"{p}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise KeyFileError(f"{p}: not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise KeyFileError(f'{p}: not {{"current": ID, "keys": {{ID: base64}}}}')
    current, raw = body.get("current"), body.get("keys")
    if not isinstance(current, str):
        raise KeyFileError(f"{p}: current: the id of the key new payloads are sealed with")
    if not isinstance(raw, dict) or not raw:
        raise KeyFileError(f"{p}: keys: an object of key ids to base64 keys")
    keys: dict[str, bytes] = {}
    for key_id, value in raw.items():
        if not isinstance(value, str):
            raise KeyFileError(f"{p}: keys.{key_id}: not a base64 string")
        try:
            keys[key_id] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise KeyFileError(f"{p}: keys.{key_id}: not valid base64") from None
    try:
        AesGcmCodec(keys, current)
    except KeyFileError as exc:
        raise KeyFileError(f"{p}: {exc}") from None
    return current, keys


def _ids(keys: Mapping[str, bytes]) -> str:
    return ", ".join(keys)
