"""TLS for wheel's channels and listeners, made in one place per side.

Client side (the SDKs, ``wheelctl``, a node calling its peers, a worker's
lease streams, a node's etcd client): a ``ChannelSecurity`` says how a
channel is secured, and every gRPC channel to a node is opened by
``make_channel``, which also takes the interceptors a caller adds (call
metadata, say). Plaintext is the default; TLS once a CA or a client
certificate is given (or ``tls=True``: the system's roots).

Server side (``wheelctl serve``): a ``ServerSecurity`` holds the node's
certificate chain and key and, for mutual TLS, the CA that signs the
certificates clients must present; ``add_port`` binds a gRPC listener with
it and ``ssl_context`` secures the HTTP metrics listener the same way.

PEM files are read when the value is made: a missing or malformed file, or
a key that is not its certificate's, fails there, naming the flag (or
environment variable) and the path. Key contents are never in a repr, an
error or a log record.

A node's certificates can change while it serves (``wheel.tls._reload``
reads them again): ``LiveServerSecurity`` hands each new handshake of a
listener the certificates current then, and ``LiveChannelSecurity`` tells
the makers of outgoing channels (to the other members, to etcd) to make new
ones. Connections made before go on with what they were made with: TLS
checks certificates at the handshake only.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped, unused-ignore]
import grpc.aio  # type: ignore[import-untyped, unused-ignore]

from wheel.errors import InvalidArgument

__all__ = [
    "ENV_CA",
    "ENV_CERT",
    "ENV_KEY",
    "PLAINTEXT",
    "ChannelSecurity",
    "LiveChannelSecurity",
    "LiveServerSecurity",
    "ServerSecurity",
    "add_port",
    "check_pair",
    "live_channel",
    "make_channel",
    "read_pem",
]

# The SDKs' and wheelctl's defaults for the client side.
ENV_CA = "WHEEL_TLS_CA"
ENV_CERT = "WHEEL_TLS_CERT"
ENV_KEY = "WHEEL_TLS_KEY"


def read_pem(path: str | os.PathLike[str], name: str, *, key: bool = False) -> bytes:
    """The PEM file at ``path``; ``name`` (a flag, a variable) is who asked,
    for the error. Only the path is ever quoted, never the contents."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise InvalidArgument(name, f"file not found: {os.fspath(path)}") from None
    except OSError as exc:
        raise InvalidArgument(name, f"cannot read {os.fspath(path)}: {exc.strerror}") from None
    want = b"PRIVATE KEY-----" if key else b"-----BEGIN CERTIFICATE-----"
    if want not in data:
        what = "a PEM private key" if key else "a PEM certificate"
        raise InvalidArgument(name, f"{os.fspath(path)} is not {what}")
    return data


def _no_password() -> bytes:
    # An encrypted key fails to load instead of OpenSSL asking on the terminal.
    return b""


