"""``wheelctl codec new-key`` and the ``--codec-key-file`` flag of ``submit``,
``update``, ``import`` and ``worker`` (``wheel.codec``)."""

from __future__ import annotations

import argparse
from typing import Any

from wheel.codec import AesGcmCodec, KeyFileError, new_key
from wheel.errors import InvalidArgument

FLAG_HELP = (
    "encrypt payloads with the current key of this key file (AES-256-GCM; JSON"
    ' {"current": ID, "keys": {ID: base64}}, made by wheelctl codec new-key); a worker'
    " decodes them with it. HTTP targets' bodies are never encrypted"
)


def add_codec_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--codec-key-file", metavar="FILE", help=FLAG_HELP)


def codec_of(ns: argparse.Namespace) -> AesGcmCodec | None:
    """The codec ``--codec-key-file`` names, or None (the flag not given)."""
    path = getattr(ns, "codec_key_file", None)
    if not path:
        return None
    try:
        return AesGcmCodec.from_file(path)
    except KeyFileError as exc:
        raise InvalidArgument("codec_key_file", str(exc)) from None


def cmd_new_key(ns: argparse.Namespace) -> int:
    try:
        key_id = new_key(ns.file, ns.id)
    except KeyFileError as exc:
        raise InvalidArgument("file", str(exc)) from None
    print(f"key {key_id} added to {ns.file} and made current")
    return 0


def register(sub: Any) -> None:
    """Add ``wheelctl codec`` to ``wheelctl``'s subcommands."""
    c = sub.add_parser("codec", help="payload encryption keys (wheel.codec)")
    cs = c.add_subparsers(dest="codec_command", required=True)
    nk = cs.add_parser(
        "new-key",
        help="add a new random key to a key file (made if absent, mode 0600) and make it current;"
        " the keys already in it stay, so payloads sealed with them still open",
    )
    nk.add_argument("file", metavar="FILE", help="the key file (JSON)")
    nk.add_argument("--id", help="the new key's id (default: k1, k2, ... the first free)")
    nk.set_defaults(fn=cmd_new_key)
