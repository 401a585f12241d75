"""One node's process, composed in one place: ``running(config)`` starts its
parts in order and stops them in reverse, whatever fails.

The order, and why:

1. the data directory's lock (and an outside SQLite file's): a second node
   on the same files is refused before anything is opened; then the
   secrets key (``--secrets-key-file``, or made in the data directory);
2. the store, then what the command does with it before the node
   (``AppConfig.on_store``: a first admin token);
3. the coordinator (a cluster member's etcd client; nothing runs yet);
4. the node, built but not started;
5. the gRPC server, then the metrics and the console listeners, bound but
   not serving: an address in use stops the process before the node
   dispatched anything or took a shard;
6. the node started (shards restored or joined), then the gRPC server
   serving, the outbox relay and the TLS files' watch.

Stopping runs the same list backwards: the relay first, then the node leaves
its cluster (its shards go to the other members while it still serves them),
the listeners close (the gRPC server draining its calls for ``drain_s``), the
node stops and the store closes; the locks go last. A part that failed to
start leaves only the parts before it to stop.

Test seams are the ``Hooks`` the root takes (a clock, a coordinator, a fault
point before each part, a note after each stop), never the environment: the
command reads its environment once, at the edge (``wheel.cli.serve``).
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from wheel._lock import DirLock, lock_data_dir, lock_sqlite_file
from wheel.auth import DEFAULT_RECHECK_S
from wheel.errors import InvalidArgument
from wheel.tls import (
    ChannelSecurity,
    LiveChannelSecurity,
    LiveServerSecurity,
    NodeSecurity,
    api_address,
)

if TYPE_CHECKING:
    import grpc

    from wheel.console import ConsoleServer
    from wheel.coord.base import Coordinator
    from wheel.metrics import MetricsServer
    from wheel.node import Clock, Node, NodeConfig, OutboxRelay, SecretsKey
    from wheel.store.base import Store
    from wheel.tls import TlsReloader

__all__ = [
    "PARTS",
    "Announce",
    "App",
    "AppConfig",
    "ClusterConfig",
    "Hooks",
    "TlsReload",
    "console_security",
    "listen_on",
    "running",
    "sqlite_file",
]

log = logging.getLogger("wheel")

# The parts in the order they start (``Hooks.before`` is called with each
# name just before it; ``Hooks.stopped`` with each one stopped, in reverse).
# "serving" and "leave" are steps of parts already started: the gRPC server
# taking calls, and the node handing its shards over before the listeners
# close.
PARTS = (
    "lock",
    "store",
    "coordinator",
    "node",
    "server",
    "metrics",
    "console",
    "start",
    "serving",
    "leave",
    "relay",
    "permits",
    "tls-reload",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    """Membership of a cluster through etcd (``--cluster``)."""

    endpoints: tuple[str, ...]
    name: str
    lease_ttl_s: int = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsReload:
    """What puts changed TLS files in force without a restart: ``load``
    reads them again (it raises on a bad set, which is then not taken),
    ``paths`` are watched every ``interval_s`` (None: on SIGHUP only)."""

    load: Callable[[], NodeSecurity]
    paths: tuple[str, ...]
    interval_s: float | None = None


def _plaintext() -> NodeSecurity:
    return NodeSecurity(server=None, peers=ChannelSecurity(), etcd=ChannelSecurity())


@dataclass(frozen=True, slots=True, kw_only=True)
class AppConfig:
    """A node's process: its store and node configuration, where it listens
    and what else it serves. ``data_dir``: locked for the process's life
    (None: no lock, as for in-process test nodes)."""

    store_url: str
    node: NodeConfig
    listen: str = "127.0.0.1:50051"
    data_dir: Path | None = None
    # The address others reach this node at (None: the address it listens on).
    advertise: str | None = None
    cluster: ClusterConfig | None = None
    security: NodeSecurity = field(default_factory=_plaintext)
    tls_reload: TlsReload | None = None
    auth: bool = False
    auth_recheck_s: float = DEFAULT_RECHECK_S
    # The key sealing signing secrets in the store (None: ``data_dir``'s
    # ``secrets.key``, made on first start; without a data dir, a key of
    # this process alone).
    secrets_key_file: Path | None = None
    metrics_listen: str | None = None
    http_listen: str | None = None
    console_actions: bool = False
    # The database whose wheel_outbox table this node relays (None: no relay).
    outbox_dsn: str | None = None
    # Seconds the gRPC server lets its calls finish when it stops.
    drain_s: float = 2.0
    # Run on the store once open, before anything else (a first admin token).
    on_store: Callable[[Store], None] | None = None
    # After the node started: collect and freeze what it restored, which
    # lives as long as the process (a node's process, not a test's).
    freeze_heap: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Hooks:
    """The seams tests reach a node's process through.

    ``clock``: the node's clock (a skewed one, say); ``coordinator``: builds
    the cluster membership from the store in place of ``AppConfig.cluster``'s
    etcd one; ``before(part)``: called before each of ``PARTS`` starts, a
    fault point (what it raises fails the start there); ``stopped(part)``:
    called after each part stopped; ``outbox_record_delay_s``: the relay's
    pause between storing a batch's jobs and recording their rows' fate."""

    clock: Clock | None = None
    coordinator: Callable[[Store], Coordinator] | None = None
    before: Callable[[str], None] | None = None
    stopped: Callable[[str], None] | None = None
    outbox_record_delay_s: float = 0.0


class Announce(Protocol):
    """A line for people and scripts: ``message`` and its fields."""

    def __call__(self, message: str, /, **fields: Any) -> None: ...


def _log_line(message: str, /, **fields: Any) -> None:
    log.info("%s", message)


@dataclass(frozen=True, slots=True, kw_only=True)
class App:
    """A node's process, running: its parts and the ports they bound."""

    store: Store
    node: Node
    server: grpc.aio.Server
    port: int
    metrics: MetricsServer | None
    console: ConsoleServer | None
    relay: OutboxRelay | None
    reloader: TlsReloader | None

    @property
    def target(self) -> str:
        """Where a client on this host reaches the node's API."""
        return f"127.0.0.1:{self.port}"


