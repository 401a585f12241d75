"""What the ``wheelctl`` commands share: durations and times as the flags
and the output give them, the client a command talks through, and the flags
that describe a job (``submit``, ``import`` and ``update`` take them). It
imports no command: every command imports it."""

from __future__ import annotations

import argparse
import base64
import importlib.metadata
import json
import os
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from wheel.cli.codec import codec_of
from wheel.client import (
    CatchUp,
    Client,
    Cron,
    Every,
    HttpTarget,
    Job,
    JobArgs,
    Overlap,
    Retry,
    Schedule,
)
from wheel.errors import InvalidArgument
from wheel.logs import FORMATS
from wheel.tls import client_security

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration(text: str, field: str) -> timedelta:
    """'250ms', '5s', '2m', '1h', '1d'."""
    if text.strip().startswith("-"):
        raise InvalidArgument(field, f"{text!r} is negative: give a positive duration like 5s")
    m = _DURATION.match(text.strip())
    if not m:
        raise InvalidArgument(field, f"{text!r} is not a duration like 500ms, 5s, 2m, 1h")
    try:
        return timedelta(milliseconds=float(m.group(1)) * _UNITS[m.group(2)])
    except OverflowError:  # past timedelta's 999,999,999 days
        raise InvalidArgument(field, f"{text!r} is too long a duration") from None


# How a zoneless time given to a command is read, as each flag's help says it.
ZONELESS_UTC = "a time without a zone is UTC"
ZONELESS_JOB = (
    "a time without a zone is a wall time in the job's zone (its cron's --tz; UTC for"
    " other schedules)"
)


def fmt_time(t: datetime | None) -> str:
    """Every time ``wheelctl`` prints: ISO 8601 in UTC, with its ``Z`` and
    milliseconds (``2026-12-06T17:00:00.000Z``); ``-`` for none."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z" if t else "-"


def fmt_zoned(t: datetime, tz: str) -> str:
    """``t`` as a wall time of ``tz`` with its offset and the zone's name:
    ``2026-12-07T02:00:00.000+09:00 (Asia/Tokyo)``."""
    from zoneinfo import ZoneInfo

    try:
        zone = ZoneInfo(tz)
    except (KeyError, ValueError):
        return fmt_time(t)
    return f"{t.astimezone(zone).isoformat(timespec='milliseconds')} ({tz})"


def fmt_duration(d: timedelta | None) -> str:
    """A run's duration as a person reads it: 132ms, 4.25s, 3m07s, 2h05m."""
    if d is None:
        return "-"
    ms = round(d.total_seconds() * 1000)
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f}s"
    s = ms // 1000
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def epoch_ms(t: datetime) -> int:
    # The client's times are whole milliseconds: the round trip is exact.
    return round(t.timestamp() * 1000)


def command_client(ns: argparse.Namespace) -> Client:
    return Client(ns.target, security=client_security(ns), token=ns.token, codec=codec_of(ns))


# -- parsing -------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """``wheelctl``'s parsers (its subcommands' too: argparse makes them of
    the top one's class). A flag a command does not know is reported with
    that command's usage, not the top-level list of commands. And a value
    that starts with ``-`` and a digit (``--every -5s``, ``--from -1h``) is a
    value, which the flag's own check then judges, rather than an unknown
    flag leaving ``--every`` with "expected one argument"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # argparse's own test for "a negative number, hence a value".
        self._negative_number_matcher = re.compile(r"^-\d")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras


