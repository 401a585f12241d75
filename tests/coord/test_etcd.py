"""EtcdCoordinator against real etcd processes: assignment, handover, expiry,
and an etcd outage. ttl is 2 s so the lease-expiry cases stay short."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import etcd3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testkit.services import EtcdServer, free_port, running_etcd
from tests.pki import Pair, Pki
from wheel.coord import (
    MAX_EPOCH,
    SHARD_COUNT,
    Coordinator,
    EtcdCoordinator,
    OwnershipChange,
    assign_shards,
)
from wheel.errors import CoordinationError
from wheel.tls import ChannelSecurity, LiveChannelSecurity

TTL = 2
MARGIN = 0.5
ALL = frozenset(range(SHARD_COUNT))


# -- rendezvous assignment (pure) ----------------------------------------------

node_ids = st.sets(st.text("abcdefgh", min_size=1, max_size=6), min_size=1, max_size=8)


@settings(deadline=None, max_examples=60)
@given(node_ids, st.text("xyz", min_size=1, max_size=4))
def test_a_joining_member_only_takes_shards_and_a_leaving_one_only_gives_its_own(
    members: set[str], newcomer: str
) -> None:
    before = assign_shards(members)
    after = assign_shards(members | {newcomer})
    assert set(before) == set(after) == ALL
    moved = {s for s in ALL if before[s] != after[s]}
    assert all(after[s] == newcomer for s in moved)
    # Leaving is the same move backwards: only the leaver's shards change hands.
    assert assign_shards(members) == before
    assert {s for s in ALL if after[s] == newcomer} == moved


@settings(deadline=None, max_examples=30)
@given(node_ids)
def test_assignment_does_not_depend_on_member_order(members: set[str]) -> None:
    assert assign_shards(sorted(members)) == assign_shards(sorted(members, reverse=True))


def test_assignment_spreads_shards_evenly() -> None:
    counts: dict[str, int] = {}
    for owner in assign_shards(["node-a", "node-b", "node-c"]).values():
        counts[owner] = counts.get(owner, 0) + 1
    assert sorted(counts) == ["node-a", "node-b", "node-c"]
    assert all(50 <= c <= 120 for c in counts.values()), counts


# -- helpers ---------------------------------------------------------------------


@dataclass
class Node:
    """A coordinator and the ownership its callbacks told the node about."""

    coord: EtcdCoordinator
    view: dict[int, int] = field(default_factory=dict)
    changes: list[OwnershipChange] = field(default_factory=list)

    def on_change(self, change: OwnershipChange) -> None:
        self.changes.append(change)
        for shard in change.lost:
            self.view.pop(shard, None)
        self.view.update(change.gained)

    def dispatchable(self) -> set[int]:
        return {s for s in range(SHARD_COUNT) if self.coord.may_dispatch(s)}


def make_node(endpoint: str, name: str, cluster: str) -> Node:
    coord = EtcdCoordinator(
        name,
        f"{name}.local:7000",
        [endpoint],
        cluster=cluster,
        ttl_s=TTL,
        safety_margin_s=MARGIN,
    )
    node = Node(coord)
    coord.subscribe(node.on_change)
    return node


async def wait_until(what: str, predicate: Callable[[], bool], timeout: float) -> float:
    """Poll until ``predicate`` holds; return how long it took."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


def covers_all_once(nodes: Iterable[Node]) -> bool:
    seen: list[int] = []
    for node in nodes:
        seen.extend(node.coord.owned())
    return len(seen) == SHARD_COUNT and set(seen) == ALL


def settled(nodes: list[Node]) -> bool:
    """Every shard owned once, by its rendezvous owner; every node sees every
    other; the callbacks agree with ``owned()``."""
    ids = sorted(n.coord.node_id for n in nodes)
    assignment = assign_shards(ids)
    return covers_all_once(nodes) and all(
        set(n.coord.owned()) == {s for s, o in assignment.items() if o == n.coord.node_id}
        and n.view == dict(n.coord.owned())
        and [m.node_id for m in n.coord.members()] == ids
        for n in nodes
    )


