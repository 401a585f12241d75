"""A node: the I/O shell around one shard owner (``wheel.engine``), with the
record of truth, the worker streams, the checkpoint and, in a cluster, the
coordinator that gives and takes its shards."""

from wheel.node._node import Node
from wheel.node._outbox import OutboxRelay
from wheel.node._secrets import SignError
from wheel.node._secrets_key import SecretsKey
from wheel.node._values import (
    Clock,
    Health,
    Membership,
    MessageSink,
    MovedRun,
    NodeConfig,
    NodeStatus,
    RaisedAlert,
    WorkerSession,
)

__all__ = [
    "Clock",
    "Health",
    "Membership",
    "MessageSink",
    "MovedRun",
    "Node",
    "NodeConfig",
    "NodeStatus",
    "OutboxRelay",
    "RaisedAlert",
    "SecretsKey",
    "SignError",
    "WorkerSession",
]
