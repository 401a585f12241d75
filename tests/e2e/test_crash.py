"""The node under load, SIGKILLed at random moments and restarted each time
(from its LMDB checkpoint). Afterwards, from the record of truth:

- no acknowledged job is lost;
- every fire that came due was dispatched at least once or recorded as missed
  with a reason (no silent drop);
- in-flight runs kept their leases across restarts instead of all being
  re-dispatched;
- no stale fence was accepted: a fire's succeeded execution carries the
  newest fence of that fire, and at most one execution of a fire succeeded.

``WHEEL_STRESS=1`` runs 100 kills instead of 20.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from testkit.e2e_handlers import events
from testkit.procs import ServerProc, WorkerProc, runs_of, wait_for, wheelctl
from tests.conftest import utc_ms
from wheel.client import Client
from wheel.engine.model import RunState
from wheel.store.sqlite import SQLiteStore

pytestmark = pytest.mark.slow

KILLS = 100 if os.environ.get("WHEEL_STRESS") else 12


def _submit(target: str, *args: str) -> int:
    out = wheelctl("submit", "--target", target, "--json", *args).stdout
    return int(json.loads(out)["job_id"])


def test_sigkill_restarts_lose_nothing_acknowledged(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("WHEEL_CRASH_SEED", "7")))
    # Interval jobs of 300 ms and more: below the node's default minimum.
    server = ServerProc(tmp_path / "data", args=("--min-interval", "100ms"))
    server.start()
    out = tmp_path / "runs.txt"
    workers = [WorkerProc(server.target, out, f"w{i}", "e2e_handlers:scripted") for i in range(2)]
    acknowledged: dict[int, str] = {}
    kill_times: list[float] = []
    try:
        slow = json.dumps({"sleep_s": 0.8})
        for i in range(4):
            job = _submit(
                server.target,
                "--name",
                f"every-{i}",
                "--handler",
                "scripted",
                "--every",
                f"{300 + 100 * i}ms",
                "--payload",
                slow,
            )
            acknowledged[job] = "interval"
        job = _submit(
            server.target,
            "--name",
            "cron",
            "--handler",
            "scripted",
            "--cron",
            "* * * * * *",
            "--catch-up",
            "run_all",
        )
        acknowledged[job] = "cron"
        for k in range(KILLS):
            time.sleep(rng.uniform(0.3, 1.2))
            if k % 3 == 0:
                # A one-shot acknowledged just before a kill must survive it.
                job = _submit(
                    server.target, "--name", f"once-{k}", "--handler", "scripted", "--at", "+1s"
                )
                acknowledged[job] = "once"
            kill_times.append(time.time())
            server.stop(signal.SIGKILL)
            server.start()
        # Let the last fires and the one-shots finish. A one-shot claimed just
        # before a kill that never reached a worker runs again once its grace
        # lease (5 s) runs out after the last restart: wait for that too.
        time.sleep(3.0)
        once = [job for job, kind in acknowledged.items() if kind == "once"]
        deadline = time.monotonic() + 12
        probe = SQLiteStore(server.data_dir / "wheel.db")
        try:
            while time.monotonic() < deadline and not all(
                any(r.state is RunState.SUCCEEDED for r in probe.list_runs(job, limit=100))
                for job in once
            ):
                time.sleep(0.5)
        finally:
            probe.close()
    finally:
        # Fires due once the workers begin to leave are owed, not dispatched:
        # with no worker to take them the owner leaves them due in the store
        # (its next fire stays at them). The bound is when the stop began, not
        # when it ended: two workers draining and a node shutting down on a
        # loaded machine take seconds.
        stopping_ms = int(time.time() * 1000)
        for w in workers:
            w.stop()
        server.stop()
    end_ms = stopping_ms - 4_000

    store = SQLiteStore(server.data_dir / "wheel.db")
    try:
        # 1. No acknowledged job is lost.
        for job_id in acknowledged:
            store.get_job(job_id)

        # 2. No silent drop: every nominal fire up to the end has an
        # execution or a missed record.
        from wheel.engine.schedule import compile_schedule

        for job_id, kind in acknowledged.items():
            record = store.get_job(job_id)
            runs = store.list_runs(job_id, limit=100_000)
            missed = store.list_missed(job_id, limit=100_000)
            seen = {r.scheduled_for for r in runs} | {m.scheduled_for for m in missed}
            compiled = compile_schedule(record.spec.schedule, job_id=job_id)
            first = compiled.next_fire(record.created_at_ms - 1)
            assert first is not None
            due = [first, *compiled.fires_between(first, end_ms, 100_000)]
            due = [f for f in due if f <= end_ms]
            lost = [f for f in due if f not in seen]
            assert lost == [], (
                f"job {job_id} ({kind}): fires silently dropped: {lost[:5]}; up to {end_ms},"
                f" next fire owed {record.next_run_at}, stop began {stopping_ms},"
                f" kills at {[int(t * 1000) for t in kill_times]}"
            )
            if kind == "once" and due:
                assert any(r.state is RunState.SUCCEEDED for r in runs), f"one-shot {job_id}"

            # 4. Fences: one success per fire, and it carries the newest fence.
            by_fire: dict[int, list[tuple[int, RunState]]] = {}
            for r in runs:
                by_fire.setdefault(r.scheduled_for, []).append((r.fence, r.state))
            for fire, attempts in by_fire.items():
                won = [f for f, s in attempts if s is RunState.SUCCEEDED]
                assert len(won) <= 1, f"job {job_id} fire {fire}: {attempts}"
                if won:
                    assert won[0] == max(f for f, _ in attempts), (job_id, fire, attempts)

        # 3. Leases kept: runs in flight at a kill were adopted by their workers
        # after the restart, not all re-dispatched as new attempts.
        all_runs = [r for j in acknowledged for r in store.list_runs(j, limit=100_000)]
        spanning = [
            r
            for r in all_runs
            if r.state is RunState.SUCCEEDED
            and r.started_at_ms is not None
            and r.finished_at_ms is not None
            and any(r.started_at_ms < t * 1000 < r.finished_at_ms for t in kill_times)
        ]
        lost_leases = [r for r in all_runs if r.state is RunState.LOST]
        assert spanning, "no run survived a restart: leases were not kept"
        assert len(lost_leases) <= max(3, len(spanning) // 2), (
            f"{len(lost_leases)} runs lost their lease vs {len(spanning)} kept across kills"
        )
    finally:
        store.close()

    # 5. Every restart came back from its checkpoint: a SIGKILL never leaves
    # LMDB unusable, so a fallback to the store here means the owner's log
    # records (full images, moves) no longer replay.
    for start in range(2, server.starts + 1):
        log = (tmp_path / f"server-{start}.log").read_text()
        assert "restored from the checkpoint" in log, f"start {start}: {log[-2000:]}"
        assert "checkpoint unusable" not in log, f"start {start}: {log[-2000:]}"


def test_a_one_shot_in_flight_when_node_and_worker_die_runs_once_after_a_rebuild(
    tmp_path: Path,
) -> None:
    """The one-shot's claim ended the job's schedule in the store; its worker and the
    node are SIGKILLed mid-run; the node comes back rebuilt from the store
    (no checkpoint). The lost run is dispatched again, as attempt 2, and the
    handler's work is done exactly once."""
    server = ServerProc(tmp_path / "data", args=("--no-checkpoint", "--lease-ms", "3000"))
    server.start()
    out = tmp_path / "runs.txt"
    first = WorkerProc(server.target, out, "w1", "e2e_handlers:scripted")
    second: WorkerProc | None = None
    try:
        # Attempt 1 runs long enough to be killed in the middle; attempt 2 is quick.
        payload = json.dumps({"sleep_s": [60, 0]})
        job = _submit(
            server.target, "--name", "once", "--handler", "scripted", "--at", "+1s",
            "--payload", payload,
        )  # fmt: skip
        wait_for(lambda: [e for e in events(out) if e["job"] == job], 20, "attempt 1 to start")
        wait_for(
            lambda: any(r["state"] == "running" for r in runs_of(server.target, job)),
            10,
            "the worker's ack to reach the store",
        )
        first.stop(signal.SIGKILL)
        server.stop(signal.SIGKILL)
        server.start()
        second = WorkerProc(server.target, out, "w2", "e2e_handlers:scripted")
        runs = wait_for(
            lambda: (
                [r for r in runs_of(server.target, job) if r["state"] == "succeeded"]
                and runs_of(server.target, job)
            ),
            30,
            "the lost run to be dispatched again and succeed",
        )
    finally:
        for w in (first, second):
            if w is not None:
                w.stop()
        server.stop()
    states = sorted((r["attempt"], r["state"]) for r in runs)
    assert states == [(1, "lost"), (2, "succeeded")], runs
    ends = [e for e in events(out) if e["job"] == job and e["event"] == "end"]
    assert [(e["attempt"], e["outcome"]) for e in ends] == [(2, "succeeded")]
    assert "restored from the store" in (tmp_path / "server-2.log").read_text()


