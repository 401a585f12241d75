"""A fire's spans as ``wheel.tracing`` makes them, through a real SDK
provider in this process: the finished spans it builds directly are the ones
the SDK's constructor makes, a batch goes through a ``BatchSpanProcessor``'s
queue whole and arrives once each, and a worker's ``run`` span is the child
of its ``dispatch``, the parent of the handler's spans and linked, on a
retry, to the first attempt's."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, StatusCode

from wheel import tracing
from wheel.engine.model import idempotency_key
from wheel.worker import _tracing as spans
from wheel.worker._api import RunContext, WorkerStats, run_context
from wheel.worker._runs import Runner


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Tracing on in this test only: a provider exporting to memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_SINK", tracing._Sink(provider))
    yield exporter
    provider.shutdown()


def _as_sdk_makes_it(span: ReadableSpan) -> ReadableSpan:
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=span.attributes,
        links=span.links,
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


@pytest.mark.parametrize("direct", [True, False], ids=["fields-set", "constructor"])
def test_a_finished_span_is_the_one_the_sdks_constructor_makes(
    exported: InMemorySpanExporter, direct: bool
) -> None:
    sink = tracing._SINK
    assert sink is not None and sink.fast  # the SDK's layout is the one checked
    sink.fast = direct
    trace_id = tracing.fire_trace_id("7:1000")
    first = Link(tracing.span_context(trace_id, 5), {"wheel.link": "first_attempt"})
    span = tracing.finished(
        "run",
        trace_id,
        9,
        8,
        1_000,
        2_000,
        SpanKind.CONSUMER,
        {"wheel.job_id": 7},
        (first,),
        "boom",
    )
    tracing.emit([span])
    (out,) = exported.get_finished_spans()
    assert out.to_json() == _as_sdk_makes_it(out).to_json()
    assert out.context is not None and out.parent is not None
    assert (out.context.trace_id, out.context.span_id, out.context.is_remote) == (
        trace_id,
        9,
        False,
    )
    assert (out.parent.trace_id, out.parent.span_id) == (trace_id, 8) and out.parent.is_remote
    assert out.context.trace_flags.sampled and out.context.is_valid and out.parent.is_valid
    assert out.context == SpanContext(trace_id, 9, is_remote=False, trace_flags=tracing.SAMPLED)
    assert (out.start_time, out.end_time, out.kind) == (1_000, 2_000, SpanKind.CONSUMER)
    assert out.status.status_code is StatusCode.ERROR and out.status.description == "boom"
    assert list(out.links) == [first] and dict(out.attributes or {}) == {"wheel.job_id": 7}
    assert out.instrumentation_scope is not None and out.instrumentation_scope.name == "wheel"


def test_a_batch_goes_through_a_batch_processors_queue_once_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter, max_queue_size=1000, max_export_batch_size=1000, schedule_delay_millis=60_000
        )
    )
    monkeypatch.setattr(tracing, "_SINK", tracing._Sink(provider))
    made = [
        tracing.finished("dispatch", n, n, 0, n, n + 1, SpanKind.PRODUCER, {"n": n})
        for n in range(1, 1501)
    ]
    for at in range(0, 900, 300):  # into the queue, a batch at a time
        tracing.emit(made[at : at + 300])
    assert exporter.get_finished_spans() == ()  # queued, not exported yet
    provider.force_flush()
    assert [s.attributes for s in exporter.get_finished_spans()] == [
        {"n": n} for n in range(1, 901)
    ]  # in order, once each
    exporter.clear()
    # More than the queue holds: one by one, as the processor's own on_end
    # takes them (it exports what it can and drops the oldest of the rest).
    tracing.emit(made)
    provider.force_flush()
    out = [int(s.attributes["n"]) for s in exporter.get_finished_spans()]  # type: ignore[index, arg-type]
    assert len(out) == len(set(out)) and 1000 <= len(out) <= 1500 and 1500 in out
    provider.shutdown()


@dataclass
class _Run:
    """What a run's span needs of a run (``spans.Run``)."""

    ctx: RunContext
    span: Any = None


def _run(job_id: int, attempt: int) -> _Run:
    key = idempotency_key(job_id, 1_000)
    return _Run(run_context(1, job_id, "h", "", b"", key, 3, attempt, 1_000, 0, 1e9))


