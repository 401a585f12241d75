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
any fire, after a failover too, and the spans still join up; a worker reads
its run span's id from the ``traceparent`` (its dispatch's, bits flipped).
A fire's spans are made as finished spans (``finished``: the SDK's
``ReadableSpan``, its fields set directly while they are the ones this SDK
has) and handed in batches (``emit``) to the provider's span processors and
so to its exporter, as the SDK's own would be, without the SDK's per-span
bookkeeping; a ``BatchSpanProcessor`` takes a batch into its queue at once.
A fire's two spans cost a few microseconds, where the SDK's tracer takes
some thirty a span. The provider's sampler decides, at the ``dispatch``;
the worker follows the decision the ``traceparent`` carries.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeAlias

from opentelemetry import propagate, trace
from opentelemetry.trace import DEFAULT_TRACE_STATE, Link, SpanContext, SpanKind, TraceFlags

__all__ = [
    "Row",
    "always_sampled",
    "configure",
    "current_traceparent",
    "dispatch_span_id",
    "dispatch_span_of",
    "emit",
    "finished",
    "finished_all",
    "fire_trace",
    "fire_trace_id",
    "install",
    "is_on",
    "parse_ids",
    "parse_traceparent",
    "remote_context",
    "run_span_id",
    "run_span_of",
    "sampled",
    "span_context",
    "traceparent",
    "traceparent_of",
    "tracer",
]

log = logging.getLogger("wheel.tracing")

SAMPLED = TraceFlags(TraceFlags.SAMPLED)
UNSAMPLED = TraceFlags(TraceFlags.DEFAULT)

# Mixed into the ids of a fire's spans: an attempt's multiple of the first,
# and the second flipped in to tell a run's span from its dispatch's.
_ATTEMPTS = 0x9E3779B97F4A7C15
_RUN = 0x52554E0052554E00

# A finished span's fields (``finished``'s arguments): name, trace id, span
# id, parent span id (0: a root), start and end (ns), kind, attributes,
# links, error ("": none).
Row: TypeAlias = tuple[
    str, int, int, int, int, int, SpanKind, Mapping[str, Any], Sequence[Link], str
]

_new_tuple = tuple.__new__
_new_object = object.__new__


def _fast_span_context(trace_id: int, span_id: int, remote: bool) -> SpanContext:
    """``SpanContext(trace_id, span_id, remote, SAMPLED)`` for ids known to be
    valid, without the constructor's checks (the tuple it would make)."""
    return _new_tuple(SpanContext, (trace_id, span_id, remote, SAMPLED, DEFAULT_TRACE_STATE, True))


def _slow_span_context(trace_id: int, span_id: int, remote: bool) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=remote, trace_flags=SAMPLED)


# The SDK's own constructor if a later API lays its context out otherwise.
_span_context = (
    _fast_span_context
    if _fast_span_context(2, 3, True) == _slow_span_context(2, 3, True)
    and _fast_span_context(2, 3, True).is_valid
    else _slow_span_context
)