@contextlib.asynccontextmanager
async def running(
    config: AppConfig, hooks: Hooks | None = None, *, announce: Announce = _log_line
) -> AsyncIterator[App]:
    """The node's process, started part by part (see the module's doc);
    leaving the block stops the parts started, in reverse."""
    hooks = hooks or Hooks()
    async with contextlib.AsyncExitStack() as stack:
        parts = _Parts(stack, hooks)
        yield await _start(config, hooks, parts, announce)


class _Parts:
    """The exit stack with the hooks around each part: ``before`` ahead of
    its start, ``stopped`` after its stop."""

    def __init__(self, stack: contextlib.AsyncExitStack, hooks: Hooks) -> None:
        self._stack = stack
        self._hooks = hooks

    def before(self, part: str) -> None:
        if self._hooks.before is not None:
            self._hooks.before(part)

    def on_exit(self, part: str, stop: Callable[[], object]) -> None:
        """Stop ``part`` with ``stop`` when the block ends (in reverse order);
        what it returns is awaited when it is awaitable."""

        async def stopping() -> None:
            try:
                pending = stop()
                if inspect.isawaitable(pending):
                    await pending
            finally:
                if self._hooks.stopped is not None:
                    self._hooks.stopped(part)

        self._stack.push_async_callback(stopping)


