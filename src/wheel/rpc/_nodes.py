"""NodeService: what the members of a cluster call on each other."""

from __future__ import annotations

import grpc

from wheel.node import Node
from wheel.rpc.v1 import node_service_pb2, node_service_pb2_grpc


class NodeServicer(node_service_pb2_grpc.NodeServiceServicer):
    def __init__(self, node: Node) -> None:
        self.node = node

    async def JobsChanged(
        self, request: node_service_pb2.JobsChangedRequest, context: grpc.aio.ServicerContext
    ) -> node_service_pb2.JobsChangedResponse:
        self.node.jobs_changed(request.job_ids)
        return node_service_pb2.JobsChangedResponse()
