"""``wheelctl calendar``: days that jobs skip (AdminService; a tenant's
token manages its own tenant's calendars, an operator's any tenant's).

wheelctl calendar set NAME [--tenant T] [--date YYYY-MM-DD]... [--range FROM..TO]...
                           [--weekday sat,sun]
wheelctl calendar list [--tenant T] [--json]
wheelctl calendar show NAME [--tenant T] [--json]
wheelctl calendar delete NAME [--tenant T]

A job names the calendars it skips with ``--skip-calendar NAME`` (submit,
update, an import's ``skip_calendars``): a fire whose date, in the job's
time zone (a cron's ``--tz``; UTC for the others), is one of the calendar's
days does not run and is recorded missed with reason ``calendar``. ``set``
replaces every day of a calendar; the jobs that skip it are re-armed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from wheel.cli._common import command_client, fmt_time
from wheel.cli.admin import print_listing
from wheel.client import Calendar
from wheel.errors import InvalidArgument

__all__ = ["calendar_json", "register"]


def _ranges(given: list[str] | None) -> list[tuple[str, str]]:
    out = []
    for i, text in enumerate(given or ()):
        first, sep, last = text.partition("..")
        if not sep:
            raise InvalidArgument(
                f"range[{i}]", f"{text!r} is not FROM..TO (YYYY-MM-DD..YYYY-MM-DD)"
            )
        out.append((first.strip(), last.strip()))
    return out


def _weekdays(given: list[str] | None) -> list[str]:
    return [w.strip() for text in given or () for w in text.split(",") if w.strip()]


def calendar_json(c: Calendar) -> dict[str, Any]:
    return {
        "tenant": c.tenant,
        "name": c.name,
        "dates": list(c.dates),
        "ranges": [{"from": a, "to": b} for a, b in c.ranges],
        "weekdays": list(c.weekdays),
        "version": c.version,
        "updated_at": None if c.updated_at is None else fmt_time(c.updated_at),
    }


def _days_text(c: Calendar) -> str:
    parts = []
    if c.weekdays:
        parts.append("every " + ",".join(c.weekdays))
    if c.dates:
        shown = ", ".join(c.dates[:6]) + (
            f" and {len(c.dates) - 6} more" if len(c.dates) > 6 else ""
        )
        parts.append(shown)
    if c.ranges:
        parts.append(", ".join(f"{a}..{b}" for a, b in c.ranges))
    return "; ".join(parts) or "no day"


def calendar_line(c: Calendar) -> str:
    return f"{c.tenant:<12}  {c.name:<24}  v{c.version:<4}  {_days_text(c)}"


def cmd_calendar_set(ns: argparse.Namespace) -> int:
    with command_client(ns) as client:
        made = client.set_calendar(
            ns.name,
            tenant=ns.tenant,
            dates=ns.date or (),
            ranges=_ranges(ns.range),
            weekdays=_weekdays(ns.weekday),
        )
    print(f"set {calendar_line(made)}")
    return 0


def cmd_calendar_list(ns: argparse.Namespace) -> int:
    with command_client(ns) as client:
        calendars = client.calendars(ns.tenant)
    return print_listing(calendars, ns.json, calendar_json, calendar_line)


def cmd_calendar_show(ns: argparse.Namespace) -> int:
    with command_client(ns) as client:
        c = client.calendar(ns.name, tenant=ns.tenant)
    if ns.json:
        print(json.dumps(calendar_json(c)))
        return 0
    print(f"calendar {c.name} of tenant {c.tenant}, version {c.version}")
    print(f"  weekdays  {', '.join(c.weekdays) or '-'}")
    print(f"  ranges    {', '.join(f'{a}..{b}' for a, b in c.ranges) or '-'}")
    print(f"  dates     {', '.join(c.dates) or '-'}")
    if c.updated_at is not None:
        print(f"  updated   {fmt_time(c.updated_at)}")
    return 0


def cmd_calendar_delete(ns: argparse.Namespace) -> int:
    with command_client(ns) as client:
        deleted = client.delete_calendar(ns.name, tenant=ns.tenant)
    if not deleted:
        print(f"no calendar {ns.name!r}", file=sys.stderr)
        return 1
    print(f"deleted {ns.name} (jobs naming it fire on every day now)")
    return 0


def register(sub: Any, target: str, target_help: str) -> None:
    """Add ``calendar`` to wheelctl's subcommands."""
    from wheel.cli.admin import add_scope_flags

    def common(p: argparse.ArgumentParser) -> None:
        add_scope_flags(p, target, target_help, "calendar")

    cc = sub.add_parser(
        "calendar", help="days that jobs skip (--skip-calendar): set, list, show, delete"
    )
    ccs = cc.add_subparsers(dest="calendar_command", required=True)

    st = ccs.add_parser(
        "set",
        help="create a calendar, or replace all its days (jobs skipping it are re-armed)",
        description="Dates are a job's local dates: in a cron's time zone, UTC otherwise.",
    )
    common(st)
    st.add_argument("name", help="the calendar's name (what --skip-calendar names)")
    st.add_argument(
        "--date", action="append", metavar="YYYY-MM-DD", help="a day to skip (again for more)"
    )
    st.add_argument(
        "--range",
        action="append",
        metavar="FROM..TO",
        help="days from FROM to TO, both included, e.g. 2026-12-24..2027-01-01 (again for more)",
    )
    st.add_argument(
        "--weekday",
        action="append",
        metavar="sat,sun",
        help="weekdays to skip every week: mon, tue, wed, thu, fri, sat, sun (comma-separated,"
        " or again for more)",
    )
    st.set_defaults(fn=cmd_calendar_set)

    ls = ccs.add_parser("list", help="every calendar (of --tenant; default: every one you see)")
    common(ls)
    ls.add_argument("--json", action="store_true", help="the calendars as a JSON array")
    ls.set_defaults(fn=cmd_calendar_list)

    sh = ccs.add_parser("show", help="one calendar's days")
    common(sh)
    sh.add_argument("name", help="the calendar to show")
    sh.add_argument("--json", action="store_true", help="the calendar as a JSON object")
    sh.set_defaults(fn=cmd_calendar_show)

    dl = ccs.add_parser("delete", help="delete a calendar; jobs naming it fire on every day")
    common(dl)
    dl.add_argument("name", help="the calendar to delete")
    dl.set_defaults(fn=cmd_calendar_delete)
