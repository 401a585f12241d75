"""The worker SDK in a cluster: several scripted nodes on real loopback gRPC
servers (``tests.worker.scripted``), each playing a member. The worker follows
the membership, reports each run to its shard's owner, and moves a run without
ever aborting it; only a real rejection aborts."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.worker.scripted import (
    Conn,
    ScriptedNode,
    assign,
    assignment,
    membership,
    nodes,
    refs,
    running,
    scenario,
    until,
)
from wheel.engine.model import SHARD_COUNT
from wheel.rpc.v1 import cluster_pb2
from wheel.rpc.v1 import worker_service_pb2 as pb
from wheel.worker import Retryable, RunContext, Worker


class Slow:
    """A handler that runs until ``release`` and notes the runs cancelled."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.cancelled: set[int] = set()

    async def __call__(self, ctx: RunContext) -> None:
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.add(ctx.run_id)
            raise


def worker(*targets: str, capacity: int = 16) -> tuple[Worker, Slow]:
    """A worker seeded with ``targets`` (as ``wheelctl worker --target a,b``
    gives them), with handlers ``slow`` and ``ok``."""
    w = Worker(",".join(targets), worker_id="w-1", capacity=capacity, reconnect_initial=0.05)
    slow = Slow()
    w.register("slow", slow)
    w.register("ok", lambda ctx: None)
    return w, slow


async def beat_with(conn: Conn, run_id: int) -> pb.Heartbeat:
    """The next heartbeat on ``conn`` that names ``run_id``."""
    while True:
        hb: pb.Heartbeat = await conn.expect("heartbeat")
        if run_id in {r.run_id for r in hb.runs}:
            return hb


def named_after(conn: Conn, run_id: int, t: float) -> bool:
    """Whether a heartbeat ``conn`` received after ``t`` named ``run_id``."""
    return any(
        m.WhichOneof("kind") == "heartbeat" and run_id in {r.run_id for r in m.heartbeat.runs}
        for at, m in conn.log
        if at > t
    )


def moved(run_id: int, owner: str = "", address: str = "") -> pb.MovedRun:
    """``moved`` for ``assignment(run_id, ...)``."""
    return pb.MovedRun(
        run_id=run_id,
        fence=run_id + 1000,
        job_id=run_id * 10,
        owner_node_id=owner,
        owner_address=address,
    )


async def no_stream_within(svc: ScriptedNode, wait: float) -> bool:
    await asyncio.sleep(wait)
    return svc.conns.empty()


# -- following the membership ----------------------------------------------------------


def test_the_worker_opens_one_stream_to_every_member_welcomed_with_or_pushed_later() -> None:
    async def go() -> None:
        async with nodes("a", "b", "c") as [(a, ta), (b, tb), (c, tc)]:
            two = membership(1, {"a": ta, "b": tb}, "a")
            three = membership(2, {"a": ta, "b": tb, "c": tc}, "a")
            w, _ = worker(ta)
            async with running(w):
                conn_a, _ = await a.accept(membership=two)
                _, hello = await b.accept(membership=two)
                assert (hello.worker_id, list(hello.handlers)) == ("w-1", ["ok", "slow"])
                await until(lambda: w.connected == 2)
                # A push naming a third member: the worker links to it too.
                conn_a.send(membership=three)
                await c.accept(membership=three)
                await until(lambda: w.connected == 3)
                for svc in (a, b, c):
                    assert await no_stream_within(svc, 0.1), f"a second stream to {svc.node_id}"

    scenario(go)


@pytest.mark.parametrize("welcomed_first", ["seed", "member"])
def test_a_seed_and_a_member_that_are_the_same_node_end_as_one_stream(welcomed_first: str) -> None:
    """The same node under two spellings (the seed's and the membership's):
    whichever stream it welcomes second is closed, and not reopened."""

    async def go() -> None:
        async with nodes("a", "b") as [(a, ta), (b, tb)]:
            view = membership(1, {"a": ta, "b": tb}, "a")
            w, _ = worker(ta, f"ipv4:{tb}")
            async with running(w):
                await until(lambda: a.conns.qsize() == 1 and b.conns.qsize() == 1)
                await a.accept(membership=view)
                await until(lambda: b.conns.qsize() == 2)
                seed, member = b.conns.get_nowait(), b.conns.get_nowait()
                first, second = (seed, member) if welcomed_first == "seed" else (member, seed)
                assert await b.greet(first, membership=view) is not None
                await until(lambda: w.connected == 2)
                await b.greet(second, membership=view)
                await until(lambda: second.ended)
                assert await no_stream_within(b, 0.3)
                assert not first.ended
                assert w.connected == 2

    scenario(go)


