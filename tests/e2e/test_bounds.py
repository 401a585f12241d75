"""Bounded schedules with real processes (``wheelctl serve``, ``wheelctl
worker``, ``wheelctl submit``): a job with ``--max-fires 3`` runs exactly
three fires and shows ``completed`` in ``wheelctl jobs``; one with
``--active-until`` a few seconds ahead stops firing there and completes; and
the count of fires holds across a SIGKILL and restart of the node."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from testkit.procs import ServerProc, WorkerProc, runs_of, wait_for, wheelctl

pytestmark = pytest.mark.slow


def _submit(target: str, *args: str) -> int:
    out = wheelctl("submit", "--target", target, "--json", "--handler", "record", *args).stdout
    return int(json.loads(out)["job_id"])


def _jobs(target: str) -> dict[int, dict[str, Any]]:
    out = wheelctl("jobs", "--target", target, "--json").stdout
    return {int(j["job_id"]): j for j in json.loads(out)}


def _fires(target: str, job_id: int) -> set[int]:
    """The job's fire records: its runs' and missed fires' scheduled times."""
    return {r["scheduled_for_ms"] for r in runs_of(target, job_id)}


def _completed(target: str, *job_ids: int) -> bool:
    jobs = _jobs(target)
    return all(jobs[j]["state"] == "completed" for j in job_ids)


def test_max_fires_and_active_until_end_jobs_that_then_show_completed(tmp_path: Path) -> None:
    server = ServerProc(tmp_path / "data", args=("--min-interval", "100ms"))
    server.start()
    worker = WorkerProc(server.target, tmp_path / "runs.txt", "w1")
    try:
        wait_for(worker.connected, 20, "the worker to connect")
        counted = _submit(server.target, "--name", "three", "--every", "300ms", "--max-fires", "3")
        until = _submit(
            server.target, "--name", "until", "--every", "400ms", "--active-until", "+3s"
        )
        # wheelctl read "+3s" before it answered: its bound is no later than
        # this (taken before the call, a loaded machine's start-up of the
        # command was more than the second once allowed for it).
        until_ms = int(time.time() * 1000) + 3_000
        wait_for(lambda: _completed(server.target, counted, until), 30, "both jobs to complete")
        runs = runs_of(server.target, counted)
        assert len(runs) == 3 and {r["state"] for r in runs} == {"succeeded"}
        fires = _fires(server.target, until)
        assert fires and max(fires) <= until_ms
        # Nothing fires any more.
        time.sleep(1.0)
        assert len(runs_of(server.target, counted)) == 3
        assert _fires(server.target, until) == fires
        shown = wheelctl("job", str(counted), "--target", server.target).stdout
        assert "at most 3 fires" in shown and "completed" in shown
    finally:
        worker.stop()
        server.stop()


def test_the_count_of_fires_holds_across_a_sigkill_and_restart(tmp_path: Path) -> None:
    server = ServerProc(tmp_path / "data", args=("--min-interval", "100ms"))
    server.start()
    worker = WorkerProc(server.target, tmp_path / "runs.txt", "w1")
    try:
        wait_for(worker.connected, 20, "the worker to connect")
        job = _submit(server.target, "--name", "five", "--every", "700ms", "--max-fires", "5")
        wait_for(lambda: len(_fires(server.target, job)) >= 2, 20, "two fires")
        server.stop(signal.SIGKILL)
        server.start()
        wait_for(lambda: _completed(server.target, job), 40, "the job to complete")
        fires = _fires(server.target, job)
        # Exactly five fire records (run, or recorded missed while the node
        # was down), each a fire of the schedule.
        assert len(fires) == 5
        spec = _jobs(server.target)[job]["schedule"]
        assert {(f - spec["start_ms"]) % 700 for f in fires} == {0}
        time.sleep(1.5)
        assert _fires(server.target, job) == fires
    finally:
        worker.stop()
        server.stop()
