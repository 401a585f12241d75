"""A real cluster for the cluster tests and the chaos benchmark: one etcd,
one fresh PostgreSQL schema, N ``wheelctl serve --cluster`` processes and
worker processes that hold a stream to every node, plus the readers the
tests judge by.

Timing choices (all tests share them):

- ``TTL_S = 3``: a node's etcd lease. 2 would be faster still, but the node's
  local deadline is ``last keepalive sent + ttl - 1 s`` (``EtcdCoordinator``'s
  safety margin) with keepalives every ttl/3, which leaves 0.33 s of slack at
  ttl 2: on a loaded two-core machine a keepalive late by that much makes a
  healthy node drop every shard and rejoin. At 3 the slack is 1 s.
- ``LEASE_MS = 3000`` and ``GRACE_MS = 2000``: a run's lease (instead of
  60 s and 5 s), so the runs a dead node handed out lapse and are dispatched
  again within seconds.

Evidence comes from the record of truth (the executions table: fence,
attempt, state, dispatched_at_ms, finished_at_ms; missed_fires; shard_epochs)
and from each node's own status, never from what a test expected to happen.
The store numbers a fire's attempts from 0; ``Truth.executions`` gives them
as the API and the handlers do, from 1, so the two compare as they are.
A fence is ``(epoch << 32) | counter`` and every epoch of a shard belongs to
one acquisition by one node, so a fence says which owner issued the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from testkit.procs import HERE as E2E_DIR
from testkit.procs import ServerProc, handlers_path, wait_for
from testkit.services import EtcdServer
from wheel.client import ChannelSecurity, Client, JobRequest, Status
from wheel.engine.model import SHARD_COUNT
from wheel.errors import WheelError
from wheel.node import SecretsKey

TTL_S = 3
# EtcdCoordinator's default; ``wheelctl serve`` does not change it.
SAFETY_MARGIN_S = 1.0
LEASE_MS = 3_000
GRACE_MS = 2_000
EPOCH_SHIFT = 32
# The handler every test job runs, and a short sleep in it, so runs are in
# flight when a node dies.
HANDLER = "scripted"
PAYLOAD = json.dumps({"sleep_s": 0.05}).encode()


def epoch_of(fence: int) -> int:
    return fence >> EPOCH_SHIFT


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def utc(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


# -- processes -------------------------------------------------------------------------


class ClusterNode(ServerProc):
    """One ``wheelctl serve --cluster`` process, restartable on the same port
    with the same node id (so rendezvous hashing gives it the same shards)."""

    def __init__(
        self,
        root: Path,
        node_id: str,
        cluster_url: str,
        dsn: str,
        *,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        security: ChannelSecurity | None = None,
    ) -> None:
        (root / node_id).mkdir(parents=True, exist_ok=True)
        super().__init__(root / node_id / "data", store=dsn, security=security)
        self.node_id = node_id
        # More environment for the process (a test hook's file, say).
        self.env = dict(env or {})
        self.args = (
            "--cluster", cluster_url,
            "--node-id", node_id,
            "--advertise", self.target,
            "--lease-ttl", str(TTL_S),
            "--lease-ms", str(LEASE_MS),
            "--grace-lease-ms", str(GRACE_MS),
            *args,
        )  # fmt: skip
        self._client: Client | None = None

    def spawn(self) -> None:
        """Start the process without waiting for it to serve."""
        args = ["serve", "--data-dir", str(self.data_dir), "--listen", self.target]
        args += ["--store", str(self.store), *self.args]
        self.starts += 1
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "wheel", *args],
                stderr=log,
                stdout=log,
                env={**os.environ, **self.env},
            )

    def start(self) -> None:
        self.spawn()
        wait_for(self.healthy, 30, f"{self.node_id} to serve")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def past_start(self) -> bool:
        """This life of the process has said where it serves (its signal
        handlers are in place by then)."""
        try:
            return b"wheel serving on" in self.log_path.read_bytes()
        except FileNotFoundError:
            return False

    def kill(self) -> None:
        """SIGKILL, and reap."""
        self.signal(signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(10)

    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.target, timeout=3.0, security=self.security)
        return self._client

    def status(self) -> Status | None:
        """This node's status with its shard rows; None when it does not answer."""
        try:
            return self.client().status(include_shards=True)
        except WheelError:  # the client's word for every failed call
            return None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class ClusterWorker:
    """A worker process (``python -m e2e_handlers``) with a stream to every
    node; its handlers log events to ``out + '.events'``."""

    def __init__(
        self,
        targets: Sequence[str],
        out: Path,
        worker_id: str,
        *,
        capacity: int = 32,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.log_path = out.parent / f"{worker_id}.log"
        self.env = dict(
            os.environ,
            WHEEL_E2E_OUT=str(out),
            WHEEL_E2E_WORKER=worker_id,
            PYTHONPATH=handlers_path(E2E_DIR),
        )
        self.env.update(env or {})
        self.cmd = [sys.executable, "-m", "e2e_handlers", "--worker-id", worker_id]
        self.cmd += ["--capacity", str(capacity)]
        for target in targets:
            self.cmd += ["--target", target]
        self.starts = 0
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.starts += 1
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(self.cmd, env=self.env, stdout=log, stderr=log)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def restart(self) -> None:
        """Start it again, same id (a dead one: killed, or its handler exited)."""
        assert not self.alive
        self.proc = self._spawn()

    def connections(self) -> int:
        """Streams that said Welcome so far (from the worker's log)."""
        try:
            return self.log_path.read_text().count("connected to ")
        except FileNotFoundError:
            return 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused one hears the SIGTERM
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Link:
    """A TCP relay between one node and a service (PostgreSQL, etcd) that a
    test can hold or cut, as a network between them would.

    - ``hold``: bytes either way wait in the relay, as they would in the
      sockets of a node paused with writes on their way (a real pause catches
      some only by luck; this makes sure); ``release`` sends them on.
    - ``cut``: a partition. Bytes wait as in ``hold`` and a new connection is
      accepted but reaches nothing (its handshake and queries hang, as SYNs
      to a dropped route would retry). ``heal`` ends it: ``reset=False`` is a
      short partition (TCP retransmits and the bytes arrive), ``reset=True``
      a long one (the connections timed out: each is closed both ways).

    An upstream that refuses (the service restarting) closes the connection
    that wanted it; the relay goes on accepting."""

    def __init__(self, upstream: tuple[str, int], name: str = "link") -> None:
        self.upstream = upstream
        self.name = name
        self._open = threading.Event()
        self._open.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._socks: set[socket.socket] = set()
        threading.Thread(target=self._accept, name=name, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def held(self) -> bool:
        return not self._open.is_set()

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def cut(self) -> None:
        self.hold()

    def heal(self, *, reset: bool = False) -> None:
        if reset:
            self.reset()
        self.release()

    def reset(self) -> None:
        """Close every connection through the relay, both ways."""
        with self._lock:
            socks, self._socks = self._socks, set()
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def close(self) -> None:
        self._closed.set()
        self._open.set()
        self._listener.close()
        self.reset()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(down,), daemon=True).start()

    def _connect(self, down: socket.socket) -> None:
        with self._lock:
            self._socks.add(down)
        self._open.wait()  # a cut: the new connection reaches nothing yet
        try:
            up = socket.create_connection(self.upstream, timeout=5)
            up.settimeout(None)
        except OSError:
            self._forget(down)
            return
        with self._lock:
            if down not in self._socks:  # reset meanwhile
                up.close()
                return
            self._socks.add(up)
        ends = [0]

        def ended() -> None:
            with self._lock:
                ends[0] += 1
                both = ends[0] == 2
            if both:
                self._forget(down, up)

        for a, b in ((down, up), (up, down)):
            threading.Thread(target=self._pipe, args=(a, b, ended), daemon=True).start()

    def _forget(self, *socks: socket.socket) -> None:
        with self._lock:
            for sock in socks:
                self._socks.discard(sock)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()

    def _pipe(self, src: socket.socket, dst: socket.socket, ended: Callable[[], None]) -> None:
        try:
            while True:
                chunk = src.recv(1 << 16)
                if not chunk:
                    break
                self._open.wait()
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            ended()


# The first name it had: the relay in front of PostgreSQL.
StoreLink = Link


def through(dsn: str, link: Link) -> str:
    """``dsn`` with its host and port replaced by the link's."""
    parts = urlsplit(dsn)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{link.port}"
    netloc[-1] = host
    return urlunsplit(parts._replace(netloc="@".join(netloc)))


def upstream_of(dsn: str) -> tuple[str, int]:
    parts = urlsplit(dsn)
    return parts.hostname or "127.0.0.1", parts.port or 5432


# -- the record of truth ----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Execution:
    run_id: int
    job_id: int
    shard: int
    scheduled_for: int
    attempt: int
    state: str
    fence: int
    dispatched_at_ms: int
    finished_at_ms: int | None

    @property
    def epoch(self) -> int:
        return epoch_of(self.fence)


class Truth:
    """Reads of the cluster's PostgreSQL schema, straight from its tables."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            return conn.execute(sql, args).fetchall()

    def executions(self, shards: Iterable[int] | None = None) -> list[Execution]:
        sql = (
            "SELECT e.run_id, e.job_id, j.shard, e.scheduled_for, e.attempt + 1, e.state,"
            " e.fence, e.dispatched_at_ms, e.finished_at_ms"
            " FROM executions AS e JOIN jobs AS j ON j.job_id = e.job_id"
        )
        args: list[Any] = []
        if shards is not None:
            sql += " WHERE j.shard = ANY(%s::int2[])"
            args.append(sorted(shards))
        names = [f.name for f in fields(Execution)]
        return [Execution(**dict(zip(names, r, strict=True))) for r in self._rows(sql, args)]

    def missed(self) -> set[tuple[int, int]]:
        """(job id, scheduled_for) of every fire recorded as missed."""
        return {(r[0], r[1]) for r in self._rows("SELECT job_id, scheduled_for FROM missed_fires")}

    def shard_epochs(self) -> dict[int, tuple[int, str]]:
        """Shard -> (epoch, owner) as the store was last fenced."""
        rows = self._rows("SELECT shard, epoch, owner FROM shard_epochs")
        return {r[0]: (r[1], r[2]) for r in rows}

    def missed_and_run(self) -> list[tuple[int, int]]:
        """(job, fire) of every fire both recorded missed and succeeded: a
        history that contradicts itself."""
        rows = self._rows(
            "SELECT DISTINCT m.job_id, m.scheduled_for FROM missed_fires AS m"
            " JOIN executions AS e ON e.job_id = m.job_id"
            " AND e.scheduled_for = m.scheduled_for WHERE e.state = 'succeeded'"
        )
        return [(r[0], r[1]) for r in rows]

    def double_successes(self) -> list[tuple[int, int, int]]:
        """(job, fire, successes) of every fire with more than one accepted success."""
        rows = self._rows(
            "SELECT job_id, scheduled_for, count(*) FROM executions"
            " WHERE state = 'succeeded' GROUP BY job_id, scheduled_for HAVING count(*) > 1"
        )
        return [(r[0], r[1], r[2]) for r in rows]


# -- ownership as the nodes report it -------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Ownership:
    """What the answering nodes say: each one's view of the owners, and the
    shards each one holds loaded (with the epoch its fences carry)."""

    views: dict[str, dict[int, str]]
    held: dict[str, dict[int, int]]
    members: dict[str, set[str]]

    def holder_epochs(self) -> dict[int, tuple[str, int]]:
        """Shard -> (node, epoch) over every answering node's loaded shards."""
        out: dict[int, tuple[str, int]] = {}
        for node, shards in self.held.items():
            for shard, epoch in shards.items():
                out[shard] = (node, epoch)
        return out

    def settled_on(self, live: set[str]) -> bool:
        """Every live node answered, they all name the same members and the same
        owner for all 256 shards, every owner is live, and each node holds
        (loaded, with an epoch) exactly the shards the others say it owns."""
        if set(self.views) != live or any(m != live for m in self.members.values()):
            return False
        first = next(iter(self.views.values()))
        if len(first) != SHARD_COUNT or not set(first.values()) <= live:
            return False
        if any(view != first for view in self.views.values()):
            return False
        return all(
            set(self.held[node]) == {s for s, o in first.items() if o == node} for node in live
        )

    def whole_on(self, live: set[str]) -> bool:
        """The live nodes answered and hold all 256 shards between them, each
        by exactly one (each node's own word for what it holds; their views
        of one another catch up within a reconcile, ttl/3)."""
        return set(self.held) == live and self.disjoint_and_whole()

    def disjoint_and_whole(self) -> bool:
        """Each shard held by exactly one answering node, all 256 held."""
        counts: dict[int, int] = {}
        for shards in self.held.values():
            for shard in shards:
                counts[shard] = counts.get(shard, 0) + 1
        return len(counts) == SHARD_COUNT and set(counts.values()) == {1}


def ownership_of(nodes: Iterable[ClusterNode]) -> Ownership:
    views: dict[str, dict[int, str]] = {}
    held: dict[str, dict[int, int]] = {}
    members: dict[str, set[str]] = {}
    for node in nodes:
        status = node.status()
        if status is None:
            continue
        views[node.node_id] = {s.shard: s.owner for s in status.shards}
        held[node.node_id] = {s.shard: s.epoch for s in status.shards if s.epoch}
        members[node.node_id] = {n.node_id for n in status.nodes}
    return Ownership(views=views, held=held, members=members)


# -- the cluster ---------------------------------------------------------------------------


def held_jobs(nodes: Iterable[ClusterNode]) -> int:
    """The jobs the nodes hold between them, as each says (-1 while one
    does not answer)."""
    total = 0
    for node in nodes:
        status = node.status()
        if status is None:
            return -1
        total += status.jobs
    return total


class Cluster:
    """etcd + PostgreSQL + ``size`` nodes + ``workers`` worker processes."""

    def __init__(
        self,
        root: Path,
        etcd: EtcdServer,
        dsn: str,
        *,
        size: int = 3,
        workers: int = 2,
        name: str = "wheel-test",
        etcd_links: bool = False,
        node_flags: Callable[[str], Sequence[str]] | None = None,
        worker_capacity: int = 32,
        node_args: Sequence[str] = (),
        security: ChannelSecurity | None = None,
        worker_env: Mapping[str, str] | None = None,
    ) -> None:
        """``node_args``: more flags for every node (TLS, say); ``node_flags``:
        more for each node by its id (a test hook's file, say); ``security``:
        how the test reaches the nodes; ``worker_env``: the workers' (WHEEL_TLS_*)."""
        self.root = root
        self.etcd = etcd
        self.dsn = dsn
        self.url = f"etcd://{etcd.endpoint}/{name}"
        ids = [f"node-{chr(97 + i)}" for i in range(size)]
        # Each node reaches PostgreSQL through its own link, which a test may
        # hold, and with ``etcd_links`` etcd through another.
        self.links = {node_id: Link(upstream_of(dsn), f"pg-{node_id}") for node_id in ids}
        self.etcd_links: dict[str, Link] = {}
        if etcd_links:
            up = ("127.0.0.1", etcd.client_port)
            self.etcd_links = {node_id: Link(up, f"etcd-{node_id}") for node_id in ids}
        # One secrets key for every node, as a real cluster needs: a secret
        # set through one node signs on all of them.
        self.secrets_key_file = root / "secrets.key"
        root.mkdir(parents=True, exist_ok=True)
        SecretsKey.load_or_create(self.secrets_key_file)
        key_args = ("--secrets-key-file", str(self.secrets_key_file))
        self.nodes = [
            ClusterNode(
                root,
                node_id,
                self._cluster_url(node_id, name),
                through(dsn, self.links[node_id]),
                args=(
                    *key_args,
                    *node_args,
                    *(node_flags(node_id) if node_flags is not None else ()),
                ),
                security=security,
            )
            for node_id in ids
        ]
        self.out = root / "runs"
        self.worker_count = workers
        self.worker_capacity = worker_capacity
        self.worker_env = dict(worker_env or {})
        self.workers: list[ClusterWorker] = []
        self.truth = Truth(dsn)

    def _cluster_url(self, node_id: str, name: str) -> str:
        link = self.etcd_links.get(node_id)
        return self.url if link is None else f"etcd://{link.address}/{name}"

    @property
    def targets(self) -> list[str]:
        return [n.target for n in self.nodes]

    def node(self, node_id: str) -> ClusterNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    def start(self) -> None:
        for node in self.nodes:
            node.spawn()
        for node in self.nodes:
            wait_for(node.healthy, 30, f"{node.node_id} to serve")
        self.wait_settled(live=self.nodes, timeout=20)
        for i in range(self.worker_count):
            self.workers.append(
                ClusterWorker(
                    self.targets,
                    self.out,
                    f"w{i + 1}",
                    capacity=self.worker_capacity,
                    env=self.worker_env,
                )
            )
        want = len(self.nodes)
        wait_for(
            lambda: all(w.connections() >= want for w in self.workers),
            20,
            "every worker to hold a stream to every node",
        )

    def ownership(self, live: Iterable[ClusterNode] | None = None) -> Ownership:
        return ownership_of(self.nodes if live is None else live)

    def wait_settled(
        self,
        *,
        live: Iterable[ClusterNode],
        timeout: float,
        holding: Mapping[str, Iterable[int]] | None = None,
    ) -> Ownership:
        """Until the live nodes hold all 256 shards between them and agree on
        who holds which; with ``holding``, until also each node named there
        holds those shards (a node that rejoined agrees with the others on
        holding none before its shards move back to it)."""
        if holding is None:
            return self._wait(live, timeout, Ownership.settled_on, "to agree on")
        wanted = {node: set(shards) for node, shards in holding.items()}

        def settled_holding(own: Ownership, ids: set[str]) -> bool:
            return own.settled_on(ids) and all(
                set(own.held.get(node, {})) == shards for node, shards in wanted.items()
            )

        what = f"to agree, {sorted(wanted)} holding theirs, on"
        return self._wait(live, timeout, settled_holding, what)

    def wait_whole(self, *, live: Iterable[ClusterNode], timeout: float) -> Ownership:
        """Until the live nodes hold (loaded, dispatching) all 256 shards
        between them, each by one node."""
        return self._wait(live, timeout, Ownership.whole_on, "to hold")

    def _wait(
        self,
        live: Iterable[ClusterNode],
        timeout: float,
        done: Callable[[Ownership, set[str]], bool],
        what: str,
    ) -> Ownership:
        live = list(live)
        ids = {n.node_id for n in live}
        found: list[Ownership] = []

        def check() -> bool:
            own = ownership_of(live)
            found[:] = [own]
            return done(own, ids)

        wait_for(check, timeout, f"{sorted(ids)} {what} all {SHARD_COUNT} shards", 0.05)
        return found[0]

    def all_links(self) -> list[Link]:
        return [*self.links.values(), *self.etcd_links.values()]

    def stop(self) -> None:
        for link in self.all_links():
            link.release()
        for w in self.workers:
            w.stop()
        for node in self.nodes:
            if node.alive:
                node.signal(signal.SIGCONT)
            node.stop()
            node.close()
        for link in self.all_links():
            link.close()


# -- load ----------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class Submitted:
    """An acknowledged job and the fires its schedule asks for."""

    job_id: int
    first_ms: int
    period_ms: int  # 0: a one-shot

    def fires_until(self, end_ms: int) -> list[int]:
        if self.period_ms == 0:
            return [self.first_ms] if self.first_ms <= end_ms else []
        return list(range(self.first_ms, end_ms + 1, self.period_ms))


@dataclass(slots=True)
class Load:
    """A steady stream of work: ``intervals`` fixed-rate jobs submitted at
    ``start``, then ``rate`` one-shots a second, each due ``lead_s`` after it
    is sent, through whichever node ``targets()`` names first that answers.
    Only acknowledged jobs are recorded (and owed their fires)."""

    targets: Callable[[], list[str]]
    rate: float = 20.0
    intervals: int = 20
    period_s: float = 1.0
    lead_s: float = 1.0
    jobs: dict[int, Submitted] = field(default_factory=dict)
    refused: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _seq: int = 0

    def start(self) -> None:
        first = now_ms() + 1_500
        period_ms = round(self.period_s * 1000)
        requests = [
            JobRequest(
                name=f"every-{i}",
                handler=HANDLER,
                every=timedelta(milliseconds=period_ms),
                # Phases spread over the period: a steady trickle, not a burst.
                start=utc(first + (i * period_ms) // max(1, self.intervals)),
                payload=PAYLOAD,
                idempotency_key=f"every-{i}",
            )
            for i in range(self.intervals)
        ]
        self._submit(requests, [(r, period_ms) for r in requests])
        self._thread = threading.Thread(target=self._run, name="cluster-load", daemon=True)
        self._thread.start()

    def stop(self) -> int:
        """Stop submitting; the wall-clock ms by which every fire owed was due."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        return now_ms()

    def snapshot(self) -> list[Submitted]:
        with self._lock:
            return list(self.jobs.values())

    def _run(self) -> None:
        tick = 0.1
        per_tick = self.rate * tick
        owed = 0.0
        while not self._stop.wait(tick):
            owed += per_tick
            count = int(owed)
            owed -= count
            if not count:
                continue
            at = now_ms() + round(self.lead_s * 1000)
            requests = []
            for _ in range(count):
                self._seq += 1
                requests.append(
                    JobRequest(
                        name=f"once-{self._seq}",
                        handler=HANDLER,
                        at=utc(at),
                        payload=PAYLOAD,
                        idempotency_key=f"once-{self._seq}",
                    )
                )
            self._submit(requests, [(r, 0) for r in requests])

    def _submit(self, requests: list[JobRequest], shapes: list[tuple[JobRequest, int]]) -> None:
        for target in self.targets():
            try:
                with Client(target, timeout=3.0) as client:
                    results = client.submit_many(requests)
            except WheelError:
                continue
            with self._lock:
                for (request, period_ms), result in zip(shapes, results, strict=True):
                    if isinstance(result, WheelError):
                        self.refused += 1
                        continue
                    first = request.start if period_ms else request.at
                    assert isinstance(first, datetime)
                    first_ms = round(first.timestamp() * 1000)
                    self.jobs[result.job_id] = Submitted(
                        job_id=result.job_id, first_ms=first_ms, period_ms=period_ms
                    )
            return
        self.refused += len(requests)


# -- judging -----------------------------------------------------------------------------


def unresolved_fires(truth: Truth, jobs: Iterable[Submitted], end_ms: int) -> list[tuple[int, int]]:
    """(job, fire) of every fire due by ``end_ms`` with neither a succeeded
    execution nor a missed record."""
    succeeded = {(e.job_id, e.scheduled_for) for e in truth.executions() if e.state == "succeeded"}
    done = succeeded | truth.missed()
    return [
        (job.job_id, fire)
        for job in jobs
        for fire in job.fires_until(end_ms)
        if (job.job_id, fire) not in done
    ]


def wait_every_fire_resolved(
    truth: Truth, jobs: Sequence[Submitted], end_ms: int, timeout: float
) -> None:
    """Until every fire due by ``end_ms`` succeeded or was recorded missed;
    fails naming the fires still open."""
    left: list[tuple[int, int]] = []

    def resolved() -> bool:
        left[:] = unresolved_fires(truth, jobs, end_ms)
        return not left

    with contextlib.suppress(AssertionError):
        wait_for(resolved, timeout, "every due fire to succeed or be recorded missed", 0.5)
    if left:
        states: dict[tuple[int, int], list[tuple[int, str, int]]] = {}
        for e in truth.executions():
            if (e.job_id, e.scheduled_for) in set(left):
                states.setdefault((e.job_id, e.scheduled_for), []).append(
                    (e.attempt, e.state, e.epoch)
                )
        sample = {k: states.get(k, []) for k in left[:10]}
        raise AssertionError(
            f"{len(left)} due fires neither succeeded nor recorded missed"
            f" (first ones: (job, fire) -> [(attempt, state, epoch)]: {sample})"
        )
