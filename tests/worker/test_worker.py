"""The worker SDK against one scripted node on a real loopback gRPC server
(``tests.worker.scripted``): the lease stream's protocol, outcomes, revokes,
timeouts, reconnects, drain and capacity."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import itertools
import json
import logging
import os.path
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest

import wheel.worker._link
from testkit.services import free_port
from tests.worker.scripted import (
    ScriptedNode,
    assign,
    assignment,
    node,
    refs,
    running,
    scenario,
    until,
)
from wheel.errors import InvalidArgument
from wheel.rpc.v1 import worker_service_pb2 as pb
from wheel.rpc.v1 import worker_service_pb2_grpc as pb_grpc
from wheel.worker import Permanent, Retryable, RunContext, Worker, load_handler
from wheel.worker._api import run_context
from wheel.worker._link import ACK_DELAY_S

# -- handshake and heartbeats ----------------------------------------------------------


def test_hello_first_then_heartbeats_at_the_interval_listing_held_runs() -> None:
    async def go() -> None:
        release = asyncio.Event()
        async with node() as (svc, target):
            w = Worker(target, worker_id="w-1", capacity=7, pools=("a", "b"))

            @w.handler("beta")
            async def beta(ctx: RunContext) -> None:
                await release.wait()

            w.register("alpha", lambda ctx: None)
            async with running(w):
                conn, hello = await svc.accept(heartbeat_ms=50)
                assert hello.worker_id == "w-1"
                assert hello.capacity == 7
                assert list(hello.pools) == ["a", "b"]
                assert list(hello.handlers) == ["alpha", "beta"]
                await asyncio.sleep(0.5)
                beats = [t for t, m in conn.log if m.WhichOneof("kind") == "heartbeat"]
                # The first beat follows Welcome at once; the rest keep the interval.
                gaps = [b - a for a, b in itertools.pairwise(beats[1:])]
                assert 6 <= len(beats) <= 12, beats
                assert min(gaps) > 0.03
                assert all(not hb.runs for hb in conn.sent("heartbeat"))

                assign(conn, assignment(5, "beta", fence=77))
                await conn.expect("ack")
                hb = await conn.expect("heartbeat")
                assert refs(hb) == {(5, 77)}
                release.set()
                done = await conn.completed(1)
                assert done[5].outcome == pb.OUTCOME_SUCCEEDED
                assert refs(await conn.expect("heartbeat")) == set()

    scenario(go)


# -- outcomes --------------------------------------------------------------------------


def test_outcomes_of_sync_and_async_handlers_and_no_ack_for_runs_done_at_once() -> None:
    seen: list[RunContext] = []

    async def go() -> None:
        async with node() as (svc, target):
            w = Worker(target, capacity=16)

            @w.handler()
            def ok_sync(ctx: RunContext) -> None:
                seen.append(ctx)

            @w.handler()
            async def ok_async(ctx: RunContext) -> str:
                seen.append(ctx)
                return "ignored"

            @w.handler()
            async def later(ctx: RunContext) -> None:
                raise Retryable("try later")

            @w.handler()
            def bad_input(ctx: RunContext) -> None:
                raise Permanent("bad input")

            @w.handler()
            async def boom(ctx: RunContext) -> None:
                raise ValueError("x is 3")

            @w.handler()
            def boom_sync(ctx: RunContext) -> None:
                raise RuntimeError

            async with running(w):
                conn, _ = await svc.accept()
                names = ["ok_sync", "ok_async", "later", "bad_input", "boom", "boom_sync", "nope"]
                runs = [
                    assignment(
                        i + 1,
                        n,
                        payload=n.encode(),
                        idempotency_key=f"k{i}",
                        scheduled_for_ms=123,
                        attempt=2,
                        tenant="t",
                    )
                    for i, n in enumerate(names)
                ]
                assign(conn, *runs)
                done = await conn.completed(len(runs))
                # Each completion says its run ran: no ack was due before it.
                await asyncio.sleep(ACK_DELAY_S * 2)
                assert conn.sent("ack") == []

        # A bug's error is its type and message, then where it was raised and
        # the traceback's frames (the handler's, not the worker's).
        errors = {names[rid - 1]: c.error for rid, c in done.items()}
        for name, head in (("boom", "ValueError: x is 3"), ("boom_sync", "RuntimeError")):
            first, _, frames = errors[name].partition("\n")
            assert first.startswith(f"{head} (at {__file__}:"), first
            assert first.endswith(f", in {name})"), first
            assert frames.startswith("Traceback (most recent call last):\n"), frames
            assert f"in {name}\n" in frames and "wheel/worker/_runs.py" not in frames, frames
        outcomes = {
            names[rid - 1]: (c.outcome, c.error.partition(" (at ")[0], c.fence - rid)
            for rid, c in done.items()
        }
        assert outcomes == {
            "ok_sync": (pb.OUTCOME_SUCCEEDED, "", 1000),
            "ok_async": (pb.OUTCOME_SUCCEEDED, "", 1000),
            "later": (pb.OUTCOME_RETRYABLE, "try later", 1000),
            "bad_input": (pb.OUTCOME_FAILED, "bad input", 1000),
            "boom": (pb.OUTCOME_RETRYABLE, "ValueError: x is 3", 1000),
            "boom_sync": (pb.OUTCOME_RETRYABLE, "RuntimeError", 1000),
            # Handed back, not failed: another worker with the handler takes it.
            "nope": (pb.OUTCOME_HANDED_BACK, "no handler registered for 'nope'", 1000),
        }
        assert w.stats.received == 7
        assert w.stats.succeeded == 2
        assert w.stats.failed == 4
        assert w.stats.handed_back == 1
        ctx = next(c for c in seen if c.handler == "ok_async")
        assert (ctx.run_id, ctx.job_id, ctx.fence, ctx.attempt) == (2, 20, 1002, 2)
        assert (ctx.payload, ctx.idempotency_key, ctx.tenant) == (b"ok_async", "k1", "t")
        assert (ctx.scheduled_for_ms, ctx.timeout_ms) == (123, 10_000)
        assert 9 < ctx.deadline - time.monotonic() < 10.5

    scenario(go)


def test_a_run_still_going_after_the_ack_delay_is_acked_once_and_a_quick_one_never() -> None:
    async def go() -> None:
        async with node() as (svc, target):
            w = Worker(target, capacity=16)
            release = asyncio.Event()

            @w.handler()
            async def slow(ctx: RunContext) -> None:
                await release.wait()

            w.register("quick", lambda ctx: None)
            async with running(w):
                conn, _ = await svc.accept()
                t0 = time.monotonic()
                assign(conn, assignment(1, "slow"), assignment(2, "quick"))
                ack = await conn.expect("ack")
                assert time.monotonic() - t0 >= ACK_DELAY_S * 0.9
                assert [(r.run_id, r.fence) for r in ack.runs] == [(1, 1001)]
                assert set(conn.completions()) == {2}
                release.set()
                await conn.completed(2)
                await asyncio.sleep(ACK_DELAY_S * 2)
                assert len(conn.sent("ack")) == 1

    scenario(go)


def test_completions_are_batched_into_few_messages() -> None:
    async def go() -> None:
        async with node() as (svc, target):
            w = Worker(target, capacity=2_000)
            w.register("noop", lambda ctx: None)

            @w.handler()
            async def anoop(ctx: RunContext) -> None:
                return None

            async with running(w):
                conn, _ = await svc.accept()
                assign(conn, *[assignment(i, "anoop") for i in range(1, 501)])
                assign(conn, *[assignment(i, "noop") for i in range(501, 1001)])
                done = await conn.completed(1000)
        assert all(c.outcome == pb.OUTCOME_SUCCEEDED for c in done.values())
        assert len(conn.sent("complete")) <= 60, len(conn.sent("complete"))
        assert len(conn.sent("ack")) <= 4

    scenario(go)


def test_completions_a_few_loop_turns_apart_share_one_complete_message() -> None:
    async def go() -> None:
        async with node() as (svc, target):
            w = Worker(target, capacity=64)

            @w.handler()
            async def turns(ctx: RunContext) -> None:
                # Run i ends i loop turns after it started: apart, but within
                # far less than the coalescing window.
                for _ in range(ctx.run_id):
                    await asyncio.sleep(0)

            async with running(w):
                conn, _ = await svc.accept()
                assign(conn, *[assignment(i, "turns") for i in range(1, 21)])
                done = await conn.completed(20)
        assert all(c.outcome == pb.OUTCOME_SUCCEEDED for c in done.values())
        sizes = [len(m.completions) for m in conn.sent("complete")]
        assert sum(sizes) == 20
        assert max(sizes) >= 10, sizes

    scenario(go)


def test_a_completion_after_a_quiet_spell_does_not_wait_to_be_coalesced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a coalescing window of seconds, a lone completion still reaches
    its node at once (nothing came just before it: none would share its
    message), and completions that keep coming still share messages."""
    # Nothing else due ends a wait early: no heartbeat meanwhile, and the
    # run's ack is held for half a second (a tenth of the grace lease).
    monkeypatch.setattr(wheel.worker._link, "COALESCE_S", 2.0)
    monkeypatch.setattr(wheel.worker._link, "ACK_DELAY_S", 10.0)

    async def go() -> None:
        async with node() as (svc, target):
            w = Worker(target, capacity=64)
            w.register("noop", lambda ctx: None)

            @w.handler()
            async def turns(ctx: RunContext) -> None:
                for _ in range(ctx.run_id):
                    await asyncio.sleep(0)

            async with running(w):
                conn, _ = await svc.accept(heartbeat_ms=30_000)
                for i in (1, 2):
                    t0 = time.monotonic()
                    assign(conn, assignment(i, "noop"))
                    await conn.completed(i, timeout=5.0)
                    assert time.monotonic() - t0 < 0.25
                    await asyncio.sleep(2.1)  # a quiet spell
                assign(conn, *[assignment(i, "turns") for i in range(3, 23)])
                await conn.completed(22, timeout=10.0)
        sizes = [len(m.completions) for m in conn.sent("complete")]
        assert sizes[:2] == [1, 1] and sum(sizes) == 22, sizes
        assert max(sizes[2:]) >= 10, sizes

    scenario(go)


