"""``wheelctl``'s views of jobs and runs: ``jobs`` (filtered, with a header),
``job ID`` (one job in full), ``runs ID`` (newest first, paged) and ``run
RUN_ID`` (one run in full, its result pretty-printed).

wheelctl jobs [--state STATE] [--name PREFIX] [--tenant T] [--json]
wheelctl job JOB_ID [--runs N] [--json]
wheelctl runs JOB_ID [--limit N | --all] [--state STATE ...] [--json]
wheelctl run RUN_ID [--json]

Every time printed is UTC in ISO 8601 with its ``Z``
(``2026-12-06T17:00:00.000Z``); ``job`` shows a cron's next fires in the
cron's zone too, with its offset and name.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from datetime import timedelta
from typing import Any

from wheel.cli._common import (
    command_client,
    epoch_ms,
    fmt_duration,
    fmt_time,
    fmt_zoned,
    job_json,
)
from wheel.cli.admin import add_token_flag
from wheel.client import Cron, Every, Job, JobState, Run, RunState
from wheel.codec import describe as described

# ``runs`` without --limit or --all: the newest this many.
DEFAULT_RUNS_LIMIT = 50
# The widest a time printed is: 2026-12-06T17:00:00.000Z.
_TIME = 24
# A run's result in the runs table: ``http 503 12ms``, or its value cut.
_RESULT = 24

JOB_HEADER = f"{'JOB ID':>20}  {'STATE':<9}  {'NAME':<24}  {'NEXT FIRE':<{_TIME + 5}}  HANDLER"


def job_line(job: Job) -> str:
    """A job in one line, under ``JOB_HEADER``'s columns."""
    return (
        f"{job.job_id:>20}  {job.state:<9}  {job.name:<24}  "
        f"next {fmt_time(job.next_fire):<{_TIME}}  handler {job.handler}"
    )


def cmd_jobs(ns: argparse.Namespace) -> int:
    with command_client(ns) as client:
        jobs = client.jobs(tenant=ns.tenant, state=ns.state, name_prefix=ns.name or "")
        if ns.json:
            print(json.dumps([job_json(job) for job in jobs]))
            return 0
        print(JOB_HEADER)
        for job in jobs:
            print(job_line(job))
    return 0


def run_json(r: Run) -> dict[str, Any]:
    """A run as ``runs --json`` and ``job --json`` print it; times in epoch
    milliseconds (0: not yet, or never), ``duration_ms`` null until it ends,
    ``result`` the object the run left (null: none)."""
    duration = run_duration(r)
    return {
        "run_id": r.run_id,
        "scheduled_for_ms": epoch_ms(r.scheduled_for),
        "attempt": r.attempt,
        "state": r.state.value,
        "fence": r.fence,
        "worker_id": r.worker_id or "",
        "error": r.error or "",
        "missed_reason": r.missed_reason or "",
        "dispatched_at_ms": epoch_ms(r.dispatched_at) if r.dispatched_at else 0,
        "started_at_ms": epoch_ms(r.started_at) if r.started_at else 0,
        "finished_at_ms": epoch_ms(r.finished_at) if r.finished_at else 0,
        "duration_ms": None if duration is None else round(duration.total_seconds() * 1000),
        "result": r.result,
    }


def run_duration(r: Run) -> timedelta | None:
    """How long a finished run took: from its start (or, when a run ended
    before its start was recorded, its dispatch) to its end."""
    began = r.started_at or r.dispatched_at
    if r.state is RunState.MISSED or began is None or r.finished_at is None:
        return None
    return r.finished_at - began


RUN_HEADER = (
    f"{'SCHEDULED FOR':<{_TIME}}  {'ATTEMPT':>7}  {'STATE':<13}  {'STARTED':<{_TIME}}  "
    f"{'FINISHED':<{_TIME}}  {'DURATION':>8}  {'RUN':<10}  {'WORKER':<20}  {'RESULT':<{_RESULT}}"
    "  ERROR / MISSED REASON"
)


def run_line(r: Run) -> str:
    """A run (or a missed fire) in one line, under ``RUN_HEADER``'s columns."""
    error = (r.error or "").strip().splitlines()
    detail = r.missed_reason or (error[0] if error else "")
    return (
        f"{fmt_time(r.scheduled_for):<{_TIME}}  {r.attempt:>7}  {r.state:<13}  "
        f"{fmt_time(r.started_at or r.dispatched_at):<{_TIME}}  {fmt_time(r.finished_at):<{_TIME}}"
        f"  {fmt_duration(run_duration(r)):>8}  {r.run_id or '-':<10}  {r.worker_id or '-':<20}"
        f"  {r.result_summary(_RESULT) or '-':<{_RESULT}}  {detail or ''}"
    ).rstrip()


