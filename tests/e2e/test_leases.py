"""Leases, fences and run policies with real processes on loopback: a node
(`wheelctl serve` with a 2 s lease) and worker processes that the tests kill,
stop and resume. Each test has its own pool, so its runs go to its own workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from testkit.e2e_handlers import events
from testkit.procs import HERE, ServerProc, runs_of, wait_for, wheelctl
from tests.conftest import epoch_ms, utc_ms
from wheel.client import Client, JobArgs, JobState, Overlap, OverlapPolicy, Retry

pytestmark = pytest.mark.slow

LEASE_MS = 2_000
GRACE_MS = 1_000
CLAIM_AHEAD_MS = 250


class TunedServer(ServerProc):
    """``wheelctl serve`` with extra flags (short leases for fast tests)."""

    def __init__(self, data_dir: Path, *flags: str) -> None:
        super().__init__(data_dir)
        self.flags = list(flags)

    def start(self) -> None:
        args = ["serve", "--data-dir", str(self.data_dir), "--listen", self.target, *self.flags]
        self.starts += 1
        with open(self.data_dir.parent / f"server-{self.starts}.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "wheel", *args], stderr=log, stdout=log
            )
        wait_for(self.healthy, 30, "the node to serve")


class Workers:
    """Worker processes (``python -m e2e_handlers``) of one test, by pid."""

    def __init__(self, target: str, out: Path, pool: str) -> None:
        self.target = target
        self.out = out
        self.pool = pool
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.logs: dict[int, Path] = {}

    def start(self, worker_id: str, capacity: int = 8) -> int:
        env = dict(os.environ, WHEEL_E2E_OUT=str(self.out), PYTHONPATH=str(HERE))
        log_path = self.out.parent / f"{worker_id}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "e2e_handlers",
                    "--target",
                    self.target,
                    "--worker-id",
                    worker_id,
                    "--pool",
                    self.pool,
                    "--capacity",
                    str(capacity),
                ],
                env=env,
                stdout=log,
                stderr=log,
            )
        self.procs[proc.pid] = proc
        self.logs[proc.pid] = log_path
        wait_for(lambda: b"connected to" in log_path.read_bytes(), 30, f"{worker_id} to connect")
        return proc.pid

    def signal(self, pid: int, sig: int) -> None:
        self.procs[pid].send_signal(sig)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TunedServer]:
    root = tmp_path_factory.mktemp("leases")
    # Its jobs fire every few hundred ms: below the node's default minimum.
    srv = TunedServer(
        root / "data", "--lease-ms", str(LEASE_MS), "--grace-lease-ms", str(GRACE_MS),
        "--min-interval", "100ms",
        # Every fire claimed ahead, not a burst's only.
        "--claim-ahead-ms", str(CLAIM_AHEAD_MS), "--claim-ahead-min", "1",
    )  # fmt: skip
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def client(server: TunedServer) -> Iterator[Client]:
    with Client(server.target) as c:
        yield c


@pytest.fixture
def workers(
    server: TunedServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Workers]:
    ws = Workers(server.target, tmp_path / "out.txt", pool=request.node.name[:90])
    try:
        yield ws
    finally:
        ws.stop_all()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def job(pool: str, payload: dict[str, Any] | None = None, **kw: Any) -> JobArgs:
    """A one-shot due now, unless ``kw`` gives another schedule."""
    if not {"cron", "every", "at"} & kw.keys():
        kw["at"] = utc_ms(now_ms())
    return cast(
        JobArgs,
        {
            "name": "lease-test",
            "handler": "scripted",
            "pool": pool,
            "payload": json.dumps(payload or {}).encode(),
            **kw,
        },
    )


def runs(client: Client, job_id: int) -> list[tuple[int, str]]:
    """(attempt, state) of every execution, oldest attempt first."""
    return sorted((r.attempt, r.state.value) for r in client.runs(job_id) if r.run_id)


def submit(client: Client, args: JobArgs) -> int:
    return client.submit(**args).job_id


def of_job(out: Path, job_id: int, event: str | None = None) -> list[dict[str, Any]]:
    return [e for e in events(out) if e["job"] == job_id and event in (None, e["event"])]


def test_a_worker_killed_mid_run_loses_the_fire_to_another_within_the_lease(
    client: Client, workers: Workers
) -> None:
    a = workers.start("kill-a")
    b = workers.start("kill-b")
    job_id = submit(client, job(workers.pool, {"sleep_s": [60, 0]}))
    started = wait_for(lambda: of_job(workers.out, job_id, "start"), 20, "the first attempt")
    holder = started[0]["pid"]
    assert holder in (a, b)
    workers.signal(holder, signal.SIGKILL)
    killed_at = now_ms()
    wait_for(
        lambda: runs(client, job_id) == [(1, "lost"), (2, "succeeded")],
        20,
        "the re-dispatched attempt to succeed",
    )
    by_attempt = {r.attempt: r for r in client.runs(job_id)}
    # Re-dispatched once the lease (renewed by heartbeats until the kill) ran out.
    dispatched_at = by_attempt[2].dispatched_at
    assert dispatched_at is not None and epoch_ms(dispatched_at) - killed_at <= LEASE_MS + 1_500
    assert by_attempt[2].fence > by_attempt[1].fence
    assert by_attempt[2].idempotency_key == by_attempt[1].idempotency_key
    ends = of_job(workers.out, job_id, "end")
    assert [(e["attempt"], e["pid"]) for e in ends] == [(2, ({a, b} - {holder}).pop())]


def test_a_stopped_worker_past_its_lease_is_fenced_out_by_the_newer_attempt(
    client: Client, workers: Workers
) -> None:
    a = workers.start("stop-a")
    b = workers.start("stop-b")
    job_id = submit(client, job(workers.pool, {"sleep_s": [3, 0], "fenced": True}))
    first = wait_for(lambda: of_job(workers.out, job_id, "start"), 20, "the first attempt")[0]
    holder = first["pid"]
    workers.signal(holder, signal.SIGSTOP)
    try:
        wait_for(
            lambda: runs(client, job_id) == [(1, "lost"), (2, "succeeded")],
            20,
            "the newer attempt to win",
        )
        writes = of_job(workers.out, job_id, "fenced_write")
        assert [(w["attempt"], w["accepted"], w["pid"]) for w in writes] == [
            (2, True, ({a, b} - {holder}).pop())
        ]
    finally:
        workers.signal(holder, signal.SIGCONT)
    # The zombie wakes up believing nothing happened and writes with its old
    # fence: the resource refuses it.
    stale = wait_for(
        lambda: [w for w in of_job(workers.out, job_id, "fenced_write") if w["attempt"] == 1],
        20,
        "the stale attempt's write",
    )
    assert stale[0]["accepted"] is False and stale[0]["fence"] < writes[0]["fence"]
    # ...and the scheduler's record of the fire does not move either.
    wait_for(
        lambda: (
            of_job(workers.out, job_id, "end")[-1:] and len(of_job(workers.out, job_id, "end")) == 2
        ),
        20,
        "the stale attempt to finish",
    )
    time.sleep(0.5)  # room for a stale completion to (wrongly) land
    assert runs(client, job_id) == [(1, "lost"), (2, "succeeded")]
    # The stopped worker did not get the fire back while it was silent.
    assert [r.worker_id for r in client.runs(job_id) if r.attempt == 2] != [
        r.worker_id for r in client.runs(job_id) if r.attempt == 1
    ]


def test_a_fires_first_attempt_is_attempt_1_wherever_it_is_shown(
    server: TunedServer, client: Client, workers: Workers
) -> None:
    """Attempts count from 1: the handler's ``RunContext.attempt``, the
    runs in flight (client and ``wheelctl inflight``) and the run's record
    (client and ``wheelctl runs``) all say 1 for a fire's first run."""
    workers.start("first")
    job_id = submit(client, job(workers.pool, {"sleep_s": [2]}))
    [start] = wait_for(lambda: of_job(workers.out, job_id, "start"), 20, "the run to start")
    assert start["attempt"] == 1
    held = client.in_flight().runs
    assert [r.attempt for r in held if r.job_id == job_id] == [1]
    listed = json.loads(wheelctl("inflight", "--target", server.target, "--json").stdout)
    assert [r["attempt"] for r in listed["runs"] if r["job_id"] == job_id] == [1]
    wait_for(lambda: runs(client, job_id) == [(1, "succeeded")], 20, "the run to succeed")
    assert [r["attempt"] for r in runs_of(server.target, job_id)] == [1]