def test_a_completion_alone_still_goes_out_promptly() -> None:
    async def go() -> None:
        async with node() as (svc, target):
            w = Worker(target, capacity=64)
            w.register("noop", lambda ctx: None)
            async with running(w):
                conn, _ = await svc.accept()
                assign(conn, assignment(1, "noop"))
                await conn.completed(1)
                # A completion alone still goes out promptly.
                t0 = time.monotonic()
                assign(conn, assignment(2, "noop"))
                await conn.completed(2, timeout=1.0)
                assert time.monotonic() - t0 < 0.5

    scenario(go)


# -- superseded runs -------------------------------------------------------------------


def test_revoked_runs_are_cancelled_or_discarded_and_never_completed() -> None:
    cancelled = threading.Event()
    sync_started = threading.Event()
    sync_release = threading.Event()

    async def go() -> None:
        started = asyncio.Event()
        async with node() as (svc, target):
            w = Worker(target)

            @w.handler()
            async def slow(ctx: RunContext) -> None:
                started.set()
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    cancelled.set()
                    raise

            @w.handler()
            def slow_sync(ctx: RunContext) -> None:
                sync_started.set()
                sync_release.wait(5)

            w.register("ok", lambda ctx: None)
            async with running(w):
                conn, _ = await svc.accept(heartbeat_ms=30)
                assign(conn, assignment(1, "slow"), assignment(2, "slow_sync"))
                await started.wait()
                await asyncio.to_thread(sync_started.wait, 5)
                conn.send(
                    revokes=pb.Revokes(
                        revokes=[
                            pb.Revoke(run_id=1, fence=1001, reason=pb.REVOKE_REASON_CANCELLED),
                            pb.Revoke(run_id=2, fence=1002, reason=pb.REVOKE_REASON_SUPERSEDED),
                        ]
                    )
                )
                await until(cancelled.is_set)
                sync_release.set()
                assign(conn, assignment(3, "ok"))
                await conn.completed(1)
                await asyncio.sleep(0.1)
                assert set(conn.completions()) == {3}
                assert refs(await conn.expect("heartbeat")) == set()
                assert w.stats.revoked == 2

    scenario(go)


