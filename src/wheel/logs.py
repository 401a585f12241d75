"""wheel's log records: text on a terminal by default, or one JSON object per
line (``wheelctl serve --log-format json``) for a log pipeline.

A record about a job or a run carries its ids as attributes, passed with
``extra=ids(...)`` where the record is made: ``job_id``, ``run_id``,
``shard`` (worked out from the job), ``fence`` and ``worker``. The JSON
formatter puts every such attribute at the top level of the object; the text
formatter appends them as ``key=value`` after the message.

What wheel logs never carries a job's payload or a request; and since a
library's record (gRPC's, say) may quote call metadata, ``RedactSecrets``
rewrites the value of any ``authorization`` header, any ``Bearer`` token,
any Standard Webhooks signing secret (``whsec_...``) and the password of
any URL (a store's) in a record (message, traceback,
extras) as ``[redacted]`` before it is written. ``configure`` puts it on the handler it installs.

What a command prints for people and scripts to read, not as a log record
(``wheel serving on HOST:PORT`` on stdout, an error on stderr), comes out of
``announcement``: the plain line in text, and in json the object a record of
it would be, so that under ``--log-format json`` every line a process writes
is JSON.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import IO, Any

from wheel.engine.model import shard_of

__all__ = [
    "FORMATS",
    "ID_FIELDS",
    "JsonFormatter",
    "RedactSecrets",
    "TextFormatter",
    "announcement",
    "configure",
    "ids",
    "redact",
]

ID_FIELDS = ("job_id", "run_id", "shard", "fence", "worker")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# What every LogRecord has; anything else on a record came with ``extra``.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


REDACTED = "[redacted]"
# The value of an authorization header however it is printed: "key: value",
# "key=value", or gRPC metadata's ('key', 'value'); a bearer token anywhere.
_AUTHORIZATION = re.compile(
    r"""(authorization['"]?\s*[:=,]\s*['"]?)(?:bearer\s+)?[^\s'",)}\]]+""", re.IGNORECASE
)
_BEARER = re.compile(r"\b(bearer\s+)[\w.~+/=-]+", re.IGNORECASE)
# A signing secret as Standard Webhooks spells one (wheel never logs one;
# a library quoting a request might).
_WHSEC = re.compile(r"\b(whsec_)[A-Za-z0-9+/=]+")
# The password in a URL's user info (a store URL: postgresql://user:pw@host/db).
_URL_PASSWORD = re.compile(r"(\b[a-z][\w+.-]*://[^/\s:@]*:)[^@\s/]+(@)", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with authorization values, bearer tokens, signing secrets
    and URL passwords replaced."""
    text = _AUTHORIZATION.sub(rf"\1{REDACTED}", text)
    text = _BEARER.sub(rf"\1{REDACTED}", text)
    if "whsec_" in text:
        text = _WHSEC.sub(rf"\1{REDACTED}", text)
    return _URL_PASSWORD.sub(rf"\1{REDACTED}\2", text)


class RedactSecrets(logging.Filter):
    """Rewrites credentials out of every record that passes (see the module's
    docstring); never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        for key, value in _extras(record).items():
            if isinstance(value, str):
                setattr(record, key, redact(value))
        return True


def ids(
    *,
    job_id: int | None = None,
    run_id: int | None = None,
    fence: int | None = None,
    worker: str | None = None,
) -> dict[str, Any]:
    """The ``extra`` of a record about a job or run: the ids known, and the
    shard of the job."""
    out: dict[str, Any] = {}
    if job_id is not None:
        out["job_id"] = job_id
        out["shard"] = shard_of(job_id)
    if run_id is not None:
        out["run_id"] = run_id
    if fence is not None:
        out["fence"] = fence
    if worker is not None:
        out["worker"] = worker
    return out


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    """What came with ``extra``: the ids first, in their order."""
    attrs = record.__dict__
    out = {k: attrs[k] for k in ID_FIELDS if attrs.get(k) is not None}
    for key, value in attrs.items():
        if key not in _STANDARD and key not in out and not key.startswith("_"):
            out[key] = value
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601 with milliseconds),
    level, logger, message, the extras (ids first), and a traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.fromtimestamp(record.created, UTC)
        out: dict[str, Any] = {
            "time": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update(_extras(record))
        if record.exc_text:  # the traceback as RedactSecrets left it
            out["exception"] = record.exc_text
        elif record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """The classic line, with the record's ids appended as ``key=value``."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        extras = _extras(record)
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return line


def configure(
    fmt: str = "text",
    *,
    level: int = logging.INFO,
    stream: IO[str] | None = None,
    force: bool = False,
) -> None:
    """Send the process's log records to ``stream`` (stderr) as ``fmt``
    ("text" or "json"). Like ``logging.basicConfig``, nothing changes when
    the root logger has handlers already (an embedding application's, or a
    test runner's), unless ``force`` replaces them."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {FORMATS}")
    root = logging.getLogger()
    if root.handlers and not force:
        return
    for old in list(root.handlers):
        root.removeHandler(old)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RedactSecrets())
    root.addHandler(handler)
    root.setLevel(level)


def announcement(
    message: str,
    fmt: str = "text",
    *,
    level: int = logging.INFO,
    logger: str = "wheel",
    **fields: Any,
) -> str:
    """The line a command prints (without its newline): ``message`` itself
    in text, or in json the object ``JsonFormatter`` makes of a record of it
    with ``fields`` (where it serves, say) at the top level."""
    if fmt != "json":
        return message
    record = logging.makeLogRecord(
        {"name": logger, "levelno": level, "levelname": logging.getLevelName(level)}
    )
    record.msg, record.args = message, None
    record.__dict__.update(fields)
    RedactSecrets().filter(record)
    return JsonFormatter().format(record)
