"""WorkerService.Connect abused with raw streams of the generated stubs: a worker
that breaks protocol gets an error for that message and cannot affect runs it
does not hold, nor other workers."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.rpc.test_api import (
    Api,
    InProcessServer,
    WorkerThread,
    all_runs,
    connect,
    now_ms,
    once,
    spec,
    submit,
    wait_for,
)
from wheel.engine.owner import OwnerConfig
from wheel.rpc.v1 import jobs_pb2
from wheel.rpc.v1 import worker_service_pb2 as pb
from wheel.rpc.v1 import worker_service_pb2_grpc as pb_grpc
from wheel.worker import RunContext

LEASE_MS = 1_500
GRACE_MS = 600


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    server = InProcessServer(
        tmp_path, OwnerConfig(lease_ms=LEASE_MS, grace_lease_ms=GRACE_MS)
    ).start()
    try:
        with connect(server) as a:
            yield a
    finally:
        server.stop()


class RawWorker:
    """One Connect stream driven by hand: every message is the test's choice."""

    def __init__(
        self,
        target: str,
        worker_id: str,
        *,
        capacity: int = 1,
        pool: str = "default",
        handlers: Sequence[str] = (),
        columns: bool = False,
    ) -> None:
        self.channel = grpc.insecure_channel(target)
        self._out: queue.Queue[pb.WorkerMessage | None] = queue.Queue()
        self.inbox: queue.Queue[pb.ServerMessage | BaseException] = queue.Queue()
        self.seen: list[pb.ServerMessage] = []
        self._out.put(
            pb.WorkerMessage(
                hello=pb.Hello(
                    worker_id=worker_id,
                    capacity=capacity,
                    pools=[pool],
                    handlers=handlers,
                    columns=columns,
                )
            )
        )
        self.call = pb_grpc.WorkerServiceStub(self.channel).Connect(iter(self._out.get, None))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.welcome = self.expect("welcome").welcome

    def _read(self) -> None:
        try:
            for msg in self.call:
                self.inbox.put(msg)
        except BaseException as exc:  # the stream's end, as the test sees it
            self.inbox.put(exc)

    def send(self, msg: pb.WorkerMessage) -> None:
        self._out.put(msg)

    def expect(self, kind: str, timeout: float = 10, where: Any = None) -> pb.ServerMessage:
        """The next message of ``kind`` (matching ``where``); others are kept in
        ``seen``. Results carried by an assignments message count as results."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {kind} message within {timeout}s; saw {self.seen}")
            try:
                msg = self.inbox.get(timeout=left)
            except queue.Empty:
                continue
            if isinstance(msg, BaseException):
                raise AssertionError(f"stream ended waiting for {kind}: {msg}")
            self.seen.append(msg)
            if kind == "results" and msg.assignments.HasField("results"):
                # Answers that rode along with the tick's assignments.
                msg = pb.ServerMessage(results=msg.assignments.results)
            if msg.WhichOneof("kind") == kind and (where is None or where(msg)):
                return msg

    def close(self) -> None:
        self._out.put(None)
        self.call.cancel()
        self.channel.close()


def ack(*refs: tuple[int, int]) -> pb.WorkerMessage:
    return pb.WorkerMessage(ack=pb.Ack(runs=[pb.RunRef(run_id=r, fence=f) for r, f in refs]))


def heartbeat(*refs: tuple[int, int]) -> pb.WorkerMessage:
    return pb.WorkerMessage(
        heartbeat=pb.Heartbeat(runs=[pb.RunRef(run_id=r, fence=f) for r, f in refs])
    )


def complete(run_id: int, fence: int, outcome: int = pb.OUTCOME_SUCCEEDED) -> pb.WorkerMessage:
    return pb.WorkerMessage(
        complete=pb.Complete(
            completions=[pb.Completion(run_id=run_id, fence=fence, outcome=outcome)]  # type: ignore[arg-type]
        )
    )


def result_for(run_id: int) -> Any:
    """A rejection of ``run_id``'s completion (accepted ones: ``accepted_for``)."""
    return lambda m: any(c.run_id == run_id for c in m.results.completions)


