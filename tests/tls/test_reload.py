"""``TlsReloader``'s rules, in process on real files: what a reload puts in
force, what it refuses (a rotation half written, a key that is not its
certificate's, a change that takes a restart), and that what is in force
stays until the files are whole again. The processes, the handshakes and
the open streams are in tests/e2e/test_tls_reload.py."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from tests.pki import Pki
from wheel.cli import build_parser
from wheel.errors import InvalidArgument
from wheel.tls import (
    LiveChannelSecurity,
    LiveServerSecurity,
    ServerSecurity,
    TlsReloader,
    node_security,
    tls_paths,
)


def _put(path: Path, source: Path) -> None:
    aside = path.with_name(f".{path.name}.new")
    aside.write_bytes(source.read_bytes())
    os.replace(aside, path)


class Files:
    """A node's certificate, key, client CA and etcd certificates, copied so
    a test can replace them, and the reloader of a node started on them."""

    def __init__(self, root: Path, pki: Pki) -> None:
        self.cert, self.key, self.ca = root / "node.pem", root / "node.key", root / "ca.pem"
        self.etcd_cert, self.etcd_key = root / "etcd.pem", root / "etcd.key"
        for path, source in (
            (self.cert, pki.node.cert),
            (self.key, pki.node.key),
            (self.ca, pki.ca),
            (self.etcd_cert, pki.client.cert),
            (self.etcd_key, pki.client.key),
        ):
            _put(path, source)
        ns = build_parser().parse_args(
            [
                "serve", "--listen", "127.0.0.1:0",
                "--tls-cert", str(self.cert), "--tls-key", str(self.key),
                "--client-ca", str(self.ca),
                "--cluster", "etcd://127.0.0.1:2379/c",
                "--etcd-ca", str(self.ca),
                "--etcd-cert", str(self.etcd_cert), "--etcd-key", str(self.etcd_key),
            ]
        )  # fmt: skip
        first = node_security(ns)
        assert first.server is not None
        self.server = LiveServerSecurity(first.server)
        self.peers = LiveChannelSecurity(first.peers)
        self.etcd = LiveChannelSecurity(first.etcd)
        self.reloader = TlsReloader(
            lambda: node_security(ns),
            tls_paths(ns),
            server=self.server,
            peers=self.peers,
            etcd=self.etcd,
        )

    def reload(self) -> bool:
        return asyncio.run(self.reloader.reload("test"))


@pytest.fixture
def files(tmp_path: Path, pki: Pki) -> Files:
    return Files(tmp_path, pki)


def test_a_whole_rotation_is_put_in_force_everywhere(files: Files, pki: Pki) -> None:
    _put(files.cert, pki.other_node.cert)
    _put(files.key, pki.other_node.key)
    _put(files.ca, pki.other_ca)
    _put(files.etcd_cert, pki.other_client.cert)
    _put(files.etcd_key, pki.other_client.key)
    assert files.reload()
    server = files.server.current
    assert server.cert == pki.other_node.cert.read_bytes()
    assert server.client_ca == pki.other_ca.read_bytes()
    # The node calls its peers with its new certificate, trusting the new CA.
    assert files.peers.current.cert == pki.other_node.cert.read_bytes()
    assert files.peers.current.ca == pki.other_ca.read_bytes()
    assert files.etcd.current.cert == pki.other_client.cert.read_bytes()
    assert (files.peers.version, files.etcd.version) == (1, 1)
    # Read again unchanged: nothing new is put in force.
    assert not files.reload()
    assert (files.peers.version, files.etcd.version) == (1, 1)


def test_half_a_rotation_is_refused_and_the_rest_of_it_taken(
    files: Files, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    before = files.server.current
    _put(files.key, pki.other_node.key)
    with caplog.at_level(logging.WARNING, logger="wheel.tls"):
        assert not files.reload()
    assert files.server.current is before
    assert files.peers.version == files.etcd.version == 0
    [refusal] = [r.getMessage() for r in caplog.records if r.name == "wheel.tls"]
    assert refusal.startswith(f"TLS files not reloaded (test): --tls-key: {files.key} is not")
    assert refusal.endswith("; the ones in force stay")
    _put(files.cert, pki.other_node.cert)
    assert files.reload()
    assert files.server.current.cert == pki.other_node.cert.read_bytes()


def test_a_missing_file_keeps_what_is_in_force(files: Files) -> None:
    before = files.server.current
    files.ca.unlink()
    assert not files.reload()
    assert files.server.current is before


def test_a_change_to_the_files_is_seen_without_a_signal(files: Files, pki: Pki) -> None:
    async def body() -> None:
        watching = asyncio.create_task(files.reloader.watch(0.05))
        try:
            _put(files.cert, pki.other_node.cert)
            _put(files.key, pki.other_node.key)
            async with asyncio.timeout(10):
                while files.peers.version == 0:
                    await asyncio.sleep(0.02)
        finally:
            watching.cancel()

    asyncio.run(body())
    assert files.server.current.cert == pki.other_node.cert.read_bytes()


def test_turning_client_certificates_off_takes_a_restart(pki: Pki) -> None:
    mutual = ServerSecurity.from_files(cert=pki.node.cert, key=pki.node.key, client_ca=pki.ca)
    plain = ServerSecurity.from_files(cert=pki.node.cert, key=pki.node.key)
    assert mutual is not None and plain is not None
    live = LiveServerSecurity(mutual)
    with pytest.raises(InvalidArgument, match="takes a restart"):
        live.replace(plain)
    assert live.current is mutual
