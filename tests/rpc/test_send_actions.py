"""What one loop iteration's actions become on a worker's stream: one message
a tick, the answers to its completions riding with its new work (accepted
ones wait a little for it)."""

from __future__ import annotations

import asyncio
import time

from wheel.engine.owner import Actions, Assignment, CompletionResult, Revoke, RevokeReason
from wheel.node import WorkerSession
from wheel.rpc._workers import RESULTS_HOLD_S
from wheel.rpc.server import send_actions
from wheel.rpc.v1 import worker_service_pb2 as pb


def _assignment(run_id: int) -> Assignment:
    return Assignment(
        run_id=run_id,
        job_id=run_id * 10,
        handler="h",
        tenant="t",
        scheduled_for=1_000 + run_id,
        attempt=0,
        fence=(1 << 32) | run_id,
        payload=b"p",
        lease_ms=5_000,
        timeout_ms=60_000,
    )


def _sent(session: WorkerSession) -> list[pb.ServerMessage]:
    out = []
    while not session.outbox.empty():
        msg = session.outbox.get_nowait()
        assert isinstance(msg, pb.ServerMessage)
        out.append(msg)
    return out


def _results() -> list[CompletionResult]:
    return [
        CompletionResult(run_id=1, accepted=True),
        CompletionResult(run_id=2, accepted=False, reason="stale fence"),
        CompletionResult(run_id=3, accepted=True),
    ]


def test_assignments_carry_the_ticks_results_in_one_message() -> None:
    session, acts = WorkerSession("w1"), Actions()
    acts.assignments["w1"] = [_assignment(7), _assignment(8)]
    acts.results["w1"] = _results()
    acts.rejected_renewals["w1"] = [(4, 44)]
    acts.assignments["w2"] = [_assignment(9)]  # another worker's: not on this stream
    send_actions(session, acts)
    [msg] = _sent(session)
    assert msg.WhichOneof("kind") == "assignments"
    a = msg.assignments
    assert [x.run_id for x in a.assignments] == [7, 8]
    assert a.assignments[0].idempotency_key == _assignment(7).idempotency_key
    assert list(a.results.accepted) == [1, 3]
    assert [(c.run_id, c.accepted, c.reason) for c in a.results.completions] == [
        (2, False, "stale fence")
    ]
    assert [(r.run_id, r.fence) for r in a.results.rejected_renewals] == [(4, 44)]


def test_results_without_new_work_go_on_their_own_and_revokes_apart() -> None:
    session, acts = WorkerSession("w1"), Actions()
    acts.results["w1"] = _results()
    acts.revokes["w1"] = [Revoke(run_id=5, fence=55, reason=RevokeReason.TIMED_OUT)]
    send_actions(session, acts)
    results, revokes = _sent(session)
    assert results.WhichOneof("kind") == "results"
    assert list(results.results.accepted) == [1, 3]
    assert revokes.WhichOneof("kind") == "revokes"
    assert revokes.revokes.revokes[0].reason == pb.REVOKE_REASON_TIMED_OUT


def test_assignments_alone_carry_no_results() -> None:
    session, acts = WorkerSession("w1"), Actions()
    acts.assignments["w1"] = [_assignment(7)]
    send_actions(session, acts)
    [msg] = _sent(session)
    assert not msg.assignments.HasField("results")


def _accepted(*run_ids: int) -> list[CompletionResult]:
    return [CompletionResult(run_id=r, accepted=True) for r in run_ids]


def _send(
    session: WorkerSession,
    results: list[CompletionResult],
    assignments: list[Assignment] | None = None,
    credited: int = 0,
) -> list[pb.ServerMessage]:
    """One loop iteration's actions for w1 through ``send_actions``: what
    went on its stream at once."""
    acts = Actions()
    acts.results["w1"] = results
    if assignments:
        acts.assignments["w1"] = assignments
    if credited:
        acts.credited["w1"] = credited
    send_actions(session, acts)
    return _sent(session)


def test_accepted_answers_wait_to_ride_with_the_workers_next_assignments() -> None:
    async def go() -> None:
        session = WorkerSession("w1")
        assert _send(session, _accepted(1, 2)) == []  # held: a message alone is a round
        [msg] = _send(session, _accepted(3), assignments=[_assignment(7)])
        assert [x.run_id for x in msg.assignments.assignments] == [7]
        assert list(msg.assignments.results.accepted) == [1, 2, 3]
        await asyncio.sleep(RESULTS_HOLD_S * 2)
        assert _sent(session) == []  # and nothing again when the hold ends

    asyncio.run(go())


def test_accepted_answers_go_alone_when_no_work_comes_within_the_hold() -> None:
    async def go() -> None:
        session = WorkerSession("w1")
        assert _send(session, _accepted(1)) == _send(session, _accepted(2)) == []
        started = time.monotonic()
        msg = await asyncio.wait_for(session.outbox.get(), timeout=10)
        assert isinstance(msg, pb.ServerMessage)
        assert msg.WhichOneof("kind") == "results"
        assert list(msg.results.accepted) == [1, 2]
        assert time.monotonic() - started < RESULTS_HOLD_S + 5
        assert _sent(session) == []

    asyncio.run(go())


def test_a_rejection_goes_at_once_and_takes_the_held_answers_with_it() -> None:
    async def go() -> None:
        session = WorkerSession("w1")
        assert _send(session, _accepted(1)) == []
        rejected = CompletionResult(run_id=2, accepted=False, reason="stale fence")
        [msg] = _send(session, [rejected])
        assert list(msg.results.accepted) == [1]
        assert [c.run_id for c in msg.results.completions] == [2]
        [msg] = _send(session, _accepted(3), credited=5)  # a credit change goes at once too
        assert (list(msg.results.accepted), msg.results.credit_seq) == ([3], 5)
        await asyncio.sleep(RESULTS_HOLD_S * 2)
        assert _sent(session) == []

    asyncio.run(go())


def test_held_answers_of_a_stream_that_closed_are_dropped() -> None:
    async def go() -> None:
        session = WorkerSession("w1")
        assert _send(session, _accepted(1)) == []
        session.closed = True  # the worker resends its completions elsewhere
        await asyncio.sleep(RESULTS_HOLD_S * 2)
        assert _sent(session) == [] and session.held == []

    asyncio.run(go())


def _traceparent(a: Assignment, key: str) -> str:
    assert key == a.idempotency_key
    return f"00-{a.run_id:032x}-{a.job_id:016x}-01"


def test_traced_runs_go_as_columns_only_to_a_worker_that_reads_their_traceparents() -> None:
    runs = [_assignment(7), _assignment(8)]
    reads = WorkerSession("w1")
    reads.columns = reads.traced_columns = True
    acts = Actions()
    acts.assignments["w1"] = runs
    send_actions(reads, acts, trace=_traceparent)
    [msg] = _sent(reads)
    cols = msg.assignments.columns
    assert not msg.assignments.assignments
    assert list(cols.run_id) == [7, 8]
    assert list(cols.traceparent) == [_traceparent(a, a.idempotency_key) for a in runs]
    # A worker that reads columns but not their traceparents: a message each.
    older = WorkerSession("w1")
    older.columns = True
    send_actions(older, acts, trace=_traceparent)
    [msg] = _sent(older)
    assert not msg.assignments.HasField("columns")
    assert [a.traceparent for a in msg.assignments.assignments] == [
        _traceparent(a, a.idempotency_key) for a in runs
    ]
    # Not tracing: columns without traceparents.
    send_actions(reads, acts)
    [msg] = _sent(reads)
    assert list(msg.assignments.columns.run_id) == [7, 8]
    assert not msg.assignments.columns.traceparent