def test_an_unversioned_view_of_a_single_node_is_not_followed() -> None:
    """Two nodes outside any cluster, each naming only itself: a worker given
    both keeps both streams, as before clusters."""

    def alone(node_id: str, address: str) -> cluster_pb2.Membership:
        return membership(0, {node_id: address}, node_id)

    async def go() -> None:
        async with nodes("a", "b") as [(a, ta), (b, tb)]:
            w, _ = worker(ta, tb)
            async with running(w):
                conn_a, _ = await a.accept(membership=alone("a", ta))
                conn_b, _ = await b.accept(membership=alone("b", tb))
                conn_a.send(membership=alone("a", ta))
                conn_b.send(membership=alone("b", tb))
                assign(conn_a, assignment(1, "ok"))
                assign(conn_b, assignment(2, "ok"))
                assert set(await conn_a.completed(1)) == {1}
                assert set(await conn_b.completed(1)) == {2}
                assert not conn_a.ended and not conn_b.ended
                assert w.connected == 2

    scenario(go)


# -- moved runs ------------------------------------------------------------------------


def test_a_heartbeat_answered_moved_re_homes_the_run_to_the_owner_named_without_aborting() -> None:
    async def go() -> None:
        async with nodes("a", "b") as [(a, ta), (b, tb)]:
            view = membership(1, {"a": ta, "b": tb}, "a")
            w, slow = worker(ta)
            async with running(w):
                conn_a, _ = await a.accept(heartbeat_ms=50, membership=view)
                # b's own beats come every 5 s: any sooner one is the move's.
                conn_b, _ = await b.accept(heartbeat_ms=5_000, membership=view)
                assign(conn_a, assignment(1, "slow"), assignment(2, "ok"))
                await conn_a.completed(1)
                hb = await beat_with(conn_a, 1)
                assert [(r.run_id, r.fence, r.job_id) for r in hb.runs] == [(1, 1001, 10)]
                assert conn_a.completions()[2].job_id == 20

                # a no longer owns the shards: run 1 (held) and run 2 (its
                # completion not confirmed) both move to b.
                t0 = time.monotonic()
                conn_a.send(results=pb.Results(moved=[moved(1, "b", tb), moved(2, "b", tb)]))
                hb_b = await beat_with(conn_b, 1)
                assert time.monotonic() - t0 < 1.0
                assert [(r.run_id, r.fence, r.job_id) for r in hb_b.runs] == [(1, 1001, 10)]
                resent = await conn_b.completed(1)
                assert (resent[2].fence, resent[2].job_id) == (1002, 20)
                assert resent[2].outcome == pb.OUTCOME_SUCCEEDED

                slow.release.set()
                done = await conn_b.completed(2)
                assert (done[1].outcome, done[1].job_id) == (pb.OUTCOME_SUCCEEDED, 10)
                assert 1 not in conn_a.completions()
                assert not named_after(conn_a, 1, t0 + 0.2)
                assert slow.cancelled == set()
                assert (w.stats.revoked, w.stats.moved) == (0, 2)

    scenario(go)


def test_moved_naming_an_owner_not_linked_yet_opens_a_stream_to_it_and_reports_there() -> None:
    async def go() -> None:
        async with nodes("a", "b") as [(a, ta), (b, tb)]:
            w, slow = worker(ta)
            async with running(w):
                # No membership at all (an older a): only the answer names b.
                conn_a, _ = await a.accept(heartbeat_ms=50)
                assign(conn_a, assignment(3, "slow"))
                await beat_with(conn_a, 3)
                conn_a.send(results=pb.Results(moved=[moved(3, "b", tb)]))
                conn_b, _ = await b.accept(heartbeat_ms=5_000)
                assert refs(await beat_with(conn_b, 3)) == {(3, 1003)}
                slow.release.set()
                assert set(await conn_b.completed(1)) == {3}
                assert slow.cancelled == set()

    scenario(go)


