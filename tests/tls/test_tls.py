"""TLS settings as values, ``wheelctl``'s TLS flags, and the safe default
for where a node listens: ``check_listen`` and ``serve`` refusing a
network address with neither TLS nor auth."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.services import free_port
from tests.pki import Pki
from wheel.cli import build_parser
from wheel.errors import InvalidArgument, WheelError
from wheel.tls import (
    ChannelSecurity,
    ServerSecurity,
    check_listen,
    is_loopback,
    listen_notice,
    node_security,
    read_pem,
)


def key_body(path: Path) -> str:
    """A line of a PEM key's base64: what must never be shown."""
    return path.read_text().splitlines()[1]


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:50051", True),
        ("127.0.0.2:50051", True),
        ("localhost:50051", True),
        ("[::1]:50051", True),
        ("unix:/run/wheel.sock", True),
        ("0.0.0.0:50051", False),
        ("[::]:50051", False),
        (":50051", False),
        ("10.0.0.5:50051", False),
        ("wheel.example.com:50051", False),
    ],
)
def test_only_loopback_addresses_and_unix_sockets_count_as_loopback(
    address: str, loopback: bool
) -> None:
    assert is_loopback(address) is loopback


def test_check_listen_refuses_a_network_address_with_neither_tls_nor_auth() -> None:
    problem = check_listen("0.0.0.0:50051", tls=False, auth=False, insecure=False)
    assert problem is not None
    assert problem.startswith("--listen 0.0.0.0:50051")
    assert "--insecure" in problem and "--tls-cert" in problem


@pytest.mark.parametrize(
    ("address", "tls", "auth", "insecure"),
    [
        ("127.0.0.1:50051", False, False, False),
        ("0.0.0.0:50051", True, False, False),
        ("0.0.0.0:50051", False, True, False),
        ("0.0.0.0:50051", False, False, True),
        ("[::]:50051", True, True, False),
    ],
)
def test_check_listen_allows_loopback_tls_auth_or_insecure(
    address: str, tls: bool, auth: bool, insecure: bool
) -> None:
    assert check_listen(address, tls, auth, insecure) is None


def test_a_node_without_tls_or_auth_says_it_serves_loopback_only() -> None:
    level, line = listen_notice("127.0.0.1:50051", tls=False, mutual=False, auth=False)
    assert level == logging.INFO
    assert "loopback 127.0.0.1:50051 only" in line and "no TLS and no auth" in line
    level, line = listen_notice("0.0.0.0:50051", tls=False, mutual=False, auth=False)
    assert level == logging.WARNING and "--insecure" in line
    assert "client certificates required" in listen_notice("h:1", True, True, False)[1]


def test_serve_flags_give_tls_on_every_side(pki: Pki) -> None:
    ns = build_parser().parse_args(
        [
            "serve",
            "--listen", "0.0.0.0:50051",
            "--tls-cert", str(pki.node.cert),
            "--tls-key", str(pki.node.key),
            "--client-ca", str(pki.ca),
            "--cluster", "etcd://127.0.0.1:2379/c",
            "--etcd-ca", str(pki.ca),
            "--etcd-cert", str(pki.node.cert),
            "--etcd-key", str(pki.node.key),
        ]
    )  # fmt: skip
    security = node_security(ns)
    assert security.server is not None and security.server.mutual
    # The node calls its peers with its own certificate, trusting --client-ca.
    assert security.peers.secure and security.peers.ca == pki.ca.read_bytes()
    assert security.peers.cert == pki.node.cert.read_bytes()
    assert security.etcd.secure and security.etcd.key == pki.node.key.read_bytes()