def test_a_revoke_with_a_stale_fence_is_ignored() -> None:
    async def go() -> None:
        release = asyncio.Event()
        async with node() as (svc, target):
            w = Worker(target)

            @w.handler()
            async def wait(ctx: RunContext) -> None:
                await release.wait()

            async with running(w):
                conn, _ = await svc.accept()
                assign(conn, assignment(1, "wait", fence=9))
                await conn.expect("ack")
                conn.send(revokes=pb.Revokes(revokes=[pb.Revoke(run_id=1, fence=8)]))
                await asyncio.sleep(0.05)
                release.set()
                done = await conn.completed(1)
                assert done[1].outcome == pb.OUTCOME_SUCCEEDED
                assert done[1].fence == 9

    scenario(go)


def test_rejected_renewal_aborts_the_run_and_rejected_completions_are_counted() -> None:
    async def go() -> None:
        cancelled = asyncio.Event()
        async with node() as (svc, target):
            w = Worker(target)

            @w.handler()
            async def slow(ctx: RunContext) -> None:
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    cancelled.set()
                    raise

            w.register("ok", lambda ctx: None)
            async with running(w):
                conn, _ = await svc.accept(heartbeat_ms=30)
                assign(conn, assignment(1, "slow", fence=41))
                while refs(await conn.expect("heartbeat")) != {(1, 41)}:
                    pass
                conn.send(results=pb.Results(rejected_renewals=[pb.RunRef(run_id=1, fence=41)]))
                await asyncio.wait_for(cancelled.wait(), 2)
                assert refs(await conn.expect("heartbeat")) == set()

                assign(conn, assignment(2, "ok"))
                await conn.completed(1)
                conn.send(
                    results=pb.Results(
                        completions=[pb.CompletionResult(run_id=2, accepted=False, reason="stale")]
                    )
                )
                await until(lambda: w.stats.rejected == 1)
                assert set(conn.completions()) == {2}
                assert w.stats.revoked == 1

    scenario(go)


