"""``wheelctl``: run a node or a worker, and talk to a running node.

wheelctl serve  [--data-dir DIR] [--listen HOST:PORT] [--store URL] [--metrics-listen HOST:PORT]
wheelctl worker [--target HOST:PORT[,HOST:PORT...]]... [--capacity N] module:function ...
wheelctl submit --name N --handler H (--at WHEN | --cron EXPR | --every DURATION) ...
wheelctl import FILE   (JSON Lines, one submit a line; see wheel.cli_import)
wheelctl jobs | runs JOB_ID | cancel JOB_ID | pause JOB_ID | resume JOB_ID
wheelctl trigger JOB_ID | status | alerts | demo
wheelctl update JOB_ID ... | updates JOB_ID | backfill JOB_ID --from --to | preview ...
wheelctl dlq list|redrive ...   (see wheel.cli_operator)
wheelctl token create|list|revoke ... | tenant set|list ...   (see wheel.cli_admin)
wheelctl outbox init|status --dsn DSN   (the transactional submit's table; see wheel.cli_outbox)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from wheel import cli_outbox
from wheel._tls import ChannelSecurity, LiveChannelSecurity, LiveServerSecurity
from wheel._tls_cli import (
    NodeSecurity,
    add_client_flags,
    add_serve_flags,
    api_address,
    check_http_listen,
    client_security,
    node_security,
    tls_paths,
)
from wheel._tls_reload import DEFAULT_INTERVAL_S as DEFAULT_RELOAD_INTERVAL_S
from wheel._tls_reload import TlsReloader
from wheel.cli_admin import add_auth_flags, add_token_flag, init_admin_token
from wheel.cli_admin import register as register_admin
from wheel.cli_common import command_client, epoch_ms, fmt_time, parse_duration
from wheel.cli_status import cmd_alerts, cmd_status
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
from wheel.logs import FORMATS, announcement
from wheel.logs import configure as configure_logging

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_when(text: str, field: str) -> datetime | timedelta:
    """'+5s' (that long from now), epoch milliseconds, or an ISO 8601 time
    (UTC if it has no zone)."""
    text = text.strip()
    if text.startswith("+"):
        return parse_duration(text[1:], field)
    if text.isdigit():
        return _EPOCH + timedelta(milliseconds=int(text))
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
        "fixed_delay": ns.fixed_delay,
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
        "at_most_once": ns.at_most_once,
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


def parse_cluster_url(url: str) -> tuple[list[str], str]:
    """``etcd://HOST:PORT[,HOST:PORT...]/NAME`` -> (endpoints, cluster name)."""
    scheme, sep, rest = url.partition("://")
    hosts, slash, name = rest.partition("/")
    if scheme != "etcd" or not sep or not slash or not name or "/" in name:
        raise InvalidArgument("cluster", f"{url!r} is not etcd://HOST:PORT[,HOST:PORT...]/NAME")
    endpoints = [h for h in hosts.split(",") if h]
    for endpoint in endpoints:
        host, colon, port = endpoint.rpartition(":")
        if not colon or not host or not port.isdigit():
            raise InvalidArgument("cluster", f"{endpoint!r} is not HOST:PORT")
    if not endpoints:
        raise InvalidArgument("cluster", f"{url!r} names no etcd endpoint")
    return endpoints, name


def serve_config(ns: argparse.Namespace, data_dir: Path) -> Any:
    """The node's configuration from ``wheelctl serve``'s flags."""
    from wheel.checkpoint import Durability
    from wheel.engine.owner import OwnerConfig
    from wheel.node import NodeConfig

    # A flag not given is None: the configuration's own default holds.
    owner = {f: getattr(ns, f) for f in ("lease_ms", "grace_lease_ms", "overdue_after_ms")}
    node = {f: getattr(ns, f) for f in ("group_commit_ms", "group_commit_light_ms", "tick_ms")}
    return NodeConfig(
        node_id=ns.node_id,
        retain_ms=ns.retain,
        retention_interval_s=ns.retention_interval,
        owner=OwnerConfig(**{f: v for f, v in owner.items() if v is not None}),
        checkpoint_dir=None if ns.no_checkpoint else str(data_dir / "checkpoint"),
        checkpoint_durability=Durability(ns.checkpoint_durability),
        **{f: v for f, v in node.items() if v is not None},
    )


