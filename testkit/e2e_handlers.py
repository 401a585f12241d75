"""Handlers the end-to-end tests' worker processes run, and a worker entry point
with test-friendly reconnect timing (``python -m e2e_handlers --target ...``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sqlite3
import time
from typing import Any

from wheel.worker import Permanent, Retryable, RunContext, Worker


def record(ctx: RunContext) -> None:
    """Append the run to the file named by WHEEL_E2E_OUT (one line per run)."""
    with open(os.environ["WHEEL_E2E_OUT"], "a") as f:
        f.write(f"{ctx.idempotency_key} {ctx.attempt} {ctx.fence} {ctx.run_id}\n")


def slow(ctx: RunContext) -> None:
    """``record``, after WHEEL_E2E_SLOW_S seconds (default 1.6): a job firing
    every second overlaps itself."""
    time.sleep(float(os.environ.get("WHEEL_E2E_SLOW_S", "1.6")))
    record(ctx)


def traced(ctx: RunContext) -> None:
    """A handler with a span of its own (under the run's, when tracing): its
    first attempt hangs (a test kills its worker), later ones return."""
    from opentelemetry import trace

    with trace.get_tracer("e2e").start_as_current_span("handler-work") as span:
        span.set_attribute("wheel.attempt", ctx.attempt)
        if ctx.attempt == 1:
            time.sleep(60)


def record_payload(ctx: RunContext) -> None:
    """Append the payload the handler got to WHEEL_E2E_OUT + '.payloads', one
    JSON line a run (its text, as the handler sees it)."""
    line = json.dumps({"job": ctx.job_id, "payload": ctx.payload.decode("utf-8", "replace")})
    with open(os.environ["WHEEL_E2E_OUT"] + ".payloads", "a") as f:
        f.write(line + "\n")


def started(ctx: RunContext) -> None:
    """Append the run's payload (text), when it was due and when it started
    (this host's wall clock, ms) to WHEEL_E2E_OUT + '.started', one JSON
    line each, then sleep WHEEL_E2E_RUN_S seconds (default 0.1): a run that
    holds its worker's slot a while."""
    start_ms = time.time_ns() // 1_000_000
    line = json.dumps(
        {
            "payload": ctx.payload.decode(),
            "job": ctx.job_id,
            "attempt": ctx.attempt,
            "scheduled_for_ms": ctx.scheduled_for_ms,
            "started_ms": start_ms,
        }
    )
    _append(".started", line)
    time.sleep(float(os.environ.get("WHEEL_E2E_RUN_S", "0.1")))


def starts(out: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The runs ``started`` wrote for this output file, in the order they started."""
    try:
        with open(f"{os.fspath(out)}.started") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
    return sorted(rows, key=lambda r: r["started_ms"])


def record_where(ctx: RunContext) -> None:
    """Append the run with the handler it was sent for and the worker that ran
    it (WHEEL_E2E_WORKER) to WHEEL_E2E_OUT + '.where', one JSON line each."""
    line = json.dumps(
        {
            "job": ctx.job_id,
            "run": ctx.run_id,
            "attempt": ctx.attempt,
            "handler": ctx.handler,
            "worker": os.environ.get("WHEEL_E2E_WORKER", ""),
        }
    )
    _append(".where", line)


def _append(suffix: str, line: str) -> None:
    """One line to WHEEL_E2E_OUT + ``suffix`` in a single O_APPEND write: lines
    from concurrent threads and processes never interleave."""
    fd = os.open(os.environ["WHEEL_E2E_OUT"] + suffix, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def where(out: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The runs ``record_where`` wrote for this output file."""
    try:
        with open(f"{os.fspath(out)}.where") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def _event(ctx: RunContext, event: str, **extra: Any) -> None:
    """One JSON line per event in WHEEL_E2E_OUT + '.events' (a single O_APPEND
    write, so lines from concurrent threads and processes never interleave)."""
    line = json.dumps(
        {
            "event": event,
            "job": ctx.job_id,
            "run": ctx.run_id,
            "attempt": ctx.attempt,
            "fence": ctx.fence,
            "key": ctx.idempotency_key,
            "scheduled_for": ctx.scheduled_for_ms,
            "pid": os.getpid(),
            "t": time.time(),
            **extra,
        }
    )
    fd = os.open(os.environ["WHEEL_E2E_OUT"] + ".events", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _fenced_write(ctx: RunContext) -> bool:
    """The protected resource of seed deep dive B: a conditional write keyed by the
    fire's idempotency key that only a fence at least as new as the last one wins."""
    db = sqlite3.connect(os.environ["WHEEL_E2E_OUT"] + ".resource.db", timeout=10)
    try:
        with db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS resource"
                " (key TEXT PRIMARY KEY, fence INTEGER NOT NULL, run INTEGER NOT NULL)"
            )
            cur = db.execute(
                "INSERT INTO resource (key, fence, run) VALUES (?, ?, ?)"
                " ON CONFLICT (key) DO UPDATE SET fence = excluded.fence, run = excluded.run"
                " WHERE excluded.fence >= resource.fence",
                (ctx.idempotency_key, ctx.fence, ctx.run_id),
            )
            return cur.rowcount == 1
    finally:
        db.close()


def scripted(ctx: RunContext) -> None:
    """Behaviour chosen by the JSON payload, every step logged as an event:

    ``sleep_s``: seconds to sleep, a number or a list (its first entry for
    attempt 1, the second for attempt 2, ...);
    ``fail``: how many first attempts fail (retryable): 2 fails attempts 1 and 2;
    ``permanent``: fail for good;
    ``fenced``: finish with a fenced write to the shared resource;
    ``effect_dsn``: finish with an effect made once by ``wheel.effects`` in
    that PostgreSQL database.
    """
    opts: dict[str, Any] = json.loads(ctx.payload or b"{}")
    _event(ctx, "start")
    sleep = opts.get("sleep_s", 0)
    if isinstance(sleep, list):
        sleep = sleep[ctx.attempt - 1] if ctx.attempt <= len(sleep) else 0
    if sleep:
        time.sleep(sleep)
    if opts.get("permanent"):
        _event(ctx, "end", outcome="permanent")
        raise Permanent("scripted permanent failure")
    if ctx.attempt <= int(opts.get("fail", 0)):
        _event(ctx, "end", outcome="retryable")
        raise Retryable(f"scripted failure of attempt {ctx.attempt}")
    if opts.get("fenced"):
        won = _fenced_write(ctx)
        _event(ctx, "fenced_write", accepted=won)
    if opts.get("effect_dsn"):
        _event(ctx, "effect", outcome=_effect_once(ctx, opts["effect_dsn"]))
    _event(ctx, "end", outcome="succeeded")


def _effect_once(ctx: RunContext, dsn: str) -> str:
    """The worked example of docs/effects.md: the reminder and its record in one
    transaction; "written", or why the database refused it."""
    import psycopg

    from wheel import effects

    with psycopg.connect(dsn) as conn:
        try:
            with conn.transaction():
                effects.record(conn, ctx)
                conn.execute(
                    "INSERT INTO reminders (key, fence, attempt, pid) VALUES (%s, %s, %s, %s)",
                    (ctx.idempotency_key, ctx.fence, ctx.attempt, os.getpid()),
                )
        except effects.StaleFence:
            return "stale"
        except effects.EffectDone:
            return "done"
    return "written"


# -- the chaos workload's handler ----------------------------------------------------------
#
# It keeps its own record, independent of wheel's: one JSON line in
# WHEEL_E2E_OUT + '.effects' when an attempt starts and one when it ends (its
# outcome, with both times), and, for a success, a fenced write to a per-job
# resource (WHEEL_E2E_OUT + '.jobs.db') that refuses a fence older than the
# one it last accepted and keeps every write it was asked for, in order.


def _effect(ctx: RunContext, kind: str, **extra: Any) -> None:
    line = json.dumps(
        {
            "kind": kind,
            "key": ctx.idempotency_key,
            "job": ctx.job_id,
            "scheduled_for": ctx.scheduled_for_ms,
            "attempt": ctx.attempt,
            "fence": ctx.fence,
            "run": ctx.run_id,
            "pid": os.getpid(),
            "worker": os.environ.get("WHEEL_E2E_WORKER", ""),
            **extra,
        }
    )
    _append(".effects", line)


JOB_RESOURCE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS job_state"
    " (job INTEGER PRIMARY KEY, fence INTEGER NOT NULL, run INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS job_writes (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " job INTEGER NOT NULL, key TEXT NOT NULL, fence INTEGER NOT NULL, run INTEGER NOT NULL,"
    " accepted INTEGER NOT NULL)",
)


def _fenced_job_write(ctx: RunContext) -> bool:
    """A write to the job's row that only a fence at least as new as the last
    accepted one wins; every write asked for is kept in ``job_writes``."""
    db = sqlite3.connect(os.environ["WHEEL_E2E_OUT"] + ".jobs.db", timeout=30)
    try:
        with db:
            for statement in JOB_RESOURCE_SCHEMA:
                db.execute(statement)
            cur = db.execute(
                "INSERT INTO job_state (job, fence, run) VALUES (?, ?, ?)"
                " ON CONFLICT (job) DO UPDATE SET fence = excluded.fence, run = excluded.run"
                " WHERE excluded.fence >= job_state.fence",
                (ctx.job_id, ctx.fence, ctx.run_id),
            )
            won = cur.rowcount == 1
            db.execute(
                "INSERT INTO job_writes (job, key, fence, run, accepted) VALUES (?, ?, ?, ?, ?)",
                (ctx.job_id, ctx.idempotency_key, ctx.fence, ctx.run_id, int(won)),
            )
            return won
    finally:
        db.close()


def chaos(ctx: RunContext) -> None:
    """Behaviour chosen by the JSON payload; every attempt logged (``_effect``):

    ``sleep_s``: seconds to sleep (past the lease, even past the timeout);
    ``fail``: how many first attempts fail (retryable);
    ``permanent``: fail for good;
    ``crash``: how many first attempts end the worker process (``os._exit``)
    right after their effect, before wheel hears of it.
    """
    opts: dict[str, Any] = json.loads(ctx.payload or b"{}")
    start = time.time()
    _effect(ctx, "start", t=start)

    def end(outcome: str, **extra: Any) -> None:
        _effect(ctx, "end", outcome=outcome, start=start, end=time.time(), **extra)

    sleep = float(opts.get("sleep_s", 0))
    if sleep:
        time.sleep(sleep)
    if opts.get("permanent"):
        end("permanent")
        raise Permanent("scripted permanent failure")
    if ctx.attempt <= int(opts.get("fail", 0)):
        end("retryable")
        raise Retryable(f"scripted failure of attempt {ctx.attempt}")
    accepted = _fenced_job_write(ctx)
    if ctx.attempt <= int(opts.get("crash", 0)):
        end("crash", accepted=accepted)
        os._exit(17)
    end("succeeded", accepted=accepted)


def effects(out: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The lines ``chaos`` wrote for this output file (a torn last line, from
    a process killed while writing it, is left out)."""
    try:
        with open(f"{os.fspath(out)}.effects") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    out_lines = []
    for line in lines:
        try:
            out_lines.append(json.loads(line))
        except ValueError:
            continue
    return out_lines


def events(out: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The events written so far by ``scripted`` for this output file."""
    try:
        with open(f"{os.fspath(out)}.events") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def main() -> None:
    p = argparse.ArgumentParser()
    # Once per node: the worker holds a stream to each (a cluster's members).
    p.add_argument("--target", action="append", required=True)
    p.add_argument("--worker-id", required=True)
    p.add_argument("--pool", default="default")
    p.add_argument("--capacity", type=int, default=8)
    ns = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if os.environ.get("WHEEL_E2E_DEBUG"):
        logging.getLogger("wheel.worker").setLevel(logging.DEBUG)
    worker = Worker(
        ns.target,
        worker_id=ns.worker_id,
        capacity=ns.capacity,
        pools=[ns.pool],
        reconnect_initial=0.05,
        reconnect_max=0.3,
    )
    worker.register("record", record)
    worker.register("scripted", scripted)
    worker.register("chaos", chaos)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, worker.stop)
        await worker.run()

    asyncio.run(run())


if __name__ == "__main__":
    main()
