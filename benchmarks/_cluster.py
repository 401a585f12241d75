"""A wheel cluster on one machine for the benchmarks: one etcd of our own,
N ``wheelctl serve --cluster`` nodes on one PostgreSQL schema, and each
node's word (its status) on the shards it holds.

Nodes are named ``node-1`` .. ``node-N`` and keep their id and port across a
restart, so rendezvous hashing gives a restarted node the shards it had.
"""

from __future__ import annotations

import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

# The test kit's ports: each from a block this process holds, below the
# kernel's ephemeral range (where a port handed out closed can be taken by an
# outgoing connection before the node binds it); the tests take theirs from
# the same blocks, so a benchmark run beside them never gets one of theirs.
if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parents[1]))
from testkit.services import free_port

SHARD_COUNT = 256
__all__ = ["free_port"]


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout_s} s waiting for {what}")


class Etcd:
    """Debian's etcd binary on free loopback ports, data in ``data_dir``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("no etcd binary: install Debian's etcd-server (as scripts/test.sh)")
        client = f"http://{self.endpoint}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir.parent / "etcd.log", "ab") as log:
            self.proc = subprocess.Popen(
                [
                    binary, "--name=bench", f"--data-dir={self.data_dir}",
                    f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=bench={peer}", "--initial-cluster-state=new",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )  # fmt: skip

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited; see {self.data_dir.parent / 'etcd.log'}")
            try:
                with socket.create_connection(("127.0.0.1", self.client_port), timeout=0.2):
                    return True
            except OSError:
                return False

        wait_until(up, 20, "etcd to listen")

    def stop(self) -> None:
        stop_all([self.proc] if self.proc else [])


class Node:
    """One ``wheelctl serve --cluster`` process."""

    def __init__(
        self,
        root: Path,
        index: int,
        *,
        wheelctl: str,
        cluster: str,
        store: str,
        args: Sequence[str],
    ) -> None:
        self.node_id = f"node-{index}"
        self.dir = root / self.node_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.cmd = [
            wheelctl, "serve", "--data-dir", str(self.dir / "data"), "--listen", self.target,
            "--store", store, "--cluster", cluster, "--node-id", self.node_id,
            *args,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._client: object | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        self.starts += 1
        with open(self.dir / f"serve-{self.starts}.log", "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)

    def serving(self) -> bool:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        if not self.alive:
            raise RuntimeError(f"{self.node_id} exited; see {self.dir}")
        try:
            with grpc.insecure_channel(self.target) as ch:
                resp = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(), timeout=1
                )
        except grpc.RpcError:
            return False
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        stop_all([self.proc] if self.proc else [])

    def held(self, client: Any = None) -> tuple[dict[int, int], dict[int, str]] | None:
        """(shard -> epoch it holds loaded, shard -> owner as it sees them), or
        None when it does not answer. ``client``: a ``wheel.client.Client``
        of this node to ask through (else one for this call)."""
        from wheel.client import Client
        from wheel.errors import WheelError

        try:
            if client is not None:
                status = client.status(include_shards=True)
            else:
                with Client(self.target, timeout=2.0) as own:
                    status = own.status(include_shards=True)
        except WheelError:  # the client's word for every failed call
            return None
        return (
            {s.shard: s.epoch for s in status.shards if s.epoch},
            {s.shard: s.owner for s in status.shards},
        )

    def switches(self) -> tuple[dict[int, int], dict[tuple[int, int], int]] | None:
        """(shard -> ms since it dispatches it, (shard, epoch) -> ms it
        stopped dispatching it under that epoch, of its latest releases),
        both on the cluster's clock, as this node records them; None when it
        does not answer."""
        from wheel.client import Client
        from wheel.errors import WheelError

        try:
            with Client(self.target, timeout=2.0) as own:
                status = own.status(include_shards=True)
        except WheelError:
            return None
        since = {
            s.shard: round(s.dispatching_since.timestamp() * 1000)
            for s in status.shards
            if s.dispatching_since is not None
        }
        released = {(r.shard, r.epoch): round(r.at.timestamp() * 1000) for r in status.released}
        return since, released


class LocalCluster:
    """etcd plus ``size`` nodes on one PostgreSQL schema (``store``)."""

    def __init__(
        self,
        root: Path,
        store: str,
        *,
        size: int,
        ttl_s: int,
        wheelctl: str,
        serve_args: str = "",
        name: str = "bench",
    ) -> None:
        self.root = root
        self.etcd = Etcd(root / "etcd-data")
        self.ttl_s = ttl_s
        self._make: Callable[[int], Node] = lambda i: Node(
            root,
            i,
            wheelctl=wheelctl,
            cluster=f"etcd://{self.etcd.endpoint}/{name}",
            store=store,
            args=["--lease-ttl", str(ttl_s), *shlex.split(serve_args)],
        )
        self.nodes: list[Node] = []
        self.size = size

    @property
    def targets(self) -> list[str]:
        return [n.target for n in self.nodes]

    def start(self) -> None:
        self.etcd.start()
        self.nodes = [self._make(i + 1) for i in range(self.size)]
        for node in self.nodes:
            node.spawn()
        for node in self.nodes:
            wait_until(node.serving, 60, f"{node.node_id} to serve")
        self.wait_settled(self.nodes, 30)

    def restart(self, node: Node) -> None:
        node.spawn()
        wait_until(node.serving, 60, f"{node.node_id} to serve again")

    def held(self, nodes: Iterable[Node]) -> dict[str, dict[int, int]]:
        """Node id -> the shards it holds loaded (and their epochs), for the
        nodes that answered."""
        out = {}
        for node in nodes:
            got = node.held()
            if got is not None:
                out[node.node_id] = got[0]
        return out

    def whole(self, live: Sequence[Node]) -> bool:
        """The live nodes hold all 256 shards between them, each by one."""
        held = self.held(live)
        if len(held) != len(live):
            return False
        shards = [s for h in held.values() for s in h]
        return len(shards) == SHARD_COUNT == len(set(shards))

    def settled(self, live: Sequence[Node]) -> bool:
        """``whole``, and every live node names the same owner for every shard."""
        answers = [n.held() for n in live]
        if any(a is None for a in answers):
            return False
        views = [a[1] for a in answers if a is not None]
        held = [a[0] for a in answers if a is not None]
        shards = [s for h in held for s in h]
        if len(shards) != SHARD_COUNT or len(set(shards)) != SHARD_COUNT:
            return False
        return all(v == views[0] and len(v) == SHARD_COUNT for v in views)

    def wait_whole(self, live: Sequence[Node], timeout_s: float) -> None:
        wait_until(lambda: self.whole(live), timeout_s, "the live nodes to hold every shard")

    def wait_settled(self, live: Sequence[Node], timeout_s: float) -> None:
        wait_until(lambda: self.settled(live), timeout_s, "the cluster to settle")

    def pids(self) -> list[int]:
        return [n.proc.pid for n in self.nodes if n.proc is not None and n.alive]

    def stop(self) -> None:
        stop_all([n.proc for n in self.nodes if n.proc is not None])
        self.etcd.stop()


def stop_all(procs: Sequence[subprocess.Popen[Any]]) -> None:
    """SIGTERM each, then wait; SIGKILL what does not exit within 15 s."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
