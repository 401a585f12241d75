"""A worker's ``run`` spans (``wheel.tracing``): one per run whose
assignment carries a sampled ``traceparent`` (its node traces), the child of
the attempt's ``dispatch`` span, current while the handler runs so that the
handler's own spans nest under it, and sent on as an HTTP target's
``traceparent``. A retry's ``run`` links to the first attempt's. Its ids
are derived from the fire's key and the attempt, like the node's; the span
is made finished and handed to the SDK (``tracing.emit``) with the others
that ended within ``EMIT_S`` of it.

While the run runs, its span is only what a handler's spans need of their
parent, its context (``RunSpan``, a non-recording span): what the SDK's span
would record is kept until the end, when the finished span is made."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind

from wheel import tracing
from wheel.worker._api import RunContext


class Run(Protocol):
    """What a run's span needs of it (``wheel.worker._runs.Run``)."""

    span: Any

    @property
    def ctx(self) -> RunContext: ...


__all__ = ["EMIT_S", "Ended", "RunSpan", "attach", "begin", "detach", "end", "header"]

_FIRST_ATTEMPT = {"wheel.link": "first_attempt"}
# How long an ended run's span waits for others to be handed over with, at
# most (seconds): a worker's runs end a few a turn of its loop, and each
# hand-over costs about what a span does. The SDK's batch processor holds
# spans for seconds before it exports them.
EMIT_S = 0.05


class RunSpan(NonRecordingSpan):
    """A run's span while it runs: the current span of its handler (its
    context, made the first time it is asked for: a handler that makes no
    span and sends no request never does), and its parent, start and worker
    for the finished span."""

    __slots__ = ("_made", "parent", "span_id", "start_ns", "trace_id", "worker_id")

    def __init__(
        self, trace_id: int, span_id: int, parent: int, start_ns: int, worker_id: str
    ) -> None:
        # NonRecordingSpan's own __init__ sets only its context (_made).
        self._made: SpanContext | None = None
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent = parent
        self.start_ns = start_ns
        self.worker_id = worker_id

    def get_span_context(self) -> SpanContext:
        context = self._made
        if context is None:
            context = self._made = tracing.span_context(self.trace_id, self.span_id, remote=False)
        return context

    def __repr__(self) -> str:
        return f"RunSpan({self.get_span_context()!r})"


class Ended:
    """The run spans that ended within ``EMIT_S``, made and handed to the
    SDK together (a batch costs its processors about what one span does,
    and its spans are made in one loop); ``emit`` hands over at once what
    waits (the runner does as it stops)."""

    def __init__(self) -> None:
        self._rows: list[tracing.Row] = []
        self._timer: asyncio.TimerHandle | None = None

    def add(self, row: tracing.Row) -> None:
        rows = self._rows
        rows.append(row)
        if len(rows) == 1:
            try:
                self._timer = asyncio.get_running_loop().call_later(EMIT_S, self.emit)
            except RuntimeError:  # no loop runs (any more): now
                self.emit()

    def emit(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        rows, self._rows = self._rows, []
        if rows:
            tracing.emit(tracing.finished_all(rows))


def begin(run: Run, traceparent: str, worker_id: str) -> None:
    """Start ``run``'s span (when this worker traces and its node sampled it)."""
    if not traceparent or not tracing.is_on():
        return
    parent = tracing.parse_ids(traceparent)
    if parent is None:
        return
    trace_id, dispatch_span_id, sampled = parent
    if not sampled:
        return
    run.span = RunSpan(
        trace_id,
        tracing.run_span_of(dispatch_span_id),
        dispatch_span_id,
        time.time_ns(),
        worker_id,
    )


def attach(run: Run) -> Any:
    """Make ``run``'s span current in this context; the token for ``detach``."""
    span = run.span
    if span is None:
        return None
    return otel_context.attach(trace.set_span_in_context(span))


def detach(token: Any) -> None:
    if token is not None:
        otel_context.detach(token)


def end(run: Run, ended: Ended, ok: bool, error: str = "") -> None:
    """End ``run``'s span (when it has one): finished, to ``ended``."""
    span: RunSpan | None = run.span
    if span is None:
        return
    run.span = None
    ctx = run.ctx
    attempt = ctx.attempt
    trace_id = span.trace_id
    links: tuple[Link, ...] = ()
    if attempt > 1:
        first = tracing.run_span_of(tracing.dispatch_span_of(trace_id, 1))
        links = (Link(tracing.span_context(trace_id, first), _FIRST_ATTEMPT),)
    ended.add(
        (
            "run",
            trace_id,
            span.span_id,
            span.parent,
            span.start_ns,
            time.time_ns(),
            SpanKind.CONSUMER,
            {
                "wheel.job_id": ctx.job_id,
                "wheel.run_id": ctx.run_id,
                "wheel.attempt": attempt,
                "wheel.worker_id": span.worker_id,
            },
            links,
            "" if ok else (error.partition("\n")[0][:200] or "failed"),
        )
    )


def header(run: Run) -> str:
    """The ``traceparent`` an HTTP target's request carries ("" untraced)."""
    span: RunSpan | None = run.span
    if span is None:
        return ""
    return tracing.traceparent(span.trace_id, span.span_id)
