"""``wheelctl serve``: a node's flags, its configuration from them
(``wheel.app.AppConfig``, read once here with the environment), and the
command that runs it (``wheel.app.running``) until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from wheel.cli import outbox as cli_outbox
from wheel.cli._common import (
    _add_log_format,
    _ms,
    _positive_ms,
    _retain,
    _seconds,
    _seconds_or_off,
    parse_duration,
)
from wheel.cli.admin import add_auth_flags, init_admin_token
from wheel.errors import InvalidArgument
from wheel.logs import announcement
from wheel.tls import DEFAULT_INTERVAL_S as DEFAULT_RELOAD_INTERVAL_S
from wheel.tls import add_serve_flags, check_http_listen, node_security, tls_paths

if TYPE_CHECKING:
    from wheel.app import AppConfig, Hooks
    from wheel.store.base import Store

# ``--cprofile``'s environment variable, and the name it had before (a job's
# profile is its template: this one is cProfile's).
CPROFILE_ENV = "WHEEL_CPROFILE"
OLD_CPROFILE_ENV = "WHEEL_PROFILE"


def add_serve_parser(sub: Any) -> None:
    """``wheelctl serve`` and its flags, on the subcommands ``sub``."""
    s = sub.add_parser(
        "serve", help="run a node (embedded SQLite, all shards; or a cluster member with --cluster)"
    )
    s.add_argument(
        "--data-dir",
        default=os.environ.get("WHEEL_DATA_DIR", "wheel-data"),
        help="the node's directory: its SQLite store (without --store) and its checkpoint"
        " ($WHEEL_DATA_DIR; %(default)s)",
    )
    s.add_argument(
        "--listen",
        default="127.0.0.1:50051",
        help="HOST:PORT the node's gRPC API listens on (%(default)s)",
    )
    s.add_argument(
        "--store", help="sqlite:///path or postgresql://... (default: SQLite in data dir)"
    )
    s.add_argument(
        "--node-id", default="node-1", help="this node's name, unique in a cluster (%(default)s)"
    )
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
        "--claim-ahead-ms",
        type=_ms,
        help="claim a burst's fires up to this long before their time (when nothing of"
        " their jobs is going on) and hand them out at their time, so the store's commit"
        " is not on the way; a node lost inside the lead leaves its claimed runs to their"
        " grace lease (default 250; 0: every fire claimed at its due time)",
    )
    s.add_argument(
        "--claim-ahead-min",
        type=_claims,
        metavar="N",
        help="the fires armed at one instant that make it a burst's, claimed ahead"
        " (default 64; 1: every fire the lead allows)",
    )
    s.add_argument(
        "--priority-aging",
        dest="priority_aging_ms",
        type=_aging_ms,
        help="a run waiting for a worker of its pool gains a priority level every this long,"
        " e.g. 10s (the default): a priority-9 run ranks with priority 0 after 9 times it;"
        " 0: no aging (strict priority)",
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
        " many ms, each round one store batch and one message a worker (default 30; 0: a"
        " round at every timer); a fire after a quiet spell goes at once",
    )
    s.add_argument(
        "--burst-batch-claims",
        type=_claims,
        metavar="N",
        help="more fires than this due at once go to the store in parts, the first of this"
        " many claims and each next twice the last, each handed out as soon as it is"
        " stored (default 0: one batch)",
    )
    s.add_argument(
        "--min-interval",
        type=_interval_floor_ms,
        metavar="DURATION",
        help="the shortest period an interval job may be submitted or updated with"
        " (default 1s, a seconds-field cron's finest; 0: no minimum); a shorter one is"
        " refused with INVALID_ARGUMENT naming spec.schedule.interval.period_ms",
    )
    s.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (default: off)",
    )
    s.add_argument(
        "--http-listen",
        metavar="HOST:PORT",
        help="serve the web console at http://HOST:PORT/ (https with --tls-cert): an overview"
        " (jobs by state, runs by outcome, lag, workers, shards, alerts), recent runs across"
        " jobs, jobs, runs, missed fires, dead letters, workers, shards and lag, through this"
        " node's API with the browser's token (default: off)",
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
        help="delete finished runs, missed-fire records and settled outbox rows older than"
        " this, in the background, in small batches ('forever': keep them; default %(default)s)."
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
    s.add_argument(
        "--statistics-interval",
        type=_seconds_or_off,
        default="1m",
        metavar="DURATION",
        help="how often the node looks for PostgreSQL tables whose planner statistics"
        " lag far behind their rows (after a bulk load, with autovacuum late or off)"
        " and analyzes them; off never does (default %(default)s)",
    )
    s.add_argument(
        "--trace-stalls",
        type=_seconds_or_off,
        default="off",
        metavar="DURATION",
        help="log each stall of the event loop longer than this with where the loop stood"
        " (its stacks, sampled every 5 ms) and how its thread spent the time: on a CPU,"
        " waiting for one, or asleep; for finding what holds a node up (default %(default)s)",
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
    # Test hooks, not for production (so not in --help): a file whose number of
    # milliseconds skews the node's clock, read again on SIGUSR1 (fault
    # injection steps one node's clock without touching the machine's); a
    # pause of the outbox relay between storing a batch's jobs and recording
    # their rows' fate (the window a crash can fall in).
    s.add_argument(
        "--clock-skew-file",
        metavar="PATH",
        help="fault injection (tests): add the milliseconds this file holds to the node's"
        " wall clock, read again on SIGUSR1",
    )
    s.add_argument(
        "--outbox-record-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="fault injection (tests): wait this long before the outbox relay records"
        " what it made (%(default)s)",
    )
    s.add_argument(
        "--cprofile",
        metavar="PATH",
        help="write a cProfile of the node's process to PATH when it stops: where its time"
        f" goes (${CPROFILE_ENV}; default: off)",
    )
    add_auth_flags(s, seconds=_seconds)
    s.add_argument(
        "--secrets-key-file",
        default=os.environ.get("WHEEL_SECRETS_KEY_FILE"),
        help='the 32-byte key (JSON {"key": BASE64} or bare base64) that encrypts the'
        " signing secrets of HTTP targets in the store; every node of a cluster needs the"
        " same one ($WHEEL_SECRETS_KEY_FILE; default: DATA_DIR/secrets.key, made on first"
        " start)",
    )
    _add_log_format(s)
    s.set_defaults(fn=cmd_serve)


def _aging_ms(text: str) -> int:
    """``--priority-aging``: a duration (``10s``, ``500ms``) or 0, in ms."""
    if text.strip() in ("0", "off"):
        return 0
    try:
        return round(parse_duration(text, "priority_aging").total_seconds() * 1000)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _interval_floor_ms(text: str) -> int:
    """``--min-interval``: a duration (``1s``, ``250ms``) or 0, in ms."""
    if text.strip() in ("0", "off"):
        return 0
    try:
        return round(parse_duration(text, "min_interval").total_seconds() * 1000)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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


def _claims(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is a negative number of claims")
    return value


def serve_config(ns: argparse.Namespace, data_dir: Path) -> Any:
    """The node's configuration from ``wheelctl serve``'s flags."""
    from wheel.checkpoint import Durability
    from wheel.engine.owner import OwnerConfig
    from wheel.node import NodeConfig

    # A flag not given is None: the configuration's own default holds.
    owner = {
        f: getattr(ns, f)
        for f in (
            "lease_ms",
            "grace_lease_ms",
            "overdue_after_ms",
            "priority_aging_ms",
            "claim_ahead_ms",
            "claim_ahead_min",
        )
    }
    node = {
        f: getattr(ns, f)
        for f in (
            "group_commit_ms",
            "group_commit_light_ms",
            "tick_ms",
            "burst_batch_claims",
            "min_interval",
        )
    }
    node["min_interval_ms"] = node.pop("min_interval")
    return NodeConfig(
        node_id=ns.node_id,
        retain_ms=ns.retain,
        retention_interval_s=ns.retention_interval,
        statistics_interval_s=ns.statistics_interval,
        trace_stalls_s=ns.trace_stalls,
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


def app_config(ns: argparse.Namespace) -> AppConfig:
    """The node's process from ``wheelctl serve``'s flags, checked: a bad
    flag, or a network address without TLS, is refused here, before
    anything is opened."""
    from wheel.app import AppConfig, ClusterConfig, TlsReload

    security = node_security(ns, auth=ns.auth)
    data_dir = Path(ns.data_dir).resolve()
    url = ns.store or f"sqlite:///{data_dir / 'wheel.db'}"
    cluster = None
    if ns.cluster:
        if not url.startswith(("postgresql://", "postgres://")):
            raise InvalidArgument(
                "store",
                "--cluster needs a PostgreSQL store (--store postgresql://...): SQLite is"
                " one node's embedded file",
            )
        endpoints, name = parse_cluster_url(ns.cluster)
        advertise = ns.advertise or ns.listen
        host, _, port = advertise.rpartition(":")
        if port in ("", "0") or host.strip("[]") in ("", "0.0.0.0", "::"):
            raise InvalidArgument(
                "advertise", f"{advertise!r}: other members need a fixed host:port to reach"
            )
        cluster = ClusterConfig(endpoints=tuple(endpoints), name=name, lease_ttl_s=ns.lease_ttl)
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
    paths = tls_paths(ns)
    return AppConfig(
        store_url=url,
        node=serve_config(ns, data_dir),
        listen=ns.listen,
        data_dir=data_dir,
        advertise=ns.advertise,
        cluster=cluster,
        security=security,
        tls_reload=TlsReload(
            load=lambda: node_security(ns, auth=ns.auth),
            paths=tuple(paths),
            interval_s=ns.tls_reload_interval,
        )
        if paths
        else None,
        auth=ns.auth,
        auth_recheck_s=ns.auth_recheck,
        secrets_key_file=Path(ns.secrets_key_file) if ns.secrets_key_file else None,
        metrics_listen=ns.metrics_listen,
        http_listen=ns.http_listen,
        console_actions=ns.console_actions,
        outbox_dsn=cli_outbox.outbox_dsn(ns, url),
        on_store=_first_admin_token(ns.init_admin_token) if ns.init_admin_token else None,
        freeze_heap=True,
    )


def _first_admin_token(path: str) -> Callable[[Store], None]:
    """``--init-admin-token``: a first admin token written to ``path`` when
    the store holds none."""

    def write(store: Store) -> None:
        if init_admin_token(store, path, store.clock_ms()):
            logging.getLogger("wheel").info("wrote a first admin token to %s", path)

    return write


def serve_hooks(ns: argparse.Namespace) -> Hooks:
    """The test hooks a node's process takes from its hidden flags (none in
    production): a clock reading ``--clock-skew-file`` and the outbox
    relay's ``--outbox-record-delay``."""
    from wheel.app import Hooks
    from wheel.node import Clock

    return Hooks(
        clock=Clock(skew_file=ns.clock_skew_file) if ns.clock_skew_file else None,
        outbox_record_delay_s=ns.outbox_record_delay,
    )