# -- timeouts --------------------------------------------------------------------------


def test_timed_out_handlers_report_a_retryable_failure_once() -> None:
    async def go() -> None:
        cancelled = asyncio.Event()
        async with node() as (svc, target):
            w = Worker(target)

            @w.handler()
            async def hang(ctx: RunContext) -> None:
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    cancelled.set()
                    raise

            @w.handler()
            def hang_sync(ctx: RunContext) -> None:
                time.sleep(0.4)

            async with running(w):
                conn, _ = await svc.accept()
                t0 = time.monotonic()
                assign(
                    conn,
                    assignment(1, "hang", timeout_ms=100),
                    assignment(2, "hang_sync", timeout_ms=150),
                )
                done = await conn.completed(2)
                elapsed = time.monotonic() - t0
                assert elapsed < 0.38
                assert cancelled.is_set()
                assert (done[1].outcome, done[1].error) == (
                    pb.OUTCOME_RETRYABLE,
                    "timed out after 100 ms",
                )
                assert (done[2].outcome, done[2].error) == (
                    pb.OUTCOME_RETRYABLE,
                    "timed out after 150 ms",
                )
                await asyncio.sleep(0.45)  # the sync handler returns; its result is dropped
                completions = [c for m in conn.sent("complete") for c in m.completions]
                assert len(completions) == 2
                assert w.stats.timed_out == 2

    scenario(go)


# -- streams ---------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def wait_and_ok(target: str, worker_id: str) -> AsyncIterator[tuple[Worker, asyncio.Event]]:
    """A running worker that reconnects fast, with two handlers: ``wait``
    returns once the event is set, ``ok`` at once."""
    release = asyncio.Event()
    w = Worker(target, worker_id=worker_id, reconnect_initial=0.05)

    @w.handler()
    async def wait(ctx: RunContext) -> None:
        await release.wait()

    w.register("ok", lambda ctx: None)
    async with running(w):
        yield w, release


