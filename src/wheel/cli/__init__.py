"""``wheelctl``: run a node or a worker, and talk to a running node.

wheelctl serve  [--data-dir DIR] [--listen HOST:PORT] [--store URL] ...   (see wheel.cli.serve)
wheelctl worker [--target HOST:PORT[,HOST:PORT...]]... [--capacity N] [--http] module:function ...
wheelctl submit --name N --handler H (--at WHEN | --cron EXPR | --every DURATION) ...
wheelctl submit --name N --http-url URL [--http-method M] [--http-header "K: V"]...
                [--payload BODY] [--signing-secret NAME] [--http-timeout 10s] --cron ...
wheelctl import FILE   (JSON Lines, one submit a line; see wheel.cli.import_)
wheelctl jobs | job JOB_ID | runs JOB_ID | run RUN_ID   (see wheel.cli.listing)
wheelctl cancel JOB_ID | pause JOB_ID | resume JOB_ID
wheelctl trigger JOB_ID | status | alerts | inflight | demo
wheelctl update JOB_ID ... | updates JOB_ID | backfill JOB_ID --from --to | preview ...
wheelctl dlq list|redrive ...   (see wheel.cli.operator)
wheelctl token create|list|revoke ... | tenant set|list ...   (see wheel.cli.admin)
wheelctl secret set|list|rotate|delete ...   (signing secrets; see wheel.cli.secret)
wheelctl calendar set|list|show|delete ...   (days jobs skip; see wheel.cli.calendar)
wheelctl limit set|list|delete ...   (concurrency keys and rate limits; see wheel.cli.limit)
wheelctl outbox init|status --dsn DSN   (the transactional submit's table; see wheel.cli.outbox)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from wheel import tracing
from wheel.cli import outbox as cli_outbox
from wheel.cli._common import (
    Parser,
    _add_log_format,
    _seconds,
    command_client,
    fmt_time,
    submit_args,
    version,
)
from wheel.cli._jobflags import add_job_flags
from wheel.cli.admin import add_token_flag
from wheel.cli.admin import register as register_admin
from wheel.cli.audit import register as register_audit
from wheel.cli.calendar import register as register_calendar
from wheel.cli.codec import add_codec_flag, codec_of
from wheel.cli.codec import register as register_codec
from wheel.cli.import_ import register as register_import
from wheel.cli.limit import register as register_limit
from wheel.cli.listing import job_line
from wheel.cli.listing import register as register_listing
from wheel.cli.operator import register as register_operator
from wheel.cli.secret import register as register_secret
from wheel.cli.serve import add_serve_parser, quiet_created_series
from wheel.cli.status import cmd_alerts, cmd_inflight, cmd_status
from wheel.client import DEFAULT_TARGET
from wheel.errors import InvalidArgument, WheelError
from wheel.logs import announcement
from wheel.logs import configure as configure_logging
from wheel.tls import (
    add_client_flags,
    client_security,
)

# -- commands ------------------------------------------------------------------------


def cmd_worker(ns: argparse.Namespace) -> int:
    from wheel.worker import load_handlers, run_worker

    if not ns.handlers and not ns.http:
        raise InvalidArgument(
            "handlers", "give at least one module:function, module:worker or module, or --http"
        )
    if ns.allow_private_targets and not ns.http:
        raise InvalidArgument("allow_private_targets", "--allow-private-targets needs --http")
    # Modules are looked for in the working directory first, as uvicorn and
    # celery do (a console script's sys.path does not have it).
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    handlers: dict[str, Any] = {}
    for spec in ns.handlers:
        for name, fn in load_handlers(spec):
            if name in handlers and handlers[name] is not fn:
                raise InvalidArgument("handlers", f"two handlers are named {name!r} ({spec!r})")
            handlers[name] = fn
    if ns.metrics_listen:
        quiet_created_series()
    targets = [t for arg in ns.target or () for t in arg.split(",") if t]
    run_worker(
        targets or [os.environ.get("WHEEL_TARGET", DEFAULT_TARGET)],
        handlers,
        capacity=ns.capacity,
        worker_id=ns.worker_id,
        pools=ns.pool or ["default"],
        reconnect_max=ns.reconnect_max,
        metrics_listen=ns.metrics_listen,
        security=client_security(ns),
        token=ns.token,
        http=ns.http,
        allow_private_targets=ns.allow_private_targets,
        codec=codec_of(ns),
    )
    return 0


def cmd_submit(ns: argparse.Namespace) -> int:
    args = submit_args(ns)
    with command_client(ns) as client:
        job = client.submit(**args)
    if ns.json:
        print(json.dumps({"job_id": job.job_id, "created": job.created}))
    else:
        print(f"{'submitted' if job.created else 'already submitted'} job {job.job_id}")
        print(job_line(job))
    return 0


def _state_cmd(method: str) -> Any:
    def run(ns: argparse.Namespace) -> int:
        with command_client(ns) as client:
            job = getattr(client, method)(ns.job_id)
        print(job_line(job))
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


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="wheelctl", description="wheel: a fault-tolerant job scheduler")
    p.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
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
    w.add_argument(
        "handlers",
        nargs="*",
        help="module:function, name=module:function, module:worker (a wheel.worker.Worker:"
        " its @worker.handler functions) or module (those of its Worker objects); modules are"
        " found in the working directory too",
    )
    w.add_argument(
        "--target",
        action="append",
        help="nodes to hold lease streams to: HOST:PORT[,HOST:PORT...], or the flag once per"
        f" node; in a cluster one is enough, the others are found (default {target})",
    )
    w.add_argument("--capacity", type=int, default=16, help="runs at once, at most (%(default)s)")
    w.add_argument("--worker-id", help="this worker's name (default: host and process id)")
    w.add_argument(
        "--pool", action="append", help="a pool to take runs of (default: default); again for more"
    )
    w.add_argument(
        "--reconnect-max",
        type=_seconds,
        default="2s",
        metavar="DURATION",
        help="the longest wait between tries at a node the worker lost its stream to (the waits"
        " double from 100ms up to it, with jitter; default %(default)s)",
    )
    w.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve the worker's Prometheus metrics at http://HOST:PORT/metrics (default: off)",
    )
    w.add_argument(
        "--http",
        action="store_true",
        help="run the built-in HTTP executor (handler 'http'): send the requests of jobs with an"
        " HTTP target, alone or beside the handlers given",
    )
    w.add_argument(
        "--allow-private-targets",
        action="store_true",
        help="with --http: send to loopback, private and link-local addresses too (refused"
        " otherwise, after DNS resolution)",
    )
    add_token_flag(w)
    add_codec_flag(w)
    _add_log_format(w)
    w.set_defaults(fn=cmd_worker)

    sb = sub.add_parser("submit", help="submit a job")
    sb.add_argument("--target", default=target, help=target_help)
    add_token_flag(sb)
    add_job_flags(sb)
    add_codec_flag(sb)
    sb.add_argument("--json", action="store_true", help="the answer as JSON: job_id, created")
    sb.set_defaults(fn=cmd_submit)

    register_listing(sub, target, target_help)

    for name, method in (("cancel", "cancel"), ("pause", "pause"), ("resume", "resume")):
        c = sub.add_parser(name, help=f"{name} a job")
        c.add_argument("job_id", type=int, help="the job's id")
        c.add_argument("--target", default=target, help=target_help)
        add_token_flag(c)
        c.set_defaults(fn=_state_cmd(method))

    t = sub.add_parser("trigger", help="run a job now, out of band")
    t.add_argument("job_id", type=int, help="the job's id")
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
    al.add_argument("--json", action="store_true", help="the alerts as JSON")
    al.set_defaults(fn=cmd_alerts)

    fl = sub.add_parser("inflight", help="runs in flight on every member, with who holds each")
    fl.add_argument("--target", default=target, help=target_help)
    add_token_flag(fl)
    fl.add_argument("--limit", type=int, default=100, help="at most N, lowest run ids (max 1000)")
    fl.add_argument("--json", action="store_true", help="the runs as JSON")
    fl.set_defaults(fn=cmd_inflight)

    register_admin(sub, target, target_help)
    register_secret(sub, target, target_help)
    register_calendar(sub, target, target_help)
    register_limit(sub, target, target_help)
    register_import(sub, target, target_help)
    register_operator(sub, target, target_help)

    d = sub.add_parser("demo", help="a server, two workers and sample jobs, with live output")
    d.add_argument("--duration", type=float, default=30.0, help="seconds (0: until Ctrl-C)")
    d.add_argument("--port", type=int, default=50051, help="the demo node's port (%(default)s)")
    d.add_argument("--data-dir", help="default: a temporary directory")
    d.set_defaults(fn=cmd_demo)
    cli_outbox.add_parser(sub)
    register_codec(sub)
    register_audit(sub, target, target_help)
    for name, command in sub.choices.items():
        if name not in ("serve", "demo", "outbox"):
            add_client_flags(command)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    configure_logging(
        getattr(ns, "log_format", "text"), level=logging.DEBUG if ns.verbose else logging.INFO
    )
    if ns.command in ("serve", "worker"):  # traces as OTEL_* say (wheel.tracing)
        tracing.configure(f"wheel-{'node' if ns.command == 'serve' else 'worker'}")
    try:
        code: int = ns.fn(ns)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``wheelctl jobs | head``): not an error of
        # ours. Python's recipe: point stdout at devnull so that the flush at
        # exit does not fail again, and end as a shell's killed writer would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except WheelError as exc:
        fmt = getattr(ns, "log_format", "text")
        print(announcement(f"wheelctl: {exc}", fmt, level=logging.ERROR), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    raise SystemExit(main())
