"""The console's JSON: the client's values as plain JSON, one rule per kind.

Pure: what the JSON API answers is a function of what the node's API
answered. Times are ISO 8601 in UTC with ``Z`` and milliseconds, their epoch
milliseconds beside them (the page shows them in the same form), durations are seconds, a
payload is its size and, when it is UTF-8 text, its first kilobyte.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

from wheel.client import At, AuditEntry, Cron, Every, Job, Run
from wheel.codec import envelope_key

# The longest payload text a job's JSON carries.
PAYLOAD_PREVIEW = 1024
# The longest a run's result is in its table's cell (the whole on expand).
RESULT_SUMMARY = 60


def jsonable(value: Any) -> Any:
    """``value`` (a client value, a list of them, a scalar) as JSON types."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return {"iso": iso_utc(value), "ms": int(value.timestamp() * 1000)}
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return payload_json(value)
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    raise TypeError(f"no JSON form for {type(value).__name__}")


def iso_utc(value: datetime) -> str:
    """The one form of a time in the console: ISO 8601 in UTC with ``Z`` and
    milliseconds, as JavaScript's ``toISOString`` writes it
    (``2026-12-06T07:17:07.132Z``)."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def payload_json(payload: bytes) -> dict[str, Any]:
    """Its size and its first kilobyte if UTF-8 text; an encrypted one
    (``wheel.codec``) only its size and key: ``encrypted`` is the key's id."""
    sealed = envelope_key(payload)
    if sealed is not None:
        return {"size": len(payload), "text": None, "truncated": False, "encrypted": sealed}
    try:
        text: str | None = payload[:PAYLOAD_PREVIEW].decode("utf-8")
    except UnicodeDecodeError:
        text = None  # binary, or a character cut at the preview's end
    return {
        "size": len(payload),
        "text": text,
        "truncated": len(payload) > PAYLOAD_PREVIEW,
        "encrypted": None,
    }


def schedule_text(schedule: Cron | Every | At) -> str:
    """One line a person reads: ``cron 0 2 * * * (America/New_York)``."""
    if isinstance(schedule, Cron):
        return f"cron {schedule.expr} ({schedule.tz})"
    if isinstance(schedule, Every):
        kind = "fixed delay" if schedule.fixed_delay else "fixed rate"
        return f"every {schedule.period.total_seconds():g}s ({kind})"
    return f"once at {iso_utc(schedule.time)}"


def job_row(job: Job) -> dict[str, Any]:
    """A job as the list shows it."""
    return {
        "job_id": str(job.job_id),
        "name": job.name,
        "tenant": job.tenant,
        "state": job.state.value,
        "handler": job.handler,
        # An HTTP target's URL (handler "http"), else null.
        "http_url": job.http.url if job.http is not None else None,
        "pool": job.pool,
        "priority": job.priority,
        "schedule": schedule_text(job.schedule),
        "next_fire": jsonable(job.next_fire),
    }


def job_detail(job: Job) -> dict[str, Any]:
    """A job with its whole spec and next fires."""
    out = jsonable(job)
    out.pop("recent_runs", None)
    out.pop("created", None)
    out["job_id"] = str(job.job_id)  # 64-bit ids lose digits as JS numbers
    out["schedule_text"] = schedule_text(job.schedule)
    out["schedule_kind"] = type(job.schedule).__name__.lower()
    return dict(out)


def audit_row(e: AuditEntry) -> dict[str, Any]:
    """An audit entry as the console's table shows it (ids as strings)."""
    out = dict(jsonable(e))
    out["entry_id"] = str(e.entry_id)
    out["job_id"] = None if e.job_id is None else str(e.job_id)
    return out


def run_row(run: Run) -> dict[str, Any]:
    """A run as the tables show it; ``result`` is what the run left (an
    object, or null) and ``result_summary`` it in a few words."""
    out = dict(jsonable(run))
    out["run_id"] = str(run.run_id)
    out["job_id"] = str(run.job_id)
    out["fence"] = str(run.fence)
    out["result_summary"] = run.result_summary(RESULT_SUMMARY)
    return out
