"""TLS for every channel and listener of wheel.

``_security``: how a channel or a listener is secured (``ChannelSecurity``,
``ServerSecurity``, their live forms, ``make_channel``, ``add_port``).
``_cli``: ``wheelctl``'s TLS flags and the loopback-only default.
``_reload``: a node's certificates read again on SIGHUP or when they change.
"""

from __future__ import annotations

from wheel.tls._cli import (
    NodeSecurity,
    add_client_flags,
    add_serve_flags,
    api_address,
    check_http_listen,
    check_listen,
    client_security,
    is_loopback,
    listen_notice,
    node_security,
    tls_paths,
)
from wheel.tls._reload import DEFAULT_INTERVAL_S, TlsReloader
from wheel.tls._security import (
    ENV_CA,
    ENV_CERT,
    ENV_KEY,
    PLAINTEXT,
    ChannelSecurity,
    LiveChannelSecurity,
    LiveServerSecurity,
    ServerSecurity,
    add_port,
    check_pair,
    live_channel,
    make_channel,
    read_pem,
)

__all__ = [
    "DEFAULT_INTERVAL_S",
    "ENV_CA",
    "ENV_CERT",
    "ENV_KEY",
    "PLAINTEXT",
    "ChannelSecurity",
    "LiveChannelSecurity",
    "LiveServerSecurity",
    "NodeSecurity",
    "ServerSecurity",
    "TlsReloader",
    "add_client_flags",
    "add_port",
    "add_serve_flags",
    "api_address",
    "check_http_listen",
    "check_listen",
    "check_pair",
    "client_security",
    "is_loopback",
    "listen_notice",
    "live_channel",
    "make_channel",
    "node_security",
    "read_pem",
    "tls_paths",
]
