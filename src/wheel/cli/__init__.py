"""``wheelctl``: run a node or a worker, and talk to a running node.

wheelctl serve  [--data-dir DIR] [--listen HOST:PORT] [--store URL] ...   (see wheel.cli.serve)
wheelctl worker [--target HOST:PORT[,HOST:PORT...]]... [--capacity N] module:function ...
wheelctl submit --name N --handler H (--at WHEN | --cron EXPR | --every DURATION) ...
wheelctl import FILE   (JSON Lines, one submit a line; see wheel.cli.import_)
wheelctl jobs | job JOB_ID | runs JOB_ID   (see wheel.cli.listing)
wheelctl cancel JOB_ID | pause JOB_ID | resume JOB_ID
wheelctl trigger JOB_ID | status | alerts | inflight | demo
wheelctl update JOB_ID ... | updates JOB_ID | backfill JOB_ID --from --to | preview ...
wheelctl dlq list|redrive ...   (see wheel.cli.operator)
wheelctl token create|list|revoke ... | tenant set|list ...   (see wheel.cli.admin)
wheelctl outbox init|status --dsn DSN   (the transactional submit's table; see wheel.cli.outbox)
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

from wheel.cli import outbox as cli_outbox
from wheel.cli._common import (
    MAX_PAYLOAD_BYTES,
    ZONELESS_UTC,
    Parser,
    _add_log_format,
    at_least_one,
    command_client,
    epoch_ms,
    fmt_time,
    parse_duration,
    read_payload,
    read_payload_json,
    version,
)
from wheel.cli.admin import add_token_flag
from wheel.cli.admin import register as register_admin
from wheel.cli.listing import job_line
from wheel.cli.listing import register as register_listing
from wheel.cli.serve import add_serve_parser, quiet_created_series
from wheel.cli.status import cmd_alerts, cmd_inflight, cmd_status
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
    Retry,
    Schedule,
)
from wheel.errors import InvalidArgument, WheelError
from wheel.logs import announcement
from wheel.logs import configure as configure_logging
from wheel.tls import (
    add_client_flags,
    client_security,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_when(text: str, field: str) -> datetime | timedelta:
    """'+5s' (that long from now), epoch milliseconds, or an ISO 8601 time
    (naive if it has no zone: the caller says in which zone it is, see
    ``ZONELESS_UTC`` and ``ZONELESS_JOB``)."""
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


def submit_args(
    ns: argparse.Namespace, now: datetime | None = None, *, files: bool = True
) -> JobArgs:
    """``Client.submit``'s keywords from ``wheelctl submit``'s flags; the client
    checks them (one schedule, options that go with it). Relative times
    (``+5s``) count from ``now`` (default: the wall clock's now), so that
    sending the same request again sends the same body; a time without a
    zone is UTC (there is no job yet). With ``files``, ``--payload @PATH``
    reads the payload from a file (an import's lines do not)."""
    now = now or datetime.now(UTC)
    args: JobArgs = {
        "name": ns.name,
        "handler": ns.handler,
        "tz": ns.tz,
        "dst_gap": ns.dst_gap,
        "dst_fold": ns.dst_fold,
        "fixed_delay": _on(ns, "fixed_delay", "fixed_rate"),
        "payload": job_payload(ns, files=files),
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
        "retry": retry_of(ns, {}),
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


def job_payload(ns: argparse.Namespace, *, files: bool = True) -> Any:
    """The payload of ``--payload`` (any bytes, as text or ``@PATH``) or of
    ``--payload-json`` (checked to be JSON), not both. An import line's
    ``payload`` is a JSON value of its own, passed on as it is."""
    raw, as_json = getattr(ns, "payload", None), getattr(ns, "payload_json", None)
    if raw not in (None, "") and as_json is not None:
        raise InvalidArgument("payload_json", "give --payload or --payload-json, not both")
    if as_json is not None:
        return read_payload_json(as_json, "payload_json", files=files)
    if isinstance(raw, str):
        return read_payload(raw, "payload", files=files)
    return b"" if raw is None else raw


# The flags of a retry policy besides --max-attempts, and the Retry field each sets.
_BACKOFF_FLAGS = {
    "initial_backoff": "initial_backoff",
    "max_backoff": "max_backoff",
    "backoff_multiplier": "multiplier",
}


def retry_of(ns: argparse.Namespace, defaults: dict[str, Any]) -> Retry | int:
    """The retry policy of the flags given (``defaults``: submit's, for the
    parts not in ``ns``): a number of attempts alone, or a whole ``Retry``
    when a backoff flag is given."""

    def part(flag: str) -> Any:
        return getattr(ns, flag, defaults.get(flag))

    backoff: dict[str, Any] = {}
    for flag, field in _BACKOFF_FLAGS.items():
        value = part(flag)
        if value is None:
            continue
        backoff[field] = value if flag == "backoff_multiplier" else parse_duration(value, flag)
    attempts: int = part("max_attempts")
    if not backoff:
        return attempts
    return Retry(max_attempts=attempts, **backoff)


# -- commands ------------------------------------------------------------------------


def cmd_worker(ns: argparse.Namespace) -> int:
    from wheel.worker import load_handlers, run_worker

    if not ns.handlers:
        raise InvalidArgument(
            "handlers", "give at least one module:function, module:worker or module"
        )
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
        metrics_listen=ns.metrics_listen,
        security=client_security(ns),
        token=ns.token,
    )
    return 0


def _job_line(job: Job) -> str:
    return job_line(job)


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
        p.add_argument("--name", required=True, help="the job's name (need not be unique)"),
        p.add_argument(
            "--handler", required=True, help="the handler a worker runs, by its registered name"
        ),
        p.add_argument(
            "--at", help=f"one-shot: +5s (from now), epoch ms, or ISO 8601; {ZONELESS_UTC}"
        ),
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
        p.add_argument("--every", help="interval, e.g. 30s (--every=30s works too)"),
        p.add_argument(
            "--start",
            help=f"first fire of an interval: +5s, epoch ms or ISO 8601 (default: now +"
            f" period); {ZONELESS_UTC}",
        ),
        *_switch(
            p,
            ("--fixed-delay", "the next fire an interval after the previous run ends"),
            ("--fixed-rate", "fires an interval apart whatever the runs take (the default)"),
        ),
        p.add_argument(
            "--jitter", help="delay each fire by up to this much, e.g. 10s (never past the next)"
        ),
        p.add_argument(
            "--payload",
            default="",
            help="the bytes a run gets, as text; @PATH reads them from a file, @- from stdin"
            f" (at most {MAX_PAYLOAD_BYTES} bytes, 256 KiB)",
        ),
        p.add_argument(
            "--payload-json",
            help="a JSON payload, checked to be valid JSON; @PATH or @- reads it from a file"
            " or stdin (at most 256 KiB)",
        ),
        p.add_argument("--tenant", default="default", help="the tenant the job belongs to"),
        p.add_argument("--pool", default="default", help="the worker pool whose workers run it"),
        p.add_argument(
            "--key",
            "--idempotency-key",
            dest="key",
            help="idempotency key: a retried submit"
            " with the same key and body returns the same job",
        ),
        p.add_argument(
            "--catch-up",
            default="run_latest_only",
            choices=[m.value for m in CatchUpMode],
            help="fires missed while down: run the latest only (default), all (up to"
            " --catch-up-max), or skip them (each recorded missed)",
        ),
        p.add_argument(
            "--catch-up-window", help="how late a missed fire may still run, e.g. 1h (default: any)"
        ),
        p.add_argument(
            "--catch-up-max", type=int, default=100, help="run_all: at most this many (100)"
        ),
        p.add_argument(
            "--overlap",
            default="skip",
            choices=[o.value for o in OverlapPolicy],
            help="a fire due while the previous run still goes: skip it (default, recorded"
            " missed), buffer one, buffer all, or allow up to --max-concurrent",
        ),
        p.add_argument(
            "--max-concurrent",
            type=at_least_one,
            default=1,
            help="--overlap allow: runs at once, at most",
        ),
        p.add_argument(
            "--max-attempts",
            type=at_least_one,
            default=5,
            help="attempts of a fire in all, the first included, before it is dead-lettered (5)",
        ),
        p.add_argument(
            "--initial-backoff",
            help="wait before the first retry, e.g. 1s (the default); each retry waits a random"
            " time up to the backoff (full jitter)",
        ),
        p.add_argument(
            "--max-backoff", help="the backoff grows to at most this, e.g. 5m (the default)"
        ),
        p.add_argument(
            "--backoff-multiplier",
            type=_multiplier,
            help="the backoff is multiplied by this after each retry, 1 to 100 (default 2)",
        ),
        p.add_argument("--timeout", default="5m", help="a run's time limit, e.g. 30s (5m)"),
        *_switch(
            p,
            ("--at-most-once", "a run never starts twice (a lost run is not run again)"),
            ("--idempotent", "a lost run is run again (the default)"),
        ),
    ]


def _multiplier(text: str) -> float:
    """--backoff-multiplier: the node takes 1 to 100."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 1.0 <= value <= 100.0:
        raise argparse.ArgumentTypeError(f"must be between 1 and 100, got {text}")
    return value


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
    from wheel.cli.import_ import register as register_import  # it imports this module

    register_import(sub, target, target_help)
    from wheel.cli.operator import register as register_operator  # it imports this module

    register_operator(sub, target, target_help)

    d = sub.add_parser("demo", help="a server, two workers and sample jobs, with live output")
    d.add_argument("--duration", type=float, default=30.0, help="seconds (0: until Ctrl-C)")
    d.add_argument("--port", type=int, default=50051, help="the demo node's port (%(default)s)")
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
