"""The HTTP executor through a real node (in process, SQLite, real gRPC) and
a real worker with ``http=True``: a job whose handler is ``http`` and whose
payload is an ``HttpCall`` is sent to a real HTTP server on loopback, and
a 503 is retried by the node as a new attempt that succeeds, and a worker
killed in the middle of a request leaves it to another attempt under a
higher fence with the same idempotency key."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.rpc.test_api import (
    Api,
    InProcessServer,
    WorkerThread,
    all_runs,
    connect,
    now_ms,
    once,
    spec,
    submit,
    wait_for,
)
from wheel.engine.owner import OwnerConfig
from wheel.rpc.v1 import jobs_pb2


class _Flaky(BaseHTTPRequestHandler):
    """503 for a fire's first attempt, 200 after; every request recorded."""

    protocol_version = "HTTP/1.1"
    seen: list[dict[str, str]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.seen.append({**dict(self.headers.items()), "body": body.decode()})
        status, text = (503, b"busy") if len(self.seen) == 1 else (200, b"done")
        self.send_response(status)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def flaky() -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    handler = type("Handler", (_Flaky,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    server = InProcessServer(tmp_path).start()
    try:
        with connect(server) as a:
            yield a
    finally:
        server.stop()


def http_spec(target: jobs_pb2.HttpTarget, body: bytes) -> jobs_pb2.JobSpec:
    """A one-shot calling ``target`` now, retried twice after 100 ms or so."""
    msg = spec(
        name="hook",
        payload=body,
        schedule=once(now_ms()),
        retry=jobs_pb2.RetryPolicy(
            max_attempts=3, initial_backoff_ms=100, max_backoff_ms=200, multiplier=2
        ),
    )
    msg.handler = ""
    msg.http.CopyFrom(target)
    return msg


def test_an_http_job_through_a_node_is_retried_after_a_503_and_then_succeeds(
    api: Api, flaky: tuple[str, list[dict[str, str]]]
) -> None:
    url, seen = flaky
    target = jobs_pb2.HttpTarget(
        url=url, headers=[jobs_pb2.HttpHeader(name="X-Team", value="blue")]
    )
    options = {"http": True, "allow_private_targets": True}
    with WorkerThread(api.server.target, "w-http", options=options):
        job_id = submit(
            api,
            http_spec(target, b'{"report": 1}'),
        ).job.job_id

        def succeeded() -> list[jobs_pb2.Run] | None:
            runs = all_runs(api, job_id)
            return runs if any(r.state == jobs_pb2.RUN_STATE_SUCCEEDED for r in runs) else None

        runs = wait_for(succeeded, 20, "the second attempt to succeed")
    by_attempt = {r.attempt: r for r in runs}
    assert by_attempt[1].state == jobs_pb2.RUN_STATE_FAILED
    assert by_attempt[1].error == "HTTP 503 Service Unavailable"
    assert by_attempt[2].state == jobs_pb2.RUN_STATE_SUCCEEDED
    assert len(seen) == 2
    first, second = seen
    assert first["Idempotency-Key"] == second["Idempotency-Key"] == runs[0].idempotency_key
    assert (first["Wheel-Attempt"], second["Wheel-Attempt"]) == ("1", "2")
    assert int(second["Wheel-Fence"]) > int(first["Wheel-Fence"])
    assert first["X-Team"] == "blue" and first["body"] == '{"report": 1}'


class _HangsFirst(BaseHTTPRequestHandler):
    """The first request hangs (until ``release``); the rest get 200."""

    protocol_version = "HTTP/1.1"
    seen: list[dict[str, str]] = []
    release = threading.Event()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.seen.append(dict(self.headers.items()))
        if len(self.seen) == 1:
            self.release.wait(30)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_worker_killed_mid_request_leaves_a_second_attempt_with_a_higher_fence(
    tmp_path: Path,
) -> None:
    seen: list[dict[str, str]] = []
    release = threading.Event()
    handler = type("Handler", (_HangsFirst,), {"seen": seen, "release": release})
    http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    server = InProcessServer(tmp_path, OwnerConfig(lease_ms=1_500, grace_lease_ms=800)).start()
    proc: subprocess.Popen[bytes] | None = None
    try:
        with connect(server) as api:
            worker = ["worker", "--http", "--allow-private-targets", "--worker-id", "doomed"]
            proc = subprocess.Popen(
                [sys.executable, "-m", "wheel", *worker, "--target", server.target]
            )
            url = f"http://127.0.0.1:{http.server_address[1]}/hook"
            job_id = submit(api, http_spec(jobs_pb2.HttpTarget(url=url), b"{}")).job.job_id
            wait_for(lambda: seen, 20, "the first request")
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            options = {"http": True, "allow_private_targets": True}
            with WorkerThread(server.target, "w-2", options=options):

                def succeeded() -> bool:
                    return any(
                        r.state == jobs_pb2.RUN_STATE_SUCCEEDED for r in all_runs(api, job_id)
                    )

                wait_for(succeeded, 20, "another attempt to succeed")
        assert len(seen) == 2
        first, second = seen
        assert first["Idempotency-Key"] == second["Idempotency-Key"]
        assert int(second["Wheel-Fence"]) > int(first["Wheel-Fence"])
    finally:
        release.set()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop()
        http.shutdown()
        http.server_close()
