"""Certificates for the TLS tests, made with the ``openssl`` command line
(the same commands docs/security.md gives): two CAs, a node certificate valid for
127.0.0.1 and localhost (server and client use: nodes call one another
with it), a client certificate of each CA, and etcd's server certificate."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# P-256: small and quick to make; gRPC, Python's ssl and etcd all take it.
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True, slots=True)
class Pair:
    """A certificate and its private key, PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True, slots=True, kw_only=True)
class Pki:
    ca: Path  # the CA of everything wheel's tests trust
    node: Pair  # IP:127.0.0.1, DNS:localhost; serverAuth and clientAuth
    client: Pair  # clientAuth, signed by ``ca``
    other_ca: Path  # a CA nobody trusts
    other_client: Pair  # clientAuth, signed by ``other_ca``
    other_node: Pair  # a server certificate for 127.0.0.1 from ``other_ca``


def _run(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=30)


def _ca(out: Path, name: str) -> Pair:
    pair = Pair(out / f"{name}.pem", out / f"{name}.key")
    _run(
        "req", "-x509", *_KEY, "-keyout", pair.key, "-out", pair.cert, "-days", "2",
        "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return pair


def _leaf(out: Path, name: str, ca: Pair, usage: str, san: str | None) -> Pair:
    pair = Pair(out / f"{name}.pem", out / f"{name}.key")
    csr, ext = out / f"{name}.csr", out / f"{name}.ext"
    lines = ["basicConstraints=CA:FALSE", f"extendedKeyUsage={usage}"]
    if san:
        lines.append(f"subjectAltName={san}")
    ext.write_text("\n".join(lines) + "\n")
    _run("req", "-new", *_KEY, "-keyout", pair.key, "-out", csr, "-subj", f"/CN={name}")
    _run(
        "x509", "-req", "-in", csr, "-CA", ca.cert, "-CAkey", ca.key,
        "-set_serial", str(secrets.randbits(62)), "-days", "2", "-extfile", ext, "-out", pair.cert,
    )  # fmt: skip
    return pair


def make_pki(out: Path) -> Pki | None:
    """Everything in ``out``; None when there is no ``openssl`` binary."""
    if shutil.which("openssl") is None:
        return None
    out.mkdir(parents=True, exist_ok=True)
    ca, other = _ca(out, "ca"), _ca(out, "other-ca")
    san = "IP:127.0.0.1,DNS:localhost"
    return Pki(
        ca=ca.cert,
        node=_leaf(out, "node", ca, "serverAuth,clientAuth", san),
        client=_leaf(out, "client", ca, "clientAuth", None),
        other_ca=other.cert,
        other_client=_leaf(out, "other-client", other, "clientAuth", None),
        other_node=_leaf(out, "other-node", other, "serverAuth,clientAuth", san),
    )