def test_lost_stream_reconnects_says_hello_again_and_keeps_its_runs() -> None:
    async def go() -> None:
        async with node() as (svc, target), wait_and_ok(target, "w-9") as (w, release):
            conn, _ = await svc.accept(heartbeat_ms=1_000)
            assign(conn, assignment(1, "wait", fence=5), assignment(2, "ok", fence=6))
            await conn.completed(1)
            # Run 2's completion is never confirmed; the stream then drops.
            conn.drop()
            t0 = time.monotonic()
            conn2, hello = await svc.accept(heartbeat_ms=1_000)
            assert time.monotonic() - t0 >= 0.02  # backed off
            assert hello.worker_id == "w-9"
            assert w.stats.reconnects == 1
            # The first heartbeat on the new stream reports what the worker holds.
            assert refs(await conn2.expect("heartbeat")) == {(1, 5)}
            # ... and re-sends the completion the old stream never confirmed.
            resent = await conn2.completed(1)
            assert [(c.run_id, c.fence) for c in resent.values()] == [(2, 6)]
            release.set()
            done = await conn2.completed(2)
            assert (done[1].fence, done[1].outcome) == (5, pb.OUTCOME_SUCCEEDED)
            assert w.stats.revoked == 0

    scenario(go)


def test_results_carried_with_assignments_confirm_completions_and_revoke_renewals() -> None:
    async def go() -> None:
        async with node() as (svc, target), wait_and_ok(target, "w-8") as (w, release):
            conn, _ = await svc.accept(heartbeat_ms=1_000)
            assign(conn, assignment(1, "ok", fence=5), assignment(2, "wait", fence=6))
            await conn.completed(1)
            # The next tick's work comes with the answer to run 1 and the
            # news that run 2 is no longer this worker's.
            conn.send(
                assignments=pb.Assignments(
                    assignments=[assignment(3, "wait", fence=7)],
                    results=pb.Results(
                        accepted=[1], rejected_renewals=[pb.RunRef(run_id=2, fence=6)]
                    ),
                )
            )
            await until(lambda: w.stats.revoked == 1)
            conn.drop()
            conn2, _ = await svc.accept(heartbeat_ms=1_000)
            # Run 1 was confirmed: not re-sent. Run 3 arrived and is held.
            assert refs(await conn2.expect("heartbeat")) == {(3, 7)}
            await asyncio.sleep(0.1)
            assert conn2.completions() == {}
            release.set()
            assert list(await conn2.completed(1)) == [3]

    scenario(go)


def test_unreachable_node_is_retried_until_it_comes_up(unused_port: int) -> None:
    async def go() -> None:
        w = Worker(f"127.0.0.1:{unused_port}", reconnect_initial=0.02, reconnect_max=0.05)
        w.register("ok", lambda ctx: None)
        async with running(w):
            await until(lambda: w.stats.reconnects >= 3)
            assert w.connected == 0
            server = grpc.aio.server()
            svc = ScriptedNode()
            pb_grpc.add_WorkerServiceServicer_to_server(svc, server)
            server.add_insecure_port(f"127.0.0.1:{unused_port}")
            await server.start()
            try:
                _, hello = await svc.accept()
                assert list(hello.handlers) == ["ok"]
                await until(lambda: w.connected == 1)
            finally:
                w.stop()
                await server.stop(None)

    scenario(go)


@pytest.fixture
def unused_port() -> int:
    return free_port()


def test_protocol_errors_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        async with node() as (svc, target):
            w = Worker(target)
            async with running(w):
                conn, _ = await svc.accept()
                conn.send(
                    error=pb.ProtocolError(code="FAILED_PRECONDITION", message="no", run_id=4)
                )
                await until(lambda: "FAILED_PRECONDITION" in caplog.text)

    with caplog.at_level(logging.INFO, logger="wheel.worker"):
        scenario(go)
    assert "run 4" in caplog.text


# -- drain and capacity ----------------------------------------------------------------


DRAIN_S = 2.0