def test_moved_with_no_owner_named_is_retried_after_asking_for_the_membership() -> None:
    async def go() -> None:
        async with nodes("a", "b") as [(a, ta), (b, tb)]:
            old = membership(1, {"a": ta, "b": tb}, "a")
            # What the nodes answer when asked: the shards went to b meanwhile.
            a.membership = b.membership = membership(2, {"a": ta, "b": tb}, "b")
            w, slow = worker(ta)
            async with running(w):
                conn_a, _ = await a.accept(heartbeat_ms=50, membership=old)
                conn_b, _ = await b.accept(heartbeat_ms=5_000, membership=old)
                assign(conn_a, assignment(1, "slow"))
                await beat_with(conn_a, 1)
                t0 = time.monotonic()
                # a gave the shard up and does not know its next owner yet.
                conn_a.send(results=pb.Results(moved=[moved(1)]))
                assert refs(await beat_with(conn_b, 1)) == {(1, 1001)}
                assert a.membership_asked + b.membership_asked >= 1
                # The old view named a, which disowned the run: never sent back there.
                assert not named_after(conn_a, 1, t0 + 0.1)
                slow.release.set()
                assert set(await conn_b.completed(1)) == {1}
                assert slow.cancelled == set()
                assert w.stats.revoked == 0

    scenario(go)


def test_a_member_removed_from_the_membership_has_its_runs_re_homed_and_its_stream_closed() -> None:
    async def go() -> None:
        async with nodes("a", "b") as [(a, ta), (b, tb)]:
            view = membership(1, {"a": ta, "b": tb}, "a")
            w, slow = worker(ta, tb)
            async with running(w):
                conn_a, _ = await a.accept(heartbeat_ms=5_000, membership=view)
                conn_b, _ = await b.accept(heartbeat_ms=5_000, membership=view)
                assign(conn_b, assignment(7, "slow"))
                assert [r.run_id for r in (await conn_b.expect("ack")).runs] == [7]
                # b left; a owns every shard.
                conn_a.send(membership=membership(2, {"a": ta}, "a"))
                assert refs(await beat_with(conn_a, 7)) == {(7, 1007)}
                await until(lambda: conn_b.ended)
                assert await no_stream_within(b, 0.3), "the worker went back to a node that left"
                slow.release.set()
                assert set(await conn_a.completed(1)) == {7}
                assert w.connected == 1
                assert slow.cancelled == set()

    scenario(go)


def test_runs_on_a_node_whose_stream_is_down_go_where_a_newer_view_puts_their_shard() -> None:
    async def go() -> None:
        async with nodes("a", "b") as [(a, ta), (b, tb)]:
            view = membership(1, {"a": ta, "b": tb}, "a")
            w, slow = worker(ta)
            async with running(w):
                conn_a, _ = await a.accept(heartbeat_ms=5_000, membership=view)
                conn_b, _ = await b.accept(heartbeat_ms=5_000, membership=view)
                assign(conn_a, assignment(4, "slow"))
                await conn_a.expect("ack")
                conn_a.drop()  # and a never answers the worker's Hello again
                await until(lambda: w.connected == 1)
                conn_b.send(membership=membership(2, {"a": ta, "b": tb}, "b"))
                assert refs(await beat_with(conn_b, 4)) == {(4, 1004)}
                slow.release.set()
                assert set(await conn_b.completed(1)) == {4}
                assert slow.cancelled == set()

    scenario(go)


def test_handlers_that_return_while_their_node_is_down_are_told_to_another_node() -> None:
    async def go() -> None:
        async with nodes("a", "b") as [(a, ta), (b, tb)]:
            view = membership(1, {"a": ta, "b": tb}, "a")
            w, slow = worker(ta)
            w.register("flaky", flaky)
            async with running(w):
                conn_a, _ = await a.accept(heartbeat_ms=5_000, membership=view)
                conn_b, _ = await b.accept(heartbeat_ms=5_000, membership=view)
                assign(conn_a, assignment(4, "slow"), assignment(5, "slow"))
                await conn_a.expect("ack")
                conn_a.drop()  # and a never answers the worker's Hello again
                await until(lambda: w.connected == 1)
                assign(conn_b, assignment(6, "slow"))
                await conn_b.expect("ack")
                slow.release.set()
                await until(lambda: returned(conn_b) == {(4, 1004), (5, 1005)})
                # b's own run went to b as a completion, and only there.
                assert set(await conn_b.completed(1)) == {6}
                assert returned(conn_b) == {(4, 1004), (5, 1005)}
                # A retryable failure may be a timeout whose handler still runs:
                # never told, whether its node is down (7) or up (8).
                conn_a2, _ = await a.accept(heartbeat_ms=5_000, membership=view)
                assign(conn_a2, assignment(7, "flaky"))
                await until(lambda: {4, 5, 7} <= set(conn_a2.completions()))
                conn_a2.drop()
                assign(conn_b, assignment(8, "flaky"))
                await until(lambda: 8 in conn_b.completions())
                # (6 may be told now: a, down again, was its node by the view.)
                told = {run for run, _ in returned(conn_b)}
                assert {4, 5} <= told and not {7, 8} & told

    scenario(go)


