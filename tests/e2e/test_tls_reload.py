"""Certificates without a restart, under load: a ``wheelctl serve`` with
mutual TLS on gRPC and metrics, a worker process's lease stream open and
jobs firing, has its certificate, key and client CA replaced on disk by
ones of another CA. On SIGHUP, or by itself once it sees the files change,
new connections get the new certificate and must show a client certificate
of the new CA; the worker's stream, made under the old ones (which the node
now refuses to a new connection), goes on running runs; no fire is lost."""

from __future__ import annotations

import os
import signal
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from testkit.cluster import HANDLER, PAYLOAD, ClusterWorker
from testkit.procs import ServerProc, wait_for
from testkit.services import free_port
from tests.pki import Pair, Pki
from wheel.client import ChannelSecurity, Client, Run, RunState
from wheel.errors import WheelError

pytestmark = pytest.mark.slow

PERIOD = timedelta(milliseconds=200)
WORKER = "w-rotation"


@dataclass(frozen=True, slots=True, kw_only=True)
class Side:
    """One CA's world: what a client of it trusts and shows, and the node's
    certificate from it."""

    ca: Path
    client: Pair
    node: Pair

    def security(self) -> ChannelSecurity:
        return ChannelSecurity.from_files(ca=self.ca, cert=self.client.cert, key=self.client.key)

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.load_cert_chain(self.client.cert, self.client.key)
        return ctx


def _sides(pki: Pki) -> tuple[Side, Side]:
    return (
        Side(ca=pki.ca, client=pki.client, node=pki.node),
        Side(ca=pki.other_ca, client=pki.other_client, node=pki.other_node),
    )


def _put(path: Path, source: Path) -> None:
    """Replace ``path`` with a copy of ``source`` in one step, as a
    certificate manager does (write aside, rename over)."""
    aside = path.with_name(f".{path.name}.new")
    aside.write_bytes(source.read_bytes())
    os.replace(aside, path)


def _der(pem: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.read_text())


def _grpc_certificate(port: int, side: Side) -> bytes:
    """The certificate a new TLS connection to the gRPC port is shown."""
    ctx = side.context()
    ctx.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        cert = tls.getpeercert(binary_form=True)
    assert cert is not None
    return cert


