"""``wheelctl``'s flags: help on every one, errors in the CLI's own words
with the command's own usage, payloads from files and checked JSON, the
retry backoff, and one rule for a time given without a zone."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tests.rpc.test_api import InProcessServer
from wheel.cli import build_parser, main
from wheel.cli._common import MAX_PAYLOAD_BYTES
from wheel.client import Client
from wheel.engine.spec import DEFAULT_LIMITS


def _options(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
    """Every option and argument of every (sub)command under ``parser``,
    with its command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield path, action


def test_every_flag_and_argument_of_every_command_has_help() -> None:
    options = list(_options(build_parser(), "wheelctl"))
    assert len(options) > 200
    assert "wheelctl dlq redrive" in {path for path, _ in options}  # the walk went all the way
    bare = [
        f"{path} {'/'.join(a.option_strings) or a.dest}"
        for path, a in options
        if not a.help or a.help == argparse.SUPPRESS
    ]
    assert bare == []


def test_every_flag_taking_a_time_says_how_a_time_without_a_zone_is_read() -> None:
    times = {"--at", "--start", "--from", "--to", "--active-from", "--active-until"}
    for path, action in _options(build_parser(), "wheelctl"):
        if times & set(action.option_strings):
            assert "without a zone" in (action.help or ""), (path, action.option_strings)