def cmd_runs(ns: argparse.Namespace) -> int:
    limit = None if ns.all or ns.limit == 0 else ns.limit
    with command_client(ns) as client:
        # ListRuns filters states on the page it read: a page of the most
        # (1000) when filtering, so that a rare state costs fewer calls.
        page = 1000 if ns.state else min(limit + 1 if limit else 1000, 1000)
        found = client.runs(ns.job_id, states=ns.state or (), page_size=page)
        # One more than shown: whether there are more to say so.
        runs = list(found if limit is None else itertools.islice(found, limit + 1))
    more = limit is not None and len(runs) > limit
    runs = runs[:limit]
    if ns.json:
        print(json.dumps([run_json(r) for r in runs]))
    else:
        print(RUN_HEADER)
        for r in runs:
            print(run_line(r))
    if more:
        print(
            f"wheelctl: the newest {limit} shown; --limit N or --all for more",
            file=sys.stderr,
        )
    return 0


def run_text(r: Run) -> list[str]:
    """``wheelctl run RUN_ID``'s lines: every field of the run, and its
    result pretty-printed."""
    duration = run_duration(r)
    lines = [
        f"run {r.run_id} of job {r.job_id}",
        f"  state           {r.state}",
        f"  scheduled for   {fmt_time(r.scheduled_for)}",
        f"  attempt         {r.attempt}   fence {r.fence}",
        f"  worker          {r.worker_id or '-'}",
        f"  dispatched      {fmt_time(r.dispatched_at)}",
        f"  started         {fmt_time(r.started_at)}",
        f"  finished        {fmt_time(r.finished_at)}",
        f"  duration        {fmt_duration(duration) if duration is not None else '-'}",
        f"  idempotency key {r.idempotency_key}",
    ]
    if r.error:
        first, *rest = r.error.splitlines() or [""]
        lines.append(f"  error           {first}")
        lines.extend(f"                  {x}" for x in rest)
    if r.result is None:
        lines.append("result: none")
    else:
        lines.append("result:")
        pretty = json.dumps(r.result, indent=2, ensure_ascii=False, sort_keys=True)
        lines.extend("  " + x for x in pretty.splitlines())
    return lines


def cmd_run(ns: argparse.Namespace) -> int:
    with command_client(ns) as client:
        run = client.get_run(ns.run_id)
    if ns.json:
        print(
            json.dumps(
                {
                    **run_json(run),
                    "job_id": run.job_id,
                    "idempotency_key": run.idempotency_key,
                }
            )
        )
        return 0
    print("\n".join(run_text(run)))
    return 0


def _schedule_text(job: Job) -> str:
    s = job.schedule
    if isinstance(s, Cron):
        return f"cron {s.expr} ({s.tz}), dst gap {s.dst_gap.value}, dst fold {s.dst_fold.value}"
    if isinstance(s, Every):
        kind = "fixed delay" if s.fixed_delay else "fixed rate"
        return f"every {fmt_duration(s.period)} ({kind}), from {fmt_time(s.start)}"
    return f"once at {fmt_time(s.time)}"


def _target_lines(job: Job) -> list[str]:
    """A job's HTTP target, for ``job_text`` (none for a Python handler)."""
    t = job.http
    if t is None:
        return []
    lines = [
        f"  http        {t.method} {t.url}",
        f"              timeout {fmt_duration(t.timeout)}",
    ]
    lines[-1] += f", signed with secret {t.signing_secret}" if t.signing_secret else ", unsigned"
    if t.retry_4xx:
        lines[-1] += ", 4xx retried"
    if t.follow_redirects:
        lines[-1] += ", redirects followed"
    lines.extend(f"              {name}: {value}" for name, value in t.headers.items())
    return lines


def _bounds_lines(job: Job) -> list[str]:
    """The bounds of a job's schedule, where it has any."""
    parts = []
    if job.active_from is not None:
        parts.append(f"from {fmt_time(job.active_from)}")
    if job.active_until is not None:
        parts.append(f"until {fmt_time(job.active_until)}")
    if job.max_fires:
        parts.append(f"at most {job.max_fires} fires")
    return [f"  bounds      {', '.join(parts)}"] if parts else []


