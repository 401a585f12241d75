"""The runs a worker holds and the execution of their handlers.

``Runner`` admits runs to at most ``capacity`` executing handlers (the rest
wait locally), runs async handlers as tasks and sync ones in a pool of threads
that hand results back in batches, and times runs out from one heap. An async
handler that cannot suspend (its body has no ``await``, ``async for`` or
``async with``: no point where its coroutine could yield) is run to its end
at once, with no task: a batch of a hundred such runs costs the loop one turn,
not a hundred tasks. It knows nothing of streams: every outcome goes to
``report``, which the worker routes to the node the run reports to now.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import dis
import heapq
import inspect
import json
import logging
import math
import queue
import threading
import time
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from wheel.codec import CodecError, PayloadCodec
from wheel.logs import ids, redact
from wheel.rpc.v1 import worker_service_pb2 as pb
from wheel.runresult import MAX_RESULT_BYTES
from wheel.worker import _tracing as spans
from wheel.worker._api import (
    Handler,
    Permanent,
    Retryable,
    RunContext,
    WorkerStats,
    current_run,
)

if TYPE_CHECKING:
    from wheel.worker._httptarget import Finish

log = logging.getLogger("wheel.worker")


class HttpRunner(Protocol):
    """The built-in ``http`` handler (``wheel.worker._http.HttpExecutor``):
    it sends a run's request and calls ``done(run, finish)`` once, later,
    with how the run ended."""

    def start(self, run: Run, done: Callable[[Run, Finish], object]) -> None: ...


class Holder(Protocol):
    """What a run asks of the link (``wheel.worker._link.Link``) it came on:
    the runs it holds, and where its completion goes."""

    held: dict[int, Run]

    def complete(self, done: Done) -> None: ...


# Error texts are for people; the server keeps them in the run's history, up
# to this many characters (it cuts a longer one: ``wheel.rpc._workers``).
MAX_ERROR_CHARS = 4_000
# Of which the exception's message takes at most this many.
MAX_MESSAGE_CHARS = 1_000

# Run states, local to this process.
QUEUED = 0  # held, waiting for a free handler slot
RUNNING = 1  # the handler is executing
DONE = 2  # outcome decided and queued for the server
ABORTED = 3  # superseded or stopped: never completed

SUCCEEDED = pb.OUTCOME_SUCCEEDED
FAILED = pb.OUTCOME_FAILED
RETRYABLE = pb.OUTCOME_RETRYABLE
HANDED_BACK = pb.OUTCOME_HANDED_BACK
ABANDONED = pb.OUTCOME_ABANDONED

# How a handler runs (``mode_of``).
SYNC = 0  # a plain function: in a thread of the pool
TASK = 1  # a coroutine function: a task of its own
INLINE = 2  # a coroutine function that cannot suspend: run to its end at once
HTTP = 3  # the built-in ``http`` handler: a task sending the run's request

# A completion on its way: run id, fence, outcome, error, job id, how long
# its handler ran in ms (0: it never started), its result (JSON object text,
# "" for none) and the least wait before a retry in ms. A tuple, not an
# object: one is made for every run, and it only travels to a message.
Done = tuple[int, int, "pb.Outcome", str, int, int, str, int]


class Run:
    """One held run: its context, its handler, its state, and the link of the
    node it reports to (None while it has none: see the worker's strays)."""

    __slots__ = (
        "acked",
        "assignment",
        "ctx",
        "fn",
        "link",
        "mode",
        "span",
        "started",
        "state",
        "task",
    )

    def __init__(
        self,
        link: Holder,
        ctx: RunContext,
        fn: Handler | None,
        mode: int,
        assignment: pb.Assignment | None = None,
    ) -> None:
        self.link: Holder | None = link
        # What the node handed out, kept for a run of the ``http`` handler
        # (its signed headers); None for the rest.
        self.assignment = assignment
        self.ctx = ctx
        self.fn = fn
        self.mode = mode
        self.state = QUEUED
        self.task: asyncio.Task[None] | None = None
        # An ack for it went out (or was queued) on some link.
        self.acked = False
        # time.perf_counter() when its handler started.
        self.started = 0.0
        # Its span while it runs, with tracing on (wheel.worker._tracing).
        self.span: Any = None

    def ref(self) -> pb.RunRef:
        ctx = self.ctx
        return pb.RunRef(run_id=ctx.run_id, fence=ctx.fence, job_id=ctx.job_id)

    def done(
        self, outcome: pb.Outcome, error: str, result: str = "", retry_after_ms: int = 0
    ) -> Done:
        ctx = self.ctx
        ran_ms = int((time.perf_counter() - self.started) * 1000) if self.started else 0
        return (ctx.run_id, ctx.fence, outcome, error, ctx.job_id, ran_ms, result, retry_after_ms)


class BadResult(Permanent):
    """A handler returned what a run cannot keep: not JSON, or too large."""


def result_of(value: Any) -> str:
    """A handler's return value as a run's result, ``{"value": ...}``; raises
    ``BadResult`` for a value that is not JSON-serialisable or whose result
    is over ``MAX_RESULT_BYTES``. A handler that returns one is wrong, and
    would be on every attempt: its run fails for good (the effect it had is
    not repeated by a retry)."""
    try:
        text = json.dumps({"value": value}, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise BadResult(
            f"the handler returned a {type(value).__name__} a run cannot keep as its result"
            f" (not JSON-serialisable: {_message(exc)[:200]}); return None or a JSON value"
        ) from None
    # ensure_ascii (the default): the length is the bytes' too.
    if len(text) > MAX_RESULT_BYTES:
        raise BadResult(
            f"the handler returned a {type(value).__name__} of {len(text)} bytes as JSON;"
            f" a run keeps at most {MAX_RESULT_BYTES}"
        )
    return text


def outcome_of(exc: BaseException) -> tuple[pb.Outcome, str]:
    if isinstance(exc, Permanent):
        return FAILED, error_text(exc)
    return RETRYABLE, error_text(exc)


def error_text(exc: BaseException) -> str:
    """A run's stored error for ``exc``. ``Retryable`` and ``Permanent`` are
    raised on purpose and their message says why: the message alone. Any
    other exception is a bug: its type, message and where it was raised on
    the first line, then the traceback's last frames (the handler's side,
    not the worker's), the earliest frames cut first to keep it within
    ``MAX_ERROR_CHARS``."""
    text = _message(exc)
    if isinstance(exc, Retryable | Permanent):
        return (text or type(exc).__name__)[:MAX_ERROR_CHARS]
    cls = type(exc)
    name = (
        cls.__qualname__
        if cls.__module__ in ("builtins", "__main__")
        else (f"{cls.__module__}.{cls.__qualname__}")
    )
    head = f"{name}: {text}" if text else name
    frames = traceback.extract_tb(_handler_tb(exc.__traceback__))
    if not frames:
        return redact(head)[:MAX_ERROR_CHARS]
    last = frames[-1]
    head += f" (at {last.filename}:{last.lineno}, in {last.name})"
    lines = frames.format()
    budget = MAX_ERROR_CHARS - len(head) - 80  # the traceback's own line
    kept: list[str] = []
    for line in reversed(lines):
        if len(line) > budget:
            break
        kept.append(line)
        budget -= len(line)
    kept.reverse()
    cut = len(lines) - len(kept)
    title = "Traceback (most recent call last"
    title += f", {cut} earlier frames cut):" if cut else "):"
    # Credentials a message or a source line may quote (a store URL's
    # password, a bearer token) are not kept, as in the logs.
    return redact(f"{head}\n{title}\n" + "".join(kept)).rstrip("\n")[:MAX_ERROR_CHARS]


def _message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # a __str__ that raises
        text = f"<{type(exc).__name__}: str() failed>"
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[:MAX_MESSAGE_CHARS] + "..."
    return text


_THIS_FILE = __file__


def _handler_tb(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` from the first frame that is not the runner's own."""
    while tb is not None and tb.tb_frame.f_code.co_filename == _THIS_FILE:
        tb = tb.tb_next
    return tb


def is_async(fn: Callable[..., Any]) -> bool:
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def mode_of(fn: Callable[..., Any]) -> int:
    """SYNC, TASK or INLINE (see above). INLINE only for a function or a
    bound method whose own code is the coroutine's: a coroutine suspends
    only at a YIELD_VALUE of its own frame, so one whose code has none runs
    to its end in one step, and ``asyncio.current_task()``, timeouts and
    context variables inside it behave as in a task of its own (nothing in
    it can wait)."""
    if not is_async(fn):
        return SYNC
    func = fn.__func__ if inspect.ismethod(fn) else fn
    if not inspect.isfunction(func) or not inspect.iscoroutinefunction(func):
        return TASK
    if any(i.opname == "YIELD_VALUE" for i in dis.get_instructions(func.__code__)):
        return TASK
    return INLINE


async def _await(aw: Any) -> Any:
    return await aw


class Runner:
    """At most ``capacity`` handlers at once, whatever the nodes send (rule 3);
    sync handlers in at most ``capacity`` threads (rule 5); run timeouts."""

    def __init__(
        self,
        capacity: int,
        stats: WorkerStats,
        report: Callable[[Run, pb.Outcome, str, str, int], None],
        *,
        worker_id: str = "",
        http: HttpRunner | None = None,
    ) -> None:
        """``report(run, outcome, error, result, retry_after_ms)`` gets each
        outcome; ``http`` runs the runs of mode HTTP."""
        self.capacity = capacity
        self.http = http
        self.stats = stats
        self._report = report
        self.worker_id = worker_id
        # Handler durations: (handler, succeeded, seconds); set when the
        # worker serves metrics.
        self.observe: Callable[[str, bool, float], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.waiting: collections.deque[Run] = collections.deque()
        self.active = 0
        self._jobs: queue.SimpleQueue[Run | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._sync_inflight = 0
        self._deadlines: list[tuple[float, int, Run]] = []
        self._deadline_seq = 0
        self._deadline_at = math.inf
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._results: collections.deque[tuple[Run, pb.Outcome, str, BaseException | None, str]] = (
            collections.deque()
        )
        self._results_lock = threading.Lock()
        self._results_scheduled = False
        # Run spans that ended, on their way to the SDK (tracing on; handed
        # over together, the last ones as it stops).
        self._ended = spans.Ended()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    # -- admission ----------------------------------------------------------------

    def queue(self, run: Run) -> None:
        """Take a run whose handler is registered; it starts when a slot is free."""
        self.waiting.append(run)

    def admit(self) -> None:
        while self.waiting and self.active < self.capacity:
            run = self.waiting.popleft()
            if run.state == QUEUED:
                self._start(run)

    def _start(self, run: Run) -> None:
        assert self._loop is not None
        run.state = RUNNING
        run.started = time.perf_counter()
        self.active += 1
        if run.mode == INLINE:
            self._run_inline(run)
            return
        if run.mode == HTTP:
            # Its request's own timeout ends no later than the run's: no watch.
            assert self.http is not None
            self.http.start(run, self._http_done)
            return
        if run.ctx.deadline != math.inf:
            self._watch_deadline(run)
        if run.mode == TASK:
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

    # -- execution ----------------------------------------------------------------

    async def _run_async(self, run: Run) -> None:
        assert run.fn is not None
        outcome, error, failure, result = SUCCEEDED, "", None, ""
        token = current_run.set(run.ctx)  # in the task's own context
        traced = spans.attach(run)
        try:
            value = await run.fn(run.ctx)
            if value is not None:
                result = result_of(value)
        except asyncio.CancelledError:
            # Ours (revoke, timeout, hand-back, stop) unless the run is still live.
            outcome, error = RETRYABLE, "handler was cancelled"
        except BaseException as exc:
            outcome, error = outcome_of(exc)
            failure = exc
        finally:
            spans.detach(traced)
            current_run.reset(token)
            self.active -= 1
        self._finish(run, outcome, error, failure, result)
        self.admit()

    def _http_done(self, run: Run, finish: Finish) -> None:
        self.active -= 1
        outcome, error, result, retry_after_ms = finish
        self._finish(run, outcome, error, None, result, retry_after_ms)
        self.admit()

    def _run_inline(self, run: Run) -> None:
        """A handler that cannot suspend, to its end now, in a copy of the
        context as a task would have (what it sets does not leak out). No
        timeout is watched: nothing could stop a step that never yields."""
        assert run.fn is not None
        outcome, error, failure, result = SUCCEEDED, "", None, ""
        try:
            coro = run.fn(run.ctx)
            context = contextvars.copy_context()
            context.run(current_run.set, run.ctx)
            context.run(spans.attach, run)
            try:
                context.run(coro.send, None)
            except StopIteration as stop:
                if stop.value is not None:
                    result = result_of(stop.value)
            else:  # pragma: no cover - mode_of said it cannot yield
                coro.close()
                raise RuntimeError("handler suspended although its code has no await")
        except BaseException as exc:
            outcome, error = outcome_of(exc)
            failure = exc
        finally:
            self.active -= 1
        self._finish(run, outcome, error, failure, result)

    def _thread_main(self) -> None:
        while True:
            run = self._jobs.get()
            if run is None:
                return
            outcome, error, failure, result = SUCCEEDED, "", None, ""
            if run.state != RUNNING:
                outcome, error = RETRYABLE, "aborted before it started"
            else:
                assert run.fn is not None
                token = current_run.set(run.ctx)
                traced = spans.attach(run)
                try:
                    value = run.fn(run.ctx)
                    if inspect.isawaitable(value):
                        # A sync-looking callable that returned an awaitable:
                        # run it on the loop, this thread waits for it.
                        assert self._loop is not None
                        value = asyncio.run_coroutine_threadsafe(_await(value), self._loop).result()
                    if value is not None:
                        result = result_of(value)
                except BaseException as exc:
                    outcome, error = outcome_of(exc)
                    failure = exc
                finally:
                    spans.detach(traced)
                    current_run.reset(token)
            self._results.append((run, outcome, error, failure, result))
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
            run, outcome, error, failure, result = results.popleft()
            self._sync_inflight -= 1
            self.active -= 1
            self._finish(run, outcome, error, failure, result)
        self.admit()

    def _finish(
        self,
        run: Run,
        outcome: pb.Outcome,
        error: str,
        failure: BaseException | None = None,
        result: str = "",
        retry_after_ms: int = 0,
    ) -> None:
        if run.state != RUNNING:
            return  # superseded, timed out or handed back meanwhile: discard
        run.state = DONE
        succeeded = outcome == SUCCEEDED
        spans.end(run, self._ended, succeeded, error)
        if succeeded:
            self.stats.succeeded += 1
        elif (failure is None and outcome != FAILED) or isinstance(failure, Retryable):
            # A Retryable is raised on purpose and says why: one line.
            self.stats.failed += 1
            self._log(run, logging.INFO, "failed", error)
        elif failure is None or isinstance(failure, Permanent):
            self.stats.failed += 1
            self._log(run, logging.WARNING, "failed for good", error)
        else:
            # A bug in the handler: where it is, with the whole traceback.
            self.stats.failed += 1
            self._log(run, logging.WARNING, "failed", error.partition("\n")[0], failure)
        if self.observe is not None:
            self.observe(run.ctx.handler, succeeded, time.perf_counter() - run.started)
        self._report(run, outcome, error, result, retry_after_ms)

    def _log(
        self,
        run: Run,
        level: int,
        what: str,
        detail: str = "",
        failure: BaseException | None = None,
    ) -> None:
        """A line about a run, with its ids (and ``failure``'s traceback)."""
        if not log.isEnabledFor(level):
            return
        ctx = run.ctx
        log.log(
            level,
            "run %d of job %d (attempt %d, handler %s) %s%s",
            ctx.run_id,
            ctx.job_id,
            ctx.attempt,
            ctx.handler,
            what,
            f": {detail}" if detail else "",
            exc_info=(type(failure), failure, failure.__traceback__) if failure else None,
            extra=ids(job_id=ctx.job_id, run_id=ctx.run_id, fence=ctx.fence, worker=self.worker_id),
        )

    # Timeouts: one heap and one loop timer for all runs, not a TimerHandle per
    # run. Entries of finished runs are dropped lazily (when they reach the top,
    # or in a compaction once they outnumber the running ones).

    def _watch_deadline(self, run: Run) -> None:
        heap = self._deadlines
        if len(heap) > 2 * self.active + 1024:
            heap[:] = [e for e in heap if e[2].state == RUNNING]
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
        while heap and (heap[0][0] <= now or heap[0][2].state != RUNNING):
            _, _, run = heapq.heappop(heap)
            self._on_timeout(run)
        if heap:
            self._arm_deadline_timer(heap[0][0])

    def _on_timeout(self, run: Run) -> None:
        if run.state != RUNNING:
            return
        run.state = DONE
        spans.end(run, self._ended, False, "timed out")
        self.stats.timed_out += 1
        self.stats.failed += 1
        self._log(run, logging.WARNING, f"timed out after {run.ctx.timeout_ms} ms")
        if self.observe is not None:
            self.observe(run.ctx.handler, False, time.perf_counter() - run.started)
        self._report(run, RETRYABLE, f"timed out after {run.ctx.timeout_ms} ms", "", 0)
        if run.task is not None:
            run.task.cancel()

    # -- ending runs early ------------------------------------------------------------

    def abort(self, run: Run) -> bool:
        """Superseded (rule 2): stop it and never complete it. False if its
        outcome was already decided."""
        if run.state in (DONE, ABORTED):
            return False
        run.state = ABORTED
        spans.end(run, self._ended, False, "superseded")
        self.stats.revoked += 1
        self._log(run, logging.INFO, "superseded: aborted, not completed")
        if run.task is not None:
            run.task.cancel()
        return True

    def hand_back(self, run: Run, why: str) -> None:
        """Give back a run whose handler never started: another worker gets
        it with the same attempt and fence."""
        if run.state != QUEUED:
            return
        run.state = DONE
        spans.end(run, self._ended, False, why)
        self.stats.handed_back += 1
        self._report(run, HANDED_BACK, why, "", 0)

    def hand_back_waiting(self, why: str) -> None:
        """Hand back every run still waiting for a slot (a drain began)."""
        while self.waiting:
            self.hand_back(self.waiting.popleft(), why)

    def give_up(self, run: Run) -> None:
        """Stop waiting for a run at the end of a drain: one never started is
        handed back; one whose handler started is abandoned (its effect is
        unknown: the node dispatches it again with a new fence, or marks an
        at_most_once run unknown). A sync handler's thread cannot be stopped;
        its result is discarded."""
        if run.state == QUEUED:
            self.hand_back(run, "worker is draining")
            return
        if run.state in (DONE, ABORTED):
            return
        run.state = DONE
        spans.end(run, self._ended, False, "abandoned")
        self.stats.abandoned += 1
        self._log(run, logging.WARNING, "abandoned: the worker stopped before the handler ended")
        if run.task is not None:
            run.task.cancel()
        self._report(run, ABANDONED, "worker stopped before the handler finished", "", 0)

    async def stop(self, runs: list[Run]) -> None:
        """The worker is stopping: ``runs`` are aborted without a word to any
        node (their leases lapse), the threads told to end."""
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        self._deadlines.clear()
        tasks = []
        for run in runs:
            run.state = ABORTED
            if run.task is not None:
                run.task.cancel()
                tasks.append(run.task)
        self.waiting.clear()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        for _ in self._threads:
            self._jobs.put(None)
        self._ended.emit()  # the spans that ended last, before the loop stops


def decoded(
    codec: PayloadCodec, payload: bytes, entry: tuple[Handler, int]
) -> tuple[bytes, tuple[Handler, int]]:
    """A run's payload through the worker's codec, and its handler entry;
    or, when the codec cannot decode it, the payload as it came and an entry
    (``INLINE``) that fails the run in the handler's place with the codec's
    error: retryable, since a worker holding the key may take the retry."""
    try:
        return codec.decode(payload), entry
    except CodecError as exc:
        message = str(exc)

    async def undecodable(ctx: RunContext) -> None:
        raise Retryable(message)

    return payload, (undecodable, INLINE)


def sent_by_the_executor(ctx: RunContext) -> None:  # pragma: no cover - never called
    """The ``http`` handler's entry: its runs go to the executor instead."""
    raise RuntimeError("a run of the http handler goes to the HTTP executor")