def _fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The error output of ``wheelctl ARGV``, which must fail as a usage error."""
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    assert exit_.value.code == 2
    return capsys.readouterr().err


SUBMIT = ["submit", "--target", "127.0.0.1:1", "--name", "n", "--handler", "h"]


@pytest.mark.parametrize("every", [["--every", "-5s"], ["--every=-5s"]])
def test_a_negative_period_is_refused_as_not_positive(
    capsys: pytest.CaptureFixture[str], every: list[str]
) -> None:
    assert main([*SUBMIT, *every]) == 2
    err = capsys.readouterr().err
    assert "expected one argument" not in err
    assert "every: '-5s' is negative: give a positive duration" in err


def test_an_unknown_flag_shows_the_commands_own_usage(capsys: pytest.CaptureFixture[str]) -> None:
    err = _fails(capsys, *SUBMIT, "--every", "5s", "--bogus")
    assert err.startswith("usage: wheelctl submit ")
    assert "wheelctl submit: error: unrecognized arguments: --bogus" in err
    assert "{serve,worker" not in err  # not the list of every command
    nested = _fails(capsys, "dlq", "list", "--bogus")
    assert nested.startswith("usage: wheelctl dlq list ")
    assert "wheelctl dlq list: error: unrecognized arguments: --bogus" in nested


@pytest.mark.parametrize("flag", ["--max-attempts", "--max-concurrent"])
def test_a_count_below_one_is_refused_in_the_clis_words(
    capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    err = _fails(capsys, *SUBMIT, "--every", "5s", flag, "0")
    assert f"argument {flag}: must be >= 1, got 0" in err
    assert "Retry" not in err


def test_a_backoff_multiplier_is_checked_by_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    err = _fails(capsys, *SUBMIT, "--every", "5s", "--backoff-multiplier", "0.5")
    assert "argument --backoff-multiplier: must be between 1 and 100, got 0.5" in err


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    s = InProcessServer(tmp_path_factory.mktemp("cli-flags")).start()
    try:
        yield s
    finally:
        s.stop()


def run(capsys: pytest.CaptureFixture[str], server: InProcessServer, *argv: str) -> Any:
    assert main([*argv, "--target", server.target, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def refused(capsys: pytest.CaptureFixture[str], server: InProcessServer, *argv: str) -> str:
    assert main([*argv, "--target", server.target]) == 2
    return capsys.readouterr().err


def payload_of(server: InProcessServer, job_id: int) -> bytes:
    with Client(server.target) as client:
        return client.get(job_id).payload


def test_the_cli_states_the_nodes_own_payload_limit() -> None:
    assert MAX_PAYLOAD_BYTES == DEFAULT_LIMITS.max_payload_bytes == 256 * 1024


def test_payload_json_is_checked_and_payloads_come_from_files(
    server: InProcessServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    every = ["submit", "--name", "p", "--handler", "h", "--every", "1h"]
    err = refused(capsys, server, *every, "--payload-json", "{not json")
    assert "payload_json: is not valid JSON" in err
    made = run(capsys, server, *every, "--payload-json", '{"id": 7}')
    assert payload_of(server, made["job_id"]) == b'{"id": 7}'
    # --payload is any text, JSON or not.
    made = run(capsys, server, *every, "--payload", "{not json")
    assert payload_of(server, made["job_id"]) == b"{not json"
    both = refused(capsys, server, *every, "--payload", "x", "--payload-json", "1")
    assert "give --payload or --payload-json, not both" in both
    # @PATH: from a file; a JSON file checked as such.
    doc = tmp_path / "doc.json"
    doc.write_text('{"rows": [1, 2, 3]}\n')
    made = run(capsys, server, *every, "--payload-json", f"@{doc}")
    assert payload_of(server, made["job_id"]) == doc.read_bytes()
    missing = refused(capsys, server, *every, "--payload", f"@{tmp_path / 'nope'}")
    assert "payload: cannot read" in missing and "No such file" in missing
    # Over the node's limit: refused before it is sent, saying the limit.
    huge = tmp_path / "huge.bin"
    huge.write_bytes(b"x" * (MAX_PAYLOAD_BYTES + 1))
    over = refused(capsys, server, *every, "--payload", f"@{huge}")
    assert f"payload: {MAX_PAYLOAD_BYTES + 1} bytes is over the limit of 262144 bytes" in over
    # The same on update.
    updated = run(capsys, server, "update", str(made["job_id"]), "--payload-json", "[1]")
    assert updated["payload"] == "[1]"
    bad = refused(capsys, server, "update", str(made["job_id"]), "--payload-json", "[1")
    assert "payload_json: is not valid JSON" in bad


@pytest.mark.slow
def test_a_200_kb_payload_goes_through_a_file_or_stdin(
    server: InProcessServer, tmp_path: Path
) -> None:
    """Too long for a command line (``Argument list too long``), not for a
    file or a pipe."""
    text = b"y" * 200_000
    big = tmp_path / "big.txt"
    big.write_bytes(text)
    cmd = [sys.executable, "-m", "wheel", "submit", "--target", server.target, "--name", "big",
           "--handler", "h", "--every", "1h", "--json", "--payload"]  # fmt: skip
    from_file = subprocess.run([*cmd, f"@{big}"], capture_output=True, timeout=60, check=True)
    from_stdin = subprocess.run([*cmd, "@-"], input=text, capture_output=True, timeout=60)
    assert from_stdin.returncode == 0, from_stdin.stderr
    for proc in (from_file, from_stdin):
        assert payload_of(server, json.loads(proc.stdout)["job_id"]) == text


def test_the_retry_backoff_has_flags_on_submit_update_and_import(
    server: InProcessServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    made = run(capsys, server, "submit", "--name", "b", "--handler", "h", "--every", "1h",
               "--max-attempts", "4", "--initial-backoff", "2s", "--max-backoff", "1m",
               "--backoff-multiplier", "3")  # fmt: skip
    [job] = [j for j in run(capsys, server, "jobs") if j["job_id"] == made["job_id"]]
    assert job["retry"] == {"max_attempts": 4, "initial_backoff_ms": 2000,
                            "max_backoff_ms": 60_000, "multiplier": 3.0}  # fmt: skip
    # An update's retry flags replace the policy, the parts not given at
    # submit's defaults (as a catch-up or overlap flag does).
    updated = run(capsys, server, "update", str(made["job_id"]), "--max-backoff", "10m")
    assert updated["retry"] == {"max_attempts": 5, "initial_backoff_ms": 1000,
                                "max_backoff_ms": 600_000, "multiplier": 2.0}  # fmt: skip
    lines = tmp_path / "jobs.jsonl"
    line = {"name": "imp", "handler": "h", "every": "1h", "initial_backoff": "500ms",
            "backoff_multiplier": 1.5, "payload_json": '{"ok": true}'}  # fmt: skip
    bad = {"name": "imp2", "handler": "h", "every": "1h", "payload_json": "{nope"}
    lines.write_text(f"{json.dumps(line)}\n{json.dumps(bad)}\n")
    assert main(["import", str(lines), "--target", server.target]) != 0
    err = capsys.readouterr()
    assert f"{lines}:2: payload_json: is not valid JSON" in err.err
    [imported] = [j for j in run(capsys, server, "jobs") if j["name"] == "imp"]
    assert imported["retry"]["initial_backoff_ms"] == 500
    assert imported["retry"]["multiplier"] == 1.5 and imported["payload"] == '{"ok": true}'


def test_a_time_without_a_zone_is_utc_or_the_jobs_zone(
    server: InProcessServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """No job yet (submit): UTC. A job (update, backfill, preview --job): its
    zone. The same text, read by each command by that one rule."""
    day = (datetime.now(UTC) + timedelta(days=3)).date().isoformat()
    once = run(capsys, server, "submit", "--name", "z", "--handler", "h", "--at", f"{day}T09:00")
    utc_nine = datetime.fromisoformat(f"{day}T09:00").replace(tzinfo=UTC)
    [job] = [j for j in run(capsys, server, "jobs") if j["job_id"] == once["job_id"]]
    assert job["schedule"]["at_ms"] == int(utc_nine.timestamp() * 1000)
    tokyo = run(capsys, server, "submit", "--name", "t", "--handler", "h",
                "--cron", "0 2 * * *", "--tz", "Asia/Tokyo")  # fmt: skip
    moved = run(capsys, server, "update", str(tokyo["job_id"]), "--at", f"{day}T09:00")
    tokyo_nine = datetime.fromisoformat(f"{day}T09:00").replace(tzinfo=ZoneInfo("Asia/Tokyo"))
    assert moved["schedule"]["at_ms"] == int(tokyo_nine.timestamp() * 1000)


def test_bounds_flags_read_a_zoneless_date_in_a_crons_zone_and_clear_with_none(
    server: InProcessServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    day = (datetime.now(UTC) + timedelta(days=3)).date().isoformat()
    tokyo = run(capsys, server, "submit", "--name", "b", "--handler", "h", "--cron", "0 2 * * *",
                "--tz", "Asia/Tokyo", "--active-until", day, "--max-fires", "2")  # fmt: skip
    jobs = {j["job_id"]: j for j in run(capsys, server, "jobs")}
    midnight = datetime.fromisoformat(day).replace(tzinfo=ZoneInfo("Asia/Tokyo"))
    tokyo = jobs[tokyo["job_id"]]
    assert tokyo["active_until_ms"] == int(midnight.timestamp() * 1000)
    assert tokyo["max_fires"] == 2
    every = run(capsys, server, "submit", "--name", "e", "--handler", "h", "--every", "1h",
                "--active-from", f"{day}T06:00")  # fmt: skip
    six = datetime.fromisoformat(f"{day}T06:00").replace(tzinfo=UTC)
    every = {j["job_id"]: j for j in run(capsys, server, "jobs")}[every["job_id"]]
    assert every["active_from_ms"] == int(six.timestamp() * 1000)
    assert every["schedule"]["start_ms"] == every["active_from_ms"]  # starts with its range
    cleared = run(capsys, server, "update", str(tokyo["job_id"]), "--active-until", "none",
                  "--max-fires", "0")  # fmt: skip
    assert (cleared["active_until_ms"], cleared["max_fires"]) == (0, 0)
    lines = tmp_path / "bounded.jsonl"
    lines.write_text(
        json.dumps({"name": "imp-b", "handler": "h", "every": "1m", "max_fires": 4}) + "\n"
    )
    assert main(["import", str(lines), "--target", server.target]) == 0, capsys.readouterr().err
    capsys.readouterr()
    [imported] = [j for j in run(capsys, server, "jobs") if j["name"] == "imp-b"]
    assert imported["max_fires"] == 4
    err = refused(capsys, server, "submit", "--name", "o", "--handler", "h", "--at", "+1h",
                  "--max-fires", "3")  # fmt: skip
    assert "spec.max_fires" in err
    fires = run(capsys, server, "preview", "--every", "1h", "--start", f"{day}T00:00",
                "--active-from", f"{day}T05:30", "--max-fires", "3")  # fmt: skip
    hours = [datetime.fromisoformat(f"{day}T0{h}:00").replace(tzinfo=UTC) for h in (6, 7, 8)]
    assert [f["fire_ms"] for f in fires] == [int(t.timestamp() * 1000) for t in hours]
    shown = main(["job", str(every["job_id"]), "--target", server.target])
    assert shown == 0 and "bounds      from" in capsys.readouterr().out
