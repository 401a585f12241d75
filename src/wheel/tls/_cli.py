"""``wheelctl``'s TLS flags and the safe default for where a node listens.

``serve``: ``--tls-cert``/``--tls-key`` (TLS on every listener),
``--client-ca`` (mutual TLS: every caller presents a certificate that CA
signed), ``--peer-tls-ca`` (what a node trusts when it calls the other
members; default ``--client-ca``), ``--etcd-ca``/``--etcd-cert``/``--etcd-key``
(TLS to etcd) and ``--insecure``. The other commands: ``--tls-ca``,
``--tls-cert``, ``--tls-key``, or ``WHEEL_TLS_CA``, ``WHEEL_TLS_CERT``,
``WHEEL_TLS_KEY``.

Safe default: a node with neither TLS nor auth serves only this machine
(loopback); ``check_listen`` refuses anything else unless ``--insecure``.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
from dataclasses import dataclass

from wheel.errors import InvalidArgument, WheelError
from wheel.tls._security import ENV_CA, ENV_CERT, ENV_KEY, ChannelSecurity, ServerSecurity, read_pem

__all__ = [
    "NodeSecurity",
    "add_client_flags",
    "add_serve_flags",
    "api_address",
    "check_http_listen",
    "check_listen",
    "client_security",
    "is_loopback",
    "listen_notice",
    "node_security",
    "tls_paths",
]


def is_loopback(address: str) -> bool:
    """Whether a gRPC listen address is reachable from this machine only: a
    loopback IP (127.0.0.0/8, ::1), ``localhost``, or a Unix socket. Pure: a
    name other than ``localhost`` counts as reachable from elsewhere."""
    if address.startswith(("unix:", "unix-abstract:")):
        return True
    host = address.removeprefix("ipv4:").removeprefix("ipv6:")
    host = host.rsplit(":", 1)[0] if ":" in host else host
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "", a wildcard's absence, or a host name


def check_listen(address: str, tls: bool, auth: bool, insecure: bool) -> str | None:
    """Why ``wheelctl serve`` must not listen on ``address``, or None.

    Without TLS and without auth anyone who reaches the port can submit,
    cancel and read every job and take runs as a worker, and sees payloads in
    the clear: only loopback is allowed then, unless ``--insecure`` says the
    network is trusted."""
    if tls or auth or insecure or is_loopback(address):
        return None
    return (
        f"--listen {address}: reachable from other machines, and this node has neither"
        " TLS (--tls-cert and --tls-key) nor auth; listen on loopback (127.0.0.1),"
        " turn TLS on, or pass --insecure to serve plaintext to the network anyway"
    )


def check_http_listen(address: str, tls: bool, auth: bool, insecure: bool) -> str | None:
    """Why the web console must not listen on ``address``, or None: the
    rule of ``check_listen`` (it shows and, with actions on, does what the
    API would)."""
    if tls or auth or insecure or is_loopback(address):
        return None
    return (
        f"{address}: reachable from other machines, and this node has neither TLS nor auth;"
        " serve the console on loopback (127.0.0.1), turn TLS or --auth on, or pass"
        " --insecure"
    )


def api_address(listen: str, port: int) -> str:
    """Where a process on this machine reaches the node's API that listens on
    ``listen`` (its port now ``port``): a wildcard host is loopback."""
    host = listen.rsplit(":", 1)[0] if ":" in listen else listen
    if host.strip("[]") in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"{host}:{port}"


def listen_notice(address: str, tls: bool, mutual: bool, auth: bool) -> tuple[int, str]:
    """The log level and line a node starts with, saying who can reach it."""
    if tls:
        who = "client certificates required" if mutual else "no client certificates"
        return logging.INFO, f"TLS on {address} ({who})"
    if is_loopback(address):
        if auth:
            return logging.INFO, f"plaintext on loopback {address} only"
        return logging.INFO, (
            f"no TLS and no auth: serving on loopback {address} only (other machines"
            " cannot reach it; --tls-cert and --tls-key to serve them)"
        )
    if auth:
        return logging.WARNING, f"plaintext on {address}: tokens cross the network in the clear"
    return logging.WARNING, (
        f"--insecure: serving plaintext on {address} with neither TLS nor auth; anyone who"
        " reaches it can use it"
    )


# -- flags -----------------------------------------------------------------------------


def add_client_flags(p: argparse.ArgumentParser) -> None:
    """``--tls-ca``, ``--tls-cert``, ``--tls-key`` on a command that calls nodes."""
    p.add_argument(
        "--tls-ca",
        metavar="PEM",
        help=f"TLS: trust this CA for the nodes' certificates (${ENV_CA})",
    )
    p.add_argument(
        "--tls-cert",
        metavar="PEM",
        help=f"mutual TLS: this client's certificate chain (${ENV_CERT})",
    )
    p.add_argument("--tls-key", metavar="PEM", help=f"its private key (${ENV_KEY})")


def client_security(ns: argparse.Namespace) -> ChannelSecurity:
    return ChannelSecurity.resolve(ns.tls_ca, ns.tls_cert, ns.tls_key)


def add_serve_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--tls-cert",
        metavar="PEM",
        help="serve TLS on every listener (gRPC, metrics) with this certificate chain;"
        " its subject alternative names must cover the address others reach it at"
        " (--advertise)",
    )
    s.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    s.add_argument(
        "--client-ca",
        metavar="PEM",
        help="mutual TLS: every caller (client, worker, other node, metrics scraper) must"
        " present a certificate this CA signed",
    )
    s.add_argument(
        "--peer-tls-ca",
        metavar="PEM",
        help="cluster with TLS: the CA that signed the other members' certificates"
        " (default: --client-ca; else the system's roots). The node presents --tls-cert to them",
    )
    s.add_argument("--etcd-ca", metavar="PEM", help="TLS to etcd: the CA of its certificate")
    s.add_argument("--etcd-cert", metavar="PEM", help="mutual TLS to etcd: this node's certificate")
    s.add_argument("--etcd-key", metavar="PEM", help="the private key of --etcd-cert")
    s.add_argument(
        "--insecure",
        action="store_true",
        help="allow a --listen address beyond loopback with neither TLS nor auth",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSecurity:
    """What ``wheelctl serve``'s flags say about TLS."""

    server: ServerSecurity | None
    peers: ChannelSecurity
    etcd: ChannelSecurity
    auth: bool = False

    def notice(self, address: str) -> tuple[int, str]:
        """The level and line a node logs at start about who can reach it."""
        server = self.server
        return listen_notice(address, server is not None, bool(server and server.mutual), self.auth)


