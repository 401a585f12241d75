"""Certificates without a restart: ``wheelctl serve`` reads its TLS files
again on SIGHUP, and when their contents change (looked at every
``--tls-reload-interval``), and puts them in force for new connections
without dropping open ones.

What a reload changes:

- the gRPC listener's certificate chain, key and client CA: every new
  handshake asks for the ones in force (gRPC's dynamic server credentials);
- the metrics listener's, when it serves HTTPS: every new handshake
  switches to the context of the ones in force;
- the certificate and CA of the node's calls to the other members: new
  channels, while the calls on the old ones finish;
- the CA, certificate and key of its etcd client: a new client, and the
  watch opens again on it.

What takes a restart: turning TLS, mutual TLS or TLS to etcd on or off, and
the files' paths. A connection made before a reload (a worker's lease
stream, a peer's channel) keeps its certificates until it ends: TLS checks
them at the handshake only. So a CA that no longer signs a worker's
certificate refuses the worker at its next connection, not on the stream it
holds.

Files are put in force only whole: all are read, each key is checked against
its certificate, and all are read again; if one changed meanwhile (a rotation
half written), or a key is not its certificate's, the node keeps what it has,
says why, and tries again at the next change or SIGHUP.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from wheel.errors import WheelError
from wheel.tls._cli import NodeSecurity
from wheel.tls._security import LiveChannelSecurity, LiveServerSecurity

__all__ = ["DEFAULT_INTERVAL_S", "TlsReloader"]

log = logging.getLogger("wheel.tls")

# How often the files are looked at for a change; reading a few small files
# is cheap, and a certificate manager's renewal is in force this soon.
DEFAULT_INTERVAL_S = 5.0
# Reads of the files that must agree around the parsing before giving up
# until the next change (a writer still at work).
READ_TRIES = 3

Contents = tuple[bytes | None, ...]


class TlsReloader:
    """Reads the files at ``paths`` with ``load`` (``wheelctl serve``'s TLS
    flags) and puts what they say in force in the live securities of the
    node's listener (``server``), of its calls to the other members
    (``peers``) and of its etcd client (``etcd``)."""

    def __init__(
        self,
        load: Callable[[], NodeSecurity],
        paths: Sequence[str],
        *,
        server: LiveServerSecurity | None,
        peers: LiveChannelSecurity,
        etcd: LiveChannelSecurity,
    ) -> None:
        self._load = load
        self.paths = tuple(paths)
        self.server = server
        self.peers = peers
        self.etcd = etcd
        # The contents last read: a change from these is worth a reload.
        self._seen = self._contents()
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[bool]] = set()

    def _contents(self) -> Contents:
        out: list[bytes | None] = []
        for path in self.paths:
            try:
                out.append(Path(path).read_bytes())
            except OSError:
                out.append(None)  # gone for a moment: the load says so
        return tuple(out)

    def _read(self) -> tuple[Contents, NodeSecurity | str]:
        """On a thread: the files' contents, and what they say (or what is
        wrong with them), from reads that agree before and after."""
        before = self._contents()
        for _ in range(READ_TRIES):
            try:
                security = self._load()
            except WheelError as exc:
                return before, str(exc)
            after = self._contents()
            if after == before:
                return before, security
            before = after
        return before, "the files kept changing while they were read"

    async def reload(self, why: str) -> bool:
        """Read the files and put them in force; False when they could not
        be (the ones in force stay) or nothing changed."""
        async with self._lock:
            contents, read = await asyncio.to_thread(self._read)
            self._seen = contents
            if isinstance(read, str):
                log.warning("TLS files not reloaded (%s): %s; the ones in force stay", why, read)
                return False
            try:
                changed = self._apply(read)
            except WheelError as exc:
                log.warning("TLS files not reloaded (%s): %s; the ones in force stay", why, exc)
                return False
            if changed:
                log.info(
                    "TLS reloaded (%s): %s in force for new connections", why, ", ".join(changed)
                )
            else:
                log.info("TLS files read again (%s): nothing changed", why)
            return bool(changed)

    def _apply(self, security: NodeSecurity) -> list[str]:
        """Put ``security`` in force; what changed, in words."""
        # The paths are the same as at start, so TLS is on or off as it was;
        # whether client certificates are asked for is the listener's to say.
        server, new_server = self.server, security.server
        if (server is None) != (new_server is None):
            raise WheelError("turning TLS on or off takes a restart")
        if self.etcd.current.secure != security.etcd.secure:
            raise WheelError("turning TLS to etcd on or off takes a restart")
        changed = []
        if server is not None and new_server is not None and server.replace(new_server):
            changed.append("the listeners' certificates")
        if self.peers.replace(security.peers):
            changed.append("the other members' channels")
        if self.etcd.replace(security.etcd):
            changed.append("the etcd client")
        return changed

    def on_signal(self) -> None:
        """SIGHUP: reload now (in a task of the running loop)."""
        task = asyncio.get_running_loop().create_task(self.reload("SIGHUP"))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def watch(self, interval_s: float) -> None:
        """Every ``interval_s``, reload when the files' contents changed
        since they were last read. Runs until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                contents = await asyncio.to_thread(self._contents)
                if contents != self._seen:
                    await self.reload("the files changed")
            except Exception:  # a bug here must not end the watching for good
                log.exception("watching the TLS files failed")