def accepted_for(run_id: int) -> Any:
    return lambda m: run_id in m.results.accepted


def error_for(run_id: int) -> Any:
    return lambda m: m.error.run_id == run_id


def one_shot(api: Api, pool: str = "default", **kw: Any) -> int:
    return int(
        submit(
            api, spec(name="one", handler="h", pool=pool, schedule=once(now_ms()), **kw)
        ).job.job_id
    )


def states(api: Api, job_id: int) -> list[tuple[int, str]]:
    names = {v: k.removeprefix("RUN_STATE_").lower() for k, v in jobs_pb2.RunState.items()}
    return sorted((r.attempt, names[r.state]) for r in all_runs(api, job_id))


def test_a_completion_for_a_run_not_held_is_rejected_and_the_holder_is_unaffected(
    api: Api,
) -> None:
    holder = RawWorker(api.server.target, "holder")
    try:
        job = one_shot(api)
        a = holder.expect("assignments").assignments.assignments[0]
        holder.send(ack((a.run_id, a.fence)))
        intruder = RawWorker(api.server.target, "intruder")
        try:
            # The right run id and fence, from the wrong worker.
            intruder.send(complete(a.run_id, a.fence))
            res = intruder.expect("results", where=result_for(a.run_id)).results.completions[0]
            assert not res.accepted and "another worker" in res.reason
            # A run that does not exist.
            intruder.send(complete(424242, 1))
            res = intruder.expect("results", where=result_for(424242)).results.completions[0]
            assert not res.accepted and "not held" in res.reason
            # Acks and heartbeats for someone else's run: an error each, no renewal.
            intruder.send(ack((a.run_id, a.fence)))
            err = intruder.expect("error", where=error_for(a.run_id)).error
            assert err.code == "FAILED_PRECONDITION" and "another worker" in err.message
            intruder.send(heartbeat((a.run_id, a.fence)))
            rej = intruder.expect("results", where=lambda m: m.results.rejected_renewals)
            assert [(r.run_id, r.fence) for r in rej.results.rejected_renewals] == [
                (a.run_id, a.fence)
            ]
        finally:
            intruder.close()
        # The ack's start may land with a later batch than the answers above.
        wait_for(lambda: states(api, job) == [(1, "running")], 10, "the holder's ack")
        holder.send(complete(a.run_id, a.fence))
        res = holder.expect("results", where=accepted_for(a.run_id)).results
        assert not res.completions  # nothing rejected
        wait_for(lambda: states(api, job) == [(1, "succeeded")], 10, "the holder's success")
        assert all_runs(api, job)[0].worker_id == "holder"
    finally:
        holder.close()


def test_a_wrong_fence_is_rejected_on_ack_heartbeat_and_completion(api: Api) -> None:
    w = RawWorker(api.server.target, "w")
    try:
        job = one_shot(api)
        a = w.expect("assignments").assignments.assignments[0]
        w.send(ack((a.run_id, a.fence - 1)))
        err = w.expect("error", where=error_for(a.run_id)).error
        assert err.code == "FAILED_PRECONDITION" and f"stale fence {a.fence - 1}" in err.message
        # A fence never issued for the run is not "stale": it does not match.
        w.send(ack((a.run_id, a.fence + 1)))
        err = w.expect("error", where=error_for(a.run_id)).error
        assert err.code == "FAILED_PRECONDITION"
        assert f"fence {a.fence + 1} does not match the run's fence {a.fence}" in err.message
        assert "stale" not in err.message
        w.send(ack((a.run_id, a.fence)))
        w.send(heartbeat((a.run_id, a.fence + 7)))
        rej = w.expect("results", where=lambda m: m.results.rejected_renewals).results
        assert [(r.run_id, r.fence) for r in rej.rejected_renewals] == [(a.run_id, a.fence + 7)]
        w.send(complete(a.run_id, a.fence - 1))
        res = w.expect("results", where=result_for(a.run_id)).results.completions[0]
        assert not res.accepted and "stale fence" in res.reason
        w.send(complete(a.run_id, a.fence + 1))
        res = w.expect("results", where=result_for(a.run_id)).results.completions[0]
        assert not res.accepted and "does not match" in res.reason and "stale" not in res.reason
        # The ack's start is written with a later batch than this answer (it
        # needs no store round trip): the run shows running, never ended.
        wait_for(lambda: states(api, job) == [(1, "running")], 10, "the ack's start")
        w.send(complete(a.run_id, a.fence))
        assert list(w.expect("results", where=accepted_for(a.run_id)).results.accepted) == [
            a.run_id
        ]
        wait_for(lambda: states(api, job) == [(1, "succeeded")], 10, "the success")
    finally:
        w.close()


