"""The composition root (``wheel.app.running``): a node's process starts its
parts in order and stops them in reverse, and a start that fails at any part
leaves nothing running: the parts started before it stopped, their ports
free, the data directory's lock released, no thread or task of the node
left. Real SQLite, real ports; failures come through the root's seams
(``Hooks``) or from the real thing (an address in use, a checkpoint
directory that cannot be made, an etcd nobody answers at)."""

from __future__ import annotations

import asyncio
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from testkit.services import free_port
from wheel._lock import lock_data_dir
from wheel.app import PARTS, AppConfig, ClusterConfig, Hooks, running
from wheel.errors import CoordinationError, InvalidArgument, WheelError
from wheel.node import Clock, NodeConfig


class Boom(Exception):
    """What a fault point raises."""


@dataclass
class Journal:
    """Which parts started and stopped, in order; ``fail_at``: the part
    whose start fails (a fault point)."""

    fail_at: str | None = None
    started: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)

    def before(self, part: str) -> None:
        if part == self.fail_at:
            raise Boom(part)
        self.started.append(part)

    def hooks(self, **more: object) -> Hooks:
        return Hooks(before=self.before, stopped=self.stopped.append, **more)  # type: ignore[arg-type]


@dataclass
class Ports:
    grpc: int = field(default_factory=free_port)
    metrics: int = field(default_factory=free_port)
    console: int = field(default_factory=free_port)

    def all(self) -> tuple[int, int, int]:
        return (self.grpc, self.metrics, self.console)


def config(tmp_path: Path, ports: Ports, **more: object) -> AppConfig:
    """A node with every listener but TLS: gRPC, metrics and the console,
    its data directory locked, SQLite in it and a checkpoint."""
    data_dir = tmp_path / "data"
    node = more.pop("node", None) or NodeConfig(checkpoint_dir=str(data_dir / "checkpoint"))
    return AppConfig(
        store_url=f"sqlite:///{data_dir / 'wheel.db'}",
        node=node,  # type: ignore[arg-type]
        listen=f"127.0.0.1:{ports.grpc}",
        data_dir=data_dir,
        metrics_listen=f"127.0.0.1:{ports.metrics}",
        http_listen=f"127.0.0.1:{ports.console}",
        drain_s=0.5,
        **more,  # type: ignore[arg-type]
    )


def wheel_threads() -> list[str]:
    """The node's threads still alive (its store, API, probe and purge
    pools, the coordinator's)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("wheel-") and t.is_alive()]


def assert_nothing_left(tmp_path: Path, ports: Ports) -> None:
    """Every port bindable, the data directory's lock free, no thread of
    the node's."""
    for port in ports.all():
        with socket.create_server(("127.0.0.1", port)):
            pass
    (tmp_path / "data").mkdir(exist_ok=True)
    lock_data_dir(tmp_path / "data").release()
    assert wheel_threads() == []