def test_peer_tls_ca_overrides_the_client_ca_for_calls_to_peers(pki: Pki) -> None:
    args = ["serve", "--tls-cert", str(pki.node.cert), "--tls-key", str(pki.node.key)]
    security = node_security(build_parser().parse_args([*args, "--peer-tls-ca", str(pki.ca)]))
    assert security.server is not None and not security.server.mutual
    assert security.peers.ca == pki.ca.read_bytes()
    # Without either: the system's roots.
    assert node_security(build_parser().parse_args(args)).peers.ca is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tls-cert", "CERT"], "--tls-key: --tls-cert needs --tls-key too"),
        (["--tls-key", "KEY"], "--tls-cert: --tls-key needs --tls-cert too"),
        (["--client-ca", "CA"], "--client-ca: needs --tls-cert and --tls-key"),
        (["--peer-tls-ca", "CA"], "--peer-tls-ca: needs --tls-cert and --tls-key"),
        (["--etcd-ca", "CA"], "--etcd-ca: needs --cluster"),
        (["--etcd-cert", "CERT"], "--etcd-key: --etcd-cert needs --etcd-key too"),
        (["--tls-cert", "CERT", "--tls-key", "MISSING"], "--tls-key: file not found: "),
        (["--tls-cert", "KEY", "--tls-key", "KEY"], "--tls-cert: "),
        (["--tls-cert", "CERT", "--tls-key", "CERT"], "--tls-key: "),
        (["--tls-cert", "CERT", "--tls-key", "OTHER_KEY"], "--tls-key: "),
        (
            [
                "--cluster",
                "etcd://127.0.0.1:2379/c",
                "--etcd-cert",
                "CERT",
                "--etcd-key",
                "OTHER_KEY",
            ],
            "--etcd-key: ",
        ),
    ],
)
def test_a_bad_tls_flag_is_named_in_the_error(pki: Pki, flags: list[str], message: str) -> None:
    paths = {"CERT": pki.node.cert, "KEY": pki.node.key, "CA": pki.ca, "MISSING": "/nonexistent"}
    paths["OTHER_KEY"] = pki.other_node.key
    ns = build_parser().parse_args(["serve", *(str(paths.get(f, f)) for f in flags)])
    with pytest.raises(WheelError) as caught:
        node_security(ns)
    assert str(caught.value).startswith(message)
    assert key_body(pki.node.key) not in str(caught.value)


def test_client_tls_comes_from_flags_or_the_environment_naming_the_source(pki: Pki) -> None:
    env = {"WHEEL_TLS_CA": str(pki.ca)}
    assert not ChannelSecurity.from_env({}).secure
    assert ChannelSecurity.from_env(env).ca == pki.ca.read_bytes()
    with pytest.raises(InvalidArgument, match=r"^WHEEL_TLS_CERT: file not found: /nope"):
        ChannelSecurity.from_env({"WHEEL_TLS_CERT": "/nope", "WHEEL_TLS_KEY": str(pki.client.key)})
    # A flag wins over its variable, and is what the error names.
    with pytest.raises(InvalidArgument, match=r"^--tls-ca: file not found"):
        ChannelSecurity.resolve("/missing", None, None, env=env)
    with pytest.raises(InvalidArgument, match=r"^--tls-key/WHEEL_TLS_KEY: WHEEL_TLS_CERT needs"):
        ChannelSecurity.from_env({"WHEEL_TLS_CERT": str(pki.client.cert)})


def test_no_repr_shows_a_private_key(pki: Pki) -> None:
    client = ChannelSecurity.from_files(ca=pki.ca, cert=pki.client.cert, key=pki.client.key)
    server = ServerSecurity.from_files(cert=pki.node.cert, key=pki.node.key, client_ca=pki.ca)
    assert server is not None
    peers = server.peer_security(None)
    for value, key in ((client, pki.client.key), (server, pki.node.key), (peers, pki.node.key)):
        assert key_body(key) not in repr(value)
    assert str(pki.node.key) in repr(server)  # the path is fine


def test_a_certificate_where_a_key_belongs_is_refused_without_quoting_it(pki: Pki) -> None:
    with pytest.raises(InvalidArgument) as caught:
        read_pem(pki.node.key, "--tls-ca")
    assert str(caught.value) == f"--tls-ca: {pki.node.key} is not a PEM certificate"


def _wheelctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wheel", *args], capture_output=True, text=True, timeout=60
    )


def test_serve_on_every_address_without_tls_or_auth_exits_naming_listen(tmp_path: Path) -> None:
    listen = f"0.0.0.0:{free_port()}"
    out = _wheelctl("serve", "--data-dir", str(tmp_path / "data"), "--listen", listen)
    assert out.returncode != 0
    assert f"--listen {listen}: reachable from other machines" in out.stderr
    assert "--insecure" in out.stderr
    assert not (tmp_path / "data").exists()  # refused before it made anything


def test_a_client_command_names_a_missing_tls_file(tmp_path: Path) -> None:
    out = _wheelctl("status", "--tls-ca", str(tmp_path / "ca.pem"))
    assert out.returncode == 2
    assert f"--tls-ca: file not found: {tmp_path / 'ca.pem'}" in out.stderr


def test_a_key_that_is_not_its_certificates_is_refused_naming_both_files(pki: Pki) -> None:
    with pytest.raises(InvalidArgument) as caught:
        ServerSecurity.from_files(cert=pki.node.cert, key=pki.other_node.key)
    assert str(caught.value).startswith(
        f"--tls-key: {pki.other_node.key} is not the private key of {pki.node.cert} ("
    )
    assert key_body(pki.other_node.key) not in str(caught.value)