def test_drain_finishes_in_flight_runs_hands_back_unstarted_ones_and_abandons_the_rest() -> None:
    async def go() -> None:
        quick = asyncio.Event()
        async with node() as (svc, target):
            w = Worker(target, capacity=2)

            @w.handler()
            async def soon(ctx: RunContext) -> None:
                await quick.wait()

            @w.handler()
            async def never(ctx: RunContext) -> None:
                await asyncio.sleep(60)

            task = asyncio.create_task(w.run())
            conn, _ = await svc.accept()
            # capacity 2: run 3 waits locally and has not started when the drain begins.
            assign(conn, assignment(1, "soon"), assignment(2, "never"), assignment(3, "never"))
            await conn.expect("ack")
            t0 = time.monotonic()
            # Long enough that the steps below, on a loaded machine, end
            # before it does (at 0.5 s run 1 was once given up with them).
            drain = asyncio.create_task(w.drain(timeout=DRAIN_S))
            await conn.expect("drain")
            early = await conn.completed(1)
            assert early[3].outcome == pb.OUTCOME_HANDED_BACK
            # Work arriving after the drain goes straight back.
            assign(conn, assignment(4, "soon"))
            await conn.completed(2)
            assert conn.completions()[4].outcome == pb.OUTCOME_HANDED_BACK
            await asyncio.sleep(0.1)
            quick.set()
            await conn.completed(3)
            assert conn.completions()[1].outcome == pb.OUTCOME_SUCCEEDED
            await conn.completed(4)
            assert time.monotonic() - t0 >= DRAIN_S - 0.05
            # Its handler started: given up, not handed back (its effect is unknown).
            assert conn.completions()[2].outcome == pb.OUTCOME_ABANDONED
            conn.send(results=pb.Results(accepted=[1, 2, 3, 4]))
            await asyncio.wait_for(drain, 3)
            await asyncio.wait_for(task, 3)
            # Not a minute: the handler still running was given up at the timeout.
            assert time.monotonic() - t0 < DRAIN_S + 1.5
            assert (w.stats.handed_back, w.stats.abandoned) == (2, 1)

    scenario(go)


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_never_more_than_capacity_handlers_at_once(kind: str) -> None:
    lock = threading.Lock()
    now = 0
    peak = 0

    def enter() -> None:
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)

    def leave() -> None:
        nonlocal now
        with lock:
            now -= 1

    async def go() -> None:
        async with node() as (svc, target):
            w = Worker(target, capacity=3)

            if kind == "async":

                @w.handler("work")
                async def work_async(ctx: RunContext) -> None:
                    enter()
                    await asyncio.sleep(0.03)
                    leave()
            else:

                @w.handler("work")
                def work_sync(ctx: RunContext) -> None:
                    enter()
                    time.sleep(0.03)
                    leave()

            async with running(w):
                conn, hello = await svc.accept()
                assert hello.capacity == 3
                # A node (or several) sending more than the capacity: the excess waits.
                assign(conn, *[assignment(i, "work") for i in range(1, 13)])
                done = await conn.completed(12)
        assert all(c.outcome == pb.OUTCOME_SUCCEEDED for c in done.values())
        assert peak == 3

    scenario(go)


# -- registration ----------------------------------------------------------------------


def test_registration_rejects_duplicates_and_empty_names() -> None:
    w = Worker("127.0.0.1:1")
    w.register("a", lambda ctx: None)
    with pytest.raises(InvalidArgument):
        w.register("a", lambda ctx: None)
    with pytest.raises(InvalidArgument):
        w.register("", lambda ctx: None)
    with pytest.raises(InvalidArgument):
        Worker("127.0.0.1:1", capacity=0)


