"""``wheelctl``: run a node or a worker, and talk to a running node.

wheelctl serve  [--data-dir DIR] [--listen HOST:PORT] [--store URL] ...   (see wheel.cli_serve)
wheelctl worker [--target HOST:PORT[,HOST:PORT...]]... [--capacity N] module:function ...
wheelctl submit --name N --handler H (--at WHEN | --cron EXPR | --every DURATION) ...
wheelctl import FILE   (JSON Lines, one submit a line; see wheel.cli_import)
wheelctl jobs | runs JOB_ID | cancel JOB_ID | pause JOB_ID | resume JOB_ID
wheelctl trigger JOB_ID | status | alerts | inflight | demo
wheelctl update JOB_ID ... | updates JOB_ID | backfill JOB_ID --from --to | preview ...
wheelctl dlq list|redrive ...   (see wheel.cli_operator)
wheelctl token create|list|revoke ... | tenant set|list ...   (see wheel.cli_admin)
wheelctl outbox init|status --dsn DSN   (the transactional submit's table; see wheel.cli_outbox)
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from wheel import cli_outbox
from wheel._tls_cli import (
    add_client_flags,
    client_security,
)
from wheel.cli_admin import add_token_flag
from wheel.cli_admin import register as register_admin
from wheel.cli_common import (
    _add_log_format,
    command_client,
    epoch_ms,
    fmt_time,
    parse_duration,
    version,
)
from wheel.cli_serve import add_serve_parser, quiet_created_series
from wheel.cli_status import cmd_alerts, cmd_inflight, cmd_status
from wheel.client import (
    DEFAULT_TARGET,
    CatchUp,
    CatchUpMode,
    Cron,
    DstFold,
    DstGap,
    Every,
    Job,
    JobArgs,
    Overlap,
    OverlapPolicy,
    Schedule,
)
from wheel.errors import InvalidArgument, WheelError
from wheel.logs import announcement
from wheel.logs import configure as configure_logging

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_when(text: str, field: str) -> datetime | timedelta:
    """'+5s' (that long from now), epoch milliseconds, or an ISO 8601 time
    (UTC if it has no zone)."""
    text = text.strip()
    if text.startswith("+"):
        return parse_duration(text[1:], field)
    if text.isdigit():
        try:
            return _EPOCH + timedelta(milliseconds=int(text))
        except OverflowError:
            raise InvalidArgument(field, f"{text!r} epoch ms is past the year 9999") from None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(field, f"{text!r} is not +DURATION, epoch ms or ISO 8601") from None


def submit_args(ns: argparse.Namespace, now: datetime | None = None) -> JobArgs:
    """``Client.submit``'s keywords from ``wheelctl submit``'s flags; the client
    checks them (one schedule, options that go with it). Relative times
    (``+5s``) count from ``now`` (default: the wall clock's now), so that
    sending the same request again sends the same body."""
    now = now or datetime.now(UTC)
    args: JobArgs = {
        "name": ns.name,
        "handler": ns.handler,
        "tz": ns.tz,
        "dst_gap": ns.dst_gap,
        "dst_fold": ns.dst_fold,
        "fixed_delay": _on(ns, "fixed_delay", "fixed_rate"),
        "payload": ns.payload,
        "tenant": ns.tenant,
        "pool": ns.pool,
        "catch_up": CatchUp(
            mode=ns.catch_up,
            window=parse_duration(ns.catch_up_window, "catch_up_window")
            if ns.catch_up_window
            else None,
            max_count=ns.catch_up_max,
        ),
        "overlap": Overlap(policy=ns.overlap, max_concurrent=ns.max_concurrent),
        "retry": ns.max_attempts,
        "timeout": parse_duration(ns.timeout, "timeout"),
        "at_most_once": _on(ns, "at_most_once", "idempotent"),
        "idempotency_key": ns.key or None,
    }
    if ns.at:
        at = parse_when(ns.at, "at")
        args["at"] = now + at if isinstance(at, timedelta) else at
    if ns.cron:
        args["cron"] = ns.cron
    if ns.every:
        args["every"] = parse_duration(ns.every, "every")
    if ns.start:
        start = parse_when(ns.start, "start")
        args["start"] = now + start if isinstance(start, timedelta) else start
    if ns.jitter:
        args["jitter"] = parse_duration(ns.jitter, "jitter")
    return args


# -- commands ------------------------------------------------------------------------


def cmd_worker(ns: argparse.Namespace) -> int:
    from wheel.worker import load_handler, run_worker

    if not ns.handlers:
        raise InvalidArgument("handlers", "give at least one module:function")
    handlers = dict(load_handler(h) for h in ns.handlers)
    sys.path.insert(0, os.getcwd())
    if ns.metrics_listen:
        quiet_created_series()
    targets = [t for arg in ns.target or () for t in arg.split(",") if t]
    run_worker(
        targets or [os.environ.get("WHEEL_TARGET", DEFAULT_TARGET)],
        handlers,
        capacity=ns.capacity,
        worker_id=ns.worker_id,
        pools=ns.pool or ["default"],
        metrics_listen=ns.metrics_listen,
        security=client_security(ns),
        token=ns.token,
    )
    return 0


def _job_line(job: Job) -> str:
    return (
        f"{job.job_id:>20}  {job.state:<9}  {job.name:<24}  "
        f"next {fmt_time(job.next_fire)}  handler {job.handler}"
    )


def cmd_submit(ns: argparse.Namespace) -> int:
    args = submit_args(ns)
    with command_client(ns) as client:
        job = client.submit(**args)
    if ns.json:
        print(json.dumps({"job_id": job.job_id, "created": job.created}))
    else:
        print(f"{'submitted' if job.created else 'already submitted'} job {job.job_id}")
        print(_job_line(job))
    return 0


def cmd_jobs(ns: argparse.Namespace) -> int:
    with command_client(ns) as client:
        if ns.json:
            print(json.dumps([job_json(job) for job in client.jobs(tenant=ns.tenant)]))
            return 0
        for job in client.jobs(tenant=ns.tenant):
            print(_job_line(job))
    return 0


def schedule_json(schedule: Schedule) -> dict[str, Any]:
    if isinstance(schedule, Cron):
        return {
            "cron": schedule.expr,
            "tz": schedule.tz,
            "dst_gap": schedule.dst_gap.value,
            "dst_fold": schedule.dst_fold.value,
        }
    if isinstance(schedule, Every):
        return {
            "every_ms": round(schedule.period.total_seconds() * 1000),
            "start_ms": epoch_ms(schedule.start),
            "fixed_delay": schedule.fixed_delay,
        }
    return {"at_ms": epoch_ms(schedule.time)}


def job_json(job: Job) -> dict[str, Any]:
    """A job as ``--json`` listings print it: its whole spec, so that an
    update's answer shows each field it changed. The payload is its UTF-8
    text, or base64 when it is not text (``payload_encoding`` says which)."""
    try:
        payload, encoding = job.payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(job.payload).decode("ascii"), "base64"
    return {
        "job_id": job.job_id,
        "name": job.name,
        "tenant": job.tenant,
        "handler": job.handler,
        "pool": job.pool,
        "state": job.state.value,
        "schedule": schedule_json(job.schedule),
        **policies_json(job),
        "payload": payload,
        "payload_encoding": encoding,
        "next_fire_ms": epoch_ms(job.next_fire) if job.next_fire else 0,
        "updated_at_ms": epoch_ms(job.updated_at),
    }


def policies_json(job: Job) -> dict[str, Any]:
    """A job's policies, durations in milliseconds as the wire has them."""

    def ms(d: timedelta) -> int:
        return round(d.total_seconds() * 1000)

    c, o, r = job.catch_up, job.overlap, job.retry
    return {
        "catch_up": {
            "mode": c.mode.value,
            "window_ms": None if c.window is None else ms(c.window),
            "max_count": c.max_count,
        },
        "overlap": {
            "policy": o.policy.value,
            "max_concurrent": o.max_concurrent,
            "max_buffered": o.max_buffered,
        },
        "retry": {
            "max_attempts": r.max_attempts,
            "initial_backoff_ms": ms(r.initial_backoff),
            "max_backoff_ms": ms(r.max_backoff),
            "multiplier": r.multiplier,
        },
        "timeout_ms": ms(job.timeout),
        "jitter_ms": ms(job.jitter),
        "at_most_once": job.at_most_once,
    }


def cmd_runs(ns: argparse.Namespace) -> int:
    with command_client(ns) as client:
        runs = list(client.runs(ns.job_id))
    if ns.json:
        print(
            json.dumps(
                [
                    {
                        "run_id": r.run_id,
                        "scheduled_for_ms": epoch_ms(r.scheduled_for),
                        "attempt": r.attempt,
                        "state": r.state.value,
                        "fence": r.fence,
                        "worker_id": r.worker_id or "",
                        "error": r.error or "",
                        "missed_reason": r.missed_reason or "",
                    }
                    for r in runs
                ]
            )
        )
        return 0
    for r in runs:
        detail = r.missed_reason or r.error or ""
        print(
            f"{fmt_time(r.scheduled_for)}  attempt {r.attempt}  {r.state:<13} "
            f"run {r.run_id:<8} worker {r.worker_id or '-':<20} {detail}"
        )
    return 0


def _state_cmd(method: str) -> Any:
    def run(ns: argparse.Namespace) -> int:
        with command_client(ns) as client:
            job = getattr(client, method)(ns.job_id)
        print(_job_line(job))
        return 0

    return run


def cmd_trigger(ns: argparse.Namespace) -> int:
    with command_client(ns) as client:
        out = client.trigger(ns.job_id)
    print(
        f"triggered job {out.job_id}: fire {fmt_time(out.scheduled_for)} key {out.idempotency_key}"
    )
    return 0


def cmd_demo(ns: argparse.Namespace) -> int:
    from wheel.demo import run_demo

    return run_demo(duration_s=ns.duration, port=ns.port, data_dir=ns.data_dir)


def add_job_flags(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """The flags of ``wheelctl submit`` that describe the job (``submit_args``
    reads them), and their actions: ``wheelctl import`` takes the same options
    as the keys of each line."""
    return [
        p.add_argument("--name", required=True),
        p.add_argument("--handler", required=True),
        p.add_argument("--at", help="one-shot: +5s, epoch ms, or ISO 8601"),
        p.add_argument("--cron", help="cron expression (5 fields, or 6 with seconds first)"),
        p.add_argument("--tz", default="UTC", help="IANA time zone of the cron expression"),
        p.add_argument(
            "--dst-gap",
            default=DstGap.FIRE_AT_TRANSITION.value,
            choices=[g.value for g in DstGap],
            help="a cron wall time that does not exist (spring forward): fire once at the"
            " transition (default), or skip it (recorded missed, dst_gap)",
        ),
        p.add_argument(
            "--dst-fold",
            default=DstFold.FIRST.value,
            choices=[f.value for f in DstFold],
            help="a cron wall time that comes twice (fall back): fire on the first (default),"
            " or on both",
        ),
        p.add_argument("--every", help="interval, e.g. 30s"),
        p.add_argument("--start", help="first fire of an interval (default: now + period)"),
        *_switch(
            p,
            ("--fixed-delay", "the next fire an interval after the previous run ends"),
            ("--fixed-rate", "fires an interval apart whatever the runs take (the default)"),
        ),
        p.add_argument("--jitter"),
        p.add_argument("--payload", default=""),
        p.add_argument("--tenant", default="default"),
        p.add_argument("--pool", default="default"),
        p.add_argument("--key", "--idempotency-key", dest="key", help="idempotency key"),
        p.add_argument(
            "--catch-up", default="run_latest_only", choices=[m.value for m in CatchUpMode]
        ),
        p.add_argument("--catch-up-window"),
        p.add_argument("--catch-up-max", type=int, default=100),
        p.add_argument("--overlap", default="skip", choices=[o.value for o in OverlapPolicy]),
        p.add_argument("--max-concurrent", type=int, default=1),
        p.add_argument("--max-attempts", type=int, default=5),
        p.add_argument("--timeout", default="5m"),
        *_switch(
            p,
            ("--at-most-once", "a run never starts twice (a lost run is not run again)"),
            ("--idempotent", "a lost run is run again (the default)"),
        ),
    ]


def _switch(
    p: argparse.ArgumentParser, on: tuple[str, str], off: tuple[str, str]
) -> list[argparse.Action]:
    """A switch and the flag that turns it back off (the default), each with a
    dest of its own (``submit_args`` reads the pair): an update can then
    change it either way, and a line of an import cannot mean the opposite of
    what it says."""
    group = p.add_mutually_exclusive_group()
    return [
        group.add_argument(on[0], action="store_true", help=on[1]),
        group.add_argument(off[0], action="store_true", help=off[1]),
    ]


def _on(ns: argparse.Namespace, on: str, off: str) -> bool:
    """A switch of ``_switch``: both given (an import's line) is refused."""
    if getattr(ns, on, False) and getattr(ns, off, False):
        raise InvalidArgument(off, f"give {on} or {off}, not both")
    return bool(getattr(ns, on, False))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="wheelctl", description="wheel: a fault-tolerant job scheduler"
    )
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {version()}",
        help="print the installed wheel-scheduler's version and exit",
    )
    sub = p.add_subparsers(dest="command", required=True)
    target = os.environ.get("WHEEL_TARGET", DEFAULT_TARGET)
    # Several nodes: a call goes to the next when one is unavailable; a worker
    # learns the rest of a cluster from any of them.
    target_help = "a node's HOST:PORT, or several comma-separated ($WHEEL_TARGET; %(default)s)"

    add_serve_parser(sub)

    w = sub.add_parser("worker", help="run handlers for assigned runs")
    w.add_argument("handlers", nargs="*", help="module:function or name=module:function")
    w.add_argument(
        "--target",
        action="append",
        help="nodes to hold lease streams to: HOST:PORT[,HOST:PORT...], or the flag once per"
        f" node; in a cluster one is enough, the others are found (default {target})",
    )
    w.add_argument("--capacity", type=int, default=16)
    w.add_argument("--worker-id")
    w.add_argument("--pool", action="append")
    w.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve the worker's Prometheus metrics at http://HOST:PORT/metrics (default: off)",
    )
    add_token_flag(w)
    _add_log_format(w)
    w.set_defaults(fn=cmd_worker)

    sb = sub.add_parser("submit", help="submit a job")
    sb.add_argument("--target", default=target, help=target_help)
    add_token_flag(sb)
    add_job_flags(sb)
    sb.add_argument("--json", action="store_true")
    sb.set_defaults(fn=cmd_submit)

    j = sub.add_parser("jobs", help="list jobs")
    j.add_argument("--target", default=target, help=target_help)
    add_token_flag(j)
    j.add_argument("--tenant")
    j.add_argument("--json", action="store_true", help="the jobs as a JSON array")
    j.set_defaults(fn=cmd_jobs)

    r = sub.add_parser("runs", help="list a job's runs and missed fires")
    r.add_argument("job_id", type=int)
    r.add_argument("--target", default=target, help=target_help)
    add_token_flag(r)
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=cmd_runs)

    for name, method in (("cancel", "cancel"), ("pause", "pause"), ("resume", "resume")):
        c = sub.add_parser(name, help=f"{name} a job")
        c.add_argument("job_id", type=int)
        c.add_argument("--target", default=target, help=target_help)
        add_token_flag(c)
        c.set_defaults(fn=_state_cmd(method))

    t = sub.add_parser("trigger", help="run a job now, out of band")
    t.add_argument("job_id", type=int)
    t.add_argument("--target", default=target, help=target_help)
    add_token_flag(t)
    t.set_defaults(fn=cmd_trigger)

    st = sub.add_parser("status", help="node status: counters, workers, unserved handlers")
    st.add_argument("--target", default=target, help=target_help)
    add_token_flag(st)
    st.add_argument("--json", action="store_true", help="the status as JSON (durations in s)")
    st.add_argument(
        "--shards",
        action="store_true",
        help="and the shard map: each shard's owner and the epoch it holds it under, asked"
        " of every member, with shards moving, held twice or not held said so",
    )
    st.set_defaults(fn=cmd_status)

    al = sub.add_parser("alerts", help="the node's alerts, and the kinds firing now")
    al.add_argument("--target", default=target, help=target_help)
    add_token_flag(al)
    al.add_argument("--since", help="only those raised this long ago or later, e.g. 1h")
    al.add_argument("--limit", type=int, default=0, help="at most the newest N (0: all)")
    al.add_argument("--json", action="store_true")
    al.set_defaults(fn=cmd_alerts)

    fl = sub.add_parser("inflight", help="runs in flight on every member, with who holds each")
    fl.add_argument("--target", default=target, help=target_help)
    add_token_flag(fl)
    fl.add_argument("--limit", type=int, default=100, help="at most N, lowest run ids (max 1000)")
    fl.add_argument("--json", action="store_true")
    fl.set_defaults(fn=cmd_inflight)

    register_admin(sub, target, target_help)
    from wheel.cli_import import register as register_import  # it imports this module

    register_import(sub, target, target_help)
    from wheel.cli_operator import register as register_operator  # it imports this module

    register_operator(sub, target, target_help)

    d = sub.add_parser("demo", help="a server, two workers and sample jobs, with live output")
    d.add_argument("--duration", type=float, default=30.0, help="seconds (0: until Ctrl-C)")
    d.add_argument("--port", type=int, default=50051)
    d.add_argument("--data-dir", help="default: a temporary directory")
    d.set_defaults(fn=cmd_demo)
    cli_outbox.add_parser(sub)
    for name, command in sub.choices.items():
        if name not in ("serve", "demo", "outbox"):
            add_client_flags(command)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    configure_logging(
        getattr(ns, "log_format", "text"), level=logging.DEBUG if ns.verbose else logging.INFO
    )
    try:
        code: int = ns.fn(ns)
    except WheelError as exc:
        fmt = getattr(ns, "log_format", "text")
        print(announcement(f"wheelctl: {exc}", fmt, level=logging.ERROR), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    raise SystemExit(main())