class _Sink:
    """Where finished spans go: the provider's span processors, with the
    provider's resource and sampler (and the SDK's types, imported once)."""

    __slots__ = (
        "always",
        "batching",
        "direct",
        "error",
        "fast",
        "keep",
        "processor",
        "readable",
        "resource",
        "sampler",
        "scope",
        "unset",
    )

    def __init__(self, provider: Any) -> None:
        from opentelemetry.sdk.trace import ReadableSpan, SynchronousMultiSpanProcessor
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import Decision
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import Status, StatusCode

        # The SDK's own list of the provider's processors (it has no public
        # name): what a span the SDK's tracer ends is handed to.
        self.processor = provider._active_span_processor
        self.direct = type(self.processor) is SynchronousMultiSpanProcessor
        self.batching = BatchSpanProcessor
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
        # A span's fields set directly (a third of the constructor's cost)
        # while they are the ones the constructor sets, which is checked here.
        self.fast = set(vars(ReadableSpan(name="")).keys()) == _READABLE_FIELDS

    def span(
        self,
        name: str,
        trace_id: int,
        span_id: int,
        parent_span_id: int,
        start_ns: int,
        end_ns: int,
        kind: SpanKind,
        attributes: Mapping[str, Any],
        links: Sequence[Link],
        error: str,
    ) -> Any:
        row = (name, trace_id, span_id, parent_span_id, start_ns, end_ns, kind, attributes)
        return self.spans(((*row, links, error),))[0]

    def spans(self, rows: Iterable[Row]) -> list[Any]:
        """A finished span of each row (``span``'s arguments), in one loop:
        what the SDK's types need looked up once, not once a span."""
        readable, resource, scope, unset, make_error = (
            self.readable,
            self.resource,
            self.scope,
            self.unset,
            self.error,
        )
        fast, make = self.fast, _span_context
        out: list[Any] = []
        append = out.append
        for name, trace_id, span_id, parent_id, start_ns, end_ns, kind, attrs, links, err in rows:
            context = make(trace_id, span_id, False)
            parent = make(trace_id, parent_id, True) if parent_id else None
            status = make_error(err) if err else unset
            if end_ns < start_ns:
                end_ns = start_ns
            if not fast:
                append(
                    readable(
                        name=name,
                        context=context,
                        parent=parent,
                        resource=resource,
                        attributes=attrs,
                        links=links,
                        kind=kind,
                        status=status,
                        start_time=start_ns,
                        end_time=end_ns,
                        instrumentation_scope=scope,
                    )
                )
                continue
            span: Any = _new_object(readable)
            span._name = name
            span._context = context
            span._kind = kind
            span._instrumentation_info = None
            span._instrumentation_scope = scope
            span._parent = parent
            span._start_time = start_ns
            span._end_time = end_ns
            span._attributes = attrs
            span._events = ()
            span._links = links
            span._resource = resource
            span._status = status
            append(span)
        return out

    def emit(self, spans: Sequence[Any]) -> None:
        processor = self.processor
        # The provider's processors one by one, as its own list would call
        # them (a layer fewer); any other list of processors is called itself.
        for each in processor._span_processors if self.direct else (processor,):
            if type(each) is not self.batching or not _queue_all(each, spans):
                on_end = each.on_end
                for span in spans:
                    on_end(span)


def _queue_all(processor: Any, spans: Sequence[Any]) -> bool:
    """Put ``spans`` in a ``BatchSpanProcessor``'s queue at once, as its
    ``on_end`` would one by one (which checks, for each, that it is not shut
    down, the process has not forked and the queue has room): whether it
    could (not when the queue would overflow: its ``on_end`` says so)."""
    try:
        batch = processor._batch_processor
        queue = batch._queue
        if (
            batch._shutdown
            or batch._pid != os.getpid()
            or len(queue) + len(spans) > batch._max_queue_size
        ):
            return False
        wake = batch._worker_awaken
        full = batch._max_export_batch_size
    except AttributeError:  # another version of the SDK: one by one
        return False
    queue.extendleft(spans)
    if len(queue) >= full and not wake.is_set():
        wake.set()
    return True


_READABLE_FIELDS = {
    "_name",
    "_context",
    "_kind",
    "_instrumentation_info",
    "_instrumentation_scope",
    "_parent",
    "_start_time",
    "_end_time",
    "_attributes",
    "_events",
    "_links",
    "_resource",
    "_status",
}

_SINK: _Sink | None = None


def is_on() -> bool:
    """Whether wheel makes spans in this process."""
    return _SINK is not None


def tracer() -> trace.Tracer:
    return trace.get_tracer("wheel")


# -- ids of a fire's spans -------------------------------------------------------------


_M64 = (1 << 64) - 1
_FIRE = hashlib.blake2b(digest_size=16, person=b"wheel-fire")


def fire_trace_id(key: str) -> int:
    """The trace of a fire (``key``: its idempotency key)."""
    digest = _FIRE.copy()  # half the cost of a new hash with its parameters
    digest.update(key.encode())
    return int.from_bytes(digest.digest(), "big") or 1


def fire_trace(key: str) -> tuple[int, str]:
    """The trace of a fire, as ``fire_trace_id`` gives it and as the 32 hex
    digits a ``traceparent`` carries (``traceparent_of``): the hash's own,
    not the number formatted again."""
    digest = _FIRE.copy()
    digest.update(key.encode())
    raw = digest.digest()
    trace_id = int.from_bytes(raw, "big")
    if not trace_id:
        return 1, "%032x" % 1  # noqa: UP031
    return trace_id, raw.hex()