def _metrics_certificate(port: int, side: Side) -> bytes:
    """The certificate a new scrape of the metrics port is shown (and that
    the scrape is answered)."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        side.context().wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        reply = b""
        while chunk := tls.recv(65536):
            reply += chunk
        cert = tls.getpeercert(binary_form=True)
    assert reply.startswith(b"HTTP/1.1 200 OK") and b"wheel_" in reply
    assert cert is not None
    return cert


def _refused(target: str, side: Side) -> bool:
    with Client(target, timeout=1.0, security=side.security()) as client:
        try:
            client.status()
        except WheelError as exc:
            return str(exc).startswith("UNAVAILABLE: cannot connect")
    return False


def _log(server: ServerProc) -> str:
    return (server.data_dir.parent / f"server-{server.starts}.log").read_text()


def _done_runs(client: Client, job_id: int) -> list[Run]:
    try:
        return [r for r in client.runs(job_id) if r.state == RunState.SUCCEEDED]
    except WheelError:
        return []


@pytest.fixture
def node_files(tmp_path: Path, pki: Pki) -> Iterator[tuple[Path, Path, Path]]:
    """The node's certificate, key and client CA: copies of the first CA's,
    which the test replaces."""
    old, _ = _sides(pki)
    tls = tmp_path / "tls"
    tls.mkdir()
    files = (tls / "node.pem", tls / "node.key", tls / "client-ca.pem")
    for path, source in zip(files, (old.node.cert, old.node.key, old.ca), strict=True):
        _put(path, source)
    yield files


@pytest.mark.parametrize("how", ["sighup", "file_change"])
def test_a_rotation_under_load_reaches_new_connections_and_keeps_the_open_stream(
    how: str, tmp_path: Path, pki: Pki, node_files: tuple[Path, Path, Path]
) -> None:
    old, new = _sides(pki)
    cert, key, client_ca = node_files
    metrics_port = free_port()
    metrics = f"127.0.0.1:{metrics_port}"
    server = ServerProc(
        tmp_path / "data",
        args=(
            "--tls-cert", str(cert), "--tls-key", str(key), "--client-ca", str(client_ca),
            "--metrics-listen", metrics, "--min-interval", "100ms",
            # SIGHUP alone, or the files looked at often (the default is seconds).
            "--tls-reload-interval", "off" if how == "sighup" else "200ms",
        ),
        security=old.security(),
    )  # fmt: skip
    server.start()
    out = tmp_path / "runs"
    worker = ClusterWorker(
        [server.target],
        out,
        WORKER,
        env={
            "WHEEL_TLS_CA": str(old.ca),
            "WHEEL_TLS_CERT": str(old.client.cert),
            "WHEEL_TLS_KEY": str(old.client.key),
        },
    )
    try:
        with Client(server.target, security=old.security()) as before:
            wait_for(lambda: worker.connections() == 1, 20, "the worker's stream")
            # Fires queue behind a run in flight: on a loaded machine a run can
            # outlast the period, and a skipped fire would be the overlap policy
            # at work, not a loss.
            every = before.submit(
                name="every", handler=HANDLER, every=PERIOD, payload=PAYLOAD, overlap="buffer_all"
            )
            # Fires due around and after the rotation, submitted before it.
            due = datetime.now(UTC) + timedelta(seconds=1)
            early = [
                before.submit(
                    name=f"early-{i}",
                    handler=HANDLER,
                    at=due + i * timedelta(milliseconds=50),
                    payload=PAYLOAD,
                ).job_id
                for i in range(20)
            ]
            wait_for(lambda: len(_done_runs(before, every.job_id)) >= 3, 20, "runs before")
        assert _grpc_certificate(server.port, old) == _der(old.node.cert)
        assert _metrics_certificate(metrics_port, old) == _der(old.node.cert)

        if how == "file_change":
            # Half a rotation first: a new key under the old certificate is
            # not put in force, and the node keeps serving what it has.
            _put(key, new.node.key)
            wait_for(
                lambda: "TLS files not reloaded (the files changed): --tls-key:" in _log(server),
                20,
                "the node to refuse the key without its certificate",
            )
            assert _grpc_certificate(server.port, old) == _der(old.node.cert)
            _put(client_ca, new.ca)
            _put(cert, new.node.cert)
        else:
            for path, source in zip(node_files, (new.node.cert, new.node.key, new.ca), strict=True):
                _put(path, source)
            assert server.proc is not None
            server.proc.send_signal(signal.SIGHUP)
        why = "SIGHUP" if how == "sighup" else "the files changed"
        wait_for(
            lambda: f"TLS reloaded ({why}): the listeners' certificates" in _log(server),
            20,
            "the node to reload its certificates",
        )
        reloaded = datetime.now(UTC)
        if how == "file_change":
            # The CA and the certificate came in two steps: wait for the last.
            wait_for(
                lambda: _grpc_certificate(server.port, new) == _der(new.node.cert),
                20,
                "the new certificate on new connections",
            )

        # New connections: the new certificate, on gRPC and metrics; a client
        # of the old CA is refused, one of the new CA served.
        assert _grpc_certificate(server.port, new) == _der(new.node.cert)
        assert _metrics_certificate(metrics_port, new) == _der(new.node.cert)
        assert _refused(server.target, old)
        server.security = new.security()
        with Client(server.target, security=new.security()) as after:
            assert [w.worker_id for w in after.status().worker_list] == [WORKER]
            late = [
                after.submit(
                    name=f"late-{i}",
                    handler=HANDLER,
                    at=timedelta(milliseconds=100),
                    payload=PAYLOAD,
                ).job_id
                for i in range(10)
            ]
            # The open stream goes on: runs keep completing on it, though a new
            # connection with the worker's certificates would be refused now.
            wait_for(
                lambda: (
                    sum(
                        r.finished_at is not None and r.finished_at > reloaded
                        for r in _done_runs(after, every.job_id)
                    )
                    >= 5
                ),
                20,
                "runs completed after the reload",
            )
            wait_for(
                lambda: all(_done_runs(after, j) for j in early + late),
                20,
                "the one-shots' runs",
                0.25,
            )
            end = datetime.now(UTC) - PERIOD
            wait_for(
                lambda: max(r.scheduled_for for r in _done_runs(after, every.job_id)) > end,
                20,
                "the interval job to catch up to now",
            )
            history = list(after.runs(every.job_id))
            for job_id in early + late:
                [run] = after.runs(job_id)
                assert (run.state, run.attempt, run.worker_id) == (
                    RunState.SUCCEEDED,
                    1,
                    WORKER,
                )
        assert worker.alive and worker.connections() == 1
    finally:
        worker.stop()
        server.stop()

    # Nothing lost: every fire of the interval job up to the last one checked
    # ran once, first time, on the one stream; none was missed.
    fires = sorted((r for r in history if r.scheduled_for <= end), key=lambda r: r.scheduled_for)
    assert fires and all(r.state == RunState.SUCCEEDED for r in fires), [
        (r.scheduled_for, r.state, r.missed_reason) for r in fires if r.state != "succeeded"
    ]
    assert {(r.attempt, r.worker_id) for r in fires} == {(1, WORKER)}
    first = fires[0].scheduled_for
    steps = [(r.scheduled_for - first) / PERIOD for r in fires]
    assert steps == list(range(len(fires)))
