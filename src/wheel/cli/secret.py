"""``wheelctl secret``: the signing secrets of HTTP targets (AdminService;
a tenant's token manages its own tenant's, an operator's any tenant's).

wheelctl secret set NAME [--tenant T] (--generate | --value-file F)
wheelctl secret list [--tenant T] [--json]
wheelctl secret rotate NAME [--tenant T] [--overlap 24h] [--generate | --value-file F]
wheelctl secret delete NAME [--tenant T]

A generated secret (``whsec_...``) is printed once, alone on stdout, and
never again: give it to the receiving endpoint. Nothing else this command
prints carries a value.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from wheel.cli._common import command_client, fmt_time, parse_duration
from wheel.cli.admin import print_listing
from wheel.client import Secret
from wheel.errors import InvalidArgument

__all__ = ["register", "secret_json"]

# A value file larger than this is no secret (keys are 24 to 64 bytes).
MAX_VALUE_FILE = 4096


def _value(ns: argparse.Namespace) -> bytes | None:
    """The value of ``--value-file`` (``-``: stdin), or None."""
    if ns.value_file is None:
        return None
    try:
        if ns.value_file == "-":
            data = sys.stdin.buffer.read(MAX_VALUE_FILE + 1)
        else:
            with Path(ns.value_file).open("rb") as f:
                data = f.read(MAX_VALUE_FILE + 1)
    except OSError as exc:
        raise InvalidArgument(
            "value_file", f"cannot read {ns.value_file}: {exc.strerror}"
        ) from None
    if len(data) > MAX_VALUE_FILE:
        raise InvalidArgument("value_file", f"larger than {MAX_VALUE_FILE} bytes")
    # A file written by an editor ends with a newline; a whsec_ text never
    # holds one. Raw key bytes are taken as they are.
    return data.strip() if data.lstrip().startswith(b"whsec_") else data


def secret_json(s: Secret) -> dict[str, Any]:
    """A secret version as ``secret list --json`` prints it (never its value)."""
    return {
        "tenant": s.tenant,
        "name": s.name,
        "version": s.version,
        "created_at": fmt_time(s.created_at),
        "retires_at": None if s.retires_at is None else fmt_time(s.retires_at),
        "key_id": s.key_id,
    }


def secret_line(s: Secret) -> str:
    retires = "-" if s.retires_at is None else fmt_time(s.retires_at)
    return (
        f"{s.tenant:<12}  {s.name:<24}  v{s.version:<4}  created {fmt_time(s.created_at)}"
        f"  retires {retires}  key {s.key_id}"
    )


def _shown(info: Secret, value: str | None, what: str) -> None:
    if value is not None:
        print(value)  # alone on stdout: SECRET=$(wheelctl secret set NAME --generate)
        print(f"{what} {secret_line(info)} (shown once)", file=sys.stderr)
    else:
        print(f"{what} {secret_line(info)}")


def cmd_secret_set(ns: argparse.Namespace) -> int:
    value = _value(ns)
    with command_client(ns) as client:
        info, shown = client.set_secret(
            ns.name, tenant=ns.tenant, value=value, generate=ns.generate
        )
    _shown(info, shown, "set")
    return 0


def cmd_secret_rotate(ns: argparse.Namespace) -> int:
    value = _value(ns)
    overlap = parse_duration(ns.overlap, "overlap") if ns.overlap else None
    with command_client(ns) as client:
        info, shown = client.rotate_secret(
            ns.name, tenant=ns.tenant, value=value, generate=value is None, overlap=overlap
        )
    _shown(info, shown, "rotated")
    return 0


def cmd_secret_list(ns: argparse.Namespace) -> int:
    with command_client(ns) as client:
        secrets = client.secrets(ns.tenant)
    return print_listing(secrets, ns.json, secret_json, secret_line)


def cmd_secret_delete(ns: argparse.Namespace) -> int:
    with command_client(ns) as client:
        deleted = client.delete_secret(ns.name, tenant=ns.tenant)
    if deleted == 0:
        print(f"no secret {ns.name!r}", file=sys.stderr)
        return 1
    print(f"deleted {ns.name} ({deleted} versions)")
    return 0


def register(sub: Any, target: str, target_help: str) -> None:
    """Add ``secret`` to wheelctl's subcommands."""
    from wheel.cli.admin import add_scope_flags

    def common(p: argparse.ArgumentParser) -> None:
        add_scope_flags(p, target, target_help, "secret")

    sc = sub.add_parser("secret", help="signing secrets of HTTP targets (never shown but once)")
    scs = sc.add_subparsers(dest="secret_command", required=True)

    st = scs.add_parser("set", help="create a secret, or replace every version of it")
    common(st)
    st.add_argument("name", help="letters, digits, '.', '_' and '-'")
    how = st.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--generate", action="store_true", help="a new random whsec_ secret, printed once"
    )
    how.add_argument(
        "--value-file", help="whsec_... or 24 to 64 raw key bytes, from this file ('-': stdin)"
    )
    st.set_defaults(fn=cmd_secret_set)

    rt = scs.add_parser("rotate", help="a new version; the ones before keep signing for --overlap")
    common(rt)
    rt.add_argument("name", help="the secret to rotate")
    rhow = rt.add_mutually_exclusive_group()
    rhow.add_argument(
        "--generate", action="store_true", help="a new random secret, printed once (the default)"
    )
    rhow.add_argument("--value-file", help="the new version's value, from this file ('-': stdin)")
    rt.add_argument(
        "--overlap", help="how long the versions before keep signing, e.g. 1h (default: 24h)"
    )
    rt.set_defaults(fn=cmd_secret_rotate)

    ls = scs.add_parser("list", help="every version still signing (names, never values)")
    common(ls)
    ls.add_argument("--json", action="store_true", help="the versions as a JSON array")
    ls.set_defaults(fn=cmd_secret_list)

    dl = scs.add_parser("delete", help="delete every version of a secret")
    common(dl)
    dl.add_argument("name", help="the secret to delete")
    dl.set_defaults(fn=cmd_secret_delete)