def test_a_run_span_is_its_dispatchs_child_and_its_handlers_parent(
    exported: InMemorySpanExporter,
) -> None:
    run = _run(7, 2)
    key = run.ctx.idempotency_key
    trace_id = tracing.fire_trace_id(key)
    dispatch = tracing.dispatch_span_id(key, 2)
    spans.begin(run, tracing.traceparent(trace_id, dispatch), "w-1")
    assert spans.header(run) == tracing.traceparent(trace_id, tracing.run_span_id(key, 2))

    def handler() -> None:  # in its own context, as the runner runs one
        spans.attach(run)
        with tracer_of(exported).start_as_current_span("handler-work"):
            pass

    contextvars.copy_context().run(handler)

    async def ending() -> None:
        ended = spans.Ended()
        spans.end(run, ended, False, "it broke\nat line 3")
        # Handed over a moment later, with the others ended meanwhile.
        assert run.span is None and len(exported.get_finished_spans()) == 1
        await _until(lambda: len(exported.get_finished_spans()) == 2)

    asyncio.run(ending())
    work, done = exported.get_finished_spans()
    assert done.name == "run" and done.kind is SpanKind.CONSUMER
    assert done.context is not None and done.parent is not None
    assert (done.context.trace_id, done.context.span_id) == (trace_id, tracing.run_span_id(key, 2))
    assert (done.parent.trace_id, done.parent.span_id) == (trace_id, dispatch)
    assert [(link.context.span_id, dict(link.attributes or {})) for link in done.links] == [
        (tracing.run_span_id(key, 1), {"wheel.link": "first_attempt"})
    ]
    assert done.status.status_code is StatusCode.ERROR
    assert done.status.description == "it broke"  # its first line
    assert done.attributes == {
        "wheel.job_id": 7, "wheel.run_id": 1, "wheel.attempt": 2, "wheel.worker_id": "w-1",
    }  # fmt: skip
    assert work.parent is not None and work.context is not None
    assert (work.parent.span_id, work.context.trace_id) == (done.context.span_id, trace_id)


async def _until(done: Any, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not done():
        assert loop.time() < deadline, "not handed over in time"
        await asyncio.sleep(0.005)


def test_run_spans_that_end_together_are_handed_over_together_and_all_as_the_runner_stops(
    exported: InMemorySpanExporter,
) -> None:
    first, second, last = _run(7, 1), _run(8, 1), _run(9, 1)
    for run in (first, second, last):
        key = run.ctx.idempotency_key
        spans.begin(run, tracing.traceparent(tracing.fire_trace_id(key), 5), "w-1")

    async def ending() -> None:
        ended = spans.Ended()
        spans.end(first, ended, True)
        spans.end(second, ended, True)
        assert exported.get_finished_spans() == ()  # they wait for more, a moment
        await _until(lambda: len(exported.get_finished_spans()) == 2)
        runner = Runner(1, WorkerStats(), lambda *report: None)
        spans.end(last, runner._ended, True)
        await runner.stop([])  # stopping: what ended goes now, not a moment later
        assert len(exported.get_finished_spans()) == 3

    asyncio.run(ending())
    job_ids = [span.attributes["wheel.job_id"] for span in exported.get_finished_spans()]  # type: ignore[index]
    assert job_ids == [7, 8, 9]


def tracer_of(exported: InMemorySpanExporter) -> Any:
    """A handler's tracer: an SDK tracer whose spans go where the fire's do."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    return provider.get_tracer("handler")


def test_a_run_whose_node_did_not_sample_it_has_no_span(exported: InMemorySpanExporter) -> None:
    run = _run(7, 1)
    trace_id = tracing.fire_trace_id(run.ctx.idempotency_key)
    spans.begin(run, tracing.traceparent(trace_id, 5, sampled=False), "w-1")
    spans.begin(run, "not a traceparent", "w-1")
    assert run.span is None and spans.attach(run) is None and spans.header(run) == ""


def test_the_spans_of_a_fire_have_ids_of_their_own() -> None:
    trace_id = tracing.fire_trace_id("7:1000")
    assert trace_id == tracing.fire_trace_id("7:1000") != tracing.fire_trace_id("7:1001")
    ids = [
        f(idempotency_key(7, 1000), attempt)
        for attempt in range(1, 50)
        for f in (tracing.dispatch_span_id, tracing.run_span_id)
    ]
    assert len(set(ids)) == len(ids) and all(0 < i < 2**64 for i in ids)
    assert tracing.run_span_id("7:1000", 3) == tracing.run_span_of(
        tracing.dispatch_span_of(trace_id, 3)
    )


def test_a_fires_traceparent_from_its_hash_digits_is_the_one_its_ids_format_to() -> None:
    for key in ("7:1000", "7:1001", "123456789:1700000000000"):
        trace_id, digits = tracing.fire_trace(key)
        assert trace_id == tracing.fire_trace_id(key) and len(digits) == 32
        for span_id, sampled in ((tracing.dispatch_span_id(key, 1), True), (1, False)):
            made = tracing.traceparent_of(digits, span_id, sampled)
            assert made == tracing.traceparent(trace_id, span_id, sampled)
            assert tracing.parse_ids(made) == (trace_id, span_id, sampled)
