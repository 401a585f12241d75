"""What the ``wheelctl`` commands share: durations and times as the flags
and the output give them, and the client a command talks through."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime, timedelta

from wheel._tls_cli import client_security
from wheel.client import Client
from wheel.errors import InvalidArgument

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration(text: str, field: str) -> timedelta:
    """'250ms', '5s', '2m', '1h', '1d'."""
    m = _DURATION.match(text.strip())
    if not m:
        raise InvalidArgument(field, f"{text!r} is not a duration like 500ms, 5s, 2m, 1h")
    return timedelta(milliseconds=float(m.group(1)) * _UNITS[m.group(2)])


def fmt_time(t: datetime | None) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if t else "-"


def epoch_ms(t: datetime) -> int:
    # The client's times are whole milliseconds: the round trip is exact.
    return round(t.timestamp() * 1000)


def command_client(ns: argparse.Namespace) -> Client:
    return Client(ns.target, security=client_security(ns), token=ns.token)
