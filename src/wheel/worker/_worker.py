"""The worker SDK: hold one lease stream per node, run handlers, report outcomes.

Protocol (``worker_service.proto``): the worker says Hello (id, capacity,
pools, handler names), the node answers Welcome (lease and heartbeat timing)
and then pushes Assignments while the worker has credit. Credit is kept by the
server (capacity minus the runs the worker holds), so the worker never sends
Credit: a completion, a hand-back or a revoke frees the slot.

Rules this module keeps:

1. Everything going out is batched per link: all the acks, completions and
   the due heartbeat gathered in one event-loop turn leave as one message
   each. One writer task per stream owns ``call.write``. An ack waits a
   short while (a tenth of the grace lease, at most ``ACK_DELAY_S``): a run
   that completes first is never acked, its completion says it ran. Short
   runs then cost the node one message and one store write fewer, and the
   grace lease still gets its ack long before it could lapse.
2. A run the server revokes, or whose renewal it rejects, is superseded: its
   async handler is cancelled, a sync handler's result is discarded, and no
   completion is ever sent for it.
3. At most ``capacity`` handlers execute at once, whatever the servers send
   (one process may hold streams to several nodes); the excess waits locally.
4. A lost stream does not stop handlers: their leases may still be valid.
   The link reconnects with backoff and jitter, says Hello again, reports the
   runs it still holds in a heartbeat and re-sends completions the server had
   not confirmed. The server decides what is still valid.
5. All run state is mutated on the event loop thread. Sync handlers run in a
   pool of at most ``capacity`` threads and hand their results back in
   batches (one loop wake-up per batch, not per run).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import importlib
import inspect
import logging
import math
import os
import queue
import random
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc  # type: ignore[import-untyped, unused-ignore]
import grpc.aio  # type: ignore[import-untyped, unused-ignore]

from wheel.errors import InvalidArgument
from wheel.rpc.v1 import worker_service_pb2 as pb
from wheel.rpc.v1 import worker_service_pb2_grpc as pb_grpc

__all__ = [
    "Permanent",
    "Retryable",
    "RunContext",
    "Worker",
    "WorkerStats",
    "load_handler",
    "run_worker",
]

log = logging.getLogger("wheel.worker")

F = TypeVar("F", bound=Callable[..., Any])
Handler = Callable[["RunContext"], Any]

# Error texts are for people; the server keeps them in the run's history.
MAX_ERROR_CHARS = 2_000
# Keeps every message far below gRPC's 4 MB default.
MAX_ITEMS_PER_MESSAGE = 1_000
# Longest an ack waits for the run's completion to make it unneeded (rule 1).
ACK_DELAY_S = 0.1
DEFAULT_HEARTBEAT_S = 1.0
# A node that does not answer Hello within this is treated as down.
WELCOME_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    """What a handler gets: one attempt of one fire."""

    run_id: int
    job_id: int
    handler: str
    tenant: str
    payload: bytes
    # Stable across attempts of the same fire: use it to deduplicate side effects.
    idempotency_key: str
    fence: int
    attempt: int
    scheduled_for_ms: int
    timeout_ms: int
    # time.monotonic() when the run times out (inf: no timeout).
    deadline: float

    @property
    def remaining(self) -> float:
        """Seconds left before the run times out."""
        return self.deadline - time.monotonic()


class Retryable(Exception):
    """Raised by a handler: this attempt failed, retry with backoff."""


class Permanent(Exception):
    """Raised by a handler: failed for good, no retry (dead-letter)."""


@dataclass(slots=True)
class WorkerStats:
    """Counters since the worker started."""

    received: int = 0
    succeeded: int = 0
    # Every failed outcome reported: retryable, permanent, timed out.
    failed: int = 0
    timed_out: int = 0
    # Aborted because the server revoked the run or refused to renew its lease.
    revoked: int = 0
    # Completions the server answered with accepted=False.
    rejected: int = 0
    # Given back unstarted (draining, no such handler): no attempt used.
    handed_back: int = 0
    # Started, then given up at the end of a drain.
    abandoned: int = 0
    reconnects: int = 0


# Run states, local to this process.
_QUEUED = 0  # held, waiting for a free handler slot
_RUNNING = 1  # the handler is executing
_DONE = 2  # outcome decided and queued for the server
_ABORTED = 3  # superseded or stopped: never completed

_SUCCEEDED = pb.OUTCOME_SUCCEEDED
_FAILED = pb.OUTCOME_FAILED
_RETRYABLE = pb.OUTCOME_RETRYABLE
_HANDED_BACK = pb.OUTCOME_HANDED_BACK
_ABANDONED = pb.OUTCOME_ABANDONED
# A completion on its way: run id, fence, outcome, error.
_Done = tuple[int, int, "pb.Outcome", str]


class _Run:
    __slots__ = ("ctx", "fn", "is_async", "link", "state", "task")

    def __init__(self, link: _Link, ctx: RunContext, fn: Handler | None, is_async: bool) -> None:
        self.link = link
        self.ctx = ctx
        self.fn = fn
        self.is_async = is_async
        self.state = _QUEUED
        self.task: asyncio.Task[None] | None = None


def _outcome_of(exc: BaseException) -> tuple[pb.Outcome, str]:
    if isinstance(exc, Permanent):
        return _FAILED, _error_text(exc)
    return _RETRYABLE, _error_text(exc)


def _error_text(exc: BaseException) -> str:
    text = str(exc)
    if not isinstance(exc, Retryable | Permanent) or not text:
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text[:MAX_ERROR_CHARS]


def _is_async(fn: Callable[..., Any]) -> bool:
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


class Worker:
    """Runs registered handlers for the runs wheel nodes assign to it."""

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        worker_id: str | None = None,
        capacity: int = 16,
        pools: Sequence[str] = ("default",),
        reconnect_initial: float = 0.1,
        reconnect_max: float = 10.0,
    ) -> None:
        if capacity < 1:
            raise InvalidArgument("capacity", f"{capacity} is below 1")
        targets = [target] if isinstance(target, str) else list(target)
        if not targets:
            raise InvalidArgument("target", "at least one node address is required")
        self.worker_id = worker_id or (
            f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        )
        self.capacity = capacity
        self.pools = tuple(pools)
        self.reconnect_initial = reconnect_initial
        self.reconnect_max = reconnect_max
        self.stats = WorkerStats()
        self._handlers: dict[str, tuple[Handler, bool]] = {}
        self._links = [_Link(self, t) for t in targets]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._stopped: asyncio.Event | None = None
        self._closing = False
        self._draining = False
        self._started = False
        # Handler admission (rule 3).
        self._waiting: collections.deque[_Run] = collections.deque()
        self._active = 0
        # Sync handlers (rule 5).
        self._jobs: queue.SimpleQueue[_Run | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._sync_inflight = 0
        self._deadlines: list[tuple[float, int, _Run]] = []
        self._deadline_seq = 0
        self._deadline_at = math.inf
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._results: collections.deque[tuple[_Run, pb.Outcome, str]] = collections.deque()
        self._results_lock = threading.Lock()
        self._results_scheduled = False

    # -- registration -------------------------------------------------------------

    def handler(self, name: str | None = None) -> Callable[[F], F]:
        """Decorator registering an async or sync function taking a ``RunContext``."""

        def register(fn: F) -> F:
            self.register(name or fn.__name__, fn)
            return fn

        return register

    def register(self, name: str, fn: Callable[[RunContext], Any]) -> None:
        if not name:
            raise InvalidArgument("handler", "a handler name must not be empty")
        if name in self._handlers:
            raise InvalidArgument("handler", f"{name!r} is already registered")
        self._handlers[name] = (fn, _is_async(fn))

    @property
    def handler_names(self) -> list[str]:
        return sorted(self._handlers)

    @property
    def connected(self) -> int:
        """How many node streams are up right now."""
        return sum(1 for link in self._links if link.connected)

    @property
    def held(self) -> int:
        """Runs this worker holds (waiting or executing)."""
        return sum(len(link.held) for link in self._links)

    # -- lifecycle ----------------------------------------------------------------

    async def run(self) -> None:
        """Hold a stream to every node until ``stop`` or ``drain`` ends the worker."""
        if self._started:
            raise RuntimeError("a Worker runs once")
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._stopped = asyncio.Event()
        if self._closing:
            return
        links = [
            asyncio.create_task(link.run(), name=f"wheel-link-{link.target}")
            for link in self._links
        ]
        try:
            await self._stopped.wait()
        finally:
            self._closing = True
            for t in links:
                t.cancel()
            await asyncio.gather(*links, return_exceptions=True)
            await self._abort_all()

    def stop(self) -> None:
        """Stop now: streams close, async handlers are cancelled, nothing more is sent.
        Safe to call from any thread."""
        loop = self._loop
        if loop is None or self._stopped is None:
            self._closing = True
        elif threading.get_ident() == self._loop_thread:
            self._closing = True
            self._stopped.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop has already closed
                loop.call_soon_threadsafe(self.stop)

    async def drain(self, timeout: float = 30.0) -> None:
        """Leave gracefully: ask every node for no more work, let in-flight runs
        finish, hand back what is still running at ``timeout``, then stop."""
        if self._loop is None or self._closing:
            self.stop()
            return
        self._draining = True
        for link in self._links:
            link.drain_requested = True
            link.wake.set()
        # Runs that never started go back at once: another worker can take them.
        while self._waiting:
            run = self._waiting.popleft()
            if run.state == _QUEUED:
                self._hand_back(run, "worker is draining")
        give_up = time.monotonic() + timeout
        while self.held and time.monotonic() < give_up and not self._closing:
            await asyncio.sleep(0.01)
        for link in self._links:
            for run in list(link.held.values()):
                self._give_up(run)
        # Give the writers a moment to deliver the last outcomes and hear back.
        flush_until = time.monotonic() + 1.0
        while time.monotonic() < flush_until and not self._closing:
            if not any(link.connected and link.unsettled for link in self._links):
                break
            await asyncio.sleep(0.01)
        self.stop()

    async def _abort_all(self) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        self._deadlines.clear()
        tasks = []
        for link in self._links:
            for run in link.held.values():
                run.state = _ABORTED
                if run.task is not None:
                    run.task.cancel()
                    tasks.append(run.task)
            link.held.clear()
        self._waiting.clear()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        for _ in self._threads:
            self._jobs.put(None)

    # -- assignments and admission ----------------------------------------------------

    def _on_assignments(self, link: _Link, assignments: Sequence[pb.Assignment]) -> None:
        now = time.monotonic()
        for a in assignments:
            self.stats.received += 1
            old = link.held.get(a.run_id)
            if old is not None:
                if old.ctx.fence == a.fence:
                    link.acks.append(pb.RunRef(run_id=a.run_id, fence=a.fence))
                    continue
                self._abort(old)  # a newer fence supersedes what we hold
            entry = self._handlers.get(a.handler)
            ctx = RunContext(
                run_id=a.run_id,
                job_id=a.job_id,
                handler=a.handler,
                tenant=a.tenant,
                payload=a.payload,
                idempotency_key=a.idempotency_key,
                fence=a.fence,
                attempt=a.attempt,
                scheduled_for_ms=a.scheduled_for_ms,
                timeout_ms=a.timeout_ms,
                deadline=now + a.timeout_ms / 1000 if a.timeout_ms > 0 else math.inf,
            )
            run = _Run(link, ctx, entry[0] if entry else None, entry[1] if entry else False)
            link.held[a.run_id] = run
            link.defer_ack(run, now)
            if self._draining or self._closing:
                self._hand_back(run, "worker is draining")
            elif entry is None:
                # A server that routes by handler sends none of these; one that
                # raced a change of ours gets it back, no attempt used.
                self._hand_back(run, f"no handler registered for {a.handler!r}")
            else:
                self._waiting.append(run)
        link.wake.set()
        self._admit()

    def _admit(self) -> None:
        while self._waiting and self._active < self.capacity:
            run = self._waiting.popleft()
            if run.state == _QUEUED:
                self._start(run)

    def _start(self, run: _Run) -> None:
        assert self._loop is not None
        run.state = _RUNNING
        self._active += 1
        if run.ctx.deadline != math.inf:
            self._watch_deadline(run)
        if run.is_async:
            run.task = self._loop.create_task(self._run_async(run))
        else:
            self._sync_inflight += 1
            if self._sync_inflight > len(self._threads):
                t = threading.Thread(
                    target=self._thread_main,
                    name=f"wheel-handler-{len(self._threads)}",
                    daemon=True,
                )
                self._threads.append(t)
                t.start()
            self._jobs.put(run)

    async def _run_async(self, run: _Run) -> None:
        assert run.fn is not None
        outcome, error = _SUCCEEDED, ""
        try:
            await run.fn(run.ctx)
        except asyncio.CancelledError:
            # Ours (revoke, timeout, hand-back, stop) unless the run is still live.
            outcome, error = _RETRYABLE, "handler was cancelled"
        except BaseException as exc:
            outcome, error = _outcome_of(exc)
        finally:
            self._active -= 1
        self._finish(run, outcome, error)
        self._admit()

    def _thread_main(self) -> None:
        while True:
            run = self._jobs.get()
            if run is None:
                return
            outcome, error = _SUCCEEDED, ""
            if run.state != _RUNNING:
                outcome, error = _RETRYABLE, "aborted before it started"
            else:
                assert run.fn is not None
                try:
                    result = run.fn(run.ctx)
                    if inspect.isawaitable(result):
                        # A sync-looking callable that returned an awaitable:
                        # run it on the loop, this thread waits for it.
                        assert self._loop is not None
                        asyncio.run_coroutine_threadsafe(_await(result), self._loop).result()
                except BaseException as exc:
                    outcome, error = _outcome_of(exc)
            self._results.append((run, outcome, error))
            with self._results_lock:
                if self._results_scheduled:
                    continue
                self._results_scheduled = True
            loop = self._loop
            if loop is not None:
                with contextlib.suppress(RuntimeError):  # loop closed: nobody to tell
                    loop.call_soon_threadsafe(self._on_sync_results)

    def _on_sync_results(self) -> None:
        with self._results_lock:
            self._results_scheduled = False
        results = self._results
        while results:
            run, outcome, error = results.popleft()
            self._sync_inflight -= 1
            self._active -= 1
            self._finish(run, outcome, error)
        self._admit()

    def _finish(self, run: _Run, outcome: pb.Outcome, error: str) -> None:
        if run.state != _RUNNING:
            return  # superseded, timed out or handed back meanwhile: discard
        run.state = _DONE
        if outcome == _SUCCEEDED:
            self.stats.succeeded += 1
        else:
            self.stats.failed += 1
        run.link.complete(run, outcome, error)

    # Timeouts: one heap and one loop timer for all runs, not a TimerHandle per
    # run. Entries of finished runs are dropped lazily (when they reach the top,
    # or in a compaction once they outnumber the running ones).

    def _watch_deadline(self, run: _Run) -> None:
        assert self._loop is not None
        heap = self._deadlines
        if len(heap) > 2 * self._active + 1024:
            heap[:] = [e for e in heap if e[2].state == _RUNNING]
            heapq.heapify(heap)
        self._deadline_seq += 1
        heapq.heappush(heap, (run.ctx.deadline, self._deadline_seq, run))
        if run.ctx.deadline < self._deadline_at:
            self._arm_deadline_timer(run.ctx.deadline)

    def _arm_deadline_timer(self, at: float) -> None:
        assert self._loop is not None
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        self._deadline_at = at
        # loop.time() is time.monotonic(), the clock of RunContext.deadline.
        self._deadline_timer = self._loop.call_at(at, self._on_deadlines)

    def _on_deadlines(self) -> None:
        assert self._loop is not None
        self._deadline_timer = None
        self._deadline_at = math.inf
        heap = self._deadlines
        now = self._loop.time()
        while heap and (heap[0][0] <= now or heap[0][2].state != _RUNNING):
            _, _, run = heapq.heappop(heap)
            self._on_timeout(run)
        if heap:
            self._arm_deadline_timer(heap[0][0])

    def _on_timeout(self, run: _Run) -> None:
        if run.state != _RUNNING:
            return
        run.state = _DONE
        self.stats.timed_out += 1
        self.stats.failed += 1
        run.link.complete(run, _RETRYABLE, f"timed out after {run.ctx.timeout_ms} ms")
        if run.task is not None:
            run.task.cancel()

    def _abort(self, run: _Run) -> None:
        """Superseded (rule 2): stop it and never complete it."""
        run.link.held.pop(run.ctx.run_id, None)
        if run.state in (_DONE, _ABORTED):
            return
        run.state = _ABORTED
        self.stats.revoked += 1
        if run.task is not None:
            run.task.cancel()

    def _hand_back(self, run: _Run, why: str) -> None:
        """Give back a run whose handler never started: another worker gets
        it with the same attempt and fence."""
        if run.state != _QUEUED:
            return
        run.state = _DONE
        self.stats.handed_back += 1
        run.link.complete(run, _HANDED_BACK, why)

    def _give_up(self, run: _Run) -> None:
        """Stop waiting for a run at the end of a drain: one never started is
        handed back; one whose handler started is abandoned (its effect is
        unknown: the node dispatches it again with a new fence, or marks an
        at_most_once run unknown). A sync handler's thread cannot be stopped;
        its result is discarded."""
        if run.state == _QUEUED:
            self._hand_back(run, "worker is draining")
            return
        if run.state in (_DONE, _ABORTED):
            return
        run.state = _DONE
        self.stats.abandoned += 1
        if run.task is not None:
            run.task.cancel()
        run.link.complete(run, _ABANDONED, "worker stopped before the handler finished")


async def _await(aw: Any) -> None:
    await aw


class _Link:
    """One node: its stream across reconnects and the runs it assigned us."""

    _welcome: pb.Welcome
    # How long a run may go unacked: a run done sooner needs no ack at all.
    ack_delay: float

    def __init__(self, worker: Worker, target: str) -> None:
        self.worker = worker
        self.target = target
        self.held: dict[int, _Run] = {}
        self.acks: list[pb.RunRef] = []
        # Acks held back until their time (rule 1), in the order they are due.
        self.later_acks: collections.deque[tuple[float, _Run]] = collections.deque()
        self._ack_timer: asyncio.TimerHandle | None = None
        # (run id, fence, outcome, error): built into messages in place when sent.
        self.completions: list[_Done] = []
        # Sent but not yet answered in Results; re-sent after a reconnect.
        self.unconfirmed: dict[int, tuple[_Done, float]] = {}
        self.heartbeat_due = False
        self.drain_requested = False
        self.drain_sent = False
        self.connected = False
        self.welcomed = False
        self.welcome = pb.Welcome()
        self.wake = asyncio.Event()

    @property
    def unsettled(self) -> bool:
        return bool(self.completions or self.unconfirmed)

    @property
    def welcome(self) -> pb.Welcome:
        return self._welcome

    @welcome.setter
    def welcome(self, welcome: pb.Welcome) -> None:
        self._welcome = welcome
        grace = welcome.grace_lease_ms / 10_000
        # Read for every run received: worked out once per Welcome.
        self.ack_delay = min(ACK_DELAY_S, grace) if grace > 0 else ACK_DELAY_S

    def defer_ack(self, run: _Run, now: float) -> None:
        self.later_acks.append((now + self.ack_delay, run))
        if self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(self.ack_delay, self._acks_due)

    def _acks_due(self) -> None:
        self._ack_timer = None
        self.wake.set()

    def _due_acks(self) -> None:
        """Move the acks whose time came into ``acks``; drop the ones whose
        run completed (or was aborted) meanwhile."""
        later = self.later_acks
        now = time.monotonic()
        while later and later[0][0] <= now:
            _, run = later.popleft()
            ctx = run.ctx
            if self.held.get(ctx.run_id) is run:
                self.acks.append(pb.RunRef(run_id=ctx.run_id, fence=ctx.fence))
        if later and self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(
                max(0.0, later[0][0] - now), self._acks_due
            )

    def complete(self, run: _Run, outcome: pb.Outcome, error: str) -> None:
        self.held.pop(run.ctx.run_id, None)
        self.completions.append((run.ctx.run_id, run.ctx.fence, outcome, error))
        self.wake.set()

    async def run(self) -> None:
        failures = 0
        while not self.worker._closing:
            self.welcomed = False
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                log.info("stream to %s ended: %s %s", self.target, exc.code().name, exc.details())
            except TimeoutError:
                log.warning("%s did not answer Hello in %.0f s", self.target, WELCOME_TIMEOUT_S)
            except Exception:
                log.exception("stream to %s failed", self.target)
            welcomed = self.welcomed
            self.connected = False
            if self.worker._closing:
                return
            failures = 1 if welcomed else failures + 1
            ceiling = min(
                self.worker.reconnect_max, self.worker.reconnect_initial * 2 ** (failures - 1)
            )
            # Equal jitter: never a thundering herd, never a zero wait.
            await asyncio.sleep(ceiling / 2 + random.uniform(0, ceiling / 2))
            self.worker.stats.reconnects += 1

    async def _session(self) -> None:
        """One stream, from Hello to its end (``welcomed`` says if it got that far)."""
        w = self.worker
        async with grpc.aio.insecure_channel(self.target) as channel:
            call = pb_grpc.WorkerServiceStub(channel).Connect()
            try:
                await call.write(
                    pb.WorkerMessage(
                        hello=pb.Hello(
                            worker_id=w.worker_id,
                            capacity=w.capacity,
                            pools=list(w.pools),
                            handlers=w.handler_names,
                        )
                    )
                )
                first = await asyncio.wait_for(call.read(), WELCOME_TIMEOUT_S)
                if first is grpc.aio.EOF:
                    return
                if first.WhichOneof("kind") != "welcome":
                    self._on_message(first)
                    log.warning("%s did not answer Hello with Welcome; reconnecting", self.target)
                    return
                self.welcome = first.welcome
                self.welcomed = True
                self.connected = True
                log.info("connected to %s (node %s)", self.target, self.welcome.node_id)
                # Rule 4: what the last stream left unsettled goes out first.
                resend = [c for c, _ in self.unconfirmed.values()]
                self.unconfirmed.clear()
                self.completions[:0] = resend
                self.drain_sent = False
                self.heartbeat_due = True
                self.wake.set()
                interval = self.welcome.heartbeat_interval_ms / 1000 or (
                    self.welcome.lease_ms / 3000 or DEFAULT_HEARTBEAT_S
                )
                tasks = [
                    asyncio.create_task(self._reader(call)),
                    asyncio.create_task(self._writer(call)),
                    asyncio.create_task(self._heartbeats(interval)),
                ]
                try:
                    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for t in tasks:
                        t.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                for t in done:
                    t.result()  # re-raise the stream error, if any
            finally:
                self.connected = False
                call.cancel()

    async def _reader(self, call: Any) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                log.info("%s closed the stream", self.target)
                return
            self._on_message(msg)

    def _on_message(self, msg: pb.ServerMessage) -> None:
        kind = msg.WhichOneof("kind")
        w = self.worker
        if kind == "assignments":
            w._on_assignments(self, msg.assignments.assignments)
            if msg.assignments.HasField("results"):
                self._on_results(msg.assignments.results)
        elif kind == "revokes":
            for r in msg.revokes.revokes:
                self._supersede(r.run_id, r.fence)
        elif kind == "results":
            self._on_results(msg.results)
        elif kind == "error":
            e = msg.error
            log.warning(
                "protocol error from %s: %s %s (run %d)", self.target, e.code, e.message, e.run_id
            )
        elif kind == "welcome":
            self.welcome = msg.welcome

    def _on_results(self, results: pb.Results) -> None:
        for run_id in results.accepted:
            self.unconfirmed.pop(run_id, None)
        for c in results.completions:
            self.unconfirmed.pop(c.run_id, None)
            if not c.accepted:
                self.worker.stats.rejected += 1
                log.info(
                    "%s rejected the completion of run %d: %s", self.target, c.run_id, c.reason
                )
        for ref in results.rejected_renewals:
            self._supersede(ref.run_id, ref.fence)

    def _supersede(self, run_id: int, fence: int) -> None:
        run = self.held.get(run_id)
        if run is not None and (fence == 0 or run.ctx.fence == fence):
            self.worker._abort(run)

    async def _writer(self, call: Any) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            # Let the rest of this loop turn land in the same batch (rule 1).
            await asyncio.sleep(0)
            for msg in self._take():
                await call.write(msg)

    def _take(self) -> list[pb.WorkerMessage]:
        out: list[pb.WorkerMessage] = []
        self._due_acks()
        if self.acks:
            acks, self.acks = self.acks, []
            for i in range(0, len(acks), MAX_ITEMS_PER_MESSAGE):
                out.append(pb.WorkerMessage(ack=pb.Ack(runs=acks[i : i + MAX_ITEMS_PER_MESSAGE])))
        if self.completions:
            done, self.completions = self.completions, []
            now = time.monotonic()
            for c in done:
                self.unconfirmed[c[0]] = (c, now)
            for i in range(0, len(done), MAX_ITEMS_PER_MESSAGE):
                msg = pb.WorkerMessage()
                add = msg.complete.completions.add
                for run_id, fence, outcome, error in done[i : i + MAX_ITEMS_PER_MESSAGE]:
                    add(run_id=run_id, fence=fence, outcome=outcome, error=error)
                out.append(msg)
        if self.heartbeat_due:
            self.heartbeat_due = False
            refs = [pb.RunRef(run_id=r.ctx.run_id, fence=r.ctx.fence) for r in self.held.values()]
            out.append(pb.WorkerMessage(heartbeat=pb.Heartbeat(runs=refs)))
        if self.drain_requested and not self.drain_sent:
            self.drain_sent = True
            out.append(pb.WorkerMessage(drain=pb.Drain()))
        return out

    async def _heartbeats(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.heartbeat_due = True
            self.wake.set()
            # A server that never answers some completion must not grow this forever:
            # past two leases the run has been reaped anyway.
            horizon = time.monotonic() - 2 * max(self.welcome.lease_ms / 1000, interval)
            stale = [rid for rid, (_, sent) in self.unconfirmed.items() if sent < horizon]
            for rid in stale:
                del self.unconfirmed[rid]


# -- running a worker process ------------------------------------------------------------


def run_worker(
    target: str | Sequence[str],
    handlers: Mapping[str, Callable[[RunContext], Any]],
    *,
    capacity: int = 16,
    worker_id: str | None = None,
    pools: Sequence[str] = ("default",),
    drain_timeout: float = 30.0,
) -> None:
    """Run a worker until SIGTERM/SIGINT (drain gracefully; a second signal stops now)."""
    worker = Worker(target, worker_id=worker_id, capacity=capacity, pools=pools)
    for name, fn in handlers.items():
        worker.register(name, fn)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        draining: list[asyncio.Task[None]] = []

        def on_signal() -> None:
            if draining:
                worker.stop()
            else:
                log.info("draining (up to %.0f s); signal again to stop now", drain_timeout)
                draining.append(loop.create_task(worker.drain(drain_timeout)))

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        try:
            await worker.run()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            for t in draining:
                t.cancel()
            await asyncio.gather(*draining, return_exceptions=True)

    asyncio.run(main())


def load_handler(spec: str) -> tuple[str, Callable[[RunContext], Any]]:
    """Resolve ``"pkg.mod:func"`` or ``"name=pkg.mod:func"`` to (name, function).

    The name defaults to the function's ``__name__``; ``func`` may be dotted
    (``pkg.mod:Class.method``).
    """
    name, sep, ref = spec.partition("=")
    if not sep or ":" in name:
        name, ref = "", spec
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise InvalidArgument(
            "handler", f"{spec!r} is not 'module:function' or 'name=module:function'"
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgument("handler", f"cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InvalidArgument("handler", f"{module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise InvalidArgument("handler", f"{spec!r} is not callable")
    return name or getattr(obj, "__name__", attr.rsplit(".", 1)[-1]), obj
