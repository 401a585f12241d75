"""A worker's ``run`` spans (``wheel.tracing``): one per run whose
assignment carries a ``traceparent`` (its node traces), the child of the
attempt's ``dispatch`` span, current while the handler runs so that the
handler's own spans nest under it, and sent on as an HTTP target's
``traceparent``. A retry's ``run`` links to the first attempt's. Its ids
are derived from the fire's key and the attempt, like the node's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from wheel import tracing

if TYPE_CHECKING:
    from wheel.worker._runs import Run

__all__ = ["attach", "begin", "detach", "end", "header"]


def begin(run: Run, traceparent: str, worker_id: str) -> None:
    """Start ``run``'s span (when this worker traces and its node did)."""
    if not traceparent or not tracing.is_on():
        return
    parent = tracing.parse_traceparent(traceparent)
    if parent is None:
        return
    ctx = run.ctx
    key = ctx.idempotency_key
    links = []
    if ctx.attempt > 1:
        first = tracing.span_context(parent.trace_id, tracing.run_span_id(key, 1))
        links.append(Link(first, {"wheel.link": "first_attempt"}))
    run.span = tracing.start_span(
        "run",
        trace_id=parent.trace_id,
        span_id=tracing.run_span_id(key, ctx.attempt),
        parent=parent,
        links=links,
        kind=SpanKind.CONSUMER,
        attributes={
            "wheel.job_id": ctx.job_id,
            "wheel.run_id": ctx.run_id,
            "wheel.handler": ctx.handler,
            "wheel.tenant": ctx.tenant,
            "wheel.attempt": ctx.attempt,
            "wheel.fence": ctx.fence,
            "wheel.scheduled_for_ms": ctx.scheduled_for_ms,
            "wheel.worker_id": worker_id,
            "wheel.idempotency_key": key,
        },
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


def end(run: Run, ok: bool, error: str = "") -> None:
    span = run.span
    if span is None:
        return
    run.span = None
    if not ok:
        span.set_status(Status(StatusCode.ERROR, error.partition("\n")[0][:200]))
    span.end()


def header(run: Run) -> str:
    """The ``traceparent`` an HTTP target's request carries ("" untraced)."""
    span = run.span
    if span is None:
        return ""
    c = span.get_span_context()
    return tracing.traceparent(c.trace_id, c.span_id)