def serving(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


def other_tasks() -> set[asyncio.Task[object]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


# The parts a node with the console and metrics starts (no relay and no
# permit listener: SQLite; no TLS to reload), and the ones with something to
# stop, in stop order.
STARTED = [p for p in PARTS if p not in ("relay", "permits", "tls-reload")]
STOPPED = ["leave", "console", "metrics", "server", "node", "store", "lock"]


def test_the_parts_start_in_order_serve_and_stop_in_reverse(tmp_path: Path) -> None:
    ports, journal = Ports(), Journal()

    async def run() -> None:
        async with running(config(tmp_path, ports), journal.hooks()) as app:
            assert journal.started == STARTED
            assert journal.stopped == []
            assert app.port == ports.grpc
            assert app.metrics is not None and app.metrics.port == ports.metrics
            assert await asyncio.to_thread(serving, app.target)
            # The data directory is this process's while it runs.
            with pytest.raises(WheelError, match="in use by another node"):
                lock_data_dir(tmp_path / "data")
        assert other_tasks() == set()

    asyncio.run(run())
    assert journal.stopped == STOPPED
    assert_nothing_left(tmp_path, ports)


def test_an_error_in_the_block_stops_every_part_in_reverse(tmp_path: Path) -> None:
    ports, journal = Ports(), Journal()

    async def run() -> None:
        async with running(config(tmp_path, ports), journal.hooks()):
            raise Boom("the command failed")

    with pytest.raises(Boom, match="the command failed"):
        asyncio.run(run())
    assert journal.stopped == STOPPED
    assert_nothing_left(tmp_path, ports)


@pytest.mark.parametrize("part", STARTED)
def test_a_start_failing_at_any_part_stops_the_parts_before_it_in_reverse(
    tmp_path: Path, part: str
) -> None:
    ports, journal = Ports(), Journal(fail_at=part)

    async def run() -> None:
        async with running(config(tmp_path, ports), journal.hooks()):
            raise AssertionError("started")

    with pytest.raises(Boom, match=part):
        asyncio.run(run())
    assert journal.started == STARTED[: STARTED.index(part)]
    assert journal.stopped == [p for p in STOPPED if p in journal.started]
    assert_nothing_left(tmp_path, ports)


def test_a_grpc_address_in_use_is_refused_and_leaves_nothing_running(tmp_path: Path) -> None:
    ports, journal = Ports(), Journal()
    taken = socket.create_server(("127.0.0.1", ports.grpc), reuse_port=False)
    try:
        with pytest.raises(InvalidArgument, match="listen"):
            asyncio.run(_start_and_stop(config(tmp_path, ports), journal))
    finally:
        taken.close()
    assert journal.started == STARTED[: STARTED.index("server") + 1]
    assert journal.stopped == ["node", "store", "lock"]
    assert_nothing_left(tmp_path, ports)


def test_a_console_address_in_use_is_refused_and_leaves_nothing_running(tmp_path: Path) -> None:
    ports, journal = Ports(), Journal()
    taken = socket.create_server(("127.0.0.1", ports.console), reuse_port=False)
    try:
        with pytest.raises(InvalidArgument, match="http_listen: cannot listen on"):
            asyncio.run(_start_and_stop(config(tmp_path, ports), journal))
    finally:
        taken.close()
    assert journal.started[-1] == "console"
    assert journal.stopped == ["metrics", "server", "node", "store", "lock"]
    assert_nothing_left(tmp_path, ports)


def test_a_node_that_cannot_open_its_checkpoint_leaves_nothing_running(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    # A file where the checkpoint's directory should be.
    (tmp_path / "data" / "checkpoint").write_text("not a directory")
    for _ in range(3):
        ports, journal = Ports(), Journal()
        with pytest.raises((WheelError, OSError)):
            asyncio.run(_start_and_stop(config(tmp_path, ports), journal))
        if journal.started[-1] == "start":
            break
        # A listener's free port taken meanwhile by another process (the
        # suite runs in parallel): not the failure this test is about.
        assert journal.started[-1] in ("server", "metrics", "console")
    assert journal.started[-1] == "start"
    assert journal.stopped == ["console", "metrics", "server", "node", "store", "lock"]
    assert_nothing_left(tmp_path, ports)


def test_a_store_that_cannot_be_opened_releases_the_lock(tmp_path: Path) -> None:
    ports, journal = Ports(), Journal()
    bad = AppConfig(
        # A directory, not a database file.
        store_url=f"sqlite:///{tmp_path}",
        node=NodeConfig(checkpoint_dir=None),
        listen=f"127.0.0.1:{ports.grpc}",
        data_dir=tmp_path / "data",
    )
    with pytest.raises(Exception):  # noqa: B017 - whatever the store raises
        asyncio.run(_start_and_stop(bad, journal))
    assert journal.started == ["lock", "store"]
    # The data directory's and the SQLite file's (kept outside it).
    assert journal.stopped == ["lock", "lock"]
    assert_nothing_left(tmp_path, ports)


def test_a_cluster_member_whose_etcd_never_answers_stops_its_started_node(
    tmp_path: Path,
) -> None:
    ports, journal = Ports(), Journal()
    cluster = ClusterConfig(endpoints=(f"127.0.0.1:{free_port()}",), name="nobody", lease_ttl_s=2)
    with pytest.raises(CoordinationError, match="could not join"):
        asyncio.run(
            _start_and_stop(
                config(tmp_path, ports, cluster=cluster, advertise=f"127.0.0.1:{ports.grpc}"),
                journal,
            )
        )
    assert journal.started[-1] == "start"
    assert journal.stopped == ["console", "metrics", "server", "node", "store", "lock"]
    assert_nothing_left(tmp_path, ports)


def test_a_coordinator_that_cannot_be_built_leaves_nothing_running(tmp_path: Path) -> None:
    ports, journal = Ports(), Journal()

    def coordinator(store: object) -> object:
        raise Boom("no coordinator")

    with pytest.raises(Boom, match="no coordinator"):
        asyncio.run(_start_and_stop(config(tmp_path, ports), journal, coordinator=coordinator))
    assert journal.started == ["lock", "store", "coordinator"]
    assert journal.stopped == ["store", "lock"]
    assert_nothing_left(tmp_path, ports)


def test_the_node_runs_on_the_clock_the_root_is_given(tmp_path: Path) -> None:
    ports, clock = Ports(), Clock()

    async def run() -> None:
        async with running(config(tmp_path, ports), Hooks(clock=clock)) as app:
            assert app.node.clock is clock

    asyncio.run(run())


async def _start_and_stop(config: AppConfig, journal: Journal, **hooks: object) -> None:
    async with running(config, journal.hooks(**hooks)):
        raise AssertionError("started")
