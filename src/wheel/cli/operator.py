"""``wheelctl``'s operator commands: change a job in place, read its record of
updates, backfill, preview a schedule, and list and redrive dead letters.

wheelctl update JOB_ID [the job flags of submit, each one given changed]
wheelctl updates JOB_ID [--json]
wheelctl backfill JOB_ID --from WHEN --to WHEN [--json]
wheelctl preview (--cron EXPR [--tz] [--dst-gap] [--dst-fold] | --every D [--start] | --at WHEN
                  | --job JOB_ID) [--from WHEN] [--count N] [--json]
wheelctl dlq list [--job JOB_ID] [--json] | dlq redrive JOB_ID [--run RUN_ID] [--json]

A ``--from`` or ``--to`` of ``preview`` and ``backfill`` without a zone
(``2027-03-13``, ``2027-03-13T22:00``) is a wall time in the schedule's zone:
``--tz``, or the job's.

``update`` takes ``wheelctl submit``'s own flag definitions (``add_job_flags``),
made optional: the flags given are the fields changed, the others stay as
they are. Schedule flags change the job's schedule in those parts alone
(``--tz Europe/Paris`` keeps the cron expression; ``--every 5m`` on an
interval keeps its start); a flag of another kind (``--cron`` on an interval)
makes a schedule of that kind from the flags given. A catch-up or overlap
flag replaces the whole policy (its other flags at submit's defaults).
``--at-most-once``/``--idempotent`` and ``--fixed-delay``/``--fixed-rate``
turn a switch on and off.

The ``--http-*`` flags and ``--signing-secret`` change those parts of the
job's HTTP target, the others kept (``--http-header`` replaces every
header); given to a job with a Python handler, they move it onto a target
(``--http-url`` then required). ``--handler`` moves a job off its target.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, cast

from wheel.cli._common import (
    BACKOFF_FLAGS,
    EPOCH,
    HTTP_FLAGS,
    ZONELESS_JOB,
    ZONELESS_UTC,
    bound_time,
    calendars_of,
    command_client,
    epoch_ms,
    fmt_time,
    fmt_zoned,
    http_target,
    job_json,
    job_payload,
    parse_duration,
    parse_when,
    retry_of,
)
from wheel.cli._jobflags import add_job_flags
from wheel.cli.admin import add_token_flag
from wheel.cli.codec import add_codec_flag
from wheel.cli.listing import job_line
from wheel.client import (
    CatchUp,
    Cron,
    DstFold,
    DstGap,
    Every,
    Overlap,
    Run,
    Schedule,
    UpdateArgs,
)
from wheel.errors import InvalidArgument

# submit's flags that ``update`` does not take: a job's tenant never changes.
_NOT_UPDATED = ("tenant",)


def _when(text: str, field: str, now: datetime, zone: tzinfo | None = None) -> datetime:
    """``parse_when``'s times, and -DURATION: that long before ``now``; a
    time without a zone (``2027-03-13``, ``2027-03-13T22:00``) is a wall time
    in ``zone`` (a schedule's own), or UTC without one."""
    if text.strip().startswith("-"):
        return now - parse_duration(text.strip()[1:], field)
    when = parse_when(text, field)
    if isinstance(when, timedelta):
        return now + when
    return when.replace(tzinfo=zone) if when.tzinfo is None and zone is not None else when


def _zoneless(text: str | None) -> bool:
    """Whether ``text`` is a time without a zone (it needs the schedule's)."""
    if text is None or text.strip().startswith(("-", "+")) or text.strip().isdigit():
        return False
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        return False  # parse_when names what is wrong with it
    return when.tzinfo is None


def _schedule_zone(schedule: Schedule) -> Any:
    """The zone a cron schedule's wall times are in (None: UTC)."""
    return _zone(schedule.tz) if isinstance(schedule, Cron) else None


def update_args(
    ns: argparse.Namespace, defaults: dict[str, Any], zone: tzinfo | None = None
) -> UpdateArgs:
    """``Client.update``'s keywords from the flags given (the others are not
    in ``ns``); ``defaults``: submit's, for the parts of a policy not given.
    Schedule keywords are only those given (``with_schedule`` completes them).
    A zoneless ``--at`` or ``--start`` is a wall time in ``zone`` (the job's)."""
    given = vars(ns)
    now = datetime.now(UTC)
    args: UpdateArgs = {}
    for flag in ("name", "handler", "pool", "concurrency_key", "tz", "dst_gap", "dst_fold", "cron"):
        if flag in given:
            args[flag] = given[flag]
    if "payload" in given or "payload_json" in given:
        args["payload"] = job_payload(ns)
    for on, off in (("fixed_delay", "fixed_rate"), ("at_most_once", "idempotent")):
        if on in given or off in given:
            args[on] = on in given  # type: ignore[literal-required]
    if "at" in given:
        args["at"] = _when(given["at"], "at", now, zone)
    if "every" in given:
        args["every"] = parse_duration(given["every"], "every")
    if "start" in given:
        args["start"] = _when(given["start"], "start", now, zone)
    if "skip_calendar" in given:
        args["skip_calendars"] = calendars_of(given["skip_calendar"])
    if "jitter" in given:
        args["jitter"] = parse_duration(given["jitter"], "jitter")
    if "timeout" in given:
        args["timeout"] = parse_duration(given["timeout"], "timeout")
    if "priority" in given:
        args["priority"] = given["priority"]
    if any(f in given for f in ("max_attempts", *BACKOFF_FLAGS)):
        args["retry"] = retry_of(ns, defaults)
    for flag in ("active_from", "active_until"):
        if flag in given:
            text = given[flag].strip()
            cleared = text.lower() in ("", "none")
            when = None if cleared else bound_time(text, flag, now, zone)
            args[flag] = when  # type: ignore[literal-required]
    if "max_fires" in given:
        args["max_fires"] = given["max_fires"]

    def part(flag: str) -> Any:
        return given.get(flag, defaults[flag])

    if any(f in given for f in ("catch_up", "catch_up_window", "catch_up_max")):
        window = part("catch_up_window")
        args["catch_up"] = CatchUp(
            mode=part("catch_up"),
            window=parse_duration(window, "catch_up_window") if window else None,
            max_count=part("catch_up_max"),
        )
    if any(f in given for f in ("overlap", "max_concurrent")):
        args["overlap"] = Overlap(policy=part("overlap"), max_concurrent=part("max_concurrent"))
    return args


# The schedule's keywords: what each kind of schedule is made of.
_SCHEDULE_PARTS = {
    "cron": ("cron", "tz", "dst_gap", "dst_fold"),
    "every": ("every", "start", "fixed_delay"),
    "at": ("at",),
}


def with_schedule(args: UpdateArgs, current: Schedule) -> UpdateArgs:
    """``args`` with the parts of the job's ``current`` schedule they do not
    change, when they change any: ``--tz`` alone keeps the cron expression
    and its DST policies. Its kind is the one ``args`` names (``cron``,
    ``every`` or ``at``), else the current one; a new kind starts from the
    flags given and submit's defaults. Two kinds given are left for the
    client to refuse."""
    if not any(k in args for parts in _SCHEDULE_PARTS.values() for k in parts):
        return args
    kinds = [k for k in _SCHEDULE_PARTS if k in args]
    if len(kinds) > 1:
        return args
    kept: dict[str, Any] = {}
    if isinstance(current, Cron):
        kind = "cron"
        kept = {"cron": current.expr, "tz": current.tz, "dst_gap": current.dst_gap,
                "dst_fold": current.dst_fold}  # fmt: skip
    elif isinstance(current, Every):
        kind = "every"
        kept = {"every": current.period, "fixed_delay": current.fixed_delay}
        if current.start > EPOCH:
            kept["start"] = current.start
    else:
        kind = "at"
        kept = {"at": current.time}
    if kinds and kinds[0] != kind:
        return args
    return cast(UpdateArgs, {**kept, **args})


def cmd_update(ns: argparse.Namespace) -> int:
    for flag in _NOT_UPDATED:
        if flag in vars(ns):
            raise InvalidArgument(flag, "a job's tenant never changes")
    if not any(flag in vars(ns) for flag in ns.submit_defaults if flag != "key"):
        raise InvalidArgument("flags", "give at least one of submit's job flags to change")
    with command_client(ns) as client:
        zone = None
        timed = ("at", "start", "active_from", "active_until")
        if any(_zoneless(getattr(ns, flag, None)) for flag in timed):
            tz = getattr(ns, "tz", None)
            zone = _zone(tz) if tz is not None else _schedule_zone(client.get(ns.job_id).schedule)
        args = update_args(ns, ns.submit_defaults, zone)
        if_version = None
        http_given = any(flag in vars(ns) for flag in HTTP_FLAGS)
        if http_given or any(k in args for parts in _SCHEDULE_PARTS.values() for k in parts):
            # Read the schedule and change the parts given, on the condition
            # that nobody updates the job meanwhile: its newest version read
            # first, then the schedule, so an update between the two fails
            # the condition too, and nothing is overwritten unseen.
            newest = next(iter(client.job_updates(ns.job_id, page_size=1)), None)
            if_version = 0 if newest is None else newest.version
            job = client.get(ns.job_id)
            args = with_schedule(args, job.schedule)
            if http_given:
                # The target's flags given change those parts, the rest kept.
                args["http"] = http_target(vars(ns), job.http)
        job = client.update(
            ns.job_id, idempotency_key=getattr(ns, "key", None), if_version=if_version, **args
        )
    if ns.json:
        print(json.dumps(job_json(job)))
    else:
        print(f"updated job {job.job_id}")
        print(job_line(job))
    return 0


def cmd_updates(ns: argparse.Namespace) -> int:
    with command_client(ns) as client:
        updates = list(client.job_updates(ns.job_id))
    rows: list[dict[str, Any]] = []
    for u in updates:
        before, after = job_json(u.before), job_json(u.after)
        changed = {k: [before[k], after[k]] for k in _SPEC_FIELDS if before[k] != after[k]}
        rows.append(
            {
                "version": u.version,
                "updated_at_ms": epoch_ms(u.updated_at),
                "updated_by": u.updated_by,
                "changed": changed,
                "payload_changed": u.payload_changed,
            }
        )
    if ns.json:
        print(json.dumps(rows))
        return 0
    for row, u in zip(rows, updates, strict=True):
        what = ", ".join(
            f"{k} {_shown(old)} -> {_shown(new)}" for k, (old, new) in row["changed"].items()
        )
        if u.payload_changed:
            what = f"{what}, payload" if what else "payload"
        print(
            f"v{u.version:<4} {fmt_time(u.updated_at)}  by {u.updated_by or '-':<24} "
            f"{what or 'nothing'}"
        )
    return 0


# ``job_json``'s keys an update may change; the payload is not among them
# (a recorded update keeps no payloads: ``payload_changed`` says it changed).
_SPEC_FIELDS = (
    "name", "handler", "http", "pool", "concurrency_key", "schedule", "catch_up", "overlap",
    "retry", "timeout_ms", "jitter_ms", "at_most_once", "priority", "skip_calendars",
    "active_from_ms", "active_until_ms", "max_fires",
)  # fmt: skip


def _shown(value: Any) -> str:
    return json.dumps(value) if isinstance(value, dict) else str(value)


def cmd_backfill(ns: argparse.Namespace) -> int:
    now = datetime.now(UTC)
    with command_client(ns) as client:
        zone = None
        if _zoneless(ns.from_) or _zoneless(ns.to):
            zone = _schedule_zone(client.get(ns.job_id).schedule)
        start, end = _when(ns.from_, "from", now, zone), _when(ns.to, "to", now, zone)
        out = client.backfill(ns.job_id, start, end)
    if ns.json:
        print(
            json.dumps(
                {
                    "scheduled": out.scheduled,
                    "skipped_existing": out.skipped_existing,
                    "scheduled_for_ms": [epoch_ms(t) for t in out.scheduled_for],
                }
            )
        )
        return 0
    print(
        f"backfill of job {ns.job_id}: {out.scheduled} fires scheduled,"
        f" {out.skipped_existing} already in its history"
    )
    for t in out.scheduled_for:
        print(f"  {fmt_time(t)}")
    return 0


def cmd_preview(ns: argparse.Namespace) -> int:
    now = datetime.now(UTC)
    kinds = [k for k in ("cron", "every", "at") if getattr(ns, k)]
    if ns.job is not None and kinds:
        raise InvalidArgument("job", f"give --job or a schedule (--{kinds[0]}), not both")
    # A --from without a zone is a wall time of the schedule's zone.
    zone = _zone(ns.tz) if ns.cron else None
    with command_client(ns) as client:
        if ns.job is not None:
            zone = _schedule_zone(client.get(ns.job).schedule)
            start_from = _when(ns.from_, "from", now, zone) if ns.from_ else None
            fires = client.preview(ns.job, start_from=start_from, count=ns.count)
        else:
            start_from = _when(ns.from_, "from", now, zone) if ns.from_ else None
            fires = client.preview(
                cron=ns.cron,
                every=parse_duration(ns.every, "every") if ns.every else None,
                at=_when(ns.at, "at", now) if ns.at else None,
                tz=ns.tz,
                dst_gap=ns.dst_gap,
                dst_fold=ns.dst_fold,
                start=_when(ns.start, "start", now) if ns.start else None,
                active_from=bound_time(ns.active_from, "active_from", now, zone)
                if ns.active_from
                else None,
                active_until=bound_time(ns.active_until, "active_until", now, zone)
                if ns.active_until
                else None,
                max_fires=ns.max_fires or None,
                start_from=start_from,
                count=ns.count,
                skip_calendars=calendars_of(ns.skip_calendar),
            )
    if ns.json:
        print(json.dumps([{"fire_ms": epoch_ms(t), "utc": t.isoformat()} for t in fires]))
        return 0
    for t in fires:
        local = f"  {fmt_zoned(t, str(zone))}" if zone is not None else ""
        print(f"{fmt_time(t)}{local}")
    return 0


def _zone(tz: str) -> Any:
    """The zone to show local times in (None: UTC, shown already)."""
    if tz in ("", "UTC"):
        return None
    from zoneinfo import ZoneInfo

    try:
        return ZoneInfo(tz)
    except (KeyError, ValueError):
        return None  # the node said what is wrong with it already


def _run_json(r: Run) -> dict[str, Any]:
    return {
        "run_id": r.run_id,
        "job_id": r.job_id,
        "scheduled_for_ms": epoch_ms(r.scheduled_for),
        "attempt": r.attempt,
        "state": r.state.value,
        "fence": r.fence,
        "worker_id": r.worker_id or "",
        "finished_at_ms": epoch_ms(r.finished_at) if r.finished_at else 0,
        "error": r.error or "",
        "result": r.result,
    }


def _print_runs(runs: list[Run], as_json: bool) -> None:
    if as_json:
        print(json.dumps([_run_json(r) for r in runs]))
        return
    for r in runs:
        print(
            f"job {r.job_id:<20} run {r.run_id:<10} {fmt_time(r.scheduled_for)}  "
            f"attempt {r.attempt}  {r.state:<14} fence {r.fence}  {r.error or ''}"
        )


def cmd_dlq_list(ns: argparse.Namespace) -> int:
    with command_client(ns) as client:
        runs = client.dead_letters(ns.job)
    _print_runs(runs, ns.json)
    return 0


def cmd_dlq_redrive(ns: argparse.Namespace) -> int:
    with command_client(ns) as client:
        runs = client.redrive(ns.job_id, run_id=ns.run)
    if not ns.json:
        print(f"redrove {len(runs)} dead letters of job {ns.job_id}: new attempts")
    _print_runs(runs, ns.json)
    return 0


def _optional(actions: list[argparse.Action]) -> dict[str, Any]:
    """Make submit's job flags optional and absent unless given (so the
    flags given are the fields changed); returns their defaults."""
    defaults = {}
    for action in actions:
        defaults[action.dest] = action.default
        action.required = False
        action.default = argparse.SUPPRESS
    return defaults


def register(sub: Any, target: str, target_help: str) -> None:
    """Add ``update``, ``updates``, ``backfill``, ``preview`` and ``dlq``."""

    def common(p: argparse.ArgumentParser, json_help: str) -> None:
        p.add_argument("--target", default=target, help=target_help)
        add_token_flag(p)
        p.add_argument("--json", action="store_true", help=json_help)

    up = sub.add_parser(
        "update",
        help="change a job in place (the job flags of submit; those given change)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.add_argument("job_id", type=int, help="the job's id")
    common(up, "the job as JSON")
    actions = add_job_flags(up)
    defaults = _optional(actions)
    add_codec_flag(up)
    for action in actions:  # the job exists: its zone is the one a zoneless time is in
        action.help = (action.help or "").replace(ZONELESS_UTC, ZONELESS_JOB)
    up.set_defaults(fn=cmd_update, submit_defaults=defaults)

    us = sub.add_parser("updates", help="a job's recorded updates, newest first")
    us.add_argument("job_id", type=int, help="the job's id")
    common(us, "the updates as a JSON array")
    us.set_defaults(fn=cmd_updates)

    bf = sub.add_parser("backfill", help="run a job's past fires of a time range")
    bf.add_argument("job_id", type=int, help="the job's id")
    common(bf, "the answer as JSON")
    bf.add_argument(
        "--from",
        dest="from_",
        required=True,
        help=f"the start: -1h (that long ago), epoch ms or ISO 8601; {ZONELESS_JOB}",
    )
    bf.add_argument(
        "--to",
        required=True,
        help=f"the end (not included), in the past, as --from; {ZONELESS_JOB}",
    )
    bf.set_defaults(fn=cmd_backfill)

    pv = sub.add_parser("preview", help="the next fire times of a schedule or of a job")
    common(pv, "the fires as a JSON array")
    pv.add_argument("--job", type=int, help="a job's schedule")
    pv.add_argument("--cron", help="cron expression (5 fields, or 6 with seconds first)")
    pv.add_argument("--tz", default="UTC", help="IANA time zone of the cron expression")
    pv.add_argument(
        "--dst-gap",
        default=DstGap.FIRE_AT_TRANSITION.value,
        choices=[g.value for g in DstGap],
        help="as submit's: a wall time that does not exist fires at the transition, or not",
    )
    pv.add_argument(
        "--dst-fold",
        default=DstFold.FIRST.value,
        choices=[f.value for f in DstFold],
        help="as submit's: a wall time that comes twice fires on the first, or on both",
    )
    pv.add_argument("--every", help="interval, e.g. 30s")
    pv.add_argument(
        "--start", help=f"first fire of an interval: +5s, epoch ms or ISO 8601; {ZONELESS_UTC}"
    )
    pv.add_argument("--at", help=f"a one-shot's time: +5s, epoch ms or ISO 8601; {ZONELESS_UTC}")
    pv.add_argument(
        "--active-from",
        metavar="DATE",
        help="as submit's: no fire before this (RFC 3339 or YYYY-MM-DD[THH:MM[:SS]]);"
        f" {ZONELESS_JOB}",
    )
    pv.add_argument(
        "--active-until",
        metavar="DATE",
        help=f"as submit's: no fire after this; {ZONELESS_JOB}",
    )
    pv.add_argument("--max-fires", metavar="N", type=int, help="as submit's: at most N fires")
    pv.add_argument(
        "--from",
        dest="from_",
        help="fires at or after this (default: now): -1h, +1h, epoch ms or ISO 8601; a time"
        " without a zone is a wall time in the schedule's zone (--tz, or the job's)",
    )
    pv.add_argument("--count", type=int, default=10, help="how many (at most 1000)")
    pv.add_argument(
        "--skip-calendar",
        action="append",
        metavar="NAME",
        help="with a schedule: skip the days of this calendar of yours (again for more);"
        " a --job skips its own",
    )
    pv.set_defaults(fn=cmd_preview)

    dq = sub.add_parser("dlq", help="dead-lettered runs: list, redrive")
    dqs = dq.add_subparsers(dest="dlq_command", required=True)
    dl = dqs.add_parser("list", help="dead letters not redriven yet, newest first")
    common(dl, "the runs as a JSON array")
    dl.add_argument("--job", type=int, help="of one job (default: every job you may see)")
    dl.set_defaults(fn=cmd_dlq_list)
    dr = dqs.add_parser("redrive", help="run a job's dead letters again as new attempts")
    dr.add_argument("job_id", type=int, help="the job's id")
    common(dr, "the new attempts as a JSON array")
    dr.add_argument("--run", type=int, help="only this dead-lettered run")
    dr.set_defaults(fn=cmd_dlq_redrive)