def test_a_worker_that_never_acks_loses_the_run_to_another_worker(api: Api) -> None:
    """The grace lease expires; the fire goes to a worker that answers, with a
    newer fence; the silent worker's late completion is rejected."""
    silent = RawWorker(api.server.target, "silent", capacity=4)
    try:
        job = one_shot(api)
        first = silent.expect("assignments").assignments.assignments[0]
        assert first.lease_ms == GRACE_MS
        t0 = time.monotonic()
        ran: list[RunContext] = []
        with WorkerThread(api.server.target, "answers", h=ran.append):
            revoke = silent.expect("revokes", timeout=10).revokes.revokes[0]
            assert (revoke.run_id, revoke.fence) == (first.run_id, first.fence)
            assert revoke.reason == pb.REVOKE_REASON_LEASE_EXPIRED
            wait_for(lambda: ran, 10, "the re-dispatch to the answering worker")
            assert time.monotonic() - t0 >= GRACE_MS / 1000 * 0.9
            again = ran[0]
            assert (first.attempt, again.attempt) == (1, 2) and again.fence > first.fence
            assert again.idempotency_key == first.idempotency_key
            wait_for(lambda: states(api, job) == [(1, "lost"), (2, "succeeded")], 10, "the success")
            # The silent worker wakes up and completes its stale attempt.
            silent.send(complete(first.run_id, first.fence))
            res = silent.expect("results", where=result_for(first.run_id)).results.completions[0]
            assert not res.accepted
        assert states(api, job) == [(1, "lost"), (2, "succeeded")]
        # It got nothing else: the fire was not handed back to it.
        handed = [
            a.run_id
            for m in silent.seen
            if m.WhichOneof("kind") == "assignments"
            for a in m.assignments.assignments
        ]
        assert handed == [first.run_id]
    finally:
        silent.close()


def test_a_flood_of_bogus_messages_gets_errors_and_other_workers_keep_running(
    api: Api,
) -> None:
    flooder = RawWorker(api.server.target, "flooder", pool="flood")
    done: list[int] = []
    try:
        with WorkerThread(api.server.target, "good", h=lambda ctx: done.append(ctx.job_id)):
            bogus = [
                ack((10**9 + 1, 1)),
                heartbeat(*[(10**9 + k, k) for k in range(50)]),
                complete(10**9 + 2, 3),
                complete(10**9 + 3, 3, outcome=99),
                pb.WorkerMessage(hello=pb.Hello(worker_id="flooder", capacity=1)),
                pb.WorkerMessage(),
            ]
            sent = 0
            jobs = []
            for i in range(40):
                for _ in range(50):
                    flooder.send(bogus[sent % len(bogus)])
                    sent += 1
                if i % 4 == 0:
                    jobs.append(one_shot(api))
            wait_for(lambda: set(done) >= set(jobs), 20, "every good job to run")
            for job in jobs:
                assert states(api, job) == [(1, "succeeded")]
            # The flooder got an answer for its messages, and its stream is up.
            flooder.expect(
                "error", timeout=10, where=lambda m: "unexpected message" in m.error.message
            )
            flooder.expect(
                "error", timeout=10, where=lambda m: "completions.outcome" in m.error.message
            )
            flooder.expect("results", timeout=10, where=result_for(10**9 + 2))
            flooder.send(ack((10**9 + 5, 1)))
            flooder.expect("error", timeout=10, where=error_for(10**9 + 5))
    finally:
        flooder.close()


