"""Worker streams under --auth: a revoked or expired credential ends its open
stream with UNAUTHENTICATED within the re-check interval; no credential takes
over another worker's session or completes its runs."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc

from tests.auth.conftest import RECHECK_S, AuthServer, Stubs, Tokens, md
from tests.auth.test_matrix import once_spec
from wheel.auth import JOBS_WRITE, WORKER, mint
from wheel.engine.model import RunState
from wheel.rpc.v1 import job_service_pb2, worker_service_pb2

# Slack for a loaded two-core machine on top of the stated bound.
SLACK_S = 1.5


class RawStream:
    """A Connect stream driven by hand: messages in through a queue, every
    server message (and the stream's end) recorded by a reader thread."""

    def __init__(self, stubs: Stubs, token: str, worker_id: str, pools: list[str]) -> None:
        self.out: queue.Queue[worker_service_pb2.WorkerMessage | None] = queue.Queue()
        self.out.put(
            worker_service_pb2.WorkerMessage(
                hello=worker_service_pb2.Hello(worker_id=worker_id, capacity=4, pools=pools)
            )
        )
        self.got: queue.Queue[worker_service_pb2.ServerMessage] = queue.Queue()
        self.error: grpc.RpcError | None = None
        self.ended = threading.Event()
        self.ended_at = 0.0
        self.call = stubs.workers.Connect(self._messages(), metadata=md(token))
        threading.Thread(target=self._read, daemon=True).start()

    def _messages(self) -> Iterator[worker_service_pb2.WorkerMessage]:
        while True:
            msg = self.out.get()
            if msg is None:
                return
            yield msg

    def _read(self) -> None:
        try:
            for msg in self.call:
                self.got.put(msg)
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self.ended.set()

    def next(self, kind: str, timeout: float = 10) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no {kind} message within {timeout}s (error: {self.error})"
            try:
                msg = self.got.get(timeout=min(left, 0.1))
            except queue.Empty:
                assert not self.ended.is_set() or not self.got.empty(), (
                    f"the stream ended waiting for {kind}: {self.error}"
                )
                continue
            if msg.WhichOneof("kind") == kind:
                return getattr(msg, kind)
            if (
                kind == "results"
                and msg.WhichOneof("kind") == "assignments"
                and msg.assignments.HasField("results")
            ):
                return msg.assignments.results

    def close(self) -> None:
        self.out.put(None)
        self.call.cancel()


def token_id(token: str) -> str:
    return token.split("_")[1]


def test_a_revoked_token_ends_its_open_stream_within_the_recheck_interval(
    server: AuthServer, stubs: Stubs, tokens: Tokens
) -> None:
    assert server.node is not None
    stream = RawStream(stubs, tokens.acme_worker, "acme-w1", ["acme/main"])
    try:
        stream.next("welcome")
        # Revoked through the store, as through another member: no cache of
        # this node is told.
        server.node.store.revoke_token(token_id(tokens.acme_worker), server.node.now_ms())
        revoked = time.monotonic()
        assert stream.ended.wait(RECHECK_S + SLACK_S + 5)
        assert stream.error is not None
        assert stream.error.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "revoked" in (stream.error.details() or "")
        assert stream.ended_at - revoked <= RECHECK_S + SLACK_S
    finally:
        stream.close()
    # And the next stream with it is refused at once.
    again = RawStream(stubs, tokens.acme_worker, "acme-w1", ["acme/main"])
    assert again.ended.wait(10)
    assert again.error is not None and again.error.code() == grpc.StatusCode.UNAUTHENTICATED


def test_an_expiring_token_ends_its_open_stream_at_its_expiry(
    server: AuthServer, stubs: Stubs
) -> None:
    assert server.node is not None
    ttl_ms = 1_000
    minted = mint(
        tenant="acme",
        scopes=[WORKER],
        now_ms=server.node.now_ms(),
        ttl_ms=ttl_ms,
        worker_id="acme-w9",
        pools=["acme/main"],
    )
    server.node.store.create_token(minted.record)
    opened = time.monotonic()
    stream = RawStream(stubs, minted.token, "acme-w9", ["acme/main"])
    try:
        stream.next("welcome")
        assert stream.ended.wait(ttl_ms / 1000 + RECHECK_S + SLACK_S + 5)
        assert stream.error is not None
        assert stream.error.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "expired" in (stream.error.details() or "")
        assert stream.ended_at - opened <= ttl_ms / 1000 + RECHECK_S + SLACK_S
    finally:
        stream.close()


def test_no_credential_takes_over_another_workers_session(
    server: AuthServer, stubs: Stubs, tokens: Tokens
) -> None:
    assert server.node is not None
    other = server.mint("acme", WORKER, worker_id="acme-w2", pools=["acme/main"])
    first = RawStream(stubs, tokens.acme_worker, "acme-w1", ["acme/main"])
    try:
        first.next("welcome")
        session = server.node.sessions["acme-w1"]
        for token, pools in ((other, ["acme/main"]), (tokens.operator, ["default"])):
            thief = RawStream(stubs, token, "acme-w1", pools)
            assert thief.ended.wait(10)
            assert thief.error is not None
            assert thief.error.code() in (
                grpc.StatusCode.PERMISSION_DENIED,
                grpc.StatusCode.UNAUTHENTICATED,
            )
        # A pool the credential is not bound to.
        wrong_pool = RawStream(stubs, other, "acme-w2", ["acme/other"])
        assert wrong_pool.ended.wait(10)
        assert wrong_pool.error is not None
        assert wrong_pool.error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "hello.pools" in (wrong_pool.error.details() or "")
        assert server.node.sessions["acme-w1"] is session
        assert not session.closed and not first.ended.is_set()
    finally:
        first.close()


def test_a_run_completed_with_another_workers_credential_is_refused(
    server: AuthServer, stubs: Stubs, tokens: Tokens
) -> None:
    assert server.node is not None
    other = server.mint("acme", WORKER, worker_id="acme-w2", pools=["acme/main"])
    owner_stream = RawStream(stubs, tokens.acme_worker, "acme-w1", ["acme/main"])
    try:
        owner_stream.next("welcome")
        spec = once_spec("run-me", pool="acme/main")
        spec.schedule.once.at_ms = server.node.now_ms()
        submitter = server.mint("acme", JOBS_WRITE)
        stubs.jobs.SubmitJob(
            job_service_pb2.SubmitJobRequest(spec=spec), metadata=md(submitter), timeout=10
        )
        (assignment,) = owner_stream.next("assignments").assignments
        intruder = RawStream(stubs, other, "acme-w2", ["acme/main"])
        try:
            intruder.next("welcome")
            intruder.out.put(
                worker_service_pb2.WorkerMessage(
                    complete=worker_service_pb2.Complete(
                        completions=[
                            worker_service_pb2.Completion(
                                run_id=assignment.run_id,
                                fence=assignment.fence,
                                job_id=assignment.job_id,
                                outcome=worker_service_pb2.OUTCOME_SUCCEEDED,
                            )
                        ]
                    )
                )
            )
            results = intruder.next("results")
            assert [c.run_id for c in results.completions] == [assignment.run_id]
            assert not results.completions[0].accepted
            assert list(results.accepted) == []
        finally:
            intruder.close()
        run = server.node.store.get_run(assignment.run_id)
        assert run.state in (RunState.DISPATCHED, RunState.RUNNING)
        # Its own worker completes it.
        owner_stream.out.put(
            worker_service_pb2.WorkerMessage(
                complete=worker_service_pb2.Complete(
                    completions=[
                        worker_service_pb2.Completion(
                            run_id=assignment.run_id,
                            fence=assignment.fence,
                            job_id=assignment.job_id,
                            outcome=worker_service_pb2.OUTCOME_SUCCEEDED,
                        )
                    ]
                )
            )
        )
        assert list(owner_stream.next("results").accepted) == [assignment.run_id]
        assert server.node.store.get_run(assignment.run_id).state is RunState.SUCCEEDED
    finally:
        owner_stream.close()
