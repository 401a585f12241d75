"""``wheelctl token`` and ``wheelctl tenant``: bearer tokens and tenant
quotas of a running node (AdminService; scope ``admin``), and the first
admin token of ``wheelctl serve --auth --init-admin-token FILE``.

wheelctl token create --tenant T --scope S [--scope S ...] [--ttl 30d] [--worker-id W --pool P ...]
wheelctl token list | token revoke ID
wheelctl tenant set T [--max-jobs N] [--submits-per-s R] [--fires-per-s R] [--max-in-flight N]
wheelctl tenant list
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

from wheel.auth import ADMIN, JOBS_READ, JOBS_WRITE, OPERATOR, SCOPES, TOKEN_ENV, mint
from wheel.cli._common import fmt_time
from wheel.client import Client, TenantQuota, Token
from wheel.errors import InvalidArgument
from wheel.store.base import Store

log = logging.getLogger("wheel")

# The first admin token's scopes: every scope but ``worker``, which binds a
# token to one worker id (make those with ``wheelctl token create``).
INIT_ADMIN_SCOPES = (JOBS_READ, JOBS_WRITE, ADMIN)
UNLIMITED = "unlimited"

T = TypeVar("T")


def add_token_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--token",
        help=f"bearer token for a node run with --auth (default: ${TOKEN_ENV})",
    )


def add_scope_flags(p: argparse.ArgumentParser, target: str, target_help: str, whose: str) -> None:
    """``--target``, ``--token`` and ``--tenant`` of a command on a tenant's
    own things (secrets, calendars, limits)."""
    p.add_argument("--target", default=target, help=target_help)
    add_token_flag(p)
    p.add_argument(
        "--tenant", default="", help=f"whose {whose} (default: the token's tenant, or default)"
    )


def print_listing(
    items: Sequence[T], as_json: bool, to_json: Callable[[T], Any], to_line: Callable[[T], str]
) -> int:
    """A listing command's output: a JSON array, or a line an item."""
    if as_json:
        print(json.dumps([to_json(x) for x in items]))
    else:
        for x in items:
            print(to_line(x))
    return 0


def add_auth_flags(s: argparse.ArgumentParser, seconds: Callable[[str], float]) -> None:
    """``wheelctl serve``'s auth flags (``seconds`` parses a duration)."""
    s.add_argument(
        "--auth",
        action="store_true",
        help="every call needs a bearer token (wheelctl token create); tenants come from it",
    )
    s.add_argument(
        "--init-admin-token",
        metavar="FILE",
        help="with --auth: write a first admin token to FILE (mode 0600) if the store has none",
    )
    s.add_argument(
        "--auth-recheck",
        type=seconds,
        default="5s",
        metavar="DURATION",
        help="re-read tokens from the store this often: a revoked or expired token stops"
        " working (open worker streams too) within it (default %(default)s)",
    )


