"""``wheelctl jobs``, ``job ID`` and ``runs`` against a real node: runs newest
first and paged, with their times and durations; jobs filtered, under a
header; one job in full; and every listing ending quietly when the reader
of its pipe goes away."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.rpc.test_api import InProcessServer, WorkerThread, wait_for
from wheel.cli import main
from wheel.cli._common import fmt_duration
from wheel.cli.listing import DEFAULT_RUNS_LIMIT, JOB_HEADER, RUN_HEADER
from wheel.worker import RunContext


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    s = InProcessServer(tmp_path_factory.mktemp("cli-listing")).start()
    try:
        yield s
    finally:
        s.stop()


def out(capsys: pytest.CaptureFixture[str], server: InProcessServer, *argv: str) -> str:
    assert main([*argv, "--target", server.target]) == 0
    return capsys.readouterr().out


def as_json(capsys: pytest.CaptureFixture[str], server: InProcessServer, *argv: str) -> Any:
    return json.loads(out(capsys, server, *argv, "--json"))


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def test_runs_are_newest_first_and_paged_with_times_durations_and_a_header(
    server: InProcessServer, capsys: pytest.CaptureFixture[str]
) -> None:
    made = as_json(capsys, server, "submit", "--name", "minutely", "--handler", "quick",
                   "--cron", "* * * * *")  # fmt: skip
    job_id = str(made["job_id"])
    start = datetime.now(UTC).replace(second=30, microsecond=0) - timedelta(hours=3)

    def quick(ctx: RunContext) -> None:
        return None

    with WorkerThread(server.target, "w-listing", quick=quick):
        back = as_json(capsys, server, "backfill", job_id, "--from", start.isoformat(),
                       "--to", (start + timedelta(minutes=120)).isoformat())  # fmt: skip
        assert back["scheduled"] == 120, back

        def succeeded() -> int:
            runs = as_json(capsys, server, "runs", job_id, "--all", "--state", "succeeded")
            return len(runs)

        wait_for(lambda: succeeded() >= 120, 60, "the backfill's runs to succeed")
    # By default the newest 50 (the fires of two hours: 4,375 would be as
    # many lines before), and stderr says how to see more.
    assert main(["runs", job_id, "--target", server.target]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0] == RUN_HEADER and len(lines) == 1 + DEFAULT_RUNS_LIMIT
    assert "the newest 50 shown; --limit N or --all for more" in captured.err
    every = as_json(capsys, server, "runs", job_id, "--all")
    assert len(every) >= 120
    fires = [r["scheduled_for_ms"] for r in every]
    assert fires == sorted(fires, reverse=True)  # newest first
    newest = as_json(capsys, server, "runs", job_id, "--limit", "3")
    assert newest == every[:3]
    # Each line: fire, attempt, state, started, finished, duration, run, worker.
    done = [r for r in every if r["state"] == "succeeded"]
    r = done[0]
    assert r["started_at_ms"] or r["dispatched_at_ms"]
    assert r["finished_at_ms"] >= (r["started_at_ms"] or r["dispatched_at_ms"])
    assert r["duration_ms"] == r["finished_at_ms"] - (r["started_at_ms"] or r["dispatched_at_ms"])
    line = next(x for x in lines[1:] if f" {r['run_id']} " in x)
    fire = datetime.fromtimestamp(r["scheduled_for_ms"] / 1000, UTC)
    finished = datetime.fromtimestamp(r["finished_at_ms"] / 1000, UTC)
    assert line.startswith(f"{_iso(fire)}  ")
    assert "succeeded" in line and _iso(finished) in line and "w-listing" in line
    assert fmt_duration(timedelta(milliseconds=r["duration_ms"])) in line.split()
    # --state keeps those states only; missed is one of them.
    assert as_json(capsys, server, "runs", job_id, "--all", "--state", "missed") == [
        x for x in every if x["state"] == "missed"
    ]


def test_runs_state_missed_lists_the_missed_fires_with_their_reason(
    server: InProcessServer, capsys: pytest.CaptureFixture[str]
) -> None:
    made = as_json(capsys, server, "submit", "--name", "paused", "--handler", "nobody",
                   "--every", "1s")  # fmt: skip
    job_id = str(made["job_id"])
    out(capsys, server, "pause", job_id)
    # The fires due while it was paused are recorded missed when it resumes.
    paused = datetime.now(UTC)
    wait_for(lambda: datetime.now(UTC) > paused + timedelta(seconds=2.5), 5, "two fires due")
    out(capsys, server, "resume", job_id)
    wait_for(
        lambda: len(as_json(capsys, server, "runs", job_id, "--state", "missed")) >= 2,
        20,
        "fires missed while paused",
    )
    missed = as_json(capsys, server, "runs", job_id, "--state", "missed")
    assert {m["state"] for m in missed} == {"missed"}
    assert {m["missed_reason"] for m in missed} == {"paused"}
    text = out(capsys, server, "runs", job_id, "--state", "missed", "--limit", "1")
    [header, line] = text.splitlines()
    assert header == RUN_HEADER and line.split()[1:3] == ["0", "missed"]
    assert line.endswith("paused")


def test_jobs_filters_by_state_and_name_prefix_under_a_header(
    server: InProcessServer, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = {}
    for name in ("report-a", "report-b", "cleanup"):
        ids[name] = as_json(capsys, server, "submit", "--name", name, "--handler", "h",
                            "--cron", "0 2 * * *", "--tz", "Asia/Tokyo")["job_id"]  # fmt: skip
    out(capsys, server, "pause", str(ids["report-b"]))
    lines = out(capsys, server, "jobs", "--name", "report-").splitlines()
    assert lines[0] == JOB_HEADER
    assert [line.split()[0] for line in lines[1:]] == [str(ids["report-a"]), str(ids["report-b"])]
    paused = as_json(capsys, server, "jobs", "--name", "report-", "--state", "paused")
    assert [j["job_id"] for j in paused] == [ids["report-b"]]
    listed = out(capsys, server, "jobs", "--state", "paused", "--name", "report-").splitlines()
    assert len(listed) == 2 and " paused " in listed[1]
    # A Tokyo cron's next fire is printed in UTC with its Z: 02:00 in Tokyo
    # is 17:00 UTC the day before.
    assert "T17:00:00.000Z" in lines[1]


def test_job_shows_one_job_in_full(
    server: InProcessServer, capsys: pytest.CaptureFixture[str]
) -> None:
    made = as_json(capsys, server, "submit", "--name", "tokyo", "--handler", "h",
                   "--cron", "0 2 * * *", "--tz", "Asia/Tokyo", "--payload-json", '{"a": 1}',
                   "--max-attempts", "4", "--initial-backoff", "2s")  # fmt: skip
    job_id = str(made["job_id"])
    text = out(capsys, server, "job", job_id).splitlines()
    assert text[0] == f"job {job_id}: tokyo"
    assert "  state       active" in text
    assert "  schedule    cron 0 2 * * * (Asia/Tokyo), dst gap fire_at_transition," in "\n".join(
        text
    )
    assert any(x.startswith("  retry       4 attempts in all; backoff 2.00s x2") for x in text)
    assert '  payload     8 bytes: {"a": 1}' in text
    # Each next fire in UTC and in the job's zone, with its offset and name.
    i = text.index("next fires:")
    first = text[i + 1].split()
    assert first[0].endswith("T17:00:00.000Z")
    assert first[1].endswith("T02:00:00.000+09:00") and first[2] == "(Asia/Tokyo)"
    assert text[-1] == "last runs: none"
    full = as_json(capsys, server, "job", job_id)
    assert full["job_id"] == made["job_id"] and full["name"] == "tokyo"
    assert len(full["next_fires_ms"]) == 5 and full["recent_runs"] == []
    assert full["retry"]["initial_backoff_ms"] == 2000 and full["retry"]["max_attempts"] == 4
    # An unknown id answers as the node does, naming it.
    assert main(["job", "987654321", "--target", server.target]) == 2
    assert "987654321" in capsys.readouterr().err


def _closed_reader() -> subprocess.Popen[bytes]:
    """A process at the other end of a pipe that closes it before anything
    comes: what ``| head -1`` becomes once it has its line."""
    code = "import os, sys, time\nos.close(0)\nprint('closed', flush=True)\ntime.sleep(60)"
    reader = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert reader.stdout is not None and reader.stdout.readline() == b"closed\n"
    return reader


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["jobs"], ["jobs", "--json"], ["runs", "{job}", "--all"],
                                  ["alerts", "--json"], ["job", "{job}"]])  # fmt: skip
def test_a_listing_piped_to_a_reader_that_went_away_ends_quietly(
    server: InProcessServer, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    made = as_json(capsys, server, "submit", "--name", "piped", "--handler", "h", "--every", "1h")
    argv = [a.replace("{job}", str(made["job_id"])) for a in argv]
    reader = _closed_reader()
    try:
        assert reader.stdin is not None
        proc = subprocess.run(
            [sys.executable, "-m", "wheel", *argv, "--target", server.target],
            stdout=reader.stdin,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
        )
    finally:
        reader.kill()
        reader.communicate()  # and closes our ends of its pipes
    assert proc.returncode in (0, 141), proc.stderr
    assert proc.stderr == b""


@pytest.mark.slow
def test_jobs_json_piped_to_head_ends_quietly(
    server: InProcessServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """More than a pipe holds (three 100 KB payloads read from a file), to
    ``head -c 1``: the listing is cut off, with no traceback."""
    big = tmp_path / "payload.txt"
    big.write_text("x" * 100_000)
    for n in range(3):
        as_json(capsys, server, "submit", "--name", f"big-{n}", "--handler", "h",
                "--every", "1h", "--payload", f"@{big}")  # fmt: skip
    listing = subprocess.Popen(
        [sys.executable, "-m", "wheel", "jobs", "--json", "--target", server.target],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    head = subprocess.run(["head", "-c", "1"], stdin=listing.stdout, capture_output=True)
    assert listing.stdout is not None
    listing.stdout.close()  # only head holds the pipe's read end
    _, err = listing.communicate(timeout=60)
    assert head.stdout == b"["
    assert listing.returncode in (0, 141) and err == b""
