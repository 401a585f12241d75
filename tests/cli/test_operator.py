"""wheelctl's operator commands against a real node over gRPC: update with
submit's own flags (only those given change), the record of updates,
backfill, preview across a DST change, submit's DST flags, dead letters
listed and redriven, and --json on every listing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tests.rpc.test_api import InProcessServer, WorkerThread, now_ms, wait_for
from wheel.cli import main
from wheel.worker import Permanent, RunContext


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    s = InProcessServer(tmp_path_factory.mktemp("cli-operator")).start()
    try:
        yield s
    finally:
        s.stop()


def run(capsys: pytest.CaptureFixture[str], server: InProcessServer, *argv: str) -> Any:
    """``wheelctl ARGV --target ... --json``'s answer, parsed."""
    assert main([*argv, "--target", server.target, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_update_changes_only_the_flags_given_and_updates_lists_the_change(
    server: InProcessServer, capsys: pytest.CaptureFixture[str]
) -> None:
    made = run(capsys, server, "submit", "--name", "nightly", "--handler", "h",
               "--cron", "0 3 * * *", "--payload", "v1", "--max-attempts", "3")  # fmt: skip
    job_id = str(made["job_id"])
    job = run(capsys, server, "update", job_id, "--cron", "*/5 * * * *", "--tz", "Europe/Paris",
              "--dst-gap", "skip", "--payload", "v2")  # fmt: skip
    assert job["job_id"] == made["job_id"] and job["name"] == "nightly"
    assert job["schedule"] == {"cron": "*/5 * * * *", "tz": "Europe/Paris", "dst_gap": "skip",
                               "dst_fold": "first"}  # fmt: skip
    assert job["next_fire_ms"] % 300_000 == 0
    run(capsys, server, "update", job_id, "--name", "every-five")
    [second, first] = run(capsys, server, "updates", job_id)
    assert (first["version"], second["version"]) == (1, 2)
    assert first["changed"]["schedule"][0]["cron"] == "0 3 * * *" and first["payload_changed"]
    assert second["changed"] == {"name": ["nightly", "every-five"]}
    [listed] = [j for j in run(capsys, server, "jobs") if j["job_id"] == made["job_id"]]
    assert listed["name"] == "every-five" and listed["schedule"] == job["schedule"]
    # Without --json: a line a change.
    assert main(["updates", job_id, "--target", server.target]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("v2") and "name nightly -> every-five" in lines[0]
    # A tenant never changes; an update needs a flag; a bad cron is named.
    target = ["--target", server.target]
    assert main(["update", job_id, *target, "--tenant", "other"]) == 2
    assert "tenant" in capsys.readouterr().err
    assert main(["update", job_id, *target]) == 2
    assert "give at least one" in capsys.readouterr().err
    assert main(["update", job_id, *target, "--cron", "99 * * * *"]) == 2
    assert "cron" in capsys.readouterr().err
    assert main(["update", "987654321", *target, "--name", "x"]) == 2
    assert "987654321" in capsys.readouterr().err
    [still] = [j for j in run(capsys, server, "jobs") if j["job_id"] == made["job_id"]]
    assert still == listed


def test_submit_takes_the_dst_flags_and_preview_shows_them_across_a_change(
    server: InProcessServer, capsys: pytest.CaptureFixture[str]
) -> None:
    made = run(capsys, server, "submit", "--name", "ny", "--handler", "h", "--cron", "30 2 * * *",
               "--tz", "America/New_York", "--dst-gap", "skip", "--dst-fold", "both")  # fmt: skip
    [job] = [j for j in run(capsys, server, "jobs") if j["job_id"] == made["job_id"]]
    assert (job["schedule"]["dst_gap"], job["schedule"]["dst_fold"]) == ("skip", "both")
    spring = ["--cron", "30 2 * * *", "--tz", "America/New_York",
              "--from", "2027-03-13T00:00:00+00:00", "--count", "2"]  # fmt: skip
    fires = [f["utc"] for f in run(capsys, server, "preview", *spring)]
    assert fires == ["2027-03-13T07:30:00+00:00", "2027-03-14T07:00:00+00:00"]
    skipped = [f["utc"] for f in run(capsys, server, "preview", *spring, "--dst-gap", "skip")]
    assert skipped == ["2027-03-13T07:30:00+00:00", "2027-03-15T06:30:00+00:00"]
    # The job's own preview from the same date: its skip policy.
    mine = run(capsys, server, "preview", "--job", str(made["job_id"]),
               "--from", "2027-03-13T00:00:00+00:00", "--count", "2")  # fmt: skip
    assert [f["utc"] for f in mine] == skipped
    every = run(capsys, server, "preview", "--every", "90s", "--start", "1800000000000",
                "--from", "1800000000000", "--count", "3")  # fmt: skip
    assert [f["fire_ms"] for f in every] == [1_800_000_000_000 + k * 90_000 for k in range(3)]
    # Without --json: UTC with its Z, and the zone's own wall time with its
    # offset and name.
    assert main(["preview", *spring, "--target", server.target]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "2027-03-14T07:00:00.000Z  2027-03-14T03:00:00.000-04:00 (America/New_York)"


def test_backfill_and_dead_letters_through_wheelctl(
    server: InProcessServer, capsys: pytest.CaptureFixture[str]
) -> None:
    failed: set[int] = set()

    def flaky(ctx: RunContext) -> None:
        if ctx.scheduled_for_ms not in failed:
            failed.add(ctx.scheduled_for_ms)
            raise Permanent("first attempt fails")

    with WorkerThread(server.target, "w-cli-dlq", cli_flaky=flaky):
        start = now_ms() - 2 * 3_600_000
        # Every half hour from two hours ago: its next fire is half an hour away.
        made = run(capsys, server, "submit", "--name", "dlq", "--handler", "cli_flaky",
                   "--every", "30m", "--start", str(start))  # fmt: skip
        job_id = str(made["job_id"])
        back = run(capsys, server, "backfill", job_id, "--from", str(start), "--to=-1s")
        assert back["scheduled_for_ms"] == [start + k * 1_800_000 for k in range(4)]
        want = 4
        letters = wait_for(
            lambda: (
                (r := run(capsys, server, "dlq", "list", "--job", job_id)) and len(r) >= want and r
            ),
            10,
            "the backfilled fires to be dead-lettered",
        )
        assert {r["scheduled_for_ms"] for r in letters} == set(back["scheduled_for_ms"])
        assert all(r["state"] == "dead_lettered" and r["error"] for r in letters)
        assert all(r["result"] is None for r in letters)  # a raise leaves no result
        everyone = {r["run_id"] for r in run(capsys, server, "dlq", "list")}
        assert {r["run_id"] for r in letters} <= everyone
        one = run(capsys, server, "dlq", "redrive", job_id, "--run", str(letters[0]["run_id"]))
        assert [(r["scheduled_for_ms"], r["attempt"]) for r in one] == [
            (letters[0]["scheduled_for_ms"], letters[0]["attempt"] + 1)
        ]
        rest = run(capsys, server, "dlq", "redrive", job_id)
        assert len(rest) == want - 1
        # A redriven dead letter is not one any more, at once.
        assert run(capsys, server, "dlq", "list", "--job", job_id) == []

        def succeeded() -> list[int]:
            runs = run(capsys, server, "runs", job_id)
            return sorted(r["scheduled_for_ms"] for r in runs if r["state"] == "succeeded")

        wait_for(lambda: len(succeeded()) >= want, 10, "every redriven run to succeed")
        assert succeeded() == back["scheduled_for_ms"]
    assert main(["dlq", "list", "--target", server.target]) == 0
    capsys.readouterr()


def test_redrive_of_a_whole_job_runs_every_dead_letter_past_a_nodes_bound_per_call(
    server: InProcessServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """More dead letters than a node redrives in one call (its bound made 5
    here, from 1,000, to keep the test quick): ``dlq redrive JOB_ID``
    (``Client.redrive``), then ``AsyncClient.redrive``, run them all and
    say how many."""
    from wheel.client import AsyncClient
    from wheel.node import _updates

    monkeypatch.setattr(_updates, "MAX_REDRIVE", 5)
    count = 12  # three calls: 5, 5 and 2
    start = (now_ms() // 1000 - count - 60) * 1000
    end = start + count * 1000  # every second of it: ``count`` past fires

    def flaky(ctx: RunContext) -> None:
        # The backfilled fires fail twice (a dead letter, then its redrive);
        # the job's own live fires run.
        if ctx.scheduled_for_ms < end and ctx.attempt <= 2:
            raise Permanent(f"attempt {ctx.attempt} fails")

    def dead(job_id: str) -> list[dict[str, Any]]:
        return run(capsys, server, "dlq", "list", "--job", job_id)  # type: ignore[no-any-return]

    with WorkerThread(server.target, "w-cli-dlq-many", cli_many=flaky):
        made = run(capsys, server, "submit", "--name", "dlq-many", "--handler", "cli_many",
                   "--every", "1s", "--start", str(start), "--overlap", "allow",
                   "--max-concurrent", "16")  # fmt: skip
        job_id = str(made["job_id"])
        back = run(capsys, server, "backfill", job_id, "--from", str(start), "--to", str(end))
        assert back["scheduled"] == count
        first = wait_for(lambda: len(d := dead(job_id)) == count and d, 20, "the dead letters")
        assert {r["attempt"] for r in first} == {1}
        assert main(["dlq", "redrive", job_id, "--target", server.target]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0] == f"redrove {count} dead letters of job {job_id}: new attempts"
        assert len(out) == 1 + count
        second = wait_for(lambda: len(d := dead(job_id)) == count and d, 20, "the second failures")
        assert {r["attempt"] for r in second} == {2}

        async def redrive_async() -> list[int]:
            async with AsyncClient(server.target) as client:
                return [r.attempt for r in await client.redrive(int(job_id))]

        assert asyncio.run(redrive_async()) == [3] * count
        assert dead(job_id) == []

        def succeeded() -> set[int]:
            runs = run(capsys, server, "runs", job_id)
            return {r["scheduled_for_ms"] for r in runs if r["state"] == "succeeded"}

        wait_for(lambda: set(back["scheduled_for_ms"]) <= succeeded(), 20, "every fire to run")


def test_a_from_or_to_without_a_zone_is_a_wall_time_in_the_schedules_zone(
    server: InProcessServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--from 2027-03-13`` with ``--tz America/New_York`` is midnight in
    New York, not in UTC (whose midnight is 19:00 the day before there), for
    a schedule, a job's preview and a backfill's range."""
    ten_pm = ["--cron", "0 22 * * *", "--tz", "America/New_York"]
    fires = run(capsys, server, "preview", *ten_pm, "--from", "2027-03-13", "--count", "2")
    assert [f["utc"] for f in fires] == [
        "2027-03-14T03:00:00+00:00",  # 22:00 on 2027-03-13 in New York (EST)
        "2027-03-15T02:00:00+00:00",  # 22:00 on 2027-03-14 (EDT from that morning)
    ]
    made = run(capsys, server, "submit", "--name", "ny-ten", "--handler", "h", *ten_pm)
    job_id = str(made["job_id"])
    mine = run(
        capsys, server, "preview", "--job", job_id, "--from", "2027-03-13T21:59", "--count", "1"
    )
    assert [f["utc"] for f in mine] == ["2027-03-14T03:00:00+00:00"]
    # Without --json the wall times are the job's zone's.
    assert main(["preview", "--job", job_id, "--from", "2027-03-13", "--count", "1",
                 "--target", server.target]) == 0  # fmt: skip
    assert capsys.readouterr().out.split() == [
        "2027-03-14T03:00:00.000Z",
        "2027-03-13T22:00:00.000-05:00",
        "(America/New_York)",
    ]
    # A zoneless ISO --from/--to of backfill: the job's wall times (read as
    # UTC, 21:00-23:00 would be the afternoon in New York, with no fire in it).
    day = (datetime.now(ZoneInfo("America/New_York")) - timedelta(days=2)).date().isoformat()
    back = run(capsys, server, "backfill", job_id, "--from", f"{day}T21:00", "--to", f"{day}T23:00")
    ten = datetime.fromisoformat(f"{day}T22:00").replace(tzinfo=ZoneInfo("America/New_York"))
    assert back["scheduled_for_ms"] == [int(ten.timestamp() * 1000)]
    # A zone given still wins.
    utc = run(
        capsys, server, "preview", *ten_pm, "--from", "2027-03-13T00:00:00+00:00", "--count", "1"
    )
    assert [f["utc"] for f in utc] == ["2027-03-13T03:00:00+00:00"]  # 22:00 on the 12th there


def test_update_changes_any_part_of_a_schedule_and_turns_switches_both_ways(
    server: InProcessServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A schedule flag alone changes that part of the job's schedule (the
    rest kept); --at-most-once and --fixed-delay have flags that turn them
    off; the job's JSON has its policies and payload, and the record of
    updates names every field that changed."""
    made = run(capsys, server, "submit", "--name", "parts", "--handler", "h",
               "--cron", "0 3 * * *", "--tz", "America/New_York", "--at-most-once",
               "--payload", "v1")  # fmt: skip
    job_id = str(made["job_id"])
    [job] = [j for j in run(capsys, server, "jobs") if j["job_id"] == made["job_id"]]
    assert job["at_most_once"] is True and job["payload"] == "v1"
    assert job["retry"]["max_attempts"] == 5 and job["timeout_ms"] == 300_000
    paris = run(capsys, server, "update", job_id, "--tz", "Europe/Paris")
    assert paris["schedule"] == {"cron": "0 3 * * *", "tz": "Europe/Paris", "dst_gap":
                                 "fire_at_transition", "dst_fold": "first"}  # fmt: skip
    skip = run(capsys, server, "update", job_id, "--dst-gap", "skip")
    assert skip["schedule"] == {**paris["schedule"], "dst_gap": "skip"}
    policies = run(capsys, server, "update", job_id, "--idempotent", "--catch-up", "run_all",
                   "--max-attempts", "9", "--timeout", "30s", "--payload", "v2")  # fmt: skip
    assert policies["at_most_once"] is False and policies["catch_up"]["mode"] == "run_all"
    assert (policies["retry"]["max_attempts"], policies["timeout_ms"]) == (9, 30_000)
    assert policies["payload"] == "v2" and policies["schedule"] == skip["schedule"]
    [third, second, first] = run(capsys, server, "updates", job_id)
    assert first["changed"] == {"schedule": [job["schedule"], paris["schedule"]]}
    assert second["changed"] == {"schedule": [paris["schedule"], skip["schedule"]]}
    assert third["changed"] == {
        "catch_up": [job["catch_up"], policies["catch_up"]],
        "retry": [job["retry"], policies["retry"]],
        "timeout_ms": [300_000, 30_000],
        "at_most_once": [True, False],
    }
    assert third["payload_changed"] and not second["payload_changed"]
    target = ["--target", server.target]
    with pytest.raises(SystemExit) as both:
        main(["update", job_id, *target, "--at-most-once", "--idempotent"])
    assert both.value.code == 2 and "not allowed with" in capsys.readouterr().err
    # An interval: --fixed-delay alone keeps its period and start, and
    # --fixed-rate turns it off again; a cron part on it is refused.
    start = now_ms() + 3_600_000
    made = run(capsys, server, "submit", "--name", "interval", "--handler", "h",
               "--every", "90s", "--start", str(start))  # fmt: skip
    job_id = str(made["job_id"])
    delay = run(capsys, server, "update", job_id, "--fixed-delay")
    assert delay["schedule"] == {"every_ms": 90_000, "start_ms": start, "fixed_delay": True}
    rate = run(capsys, server, "update", job_id, "--fixed-rate", "--every", "2m")
    assert rate["schedule"] == {"every_ms": 120_000, "start_ms": start, "fixed_delay": False}
    assert main(["update", job_id, *target, "--tz", "Europe/Paris"]) == 2
    assert "tz" in capsys.readouterr().err
    # Another kind of schedule is made from the flags given.
    cron = run(capsys, server, "update", job_id, "--cron", "*/5 * * * *")
    assert cron["schedule"] == {"cron": "*/5 * * * *", "tz": "UTC", "dst_gap":
                                "fire_at_transition", "dst_fold": "first"}  # fmt: skip
