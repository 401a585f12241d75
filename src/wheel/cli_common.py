"""What the ``wheelctl`` commands share: durations and times as the flags
and the output give them, and the client a command talks through."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
from datetime import UTC, datetime, timedelta

from wheel._tls_cli import client_security
from wheel.client import Client
from wheel.errors import InvalidArgument
from wheel.logs import FORMATS

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration(text: str, field: str) -> timedelta:
    """'250ms', '5s', '2m', '1h', '1d'."""
    m = _DURATION.match(text.strip())
    if not m:
        raise InvalidArgument(field, f"{text!r} is not a duration like 500ms, 5s, 2m, 1h")
    try:
        return timedelta(milliseconds=float(m.group(1)) * _UNITS[m.group(2)])
    except OverflowError:  # past timedelta's 999,999,999 days
        raise InvalidArgument(field, f"{text!r} is too long a duration") from None


def fmt_time(t: datetime | None) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if t else "-"


def epoch_ms(t: datetime) -> int:
    # The client's times are whole milliseconds: the round trip is exact.
    return round(t.timestamp() * 1000)


def command_client(ns: argparse.Namespace) -> Client:
    return Client(ns.target, security=client_security(ns), token=ns.token)


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
