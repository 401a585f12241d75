"""The client SDK: submit jobs to a wheel node and manage them.

```python
from datetime import timedelta
from wheel.client import Client, Retry

with Client("127.0.0.1:50051") as client:
    job = client.submit(
        name="nightly-report",
        handler="send_report",
        cron="0 2 * * *",
        tz="America/New_York",
        payload={"report": "sales"},
        retry=Retry(max_attempts=3, initial_backoff=timedelta(seconds=5)),
        idempotency_key="nightly-report-v1",
    )
    print(job.job_id, job.next_fire)
    for run in client.runs(job.job_id):
        print(run.scheduled_for, run.attempt, run.state, run.missed_reason or run.error)
```

``AsyncClient`` has the same calls for asyncio (``async with``, ``await``,
``async for``). Everything taken and returned is a value of this package
(frozen dataclasses, ``StrEnum`` states and policies, ``datetime`` and
``timedelta``); every failure is a ``wheel.errors.WheelError``.
"""

from wheel.client._admin import AuditEntry, Calendar, Limit, Secret, TenantQuota, Token
from wheel.client._async import AsyncClient
from wheel.client._overview import JobHistory, OutcomeBucket, RecentRun, RunOverview
from wheel.client._specs import JobArgs, JobRequest, Payload, UpdateArgs
from wheel.client._sync import Client
from wheel.client._time import Duration, When
from wheel.client._values import (
    Alert,
    AlertKind,
    Alerts,
    At,
    Backfill,
    CatchUp,
    CatchUpMode,
    Cron,
    DstFold,
    DstGap,
    Every,
    HttpTarget,
    InFlight,
    InFlightRun,
    Job,
    JobState,
    JobUpdate,
    LagMinute,
    Member,
    Membership,
    MissedReason,
    NodeStatus,
    Overlap,
    OverlapPolicy,
    Page,
    Retry,
    Run,
    RunState,
    Schedule,
    ShardRelease,
    ShardStatus,
    Status,
    Trigger,
    UnservedHandler,
    WorkerStatus,
)
from wheel.client._wire import DEFAULT_TARGET
from wheel.tls import ChannelSecurity

__all__ = [
    "DEFAULT_TARGET",
    "Alert",
    "AlertKind",
    "Alerts",
    "AsyncClient",
    "At",
    "AuditEntry",
    "Backfill",
    "Calendar",
    "CatchUp",
    "CatchUpMode",
    "ChannelSecurity",
    "Client",
    "Cron",
    "DstFold",
    "DstGap",
    "Duration",
    "Every",
    "HttpTarget",
    "InFlight",
    "InFlightRun",
    "Job",
    "JobArgs",
    "JobHistory",
    "JobRequest",
    "JobState",
    "JobUpdate",
    "LagMinute",
    "Limit",
    "Member",
    "Membership",
    "MissedReason",
    "NodeStatus",
    "OutcomeBucket",
    "Overlap",
    "OverlapPolicy",
    "Page",
    "Payload",
    "RecentRun",
    "Retry",
    "Run",
    "RunOverview",
    "RunState",
    "Schedule",
    "Secret",
    "ShardRelease",
    "ShardStatus",
    "Status",
    "TenantQuota",
    "Token",
    "Trigger",
    "UnservedHandler",
    "UpdateArgs",
    "When",
    "WorkerStatus",
]
