"""``wheelctl audit``: the audit trail of administrative changes."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from wheel.cli._common import command_client, epoch_ms, fmt_time, parse_duration
from wheel.cli.admin import add_token_flag
from wheel.client import AuditEntry


def audit_line(e: AuditEntry) -> str:
    details = json.dumps(e.details, sort_keys=True, separators=(",", ":"))
    who = e.actor or "-"
    return f"{fmt_time(e.at)}  {e.action:<18} {e.target:<24} {who:<22} {e.address}  {details}"


def cmd_audit(ns: argparse.Namespace) -> int:
    since = datetime.now(UTC) - parse_duration(ns.since, "since") if ns.since else None
    with command_client(ns) as client:
        entries = client.audit(since=since, job_id=ns.job, tenant=ns.tenant, limit=ns.limit)
    if ns.json:
        print(
            json.dumps(
                [
                    {
                        "entry_id": e.entry_id,
                        "at_ms": epoch_ms(e.at),
                        "actor": e.actor,
                        "tenant": e.tenant,
                        "address": e.address,
                        "action": e.action,
                        "target": e.target,
                        "job_id": e.job_id,
                        "details": e.details,
                    }
                    for e in entries
                ]
            )
        )
        return 0
    print(f"{'AT':<24}  {'ACTION':<18} {'TARGET':<24} {'WHO':<22} FROM  DETAILS")
    for e in entries:
        print(audit_line(e))
    return 0


def register(sub: Any, target: str, target_help: str) -> None:
    """Add ``audit`` to wheelctl's subcommands."""
    a = sub.add_parser(
        "audit",
        help="administrative changes, newest first: who paused, updated, redrove, or changed"
        " tokens, quotas and secrets, when and from where",
    )
    a.add_argument("--target", default=target, help=target_help)
    add_token_flag(a)
    a.add_argument("--since", help="only those made this long ago or later, e.g. 1h, 7d")
    a.add_argument("--job", type=int, help="only those of this job (its id)")
    a.add_argument(
        "--tenant", default="", help="only this tenant's (an operator's token; default: all)"
    )
    a.add_argument("--limit", type=int, default=100, help="at most N (default %(default)s)")
    a.add_argument("--json", action="store_true", help="the entries as a JSON array")
    a.set_defaults(fn=cmd_audit)