def test_retries_back_off_and_then_dead_letter(client: Client, workers: Workers) -> None:
    workers.start("retry")
    retry = Retry(max_attempts=3, initial_backoff=0.1, max_backoff=0.3)
    doomed = submit(client, job(workers.pool, {"fail": 99}, retry=retry))
    flaky = submit(client, job(workers.pool, {"fail": 2}, retry=retry))
    permanent = submit(client, job(workers.pool, {"permanent": True}, retry=retry))
    wait_for(
        lambda: runs(client, doomed) == [(1, "failed"), (2, "failed"), (3, "dead_lettered")],
        20,
        "the dead letter",
    )
    wait_for(
        lambda: runs(client, flaky) == [(1, "failed"), (2, "failed"), (3, "succeeded")],
        20,
        "the third attempt to succeed",
    )
    wait_for(lambda: runs(client, permanent) == [(1, "dead_lettered")], 20, "no retry")
    assert [e["attempt"] for e in of_job(workers.out, doomed, "start")] == [1, 2, 3]
    # Each retry waits at least its backoff (0.1 s, then 0.2 s), never less.
    tried = sorted((r for r in client.runs(doomed) if r.run_id), key=lambda r: r.attempt)
    for before, after, backoff_ms in zip(tried, tried[1:], (100, 200), strict=False):
        assert before.finished_at is not None and after.dispatched_at is not None
        assert epoch_ms(after.dispatched_at) - epoch_ms(before.finished_at) >= backoff_ms
    dead = list(client.runs(doomed, states=["dead_lettered"]))
    assert len(dead) == 1 and "scripted failure of attempt 3" in (dead[0].error or "")
    keys = {r.idempotency_key for r in client.runs(doomed)}
    assert len(keys) == 1  # stable across attempts