class Sampler:
    """Checks, every few ms, that no shard is dispatchable on two nodes at once."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.samples = 0
        self.overlaps: list[tuple[int, list[str]]] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            seen: dict[int, list[str]] = {}
            for node in self.nodes:
                for shard in node.dispatchable():
                    seen.setdefault(shard, []).append(node.coord.node_id)
            self.overlaps.extend((s, ns) for s, ns in seen.items() if len(ns) > 1)
            self.samples += 1
            await asyncio.sleep(0.005)

    def __enter__(self) -> Sampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        assert not self.overlaps, f"dispatchable on two nodes at once: {self.overlaps[:5]}"
        assert self.samples > 10


async def start_cluster(endpoint: str, names: list[str], cluster: str) -> list[Node]:
    nodes = [make_node(endpoint, name, cluster) for name in names]
    await asyncio.gather(*(n.coord.start() for n in nodes))
    for n in nodes:
        assert n.changes, "start returned before the first ownership change arrived"
    await wait_until("the cluster to settle", lambda: settled(nodes), 10)
    return nodes


async def stop_all(nodes: list[Node]) -> None:
    await asyncio.gather(*(n.coord.stop() for n in nodes))


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 30))


def epochs_of(nodes: Iterable[Node]) -> dict[int, int]:
    out: dict[int, int] = {}
    for node in nodes:
        out.update(node.coord.owned())
    return out


def coord_threads_alive(nodes: Iterable[Node]) -> bool:
    names = {t.name for t in threading.enumerate()}
    return all(
        f"wheel-coord-{kind}-{n.coord.node_id}" in names
        for n in nodes
        for kind in ("control", "keepalive", "watch")
    )


# -- against etcd ------------------------------------------------------------------


@pytest.mark.etcd
def test_three_nodes_own_every_shard_exactly_once_with_positive_epochs(etcd_server: Any) -> None:
    async def body() -> None:
        nodes = await start_cluster(etcd_server.endpoint, ["a", "b", "c"], "three")
        try:
            for n in nodes:
                assert isinstance(n.coord, Coordinator)
                assert 50 <= len(n.coord.owned()) <= 120
                assert all(e > 0 for e in n.coord.owned().values())
                assert n.dispatchable() == set(n.coord.owned())
                assert [m.node_id for m in n.coord.members()] == ["a", "b", "c"]
                assert n.coord.members()[0].address == "a.local:7000"
        finally:
            await stop_all(nodes)
        for n in nodes:
            assert not n.coord.owned() and not n.dispatchable() and not n.view

    run(body)


@pytest.mark.etcd
def test_a_graceful_stop_hands_shards_over_at_once_with_higher_epochs(etcd_server: Any) -> None:
    async def body() -> None:
        nodes = await start_cluster(etcd_server.endpoint, ["a", "b", "c"], "graceful")
        a, b, c = nodes
        try:
            with Sampler(nodes) as sampler:
                before = dict(c.coord.owned())
                await c.coord.stop()
                took = await wait_until("a and b to take c's shards", lambda: settled([a, b]), 5)
                await wait_until("more samples", lambda: sampler.samples > 10, 5)
            # Released, not expired: much faster than the lease ttl.
            assert took < TTL - MARGIN
            after = epochs_of([a, b])
            assert all(after[s] > e for s, e in before.items())
            assert not c.view and c.changes[-1].lost == frozenset(before)

            # The same node comes back: its shards return to it, fenced anew.
            with Sampler(nodes) as sampler:
                await c.coord.start()
                await wait_until("c to take its shards back", lambda: settled(nodes), 5)
                # A prepared join is quick: sample past it for a while too.
                await wait_until("more samples", lambda: sampler.samples > 10, 5)
            back = epochs_of([c])
            assert set(back) == set(before)
            assert all(back[s] > after[s] for s in back)
        finally:
            await stop_all(nodes)

    run(body)


@pytest.mark.etcd
def test_a_partitioned_node_stops_dispatching_before_anyone_takes_its_shards(
    etcd_server: Any,
) -> None:
    async def body() -> None:
        nodes = await start_cluster(etcd_server.endpoint, ["a", "b", "c"], "partition")
        a, b, c = nodes
        try:
            with Sampler(nodes):
                before = dict(c.coord.owned())
                frozen_at = time.monotonic()
                c.coord._freeze()  # no keepalives, no release: as if cut off
                lapse = await wait_until("c to stop dispatching", lambda: not c.dispatchable(), 5)
                assert lapse <= TTL - MARGIN + 0.1
                # Nobody may take c's shards before its lease really expires.
                assert not set(before) & (set(a.coord.owned()) | set(b.coord.owned()))
                await wait_until("a and b to take c's shards", lambda: covers_all_once([a, b]), 6)
                assert time.monotonic() - frozen_at >= TTL - MARGIN
                after = epochs_of([a, b])
                assert all(after[s] > e for s, e in before.items())

                # Back from the partition: c learns its lease lapsed, says so and rejoins.
                c.coord._freeze(False)
                await wait_until("the cluster to settle again", lambda: settled(nodes), 8)
            lost_everything = [ch for ch in c.changes if ch.lost == frozenset(before)]
            assert lost_everything, "c never published the loss of its shards"
            regained = epochs_of([c])
            assert all(regained[s] > after.get(s, before.get(s, 0)) for s in regained)
        finally:
            await stop_all(nodes)

    run(body)


# A coordinator in its own process: prints its local dispatch deadline (on the
# machine-wide monotonic clock) every time it moves, until it is killed.
CHILD = """
import asyncio, json, logging, sys
from wheel.coord import EtcdCoordinator

