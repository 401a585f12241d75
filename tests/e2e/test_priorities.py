"""Priorities with real processes: a ``wheelctl serve`` node and one
``wheelctl worker --capacity 2`` whose handler sleeps; many priority-9 jobs
and a few priority-0 jobs come due together, and the priority-0 runs start
first (their start times written by the handler itself)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from testkit.e2e_handlers import starts
from testkit.procs import ServerProc, WorkerProc, wait_for
from wheel.client import Client, Job, JobRequest

pytestmark = pytest.mark.slow


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ServerProc]:
    data = tmp_path / "data"
    data.mkdir()
    server = ServerProc(data)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_priority_0_runs_start_before_the_priority_9_runs_due_with_them(
    node: ServerProc, tmp_path: Path
) -> None:
    out = tmp_path / "runs"
    worker = WorkerProc(
        node.target,
        out,
        "w1",
        "e2e_handlers:started",
        flags=("--capacity", "2"),
        env={"WHEEL_E2E_RUN_S": "0.2"},
    )
    try:
        wait_for(worker.connected, 30, "the worker to connect")
        due = datetime.now(UTC) + timedelta(seconds=2)
        # The priority-9 jobs submitted first: in arrival order they would run first.
        requests = [
            JobRequest(name=f"p9-{i}", handler="started", at=due, payload=f"p9-{i}", priority=9)
            for i in range(16)
        ]
        requests += [
            JobRequest(name=f"p0-{i}", handler="started", at=due, payload=f"p0-{i}", priority=0)
            for i in range(4)
        ]
        with Client(node.target) as client:
            jobs = [j for j in client.submit_many(requests) if isinstance(j, Job)]
            assert len(jobs) == len(requests)
            assert {client.get(j.job_id).priority for j in jobs} == {0, 9}
        ran = wait_for(lambda: len(starts(out)) == 20 and starts(out), 60, "every run to start")
    finally:
        worker.stop()
    order = [r["payload"][:2] for r in ran]
    # Two slots: the four priority-0 runs take them twice over, then the rest.
    assert order[:4] == ["p0"] * 4, order
    assert {r["attempt"] for r in ran} == {1}
    lag = {r["payload"]: r["started_ms"] - r["scheduled_for_ms"] for r in ran}
    p0 = max(v for k, v in lag.items() if k.startswith("p0"))
    p9 = max(v for k, v in lag.items() if k.startswith("p9"))
    assert p0 < p9