def test_a_one_shot_is_running_while_its_run_goes_on_and_completed_once_it_succeeds(
    client: Client, workers: Workers
) -> None:
    workers.start("one-shot-long")
    job_id = submit(client, job(workers.pool, {"sleep_s": [2]}))
    wait_for(lambda: of_job(workers.out, job_id, "start"), 20, "the run to start")
    assert client.get(job_id).state == JobState.RUNNING
    assert job_id in {j.job_id for j in client.jobs(state="running")}
    wait_for(lambda: of_job(workers.out, job_id, "end"), 20, "the run to end")
    wait_for(lambda: client.get(job_id).state == JobState.COMPLETED, 10, "the job to complete")


def test_a_one_shot_whose_only_attempt_fails_ends_failed(client: Client, workers: Workers) -> None:
    workers.start("one-shot-fails")
    job_id = submit(client, job(workers.pool, {"fail": 1}, retry=Retry(max_attempts=1)))
    wait_for(lambda: runs(client, job_id) == [(1, "dead_lettered")], 20, "the dead letter")
    assert client.get(job_id).state == JobState.FAILED
    assert job_id in {j.job_id for j in client.jobs(state="failed")}
    assert job_id not in {j.job_id for j in client.jobs(state="completed")}


def test_a_run_past_its_timeout_is_revoked_and_retried(client: Client, workers: Workers) -> None:
    workers.start("timeout")
    job_id = submit(
        client,
        job(
            workers.pool,
            {"sleep_s": 30},
            timeout=0.8,
            retry=Retry(max_attempts=2, initial_backoff=0.1, max_backoff=0.1),
        ),
    )
    wait_for(
        lambda: (
            len(runs(client, job_id)) == 2
            and runs(client, job_id)[1][1] not in ("dispatched", "running")
        ),
        20,
        "both attempts to end",
    )
    attempts = sorted((r for r in client.runs(job_id) if r.run_id), key=lambda r: r.attempt)
    assert attempts[0].state in ("timed_out", "failed")
    assert attempts[1].state == "dead_lettered"
    for r in attempts:
        assert "timed out" in (r.error or "")
        # Ended near the timeout, not after the handler's 30 s.
        assert r.finished_at is not None and r.dispatched_at is not None
        assert epoch_ms(r.finished_at) - epoch_ms(r.dispatched_at) < 800 + 1_500