async def _start(config: AppConfig, hooks: Hooks, parts: _Parts, announce: Announce) -> App:
    from wheel.node import Node
    from wheel.rpc.server import bind
    from wheel.store.open import libpq_dsn, open_store

    parts.before("lock")
    for lock in _locks(config):
        parts.on_exit("lock", lock.release)

    secrets_key = _secrets_key(config)

    parts.before("store")
    store = open_store(config.store_url)
    parts.on_exit("store", store.close)
    if config.on_store is not None:
        config.on_store(store)
    # What a reload replaces (wheel.tls._reload): the listeners' TLS, and
    # that of the channels to the other members and to etcd.
    security = config.security
    live_server = LiveServerSecurity(security.server) if security.server else None
    live_peers = LiveChannelSecurity(security.peers)
    live_etcd = LiveChannelSecurity(security.etcd)

    parts.before("coordinator")
    coordinator = _coordinator(config, hooks, store, live_etcd)

    parts.before("node")
    node = Node(
        store,
        config.node,
        coordinator=coordinator,
        clock=hooks.clock,
        secrets_key=secrets_key,
    )
    # Stopping a node that never started only shuts its threads down.
    parts.on_exit("node", node.stop)

    parts.before("server")
    bound = await bind(
        node,
        config.listen,
        security=live_server,
        peer_security=live_peers,
        auth=config.auth,
        recheck_s=config.auth_recheck_s,
    )
    serving = False

    async def stop_server() -> None:
        if not serving:
            # gRPC lets a bound port go only once its server has started:
            # start it, saying NOT_SERVING, and stop it at once.
            await bound.health_servicer.enter_graceful_shutdown()
            await bound.server.start()
        await bound.server.stop(config.drain_s if serving else None)

    parts.on_exit("server", stop_server)
    ssl = live_server.ssl_context() if live_server else None
    scheme = "https" if ssl else "http"

    metrics = None
    if config.metrics_listen:
        from wheel.metrics import MetricsServer

        parts.before("metrics")
        metrics = MetricsServer(node.metrics.registry)
        listen = config.metrics_listen
        metrics_port = await listen_on("metrics_listen", listen, metrics.start(listen, ssl=ssl))
        parts.on_exit("metrics", metrics.stop)
        url = f"{scheme}://{listen.rsplit(':', 1)[0] or '0.0.0.0'}:{metrics_port}/metrics"
        announce(f"wheel metrics on {url}", url=url, port=metrics_port)

    console = None
    if config.http_listen:
        from wheel.console import Console, ConsoleServer

        parts.before("console")
        console = ConsoleServer(
            Console(
                config.advertise or api_address(config.listen, bound.port),
                auth=config.auth,
                actions=config.console_actions,
                security=console_security(security, live_peers),
                node_id=config.node.node_id,
                lag_objective_ms=config.node.lag_slo_ms,
            )
        )
        listen = config.http_listen
        console_port = await listen_on("http_listen", listen, console.start(listen, ssl=ssl))
        parts.on_exit("console", console.stop)
        url = f"{scheme}://{listen.rsplit(':', 1)[0] or '0.0.0.0'}:{console_port}/"
        mode = "actions on" if config.console_actions else "read-only"
        announce(f"wheel console on {url} ({mode})", url=url, port=console_port)

    parts.before("start")
    await node.start()
    if config.freeze_heap:
        # What the node restored lives as long as the process: never scan it again.
        gc.collect()
        gc.freeze()

    parts.before("serving")
    serving = True
    server, port = await bound.start()
    log.info(
        "wheel node %s serving on port %d (store %s)",
        config.node.node_id,
        port,
        config.store_url.split("?")[0],
    )
    log.log(*security.notice(config.listen))
    # The shards go to the other members while the listeners still serve.
    parts.before("leave")
    parts.on_exit("leave", node.leave)

    relay = None
    if config.outbox_dsn:
        from wheel.node import OutboxRelay

        parts.before("relay")
        relay = OutboxRelay(node, config.outbox_dsn, record_delay_s=hooks.outbox_record_delay_s)
        relay.start()
        parts.on_exit("relay", relay.stop)
        log.info("relaying the outbox at %s", _safe_dsn(config.outbox_dsn))

    if (permits_dsn := libpq_dsn(config.store_url)) is not None:
        # Permits freed on other nodes, heard at once (PostgreSQL alone).
        from wheel.node._permits import PermitListener

        parts.before("permits")
        permits = PermitListener(
            permits_dsn, node.permit_freed, name=f"wheel-{config.node.node_id}-permits"
        )
        permits.start()
        parts.on_exit("permits", permits.stop)

    reloader = None
    if config.tls_reload is not None and config.tls_reload.paths:
        reloader = _reloader(config.tls_reload, parts, live_server, live_peers, live_etcd)

    return App(
        store=store,
        node=node,
        server=server,
        port=port,
        metrics=metrics,
        console=console,
        relay=relay,
        reloader=reloader,
    )