def flaky(ctx: RunContext) -> None:
    raise Retryable("try again")


def returned(conn: Conn) -> set[tuple[int, int]]:
    """The runs ``conn``'s worker said returned (``Returned``) so far."""
    return {(r.run_id, r.fence) for m in conn.sent("returned") for r in m.runs}


# -- what still holds across links -----------------------------------------------------


def test_never_more_than_capacity_handlers_at_once_across_links() -> None:
    lock = threading.Lock()
    now = 0
    peak = 0

    async def work(ctx: RunContext) -> None:
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)
        await asyncio.sleep(0.03)
        with lock:
            now -= 1

    async def go() -> None:
        async with nodes("a", "b", "c") as [(a, ta), (b, tb), (c, tc)]:
            view = membership(1, {"a": ta, "b": tb, "c": tc}, lambda s: "abc"[s % 3])
            w = Worker(ta, capacity=3)
            w.register("work", work)
            async with running(w):
                conns = [(await svc.accept(membership=view))[0] for svc in (a, b, c)]
                # Each node sends a full capacity and more: the excess waits.
                for i, conn in enumerate(conns):
                    assign(conn, *[assignment(10 * i + k, "work") for k in range(1, 7)])
                done = [await conn.completed(6) for conn in conns]
        # Each run completes to the node that assigned it.
        assert [sorted(d) for d in done] == [[10 * i + k for k in range(1, 7)] for i in range(3)]
        assert peak == 3

    scenario(go)


def test_a_real_rejection_still_aborts_a_run_whether_it_moved_or_not() -> None:
    async def go() -> None:
        async with nodes("a", "b") as [(a, ta), (b, tb)]:
            view = membership(1, {"a": ta, "b": tb}, "a")
            w, slow = worker(ta)
            async with running(w):
                conn_a, _ = await a.accept(heartbeat_ms=50, membership=view)
                conn_b, _ = await b.accept(heartbeat_ms=5_000, membership=view)
                assign(conn_a, assignment(1, "slow"), assignment(2, "slow"))
                await beat_with(conn_a, 1)
                conn_a.send(results=pb.Results(moved=[moved(1, "b", tb)]))
                await beat_with(conn_b, 1)
                # Its new owner refuses its renewal: superseded after all.
                conn_b.send(results=pb.Results(rejected_renewals=[pb.RunRef(run_id=1, fence=1001)]))
                # And b revokes run 2, which still reports to a.
                conn_b.send(revokes=pb.Revokes(revokes=[pb.Revoke(run_id=2, fence=1002)]))
                await until(lambda: slow.cancelled == {1, 2})
                await asyncio.sleep(0.1)
                assert conn_a.completions() == {} and conn_b.completions() == {}
                assert w.stats.revoked == 2
                assert w.held == 0

    scenario(go)


def test_a_membership_with_too_few_shard_owners_routes_nothing() -> None:
    async def go() -> None:
        async with nodes("a", "b") as [(a, ta), (b, tb)]:
            bad = membership(1, {"a": ta, "b": tb}, "b")
            del bad.shard_owners[SHARD_COUNT - 1 :]
            w, slow = worker(ta)
            async with running(w):
                conn_a, _ = await a.accept(heartbeat_ms=50, membership=bad)
                conn_b, _ = await b.accept(heartbeat_ms=5_000, membership=bad)
                assign(conn_a, assignment(1, "slow"))
                await beat_with(conn_a, 1)
                # No owner named and no usable map: the run waits, nowhere misrouted.
                conn_a.send(results=pb.Results(moved=[moved(1)]))
                await asyncio.sleep(0.5)
                assert not any(r.run_id == 1 for hb in conn_b.sent("heartbeat") for r in hb.runs)
                assert w.held == 1
                assert slow.cancelled == set()

    scenario(go)