def test_cancel_during_a_run_revokes_it_and_nothing_more_runs(
    client: Client, workers: Workers
) -> None:
    workers.start("cancel")
    job_id = submit(
        client,
        job(workers.pool, {"sleep_s": 2}, every=0.5, start=utc_ms(now_ms())),
    )
    wait_for(lambda: of_job(workers.out, job_id, "start"), 20, "the run to start")
    cancelled = client.cancel(job_id)
    assert cancelled.state == JobState.CANCELLED
    wait_for(lambda: runs(client, job_id) == [(1, "cancelled")], 10, "the run to be cancelled")
    # The handler finishes its sleep; its completion must not revive the run.
    wait_for(lambda: of_job(workers.out, job_id, "end"), 10, "the handler to return")
    time.sleep(0.5)
    assert runs(client, job_id) == [(1, "cancelled")]
    assert len(of_job(workers.out, job_id, "start")) == 1
    assert client.cancel(job_id).state == JobState.CANCELLED  # idempotent


def test_one_shots_due_together_are_claimed_ahead_and_start_no_earlier_than_their_time(
    client: Client, workers: Workers
) -> None:
    workers.start("ahead-a", capacity=64)
    workers.start("ahead-b", capacity=64)
    at = now_ms() + 2_000
    ids = [submit(client, job(workers.pool, at=utc_ms(at))) for _ in range(100)]
    wait_for(
        lambda: all(runs(client, j) == [(1, "succeeded")] for j in ids), 20, "every one-shot to run"
    )
    started = [e["t"] * 1000 for j in ids for e in of_job(workers.out, j, "start")]
    assert len(started) == 100
    # Claimed ahead of the instant (the store says each was dispatched at
    # its time, not at its claim's), none started before it.
    assert min(started) >= at
    for j in ids:
        [r] = client.runs(j)
        assert r.dispatched_at is not None
        assert epoch_ms(r.dispatched_at) == epoch_ms(r.scheduled_for) == at


