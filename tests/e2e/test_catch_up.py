"""Catch-up after downtime with real processes: the node is SIGKILLed for a few
seconds while a mix of jobs keeps coming due, then restarted. Every fire of the
downtime ends exactly as its job's policy says: run, or recorded as missed with
the policy's reason -- never both, never neither."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any, cast

import pytest

from testkit.procs import wait_for
from tests.conftest import epoch_ms, utc_ms
from tests.e2e.test_leases import TunedServer, Workers, now_ms
from wheel.client import CatchUp, CatchUpMode, Client, JobArgs

pytestmark = pytest.mark.slow

PERIOD = 1_000
DOWNTIME_S = 3.5


def _spec(name: str, pool: str, schedule: dict[str, Any], **catch_up: Any) -> JobArgs:
    return cast(
        JobArgs,
        {"name": name, "handler": "scripted", "pool": pool, "catch_up": CatchUp(**catch_up)}
        | schedule,
    )


def _history(client: Client, job_id: int) -> tuple[dict[int, list[str]], dict[int, Any]]:
    """fire -> execution states, and fire -> missed record."""
    runs: dict[int, list[str]] = {}
    missed: dict[int, Any] = {}
    for r in client.runs(job_id):
        fire = epoch_ms(r.scheduled_for)
        if r.run_id:
            runs.setdefault(fire, []).append(r.state.value)
        else:
            assert fire not in missed
            missed[fire] = r
    return runs, missed


def test_downtime_fires_follow_each_jobs_catch_up_policy_exactly(tmp_path: Path) -> None:
    server = TunedServer(tmp_path / "data", "--overdue-after-ms", "500")
    server.start()
    pool = "catch-up"
    workers = Workers(server.target, tmp_path / "out.txt", pool)
    try:
        workers.start("catch-up-worker")
        start = (now_ms() // PERIOD + 2) * PERIOD
        every = {"every": PERIOD / 1000, "start": utc_ms(start)}
        window_ms = 1_800
        with Client(server.target) as client:
            ids = {
                "latest": _spec("latest", pool, every, mode=CatchUpMode.RUN_LATEST_ONLY),
                "all": _spec("all", pool, every, mode=CatchUpMode.RUN_ALL),
                "capped": _spec("capped", pool, every, mode=CatchUpMode.RUN_ALL, max_count=2),
                "skip": _spec("skip", pool, every, mode=CatchUpMode.SKIP),
                "window": _spec(
                    "window", pool, every, mode=CatchUpMode.RUN_ALL, window=window_ms / 1000
                ),
                "cron": _spec("cron", pool, {"cron": "* * * * * *"}),
            }
            jobs = {name: client.submit(**s).job_id for name, s in ids.items()}
            # Normal operation first: every job runs a couple of fires.
            wait_for(
                lambda: all(
                    sum(st == ["succeeded"] for st in _history(client, j)[0].values()) >= 2
                    for j in jobs.values()
                ),
                20,
                "two runs of every job",
            )
            # Kill the node halfway between two fires, so no fire is in flight.
            wait_for(lambda: 400 <= now_ms() % PERIOD <= 600, 5, "mid-period", interval=0.01)
            killed_at = now_ms()
            at = killed_at + 1_500
            once = {"at": utc_ms(at)}
            jobs["once"] = client.submit(**_spec("once", pool, once)).job_id
            jobs["once_skip"] = client.submit(
                **_spec("once-skip", pool, once, mode=CatchUpMode.SKIP)
            ).job_id
            killed_at = max(killed_at, now_ms() - 50)
            server.stop(signal.SIGKILL)
            time.sleep(DOWNTIME_S)  # fires come due with nobody to dispatch them
            server.start()

            # The catch-up pass of the restarted node stamps its missed records
            # with its clock: that moment bounds the downtime batch.
            skip_missed = wait_for(
                lambda: [m for f, m in _history(client, jobs["skip"])[1].items() if f > killed_at],
                20,
                "the skip job's missed fires",
            )
            caught_up_at = epoch_ms(skip_missed[0].finished_at)
            assert caught_up_at - killed_at >= DOWNTIME_S * 1000
            batch = [f for f in range(start, caught_up_at + 1, PERIOD) if f > killed_at]
            assert len(batch) >= 3, batch
            # Let the batch and a fire after it run, then freeze the schedules.
            wait_for(
                lambda: all(
                    any(f > caught_up_at + PERIOD for f in _history(client, jobs[n])[0])
                    for n in ("latest", "all", "skip", "capped", "window", "cron")
                ),
                20,
                "fresh fires after the catch-up",
            )
            for name, j in jobs.items():
                if not name.startswith("once"):
                    client.pause(j)
            wait_for(
                lambda: (
                    not [
                        st
                        for j in jobs.values()
                        for sts in _history(client, j)[0].values()
                        for st in sts
                        if st in ("dispatched", "running")
                    ]
                ),
                10,
                "runs in flight to end",
            )

            hist = {name: _history(client, j) for name, j in jobs.items()}

        def outcome(name: str, fire: int) -> str:
            runs, missed = hist[name]
            assert not (fire in runs and fire in missed), (name, fire)
            if fire in runs:
                assert runs[fire] == ["succeeded"], (name, fire, runs[fire])
                return "ran"
            assert fire in missed, (name, fire, "neither ran nor recorded as missed")
            return str(missed[fire].missed_reason)

        # Before the kill everything ran; no fire of any recurring job is
        # without a record (a gap) and none has two.
        for name in ("latest", "all", "capped", "skip", "window"):
            runs, missed = hist[name]
            last = max([*runs, *missed])
            for fire in range(start, last + 1, PERIOD):
                result = outcome(name, fire)
                if fire < killed_at - PERIOD:
                    assert result == "ran", (name, fire, result)
        early = batch[:-1]
        assert [outcome("latest", f) for f in batch] == ["collapsed"] * len(early) + ["ran"]
        assert [outcome("all", f) for f in batch] == ["ran"] * len(batch)
        assert [outcome("capped", f) for f in batch] == ["over_cap"] * len(early) + ["ran"]
        assert [outcome("skip", f) for f in batch] == ["skipped"] * len(batch)
        assert [outcome("window", f) for f in batch] == [
            "outside_window" if caught_up_at - f > window_ms else "ran" for f in batch
        ]
        assert "outside_window" in [outcome("window", f) for f in batch]
        # The cron job (run_latest_only by default) over the same downtime.
        cron_batch = [f for f in range(killed_at // 1000 * 1000 + 1000, caught_up_at + 1, 1000)]
        assert [outcome("cron", f) for f in cron_batch] == ["collapsed"] * (len(cron_batch) - 1) + [
            "ran"
        ]
        # A one-shot that came due during the downtime runs once after it,
        # unless its policy skips it; then it is recorded, not lost.
        assert outcome("once", at) == "ran" and len(hist["once"][0]) == 1
        assert outcome("once_skip", at) == "skipped" and not hist["once_skip"][0]
        # The missed records are stamped by the catch-up pass, not invented later.
        for name in ("latest", "capped", "skip"):
            for f in early:
                assert epoch_ms(hist[name][1][f].finished_at) == caught_up_at, name
    finally:
        workers.stop_all()
        server.stop()
