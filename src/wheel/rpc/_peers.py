"""The other members of a cluster as a node calls them: job calls forwarded to
a shard's owner, and word that jobs of its shards changed.

A call that must run on the owner of a job's shard (a pause, a trigger...) is
forwarded once, marked with the forwarding node's id; the owner serves it, or,
if it no longer owns the shard either, answers UNAVAILABLE and the client
retries (``NotOwner``). Nothing is ever forwarded twice, so a stale
membership cannot make calls circle.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from typing import Any

import grpc

from wheel.auth import AUTHORIZATION
from wheel.rpc.v1 import (
    admin_service_pb2_grpc,
    job_service_pb2_grpc,
    node_service_pb2,
    node_service_pb2_grpc,
)
from wheel.tls import ChannelSecurity, LiveChannelSecurity, live_channel, make_channel

log = logging.getLogger("wheel.rpc")

FORWARDED_BY = "wheel-forwarded-by"
# A forwarded call gets what is left of the caller's deadline, at most this.
FORWARD_TIMEOUT_S = 10.0
# A member asked for its share of a cluster-wide answer (``ask_admin``) gets
# this long at most: one that is stopped must not hold up a console's page.
ASK_TIMEOUT_S = 2.0
# Word of changed jobs is a hint (the change feed carries it within a second
# anyway): short, and never retried.
NOTIFY_TIMEOUT_S = 2.0


def credential(context: grpc.aio.ServicerContext) -> tuple[tuple[str, str], ...]:
    """The caller's credential (its ``authorization`` metadata), which a
    call forwarded to another member, or the word of a submit sent there,
    carries on: the member checks it as its own caller's. Nodes hold no
    credential of their own."""
    return tuple(
        (key, value.decode() if isinstance(value, bytes) else str(value))
        for key, value in context.invocation_metadata() or ()
        if key == AUTHORIZATION
    )


def forwarded_by(context: grpc.aio.ServicerContext) -> str | None:
    """The node that forwarded this call, if one did."""
    for key, value in context.invocation_metadata() or ():
        if key == FORWARDED_BY:
            return str(value)
    return None


class Peers:
    """One channel per member address, opened on first use, secured as
    ``security`` says (the node's own certificate when it serves TLS). When a
    reload replaces that (``LiveChannelSecurity``), the next call opens new
    channels with it; calls on the old ones finish before they close."""

    def __init__(
        self, node_id: str, security: ChannelSecurity | LiveChannelSecurity | None = None
    ) -> None:
        self.node_id = node_id
        self.security = live_channel(security)
        self._version = self.security.version
        self._channels: dict[str, grpc.aio.Channel] = {}
        # Channels made before a reload, closing once their calls are over.
        self._retired: set[grpc.aio.Channel] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def _channel(self, address: str) -> grpc.aio.Channel:
        if self.security.version != self._version:
            self._version = self.security.version
            self._retire()
        channel = self._channels.get(address)
        if channel is None:
            security = self.security.current
            channel = self._channels[address] = make_channel(address, security, aio=True)
        return channel

    def _retire(self) -> None:
        """Close the channels made with the certificates a reload replaced,
        once the calls on them are over (a forward's deadline at most)."""
        old, self._channels = self._channels, {}
        for channel in old.values():
            self._retired.add(channel)
            self._background(self._close_later(channel))

    async def _close_later(self, channel: grpc.aio.Channel) -> None:
        await channel.close(grace=FORWARD_TIMEOUT_S)
        self._retired.discard(channel)

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def forward(
        self, address: str, method: str, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        """Call ``JobService.<method>`` on the member at ``address`` and return
        its answer; its failure is this call's failure, code and message."""
        stub = job_service_pb2_grpc.JobServiceStub(self._channel(address))
        remaining = context.time_remaining()
        timeout = FORWARD_TIMEOUT_S if remaining is None else min(remaining, FORWARD_TIMEOUT_S)
        try:
            return await getattr(stub, method)(
                request,
                timeout=timeout,
                metadata=((FORWARDED_BY, self.node_id), *credential(context)),
            )
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "")
            raise AssertionError("unreachable") from exc

    async def ask_admin(
        self, address: str, method: str, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        """Call ``AdminService.<method>`` on the member at ``address``, marked
        as forwarded (it answers for itself alone) and with the caller's
        credential; its failure is raised (``grpc.aio.AioRpcError``), for
        the caller to report the member as not answering."""
        stub = admin_service_pb2_grpc.AdminServiceStub(self._channel(address))
        remaining = context.time_remaining()
        # Time left to answer without the member if it does not answer.
        timeout = ASK_TIMEOUT_S if remaining is None else min(remaining - 0.2, ASK_TIMEOUT_S)
        return await getattr(stub, method)(
            request,
            timeout=max(0.05, timeout),
            metadata=((FORWARDED_BY, self.node_id), *credential(context)),
        )

    def jobs_changed(
        self, by_owner: dict[str, list[int]], metadata: tuple[tuple[str, str], ...] = ()
    ) -> None:
        """Tell each owner (by address) that jobs of its shards changed here,
        in the background (``metadata``: the submitter's credential)."""
        for address, job_ids in by_owner.items():
            self._background(self._notify(address, job_ids, metadata))

    async def _notify(
        self, address: str, job_ids: Iterable[int], metadata: tuple[tuple[str, str], ...]
    ) -> None:
        stub = node_service_pb2_grpc.NodeServiceStub(self._channel(address))
        try:
            await stub.JobsChanged(
                node_service_pb2.JobsChangedRequest(
                    job_ids=list(job_ids), from_node_id=self.node_id
                ),
                timeout=NOTIFY_TIMEOUT_S,
                metadata=metadata,
            )
        except grpc.aio.AioRpcError as exc:
            log.debug("%s not told of changed jobs (%s): its change feed will", address, exc)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for channel in [*self._retired, *self._channels.values()]:
            await channel.close()
        self._retired.clear()
        self._channels.clear()