def _locks(config: AppConfig) -> list[DirLock]:
    """One node per data directory (and per SQLite file kept outside it),
    refused before anything is opened."""
    if config.data_dir is None:
        return []
    data_dir = config.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    locks = [lock_data_dir(data_dir)]
    db = sqlite_file(config.store_url)
    if db is not None and db.parent != data_dir:
        try:
            locks.append(lock_sqlite_file(db))
        except BaseException:
            locks[0].release()
            raise
    return locks


def _secrets_key(config: AppConfig) -> SecretsKey | None:
    """The key that seals signing secrets: the file given, else the data
    directory's (made there on first start)."""
    from wheel.node import SecretsKey
    from wheel.node._secrets_key import KEY_FILE

    if config.secrets_key_file is not None:
        key = SecretsKey.load(config.secrets_key_file)
    elif config.data_dir is not None:
        key = SecretsKey.load_or_create(config.data_dir / KEY_FILE)
        if config.cluster is not None:
            log.warning(
                "no --secrets-key-file: this member seals signing secrets with its own key"
                " (%s), which the other members cannot open; give every member the same file",
                config.data_dir / KEY_FILE,
            )
    else:
        return None
    log.info("signing secrets are sealed with secrets key %s", key.key_id)
    return key


def _coordinator(
    config: AppConfig, hooks: Hooks, store: Store, security: LiveChannelSecurity
) -> Coordinator | None:
    if hooks.coordinator is not None:
        return hooks.coordinator(store)
    cluster = config.cluster
    if cluster is None:
        return None
    from wheel.coord.etcd import EtcdCoordinator

    return EtcdCoordinator(
        config.node.node_id,
        config.advertise or config.listen,
        list(cluster.endpoints),
        cluster=cluster.name,
        ttl_s=cluster.lease_ttl_s,
        security=security,
    )


def _reloader(
    reload: TlsReload,
    parts: _Parts,
    server: LiveServerSecurity | None,
    peers: LiveChannelSecurity,
    etcd: LiveChannelSecurity,
) -> TlsReloader:
    """The TLS files' reloader, watching them every ``interval_s`` (its
    ``on_signal`` is the command's SIGHUP handler)."""
    import asyncio

    from wheel.tls import TlsReloader

    parts.before("tls-reload")
    reloader = TlsReloader(reload.load, list(reload.paths), server=server, peers=peers, etcd=etcd)
    if reload.interval_s:
        watching = asyncio.create_task(reloader.watch(reload.interval_s))
        parts.on_exit("tls-reload", watching.cancel)
    return reloader


async def listen_on(field: str, listen: str, starting: Awaitable[int]) -> int:
    """The port an HTTP listener bound, or ``InvalidArgument`` naming its
    flag when its address is in use (or not this host's)."""
    try:
        return await starting
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        raise InvalidArgument(field, f"cannot listen on {listen}: {why}") from None


def sqlite_file(url: str) -> Path | None:
    """The file of an SQLite store URL (None: not SQLite, or in memory)."""
    scheme, sep, rest = url.partition(":///")
    if scheme != "sqlite" or not sep:
        return None
    path = rest.split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    return Path(path).resolve()


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


def _safe_dsn(dsn: str) -> str:
    """A DSN to log: without its password."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(dsn)
    except Exception:
        return "(a DSN)"
    return (
        f"{params.get('host', 'localhost')}:{params.get('port', 5432)}/{params.get('dbname', '')}"
    )
