"""A read of the store on its way while the node's own claim of a fire is.

The node sends a round's claims to the store thread and, in the same round,
reads the store (the change feed, or the jobs another member said it
stored): the read's snapshot may come before the claim commits, and its
rows are applied after the owner claimed. Applied as the store's word, such
a row (next_run_at still the claimed fire) armed the fire again; it came
due while its own run was going and was recorded missed (overlap): one fire
both run and missed, as a chaos run found."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import grpc

from tests.ops._node import LiveNode
from tests.rpc.test_api import all_runs, every, now_ms, spec, submit, wait_for
from tests.rpc.test_protocol_abuse import RawWorker, ack
from wheel.coord.local import LocalCoordinator
from wheel.node import NodeConfig
from wheel.rpc.v1 import job_service_pb2_grpc
from wheel.store.base import Store


class ClaimBehindARead:
    """A node whose first claim of ``job`` waits on the store thread until a
    re-read of that job has read the store (and so found it not claimed)."""

    def __init__(self, path: Path) -> None:
        self.job = 0
        self.claiming = threading.Event()
        self.read = threading.Event()
        self.live = LiveNode(f"sqlite:///{path}", NodeConfig(), coordinator=self._coordinator)

    def _coordinator(self, store: Store) -> LocalCoordinator:
        write_batch, job_rows = store.write_batch, store.job_rows

        def held_write(batch: Any) -> Any:
            if not self.claiming.is_set() and any(
                c.job_id == self.job and c.advance for c in batch.claims
            ):
                self.claiming.set()
                self.read.wait(10)
            return write_batch(batch)

        def reread(job_ids: Any) -> Any:
            out = job_rows(job_ids)
            if self.job in job_ids:
                self.read.set()
            return out

        store.write_batch = held_write  # type: ignore[method-assign]
        store.job_rows = reread  # type: ignore[method-assign]
        return LocalCoordinator("node-1", store.acquire_epochs)


def test_a_row_read_while_its_claim_commits_never_records_the_run_fire_missed(
    tmp_path: Path,
) -> None:
    held = ClaimBehindARead(tmp_path / "wheel.db")
    live = held.live.start()
    channel = grpc.insecure_channel(live.target)
    worker = RawWorker(live.target, "w1", capacity=4)
    try:
        api = type("Api", (), {"jobs": job_service_pb2_grpc.JobServiceStub(channel)})()
        period = 1_000
        first = now_ms() + 1_500
        job = submit(api, spec(name="every", handler="h", schedule=every(period, first))).job
        held.job = job.job_id
        assert held.claiming.wait(10), "the first fire was never claimed"
        # Word from another member that it stored the job: read it again now,
        # while the claim waits on the store thread.
        node = live.node
        assert node is not None
        live.call(lambda: node.jobs_changed([job.job_id]))
        assert held.read.wait(10), "the job was never read again"
        message = worker.expect("assignments", timeout=10)
        [a] = message.assignments.assignments
        assert a.scheduled_for_ms == first
        worker.send(ack((a.run_id, a.fence)))  # and it keeps running

        def missed() -> dict[int, str]:
            runs = all_runs(api, job.job_id)
            return {r.scheduled_for_ms: r.missed_reason for r in runs if r.missed_reason}

        # The next fire comes due while the first one runs: missed (overlap).
        seen = wait_for(lambda: missed().get(first + period), 10, "the next fire missed")
        assert seen == "overlap"
        assert first not in missed(), missed()
    finally:
        worker.close()
        channel.close()
        live.stop()