# The cyclic collector's young generation, in allocations. CPython's default
# (700) runs it about every tenth of a run at 8,000 dispatches/s, so a run's
# objects outlive two young collections and reach the old generation, whose
# full scans (every job cached) took up to 370 ms each: dispatch stalls. At
# 50,000 a run's objects die young.
GC_YOUNG_THRESHOLD = 50_000
# How long a thread may hold the GIL while another waits for it. The store
# thread runs SQLite with the GIL released and needs it back after each
# statement of a batch (a dozen or more); at CPython's 5 ms each return
# waited behind the event loop, and at 24,000 dispatches/s the store thread
# spent about 60% of its time waiting, not working. At 26,000/s on SQLite:
# p99 336 ms at 5 ms, 221 ms at 0.5 ms, 111-122 ms at 0.2 ms, for about 3%
# more CPU.
SWITCH_INTERVAL_S = 0.0002


def tune_runtime() -> None:
    """The collector and the GIL hand-off for a node's process."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def quiet_created_series() -> None:
    """Leave out the ``*_created`` series prometheus_client adds next to each
    counter and histogram: Prometheus does not read them from the text
    format, and they double the series a scrape carries. Process-wide, so
    set by the command that serves metrics, not by the library."""
    import prometheus_client

    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]


def console_security(
    security: NodeSecurity, peers: LiveChannelSecurity
) -> ChannelSecurity | LiveChannelSecurity:
    """How the web console's channel to its own node is secured: as the
    node's channels to its peers, which trust --peer-tls-ca or --client-ca;
    with neither, the node's own certificate chain (a node with a private
    CA and no client certificates still reaches itself)."""
    server = security.server
    if server is None or peers.current.ca is not None:
        return peers
    return ChannelSecurity(tls=True, ca=server.cert, cert=server.cert, key=server.key)


def cmd_serve(ns: argparse.Namespace) -> int:
    from wheel.node import CLOCK_SKEW_ENV, Node
    from wheel.rpc.server import serve
    from wheel.store.open import open_store

    if os.environ.get(CLOCK_SKEW_ENV):
        # Test hook (see wheel.node.Clock): a step signalled before the handler
        # is installed must not end the process (SIGUSR1's default action);
        # the clock reads the file when it is made.
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    # Refused (a bad flag, a network address without TLS) before touching anything.
    security = node_security(ns, auth=ns.auth)
    data_dir = Path(ns.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    url = ns.store or f"sqlite:///{data_dir / 'wheel.db'}"

    coordinator_args = None
    if ns.cluster:
        if not url.startswith(("postgresql://", "postgres://")):
            raise InvalidArgument(
                "store",
                "--cluster needs a PostgreSQL store (--store postgresql://...): SQLite is"
                " one node's embedded file",
            )
        endpoints, cluster = parse_cluster_url(ns.cluster)
        advertise = ns.advertise or ns.listen
        host, _, port = advertise.rpartition(":")
        if port in ("", "0") or host.strip("[]") in ("", "0.0.0.0", "::"):
            raise InvalidArgument(
                "advertise", f"{advertise!r}: other members need a fixed host:port to reach"
            )
        coordinator_args = (endpoints, cluster, advertise)

    if ns.init_admin_token and not ns.auth:
        raise InvalidArgument("init_admin_token", "goes with --auth")
    if ns.http_listen:
        from wheel.console import parse_http_listen

        parse_http_listen(ns.http_listen)
        problem = check_http_listen(
            ns.http_listen, security.server is not None, ns.auth, ns.insecure
        )
        if problem:
            raise InvalidArgument("http_listen", problem)
    elif ns.console_actions:
        raise InvalidArgument("console_actions", "goes with --http-listen")

    def say(
        message: str, stream: IO[str] | None = None, level: int = logging.INFO, **fields: Any
    ) -> None:
        """A line for people and scripts, JSON under ``--log-format json``."""
        line = announcement(message, ns.log_format, level=level, **fields)
        print(line, file=stream or sys.stdout, flush=True)

    async def main() -> None:
        store = open_store(url)
        if ns.init_admin_token and init_admin_token(store, ns.init_admin_token, store.clock_ms()):
            logging.getLogger("wheel").info("wrote a first admin token to %s", ns.init_admin_token)
        # What a reload replaces (wheel._tls_reload): the listeners' TLS, and
        # that of the channels to the other members and to etcd.
        live_server = LiveServerSecurity(security.server) if security.server else None
        live_peers, live_etcd = (
            LiveChannelSecurity(security.peers),
            LiveChannelSecurity(security.etcd),
        )
        coordinator = None
        if coordinator_args is not None:
            from wheel.coord.etcd import EtcdCoordinator

            endpoints, cluster, advertise = coordinator_args
            coordinator = EtcdCoordinator(
                ns.node_id, advertise, endpoints, cluster=cluster, ttl_s=ns.lease_ttl,
                security=live_etcd,
            )  # fmt: skip
        node = Node(store, serve_config(ns, data_dir), coordinator=coordinator)
        await node.start()
        # What the node restored lives as long as the process: never scan it again.
        gc.collect()
        gc.freeze()
        relay_dsn = cli_outbox.outbox_dsn(ns, url)
        server, port = await serve(
            node,
            ns.listen,
            security=live_server,
            peer_security=live_peers,
            auth=ns.auth,
            recheck_s=ns.auth_recheck,
        )
        logging.getLogger("wheel").info(
            "wheel node %s serving on port %d (store %s)", ns.node_id, port, url.split("?")[0]
        )
        logging.getLogger("wheel").log(*security.notice(ns.listen))
        relay = cli_outbox.start_relay(node, relay_dsn) if relay_dsn else None
        metrics = None
        if ns.metrics_listen:
            from wheel.metrics import MetricsServer

            quiet_created_series()
            metrics = MetricsServer(node.metrics.registry)
            ssl = live_server.ssl_context() if live_server else None
            metrics_port = await metrics.start(ns.metrics_listen, ssl=ssl)
            host = ns.metrics_listen.rsplit(":", 1)[0] or "0.0.0.0"
            metrics_url = f"{'https' if ssl else 'http'}://{host}:{metrics_port}/metrics"
            say(f"wheel metrics on {metrics_url}", url=metrics_url, port=metrics_port)
        console = None
        if ns.http_listen:
            from wheel.console import Console, ConsoleServer

            console = ConsoleServer(
                Console(
                    ns.advertise or api_address(ns.listen, port),
                    auth=ns.auth,
                    actions=ns.console_actions,
                    security=console_security(security, live_peers),
                    node_id=ns.node_id,
                )
            )
            ssl = live_server.ssl_context() if live_server else None
            console_port = await console.start(ns.http_listen, ssl=ssl)
            host = ns.http_listen.rsplit(":", 1)[0] or "0.0.0.0"
            console_url = f"{'https' if ssl else 'http'}://{host}:{console_port}/"
            mode = "actions on" if ns.console_actions else "read-only"
            say(f"wheel console on {console_url} ({mode})", url=console_url, port=console_port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if os.environ.get(CLOCK_SKEW_ENV):
            # Test hook (see wheel.node.Clock): step the clock to the file's skew.
            loop.add_signal_handler(signal.SIGUSR1, node.clock.reload_skew)
        watching = None
        paths = tls_paths(ns)
        if paths:
            reloader = TlsReloader(
                lambda: node_security(ns, auth=ns.auth),
                paths,
                server=live_server,
                peers=live_peers,
                etcd=live_etcd,
            )
            loop.add_signal_handler(signal.SIGHUP, reloader.on_signal)
            if ns.tls_reload_interval:
                watching = asyncio.create_task(reloader.watch(ns.tls_reload_interval))
        address = f"{ns.listen.rsplit(':', 1)[0]}:{port}"
        # Scripts and tests wait for this line: the node serves and its signal
        # handlers are in place.
        say(f"wheel serving on {address}", address=address, port=port)
        stopping = asyncio.create_task(stop.wait())
        died = asyncio.create_task(node.stopped.wait())
        await asyncio.wait({stopping, died}, return_when=asyncio.FIRST_COMPLETED)
        crashed = died.done() and not stop.is_set()
        stopping.cancel()
        died.cancel()
        if watching is not None:
            watching.cancel()
        if relay is not None:
            await relay.stop()
        await node.leave()  # shards to the other members first, then the server
        if console is not None:
            await console.stop()
        await server.stop(grace=2.0)
        if metrics is not None:
            await metrics.stop()
        await node.stop()
        store.close()
        if crashed:
            say("wheel: the dispatch loop died; see the log above", sys.stderr, logging.CRITICAL)
            raise SystemExit(1)

    tune_runtime()
    profile = os.environ.get("WHEEL_PROFILE")
    if profile:
        # Operators' and benchmarks' view of where a node's time goes.
        import cProfile

        with cProfile.Profile() as prof:
            asyncio.run(main())
        prof.dump_stats(profile)
        return 0
    asyncio.run(main())
    return 0


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
    """A job as ``--json`` listings print it."""
    return {
        "job_id": job.job_id,
        "name": job.name,
        "tenant": job.tenant,
        "handler": job.handler,
        "pool": job.pool,
        "state": job.state.value,
        "schedule": schedule_json(job.schedule),
        "next_fire_ms": epoch_ms(job.next_fire) if job.next_fire else 0,
        "updated_at_ms": epoch_ms(job.updated_at),
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


def _positive_ms(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number of milliseconds")
    return value


def _ms(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is a negative number of milliseconds")
    return value


def parse_retain(text: str) -> int | None:
    """``--retain``: a duration (30d, 12h), or "forever" (never purge)."""
    if text.strip().lower() in ("forever", "never", "off"):
        return None
    ms = round(parse_duration(text, "retain").total_seconds() * 1000)
    if ms <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a retention must be positive (or 'forever')")
    return ms


def _retain(text: str) -> int | None:
    try:
        return parse_retain(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    """A positive duration flag, in seconds."""
    try:
        seconds = parse_duration(text, "duration").total_seconds()
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive duration")
    return seconds


def _seconds_or_off(text: str) -> float:
    """A duration flag that "off" (or 0) turns off, in seconds (0.0: off)."""
    if text.strip().lower() in ("off", "0"):
        return 0.0
    return _seconds(text)


def _add_log_format(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-format",
        choices=FORMATS,
        default=os.environ.get("WHEEL_LOG_FORMAT", "text"),
        help="text lines (default; $WHEEL_LOG_FORMAT), or one JSON object per line with"
        " job_id, run_id, shard, fence and worker on every record about them",
    )


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
        p.add_argument("--fixed-delay", action="store_true"),
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
        p.add_argument("--at-most-once", action="store_true"),
    ]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="wheelctl", description="wheel: a fault-tolerant job scheduler"
    )
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)
    target = os.environ.get("WHEEL_TARGET", DEFAULT_TARGET)
    # Several nodes: a call goes to the next when one is unavailable; a worker
    # learns the rest of a cluster from any of them.
    target_help = "a node's HOST:PORT, or several comma-separated ($WHEEL_TARGET; %(default)s)"

    s = sub.add_parser(
        "serve", help="run a node (embedded SQLite, all shards; or a cluster member with --cluster)"
    )
    s.add_argument("--data-dir", default=os.environ.get("WHEEL_DATA_DIR", "wheel-data"))
    s.add_argument("--listen", default="127.0.0.1:50051")
    s.add_argument(
        "--store", help="sqlite:///path or postgresql://... (default: SQLite in data dir)"
    )
    s.add_argument("--node-id", default="node-1")
    s.add_argument(
        "--cluster",
        help="etcd://HOST:PORT[,HOST:PORT...]/NAME: join the cluster NAME and own the shards"
        " it gives this node (needs --store postgresql://...)",
    )
    s.add_argument(
        "--advertise",
        help="host:port other members and workers reach this node at (default: --listen)",
    )
    s.add_argument(
        "--lease-ttl",
        type=int,
        default=5,
        help="cluster: seconds a node's etcd lease outlives its last keepalive; a dead"
        " node's shards move within about this plus one second",
    )
    s.add_argument(
        "--checkpoint-durability",
        default="sync",
        choices=["sync", "async", "none"],
        help="LMDB checkpoint: fsync per batch (sync), on process crash only (async), none",
    )
    s.add_argument("--no-checkpoint", action="store_true", help="always rebuild from the store")
    # Without a default here: serve_config leaves the node's own (NodeConfig,
    # OwnerConfig) where a flag is not given, so that building the parser,
    # which every command does, does not import the node.
    s.add_argument(
        "--lease-ms",
        type=_positive_ms,
        help="full lease after a worker's ack; heartbeats come every third of it",
    )
    s.add_argument(
        "--grace-lease-ms",
        type=_positive_ms,
        help="lease of a run handed out but not yet acked",
    )
    s.add_argument(
        "--overdue-after-ms",
        type=_positive_ms,
        help="a fire this late counts as catch-up work",
    )
    s.add_argument(
        "--group-commit-ms",
        type=_ms,
        help="under load, at most one store batch per this many ms (0: no holding back);"
        " more fires per commit for a few ms of lag",
    )
    s.add_argument(
        "--group-commit-light-ms",
        type=_ms,
        help="the same after a small batch: a steady trickle commits at most once per"
        " this many ms (0: at once)",
    )
    s.add_argument(
        "--tick-ms",
        type=_ms,
        help="while fires keep coming due, the dispatch loop goes round at most once per this"
        " many ms, each round one store batch and one message a worker (default 20; 0: a"
        " round at every timer); a fire after a quiet spell goes at once",
    )
    s.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (default: off)",
    )
    s.add_argument(
        "--http-listen",
        metavar="HOST:PORT",
        help="serve the web console at http://HOST:PORT/ (https with --tls-cert): jobs, runs,"
        " missed fires, dead letters, workers, shards and lag, through this node's API with"
        " the browser's token (default: off)",
    )
    s.add_argument(
        "--console-actions",
        action="store_true",
        help="let the web console act (pause, resume, trigger, cancel, redrive) as the"
        " token allows; without it the console only reads",
    )
    s.add_argument(
        "--retain",
        type=_retain,
        default="30d",
        metavar="DURATION",
        help="delete finished runs and missed-fire records older than this, in the"
        " background, in small batches ('forever': keep them; default %(default)s)."
        " 30 days keeps a month of history to look into and to backfill against (a"
        " backfill runs again the fires whose history is gone) while the executions table"
        " stays bounded: a fire a second is 2.6 million rows a month",
    )
    s.add_argument(
        "--retention-interval",
        type=_seconds,
        default="10m",
        metavar="DURATION",
        help="how often a retention pass starts (each paces itself to a tenth of the"
        " store's time; default %(default)s)",
    )
    add_serve_flags(s)
    cli_outbox.add_serve_flag(s)
    s.add_argument(
        "--tls-reload-interval",
        type=_seconds_or_off,
        default=f"{DEFAULT_RELOAD_INTERVAL_S:g}s",
        metavar="DURATION",
        help="how often the TLS files are looked at for a change, which puts them in force"
        " for new connections without a restart, as SIGHUP does ('off': on SIGHUP only;"
        " default %(default)s)",
    )
    add_auth_flags(s, seconds=_seconds)
    _add_log_format(s)
    s.set_defaults(fn=cmd_serve)

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
