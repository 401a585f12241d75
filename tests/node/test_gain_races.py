"""A job submitted through a node while it loads the shard the job falls in:
the load may have read the store before the job, and the change feed, read
on from the load's watermark, must bring it. Marked as the node's own (left
out of the feed) while the owner did not hold the shard, it was never armed,
until a restart or a move loaded the shard again. (A state change or update
of a shard being gained is refused as moving; a submit is taken.)"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import grpc

from tests.ops._node import LiveNode
from tests.rpc.test_api import now_ms, once, spec, submit
from tests.rpc.test_protocol_abuse import RawWorker
from wheel.coord.local import LocalCoordinator
from wheel.node import NodeConfig
from wheel.rpc.v1 import job_service_pb2_grpc
from wheel.store.base import Store


class SlowGain:
    """A node in a cluster whose first gain's load reads the store, then
    waits until ``release``: changes made meanwhile commit after what the load
    read and before the owner holds the shards (a slow load, a busy machine)."""

    def __init__(self, path: Path) -> None:
        self.read = threading.Event()
        self.release = threading.Event()
        self.live = LiveNode(f"sqlite:///{path}", NodeConfig(), coordinator=self._coordinator)

    def _coordinator(self, store: Store) -> LocalCoordinator:
        real = store.load_shards

        def load_shards(shards: Any, *args: Any, **kw: Any) -> Any:
            out = real(shards, *args, **kw)
            if shards and not self.release.is_set():
                self.read.set()
                self.release.wait(10)
            return out

        store.load_shards = load_shards  # type: ignore[method-assign]
        return LocalCoordinator("node-1", store.acquire_epochs)

    def __enter__(self) -> tuple[LiveNode, Any]:
        self.live.start()
        assert self.read.wait(10), "the gain never read the store"
        self.channel = grpc.insecure_channel(self.live.target)
        api = type("Api", (), {"jobs": job_service_pb2_grpc.JobServiceStub(self.channel)})()
        return self.live, api

    def taken_on(self) -> None:
        """Check the shards are still loading, and let the load finish."""
        node = self.live.node
        assert node is not None
        assert not self.live.call(lambda: node.held_shards()), "the shards were taken on early"
        self.release.set()

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.channel.close()
        self.live.stop()


def test_a_job_submitted_while_its_shard_loads_fires_once_the_shard_is_taken_on(
    tmp_path: Path,
) -> None:
    gain = SlowGain(tmp_path / "wheel.db")
    with gain as (live, api):
        job = submit(api, spec(name="during", handler="h", schedule=once(now_ms()))).job.job_id
        gain.taken_on()
        worker = RawWorker(live.target, "w1", capacity=4)
        try:
            message = worker.expect("assignments", timeout=10)
            assert [a.job_id for a in message.assignments.assignments] == [job]
        finally:
            worker.close()
