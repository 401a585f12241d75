"""TLS end to end: a real ``wheelctl serve`` with ``--tls-cert``/``--tls-key``
(and ``--client-ca`` for mutual TLS), reached by the SDKs, ``wheelctl`` and
a ``wheelctl worker`` process; whoever lacks the right CA or certificate is
refused, with an error that says what to check."""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from testkit.procs import HERE, ServerProc, recorded, wait_for
from testkit.services import free_port
from tests.pki import Pki
from wheel.client import AsyncClient, ChannelSecurity, Client
from wheel.errors import Unauthenticated, WheelError
from wheel.worker import Worker

pytestmark = pytest.mark.slow


def _serve(root: Path, pki: Pki, *extra: str) -> Iterator[ServerProc]:
    flags = ("--tls-cert", str(pki.node.cert), "--tls-key", str(pki.node.key), *extra)
    client = ChannelSecurity.from_files(ca=pki.ca, cert=pki.client.cert, key=pki.client.key)
    server = ServerProc(root / "data", args=flags, security=client)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tls_node(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    """TLS, no client certificates asked for."""
    yield from _serve(tmp_path_factory.mktemp("tls"), pki)


@pytest.fixture(scope="module")
def mtls_node(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    """Mutual TLS: client certificates signed by ``pki.ca`` required; metrics too."""
    metrics = f"127.0.0.1:{free_port()}"
    root = tmp_path_factory.mktemp("mtls")
    yield from _serve(root, pki, "--client-ca", str(pki.ca), "--metrics-listen", metrics)


def _refusal(target: str, security: ChannelSecurity) -> str:
    with Client(target, timeout=1.0, security=security) as client, pytest.raises(WheelError) as e:
        client.status()
    return str(e.value)


def test_a_client_that_trusts_the_nodes_ca_submits_over_tls(tls_node: ServerProc, pki: Pki) -> None:
    with Client(tls_node.target, security=ChannelSecurity.from_files(ca=pki.ca)) as client:
        job = client.submit(name="tls", handler="h", at=timedelta(hours=1))
        assert client.get(job.job_id).name == "tls"

    async def over_aio() -> str:
        security = ChannelSecurity.from_files(ca=pki.ca)
        async with AsyncClient(tls_node.target, security=security) as client:
            return (await client.get(job.job_id)).name

    assert asyncio.run(over_aio()) == "tls"


def test_a_client_that_trusts_another_ca_is_refused(tls_node: ServerProc, pki: Pki) -> None:
    message = _refusal(tls_node.target, ChannelSecurity.from_files(ca=pki.other_ca))
    assert message.startswith(f"UNAVAILABLE: cannot connect to {tls_node.target}")
    assert "CERTIFICATE_VERIFY_FAILED" in message and "--tls-ca" in message


def test_a_plaintext_client_is_refused_by_a_tls_node(tls_node: ServerProc) -> None:
    message = _refusal(tls_node.target, ChannelSecurity())
    assert message.startswith("UNAVAILABLE: cannot connect")
    assert "give --tls-ca" in message


def test_wheelctl_reaches_a_tls_node_with_the_ca_from_its_environment(
    tls_node: ServerProc, pki: Pki
) -> None:
    env = dict(os.environ, WHEEL_TLS_CA=str(pki.ca))
    out = subprocess.run(
        [sys.executable, "-m", "wheel", "status", "--target", tls_node.target],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("node node-1:")


def test_mutual_tls_takes_a_client_certificate_its_ca_signed(
    mtls_node: ServerProc, pki: Pki
) -> None:
    security = ChannelSecurity.from_files(ca=pki.ca, cert=pki.client.cert, key=pki.client.key)
    with Client(mtls_node.target, security=security) as client:
        assert client.status().node_id == "node-1"


def test_mutual_tls_refuses_a_client_without_a_certificate(mtls_node: ServerProc, pki: Pki) -> None:
    message = _refusal(mtls_node.target, ChannelSecurity.from_files(ca=pki.ca))
    assert message.startswith("UNAVAILABLE: cannot connect")
    assert "--tls-cert and --tls-key" in message


def test_mutual_tls_refuses_a_certificate_from_another_ca(mtls_node: ServerProc, pki: Pki) -> None:
    other = pki.other_client
    security = ChannelSecurity.from_files(ca=pki.ca, cert=other.cert, key=other.key)
    assert _refusal(mtls_node.target, security).startswith("UNAVAILABLE: cannot connect")


def test_a_worker_without_a_client_certificate_gets_no_stream(
    mtls_node: ServerProc, pki: Pki
) -> None:
    worker = Worker(
        mtls_node.target,
        worker_id="no-cert",
        security=ChannelSecurity.from_files(ca=pki.ca),
        reconnect_max=0.2,
    )
    worker.register("h", lambda ctx: None)

    async def attempt() -> int:
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(2.0)
        connected = worker.connected
        worker.stop()
        await task
        return connected

    assert asyncio.run(attempt()) == 0
    security = ChannelSecurity.from_files(ca=pki.ca, cert=pki.client.cert, key=pki.client.key)
    with Client(mtls_node.target, security=security) as client:
        assert "no-cert" not in {w.worker_id for w in client.status().worker_list}


def test_a_worker_process_runs_a_job_over_mutual_tls(
    mtls_node: ServerProc, pki: Pki, tmp_path: Path
) -> None:
    out = tmp_path / "runs"
    cert, key = pki.client.cert, pki.client.key
    env = dict(os.environ, WHEEL_E2E_OUT=str(out), PYTHONPATH=str(HERE))
    with open(tmp_path / "worker.log", "wb") as log:
        worker = subprocess.Popen(
            [
                sys.executable, "-m", "wheel", "worker", "--target", mtls_node.target,
                "--worker-id", "tls-worker", "--tls-ca", str(pki.ca),
                "--tls-cert", str(cert), "--tls-key", str(key), "e2e_handlers:record",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )  # fmt: skip
    security = ChannelSecurity.from_files(ca=pki.ca, cert=cert, key=key)
    try:
        with Client(mtls_node.target, security=security) as client:
            job = client.submit(
                name="over-mtls",
                handler="record",
                at=timedelta(milliseconds=200),
                idempotency_key="over-mtls",
            )
            wait_for(lambda: recorded(out), 20, "the worker to run the job")
            wait_for(
                lambda: [r.state for r in client.runs(job.job_id)] == ["succeeded"],
                10,
                "the run to be recorded succeeded",
            )
            [run] = client.runs(job.job_id)
            assert run.worker_id == "tls-worker"
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    [(_key, attempt, _fence)] = recorded(out)
    assert attempt == 1


def test_metrics_are_served_over_tls_to_a_scraper_with_a_certificate(
    mtls_node: ServerProc, pki: Pki
) -> None:
    metrics = mtls_node.args[mtls_node.args.index("--metrics-listen") + 1]
    url = f"https://{metrics}/metrics"
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    ctx.load_cert_chain(pki.client.cert, pki.client.key)
    with urllib.request.urlopen(url, context=ctx, timeout=10) as resp:
        assert b"wheel_" in resp.read()
    bare = ssl.create_default_context(cafile=str(pki.ca))
    with pytest.raises(OSError):  # no client certificate: the handshake fails
        urllib.request.urlopen(url, context=bare, timeout=10).read()


class _Count(grpc.UnaryUnaryClientInterceptor):
    """Counts the calls it sees, and adds a header to each."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.methods.append(details.method)
        metadata = [*(details.metadata or ()), ("x-wheel-test", "1")]
        return continuation(details._replace(metadata=metadata), request)


class _CountStreams(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self) -> None:
        self.methods: list[str] = []

    async def intercept_stream_stream(
        self, continuation: Any, details: Any, request_iterator: Any
    ) -> Any:
        method = details.method  # bytes in grpc.aio
        self.methods.append(method.decode() if isinstance(method, bytes) else method)
        return await continuation(details, request_iterator)


def test_interceptors_wrap_every_call_over_mutual_tls(mtls_node: ServerProc, pki: Pki) -> None:
    security = ChannelSecurity.from_files(ca=pki.ca, cert=pki.client.cert, key=pki.client.key)
    calls = _Count()
    with Client(mtls_node.target, security=security, interceptors=[calls]) as client:
        client.status()
    assert calls.methods[-1] == "/wheel.rpc.v1.AdminService/GetClusterStatus"
    streams = _CountStreams()
    worker = Worker(
        mtls_node.target, worker_id="intercepted", security=security, interceptors=[streams]
    )
    worker.register("h", lambda ctx: None)

    async def connect() -> None:
        task = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(_until(lambda: worker.connected == 1), 20)
        finally:
            worker.stop()
            await task

    asyncio.run(connect())
    assert streams.methods == ["/wheel.rpc.v1.WorkerService/Connect"]


async def _until(done: Callable[[], bool]) -> None:
    while not done():
        await asyncio.sleep(0.05)


def test_tls_and_auth_together_serve_a_network_address_and_each_still_holds(
    pki: Pki, tmp_path: Path
) -> None:
    # TLS and --auth at once: the node may listen on every interface (no
    # --insecure), a caller needs both the CA and a token, and the token's
    # tenant is the one its jobs land in.
    admin_file = tmp_path / "admin.token"
    server = ServerProc(
        tmp_path / "data",
        args=(
            "--tls-cert", str(pki.node.cert), "--tls-key", str(pki.node.key),
            "--auth", "--init-admin-token", str(admin_file),
        ),
        security=ChannelSecurity.from_files(ca=pki.ca),
    )  # fmt: skip
    server.args += ("--listen", f"0.0.0.0:{server.port}")
    server.start()
    try:
        admin = admin_file.read_text().strip()
        security = ChannelSecurity.from_files(ca=pki.ca)
        with Client(server.target, security=security, token=admin) as client:
            acme, _ = client.create_token(tenant="acme", scopes=["jobs:read", "jobs:write"])
        with Client(server.target, security=security, token=acme) as client:
            job = client.submit(name="both", handler="h", at=timedelta(hours=1))
            assert client.get(job.job_id).tenant == "acme"
        anonymous = Client(server.target, timeout=2.0, security=security)
        with anonymous, pytest.raises(Unauthenticated, match="missing bearer token"):
            anonymous.get(job.job_id)
        message = _refusal(server.target, ChannelSecurity())  # the token, but no TLS
        assert message.startswith("UNAVAILABLE: cannot connect")
    finally:
        server.stop()
