"""The gRPC edge: JobService, WorkerService, AdminService and (between the
members of a cluster) NodeService on a grpc.aio server, plus health and
reflection. Errors become status codes in one place
(``status_of``); a bad request never changes state or disturbs other streams.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from wheel import tracing
from wheel.auth import DEFAULT_RECHECK_S, Authenticator, AuthInterceptor
from wheel.errors import InvalidArgument
from wheel.node import Health, Node
from wheel.rpc._admin import AdminServicer
from wheel.rpc._audit import AuditInterceptor
from wheel.rpc._common import MAX_MESSAGE_BYTES, status_of
from wheel.rpc._decode import DecodeInterceptor
from wheel.rpc._guard import Guard
from wheel.rpc._health import statuses
from wheel.rpc._jobs import JobServicer
from wheel.rpc._nodes import NodeServicer
from wheel.rpc._peers import Peers
from wheel.rpc._tracing import DispatchTraces, TracingInterceptor
from wheel.rpc._workers import WorkerServicer, send_actions, send_membership, send_moved
from wheel.rpc.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    job_service_pb2,
    job_service_pb2_grpc,
    node_service_pb2,
    node_service_pb2_grpc,
    worker_service_pb2,
    worker_service_pb2_grpc,
)
from wheel.tls import (
    ChannelSecurity,
    LiveChannelSecurity,
    LiveServerSecurity,
    ServerSecurity,
    add_port,
)

__all__ = ["Bound", "bind", "send_actions", "serve", "status_of"]


# Two servers on one port would each take some of its connections (gRPC
# turns SO_REUSEPORT on by default): two nodes answering one address in
# turn. Off, a port in use is refused at bind.
NO_PORT_SHARING = ("grpc.so_reuseport", 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Bound:
    """A gRPC server for a node, bound to its port and not started yet
    (``bind``); ``start`` serves."""

    server: grpc.aio.Server
    port: int
    node: Node
    health_servicer: health.aio.HealthServicer

    async def start(self) -> tuple[grpc.aio.Server, int]:
        """Serve; NOT_SERVING until the node is ready (awaited) and then
        as its health says. Returns the server and its port."""
        await self.server.start()
        await self.node.ready.wait()
        servicer = self.health_servicer

        async def report(health: Health) -> None:
            for name, status in statuses(health).items():
                await servicer.set(name, status)

        self.node.on_health(report)
        await report(self.node.health())
        return self.server, self.port


async def serve(
    node: Node,
    listen: str,
    *,
    security: ServerSecurity | LiveServerSecurity | None = None,
    peer_security: ChannelSecurity | LiveChannelSecurity | None = None,
    auth: bool = False,
    recheck_s: float = DEFAULT_RECHECK_S,
) -> tuple[grpc.aio.Server, int]:
    """Start the gRPC server for ``node``, with TLS if ``security`` is given;
    ``peer_security`` secures its calls to the other members. Either may be
    live: a reload replaces it for new connections (``wheel.tls``).
    Returns the server and the bound port (``bind`` then ``Bound.start``).

    ``auth``: every call but health and reflection needs a bearer token
    (``wheel.auth``), re-checked against the store every ``recheck_s``."""
    bound = await bind(
        node,
        listen,
        security=security,
        peer_security=peer_security,
        auth=auth,
        recheck_s=recheck_s,
    )
    return await bound.start()


async def bind(
    node: Node,
    listen: str,
    *,
    security: ServerSecurity | LiveServerSecurity | None = None,
    peer_security: ChannelSecurity | LiveChannelSecurity | None = None,
    auth: bool = False,
    recheck_s: float = DEFAULT_RECHECK_S,
) -> Bound:
    """``serve``'s server, bound to ``listen`` but not started: a node
    binds before it starts dispatching, so that an address in use
    (``InvalidArgument`` naming ``listen``) stops it before it did anything."""
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        NO_PORT_SHARING,
    ]
    authenticator = None
    interceptors: list[grpc.aio.ServerInterceptor] = []
    # Outermost, with tracing on: each call's span covers its refusals too.
    traces = DispatchTraces(node) if tracing.is_on() else None
    if traces is not None:
        interceptors.append(TracingInterceptor(node, traces))
    if auth:
        authenticator = Authenticator(node.get_token, now_ms=node.now_ms, recheck_s=recheck_s)
        interceptors.append(AuthInterceptor(authenticator))
    # Innermost: the credential is judged before the request's bytes.
    interceptors.append(DecodeInterceptor())
    # Administrative changes that answered OK go to the audit trail.
    interceptors.append(AuditInterceptor(node, authenticator))
    guard = Guard(authenticator)
    server = grpc.aio.server(options=options, interceptors=interceptors)
    node.message_sink = functools.partial(
        send_actions,
        sign=node.signed_headers,
        trace=None if traces is None else traces.handed_out,
    )
    node.membership_sink = send_membership
    node.moved_sink = send_moved
    peers = Peers(node.config.node_id, peer_security)
    node.on_stop(peers.close)
    node.job_changes_sink = lambda job_ids: peers.jobs_changed(node.owners_of(job_ids))
    job_service_pb2_grpc.add_JobServiceServicer_to_server(JobServicer(node, peers, guard), server)
    node_service_pb2_grpc.add_NodeServiceServicer_to_server(NodeServicer(node), server)
    worker_service_pb2_grpc.add_WorkerServiceServicer_to_server(WorkerServicer(node, guard), server)
    admin_service_pb2_grpc.add_AdminServiceServicer_to_server(
        AdminServicer(node, guard, peers), server
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [
        job_service_pb2.DESCRIPTOR.services_by_name["JobService"].full_name,
        worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
        admin_service_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
        node_service_pb2.DESCRIPTOR.services_by_name["NodeService"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    ]
    reflection.enable_server_reflection(names, server)
    try:
        port = add_port(server, listen, security)
    except RuntimeError:  # grpcio >= 1.60 raises where older ones returned 0
        port = 0
    if port == 0:
        raise InvalidArgument(
            "listen",
            f"cannot listen on {listen}: the address is in use (another node serving"
            " there?) or not an address of this host",
        )
    # NOT_SERVING until the node is ready and says otherwise.
    for name in statuses(Health(store=False, dispatching=False)):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    return Bound(server=server, port=port, node=node, health_servicer=health_servicer)