def test_a_store_that_lost_its_last_commits_wins_over_the_checkpoint(tmp_path: Path) -> None:
    """A power loss with ``?synchronous=normal``: the store's last commits are
    gone while the checkpoint (fsynced each batch) logged them. Made for real:
    the store's files are copied while the node is stopped (SIGSTOP: a
    crash-consistent image, what the disk may hold after the power goes),
    the node then claims and runs the fires, is SIGKILLed, and the copy is
    put back. The restart finds the store's change mark below the one the
    checkpoint logged and rebuilds from the store, so every fire the store
    still owes runs; among them the interval job's, which the checkpoint's
    row has an hour on: a restore from that row dropped it silently."""
    data = tmp_path / "data"
    data.mkdir()
    db = data / "wheel.db"
    server = ServerProc(data, store=f"sqlite:///{db}?synchronous=normal")
    server.start()
    worker = WorkerProc(server.target, tmp_path / "runs.txt", "w1")
    backup = tmp_path / "backup"
    backup.mkdir()
    try:
        with Client(server.target) as client:
            at = int(time.time() * 1000) + 4_000
            jobs = [
                client.submit(name=f"once-{i}", handler="record", at=utc_ms(at)).job_id
                for i in range(5)
            ]
            jobs.append(
                client.submit(name="hourly", handler="record", every=3600, start=utc_ms(at)).job_id
            )
            # The change feed's watermark (read once a second) passes the
            # submits, so a restore from the checkpoint does not read them again.
            wait_for(lambda: time.time() * 1000 >= at - 1_500, 10, "the watermark to move")
            assert server.proc is not None
            server.proc.send_signal(signal.SIGSTOP)
            try:
                for name in ("wheel.db", "wheel.db-wal"):
                    if (data / name).exists():
                        shutil.copy2(data / name, backup / name)
            finally:
                server.proc.send_signal(signal.SIGCONT)

            def succeeded(job_id: int) -> bool:
                return any(r.state == "succeeded" for r in client.runs(job_id))

            wait_for(lambda: all(succeeded(j) for j in jobs), 20, "every fire to run")
            server.stop(signal.SIGKILL)
            for name in ("wheel.db", "wheel.db-wal", "wheel.db-shm"):
                (data / name).unlink(missing_ok=True)
            for copy in backup.iterdir():
                shutil.copy2(copy, data / copy.name)
            store = SQLiteStore(db)
            try:
                assert not any(store.list_runs(j) for j in jobs), "a copy from before the runs"
            finally:
                store.close()
            server.start()
            wait_for(lambda: all(succeeded(j) for j in jobs), 20, "the owed fires to run again")
    finally:
        worker.stop()
        server.stop()
    log = (tmp_path / "server-2.log").read_text()
    assert "checkpoint logged: the store lost commits" in log, log[-2000:]
    assert "restored from the store" in log, log[-2000:]