def test_pause_then_resume_runs_from_now_without_a_burst(client: Client, workers: Workers) -> None:
    workers.start("pause")
    period = 300
    job_id = submit(
        client,
        job(workers.pool, every=period / 1000, start=utc_ms(now_ms() + period)),
    )
    wait_for(lambda: len(of_job(workers.out, job_id, "end")) >= 2, 20, "two runs")
    client.pause(job_id)
    paused_at = now_ms()
    time.sleep(2.5)  # fires come due while paused
    resume_sent = now_ms()
    client.resume(job_id)
    wait_for(
        lambda: (
            len([e for e in of_job(workers.out, job_id, "start") if e["t"] * 1000 > resume_sent])
            >= 3
        ),
        20,
        "runs after the resume",
    )
    client.pause(job_id)
    all_runs = list(client.runs(job_id))
    ran = sorted(epoch_ms(r.scheduled_for) for r in all_runs if r.run_id)
    missed = {epoch_ms(r.scheduled_for): r.missed_reason for r in all_runs if not r.run_id}
    # Nothing that came due while paused ran, late or otherwise: no burst.
    # A fire within the claim's lead of the pause may have been claimed
    # before it, and runs (``CLAIM_AHEAD_MS``).
    after = paused_at + CLAIM_AHEAD_MS + 50
    assert not [f for f in ran if after < f < resume_sent - 50]
    while_paused = [f for f in range(ran[0], resume_sent, period) if after < f < resume_sent - 50]
    assert len(while_paused) >= 5
    assert all(missed.get(f) == "paused" for f in while_paused), (while_paused, missed)
    # After the resume, runs follow the schedule one period apart.
    starts = sorted(
        e["t"] * 1000 for e in of_job(workers.out, job_id, "start") if e["t"] * 1000 > resume_sent
    )
    first_second = [t for t in starts if t < resume_sent + 1000]
    assert len(first_second) <= 1000 // period + 1


def _max_concurrency(evs: list[dict[str, Any]]) -> int:
    edges = sorted(
        (e["t"], 1 if e["event"] == "start" else -1) for e in evs if e["event"] in ("start", "end")
    )
    level = peak = 0
    for _, d in edges:
        level += d
        peak = max(peak, level)
    return peak


def test_overlap_policies(client: Client, workers: Workers) -> None:
    workers.start("overlap", capacity=8)
    period, run_s = 400, 1.0
    start = now_ms() + 300
    ids = {}
    for name, overlap in {
        "skip": Overlap(policy=OverlapPolicy.SKIP),
        "buffer_one": Overlap(policy=OverlapPolicy.BUFFER_ONE),
        "buffer_all": Overlap(policy=OverlapPolicy.BUFFER_ALL, max_buffered=100),
        "allow": Overlap(policy=OverlapPolicy.ALLOW, max_concurrent=2),
    }.items():
        ids[name] = submit(
            client,
            job(
                workers.pool,
                {"sleep_s": run_s},
                every=period / 1000,
                start=utc_ms(start),
                overlap=overlap,
            ),
        )
    wait_for(
        lambda: all(len(of_job(workers.out, j, "end")) >= 3 for j in ids.values()),
        30,
        "three runs of every job",
    )
    for j in ids.values():
        client.pause(j)
    # Let the runs in flight finish.
    wait_for(
        lambda: all(
            len(of_job(workers.out, j, "end")) == len(of_job(workers.out, j, "start"))
            for j in ids.values()
        ),
        10,
        "runs in flight to end",
    )
    out: dict[str, tuple[int, list[str]]] = {}
    for name, j in ids.items():
        rs = list(client.runs(j))
        out[name] = (
            _max_concurrency(of_job(workers.out, j)),
            [str(r.missed_reason) for r in rs if not r.run_id],
        )
        fires = sorted(epoch_ms(r.scheduled_for) for r in rs)
        # No silent drop: every fire from the first to the last has a record.
        assert fires == list(range(start, fires[-1] + 1, period)), name
    assert out["skip"][0] == 1 and "overlap" in out["skip"][1]
    assert out["buffer_one"][0] == 1 and "overlap" in out["buffer_one"][1]
    assert out["buffer_all"][0] == 1 and "overlap" not in out["buffer_all"][1]
    assert out["allow"][0] == 2 and "overlap" in out["allow"][1]
    # buffer_one runs the fire it held back right after the run it waited for.
    ran = sorted(epoch_ms(r.scheduled_for) for r in client.runs(ids["buffer_one"]) if r.run_id)
    skipped = sorted(epoch_ms(r.scheduled_for) for r in client.runs(ids["skip"]) if r.run_id)
    assert len(ran) >= len(skipped)
