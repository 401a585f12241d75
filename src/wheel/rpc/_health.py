"""What the standard gRPC health service says for each service name, from
the node's health.

- ``wheel.rpc.v1.JobService`` (and NodeService, its peer-to-peer side) serves
  while the store answers: a node without shards still takes submits and
  reads, and forwards calls for jobs others own.
- ``wheel.rpc.v1.WorkerService`` and the overall "" need the store and a
  shard this node may dispatch: a worker or a load balancer sent here while
  the node holds none would wait for nothing.
- ``wheel.rpc.v1.AdminService`` always serves: it reads the node's memory,
  and it is where an operator finds out why the others do not.
"""

from __future__ import annotations

from grpc_health.v1 import health_pb2

from wheel.node import Health
from wheel.rpc.v1 import (
    admin_service_pb2,
    job_service_pb2,
    node_service_pb2,
    worker_service_pb2,
)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

JOB_SERVICE = job_service_pb2.DESCRIPTOR.services_by_name["JobService"].full_name
WORKER_SERVICE = worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name
ADMIN_SERVICE = admin_service_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name
NODE_SERVICE = node_service_pb2.DESCRIPTOR.services_by_name["NodeService"].full_name


def statuses(health: Health) -> dict[str, int]:
    """Service name ("" for the server as a whole) -> health status."""
    answers = SERVING if health.store else NOT_SERVING
    dispatches = SERVING if health.store and health.dispatching else NOT_SERVING
    return {
        "": dispatches,
        JOB_SERVICE: answers,
        NODE_SERVICE: answers,
        WORKER_SERVICE: dispatches,
        ADMIN_SERVICE: SERVING,
    }