def check_pair(
    cert: str | os.PathLike[str], key: str | os.PathLike[str], names: tuple[str, str]
) -> ssl.SSLContext:
    """A server context loaded with ``cert`` and ``key``; refuses a key that
    is not the certificate's (a rotation half done: the key replaced, the
    certificate not yet), naming ``names[1]``, the key's flag."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert, key, password=_no_password)
    except ssl.SSLError as exc:
        why = exc.reason or exc.__class__.__name__
        raise InvalidArgument(
            names[1], f"{os.fspath(key)} is not the private key of {os.fspath(cert)} ({why})"
        ) from None
    except OSError as exc:
        raise InvalidArgument(names[1], f"cannot read {os.fspath(key)}: {exc.strerror}") from None
    return ctx


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelSecurity:
    """How a channel to a node (or to etcd) is secured.

    ``ca``: PEM of the CAs that may sign the server's certificate (None with
    TLS on: the system's roots). ``cert`` and ``key``: this side's certificate
    chain and private key, for servers that require one (mutual TLS).
    Everything None and ``tls`` False: plaintext.
    """

    tls: bool = False
    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise InvalidArgument("tls", "a client certificate and its key go together")

    @property
    def secure(self) -> bool:
        return self.tls or self.ca is not None or self.cert is not None

    def credentials(self) -> Any:
        """gRPC channel credentials for this; only when ``secure``."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )

    @classmethod
    def from_files(
        cls,
        *,
        ca: str | os.PathLike[str] | None = None,
        cert: str | os.PathLike[str] | None = None,
        key: str | os.PathLike[str] | None = None,
        names: tuple[str, str, str] = ("tls_ca", "tls_cert", "tls_key"),
    ) -> ChannelSecurity:
        """From PEM files; ``names`` are what errors call the three (flags)."""
        if (cert is None) != (key is None):
            given, missing = (names[1], names[2]) if key is None else (names[2], names[1])
            raise InvalidArgument(missing, f"{given} needs {missing} too")
        out = cls(
            ca=None if ca is None else read_pem(ca, names[0]),
            cert=None if cert is None else read_pem(cert, names[1]),
            key=None if key is None else read_pem(key, names[2], key=True),
        )
        if cert is not None and key is not None:
            check_pair(cert, key, (names[1], names[2]))
        return out

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ChannelSecurity:
        """From ``WHEEL_TLS_CA``, ``WHEEL_TLS_CERT`` and ``WHEEL_TLS_KEY``
        (paths); plaintext when none is set."""
        return cls.resolve(None, None, None, env=env)

    @classmethod
    def resolve(
        cls,
        ca: str | None,
        cert: str | None,
        key: str | None,
        *,
        env: Mapping[str, str] | None = None,
    ) -> ChannelSecurity:
        """From ``wheelctl``'s ``--tls-ca``, ``--tls-cert`` and ``--tls-key``,
        each falling back to its environment variable; errors name whichever
        gave the path."""
        env = os.environ if env is None else env
        paths: list[str | None] = []
        names: list[str] = []
        for value, flag, var in (
            (ca, "--tls-ca", ENV_CA),
            (cert, "--tls-cert", ENV_CERT),
            (key, "--tls-key", ENV_KEY),
        ):
            from_env = value is None and bool(env.get(var))
            paths.append(env[var] if from_env else value)
            names.append(var if from_env else flag if value is not None else f"{flag}/{var}")
        return cls.from_files(
            ca=paths[0], cert=paths[1], key=paths[2], names=(names[0], names[1], names[2])
        )


PLAINTEXT = ChannelSecurity()


class LiveChannelSecurity:
    """How a node's outgoing channels of one kind (to the other members, to
    etcd) are secured now. A reload replaces ``current`` and bumps
    ``version``; whoever keeps channels makes new ones when ``version`` moved
    on and lets calls on the old ones finish."""

    def __init__(self, security: ChannelSecurity | None = None) -> None:
        self.current = security or PLAINTEXT
        self.version = 0

    def replace(self, security: ChannelSecurity) -> bool:
        """Put ``security`` in force; False when it is what is in force."""
        if security == self.current:
            return False
        self.current = security
        self.version += 1
        return True


def live_channel(security: ChannelSecurity | LiveChannelSecurity | None) -> LiveChannelSecurity:
    """``security`` as a ``LiveChannelSecurity`` (a fixed one never changes)."""
    return security if isinstance(security, LiveChannelSecurity) else LiveChannelSecurity(security)