@pytest.mark.parametrize(
    ("first", "fragment"),
    [
        (pb.WorkerMessage(ack=pb.Ack()), "first message"),
        (pb.WorkerMessage(hello=pb.Hello(worker_id="", capacity=1)), "hello.worker_id"),
        (pb.WorkerMessage(hello=pb.Hello(worker_id="x" * 201, capacity=1)), "200"),
        (pb.WorkerMessage(hello=pb.Hello(worker_id="w", capacity=-1)), "hello.capacity"),
        (pb.WorkerMessage(hello=pb.Hello(worker_id="w", capacity=10**6)), "100000"),
    ],
    ids=["no hello", "empty id", "long id", "negative capacity", "huge capacity"],
)
def test_a_bad_hello_ends_only_that_stream(
    api: Api, first: pb.WorkerMessage, fragment: str
) -> None:
    with WorkerThread(api.server.target, "bystander", h=lambda ctx: None) as good:
        with grpc.insecure_channel(api.server.target) as ch:
            call = pb_grpc.WorkerServiceStub(ch).Connect(iter([first]))
            with pytest.raises(grpc.RpcError) as info:
                list(call)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert fragment in info.value.details()
        assert good.connected == 1
        job = one_shot(api)
        wait_for(lambda: states(api, job) == [(1, "succeeded")], 10, "the bystander's run")


def test_credit_cannot_take_a_worker_past_the_capacity_limit(api: Api) -> None:
    worker = RawWorker(api.server.target, "greedy", pool="greedy")
    try:
        worker.send(pb.WorkerMessage(credit=pb.Credit(add=10**6)))
        err = worker.expect("error", timeout=10, where=lambda m: "credit.add" in m.error.message)
        assert "100000" in err.error.message
        worker.send(pb.WorkerMessage(credit=pb.Credit(add=-(10**6))))
        worker.expect("error", timeout=10, where=lambda m: "credit.add" in m.error.message)
        node = api.server.node
        assert node is not None
        assert api.server.call(lambda: node.worker_capacity("greedy")) == 1
    finally:
        worker.close()


@pytest.mark.parametrize("after_hello", [False, True])
def test_bytes_that_are_not_a_worker_message_end_only_that_stream(
    api: Api, after_hello: bool
) -> None:
    """grpc answered UNKNOWN ("Unexpected DecodeError") for a stream message
    that does not parse; it is INVALID_ARGUMENT naming the request, and the
    other workers keep running."""
    hello = pb.WorkerMessage(hello=pb.Hello(worker_id="garbled", capacity=1, pools=["default"]))
    sent = [hello.SerializeToString()] if after_hello else []
    sent.append(b"\xff\xff\xff")
    with WorkerThread(api.server.target, "bystander", h=lambda ctx: None) as good:
        with grpc.insecure_channel(api.server.target) as ch:
            call = ch.stream_stream("/wheel.rpc.v1.WorkerService/Connect")(iter(sent), timeout=10)
            with pytest.raises(grpc.RpcError) as info:
                list(call)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (info.value.details() or "").startswith(
            "request: not a /wheel.rpc.v1.WorkerService/Connect request message"
        )
        assert good.connected == 1
        job = one_shot(api)
        wait_for(lambda: states(api, job) == [(1, "succeeded")], 10, "the bystander's run")
