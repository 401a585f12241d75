"""What ``wheelctl status`` says about a real node: an alert clears when
its cause does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.procs import ServerProc, runs_of, wait_for, wheelctl

pytestmark = pytest.mark.slow


def _submit(target: str, *args: str) -> int:
    out = wheelctl("submit", "--target", target, "--json", *args).stdout
    return int(json.loads(out)["job_id"])


def _status_text(target: str) -> str:
    return wheelctl("status", "--target", target).stdout


def _firing(target: str) -> list[str]:
    out = json.loads(wheelctl("alerts", "--target", target, "--json").stdout)
    firing: list[str] = out["firing"]
    return firing


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
