"""The nodes' secrets key: what encrypts the signing secrets of HTTP targets
at rest. The store keeps only ciphertext; whoever can read this key (and the
store) can read the secrets, so it lives in a file only the node's user may
read.

A key file holds 32 random bytes, either as JSON ``{"key": "<base64>"}``
(what a node writes when it makes one) or as the bare base64 text. Every
node of a cluster must be given the same file (``--secrets-key-file``): a
version sealed under another key cannot be opened, and the node reports it
rather than sign.

Sealing is AES-256-GCM with a random 96-bit nonce per seal, the nonce kept
in front of the ciphertext. The associated data binds a ciphertext to its
tenant, name and version, so a row copied to another secret, tenant or
version does not open there.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from wheel.errors import InvalidArgument, WheelError

__all__ = ["KEY_BYTES", "KEY_FILE", "SecretsKey", "SecretsKeyError"]

KEY_BYTES = 32
NONCE_BYTES = 12
# The key a node makes in its data directory when given none.
KEY_FILE = "secrets.key"


class SecretsKeyError(WheelError):
    """A sealed secret that this key cannot open: sealed under another key,
    or altered."""


class SecretsKey:
    """A 32-byte AES-GCM key and its id (a short hash of it, safe to show)."""

    __slots__ = ("_aead", "key_id")

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise InvalidArgument(
                "secrets_key_file", f"a key of {len(key)} bytes; want {KEY_BYTES}"
            )
        self._aead = AESGCM(key)
        self.key_id = hashlib.sha256(b"wheel-secrets-key:" + key).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"SecretsKey(key_id={self.key_id!r})"

    @classmethod
    def generate(cls) -> SecretsKey:
        """A new random key (kept in memory only)."""
        return cls(secrets.token_bytes(KEY_BYTES))

    @classmethod
    def load(cls, path: Path) -> SecretsKey:
        """The key in ``path`` (JSON or bare base64; ``InvalidArgument``
        naming the flag when it is neither)."""
        try:
            text = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise InvalidArgument(
                "secrets_key_file", f"cannot read {path}: {exc.strerror}"
            ) from None
        encoded = text
        if text.startswith("{"):
            try:
                encoded = str(json.loads(text)["key"])
            except (ValueError, KeyError, TypeError):
                raise InvalidArgument(
                    "secrets_key_file", f'{path}: JSON without a "key" string'
                ) from None
        try:
            key = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgument("secrets_key_file", f"{path}: the key is not base64") from None
        return cls(key)

    @classmethod
    def load_or_create(cls, path: Path) -> SecretsKey:
        """The key in ``path``; made there first (mode 0600, written whole or
        not at all) when the file does not exist."""
        if not path.exists():
            key = secrets.token_bytes(KEY_BYTES)
            body = json.dumps({"key": base64.b64encode(key).decode("ascii")}) + "\n"
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, body.encode("ascii"))
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                # Never over a key another process made meanwhile.
                os.link(tmp, path)
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        return cls.load(path)

    def seal(self, plain: bytes, tenant: str, name: str, version: int) -> bytes:
        nonce = secrets.token_bytes(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, plain, _bound(tenant, name, version))

    def open(self, sealed: bytes, tenant: str, name: str, version: int) -> bytes:
        """The plain key; ``SecretsKeyError`` when it does not open here."""
        nonce, body = sealed[:NONCE_BYTES], sealed[NONCE_BYTES:]
        try:
            return self._aead.decrypt(nonce, body, _bound(tenant, name, version))
        except (InvalidTag, ValueError):
            raise SecretsKeyError(
                f"secret {name!r} of tenant {tenant!r} (version {version}) does not open"
                f" with secrets key {self.key_id}"
            ) from None


def _bound(tenant: str, name: str, version: int) -> bytes:
    """The associated data: which secret version a ciphertext belongs to."""
    return b"wheel-secret\x00%s\x00%s\x00%d" % (tenant.encode(), name.encode(), version)