def cprofile_path(ns: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """Where ``--cprofile`` (or ``$WHEEL_CPROFILE``, or its old name
    ``$WHEEL_PROFILE``) writes the node's profile; None: no profile."""
    return ns.cprofile or environ.get(CPROFILE_ENV) or environ.get(OLD_CPROFILE_ENV) or None


def cmd_serve(ns: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    """Run a node until SIGTERM or SIGINT: drain, leave the cluster, exit."""
    environ = os.environ if environ is None else environ
    config = app_config(ns)
    hooks = serve_hooks(ns)
    if hooks.clock is not None:
        # A step signalled before the handler is installed must not end the
        # process (SIGUSR1's default action).
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    if config.metrics_listen:
        quiet_created_series()

    def say(
        message: str, stream: IO[str] | None = None, level: int = logging.INFO, **fields: Any
    ) -> None:
        """A line for people and scripts, JSON under ``--log-format json``."""
        line = announcement(message, ns.log_format, level=level, **fields)
        print(line, file=stream or sys.stdout, flush=True)

    def announce(message: str, /, **fields: Any) -> None:
        say(message, **fields)

    async def main() -> None:
        from wheel.app import running

        async with running(config, hooks, announce=announce) as app:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            if hooks.clock is not None:
                # Step the clock to the skew file's number.
                loop.add_signal_handler(signal.SIGUSR1, app.node.clock.reload_skew)
            if app.reloader is not None:
                loop.add_signal_handler(signal.SIGHUP, app.reloader.on_signal)
            address = f"{ns.listen.rsplit(':', 1)[0]}:{app.port}"
            # Scripts and tests wait for this line: the node serves and its
            # signal handlers are in place.
            say(f"wheel serving on {address}", address=address, port=app.port)
            stopping = asyncio.create_task(stop.wait())
            died = asyncio.create_task(app.node.stopped.wait())
            await asyncio.wait({stopping, died}, return_when=asyncio.FIRST_COMPLETED)
            crashed = died.done() and not stop.is_set()
            stopping.cancel()
            died.cancel()
        if crashed:
            say("wheel: the dispatch loop died; see the log above", sys.stderr, logging.CRITICAL)
            raise SystemExit(1)

    tune_runtime()
    profile = cprofile_path(ns, environ)
    if profile:
        # Operators' and benchmarks' view of where a node's time goes.
        import cProfile

        with cProfile.Profile() as prof:
            asyncio.run(main())
        prof.dump_stats(profile)
        return 0
    asyncio.run(main())
    return 0
