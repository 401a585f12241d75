"""Standard Webhooks signatures (https://www.standardwebhooks.com/).

A signed request carries ``webhook-id`` (the fire's idempotency key: the same
on every attempt of a fire), ``webhook-timestamp`` (the attempt's hand-out,
in whole seconds since the epoch) and ``webhook-signature``: ``v1,`` and the
base64 of HMAC-SHA256 over ``{id}.{timestamp}.{body}`` with the secret's key,
one such entry for each secret version still signing, space-separated. Any
Standard Webhooks library verifies it with the ``whsec_`` secret.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from collections.abc import Sequence

__all__ = [
    "ID",
    "PREFIX",
    "SIGNATURE",
    "TIMESTAMP",
    "SecretFormatError",
    "encode_secret",
    "new_secret",
    "parse_secret",
    "sign",
    "signed_headers",
]

PREFIX = "whsec_"
ID = "webhook-id"
TIMESTAMP = "webhook-timestamp"
SIGNATURE = "webhook-signature"
# A new secret's key; a given one may be 24 to 64 bytes.
KEY_BYTES = 32
MIN_KEY_BYTES = 24
MAX_KEY_BYTES = 64


class SecretFormatError(ValueError):
    """A secret's value that is neither ``whsec_`` and base64 of a key nor a
    raw key of an allowed length."""


def new_secret() -> str:
    """A new random secret, as ``whsec_`` and the base64 of 32 bytes."""
    return encode_secret(secrets.token_bytes(KEY_BYTES))


def encode_secret(key: bytes) -> str:
    return PREFIX + base64.b64encode(key).decode("ascii")


def parse_secret(value: bytes | str) -> bytes:
    """The key of a secret given as ``whsec_<base64>`` or as raw bytes."""
    raw = value.encode() if isinstance(value, str) else bytes(value)
    text = raw.strip()
    if text.startswith(PREFIX.encode()):
        try:
            key = base64.b64decode(text[len(PREFIX) :], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise SecretFormatError(f"value: {PREFIX}... is not valid base64") from exc
    else:
        key = raw
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise SecretFormatError(
            f"value: a key of {len(key)} bytes; give {MIN_KEY_BYTES} to {MAX_KEY_BYTES}"
            f" (or {PREFIX} and their base64)"
        )
    return key


def sign(keys: Sequence[bytes], msg_id: str, timestamp_s: int, body: bytes) -> str:
    """The ``webhook-signature`` value: one ``v1,<base64>`` per key."""
    signed = b"%s.%d.%s" % (msg_id.encode(), timestamp_s, body)
    # hmac.digest: OpenSSL's one-shot HMAC, a third cheaper than hmac.new.
    return " ".join(
        "v1," + base64.b64encode(hmac.digest(key, signed, "sha256")).decode("ascii") for key in keys
    )


def signed_headers(
    keys: Sequence[bytes], msg_id: str, timestamp_s: int, body: bytes
) -> list[tuple[str, str]]:
    """The three Standard Webhooks headers of one request."""
    return [
        (ID, msg_id),
        (TIMESTAMP, str(timestamp_s)),
        (SIGNATURE, sign(keys, msg_id, timestamp_s, body)),
    ]