def init_admin_token(store: Store, path: str, now_ms: int) -> bool:
    """Write a first admin token (tenant ``*``) to ``path`` (mode 0600) when
    the store holds no token; False when it holds some (nothing written)."""
    if store.list_tokens():
        return False
    minted = mint(tenant=OPERATOR, scopes=INIT_ADMIN_SCOPES, now_ms=now_ms, label="init-admin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
        os.write(fd, (minted.token + "\n").encode())
    finally:
        os.close(fd)
    store.create_token(minted.record)
    return True


def _client(ns: argparse.Namespace) -> Client:
    return Client(ns.target, token=ns.token)


def _time_text(t: datetime | None) -> str:
    return fmt_time(t)


def token_line(t: Token) -> str:
    worker = f"  worker {t.worker_id} pools {','.join(t.pools)}" if t.worker_id else ""
    state = "revoked" if t.revoked_at is not None else "active"
    return (
        f"{t.token_id}  {state:<7}  tenant {t.tenant:<12}  scopes {','.join(t.scopes):<30}"
        f"  created {_time_text(t.created_at)}  expires {_time_text(t.expires_at)}"
        f"{worker}{'  ' + t.label if t.label else ''}"
    )


def cmd_token_create(ns: argparse.Namespace) -> int:
    from wheel.cli._common import parse_duration

    ttl = parse_duration(ns.ttl, "ttl") if ns.ttl else None
    with _client(ns) as client:
        token, _ = client.create_token(
            tenant=ns.tenant,
            scopes=ns.scope,
            ttl=ttl,
            worker_id=ns.worker_id or "",
            pools=ns.pool or [],
            label=ns.label,
        )
    print(token)  # alone on stdout: TOKEN=$(wheelctl token create ...)
    return 0


def cmd_token_list(ns: argparse.Namespace) -> int:
    with _client(ns) as client:
        tokens = client.tokens()
    if ns.json:
        print(json.dumps([token_json(t) for t in tokens]))
        return 0
    for t in tokens:
        print(token_line(t))
    return 0


def _ms(t: datetime | None) -> int | None:
    return None if t is None else round(t.timestamp() * 1000)


def token_json(t: Token) -> dict[str, Any]:
    """A token as ``token list --json`` prints it (never its secret)."""
    return {
        "token_id": t.token_id,
        "tenant": t.tenant,
        "scopes": list(t.scopes),
        "worker_id": t.worker_id,
        "pools": list(t.pools),
        "label": t.label,
        "created_at_ms": _ms(t.created_at),
        "expires_at_ms": _ms(t.expires_at),
        "revoked_at_ms": _ms(t.revoked_at),
    }


def cmd_token_revoke(ns: argparse.Namespace) -> int:
    with _client(ns) as client:
        print(token_line(client.revoke_token(ns.token_id)))
    return 0


def _limit(text: str | None, field: str, kind: type[Any]) -> Any:
    """A flag's limit: None when not given (keep), UNLIMITED to clear."""
    if text is None or text == UNLIMITED:
        return text
    try:
        return kind(text)
    except ValueError:
        raise InvalidArgument(field, f"{text!r} is not a number (or {UNLIMITED!r})") from None


def quota_line(q: TenantQuota) -> str:
    def show(v: float | None) -> str:
        return UNLIMITED if v is None else f"{v:g}"

    return (
        f"{q.tenant:<20} max_jobs {show(q.max_jobs)}  submits_per_s {show(q.submits_per_s)}"
        f"  fires_per_s {show(q.fires_per_s)}  max_in_flight {show(q.max_in_flight)}"
    )


def cmd_tenant_set(ns: argparse.Namespace) -> int:
    """Change the limits given, keep the others (``unlimited`` clears one)."""
    wanted = {
        "max_jobs": _limit(ns.max_jobs, "max_jobs", int),
        "submits_per_s": _limit(ns.submits_per_s, "submits_per_s", float),
        "fires_per_s": _limit(ns.fires_per_s, "fires_per_s", float),
        "max_in_flight": _limit(ns.max_in_flight, "max_in_flight", int),
    }
    with _client(ns) as client:
        current = next(
            (q for q in client.tenant_quotas() if q.tenant == ns.tenant),
            TenantQuota(tenant=ns.tenant),
        )
        changes: dict[str, Any] = {
            k: (None if v == UNLIMITED else v) for k, v in wanted.items() if v is not None
        }
        print(quota_line(client.set_tenant_quota(replace(current, **changes))))
    return 0


def cmd_tenant_list(ns: argparse.Namespace) -> int:
    with _client(ns) as client:
        quotas = client.tenant_quotas()
    if ns.json:
        print(json.dumps([dataclasses.asdict(q) for q in quotas]))
        return 0
    for q in quotas:
        print(quota_line(q))
    return 0


def register(sub: Any, target: str, target_help: str) -> None:
    """Add ``token`` and ``tenant`` to wheelctl's subcommands."""

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--target", default=target, help=target_help)
        add_token_flag(p)

    tk = sub.add_parser("token", help="bearer tokens of a node run with --auth (scope admin)")
    tks = tk.add_subparsers(dest="token_command", required=True)
    c = tks.add_parser("create", help="make a token; prints it alone on stdout")
    common(c)
    c.add_argument("--tenant", required=True, help="the tenant it acts for ('*': operator)")
    c.add_argument("--scope", action="append", required=True, choices=SCOPES, help="once per scope")
    c.add_argument("--ttl", help="lifetime, e.g. 30d or 12h (default: no expiry)")
    c.add_argument("--worker-id", help="scope worker: the worker id it is bound to")
    c.add_argument(
        "--pool", action="append", help="scope worker: a pool it may serve (default: default)"
    )
    c.add_argument("--label", default="", help="a note shown by token list")
    c.set_defaults(fn=cmd_token_create)
    ls = tks.add_parser("list", help="every token (never their secrets)")
    common(ls)
    ls.add_argument("--json", action="store_true", help="the tokens as a JSON array")
    ls.set_defaults(fn=cmd_token_list)
    rv = tks.add_parser("revoke", help="revoke a token by id; its open streams end too")
    common(rv)
    rv.add_argument("token_id", help="the token's id, as token list shows it")
    rv.set_defaults(fn=cmd_token_revoke)

    tn = sub.add_parser("tenant", help="tenant quotas")
    tns = tn.add_subparsers(dest="tenant_command", required=True)
    st = tns.add_parser(
        "set", help=f"change a tenant's limits (those not given stay; '{UNLIMITED}' clears one)"
    )
    common(st)
    st.add_argument("tenant", help="the tenant's name")
    st.add_argument("--max-jobs", help="active or paused jobs it may hold")
    st.add_argument("--submits-per-s", help="submits a second (per node)")
    st.add_argument("--fires-per-s", help="runs dispatched a second (per shard owner)")
    st.add_argument("--max-in-flight", help="runs in flight at once (per shard owner)")
    st.set_defaults(fn=cmd_tenant_set)
    tl = tns.add_parser("list", help="every tenant with limits")
    common(tl)
    tl.add_argument("--json", action="store_true", help="the quotas as a JSON array")
    tl.set_defaults(fn=cmd_tenant_list)
