"""What ``wheelctl status`` says about a real node: a backfill's old fires
are not dispatch lag, an alert clears when its cause does, and an empty
fleet is not called busy."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from testkit.procs import ServerProc, WorkerProc, runs_of, wait_for, wheelctl
from testkit.services import free_port
from tests.ops._node import scrape

pytestmark = pytest.mark.slow

HOUR_MS = 3_600_000


def _submit(target: str, *args: str) -> int:
    out = wheelctl("submit", "--target", target, "--json", *args).stdout
    return int(json.loads(out)["job_id"])


def _status(target: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(wheelctl("status", "--target", target, "--json").stdout)
    return out


def _status_text(target: str) -> str:
    return wheelctl("status", "--target", target).stdout


def _states(target: str, job: int) -> list[str]:
    """The job's runs' states by attempt."""
    return [r["state"] for r in sorted(runs_of(target, job), key=lambda r: r["attempt"])]


def _firing(target: str) -> list[str]:
    out = json.loads(wheelctl("alerts", "--target", target, "--json").stdout)
    firing: list[str] = out["firing"]
    return firing


def test_a_backfill_of_fires_hours_old_is_not_dispatch_lag(tmp_path: Path) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    server = ServerProc(tmp_path / "data", args=("--metrics-listen", metrics))
    server.start()
    worker = WorkerProc(server.target, tmp_path / "runs.txt", "w1")
    try:
        job = _submit(server.target, "--name", "hourly", "--handler", "record",
                      "--cron", "0 * * * *")  # fmt: skip
        wheelctl("backfill", str(job), "--target", server.target, "--from=-9h", "--to=-1m")

        def backfilled() -> list[dict[str, Any]]:
            runs = runs_of(server.target, job)
            old = [r for r in runs if r["scheduled_for_ms"] < time.time() * 1000 - HOUR_MS]
            done = len(old) >= 8 and all(r["state"] == "succeeded" for r in old)
            return old if done else []

        old = wait_for(backfilled, 60, "the backfill's runs to succeed")
        # Fires eight hours old and more went out: the lag of a fire due now.
        assert min(r["scheduled_for_ms"] for r in old) < time.time() * 1000 - 8 * HOUR_MS
        wheelctl("trigger", str(job), "--target", server.target)
        wait_for(
            lambda: _status(server.target)["dispatched_total"] >= len(old) + 1,
            20,
            "the trigger's run",
        )
        status = _status(server.target)
        assert status["dispatch_lag_p99"] < 1.0, status  # seconds; 8 hours before
        # The status text's lag too (eight hours would read "p99 28800000.0 ms").
        text = _status_text(server.target)
        (p99,) = re.findall(r" p99 ([0-9.]+) ms", text)
        assert float(p99) < 1000, text
        # The histogram the metrics and the console's lag chart read: the
        # trigger's run only.
        samples = scrape(f"http://{metrics}/metrics")
        assert samples["wheel_dispatch_lag_seconds_count"] == 1
        assert samples["wheel_dispatch_lag_seconds_sum"] < 1.0
    finally:
        worker.stop()
        server.stop()


def test_the_no_worker_alert_clears_when_the_job_waiting_for_a_worker_is_cancelled(
    tmp_path: Path,
) -> None:
    server = ServerProc(tmp_path / "data")
    server.start()
    try:
        job = _submit(server.target, "--name", "orphan", "--handler", "does_not_exist",
                      "--at", "+0s")  # fmt: skip
        waiting = "no worker for handler does_not_exist in pool default: 1 waiting"
        wait_for(lambda: waiting in _status_text(server.target), 20, "the waiting count")
        # The alert goes out after 10 s of waiting.
        wait_for(lambda: "no_worker" in _firing(server.target), 30, "the no_worker alert")
        assert "alerts firing: no_worker" in _status_text(server.target)
        wheelctl("cancel", str(job), "--target", server.target)

        def cleared() -> bool:
            text = _status_text(server.target)
            return waiting not in text and "alerts firing" not in text

        wait_for(cleared, 5, "the count and the alert to clear")
        assert _firing(server.target) == []
        assert [r["missed_reason"] for r in runs_of(server.target, job)] == ["cancelled"]
    finally:
        server.stop()


def test_a_lost_run_with_no_worker_connected_says_so_not_that_the_workers_are_busy(
    tmp_path: Path,
) -> None:
    server = ServerProc(tmp_path / "data", args=("--lease-ms", "1500", "--grace-lease-ms", "1000"))
    server.start()
    out = tmp_path / "runs.txt"
    first = WorkerProc(server.target, out, "w1", "e2e_handlers:scripted")
    second = None
    try:
        job = _submit(server.target, "--name", "long", "--handler", "scripted", "--at", "+0s",
                      "--payload", json.dumps({"sleep_s": [60, 0]}))  # fmt: skip
        wait_for(
            lambda: _states(server.target, job) == ["running"],
            20,
            "the run to start",
        )
        first.stop(signal.SIGKILL)  # its lease lapses with no worker left
        paused = "re-dispatch of lost runs is paused: no worker is connected"
        wait_for(lambda: paused in _status_text(server.target), 20, "the reaper's pause")
        assert "busy" not in _status_text(server.target)
        alerts = json.loads(wheelctl("alerts", "--target", server.target, "--json").stdout)
        [alert] = [a for a in alerts["alerts"] if a["kind"] == "reaper_paused"]
        assert "no worker connected" in alert["message"] and "busy" not in alert["message"]
        # A worker connects: the lost run goes to it, and the pause is over.
        second = WorkerProc(server.target, out, "w2", "e2e_handlers:scripted")
        wait_for(
            lambda: _states(server.target, job) == ["lost", "succeeded"],
            20,
            "the re-dispatched attempt",
        )
        wait_for(lambda: paused not in _status_text(server.target), 10, "the pause to end")
    finally:
        first.stop(signal.SIGKILL)
        if second is not None:
            second.stop()
        server.stop()
