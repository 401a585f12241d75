"""The console of a node with TLS: HTTPS with the node's certificate, and its
own channel to the node's API over TLS too."""

from __future__ import annotations

import json
import ssl
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest

from tests.console.http import ConsoleNode
from tests.pki import Pki
from wheel.client import Client
from wheel.tls import ChannelSecurity

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mutual-tls"])
def test_a_tls_nodes_console_serves_https_and_reads_the_api_over_tls(
    pki: Pki, tmp_path: Path, mutual: bool
) -> None:
    flags: tuple[str, ...] = ("--tls-cert", str(pki.node.cert), "--tls-key", str(pki.node.key))
    if mutual:
        flags += ("--client-ca", str(pki.ca))
    client_tls = ChannelSecurity.from_files(ca=pki.ca, cert=pki.client.cert, key=pki.client.key)
    node = ConsoleNode(tmp_path / "data", args=flags)
    node.security = client_tls
    node.start()
    try:
        with Client(node.target, security=client_tls) as client:
            job_id = client.submit(name="secure", handler="h", every=timedelta(hours=1)).job_id
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        if mutual:
            ctx.load_cert_chain(pki.client.cert, pki.client.key)
        url = f"https://127.0.0.1:{node.http_port}/api/jobs?name=sec"
        with urllib.request.urlopen(url, context=ctx, timeout=10) as resp:
            listed = json.loads(resp.read())
        assert [j["job_id"] for j in listed["jobs"]] == [str(job_id)]
        plain = f"http://127.0.0.1:{node.http_port}/api/config"
        with pytest.raises(OSError):  # no plaintext beside HTTPS
            urllib.request.urlopen(plain, timeout=5).read()
    finally:
        node.stop()