logging.basicConfig(level=logging.INFO, format="%(relativeCreated)d %(threadName)s %(message)s")

async def main():
    coord = EtcdCoordinator("k", "k:1", [sys.argv[1]], cluster=sys.argv[2],
                            ttl_s=int(sys.argv[3]), safety_margin_s=float(sys.argv[4]))
    await coord.start()
    last = None
    while True:
        state = (dict(coord.owned()), coord._valid_until)
        if state != last:
            print(json.dumps({"owned": state[0], "deadline": state[1]}), flush=True)
            last = state
        await asyncio.sleep(0.002)

asyncio.run(main())
"""


@pytest.mark.etcd
@pytest.mark.slow
def test_a_killed_node_s_shards_move_only_after_its_own_deadline(etcd_server: Any) -> None:
    async def body() -> None:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            etcd_server.endpoint,
            "killed",
            str(TTL),
            str(MARGIN),
            stdout=asyncio.subprocess.PIPE,
        )
        deadline = 0.0
        owned_by_k: dict[int, int] = {}

        async def read_child() -> None:
            nonlocal deadline, owned_by_k
            assert child.stdout is not None
            async for line in child.stdout:
                state = json.loads(line)
                owned_by_k = {int(s): e for s, e in state["owned"].items()}
                deadline = state["deadline"]

        reader = asyncio.get_running_loop().create_task(read_child())
        nodes: list[Node] = []
        try:
            nodes = [make_node(etcd_server.endpoint, name, "killed") for name in ("a", "b")]
            await asyncio.gather(*(n.coord.start() for n in nodes))
            expected = assign_shards(["a", "b", "k"])
            mine = {s for s, o in expected.items() if o == "k"}
            await wait_until(
                "a, b and the child to settle",
                lambda: (
                    set(owned_by_k) == mine
                    and set(epochs_of(nodes)) == ALL - mine
                    and all(len(n.coord.members()) == 3 for n in nodes)
                ),
                10,
            )
            before = dict(owned_by_k)
            child.kill()  # SIGKILL: no release, no revoke
            await child.wait()
            killed_at = time.monotonic()
            await asyncio.sleep(0.05)  # let the reader take the last line
            dead_deadline = deadline
            assert dead_deadline <= killed_at + TTL - MARGIN

            first_seen = 0.0
            while not covers_all_once(nodes):
                if not first_seen and mine & set(epochs_of(nodes)):
                    first_seen = time.monotonic()
                assert time.monotonic() < killed_at + TTL + 3, "shards never moved"
                await asyncio.sleep(0.005)
            first_seen = first_seen or time.monotonic()
            # The dead node would have stopped dispatching before anyone took over.
            assert first_seen >= dead_deadline
            after = epochs_of(nodes)
            assert all(after[s] > e for s, e in before.items())
        finally:
            reader.cancel()
            if child.returncode is None:
                child.kill()
                await child.wait()
            await stop_all(nodes)

    run(body)


@pytest.mark.etcd
def test_an_etcd_outage_stops_dispatch_by_the_local_clock_and_nodes_recover(
    etcd_server: Any,
) -> None:
    async def body() -> None:
        nodes = await start_cluster(etcd_server.endpoint, ["a", "b", "c"], "outage")
        try:
            before = epochs_of(nodes)
            await asyncio.to_thread(etcd_server.stop)
            stopped_at = time.monotonic()
            await wait_until(
                "every node to stop dispatching",
                lambda: not any(n.dispatchable() for n in nodes),
                TTL - MARGIN + 0.2,
            )
            # Stay down past the ttl; nobody crashes, everybody publishes the loss.
            await wait_until("the loss to be published", lambda: not any(n.view for n in nodes), 2)
            await asyncio.sleep(max(0.0, stopped_at + TTL + 0.3 - time.monotonic()))
            assert coord_threads_alive(nodes)
            assert not any(n.coord.owned() for n in nodes)

            await asyncio.to_thread(etcd_server.start)
            await wait_until("the cluster to settle after etcd returns", lambda: settled(nodes), 10)
            after = epochs_of(nodes)
            assert all(after[s] > before[s] for s in range(SHARD_COUNT))
            assert coord_threads_alive(nodes)
        finally:
            await stop_all(nodes)

    run(body)


@pytest.mark.etcd
def test_epochs_continue_from_the_cluster_counter_and_stop_at_32_bits(etcd_server: Any) -> None:
    host, port = etcd_server.endpoint.rsplit(":", 1)
    client = etcd3.client(host=host, port=int(port), timeout=5)
    for _ in range(50):  # the fixture returns on TCP accept; gRPC may lag
        try:
            client.put("/limits/epochs/5", str(MAX_EPOCH))
            break
        except etcd3.Etcd3Exception:
            time.sleep(0.1)
    client.put("/limits/epochs/6", "41")
    client.close()

    async def body() -> None:
        node = make_node(etcd_server.endpoint, "solo", "limits")
        await node.coord.start()
        try:
            await wait_until("all but shard 5", lambda: len(node.coord.owned()) == 255, 5)
            assert 5 not in node.coord.owned() and not node.coord.may_dispatch(5)
            assert node.coord.owned()[6] == 42
            assert node.coord.owned()[7] == 1
        finally:
            await node.coord.stop()

    run(body)


@pytest.mark.etcd
def test_a_reloaded_client_certificate_is_used_once_etcd_refuses_the_old_one(
    tmp_path: Path, pki: Pki
) -> None:
    """etcd trusts the old and the new CA; the node's client certificate is
    replaced by one of the new CA (a reload); then etcd restarts trusting
    only the new one. The node's connections after that are made with the
    new certificate, so it keeps (or takes back) its shards."""
    old = ChannelSecurity.from_files(ca=pki.ca, cert=pki.client.cert, key=pki.client.key)
    new = ChannelSecurity.from_files(
        ca=pki.ca, cert=pki.other_client.cert, key=pki.other_client.key
    )
    trust = tmp_path / "trusted.pem"
    trust.write_bytes(pki.ca.read_bytes() + pki.other_ca.read_bytes())
    with running_etcd(tls=(pki.node.cert, pki.node.key, trust)) as server:
        _reload_client_certificate(server, old, new, pki)


def _reload_client_certificate(
    server: EtcdServer, old: ChannelSecurity, new: ChannelSecurity, pki: Pki
) -> None:
    live = LiveChannelSecurity(old)
    coord = EtcdCoordinator(
        "a", "a.local:7000", [server.endpoint], cluster="reload", ttl_s=TTL,
        safety_margin_s=MARGIN, security=live,
    )  # fmt: skip
    node = Node(coord)
    coord.subscribe(node.on_change)

    async def body() -> None:
        await coord.start()
        try:
            await wait_until("the node to own every shard", lambda: settled([node]), 10)
            assert live.replace(new)
            await asyncio.to_thread(server.stop)
            server.tls = (pki.node.cert, pki.node.key, pki.other_ca)
            await asyncio.to_thread(server.start)
            # The old certificate is refused now: the check below means something.
            assert not await asyncio.to_thread(_answers, server.endpoint, pki.client, pki.ca)
            assert await asyncio.to_thread(_answers, server.endpoint, pki.other_client, pki.ca)
            # It may have kept its keys through the restart and still wait for
            # a keepalive to go through before it may dispatch again.
            await wait_until(
                "the node to own and dispatch every shard again",
                lambda: settled([node]) and node.dispatchable() == ALL,
                10,
            )
        finally:
            await coord.stop()

    run(body)


def _answers(endpoint: str, client: Pair, ca: Path) -> bool:
    """Whether etcd answers a client showing ``client``'s certificate."""
    host, port = endpoint.rsplit(":", 1)
    etcd = etcd3.client(
        host=host, port=int(port), ca_cert=str(ca), cert_cert=str(client.cert),
        cert_key=str(client.key), timeout=2,
    )  # fmt: skip
    try:
        for _ in range(20):  # the server was just started: gRPC may lag its accept
            try:
                etcd.status()
                return True
            except etcd3.exceptions.ConnectionFailedError:
                time.sleep(0.1)
            except Exception:  # a refused handshake
                return False
        return False
    finally:
        etcd.close()


@pytest.mark.etcd
def test_start_fails_with_a_coordination_error_when_etcd_is_unreachable() -> None:
    async def body() -> None:
        coord = EtcdCoordinator(
            "lonely", "x:1", [f"127.0.0.1:{free_port()}"], ttl_s=TTL, start_timeout_s=0.5
        )
        with pytest.raises(CoordinationError, match="could not join"):
            await coord.start()
        assert not coord.owned() and not coord.may_dispatch(0)

    run(body)


def test_bad_configuration_is_a_coordination_error() -> None:
    with pytest.raises(CoordinationError):
        EtcdCoordinator("n", "x:1", [])
    with pytest.raises(CoordinationError):
        EtcdCoordinator("n", "x:1", ["nohost"])
    with pytest.raises(CoordinationError):
        EtcdCoordinator("a/b", "x:1", ["127.0.0.1:2379"])
    with pytest.raises(CoordinationError):
        EtcdCoordinator("n", "x:1", ["127.0.0.1:2379"], ttl_s=2, safety_margin_s=2.0)
