"""WorkerService: the lease stream, and how an owner's actions become one
message per worker per loop iteration."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from wheel.auth import Authenticator, Principal
from wheel.engine.model import HTTP_HANDLER
from wheel.engine.owner import Actions, Assignment, CompletionResult, Outcome
from wheel.engine.spec import DEFAULT_LIMITS
from wheel.errors import StoreError, Unauthenticated
from wheel.node import Membership, MovedRun, Node, SignError, WorkerSession
from wheel.rpc._common import (
    MAX_CAPACITY,
    MAX_HANDLERS,
    MAX_PENDING_MESSAGES,
    MAX_RETURNED_RUNS,
    MAX_WORKER_ID,
)
from wheel.rpc._guard import Guard
from wheel.rpc.convert import wire_attempt
from wheel.rpc.v1 import (
    cluster_pb2,
    jobs_pb2,
    worker_service_pb2,
    worker_service_pb2_grpc,
)
from wheel.runresult import checked_result, clamp_retry_after

log = logging.getLogger("wheel.rpc")

# Signs one attempt: (tenant, secret name, webhook id, body) -> its Standard
# Webhooks headers, or ``SignError`` (``Node.signed_headers``).
Signer = Callable[[str, str, str, bytes], list[tuple[str, str]]]


class _CredentialEnded:
    """Put in a session's outbox when its credential was revoked or expired:
    the stream ends with UNAUTHENTICATED."""

    def __init__(self, message: str) -> None:
        self.message = message


class WorkerServicer(worker_service_pb2_grpc.WorkerServiceServicer):
    """The lease stream. A bad message gets a ProtocolError for that message; it
    never affects other runs or other workers.

    With ``--auth`` a stream needs a worker credential bound to the Hello's
    worker id and to every pool it names (PERMISSION_DENIED otherwise), so no
    other credential can take over its session or complete its runs (those
    would be another worker's runs, which the owner rejects). The credential
    is checked again every ``recheck_s`` (and at its expiry) while the stream
    is open: revoked or expired, the stream ends with UNAUTHENTICATED."""

    def __init__(self, node: Node, guard: Guard | None = None) -> None:
        self.node = node
        self.guard = guard or Guard(None)

    async def Connect(
        self,
        request_iterator: AsyncIterator[worker_service_pb2.WorkerMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[worker_service_pb2.ServerMessage]:
        node = self.node
        await node.ready.wait()
        try:
            first = await request_iterator.__anext__()
        except StopAsyncIteration:
            return
        hello = first.hello
        problem = _check_hello(first)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
            return
        principal = await self.guard.principal(context)
        if principal is not None:
            problem = _check_binding(principal, hello)
            if problem is not None:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, problem)
                return
        session = node.attach_worker(
            hello.worker_id,
            hello.capacity,
            list(hello.pools) or ["default"],
            handlers=list(hello.handlers),
        )
        session.columns = hello.columns
        session.traced_columns = hello.columns and hello.traced_columns
        cfg = node.config.owner
        yield worker_service_pb2.ServerMessage(
            welcome=worker_service_pb2.Welcome(
                node_id=node.config.node_id,
                grace_lease_ms=cfg.grace_lease_ms,
                lease_ms=cfg.lease_ms,
                heartbeat_interval_ms=cfg.heartbeat_interval_ms,
                membership=membership_to_proto(node.membership()),
                columns=True,
            )
        )
        reader = asyncio.create_task(self._read(session, request_iterator))
        watcher = None
        if principal is not None and self.guard.auth is not None:
            watcher = asyncio.create_task(_watch(self.guard.auth, principal, session))
        try:
            while True:
                msg = await session.outbox.get()
                if msg is None:
                    break
                if isinstance(msg, _CredentialEnded):
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, msg.message)
                assert isinstance(msg, worker_service_pb2.ServerMessage)
                yield msg
        finally:
            for task in (reader, watcher):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            node.detach_worker(session)

    async def _read(
        self,
        session: WorkerSession,
        requests: AsyncIterator[worker_service_pb2.WorkerMessage],
    ) -> None:
        node = self.node
        wid = session.worker_id
        try:
            async for msg in requests:
                if session.closed:
                    break
                kind = msg.WhichOneof("kind")
                if kind == "ack":
                    node.worker_ack(wid, self._here(session, msg.ack.runs))
                elif kind == "heartbeat":
                    node.worker_heartbeat(wid, self._here(session, msg.heartbeat.runs))
                elif kind == "complete":
                    done = []
                    ran_ms: dict[int, int] = {}
                    results: dict[int, str] = {}
                    retry_after_ms: dict[int, int] = {}
                    for c in self._here(session, msg.complete.completions, full=True):
                        if c.outcome not in _OUTCOMES:
                            _protocol_error(
                                session,
                                "INVALID_ARGUMENT",
                                f"completions.outcome: unknown value {c.outcome}",
                                c.run_id,
                            )
                            continue
                        done.append((c.run_id, c.fence, _OUTCOMES[c.outcome], c.error[:4000]))
                        if c.ran_ms > 0:
                            ran_ms[c.run_id] = c.ran_ms
                        if c.result_json:
                            results[c.run_id] = checked_result(c.result_json)
                        if c.retry_after_ms > 0:
                            retry_after_ms[c.run_id] = clamp_retry_after(c.retry_after_ms)
                    if msg.complete.HasField("columns"):
                        self._columns_here(session, msg.complete.columns, done, ran_ms)
                    if done:
                        node.worker_complete(wid, done, ran_ms, results, retry_after_ms)
                elif kind == "credit":
                    held = node.worker_capacity(wid)
                    if held is None or not 0 <= held + msg.credit.add <= MAX_CAPACITY:
                        _protocol_error(
                            session,
                            "INVALID_ARGUMENT",
                            f"credit.add: {msg.credit.add} would take the capacity outside"
                            f" [0, {MAX_CAPACITY}]",
                            0,
                        )
                    else:
                        node.worker_credit(wid, msg.credit.add, msg.credit.seq)
                elif kind == "drain":
                    node.worker_drain(wid)
                elif kind == "returned" and len(msg.returned.runs) > MAX_RETURNED_RUNS:
                    _protocol_error(
                        session,
                        "INVALID_ARGUMENT",
                        f"returned.runs: {len(msg.returned.runs)} runs is over the limit of"
                        f" {MAX_RETURNED_RUNS} a message",
                        0,
                    )
                elif kind == "returned":
                    # Any node, the runs' owner or not: the store checks each
                    # run. With credentials, only runs acked by this worker:
                    # another's run not acked yet is not its to give back.
                    node.release_returned(
                        wid,
                        [(r.run_id, r.fence) for r in msg.returned.runs],
                        acked_only=self.guard.auth is not None,
                    )
                else:
                    _protocol_error(
                        session, "INVALID_ARGUMENT", f"unexpected message {kind!r} after hello", 0
                    )
        finally:
            session.outbox.put_nowait(None)

    def _columns_here(
        self,
        session: WorkerSession,
        cols: worker_service_pb2.CompletionColumns,
        done: list[tuple[int, int, Outcome, str]],
        ran_ms: dict[int, int],
    ) -> None:
        """Completions sent as columns (none has an error, a result or a
        Retry-After): those whose shard this node holds go into ``done`` and
        ``ran_ms``, the others are answered with ``Results.moved`` as in
        ``_here``."""
        run_ids, fences, job_ids = list(cols.run_id), list(cols.fence), list(cols.job_id)
        outcomes, ran = list(cols.outcome), list(cols.ran_ms)
        if not len(fences) == len(job_ids) == len(outcomes) == len(ran) == len(run_ids):
            _protocol_error(
                session, "INVALID_ARGUMENT", "complete.columns: columns of different lengths", 0
            )
            return
        node = self.node
        moved: list[MovedRun] = []
        for run_id, fence, job_id, outcome, ms in zip(
            run_ids, fences, job_ids, outcomes, ran, strict=True
        ):
            home = node.run_home(job_id) if job_id else None
            if home is not None:
                moved.append(MovedRun(run_id, fence, job_id, home))
                continue
            known = _OUTCOMES.get(outcome)
            if known is None:
                _protocol_error(
                    session,
                    "INVALID_ARGUMENT",
                    f"complete.columns.outcome: unknown value {outcome}",
                    run_id,
                )
                continue
            done.append((run_id, fence, known, ""))
            if ms > 0:
                ran_ms[run_id] = ms
        if moved:
            send_moved(session, moved)

    def _here(
        self, session: WorkerSession, refs: Sequence[Any], *, full: bool = False
    ) -> list[Any]:
        """Of the runs a worker names (RunRefs, or Completions with ``full``),
        those whose shard this node holds, as (run id, fence) pairs (or the
        messages themselves with ``full``). The others are answered at once
        with ``Results.moved``, naming their shard's owner: not a rejection,
        the worker reports them there."""
        node = self.node
        here: list[Any] = []
        moved: list[MovedRun] = []
        for ref in refs:
            home = node.run_home(ref.job_id) if ref.job_id else None
            if home is None:
                here.append(ref if full else (ref.run_id, ref.fence))
            else:
                moved.append(MovedRun(ref.run_id, ref.fence, ref.job_id, home))
        if moved:
            send_moved(session, moved)
        return here


def membership_to_proto(view: Membership) -> cluster_pb2.Membership:
    return cluster_pb2.Membership(
        members=[cluster_pb2.Member(node_id=m.node_id, address=m.address) for m in view.members],
        shard_owners=view.shard_owners,
        version=view.version,
    )


def send_moved(session: WorkerSession, runs: Sequence[MovedRun]) -> None:
    """Tell a worker stream where runs report now: runs of shards this
    node handed over, or does not hold."""
    msg = worker_service_pb2.ServerMessage()
    for r in runs:
        msg.results.moved.add(
            run_id=r.run_id,
            fence=r.fence,
            job_id=r.job_id,
            owner_node_id=r.owner.node_id,
            owner_address=r.owner.address,
        )
    session.outbox.put_nowait(msg)


def send_membership(session: WorkerSession, view: Membership) -> None:
    """Push the cluster's new view on one worker stream."""
    session.outbox.put_nowait(
        worker_service_pb2.ServerMessage(membership=membership_to_proto(view))
    )


_OUTCOMES = {
    worker_service_pb2.OUTCOME_SUCCEEDED: Outcome.SUCCEEDED,
    worker_service_pb2.OUTCOME_FAILED: Outcome.FAILED,
    worker_service_pb2.OUTCOME_RETRYABLE: Outcome.RETRYABLE,
    worker_service_pb2.OUTCOME_HANDED_BACK: Outcome.HANDED_BACK,
    worker_service_pb2.OUTCOME_ABANDONED: Outcome.ABANDONED,
}


def _check_hello(msg: worker_service_pb2.WorkerMessage) -> str | None:
    if msg.WhichOneof("kind") != "hello":
        return "the first message on a Connect stream must be hello"
    h = msg.hello
    if not h.worker_id:
        return "hello.worker_id: must not be empty"
    if len(h.worker_id) > MAX_WORKER_ID:
        return f"hello.worker_id: longer than {MAX_WORKER_ID} characters"
    # 0 is a worker of several nodes with all its capacity given to others.
    if not 0 <= h.capacity <= MAX_CAPACITY:
        return f"hello.capacity: {h.capacity} is outside [0, {MAX_CAPACITY}]"
    if len(h.handlers) > MAX_HANDLERS:
        return f"hello.handlers: {len(h.handlers)} names is over the limit of {MAX_HANDLERS}"
    limit = DEFAULT_LIMITS.max_handler_len
    for name in h.handlers:
        if not name or len(name) > limit:
            return f"hello.handlers: {name!r} is empty or longer than {limit} characters"
    return None


def _check_binding(principal: Principal, hello: worker_service_pb2.Hello) -> str | None:
    """Why this credential may not open this worker's stream, if it may not."""
    if principal.worker_id is None:
        return "hello.worker_id: this credential is not bound to a worker id"
    if hello.worker_id != principal.worker_id:
        return f"hello.worker_id: this credential is bound to worker {principal.worker_id!r}"
    for pool in list(hello.pools) or ["default"]:
        if pool not in principal.pools:
            return f"hello.pools: this credential may not serve pool {pool!r}"
    return None


async def _watch(auth: Authenticator, principal: Principal, session: WorkerSession) -> None:
    """Re-check an open stream's credential until it fails; then end the stream."""
    while not session.closed:
        await asyncio.sleep(auth.seconds_to_recheck(principal))
        try:
            await auth.recheck(principal)
        except Unauthenticated as exc:
            session.outbox.put_nowait(_CredentialEnded(str(exc)))
            return
        except StoreError as exc:  # the store is down: keep the stream, ask again
            log.warning("re-checking worker %s's credential failed: %s", session.worker_id, exc)


def _protocol_error(session: WorkerSession, code: str, message: str, run_id: int) -> None:
    if session.outbox.qsize() > MAX_PENDING_MESSAGES:
        # A client that floods bad messages and reads none of the answers: end
        # its stream rather than buffer without bound (other streams go on).
        session.closed = True
        session.outbox.put_nowait(None)
        return
    session.outbox.put_nowait(
        worker_service_pb2.ServerMessage(
            error=worker_service_pb2.ProtocolError(code=code, message=message, run_id=run_id)
        )
    )


# Longest a worker's accepted completions wait to ride with its next
# assignments. A store batch's runs go to one worker (``OwnerConfig.
# hand_out_chunk``), so the batch that records a worker's completions
# often hands out to another: answered at once, each such answer was a
# message of its own, a round of the stream (~0.5 ms of CPU each side at
# 50 rounds/s, ``benchmarks/transport.py``). Nothing waits on an
# accepted answer but the worker's memory of what to resend on a
# reconnect; a rejection, a credit change and a refused renewal still go
# at once.
RESULTS_HOLD_S = 0.06


def send_actions(
    session: WorkerSession,
    acts: Actions,
    sign: Signer | None = None,
    trace: Callable[[Assignment, str], str] | None = None,
) -> None:
    """One message per worker per loop iteration (batching): its assignments
    carry the answers to its completions; revokes go on their own. With
    ``sign``, each run of an HTTP target with a signing secret is signed as
    it is handed out (``sign_http``); with ``trace`` (tracing on), each
    carries its dispatch span's ``traceparent`` (``trace(run, its
    idempotency key)``)."""
    wid = session.worker_id
    put = session.outbox.put_nowait
    results = acts.results.get(wid)
    rejected = acts.rejected_renewals.get(wid)
    assignments = acts.assignments.get(wid)
    # After the assignments it follows (the worker reads a message's
    # assignments before its results).
    credited = acts.credited.get(wid, 0)
    if (
        results
        and not assignments
        and not rejected
        and not credited
        and all(r.accepted for r in results)
    ):
        _hold(session, results)
        results = None
    elif session.held:
        results = _take_held(session) + list(results or ())
    if assignments:
        msg = worker_service_pb2.ServerMessage()
        if session.columns and (trace is None or session.traced_columns):
            assignments = _fill_columns(msg.assignments, assignments, sign, trace)
        # add() builds each in place: a message per run built apart and then
        # copied into the list cost twice as much (4.7 against 2.6 us a run).
        add = msg.assignments.assignments.add
        for a in assignments:
            out = add(
                run_id=a.run_id,
                job_id=a.job_id,
                handler=a.handler,
                scheduled_for_ms=a.scheduled_for,
                attempt=wire_attempt(a.attempt),
                fence=a.fence,
                idempotency_key=a.idempotency_key,
                payload=a.payload,
                lease_ms=a.lease_ms,
                timeout_ms=a.timeout_ms,
                tenant=a.tenant,
            )
            if a.handler == HTTP_HANDLER and sign is not None:
                sign_http(out, sign)
            if trace is not None:
                out.traceparent = trace(a, out.idempotency_key)
        if results or rejected or credited:
            _fill_results(msg.assignments.results, results or (), rejected or (), credited)
        put(msg)
    elif results or rejected or credited:
        msg = worker_service_pb2.ServerMessage()
        _fill_results(msg.results, results or (), rejected or (), credited)
        put(msg)
    revokes = acts.revokes.get(wid)
    if revokes:
        put(
            worker_service_pb2.ServerMessage(
                revokes=worker_service_pb2.Revokes(
                    revokes=[
                        worker_service_pb2.Revoke(
                            run_id=r.run_id,
                            fence=r.fence,
                            reason=worker_service_pb2.RevokeReason.Name(int(r.reason)),
                        )
                        for r in revokes
                    ]
                )
            )
        )
    for v in acts.violations.get(wid, ()):
        _protocol_error(session, v.code, v.message, v.run_id)


def _fill_columns(
    out: worker_service_pb2.Assignments,
    assignments: Sequence[Assignment],
    sign: Signer | None,
    trace: Callable[[Assignment, str], str] | None = None,
) -> list[Assignment]:
    """The runs as ``out.columns``, a list per field extended once (about a
    fifth of a message built per run), with ``trace`` each one's
    ``traceparent``; returns those that need a message of their own: an HTTP
    target's run to sign."""
    run_id: list[int] = []
    job_id: list[int] = []
    handler: list[str] = []
    scheduled_for: list[int] = []
    attempt: list[int] = []
    fence: list[int] = []
    key: list[str] = []
    payload: list[bytes] = []
    lease_ms: list[int] = []
    timeout_ms: list[int] = []
    tenant: list[str] = []
    traceparent: list[str] = []
    apart: list[Assignment] = []
    for a in assignments:
        if a.handler == HTTP_HANDLER and sign is not None:
            apart.append(a)
            continue
        run_id.append(a.run_id)
        job_id.append(a.job_id)
        handler.append(a.handler)
        scheduled_for.append(a.scheduled_for)
        attempt.append(wire_attempt(a.attempt))
        fence.append(a.fence)
        k = a.idempotency_key
        key.append(k)
        payload.append(a.payload)
        lease_ms.append(a.lease_ms)
        timeout_ms.append(a.timeout_ms)
        tenant.append(a.tenant)
        if trace is not None:
            traceparent.append(trace(a, k))
    if run_id:
        cols = out.columns
        cols.run_id.extend(run_id)
        cols.job_id.extend(job_id)
        cols.handler.extend(handler)
        cols.scheduled_for_ms.extend(scheduled_for)
        cols.attempt.extend(attempt)
        cols.fence.extend(fence)
        cols.idempotency_key.extend(key)
        cols.payload.extend(payload)
        cols.lease_ms.extend(lease_ms)
        cols.timeout_ms.extend(timeout_ms)
        cols.tenant.extend(tenant)
        if traceparent:
            cols.traceparent.extend(traceparent)
    return apart


def sign_http(out: worker_service_pb2.Assignment, sign: Signer) -> None:
    """Sign a hand-out of an HTTP target (its payload an ``HttpCall``) whose
    target names a signing secret: ``signed_headers`` by every version of
    the secret still signing, ``webhook-id`` the fire's idempotency key (the
    same on every attempt of the fire) and ``webhook-timestamp`` this
    hand-out's second. A run that cannot be signed here gets ``sign_error``
    instead, and its worker fails it as retryable without sending it."""
    try:
        call = jobs_pb2.HttpCall.FromString(out.payload)
    except DecodeError:
        out.sign_error = "payload: a run of handler 'http' whose payload is no HttpCall"
        return
    name = call.target.signing_secret
    if not name:
        return
    try:
        headers = sign(out.tenant, name, out.idempotency_key, call.body)
    except SignError as exc:
        out.sign_error = str(exc)
        return
    for key, value in headers:
        out.signed_headers.add(name=key, value=value)


def _hold(session: WorkerSession, results: Sequence[CompletionResult]) -> None:
    session.held.extend(results)
    if session.held_timer is None:
        session.held_timer = asyncio.get_running_loop().call_later(
            RESULTS_HOLD_S, _send_held, session
        )


def _take_held(session: WorkerSession) -> list[CompletionResult]:
    held = session.held
    session.held = []
    if session.held_timer is not None:
        session.held_timer.cancel()
        session.held_timer = None
    return held


def _send_held(session: WorkerSession) -> None:
    """No assignments came for the worker in time: its answers go alone."""
    session.held_timer = None
    held = _take_held(session)
    if held and not session.closed:
        msg = worker_service_pb2.ServerMessage()
        _fill_results(msg.results, held, ())
        session.outbox.put_nowait(msg)


def _fill_results(
    out: worker_service_pb2.Results,
    results: Sequence[CompletionResult],
    rejected: Sequence[tuple[int, int]],
    credited: int = 0,
) -> None:
    out.credit_seq = credited
    out.accepted.extend([r.run_id for r in results if r.accepted])
    for r in results:
        if not r.accepted:
            out.completions.add(run_id=r.run_id, accepted=False, reason=r.reason)
    for run_id, fence in rejected:
        out.rejected_renewals.add(run_id=run_id, fence=fence)
