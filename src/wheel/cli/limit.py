"""``wheelctl limit``: concurrency keys and rate limits held across the
cluster (AdminService; a tenant's token manages its own tenant's, an
operator's any tenant's). A job joins a key with ``--concurrency-key KEY``.

wheelctl limit set KEY [--tenant T] [--max-concurrent N] [--rate N/s|N/m [--burst B]]
wheelctl limit list [--tenant T] [--json]
wheelctl limit delete KEY [--tenant T]
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import timedelta
from typing import Any

from wheel.cli._common import command_client
from wheel.cli.admin import print_listing
from wheel.client import Limit
from wheel.errors import InvalidArgument

__all__ = ["limit_json", "parse_rate", "register"]

_RATE = re.compile(r"(\d+)/(s|m)")


def parse_rate(text: str) -> tuple[int, timedelta]:
    """``N/s`` or ``N/m``: starts and their period."""
    m = _RATE.fullmatch(text.strip())
    if m is None:
        raise InvalidArgument("rate", f"{text!r} is not N/s or N/m (e.g. 10/s)")
    per = timedelta(seconds=1) if m.group(2) == "s" else timedelta(minutes=1)
    return int(m.group(1)), per


def _rate_text(limit: Limit) -> str:
    if limit.rate is None:
        return "-"
    unit = "s" if limit.per <= timedelta(seconds=1) else "m"
    return f"{limit.rate}/{unit} burst {limit.burst or limit.rate}"


def limit_json(limit: Limit) -> dict[str, Any]:
    """A limit as ``limit list --json`` prints it."""
    return {
        "tenant": limit.tenant,
        "key": limit.key,
        "max_concurrent": limit.max_concurrent or 0,
        "rate": limit.rate or 0,
        "rate_period_ms": int(limit.per.total_seconds() * 1000) if limit.rate else 0,
        "burst": limit.burst or 0,
        "in_flight": limit.in_flight,
        "waiting": limit.waiting,
    }


def limit_line(limit: Limit) -> str:
    most = "-" if limit.max_concurrent is None else str(limit.max_concurrent)
    return (
        f"{limit.tenant:<12}  {limit.key:<24}  max {most:<6}  rate {_rate_text(limit):<18}"
        f"  in flight {limit.in_flight:<6}  waiting {limit.waiting}"
    )


def cmd_limit_set(ns: argparse.Namespace) -> int:
    rate, per = parse_rate(ns.rate) if ns.rate else (None, timedelta(seconds=1))
    if ns.burst is not None and rate is None:
        raise InvalidArgument("burst", "a burst needs --rate")
    with command_client(ns) as client:
        limit = client.set_limit(
            ns.key,
            tenant=ns.tenant,
            max_concurrent=ns.max_concurrent,
            rate=rate,
            per=per,
            burst=ns.burst,
        )
    print(f"set {limit_line(limit)}")
    return 0


def cmd_limit_list(ns: argparse.Namespace) -> int:
    with command_client(ns) as client:
        limits = client.limits(ns.tenant)
    return print_listing(limits, ns.json, limit_json, limit_line)


def cmd_limit_delete(ns: argparse.Namespace) -> int:
    with command_client(ns) as client:
        deleted = client.delete_limit(ns.key, tenant=ns.tenant)
    if deleted == 0:
        print(f"no limit {ns.key!r}", file=sys.stderr)
        return 1
    print(f"deleted {ns.key} (its jobs keep the key and run unlimited)")
    return 0


def register(sub: Any, target: str, target_help: str) -> None:
    """Add ``limit`` to wheelctl's subcommands."""
    from wheel.cli.admin import add_scope_flags

    def common(p: argparse.ArgumentParser) -> None:
        add_scope_flags(p, target, target_help, "limit")

    lc = sub.add_parser("limit", help="concurrency keys and rate limits held across the cluster")
    lcs = lc.add_subparsers(dest="limit_command", required=True)

    st = lcs.add_parser(
        "set",
        help="create or replace a key's limits (its runs in flight are counted again)",
    )
    common(st)
    st.add_argument("key", help="the concurrency key jobs name with --concurrency-key")
    st.add_argument(
        "--max-concurrent",
        type=int,
        metavar="N",
        help="at most N runs of the key's jobs in flight at once, across the cluster",
    )
    st.add_argument(
        "--rate", metavar="N/s|N/m", help="at most N starts a second or a minute (token bucket)"
    )
    st.add_argument(
        "--burst", type=int, metavar="B", help="starts the bucket holds at most (default: N)"
    )
    st.set_defaults(fn=cmd_limit_set)

    ls = lcs.add_parser("list", help="every key with its limits, runs in flight and waiting")
    common(ls)
    ls.add_argument("--json", action="store_true", help="the limits as a JSON array")
    ls.set_defaults(fn=cmd_limit_list)

    dl = lcs.add_parser("delete", help="delete a key's limits (its jobs then run unlimited)")
    common(dl)
    dl.add_argument("key", help="the key whose limits go")
    dl.set_defaults(fn=cmd_limit_delete)
