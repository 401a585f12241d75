"""A node's spans (``wheel.tracing``), in place only when tracing is on.

``TracingInterceptor`` makes a server span of each unary API call, the
child of the caller's span when the call carries a ``traceparent``; once a
submit or an update answered OK, the span's context is stored with the job
it made or changed (``TraceStore``), so that the job's fires can link to it.

``DispatchTraces`` makes a ``dispatch`` span of each attempt handed out.
The hand-out itself only derives the span's ids and puts the run's
``traceparent`` in its assignment (a few microseconds); the span is made a
moment later by a task of its own, which looks up the jobs' stored
contexts in one read per batch (and keeps them, by job, for the next
fires) and links each span to its job's context and, for a retry, to the
first attempt's ``dispatch``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc  # type: ignore[import-untyped, unused-ignore]
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from wheel import tracing
from wheel.engine.model import shard_of
from wheel.engine.owner import Assignment
from wheel.node import Node
from wheel.rpc.convert import wire_attempt

__all__ = ["DispatchTraces", "TracingInterceptor"]

log = logging.getLogger("wheel.tracing")

_JOBS = "/wheel.rpc.v1.JobService/"
# Jobs whose stored trace context a node keeps in memory, at most.
CACHED_JOBS = 100_000
# How long a hand-out's span waits to be made, at most (seconds).
FLUSH_S = 0.2
_SUBMITTED = {"wheel.link": "submitted"}
_FIRST_ATTEMPT = {"wheel.link": "first_attempt"}


def _made_or_changed(method: str, response: Any) -> list[int]:
    """The jobs a call that answered OK made or changed."""
    if method == _JOBS + "SubmitJob":
        return [response.job.job_id] if response.created else []
    if method == _JOBS + "SubmitJobs":
        return [
            r.response.job.job_id
            for r in response.results
            if not r.error_code and r.response.created and r.response.job.job_id
        ]
    if method == _JOBS + "UpdateJob":
        return [response.job.job_id] if response.updated else []
    return []


class TracingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """A server span of each unary call (see the module)."""

    def __init__(self, node: Node, traces: DispatchTraces) -> None:
        self.node = node
        self.traces = traces

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        method = details.method
        if handler is None or handler.unary_unary is None or method.startswith("/grpc."):
            return handler  # streams, health checks and reflection: no span
        inner = handler.unary_unary
        service, _, name = method.lstrip("/").rpartition("/")
        span_name = f"{service.rsplit('.', 1)[-1]}/{name}"
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}

        async def traced(request: Any, context: grpc.aio.ServicerContext) -> Any:
            parent = tracing.remote_context(
                {str(k): str(v) for k, v in context.invocation_metadata() or ()}
            )
            with tracing.tracer().start_as_current_span(
                span_name, context=parent, kind=SpanKind.SERVER, attributes=attributes
            ) as span:
                response = await inner(request, context)
                code = context.code()
                if code not in (None, grpc.StatusCode.OK):
                    span.set_status(Status(StatusCode.ERROR, str(code)))
                    return response
                jobs = _made_or_changed(method, response)
                if jobs:
                    here = tracing.current_traceparent()
                    await self.traces.remember([(job_id, here) for job_id in jobs])
                return response

        return grpc.unary_unary_rpc_method_handler(
            traced, handler.request_deserializer, handler.response_serializer
        )


class DispatchTraces:
    """The ``dispatch`` spans of a node (see the module)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        # Each job's links to the span that submitted or last updated it
        # (none when it has none), made once for all its fires.
        self._jobs: collections.OrderedDict[int, tuple[Link, ...]] = collections.OrderedDict()
        self._queue: list[tuple[Assignment, int, int, int]] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        # The provider's sampler keeps every fire: no need to ask it.
        self._always = tracing.always_sampled()

    async def remember(self, traces: list[tuple[int, str]]) -> None:
        """Store each job's context (and keep it here for its fires)."""
        for job_id, traceparent in traces:
            self._keep(job_id, traceparent)
        try:
            await self.node.record_job_traces(traces)
        except Exception as exc:  # tracing never fails a call
            log.warning(
                "tracing: could not store the trace context of %d jobs: %s", len(traces), exc
            )

    def _keep(self, job_id: int, traceparent: str) -> None:
        jobs = self._jobs
        submitted = tracing.parse_traceparent(traceparent)
        jobs[job_id] = () if submitted is None else (Link(submitted, _SUBMITTED),)
        jobs.move_to_end(job_id)
        while len(jobs) > CACHED_JOBS:
            jobs.popitem(last=False)

    def handed_out(self, a: Assignment, key: str) -> str:
        """The ``traceparent`` of the attempt's dispatch span (``key``: the
        run's idempotency key), which is made soon after (on the event loop,
        per hand-out)."""
        attempt = wire_attempt(a.attempt)  # 1 for a fire's first, as workers see it
        trace_id, trace_hex = tracing.fire_trace(key)
        span_id = tracing.dispatch_span_of(trace_id, attempt)
        if not self._always and not tracing.sampled(trace_id, "dispatch", ()):
            return tracing.traceparent_of(trace_hex, span_id, sampled=False)
        queue = self._queue
        queue.append((a, time.time_ns(), trace_id, span_id))
        if len(queue) == 1:
            if self._task is None:
                self._wake = asyncio.Event()
                self._task = asyncio.get_running_loop().create_task(
                    self._run(), name="wheel-dispatch-traces"
                )
                self.node.on_stop(self.close)
            assert self._wake is not None
            self._wake.set()
        return tracing.traceparent_of(trace_hex, span_id)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._flush()

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(FLUSH_S)  # the hand-outs of a moment, together
            try:
                await self._flush()
            except Exception:  # pragma: no cover - never end the task
                log.exception("tracing: dispatch spans were lost")

    async def _flush(self) -> None:
        batch, self._queue = self._queue, []
        if not batch:
            return
        jobs = self._jobs
        # (A set of the batch's jobs first: a hand-out's tuple is not
        # unpacked, nor each job looked up, once a fire.)
        unknown = sorted(j for j in {item[0].job_id for item in batch} if j not in jobs)
        if unknown:
            try:
                found = await self.node.job_traces(unknown)
            except Exception as exc:
                log.warning("tracing: could not read jobs' trace contexts: %s", exc)
                found = {}
            for job_id in unknown:
                self._keep(job_id, found.get(job_id, ""))
        rows: list[tracing.Row] = []
        row = rows.append
        producer = SpanKind.PRODUCER
        for a, at_ns, trace_id, span_id in batch:
            job_id = a.job_id
            attempt = wire_attempt(a.attempt)
            links = jobs.get(job_id, ())
            if attempt > 1:
                first = tracing.dispatch_span_of(trace_id, 1)
                links = (*links, Link(tracing.span_context(trace_id, first), _FIRST_ATTEMPT))
            scheduled_for = a.scheduled_for
            scheduled_ns = scheduled_for * 1_000_000
            row(
                (
                    "dispatch",
                    trace_id,
                    span_id,
                    0,
                    # A fire's first hand-out spans its lag; a retry's is a moment.
                    scheduled_ns if attempt == 1 else at_ns,
                    max(at_ns, scheduled_ns),
                    producer,
                    {
                        "wheel.job_id": job_id,
                        "wheel.shard": shard_of(job_id),
                        "wheel.fence": a.fence,
                        "wheel.attempt": attempt,
                        "wheel.scheduled_for_ms": scheduled_for,
                        "wheel.dispatched_at_ms": at_ns // 1_000_000,
                    },
                    links,
                    "",
                )
            )
        tracing.emit(tracing.finished_all(rows))
