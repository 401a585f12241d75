"""What the ``wheelctl`` commands share: durations and times as the flags
and the output give them, and the client a command talks through."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from wheel.client import Client
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
    return Client(ns.target, security=client_security(ns), token=ns.token)


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
