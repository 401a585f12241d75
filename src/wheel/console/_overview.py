"""The JSON of the console's overview, its feed of recent runs and a job's
history at a glance: pure functions of what the node's API answered, in
the same forms as ``_json`` (times as ``{"iso", "ms"}``, ids as strings)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from wheel.client import Alerts, JobHistory, RecentRun, RunOverview
from wheel.console._json import jsonable, run_row

MS = timedelta(milliseconds=1)
# The outcomes of the overview's bars, bottom up.
OUTCOMES = ("succeeded", "failed", "timed_out", "lost", "dead_lettered", "missed", "other")


def overview_json(got: RunOverview, window: str) -> dict[str, Any]:
    """Jobs by state, and one series per outcome over every bar of the
    window (zeros where nothing ended): what the stacked chart draws."""
    width = round(got.bucket / MS)
    first = round(got.since.timestamp() * 1000)
    last = round(got.now.timestamp() * 1000) // width * width
    starts = list(range(first, last + 1, width))
    index = {t: i for i, t in enumerate(starts)}
    series = {o: [0] * len(starts) for o in OUTCOMES}
    for b in got.runs:
        i = index.get(round(b.start.timestamp() * 1000))
        if i is None:
            continue
        outcome = b.outcome.value if b.outcome.value in series else "other"
        series[outcome][i] += b.count
    return {
        "window": window,
        "bucket_ms": width,
        "now": jsonable(got.now),
        "jobs": {s.value: n for s, n in got.jobs.items()},
        "jobs_total": sum(got.jobs.values()),
        "bucket_starts_ms": starts,
        "runs": series,
        "totals": {o: sum(v) for o, v in series.items()},
    }


def feed_row(r: RecentRun) -> dict[str, Any]:
    """A run of the feed, with its job's tenant, name and handler."""
    return {**run_row(r.run), "tenant": r.tenant, "job_name": r.job_name, "handler": r.handler}


def history_json(got: JobHistory) -> dict[str, Any]:
    """A job's last fires, oldest first (the strip reads left to right),
    and its day's success rate and p50/p99 durations in milliseconds."""
    return {
        "fires": [run_row(r) for r in reversed(got.fires)],
        "runs": got.runs,
        "succeeded": got.succeeded,
        "success_rate": got.succeeded / got.runs if got.runs else None,
        "p50_ms": None if got.p50 is None else got.p50 / MS,
        "p99_ms": None if got.p99 is None else got.p99 / MS,
        "since": jsonable(got.since),
    }


def alerts_json(got: Alerts) -> dict[str, Any]:
    """Alerts newest first, and each firing kind with its latest alert's
    time (its age on the page; null when none was kept)."""
    newest = list(reversed(got.alerts))
    firing = []
    for kind in got.firing:
        last = next((a for a in newest if a.kind == kind), None)
        firing.append({"kind": str(kind), "since": None if last is None else jsonable(last.at)})
    alerts = [
        {**jsonable(a), "job_id": None if a.job_id is None else str(a.job_id)} for a in newest
    ]
    for a in alerts:
        a.pop("fence", None)
    return {"firing": firing, "alerts": alerts}