def at_least_one(text: str) -> int:
    """A whole-number flag's type that refuses 0 and below in the CLI's own
    words: ``argument --max-attempts: must be >= 1, got 0``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


# The node's limit on a payload (``wheel.engine.spec.Limits``).
MAX_PAYLOAD_BYTES = 256 * 1024


def read_payload(text: str, flag: str, *, files: bool = True) -> bytes:
    """A payload flag's bytes: its text (UTF-8), or with ``files`` the
    contents of ``@PATH`` (``@-``: standard input), which also carries a
    payload too long for a command line. Over the node's limit it is refused
    here, saying the limit."""
    if files and text.startswith("@"):
        path = text[1:]
        try:
            if path == "-":
                data = sys.stdin.buffer.read()
            else:
                with open(path, "rb") as f:
                    data = f.read()
        except OSError as exc:
            raise InvalidArgument(flag, f"cannot read {path}: {exc.strerror}") from None
    else:
        data = text.encode("utf-8", "surrogateescape")
    if len(data) > MAX_PAYLOAD_BYTES:
        raise InvalidArgument(
            flag,
            f"{len(data)} bytes is over the limit of {MAX_PAYLOAD_BYTES} bytes (256 KiB)",
        )
    return data


def read_payload_json(text: str, flag: str, *, files: bool = True) -> bytes:
    """``read_payload``, checked to be one JSON document (UTF-8)."""
    data = read_payload(text, flag, files=files)
    try:
        json.loads(data)
    except UnicodeDecodeError:
        raise InvalidArgument(flag, "is not UTF-8 text, so not JSON") from None
    except json.JSONDecodeError as exc:
        raise InvalidArgument(
            flag, f"is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    return data


# -- flag values the commands share --------------------------------------------------


def _positive_ms(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number of milliseconds")
    return value


def _ms(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is a negative number of milliseconds")
    return value


def parse_retain(text: str) -> int | None:
    """``--retain``: a duration (30d, 12h), or "forever" (never purge)."""
    if text.strip().lower() in ("forever", "never", "off"):
        return None
    ms = round(parse_duration(text, "retain").total_seconds() * 1000)
    if ms <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a retention must be positive (or 'forever')")
    return ms


def _retain(text: str) -> int | None:
    try:
        return parse_retain(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    """A positive duration flag, in seconds."""
    try:
        seconds = parse_duration(text, "duration").total_seconds()
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive duration")
    return seconds


def _seconds_or_off(text: str) -> float:
    """A duration flag that "off" (or 0) turns off, in seconds (0.0: off)."""
    if text.strip().lower() in ("off", "0"):
        return 0.0
    return _seconds(text)


def _add_log_format(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-format",
        choices=FORMATS,
        default=os.environ.get("WHEEL_LOG_FORMAT", "text"),
        help="text lines (default; $WHEEL_LOG_FORMAT), or one JSON object per line with"
        " job_id, run_id, shard, fence and worker on every record about them",
    )


def version() -> str:
    """The installed distribution's version (``wheelctl --version``); a
    checkout that was never installed has no metadata, only the package's
    own ``__version__``."""
    try:
        return importlib.metadata.version("wheel-scheduler")
    except importlib.metadata.PackageNotFoundError:
        import wheel

        return wheel.__version__


# -- the job's flags, shared by submit, import and update ---------------------------


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_when(text: str, field: str) -> datetime | timedelta:
    """'+5s' (that long from now), epoch milliseconds, or an ISO 8601 time
    (naive if it has no zone: the caller says in which zone it is, see
    ``ZONELESS_UTC`` and ``ZONELESS_JOB``)."""
    text = text.strip()
    if text.startswith("+"):
        return parse_duration(text[1:], field)
    if text.isdigit():
        try:
            return EPOCH + timedelta(milliseconds=int(text))
        except OverflowError:
            raise InvalidArgument(field, f"{text!r} epoch ms is past the year 9999") from None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(field, f"{text!r} is not +DURATION, epoch ms or ISO 8601") from None


def bound_time(text: str, field: str, now: datetime, zone: tzinfo | None) -> datetime:
    """A bound of a schedule (``--active-from``, ``--active-until``): as
    ``parse_when`` reads it (``+DURATION`` from ``now``), a time without a
    zone being a wall time in ``zone`` (a cron's) or UTC."""
    when = parse_when(text, field)
    if isinstance(when, timedelta):
        return now + when
    if when.tzinfo is None:
        return when.replace(tzinfo=zone or UTC)
    return when


def _cron_zone(name: str) -> tzinfo | None:
    """A cron's zone; None for a bad name, which the node refuses naming it."""
    try:
        return ZoneInfo(name)
    except (ValueError, KeyError, OSError):  # ZoneInfoNotFoundError is a KeyError
        return None


def submit_args(
    ns: argparse.Namespace, now: datetime | None = None, *, files: bool = True
) -> JobArgs:
    """``Client.submit``'s keywords from ``wheelctl submit``'s flags; the client
    checks them (one schedule, options that go with it). Relative times
    (``+5s``) count from ``now`` (default: the wall clock's now), so that
    sending the same request again sends the same body; a time without a
    zone is UTC (there is no job yet). With ``files``, ``--payload @PATH``
    reads the payload from a file (an import's lines do not)."""
    now = now or datetime.now(UTC)
    args: JobArgs = {
        "name": ns.name,
        "tz": ns.tz,
        "dst_gap": ns.dst_gap,
        "dst_fold": ns.dst_fold,
        "fixed_delay": _on(ns, "fixed_delay", "fixed_rate"),
        "payload": job_payload(ns, files=files),
        "tenant": ns.tenant,
        "pool": ns.pool,
        "priority": ns.priority,
        "concurrency_key": ns.concurrency_key,
        "catch_up": CatchUp(
            mode=ns.catch_up,
            window=parse_duration(ns.catch_up_window, "catch_up_window")
            if ns.catch_up_window
            else None,
            max_count=ns.catch_up_max,
        ),
        "overlap": Overlap(policy=ns.overlap, max_concurrent=ns.max_concurrent),
        "retry": retry_of(ns, {}),
        "timeout": parse_duration(ns.timeout, "timeout"),
        "at_most_once": _on(ns, "at_most_once", "idempotent"),
        "skip_calendars": calendars_of(ns.skip_calendar),
        "idempotency_key": ns.key or None,
    }
    if ns.at:
        at = parse_when(ns.at, "at")
        args["at"] = now + at if isinstance(at, timedelta) else at
    if ns.cron:
        args["cron"] = ns.cron
    if ns.every:
        args["every"] = parse_duration(ns.every, "every")
    if ns.start:
        start = parse_when(ns.start, "start")
        args["start"] = now + start if isinstance(start, timedelta) else start
    if ns.jitter:
        args["jitter"] = parse_duration(ns.jitter, "jitter")
    for flag in ("active_from", "active_until"):
        text = getattr(ns, flag, None)
        if text:
            zone = _cron_zone(ns.tz) if ns.cron else None
            args[flag] = bound_time(text, flag, now, zone)
    if getattr(ns, "max_fires", None):
        args["max_fires"] = ns.max_fires
    target = http_target(vars(ns))
    if target is None:
        if not ns.handler:
            raise InvalidArgument("handler", "is required (or --http-url, an HTTP target)")
        args["handler"] = ns.handler
    elif ns.handler not in (None, "", "http"):
        raise InvalidArgument("handler", "give --handler or --http-url, not both")
    else:
        args["http"] = target
    return args


# The flags of an HTTP target (``http_target`` reads them), by dest.
HTTP_FLAGS = (
    "http_url",
    "http_method",
    "http_header",
    "http_timeout",
    "signing_secret",
    "http_retry_4xx",
    "http_no_retry_4xx",
    "http_follow_redirects",
    "http_no_follow_redirects",
)


def http_target(given: dict[str, Any], current: HttpTarget | None = None) -> HttpTarget | None:
    """The HTTP target of the flags ``given`` (a namespace's ``vars``), those
    absent or None taken from ``current`` (an update's job), else their
    defaults; None when no target is given and there is none."""
    flags = {k: v for k, v in given.items() if k in HTTP_FLAGS and v not in (None, False)}
    if not flags:
        return current
    url = flags.get("http_url") or (current.url if current is not None else None)
    if not url:
        named = ", ".join("--" + k.replace("_", "-") for k in flags)
        raise InvalidArgument("http_url", f"is required with {named}")
    headers: Any = current.headers if current is not None else {}
    if "http_header" in flags:
        headers = [_header(h) for h in flags["http_header"]]
    timeout = current.timeout if current is not None else None
    if "http_timeout" in flags:
        timeout = parse_duration(flags["http_timeout"], "http_timeout")
    return HttpTarget(
        url,
        method=flags.get("http_method") or (current.method if current is not None else "POST"),
        headers=headers,
        timeout=timeout or timedelta(seconds=30),
        signing_secret=flags.get("signing_secret")
        or (current.signing_secret if current is not None else None),
        retry_4xx=_turned(flags, "http_retry_4xx", "http_no_retry_4xx", current, "retry_4xx"),
        follow_redirects=_turned(
            flags, "http_follow_redirects", "http_no_follow_redirects", current, "follow_redirects"
        ),
    )


def _header(text: object) -> tuple[str, str]:
    """A ``--http-header`` value, ``"Name: value"``."""
    if not isinstance(text, str):
        raise InvalidArgument("http_header", f'expected "Name: value", got {text!r}')
    name, colon, value = text.partition(":")
    if not colon or not name.strip():
        raise InvalidArgument("http_header", f'{text[:100]!r} is not "Name: value"')
    return name.strip(), value.strip()


def _turned(
    flags: dict[str, Any], on: str, off: str, current: HttpTarget | None, field: str
) -> bool:
    if flags.get(on) and flags.get(off):
        raise InvalidArgument(off, f"give --{on.replace('_', '-')} or --{off.replace('_', '-')}")
    if flags.get(on) or flags.get(off):
        return bool(flags.get(on))
    return bool(getattr(current, field)) if current is not None else False


def http_json(target: HttpTarget | None) -> dict[str, Any] | None:
    """A job's HTTP target as ``--json`` prints it (None: a Python handler's)."""
    if target is None:
        return None
    return {
        "url": target.url,
        "method": target.method,
        "headers": dict(target.headers),
        "timeout_ms": round(target.timeout.total_seconds() * 1000),
        "signing_secret": target.signing_secret or "",
        "retry_4xx": target.retry_4xx,
        "follow_redirects": target.follow_redirects,
    }


def job_payload(ns: argparse.Namespace, *, files: bool = True) -> Any:
    """The payload of ``--payload`` (any bytes, as text or ``@PATH``) or of
    ``--payload-json`` (checked to be JSON), not both. An import line's
    ``payload`` is a JSON value of its own, passed on as it is."""
    raw, as_json = getattr(ns, "payload", None), getattr(ns, "payload_json", None)
    if raw not in (None, "") and as_json is not None:
        raise InvalidArgument("payload_json", "give --payload or --payload-json, not both")
    if as_json is not None:
        return read_payload_json(as_json, "payload_json", files=files)
    if isinstance(raw, str):
        return read_payload(raw, "payload", files=files)
    return b"" if raw is None else raw


# The flags of a retry policy besides --max-attempts, and the Retry field each sets.
BACKOFF_FLAGS = {
    "initial_backoff": "initial_backoff",
    "max_backoff": "max_backoff",
    "backoff_multiplier": "multiplier",
}


def retry_of(ns: argparse.Namespace, defaults: dict[str, Any]) -> Retry | int:
    """The retry policy of the flags given (``defaults``: submit's, for the
    parts not in ``ns``): a number of attempts alone, or a whole ``Retry``
    when a backoff flag is given."""

    def part(flag: str) -> Any:
        return getattr(ns, flag, defaults.get(flag))

    backoff: dict[str, Any] = {}
    for flag, field in BACKOFF_FLAGS.items():
        value = part(flag)
        if value is None:
            continue
        backoff[field] = value if flag == "backoff_multiplier" else parse_duration(value, flag)
    attempts: int = part("max_attempts")
    if not backoff:
        return attempts
    return Retry(max_attempts=attempts, **backoff)


def schedule_json(schedule: Schedule) -> dict[str, Any]:
    if isinstance(schedule, Cron):
        return {
            "cron": schedule.expr,
            "tz": schedule.tz,
            "dst_gap": schedule.dst_gap.value,
            "dst_fold": schedule.dst_fold.value,
        }
    if isinstance(schedule, Every):
        return {
            "every_ms": round(schedule.period.total_seconds() * 1000),
            "start_ms": epoch_ms(schedule.start),
            "fixed_delay": schedule.fixed_delay,
        }
    return {"at_ms": epoch_ms(schedule.time)}


def job_json(job: Job) -> dict[str, Any]:
    """A job as ``--json`` listings print it: its whole spec, so that an
    update's answer shows each field it changed. The payload is its UTF-8
    text, or base64 when it is not text (``payload_encoding`` says which)."""
    try:
        payload, encoding = job.payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(job.payload).decode("ascii"), "base64"
    return {
        "job_id": job.job_id,
        "name": job.name,
        "tenant": job.tenant,
        "handler": job.handler,
        "pool": job.pool,
        "concurrency_key": job.concurrency_key,
        "state": job.state.value,
        "schedule": schedule_json(job.schedule),
        **policies_json(job),
        "payload": payload,
        "payload_encoding": encoding,
        "http": http_json(job.http),
        "active_from_ms": epoch_ms(job.active_from) if job.active_from else 0,
        "active_until_ms": epoch_ms(job.active_until) if job.active_until else 0,
        "max_fires": job.max_fires,
        "next_fire_ms": epoch_ms(job.next_fire) if job.next_fire else 0,
        "updated_at_ms": epoch_ms(job.updated_at),
    }


def policies_json(job: Job) -> dict[str, Any]:
    """A job's policies, durations in milliseconds as the wire has them."""

    def ms(d: timedelta) -> int:
        return round(d.total_seconds() * 1000)

    c, o, r = job.catch_up, job.overlap, job.retry
    return {
        "catch_up": {
            "mode": c.mode.value,
            "window_ms": None if c.window is None else ms(c.window),
            "max_count": c.max_count,
        },
        "overlap": {
            "policy": o.policy.value,
            "max_concurrent": o.max_concurrent,
            "max_buffered": o.max_buffered,
        },
        "retry": {
            "max_attempts": r.max_attempts,
            "initial_backoff_ms": ms(r.initial_backoff),
            "max_backoff_ms": ms(r.max_backoff),
            "multiplier": r.multiplier,
        },
        "timeout_ms": ms(job.timeout),
        "jitter_ms": ms(job.jitter),
        "at_most_once": job.at_most_once,
        "priority": job.priority,
        "skip_calendars": list(job.skip_calendars),
    }


def calendars_of(given: list[str] | None) -> list[str]:
    """The calendars of ``--skip-calendar`` (given again for more; an empty
    one names none, so that an update can clear them)."""
    return [name for name in given or () if name]


def _on(ns: argparse.Namespace, on: str, off: str) -> bool:
    """A switch of ``_switch``: both given (an import's line) is refused."""
    if getattr(ns, on, False) and getattr(ns, off, False):
        raise InvalidArgument(off, f"give {on} or {off}, not both")
    return bool(getattr(ns, on, False))