def make_channel(
    address: str,
    security: ChannelSecurity | None = None,
    *,
    aio: bool = False,
    options: Sequence[tuple[str, Any]] = (),
    interceptors: Sequence[Any] = (),
) -> Any:
    """A gRPC channel to ``address`` (``grpc.aio`` when ``aio``), secured as
    ``security`` says, with ``interceptors`` around every call on it. The
    server's certificate must name the host of ``address`` (a DNS or, for an
    IP address, an IP subject alternative name)."""
    security = security or PLAINTEXT
    opts = list(options)
    if aio:
        extra = list(interceptors) or None
        if security.secure:
            return grpc.aio.secure_channel(
                address, security.credentials(), options=opts, interceptors=extra
            )
        return grpc.aio.insecure_channel(address, options=opts, interceptors=extra)
    if security.secure:
        channel = grpc.secure_channel(address, security.credentials(), options=opts)
    else:
        channel = grpc.insecure_channel(address, options=opts)
    return grpc.intercept_channel(channel, *interceptors) if interceptors else channel


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSecurity:
    """A node's listeners' TLS: its certificate chain and key and, for mutual
    TLS, the CA that signs the client certificates every caller (SDK, worker,
    another node) must then present."""

    cert_path: Path
    key_path: Path
    client_ca_path: Path | None = None
    cert: bytes = field(repr=False)
    key: bytes = field(repr=False)
    client_ca: bytes | None = field(default=None, repr=False)
    # The HTTP listeners' context, made from the same files when they were read.
    context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_files(
        cls,
        *,
        cert: str | os.PathLike[str] | None,
        key: str | os.PathLike[str] | None,
        client_ca: str | os.PathLike[str] | None = None,
    ) -> ServerSecurity | None:
        """From ``--tls-cert``, ``--tls-key`` and ``--client-ca``; None when
        none is given (plaintext)."""
        if cert is None and key is None:
            if client_ca is not None:
                raise InvalidArgument("--client-ca", "needs --tls-cert and --tls-key")
            return None
        if cert is None or key is None:
            given, missing = "--tls-cert", "--tls-key"
            if cert is None:
                given, missing = missing, given
            raise InvalidArgument(missing, f"{given} needs {missing} too")
        out = cls(
            cert_path=Path(cert),
            key_path=Path(key),
            client_ca_path=None if client_ca is None else Path(client_ca),
            cert=read_pem(cert, "--tls-cert"),
            key=read_pem(key, "--tls-key", key=True),
            client_ca=None if client_ca is None else read_pem(client_ca, "--client-ca"),
        )
        ctx = check_pair(cert, key, ("--tls-cert", "--tls-key"))
        if client_ca is not None:
            try:
                ctx.load_verify_locations(client_ca)
            except ssl.SSLError as exc:
                why = exc.reason or exc.__class__.__name__
                raise InvalidArgument("--client-ca", f"{client_ca} holds no CA ({why})") from None
            ctx.verify_mode = ssl.CERT_REQUIRED
        return dataclasses.replace(out, context=ctx)

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None

    def credentials(self) -> Any:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)],
            root_certificates=self.client_ca,
            require_client_auth=self.mutual,
        )

    def ssl_context(self) -> ssl.SSLContext:
        """The same for an HTTP listener (metrics)."""
        if self.context is not None:
            return self.context
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert_path, self.key_path, password=_no_password)
        if self.client_ca_path is not None:
            ctx.load_verify_locations(self.client_ca_path)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def certificate_configuration(self) -> Any:
        """What gRPC's dynamic server credentials take: the chain and key,
        and the CA of client certificates."""
        return grpc.ssl_server_certificate_configuration(
            [(self.key, self.cert)], root_certificates=self.client_ca
        )

    def peer_security(self, ca: bytes | None) -> ChannelSecurity:
        """How this node calls the other members: TLS, trusting ``ca`` (the
        system's roots if None), presenting its own certificate."""
        return ChannelSecurity(tls=True, ca=ca, cert=self.cert, key=self.key)


class LiveServerSecurity:
    """A listener's TLS that a reload may replace while it serves. Each new
    handshake takes the certificates in force then: gRPC asks
    ``_fetch`` for them (dynamic server credentials), and an HTTP listener's
    context hands its handshakes to the current context (``ssl_context``).
    Whether client certificates are required at all is fixed at start."""

    def __init__(self, security: ServerSecurity) -> None:
        self._current = security
        self._version = 0
        # The version gRPC holds (it asks on every handshake, from its threads).
        self._fetched = 0

    @property
    def current(self) -> ServerSecurity:
        return self._current

    @property
    def mutual(self) -> bool:
        return self._current.mutual

    def replace(self, security: ServerSecurity) -> bool:
        """Put ``security`` in force for new handshakes; False when it is what
        is in force. Turning client certificates on or off is refused
        (``InvalidArgument``): it takes a restart."""
        if security.mutual != self._current.mutual:
            raise InvalidArgument(
                "--client-ca", "turning mutual TLS on or off takes a restart, not a reload"
            )
        if security == self._current:
            return False
        self._current = security
        self._version += 1  # after: a fetch between the two hands out the new one twice
        return True

    def credentials(self) -> Any:
        """gRPC server credentials that take up each replacement."""
        return grpc.dynamic_ssl_server_credentials(
            self._current.certificate_configuration(),
            self._fetch,
            require_client_authentication=self._current.mutual,
        )

    def _fetch(self) -> Any:
        """Called by gRPC (on its own threads) before a handshake: the
        current configuration when it changed since the last call, else None."""
        version = self._version
        if version == self._fetched:
            return None
        self._fetched = version
        return self._current.certificate_configuration()

    def ssl_context(self) -> ssl.SSLContext:
        """The context to serve HTTPS with: the first one's handshakes switch
        to the context of the certificates in force (its SNI callback runs
        for every ClientHello, with or without a server name)."""
        first = self._current.ssl_context()
        first.sni_callback = self._switch
        return first

    def _switch(self, conn: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext) -> None:
        current = self._current.ssl_context()
        if current is not ctx:
            conn.context = current


def add_port(server: Any, listen: str, security: ServerSecurity | LiveServerSecurity | None) -> int:
    """Bind ``server`` (``grpc.aio``) to ``listen``; the port bound, 0 on failure."""
    if security is None:
        return int(server.add_insecure_port(listen))
    return int(server.add_secure_port(listen, security.credentials()))
