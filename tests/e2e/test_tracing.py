"""Traces across processes (``wheel.tracing``): an application's span, a real
node and real workers exporting with the OpenTelemetry SDK over OTLP to a
receiver in this test. One fire's spans join up: the node's SubmitJob span
is the child of the application's span; the fire's ``dispatch`` span links
to it; the worker's ``run`` span is the child of its ``dispatch`` and the
handler's own span the child of the ``run``; and after the first worker is
SIGKILLed mid-run, the retry's ``dispatch`` and ``run`` link to the first
attempt's."""

from __future__ import annotations

import http.server
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from testkit.otlp_receiver import OtlpReceiver
from testkit.procs import ServerProc, WorkerProc, runs_of, wait_for
from wheel import outbox, tracing
from wheel.client import Client, HttpTarget
from wheel.engine.model import idempotency_key

pytestmark = pytest.mark.slow

LEASE = ("--lease-ms", "2000", "--grace-lease-ms", "1000")


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        # What the node and worker processes inherit: the standard variables.
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        yield r


def test_one_fires_spans_join_up_across_processes_and_a_worker_sigkill(
    receiver: OtlpReceiver, tmp_path: Path
) -> None:
    node = ServerProc(tmp_path / "data", args=LEASE)
    node.start()
    out = tmp_path / "out"
    first = WorkerProc(node.target, out, "w-first", "e2e_handlers:traced")
    second: WorkerProc | None = None
    # The application traces with an SDK of its own (not this process's
    # global provider): the client sends its span's context.
    app = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(app))
    try:
        wait_for(first.connected, 30, "the first worker to connect")
        with (
            provider.get_tracer("app").start_as_current_span("checkout"),
            Client(node.target) as client,
        ):
            job = client.submit(name="traced", handler="traced", at=timedelta(0), retry=3)
        (checkout,) = app.get_finished_spans()
        app_ctx = checkout.get_span_context()
        assert app_ctx is not None

        submit = receiver.wait("JobService/SubmitJob")
        assert submit.service == "wheel-node"
        assert (submit.trace_id, submit.parent_span_id) == (app_ctx.trace_id, app_ctx.span_id)

        d1 = receiver.wait("dispatch", **{"wheel.job_id": job.job_id, "wheel.attempt": 1})
        key = idempotency_key(job.job_id, d1.attributes["wheel.scheduled_for_ms"])
        assert d1.trace_id == tracing.fire_trace_id(key) != app_ctx.trace_id
        assert d1.span_id == tracing.dispatch_span_id(key, 1) and d1.parent_span_id == 0
        assert (submit.trace_id, submit.span_id) in d1.links
        assert d1.attributes["wheel.fence"] > 0 and "wheel.shard" in d1.attributes

        # The first attempt hangs; its worker dies; another takes the retry.
        wait_for(lambda: runs_of(node.target, job.job_id), 20, "the first run")
        first.stop(signal.SIGKILL)
        second = WorkerProc(node.target, out, "w-second", "e2e_handlers:traced")
        d2 = receiver.wait(
            "dispatch", timeout=30, **{"wheel.job_id": job.job_id, "wheel.attempt": 2}
        )
        assert d2.trace_id == d1.trace_id
        assert (d1.trace_id, d1.span_id) in d2.links  # the first attempt's
        assert (submit.trace_id, submit.span_id) in d2.links
        assert d2.attributes["wheel.fence"] > d1.attributes["wheel.fence"]

        run2 = receiver.wait("run", **{"wheel.job_id": job.job_id, "wheel.attempt": 2})
        assert run2.service == "wheel-worker"
        assert (run2.trace_id, run2.parent_span_id) == (d2.trace_id, d2.span_id)
        assert (d1.trace_id, tracing.run_span_id(key, 1)) in run2.links
        assert run2.attributes["wheel.worker_id"] == "w-second" and not run2.error
        work = receiver.wait("handler-work", **{"wheel.attempt": 2})
        assert (work.trace_id, work.parent_span_id) == (run2.trace_id, run2.span_id)
        # Nothing of the first attempt's run was exported: its worker was killed.
        assert not receiver.find("run", **{"wheel.job_id": job.job_id, "wheel.attempt": 1})
    finally:
        for w in (first, second):
            if w is not None:
                w.stop()
        node.stop()


class _Hook(http.server.BaseHTTPRequestHandler):
    """Answers 200 and keeps each request's traceparent (``server.seen``)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append(self.headers.get("traceparent", ""))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_an_http_targets_request_carries_its_run_spans_traceparent(
    receiver: OtlpReceiver, tmp_path: Path
) -> None:
    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    hook.seen = []  # type: ignore[attr-defined]
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    node = ServerProc(tmp_path / "data")
    node.start()
    worker = WorkerProc(
        node.target, tmp_path / "out", "w-http", flags=("--http", "--allow-private-targets")
    )
    try:
        wait_for(worker.connected, 30, "the worker to connect")
        with Client(node.target) as client:
            url = f"http://127.0.0.1:{hook.server_address[1]}/hook"
            job = client.submit(name="hook", http=HttpTarget(url=url), at=timedelta(0))
        seen = wait_for(lambda: list(hook.seen), 30, "the request")  # type: ignore[attr-defined]
        run = receiver.wait("run", **{"wheel.job_id": job.job_id})
        assert seen == [tracing.traceparent(run.trace_id, run.span_id)]
        fire = receiver.wait("dispatch", **{"wheel.job_id": job.job_id})
        key = idempotency_key(job.job_id, fire.attributes["wheel.scheduled_for_ms"])
        assert run.span_id == tracing.run_span_id(key, 1)
    finally:
        worker.stop()
        node.stop()
        hook.shutdown()
        hook.server_close()


APP = """
import json, sys
from datetime import timedelta

import psycopg
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from wheel import outbox, tracing

provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
tracing.install(provider)
with provider.get_tracer("app").start_as_current_span("place-order") as span:
    with psycopg.connect(sys.argv[1]) as conn:
        entry = outbox.submit(conn, name="via-outbox", handler="record", at=timedelta(0))
        conn.commit()
ctx = span.get_span_context()
print(json.dumps({"trace_id": ctx.trace_id, "span_id": ctx.span_id, "row": entry.id}))
"""


@pytest.mark.postgres
def test_a_job_submitted_through_the_outbox_links_its_fires_to_the_applications_span(
    receiver: OtlpReceiver, tmp_path: Path, pg_dsn: str
) -> None:
    node = ServerProc(tmp_path / "data", store=pg_dsn)
    node.start()
    worker = WorkerProc(node.target, tmp_path / "out", "w-outbox")
    try:
        wait_for(worker.connected, 30, "the worker to connect")
        # The application: its own process, its own SDK, a span around the
        # transaction that inserts the row.
        done = subprocess.run(
            [sys.executable, "-c", APP, pg_dsn], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        app = json.loads(done.stdout)
        with psycopg.connect(pg_dsn) as conn:

            def job_id() -> int | None:
                fate = outbox.fate(conn, app["row"])
                conn.commit()
                return fate.job_id

            job = wait_for(job_id, 30, "the row to become a job")
        dispatch = receiver.wait("dispatch", timeout=30, **{"wheel.job_id": job})
        assert (app["trace_id"], app["span_id"]) in dispatch.links
        assert dispatch.trace_id != app["trace_id"]  # the fire's own trace
    finally:
        worker.stop()
        node.stop()
