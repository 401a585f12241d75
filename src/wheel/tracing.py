"""OpenTelemetry traces of wheel's API calls, fires and runs.

Off unless the standard ``OTEL_*`` variables ask for it (``configure``,
which ``wheelctl serve`` and ``wheelctl worker`` call at start): an
exporter named by ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, or
``null``, which keeps every span and sends none, for measuring what tracing
costs), ``otlp`` by default once an ``OTEL_EXPORTER_OTLP_*ENDPOINT`` is set;
``OTEL_SDK_DISABLED=true`` turns it off. The SDK and the OTLP exporter are
the ``otel`` extra (``pip install wheel-scheduler[otel]``); only the API is
a dependency. An application that sets up its own SDK calls
``install(provider)`` instead.

What is traced:

- each API call on a node: a server span (``JobService/SubmitJob``...),
  the child of the caller's span when the call carries a ``traceparent``
  (``wheel.client`` sends the current one);
- each fire: a trace of its own, whose id is derived from the fire's
  idempotency key (the same on every attempt). A ``dispatch`` span per
  attempt (scheduled time, hand-out time, shard, fence, attempt) links to
  the span that submitted or last updated the job (its W3C context is kept
  with the job) and, for a retry, to the first attempt's ``dispatch``;
- on the worker, a ``run`` span, the child of its ``dispatch``, current
  while the handler runs (the handler's own spans nest under it; an HTTP
  target's request carries its ``traceparent``); a retry's ``run`` links to
  the first attempt's.

The ids of a fire's spans are derived, not stored (``fire_trace_id``,
``dispatch_span_id``, ``run_span_id``): any node hands out any attempt of
any fire, after a failover too, and the spans still join up. The span ids
are given to the SDK through ``FireIds``, the id generator ``configure``
and ``install`` put in place.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags

__all__ = [
    "FireIds",
    "configure",
    "current_traceparent",
    "dispatch_span_id",
    "fire_trace_id",
    "forced_ids",
    "install",
    "is_on",
    "link_to",
    "remote_context",
    "run_span_id",
    "span_context",
    "traceparent",
    "tracer",
]

log = logging.getLogger("wheel.tracing")

_ON = False
# (trace id or 0, span id): the ids the next span the SDK makes takes.
_FORCED: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "wheel_forced_span_ids", default=None
)


def is_on() -> bool:
    """Whether wheel makes spans in this process."""
    return _ON


def tracer() -> trace.Tracer:
    return trace.get_tracer("wheel")


# -- ids of a fire's spans -------------------------------------------------------------


def _h(*parts: object, bits: int) -> int:
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=bits // 8)
    return int.from_bytes(digest.digest(), "big") or 1


def fire_trace_id(key: str) -> int:
    """The trace of a fire (``key``: its idempotency key)."""
    return _h("trace", key, bits=128)


def dispatch_span_id(key: str, attempt: int) -> int:
    return _h("dispatch", key, attempt, bits=64)


def run_span_id(key: str, attempt: int) -> int:
    return _h("run", key, attempt, bits=64)


def span_context(trace_id: int, span_id: int, *, remote: bool = True) -> SpanContext:
    return SpanContext(
        trace_id, span_id, is_remote=remote, trace_flags=TraceFlags(TraceFlags.SAMPLED)
    )


def link_to(trace_id: int, span_id: int) -> Link:
    return Link(span_context(trace_id, span_id))


def traceparent(trace_id: int, span_id: int) -> str:
    """The W3C ``traceparent`` of a sampled span."""
    return f"00-{trace_id:032x}-{span_id:016x}-01"


def current_traceparent() -> str:
    """The ``traceparent`` of the current span, or ""."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent", "")


def remote_context(value: str | Mapping[str, str]) -> otel_context.Context:
    """A context whose current span is the remote parent ``value`` names (a
    ``traceparent``, or a carrier of headers or gRPC metadata)."""
    carrier = {"traceparent": value} if isinstance(value, str) else dict(value)
    return propagate.extract(carrier)


def parse_traceparent(value: str) -> SpanContext | None:
    """The span context of a ``traceparent``, or None if it is not one."""
    span = trace.get_current_span(remote_context(value))
    ctx = span.get_span_context()
    return ctx if ctx.is_valid else None


@contextlib.contextmanager
def forced_ids(trace_id: int, span_id: int) -> Iterator[None]:
    """The next span made in this block takes these ids (trace id 0: its
    parent's) where ``FireIds`` generates them."""
    token = _FORCED.set((trace_id, span_id))
    try:
        yield
    finally:
        _FORCED.reset(token)


def start_span(
    name: str,
    *,
    trace_id: int,
    span_id: int,
    parent: SpanContext | None = None,
    links: Sequence[Link] = (),
    attributes: Mapping[str, Any] | None = None,
    start_ns: int | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> trace.Span:
    """A span with the given ids: a root of ``trace_id``, or the child of
    ``parent`` (which must be of the same trace)."""
    ctx = (
        trace.set_span_in_context(NonRecordingSpan(parent))
        if parent is not None
        else otel_context.Context()
    )
    with forced_ids(trace_id, span_id):
        return tracer().start_span(
            name,
            context=ctx,
            kind=kind,
            links=links,
            attributes=attributes,
            start_time=start_ns,
        )


# -- the SDK ---------------------------------------------------------------------------


class FireIds:
    """The SDK's id generator: random ids, but those ``forced_ids`` gives."""

    def __init__(self) -> None:
        self._random = random.Random()

    def generate_span_id(self) -> int:
        forced = _FORCED.get()
        if forced is not None:
            return forced[1]
        return self._random.getrandbits(64) or 1

    def is_trace_id_random(self) -> bool:
        # A fire's trace id is derived from its key, not drawn at random.
        return False

    def generate_trace_id(self) -> int:
        forced = _FORCED.get()
        if forced is not None and forced[0]:
            return forced[0]
        return self._random.getrandbits(128) or 1


def install(provider: Any) -> None:
    """Trace with ``provider`` (an SDK ``TracerProvider`` the application
    made): wheel's ids are put in place and it becomes the global one."""
    global _ON
    provider.id_generator = FireIds()
    trace.set_tracer_provider(provider)
    _ON = True


def configure(service_name: str, env: Mapping[str, str] | None = None) -> bool:
    """Trace as the ``OTEL_*`` variables say (see the module); whether on."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter_name = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not exporter_name:
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        exporter_name = "otlp" if endpoint else "none"
    if exporter_name == "none":
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_TRACES_EXPORTER=%s but the OpenTelemetry SDK is not installed:"
            " pip install 'wheel-scheduler[otel]'; not tracing",
            exporter_name,
        )
        return False
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource)
    if exporter_name == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    elif exporter_name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    elif exporter_name == "null":
        provider.add_span_processor(BatchSpanProcessor(_null_exporter()))
    else:
        log.warning("OTEL_TRACES_EXPORTER=%s is not one wheel knows; not tracing", exporter_name)
        return False
    install(provider)
    log.info("tracing: spans exported by %s as service %s", exporter_name, resource.attributes)
    return True


def _null_exporter() -> Any:
    """Takes every span and sends none (``OTEL_TRACES_EXPORTER=null``)."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class NullExporter(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    return NullExporter()
