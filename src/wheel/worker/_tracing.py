"""A worker's ``run`` spans (``wheel.tracing``): one per run whose
assignment carries a sampled ``traceparent`` (its node traces), the child of
the attempt's ``dispatch`` span, current while the handler runs so that the
handler's own spans nest under it, and sent on as an HTTP target's
``traceparent``. A retry's ``run`` links to the first attempt's. Its ids
are derived from the fire's key and the attempt, like the node's; the span
is handed to the SDK finished, when the run ends (``tracing.emit``)."""

from __future__ import annotations

import time
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanKind

from wheel import tracing
from wheel.worker._api import RunContext


class Run(Protocol):
    """What a run's span needs of it (``wheel.worker._runs.Run``)."""

    span: Any

    @property
    def ctx(self) -> RunContext: ...


__all__ = ["RunSpan", "attach", "begin", "detach", "end", "header"]


class RunSpan:
    """A run's span while it runs: its ids, parent, start and worker."""

    __slots__ = ("parent", "span_id", "start_ns", "trace_id", "worker_id")

    def __init__(
        self, trace_id: int, span_id: int, parent: int, start_ns: int, worker_id: str
    ) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent = parent
        self.start_ns = start_ns
        self.worker_id = worker_id


def begin(run: Run, traceparent: str, worker_id: str) -> None:
    """Start ``run``'s span (when this worker traces and its node sampled it)."""
    if not traceparent or not tracing.is_on():
        return
    parent = tracing.parse_traceparent(traceparent)
    if parent is None or not parent.trace_flags.sampled:
        return
    ctx = run.ctx
    run.span = RunSpan(
        parent.trace_id,
        tracing.run_span_id(ctx.idempotency_key, ctx.attempt),
        parent.span_id,
        time.time_ns(),
        worker_id,
    )


def attach(run: Run) -> Any:
    """Make ``run``'s span current in this context; the token for ``detach``."""
    span = run.span
    if span is None:
        return None
    current = NonRecordingSpan(tracing.span_context(span.trace_id, span.span_id, remote=False))
    return otel_context.attach(trace.set_span_in_context(current))


def detach(token: Any) -> None:
    if token is not None:
        otel_context.detach(token)


def end(run: Run, ok: bool, error: str = "") -> None:
    span: RunSpan | None = run.span
    if span is None:
        return
    run.span = None
    ctx = run.ctx
    links = []
    if ctx.attempt > 1:
        first = tracing.run_span_id(ctx.idempotency_key, 1)
        links.append(
            Link(tracing.span_context(span.trace_id, first), {"wheel.link": "first_attempt"})
        )
    tracing.emit(
        "run",
        trace_id=span.trace_id,
        span_id=span.span_id,
        parent_span_id=span.parent,
        links=links,
        start_ns=span.start_ns,
        end_ns=time.time_ns(),
        kind=SpanKind.CONSUMER,
        attributes={
            "wheel.job_id": ctx.job_id,
            "wheel.run_id": ctx.run_id,
            "wheel.attempt": ctx.attempt,
            "wheel.worker_id": span.worker_id,
        },
        error="" if ok else (error.partition("\n")[0][:200] or "failed"),
    )


def header(run: Run) -> str:
    """The ``traceparent`` an HTTP target's request carries ("" untraced)."""
    span: RunSpan | None = run.span
    if span is None:
        return ""
    return tracing.traceparent(span.trace_id, span.span_id)
