"""Calendars through real processes: ``wheelctl serve``, ``wheelctl worker``
and ``wheelctl calendar``. A job skipping a calendar that holds today runs
no fire today and shows the day missed (calendar); deleting the calendar
makes it fire again, and setting it again stops it, without a resubmit;
a restart of the node keeps skipping."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from testkit.procs import ServerProc, WorkerProc, recorded, runs_of, wait_for, wheelctl

pytestmark = pytest.mark.slow


def _fires(out: Path, job_id: int) -> set[int]:
    return {int(k.split(":")[1]) for k, _, _ in recorded(out) if int(k.split(":")[0]) == job_id}


def _missed(target: str, job_id: int) -> list[int]:
    return [
        r["scheduled_for_ms"]
        for r in runs_of(target, job_id)
        if r["state"] == "missed" and r["missed_reason"] == "calendar"
    ]


def _set_today(target: str) -> None:
    # Today and tomorrow (UTC): a test run across midnight skips both.
    today = datetime.now(UTC).date()
    wheelctl("calendar", "set", "today", "--target", target,
             "--range", f"{today}..{today + timedelta(days=1)}")  # fmt: skip


def _quiet_for(out: Path, job_id: int, seconds: float) -> set[int]:
    """The job's fires, checked to stay the same for ``seconds``."""
    before = _fires(out, job_id)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert _fires(out, job_id) == before, "a fire ran on a skipped day"
        time.sleep(0.2)
    return before


def test_a_job_skipping_today_runs_nothing_until_its_calendar_changes(tmp_path: Path) -> None:
    server = ServerProc(tmp_path / "data")
    server.start()
    out = tmp_path / "runs.txt"
    worker = WorkerProc(server.target, out, "worker-1")
    try:
        wait_for(worker.connected, 20, "the worker to connect")
        _set_today(server.target)
        made = wheelctl("submit", "--target", server.target, "--name", "every-second",
                        "--handler", "record", "--cron", "* * * * * *",
                        "--skip-calendar", "today", "--json").stdout  # fmt: skip
        job_id = int(json.loads(made)["job_id"])
        shown = json.loads(wheelctl("job", str(job_id), "--target", server.target, "--json").stdout)
        assert shown["skip_calendars"] == ["today"]

        # Today is skipped: one missed record for the day, no run.
        wait_for(lambda: _missed(server.target, job_id), 15, "the day recorded missed")
        assert _quiet_for(out, job_id, 3) == set()
        assert len(_missed(server.target, job_id)) == 1
        assert all(r["state"] == "missed" for r in runs_of(server.target, job_id))

        # A restart of the node reads the calendar before it fires.
        server.stop()
        server.start()
        wait_for(worker.connected, 20, "the worker to connect again")
        assert _quiet_for(out, job_id, 3) == set()

        # Deleted: the job fires again, from now, without a resubmit.
        wheelctl("calendar", "delete", "today", "--target", server.target)
        wait_for(lambda: len(_fires(out, job_id)) >= 2, 20, "fires after the delete")
        runs = runs_of(server.target, job_id)
        ran = {r["scheduled_for_ms"] for r in runs if r["state"] == "succeeded"}
        assert not ran & set(_missed(server.target, job_id))

        # Set again: the next fire is recorded missed and the runs stop.
        before = len(_missed(server.target, job_id))
        _set_today(server.target)
        wait_for(lambda: len(_missed(server.target, job_id)) > before, 15, "a new missed day")
        _quiet_for(out, job_id, 3)
    finally:
        worker.stop()
        server.stop()