def tls_paths(ns: argparse.Namespace) -> list[str]:
    """The files ``serve``'s TLS flags name, in flag order: what a reload
    reads again (``wheel.tls._reload``)."""
    flags = ("tls_cert", "tls_key", "client_ca", "peer_tls_ca", "etcd_ca", "etcd_cert", "etcd_key")
    return [path for path in (getattr(ns, flag) for flag in flags) if path]


def node_security(ns: argparse.Namespace, *, auth: bool = False) -> NodeSecurity:
    """Read and check ``serve``'s TLS flags and where it listens; raises a
    ``WheelError`` naming the flag at fault."""
    server = ServerSecurity.from_files(cert=ns.tls_cert, key=ns.tls_key, client_ca=ns.client_ca)
    problem = check_listen(ns.listen, server is not None, auth, ns.insecure)
    if problem is not None:
        raise WheelError(problem)
    peers = ChannelSecurity()
    if server is not None:
        peer_ca = read_pem(ns.peer_tls_ca, "--peer-tls-ca") if ns.peer_tls_ca else server.client_ca
        peers = server.peer_security(peer_ca)
    elif ns.peer_tls_ca:
        raise InvalidArgument("--peer-tls-ca", "needs --tls-cert and --tls-key")
    etcd = ChannelSecurity.from_files(
        ca=ns.etcd_ca,
        cert=ns.etcd_cert,
        key=ns.etcd_key,
        names=("--etcd-ca", "--etcd-cert", "--etcd-key"),
    )
    if etcd.secure and not ns.cluster:
        raise InvalidArgument("--etcd-ca" if ns.etcd_ca else "--etcd-cert", "needs --cluster")
    return NodeSecurity(server=server, peers=peers, etcd=etcd, auth=auth)
