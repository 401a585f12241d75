"""OpenTelemetry traces of wheel's API calls, fires and runs.

Off unless the standard ``OTEL_*`` variables ask for it (``configure``,
which ``wheelctl serve`` and ``wheelctl worker`` call at start): an
exporter named by ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, or
``null``, which keeps every span and sends none, for measuring what tracing
costs), ``otlp`` by default once an ``OTEL_EXPORTER_OTLP_*ENDPOINT`` is set;
the sampler by ``OTEL_TRACES_SAMPLER``; ``OTEL_SDK_DISABLED=true`` turns it
off. The SDK and the OTLP exporter are the ``otel`` extra (``pip install
wheel-scheduler[otel]``); only the API is a dependency. An application that
sets up its own SDK calls ``install(provider)`` instead.

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
any fire, after a failover too, and the spans still join up. A fire's spans
are made as finished spans (``emit``: the SDK's ``ReadableSpan``) and handed
to the provider's span processors and so to its exporter, as the SDK's own
would be, without the SDK's per-span bookkeeping: a fire's two spans cost a
few microseconds, where the SDK's tracer takes some thirty a span. The
provider's sampler decides, at the ``dispatch``; the worker follows the
decision the ``traceparent`` carries.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

__all__ = [
    "configure",
    "current_traceparent",
    "dispatch_span_id",
    "emit",
    "fire_trace_id",
    "install",
    "is_on",
    "parse_traceparent",
    "remote_context",
    "run_span_id",
    "sampled",
    "span_context",
    "traceparent",
    "tracer",
]

log = logging.getLogger("wheel.tracing")

SAMPLED = TraceFlags(TraceFlags.SAMPLED)
UNSAMPLED = TraceFlags(TraceFlags.DEFAULT)


class _Sink:
    """Where finished spans go: the provider's span processors, with the
    provider's resource and sampler (and the SDK's types, imported once)."""

    __slots__ = (
        "always",
        "error",
        "keep",
        "processor",
        "readable",
        "resource",
        "sampler",
        "scope",
        "unset",
    )

    def __init__(self, provider: Any) -> None:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.trace.sampling import Decision
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import Status, StatusCode

        # The SDK's own list of the provider's processors (it has no public
        # name): what a span the SDK's tracer ends is handed to.
        self.processor = provider._active_span_processor
        self.resource = provider.resource
        self.sampler = provider.sampler
        # The default sampler (parent-based, always on) keeps every root: no
        # need to ask it for each fire.
        self.always = self.sampler.get_description() in (
            "AlwaysOnSampler",
            "ParentBased{root:AlwaysOnSampler,remoteParentSampled:AlwaysOnSampler,"
            "remoteParentNotSampled:AlwaysOffSampler,localParentSampled:AlwaysOnSampler,"
            "localParentNotSampled:AlwaysOffSampler}",
        )
        self.scope = InstrumentationScope("wheel")
        self.readable = ReadableSpan
        self.keep = Decision.RECORD_AND_SAMPLE
        self.unset = Status(StatusCode.UNSET)
        self.error: Callable[[str], Any] = lambda text: Status(StatusCode.ERROR, text)


_SINK: _Sink | None = None


def is_on() -> bool:
    """Whether wheel makes spans in this process."""
    return _SINK is not None


def tracer() -> trace.Tracer:
    return trace.get_tracer("wheel")


# -- ids of a fire's spans -------------------------------------------------------------


_M64 = (1 << 64) - 1


def fire_trace_id(key: str) -> int:
    """The trace of a fire (``key``: its idempotency key)."""
    digest = hashlib.blake2b(key.encode(), digest_size=16, person=b"wheel-fire")
    return int.from_bytes(digest.digest(), "big") or 1


def _span_id(key: str, attempt: int, salt: int) -> int:
    # splitmix64 of the fire's trace id, the attempt and the kind of span:
    # distinct spans of a fire get distinct ids, and any process derives them.
    x = (fire_trace_id(key) ^ (attempt * 0x9E3779B97F4A7C15) ^ salt) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return (x ^ (x >> 31)) or 1


def dispatch_span_id(key: str, attempt: int) -> int:
    return _span_id(key, attempt, 0xD15BA7C4)


def run_span_id(key: str, attempt: int) -> int:
    return _span_id(key, attempt, 0x52554E00)


def span_context(trace_id: int, span_id: int, *, remote: bool = True) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=remote, trace_flags=SAMPLED)


def traceparent(trace_id: int, span_id: int, sampled: bool = True) -> str:
    """The W3C ``traceparent`` of a span."""
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def parse_traceparent(value: str) -> SpanContext | None:
    """The span context of a W3C ``traceparent`` (version 00), or None."""
    if len(value) != 55 or value[2] != "-" or value[35] != "-" or value[52] != "-":
        return None
    try:
        trace_id, span_id = int(value[3:35], 16), int(value[36:52], 16)
        flags = int(value[53:55], 16)
    except ValueError:
        return None
    if not trace_id or not span_id or value[:2] == "ff":
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags & 1))


def current_traceparent() -> str:
    """The ``traceparent`` of the current span, or ""."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent", "")


def remote_context(value: str | Mapping[str, str]) -> Any:
    """A context whose current span is the remote parent ``value`` names (a
    ``traceparent``, or a carrier of headers or gRPC metadata)."""
    carrier = {"traceparent": value} if isinstance(value, str) else dict(value)
    return propagate.extract(carrier)


# -- a fire's spans ----------------------------------------------------------------------


def sampled(trace_id: int, name: str, links: Sequence[Link]) -> bool:
    """Whether the provider's sampler keeps a fire's root span."""
    sink = _SINK
    if sink is None:
        return False
    if sink.always:
        return True
    result = sink.sampler.should_sample(None, trace_id, name, SpanKind.PRODUCER, None, links)
    return bool(result.decision is sink.keep)


def emit(
    name: str,
    *,
    trace_id: int,
    span_id: int,
    start_ns: int,
    end_ns: int,
    attributes: Mapping[str, Any],
    parent_span_id: int = 0,
    links: Sequence[Link] = (),
    kind: SpanKind = SpanKind.INTERNAL,
    error: str = "",
) -> None:
    """Hand a finished span with these ids to the provider's processors."""
    sink = _SINK
    if sink is None:
        return
    sink.processor.on_end(
        sink.readable(
            name=name,
            context=SpanContext(trace_id, span_id, is_remote=False, trace_flags=SAMPLED),
            parent=(
                SpanContext(trace_id, parent_span_id, is_remote=True, trace_flags=SAMPLED)
                if parent_span_id
                else None
            ),
            resource=sink.resource,
            attributes=attributes,
            links=links,
            kind=kind,
            status=sink.error(error) if error else sink.unset,
            start_time=start_ns,
            end_time=max(start_ns, end_ns),
            instrumentation_scope=sink.scope,
        )
    )


# -- the SDK ---------------------------------------------------------------------------


def install(provider: Any) -> None:
    """Trace with ``provider`` (an SDK ``TracerProvider`` the application
    made): it becomes the global one, and a fire's spans go to its span
    processors."""
    global _SINK
    trace.set_tracer_provider(provider)
    _SINK = _Sink(provider)


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
