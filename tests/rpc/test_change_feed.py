"""A node's change feed brings what others changed, and leaves out the jobs
the node wrote itself: it applied those when it wrote them. The jobs come
as rows (no spec to parse): their profile, parameter and state.

(A read that starts while one of the node's writes commits may still bring
that write back, before the node has its marker: harmless, the job is
applied twice. The test reads at a moment of its choosing.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.rpc.test_api import (
    HOUR_MS,
    InProcessServer,
    connect,
    every,
    now_ms,
    spec,
    submit,
)
from wheel.engine.model import JobState
from wheel.engine.spec import Interval, JobSpec
from wheel.rpc.v1 import job_service_pb2
from wheel.store.base import NewJob, RowChanges
from wheel.store.open import open_store


def test_the_change_feed_brings_others_changes_and_not_the_node_s_own(tmp_path: Path) -> None:
    # No read of the node's own accord: the test reads when all is written.
    server = InProcessServer(tmp_path, changes_interval_s=3_600).start()
    try:
        node = server.node
        assert node is not None
        # Every job the feed hands the node, as the store answers it.
        read: list[int] = []
        real = node.store.changed_rows

        def recording(*args: Any, **kwargs: Any) -> RowChanges:
            changes = real(*args, **kwargs)
            read.extend(r.job_id for r in changes.rows)
            read.extend(j.job_id for j in changes.jobs)
            return changes

        node.store.changed_rows = recording  # type: ignore[method-assign]
        with connect(server) as api:
            hourly = every(HOUR_MS, now_ms() + HOUR_MS)
            mine = [submit(api, spec(name=f"j{i}", schedule=hourly)).job.job_id for i in range(6)]
            api.jobs.PauseJob(job_service_pb2.JobRef(job_id=mine[0]), timeout=10)
        other = open_store(f"sqlite:///{tmp_path / 'wheel.db'}")
        try:
            theirs, _ = other.submit_job(
                NewJob(
                    spec=JobSpec(name="theirs", handler="h", schedule=Interval(period_ms=HOUR_MS)),
                    created_at_ms=now_ms(),
                    next_run_at=now_ms() + HOUR_MS,
                )
            )
            # Another writer pauses a job this node submitted.
            other.set_job_state(mine[1], JobState.PAUSED, next_run_at=None, now_ms=now_ms())
        finally:
            other.close()

        server.run(node._changes.read_page(node._the_driver(), set()))
        assert sorted(read) == sorted([theirs.job_id, mine[1]])

        def paused(job_id: int) -> bool:
            job = node._the_driver().owner.book.job(job_id)
            return job is not None and job.paused

        assert server.call(lambda: node._the_driver().owner.has_job(theirs.job_id))
        assert server.call(lambda: [paused(j) for j in mine]) == [True, True, *[False] * 4]
    finally:
        server.stop()
