"""``wheelctl outbox init|status`` and ``wheelctl serve --outbox-dsn``.

``init`` creates the ``wheel_outbox`` table (with its index and NOTIFY
trigger) in the application's database, in the first schema of the DSN's
search_path; wheel's own PostgreSQL store has it from its migrations.
``status`` reads the backlog from that database directly (no node needed):
pending rows, the oldest one's age, those being retried, failed rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from wheel.errors import InvalidArgument, StoreUnavailable

# ``--outbox-dsn`` that turns the relay off.
OFF = "off"


def add_serve_flag(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--outbox-dsn",
        metavar="DSN",
        help="the PostgreSQL database whose wheel_outbox table this node relays into jobs"
        " (wheel.outbox.submit; the holder of shard 0 relays in a cluster). Default: the"
        " store's own database when it is PostgreSQL; 'off': no relay",
    )


def outbox_dsn(ns: argparse.Namespace, store_url: str) -> str | None:
    """The database to relay from, or None (no relay)."""
    from wheel.store.open import libpq_dsn

    given = ns.outbox_dsn
    if given == OFF:
        return None
    if given:
        if libpq_dsn(given) is None and "=" not in given:
            raise InvalidArgument("outbox_dsn", f"{given!r} is not a PostgreSQL DSN")
        return str(given)
    return libpq_dsn(store_url)


def add_parser(sub: Any) -> None:
    o = sub.add_parser("outbox", help="the transactional submit's outbox table (PostgreSQL)")
    osub = o.add_subparsers(dest="outbox_cmd", required=True)
    init = osub.add_parser("init", help="create wheel_outbox in the application's database")
    init.add_argument("--dsn", required=True, help="the application's PostgreSQL DSN")
    init.set_defaults(fn=cmd_init)
    st = osub.add_parser("status", help="the outbox's backlog, read from its database")
    st.add_argument("--dsn", required=True, help="the database holding wheel_outbox")
    st.add_argument("--json", action="store_true", help="the status as JSON")
    st.set_defaults(fn=cmd_status)


def _connect(dsn: str) -> Any:
    import psycopg

    try:
        return psycopg.connect(dsn, connect_timeout=5)
    except psycopg.Error as exc:
        raise StoreUnavailable(f"cannot reach the outbox's database: {exc}") from None


def cmd_init(ns: argparse.Namespace) -> int:
    import psycopg

    from wheel.outbox import create_table

    with _connect(ns.dsn) as conn:
        try:
            create_table(conn)
        except psycopg.Error as exc:
            raise StoreUnavailable(f"creating wheel_outbox failed: {exc}") from None
    print("wheel_outbox is ready")
    return 0


def cmd_status(ns: argparse.Namespace) -> int:
    import psycopg

    from wheel.outbox import status

    with _connect(ns.dsn) as conn:
        try:
            backlog = status(conn)
        except psycopg.errors.UndefinedTable:
            raise InvalidArgument(
                "dsn", "no wheel_outbox table there (wheelctl outbox init --dsn ...)"
            ) from None
        except psycopg.Error as exc:
            raise StoreUnavailable(f"reading the outbox failed: {exc}") from None
    if ns.json:
        json.dump(
            {
                "pending": backlog.pending,
                "oldest_pending_s": round(backlog.oldest_pending_s, 3),
                "retrying": backlog.retrying,
                "failed": backlog.failed,
            },
            sys.stdout,
        )
        print()
        return 0
    print(f"pending   {backlog.pending}")
    print(f"oldest    {backlog.oldest_pending_s:.1f}s")
    print(f"retrying  {backlog.retrying}")
    print(f"failed    {backlog.failed}")
    return 0
