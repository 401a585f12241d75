"""A planned hand-over tells each worker at once where the runs it holds of
the shards handed over report from now on: ``Results.moved`` on its stream,
naming the member the assignment gives each shard, before the worker says
anything about the run. Without it a worker learnt it from its next
heartbeat, or from a newer view, while the run's grace lease ran out at the
new owner."""

from __future__ import annotations

from pathlib import Path

import grpc

from tests.ops._node import LiveNode
from tests.rpc.test_api import now_ms, once, spec, submit
from tests.rpc.test_protocol_abuse import RawWorker, ack
from wheel.coord._moves import rendezvous_owner
from wheel.coord.base import Member
from wheel.coord.local import LocalCoordinator
from wheel.engine.model import shard_of
from wheel.node import NodeConfig
from wheel.rpc.v1 import job_service_pb2_grpc
from wheel.store.base import Store

OTHER = Member(node_id="node-2", address="127.0.0.1:1")


class Joined(LocalCoordinator):
    """Holds every shard, and sees ``OTHER`` as a member that joined."""

    def members(self) -> list[Member]:
        return [*super().members(), OTHER]


def test_a_planned_hand_over_tells_the_worker_where_its_runs_report(tmp_path: Path) -> None:
    def coordinator(store: Store) -> Joined:
        return Joined("node-1", store.acquire_epochs, address="127.0.0.1:2")

    with LiveNode(
        f"sqlite:///{tmp_path / 'wheel.db'}", NodeConfig(), coordinator=coordinator
    ) as live:
        channel = grpc.insecure_channel(live.target)
        jobs = job_service_pb2_grpc.JobServiceStub(channel)
        api = type("Api", (), {"jobs": jobs})()
        worker = RawWorker(live.target, "w1", capacity=16)
        try:
            for i in range(8):
                submit(api, spec(name=f"j{i}", handler="h", schedule=once(now_ms())))
            held: dict[int, tuple[int, int]] = {}  # run -> (fence, job)
            while len(held) < 8:
                for a in worker.expect("assignments").assignments.assignments:
                    held[a.run_id] = (a.fence, a.job_id)
            worker.send(ack(*((run, fence) for run, (fence, _) in held.items())))
            ids = ["node-1", OTHER.node_id]
            to_other = {
                run: fj
                for run, fj in held.items()
                if rendezvous_owner(shard_of(fj[1]), ids) == OTHER.node_id
            }
            assert to_other, "no run on a shard the joiner takes; submit more jobs"
            shards = {shard_of(job) for _, job in to_other.values()}
            assert live.node is not None
            live.run(live.node.hand_over_planned(shards))

            told: dict[int, tuple[int, str, str]] = {}
            while len(told) < len(to_other):
                msg = worker.expect("results", where=lambda m: len(m.results.moved) > 0)
                for m in msg.results.moved:
                    told[m.run_id] = (m.fence, m.owner_node_id, m.owner_address)
            assert told == {
                run: (fence, OTHER.node_id, OTHER.address) for run, (fence, _) in to_other.items()
            }
        finally:
            worker.close()
            channel.close()
