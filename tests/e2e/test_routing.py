"""Routing by handler with real processes: workers of one pool that register
different handlers each get only the runs of their own handlers; work whose
handler no connected worker registered waits, shown in the node's status,
and runs once such a worker arrives."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from testkit.e2e_handlers import where
from testkit.procs import ServerProc, WorkerProc, wait_for
from wheel.rpc.v1 import admin_service_pb2, admin_service_pb2_grpc, jobs_pb2
from wheel.rpc.v1 import job_service_pb2 as js
from wheel.rpc.v1 import job_service_pb2_grpc as js_grpc

pytestmark = pytest.mark.slow


def _submit_one_shots(target: str, handler: str, count: int, at_ms: int) -> list[int]:
    with grpc.insecure_channel(target) as ch:
        resp = js_grpc.JobServiceStub(ch).SubmitJobs(
            js.SubmitJobsRequest(
                jobs=[
                    js.SubmitJobRequest(
                        spec=jobs_pb2.JobSpec(
                            name=f"{handler}-{i}",
                            handler=handler,
                            schedule=jobs_pb2.Schedule(once=jobs_pb2.OnceSchedule(at_ms=at_ms)),
                            retry=jobs_pb2.RetryPolicy(max_attempts=1),
                        )
                    )
                    for i in range(count)
                ]
            ),
            timeout=10,
        )
    assert all(not r.error_code for r in resp.results), resp
    return [r.response.job.job_id for r in resp.results]


def _status(target: str) -> admin_service_pb2.ClusterStatus:
    with grpc.insecure_channel(target) as ch:
        return admin_service_pb2_grpc.AdminServiceStub(ch).GetClusterStatus(  # type: ignore[no-any-return]
            admin_service_pb2.GetClusterStatusRequest(), timeout=5
        )


def _states(target: str, job_ids: list[int]) -> Counter[tuple[int, int]]:
    """(attempt, state) of every execution of the jobs."""
    out: Counter[tuple[int, int]] = Counter()
    with grpc.insecure_channel(target) as ch:
        stub = js_grpc.JobServiceStub(ch)
        for job_id in job_ids:
            for r in stub.ListRuns(js.ListRunsRequest(job_id=job_id), timeout=5).runs:
                out[(r.attempt, r.state)] += 1
    return out


def test_mixed_handler_workers_each_run_only_their_handlers(tmp_path: Path) -> None:
    server = ServerProc(tmp_path / "data")
    server.start()
    out = tmp_path / "runs.txt"
    workers = [WorkerProc(server.target, out, "alpha-1", "alpha=e2e_handlers:record_where")]
    try:
        at = int(time.time() * 1000) + 1_000
        alpha = _submit_one_shots(server.target, "alpha", 50, at)
        beta = _submit_one_shots(server.target, "beta", 50, at)
        wait_for(lambda: len(where(out)) >= 50, 30, "the alpha fires")

        # No worker registered beta: its fires wait unclaimed, and say so.
        status = wait_for(
            lambda: (s := _status(server.target)).unserved and s, 10, "beta shown as unserved"
        )
        assert [(u.pool, u.handler, u.waiting) for u in status.unserved] == [
            ("default", "beta", 50)
        ]
        assert [(w.worker_id, list(w.handlers)) for w in status.worker_list] == [
            ("alpha-1", ["alpha"])
        ]
        assert _states(server.target, beta) == Counter()  # no attempt used

        workers.append(WorkerProc(server.target, out, "beta-1", "beta=e2e_handlers:record_where"))
        workers.append(WorkerProc(server.target, out, "alpha-2", "alpha=e2e_handlers:record_where"))
        wait_for(lambda: len(where(out)) >= 100, 30, "the beta fires")
        wait_for(
            lambda: (
                _states(server.target, alpha + beta)
                == Counter({(1, jobs_pb2.RUN_STATE_SUCCEEDED): 100})
            ),
            15,
            "all 100 fires to succeed at their first attempt",
        )
        assert not _status(server.target).unserved
    finally:
        for w in workers:
            w.stop()
        server.stop()
    runs = where(out)
    assert len(runs) == 100
    assert {r["job"] for r in runs} == set(alpha + beta)
    for r in runs:
        assert r["worker"].startswith(r["handler"]), r
