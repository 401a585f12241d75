"""Secrets stay out of what wheel writes: a node, a worker and ``wheelctl``
all at debug level (the node in JSON, the others in text), a job whose
payload is a recognisable secret run end to end over TLS, and a call that
carries an ``authorization`` header. Neither the payload, nor the token,
nor a line of the node's private key appears in any log, output or
``ListRuns`` answer."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from testkit.procs import HERE, recorded, wait_for
from testkit.services import free_port
from tests.pki import Pki
from wheel.rpc.v1 import job_service_pb2, job_service_pb2_grpc
from wheel.tls import ChannelSecurity, make_channel

pytestmark = pytest.mark.slow


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_no_payload_token_or_key_reaches_a_log_or_an_answer(pki: Pki, tmp_path: Path) -> None:
    payload = f"payload-secret-{secrets.token_hex(8)}"
    token = f"token-secret-{secrets.token_hex(8)}"
    key_lines = [line for line in pki.node.key.read_text().splitlines() if "-----" not in line]
    target = f"127.0.0.1:{free_port()}"
    out = tmp_path / "runs"
    env = dict(
        os.environ,
        WHEEL_TLS_CA=str(pki.ca),
        WHEEL_E2E_OUT=str(out),
        PYTHONPATH=str(HERE),
    )
    wheel = [sys.executable, "-m", "wheel", "-v"]
    node_log, worker_log = tmp_path / "node.log", tmp_path / "worker.log"
    with open(node_log, "wb") as log:
        node = subprocess.Popen(
            [
                *wheel, "serve", "--log-format", "json", "--data-dir", str(tmp_path / "data"),
                "--listen", target,
                "--tls-cert", str(pki.node.cert), "--tls-key", str(pki.node.key),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    with open(worker_log, "wb") as log:
        worker = subprocess.Popen(
            [*wheel, "worker", "--target", target, "--worker-id", "w", "e2e_handlers:record"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    answers: list[str] = []

    def wheelctl(*args: str) -> str:
        done = subprocess.run(
            [*wheel, *args, "--target", target], env=env, capture_output=True, text=True, timeout=60
        )
        answers.extend([done.stdout, done.stderr])
        assert done.returncode == 0, done.stderr
        return done.stdout

    try:
        wait_for(lambda: "connected to" in worker_log.read_text(), 30, "the worker to connect")
        submitted = wheelctl(
            "submit", "--name", "secret", "--handler", "record", "--at", "+200ms",
            "--payload", payload, "--json",
        )  # fmt: skip
        job_id = submitted.split('"job_id": ')[1].split(",")[0]
        wait_for(lambda: recorded(out), 20, "the run")
        wait_for(lambda: '"succeeded"' in wheelctl("runs", job_id, "--json"), 10, "its record")
        wheelctl("runs", job_id)
        wheelctl("status")
        # A call with a bearer token (for a job that may not exist): never logged.
        with make_channel(target, ChannelSecurity.from_files(ca=pki.ca)) as channel:
            stub = job_service_pb2_grpc.JobServiceStub(channel)
            with contextlib.suppress(grpc.RpcError):
                stub.GetJob(
                    job_service_pb2.GetJobRequest(job_id=int(job_id) + 1),
                    metadata=(("authorization", f"Bearer {token}"),),
                    timeout=10,
                )
    finally:
        _stop(worker)
        _stop(node)
    logs = {"node": node_log.read_text(), "worker": worker_log.read_text()}
    assert '"level": "DEBUG"' in logs["node"] and " DEBUG " in logs["worker"]  # debug was on
    assert "TLS on" in logs["node"]
    for name, text in [*logs.items(), *(("wheelctl", a) for a in answers)]:
        assert payload not in text, name
        assert token not in text, name
        assert not any(line in text for line in key_lines), name