def job_text(job: Job) -> list[str]:
    """``wheelctl job ID``'s lines: the spec, the state, the next fires in
    UTC (and in a cron's zone), the last runs."""
    c, o, r = job.catch_up, job.overlap, job.retry
    sealed = described(job.payload)
    try:
        payload = job.payload.decode("utf-8")
        shown = payload if len(payload) <= 200 else payload[:200] + "..."
        payload_text = f"{len(job.payload)} bytes: {shown}" if job.payload else "none"
    except UnicodeDecodeError:
        payload_text = f"{len(job.payload)} bytes, not UTF-8 text"
    if sealed is not None:  # and this command was given no key file that opens it
        payload_text = f"{len(job.payload)} bytes, {sealed}"
    window = "any" if c.window is None else fmt_duration(c.window)
    lines = [
        f"job {job.job_id}: {job.name}",
        f"  state       {job.state}",
        f"  handler     {job.handler}   pool {job.pool}   tenant {job.tenant}",
        f"  priority    {job.priority}",
        *_target_lines(job),
        f"  schedule    {_schedule_text(job)}",
        *_bounds_lines(job),
        f"  jitter      {fmt_duration(job.jitter)}",
        f"  catch-up    {c.mode.value}, window {window}, at most {c.max_count}",
        f"  overlap     {o.policy.value}, max concurrent {o.max_concurrent}",
        f"  retry       {r.max_attempts} attempts in all; backoff {fmt_duration(r.initial_backoff)}"
        f" x{r.multiplier:g} up to {fmt_duration(r.max_backoff)}, full jitter",
        f"  timeout     {fmt_duration(job.timeout)}",
        f"  side effect {'at most once' if job.at_most_once else 'idempotent'}",
        *(
            [f"  skips       {', '.join(job.skip_calendars)} (calendars)"]
            if job.skip_calendars
            else []
        ),
        f"  payload     {payload_text}",
        f"  created     {fmt_time(job.created_at)}   updated {fmt_time(job.updated_at)}",
    ]
    zone = job.schedule.tz if isinstance(job.schedule, Cron) else None
    lines.append("next fires:" if job.next_fires else "next fires: none")
    for t in job.next_fires:
        local = f"  {fmt_zoned(t, zone)}" if zone and zone != "UTC" else ""
        lines.append(f"  {fmt_time(t)}{local}")
    if job.recent_runs:
        lines.append("last runs:")
        lines.append("  " + RUN_HEADER)
        lines.extend("  " + run_line(run) for run in job.recent_runs)
    else:
        lines.append("last runs: none")
    return lines


def cmd_job(ns: argparse.Namespace) -> int:
    with command_client(ns) as client:
        job = client.get(ns.job_id, next_fires=ns.next, recent_runs=ns.runs)
    if ns.json:
        print(
            json.dumps(
                {
                    **job_json(job),
                    "created_at_ms": epoch_ms(job.created_at),
                    "next_fires_ms": [epoch_ms(t) for t in job.next_fires],
                    "recent_runs": [run_json(r) for r in job.recent_runs],
                }
            )
        )
        return 0
    print("\n".join(job_text(job)))
    return 0


def _count(most: int) -> Any:
    def convert(text: str) -> int:
        value = int(text)
        if not 0 <= value <= most:
            raise argparse.ArgumentTypeError(f"must be 0 to {most}, got {value}")
        return value

    convert.__name__ = "number"
    return convert


def register(sub: Any, target: str, target_help: str) -> None:
    """Add ``jobs``, ``job``, ``runs`` and ``run``."""

    def common(p: argparse.ArgumentParser, json_help: str) -> None:
        p.add_argument("--target", default=target, help=target_help)
        add_token_flag(p)
        p.add_argument("--json", action="store_true", help=json_help)

    j = sub.add_parser("jobs", help="list jobs, with a header line")
    common(j, "the jobs as a JSON array")
    j.add_argument("--tenant", help="only this tenant's (an admin's token sees them all)")
    j.add_argument(
        "--state", choices=[s.value for s in JobState], help="only the jobs in this state"
    )
    j.add_argument(
        "--name",
        metavar="PREFIX",
        help="only the jobs whose name starts with PREFIX (case-sensitive; listed in name order)",
    )
    j.set_defaults(fn=cmd_jobs)

    one = sub.add_parser("job", help="one job in full: spec, state, next fires, last runs")
    one.add_argument("job_id", type=int, help="the job's id")
    common(one, "the job as JSON, with next_fires_ms and recent_runs")
    one.add_argument(
        "--next", type=_count(100), default=5, help="how many next fires (default 5, at most 100)"
    )
    one.add_argument(
        "--runs", type=_count(100), default=10, help="how many last runs (default 10, at most 100)"
    )
    one.set_defaults(fn=cmd_job)

    r = sub.add_parser(
        "runs",
        help="a job's runs (every attempt) and missed fires, newest first",
        description="A job's runs and missed fires, newest first: the newest --limit (50)"
        " unless --all. Times are UTC (Z). STARTED is when the worker started the run (when"
        " a run ended before its start was recorded, when it was handed out); DURATION runs"
        " from then to FINISHED.",
    )
    r.add_argument("job_id", type=int, help="the job's id")
    common(r, "the runs as a JSON array (the same --limit)")
    r.add_argument(
        "--limit",
        type=_count(1_000_000),
        default=DEFAULT_RUNS_LIMIT,
        help=f"at most the newest N (default {DEFAULT_RUNS_LIMIT}; 0: all)",
    )
    r.add_argument("--all", action="store_true", help="every run, however many")
    r.add_argument(
        "--state",
        action="append",
        choices=[s.value for s in RunState],
        help="only runs in this state (missed: the missed fires); again for more states",
    )
    r.set_defaults(fn=cmd_runs)

    one_run = sub.add_parser(
        "run",
        help="one run in full: its times, worker, error and result",
        description="One run (one attempt of one fire) in full, its result pretty-printed."
        " Times are UTC (Z).",
    )
    one_run.add_argument("run_id", type=int, help="the run's id (the RUN column of runs)")
    common(one_run, "the run as JSON (the keys of runs --json, and job_id, idempotency_key)")
    one_run.set_defaults(fn=cmd_run)