def dispatch_span_of(trace_id: int, attempt: int) -> int:
    """The id of a fire's ``dispatch`` span for an attempt (1 for the
    first), from the fire's trace id."""
    # The high half of the trace id (a hash) with each attempt's multiple of
    # an odd constant flipped in: distinct for distinct attempts (an odd
    # multiplier is a bijection modulo 2**64), and any process derives it.
    return ((trace_id >> 64) ^ ((attempt * _ATTEMPTS) & _M64)) or 1


def run_span_of(dispatch_span_id: int) -> int:
    """The id of the ``run`` span whose parent is this ``dispatch`` span: its
    id with bits flipped, so that a worker has it from the ``traceparent``."""
    return (dispatch_span_id ^ _RUN) or 1


def dispatch_span_id(key: str, attempt: int) -> int:
    return dispatch_span_of(fire_trace_id(key), attempt)


def run_span_id(key: str, attempt: int) -> int:
    return run_span_of(dispatch_span_id(key, attempt))


def span_context(trace_id: int, span_id: int, *, remote: bool = True) -> SpanContext:
    """A sampled span's context (both ids non-zero)."""
    return _span_context(trace_id, span_id, remote)


def traceparent(trace_id: int, span_id: int, sampled: bool = True) -> str:
    """The W3C ``traceparent`` of a span."""
    # %-formatting: a third of what an f-string's format specs cost.
    return "00-%032x-%016x-%s" % (trace_id, span_id, "01" if sampled else "00")  # noqa: UP031


def traceparent_of(trace_hex: str, span_id: int, sampled: bool = True) -> str:
    """``traceparent`` of a trace id given as its 32 hex digits (``fire_trace``)."""
    return "00-" + trace_hex + ("-%016x-01" if sampled else "-%016x-00") % span_id


def parse_traceparent(value: str) -> SpanContext | None:
    """The span context of a W3C ``traceparent`` (version 00), or None."""
    ids = parse_ids(value)
    if ids is None:
        return None
    trace_id, span_id, sampled = ids
    if sampled:
        return _span_context(trace_id, span_id, True)
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=UNSAMPLED)


def parse_ids(value: str) -> tuple[int, int, bool] | None:
    """The trace id, span id and sampled flag of a W3C ``traceparent``
    (version 00), or None."""
    if len(value) != 55 or value[2] != "-" or value[35] != "-" or value[52] != "-":
        return None
    try:
        trace_id, span_id = int(value[3:35], 16), int(value[36:52], 16)
        flags = int(value[53:55], 16)
    except ValueError:
        return None
    if not trace_id or not span_id or value[:2] == "ff":
        return None
    return trace_id, span_id, bool(flags & 1)


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


def always_sampled() -> bool:
    """Whether the provider's sampler keeps every fire (no need to ask it)."""
    return _SINK is not None and _SINK.always


def finished(
    name: str,
    trace_id: int,
    span_id: int,
    parent_span_id: int,
    start_ns: int,
    end_ns: int,
    kind: SpanKind,
    attributes: Mapping[str, Any],
    links: Sequence[Link] = (),
    error: str = "",
) -> Any:
    """A finished, sampled span with these ids (the SDK's ``ReadableSpan``;
    a ``parent_span_id`` of 0: a root) for ``emit``; None when not tracing."""
    sink = _SINK
    if sink is None:
        return None
    return sink.span(
        name, trace_id, span_id, parent_span_id, start_ns, end_ns, kind, attributes, links, error
    )


def finished_all(rows: Iterable[Row]) -> list[Any]:
    """``finished`` of each row (its arguments, all ten), made in one loop;
    empty when not tracing."""
    sink = _SINK
    if sink is None:
        return []
    return sink.spans(rows)


def emit(spans: Sequence[Any]) -> None:
    """Hand finished spans (``finished``) to the provider's processors."""
    sink = _SINK
    if sink is not None and spans:
        sink.emit(spans)


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
