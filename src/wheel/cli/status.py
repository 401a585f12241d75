"""``wheelctl status`` and ``wheelctl alerts``: what a node says about
itself, its workers and its cluster (with ``--shards``, the shard map its
members report: ``wheel.cli.shards``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from datetime import UTC, datetime, timedelta

from wheel.cli._common import command_client, epoch_ms, fmt_time, parse_duration
from wheel.cli.shards import ShardRow, gather, shard_lines, shard_map
from wheel.client import Alert, Client, Status
from wheel.errors import WheelError
from wheel.tls import client_security

__all__ = ["alert_line", "cmd_alerts", "cmd_inflight", "cmd_status", "status_lines"]


def status_lines(st: Status) -> list[str]:
    """``wheelctl status``: the node, its counters, a row per worker (held/capacity,
    pools, the handlers it runs) and a row per handler that work waits for."""
    ms = timedelta(milliseconds=1)
    lines = [
        f"node {st.node_id}: {st.jobs} jobs, {st.pending_timers} timers, {st.in_flight} in flight",
        f"backlog {st.backlog} ({st.overdue_backlog} overdue), dispatch lag"
        f" p50 {st.dispatch_lag_p50 / ms:.1f} ms p99 {st.dispatch_lag_p99 / ms:.1f} ms",
        f"totals: {st.dispatched_total} dispatched, {st.completed_total} completed,"
        f" {st.missed_total} missed, {st.dead_lettered_total} dead-lettered",
    ]
    lines += [f"  node {n.node_id} {n.address} owns {n.shards_owned} shards" for n in st.nodes]
    if st.reaper_paused:
        lines.append(f"re-dispatch of lost runs is paused: {_why_reaper_paused(st)}")
    lines.append(f"workers: {st.workers}, capacity {st.worker_capacity}")
    for w in st.worker_list:
        flags = "".join(
            f"  {flag}" for flag, on in (("draining", w.draining), ("silent", w.silent)) if on
        )
        lines.append(
            f"  {w.worker_id}  held {w.held}/{w.capacity}  pools {','.join(w.pools) or '-'}"
            f"  handlers {', '.join(w.handlers) or '(any)'}{flags}"
        )
    lines += [
        f"no worker for handler {u.handler} in pool {u.pool}: {u.waiting} waiting"
        for u in st.unserved
    ]
    if st.alerts_firing:
        lines.append(f"alerts firing: {', '.join(st.alerts_firing)} (wheelctl alerts)")
    return lines


def _why_reaper_paused(st: Status) -> str:
    """The true reason: an empty fleet is not a busy one."""
    if st.workers == 0:
        return "no worker is connected"
    if st.worker_capacity == 0:
        return "the connected workers have no capacity"
    return "the workers are busy"


def alert_line(a: Alert) -> str:
    about = "".join(
        f"  {name} {value}"
        for name, value in (("job", a.job_id), ("run", a.run_id), ("worker", a.worker_id))
        if value is not None
    )
    return f"{fmt_time(a.at)}  {a.kind:<17} {a.node_id}  {a.message}{about}"


def cmd_alerts(ns: argparse.Namespace) -> int:
    since = datetime.now(UTC) - parse_duration(ns.since, "since") if ns.since else None
    with command_client(ns) as client:
        out = client.alerts(since=since, limit=ns.limit)
    if ns.json:
        print(
            json.dumps(
                {
                    "firing": [str(k) for k in out.firing],
                    "alerts": [
                        {
                            "at_ms": epoch_ms(a.at),
                            "kind": str(a.kind),
                            "message": a.message,
                            "node_id": a.node_id,
                            "job_id": a.job_id,
                            "run_id": a.run_id,
                            "fence": a.fence,
                            "worker_id": a.worker_id,
                        }
                        for a in out.alerts
                    ],
                }
            )
        )
        return 0
    print(f"firing: {', '.join(out.firing) or 'none'}")
    for a in out.alerts:
        print(alert_line(a))
    return 0


def cmd_inflight(ns: argparse.Namespace) -> int:
    """The runs in flight on every member of the cluster (the lowest run
    ids, at most ``--limit``), with the member holding each."""
    with command_client(ns) as client:
        held = client.in_flight(limit=ns.limit)
    if ns.json:
        runs = [
            {
                "run_id": r.run_id,
                "job_id": r.job_id,
                "scheduled_for_ms": epoch_ms(r.scheduled_for),
                "attempt": r.attempt,
                "fence": r.fence,
                "node_id": r.node_id,
                "worker_id": r.worker_id,
                "phase": r.phase,
            }
            for r in held.runs
        ]
        print(json.dumps({"runs": runs, "total": held.total, "unreachable": held.unreachable}))
        return 0
    for r in held.runs:
        print(
            f"run {r.run_id:<10} job {r.job_id:<10} {fmt_time(r.scheduled_for)}"
            f"  attempt {r.attempt}  fence {r.fence}  {r.phase:<10} on {r.node_id or '-'}"
            f"  worker {r.worker_id or '-'}"
        )
    shown = f"{len(held.runs)} of {held.total}" if len(held.runs) < held.total else held.total
    print(f"{shown} in flight")
    if held.unreachable:
        print(f"not answering (their runs are not counted): {', '.join(held.unreachable)}")
    return 0


def _json_default(value: object) -> object:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _member_status(ns: argparse.Namespace, address: str) -> Status | None:
    """Another member's status with its shard rows; None when it does not answer."""
    try:
        with Client(address, timeout=3.0, security=client_security(ns), token=ns.token) as client:
            return client.status(include_shards=True)
    except WheelError:
        return None


def cmd_status(ns: argparse.Namespace) -> int:
    with command_client(ns) as client:
        status = client.status(include_shards=ns.shards)
    answers: dict[str, Status | None] = {}
    rows: list[ShardRow] = []
    if ns.shards:
        answers = gather(status, lambda address: _member_status(ns, address))
        rows = shard_map(status, answers)
    if ns.json:
        out = dataclasses.asdict(status)
        if ns.shards:
            out["shards"] = [r.as_json() for r in rows]
            out["unanswered"] = sorted(n for n, st in answers.items() if st is None)
        print(json.dumps(out, indent=2, default=_json_default))
        return 0
    lines = status_lines(status)
    if ns.shards:
        lines += shard_lines(rows, answers)
    print("\n".join(lines))
    return 0