@pytest.mark.parametrize("field", ["reconnect_initial", "reconnect_max"])
@pytest.mark.parametrize("wait", [0.0, -1.0, float("nan")])
def test_a_reconnect_wait_that_is_not_positive_is_refused_naming_it(
    field: str, wait: float
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        kw: dict[str, Any] = {field: wait}
        Worker("127.0.0.1:1", **kw)
    assert caught.value.field == field


def test_load_handler_resolves_module_function_references() -> None:
    expected: list[tuple[str, tuple[str, object]]] = [
        ("json:dumps", ("dumps", json.dumps)),
        ("enc=json:dumps", ("enc", json.dumps)),
        ("os.path:join", ("join", os.path.join)),
        ("j=json:JSONEncoder.encode", ("j", json.JSONEncoder.encode)),
    ]
    for ref, want in expected:
        assert load_handler(ref) == want
    for bad in ("json", "json:", ":dumps", "no_such_module_zz:f", "json:nope", "json:__doc__"):
        with pytest.raises(InvalidArgument):
            load_handler(bad)


def test_run_worker_drains_on_sigterm() -> None:
    script = (
        "import sys, time\n"
        "from wheel.worker import run_worker\n"
        "def slow(ctx):\n"
        "    time.sleep(0.3)\n"
        "run_worker(sys.argv[1], {'slow': slow}, capacity=2, worker_id='proc', drain_timeout=5)\n"
    )

    async def go() -> None:
        async with node() as (svc, target):
            proc = await asyncio.create_subprocess_exec(sys.executable, "-c", script, target)
            try:
                conn, hello = await svc.accept()
                assert (hello.worker_id, list(hello.handlers)) == ("proc", ["slow"])
                assign(conn, assignment(1, "slow"))
                await conn.expect("ack")
                proc.send_signal(signal.SIGTERM)
                await conn.expect("drain")
                done = await conn.completed(1)
                assert done[1].outcome == pb.OUTCOME_SUCCEEDED
                conn.send(results=pb.Results(accepted=[1]))
                assert await asyncio.wait_for(proc.wait(), 5) == 0
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()

    scenario(go)


# -- handlers that cannot suspend run inline ----------------------------------------------


def test_how_each_kind_of_handler_runs() -> None:
    from functools import partial

    from wheel.worker._runs import INLINE, SYNC, TASK, mode_of

    async def no_await(ctx: RunContext) -> None:
        return None

    async def awaits(ctx: RunContext) -> None:
        await asyncio.sleep(0)

    async def iterates(ctx: RunContext) -> None:
        async for _ in _agen():
            pass

    class Obj:
        async def method(self, ctx: RunContext) -> None:
            return None

        async def __call__(self, ctx: RunContext) -> None:
            return None

    assert mode_of(lambda ctx: None) == SYNC
    assert mode_of(no_await) == INLINE
    assert mode_of(Obj().method) == INLINE
    assert mode_of(awaits) == TASK
    assert mode_of(iterates) == TASK
    assert mode_of(Obj()) == TASK  # its code is not looked into
    assert mode_of(partial(no_await)) == TASK


async def _agen() -> AsyncIterator[int]:
    yield 1


def test_a_batch_of_handlers_that_cannot_suspend_creates_no_task_per_run() -> None:
    import contextvars

    var: contextvars.ContextVar[int] = contextvars.ContextVar("var", default=0)
    created = 0

    async def go() -> None:
        nonlocal created
        loop = asyncio.get_running_loop()

        def count(loop: asyncio.AbstractEventLoop, coro: object) -> asyncio.Task[object]:
            nonlocal created
            created += 1
            return asyncio.Task(coro, loop=loop)  # type: ignore[arg-type]

        async with node() as (svc, target):
            w = Worker(target, capacity=1_000)
            seen: list[int] = []

            @w.handler()
            async def quick(ctx: RunContext) -> None:
                seen.append(var.get())
                var.set(ctx.run_id)  # stays in the run's own context
                if ctx.run_id % 10 == 0:
                    raise Retryable("every tenth")

            async with running(w):
                conn, _ = await svc.accept()
                await asyncio.sleep(0.2)  # the link's tasks are up
                loop.set_task_factory(count)  # type: ignore[arg-type]
                try:
                    assign(conn, *[assignment(i, "quick") for i in range(1, 301)])
                    done = await conn.completed(300)
                finally:
                    loop.set_task_factory(None)
        outcomes = {c.run_id: c.outcome for c in done.values()}
        assert sum(o == pb.OUTCOME_RETRYABLE for o in outcomes.values()) == 30
        assert sum(o == pb.OUTCOME_SUCCEEDED for o in outcomes.values()) == 270
        assert seen == [0] * 300  # no run saw another's context variable
        assert var.get() == 0

    scenario(go)
    # A task each for the loop's own waits (the writer's, a timer), never one a run.
    assert created < 30, created


def test_the_context_built_for_each_run_is_the_frozen_dataclass_with_every_field() -> None:
    # The worker builds each run's context through ``run_context`` (cheaper
    # than the dataclass's own __init__); it must be that same object.
    values: dict[str, Any] = {
        "run_id": 1,
        "job_id": 2,
        "handler": "h",
        "tenant": "t",
        "payload": b"p",
        "idempotency_key": "k",
        "fence": 3,
        "attempt": 4,
        "scheduled_for_ms": 5,
        "timeout_ms": 6,
        "deadline": 7.5,
    }
    assert list(inspect.signature(run_context).parameters) == [
        f.name for f in dataclasses.fields(RunContext)
    ]
    ctx = run_context(**values)
    assert type(ctx) is RunContext
    assert ctx == RunContext(**values) and hash(ctx) == hash(RunContext(**values))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.run_id = 9  # type: ignore[misc]
