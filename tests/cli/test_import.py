"""``wheelctl import``: a line is the job ``wheelctl submit`` makes of the same
options; bad lines are reported with their number and reason and hold back no
other; and an import run again, after a node was killed in the middle of it
too, leaves each good line exactly one job. The imports run as ``wheelctl``
processes against ``wheelctl serve`` processes on SQLite."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from testkit.procs import ServerProc, wait_for
from wheel.cli import build_parser
from wheel.cli._common import submit_args
from wheel.cli.import_ import (
    LineParser,
    Report,
    batches,
    derived_key,
    progress_text,
    retryable,
)
from wheel.client import CatchUpMode, Client, Cron, JobRequest
from wheel.errors import AlreadyExists, InvalidArgument, ResourceExhausted, WheelError

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def _request(line: dict[str, Any], number: int = 1) -> JobRequest:
    return LineParser(now=NOW).request(number, json.dumps(line))


def _reason(text: str) -> str:
    """Why a line is refused."""
    with pytest.raises(WheelError) as info:
        LineParser(now=NOW).request(1, text)
    return str(info.value)


def _submit_request(*flags: str) -> JobRequest:
    """The request ``wheelctl submit FLAGS`` sends."""
    return JobRequest(**submit_args(build_parser().parse_args(["submit", *flags]), now=NOW))


# -- lines -> requests ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "flags"),
    [
        (
            {"name": "n", "handler": "h", "cron": "0 2 * * *", "tz": "Europe/Paris",
             "catch_up": "skip", "catch_up_window": "1h", "max_attempts": 3, "payload": "p",
             "key": "k1"},
            ["--name", "n", "--handler", "h", "--cron", "0 2 * * *", "--tz", "Europe/Paris",
             "--catch-up", "skip", "--catch-up-window", "1h", "--max-attempts", "3",
             "--payload", "p", "--key", "k1"],
        ),
        (
            {"name": "n", "handler": "h", "every": "30s", "start": 1893456000000,
             "fixed_delay": True, "jitter": "2s", "overlap": "allow", "max_concurrent": 2,
             "timeout": "1m", "at_most_once": True, "pool": "gpu", "tenant": "acme",
             "idempotency_key": "k2"},
            ["--name", "n", "--handler", "h", "--every", "30s", "--start", "1893456000000",
             "--fixed-delay", "--jitter", "2s", "--overlap", "allow", "--max-concurrent", "2",
             "--timeout", "1m", "--at-most-once", "--pool", "gpu", "--tenant", "acme",
             "--idempotency-key", "k2"],
        ),
        (
            {"name": "n", "handler": "h", "every": "1m", "concurrency_key": "db", "key": "k4"},
            ["--name", "n", "--handler", "h", "--every", "1m", "--concurrency-key", "db",
             "--key", "k4"],
        ),
        (
            {"name": "n", "handler": "h", "at": "+1h", "catch-up": "run_all", "catch_up_max": 7,
             "key": "k3"},
            ["--name", "n", "--handler", "h", "--at", "+1h", "--catch-up", "run_all",
             "--catch-up-max", "7", "--key", "k3"],
        ),
    ],
)  # fmt: skip
def test_a_line_is_the_request_wheelctl_submit_makes_of_the_same_options(
    line: dict[str, Any], flags: list[str]
) -> None:
    assert _request(line) == _submit_request(*flags)
    assert _request(line).concurrency_key == line.get("concurrency_key", "")


def test_a_line_without_a_key_gets_one_from_its_number_and_its_text() -> None:
    line = {"name": "n", "handler": "h", "every": "1h"}
    text = json.dumps(line)
    key = _request(line, number=7).idempotency_key
    assert key == derived_key(7, text)
    assert key is not None and key.startswith("import-7-")
    # The same line at the same number in another run: the same key.
    assert LineParser(now=datetime.now(UTC)).request(7, text).idempotency_key == key
    assert _request(line, number=8).idempotency_key != key
    assert _request({**line, "every": "2h"}, number=7).idempotency_key != key
    assert _request({**line, "idempotency_key": "mine"}).idempotency_key == "mine"
    # A payload may be any JSON value: sent as the client sends one (compact, keys sorted).
    assert _request({**line, "payload": {"b": 1, "a": [True]}}).payload == {"b": 1, "a": [True]}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "not JSON: Expecting property name enclosed in double quotes at column 2"),
        ('["a list"]', "not a JSON object but an array"),
        ('{"name": "n", "handler": "h", "every": "1h", "colour": "red"}',
         "colour: is not an option of wheelctl submit"),
        ('{"name": "n", "handler": "h", "every": "1h", "target": "10.0.0.1:1"}',
         "target: is not an option of wheelctl submit"),
        ('{"handler": "h", "every": "1h"}', "name: is required"),
        ('{"name": "n", "handler": "h", "every": "soon"}',
         "every: 'soon' is not a duration like 500ms, 5s, 2m, 1h"),
        ('{"name": "n", "handler": "h", "every": "1h", "max_attempts": "x"}',
         "max_attempts: 'x' is not a whole number"),
        ('{"name": "n", "handler": "h", "every": "1h", "overlap": "often"}',
         "overlap: 'often' is not one of skip, buffer_one, buffer_all, allow"),
        ('{"name": "n", "handler": "h", "every": "1h", "fixed_delay": "yes"}',
         "fixed_delay: expected true or false, got a string"),
        ('{"name": "n", "handler": "h", "every": "1h", "tz": "Europe/Paris"}',
         "tz: goes with cron= only, not with every="),
        ('{"name": "n", "handler": "h"}', "schedule: give exactly one of cron=, every= or at="),
        ('{"name": "n", "handler": "h", "every": "1h", "key": "a", "idempotency_key": "b"}',
         "idempotency_key: is the same option as key"),
        ('{"name": "n", "handler": "h", "every": "1h", "at_most_once": true, "idempotent": true}',
         "idempotent: give at_most_once or idempotent, not both"),
    ],
)  # fmt: skip
def test_a_bad_line_says_why(text: str, reason: str) -> None:
    assert _reason(text) == reason


def _report(err: io.StringIO | None = None) -> Report:
    return Report(source="f", total_bytes=None, err=err or io.StringIO(), tty=False, errors=None)


def test_batches_hold_at_most_so_many_lines_and_bytes_and_skip_blank_and_bad_lines() -> None:
    def line(i: int, pad: int = 0) -> str:
        return json.dumps({"name": f"n{i}", "handler": "h", "every": "1h", "payload": "x" * pad})

    stream = [line(i).encode() + b"\n" for i in range(1, 8)]
    stream[2] = b"  \n"  # line 3: blank
    stream[4] = b"{bad\n"  # line 5
    err = io.StringIO()
    report = _report(err)
    cut = list(batches(stream, LineParser(now=NOW), report, max_lines=2))
    assert [b.numbers for b in cut] == [(1, 2), (4, 6), (7,)]
    assert [r.name for b in cut for r in b.requests] == ["n1", "n2", "n4", "n6", "n7"]
    assert err.getvalue() == f"f:5: {_reason('{bad')}\n"
    assert (report.lines, report.failed) == (6, 1)

    big = [line(i, pad=400).encode() + b"\n" for i in range(1, 6)]
    cut = list(batches(big, LineParser(now=NOW), _report(), max_lines=100, max_bytes=1000))
    assert [b.numbers for b in cut] == [(1, 2), (3, 4), (5,)]
    assert all(b.size <= 1000 for b in cut)


def test_only_a_node_gone_or_slow_is_tried_again() -> None:
    assert retryable(WheelError("UNAVAILABLE: cannot connect to 127.0.0.1:1"))
    assert retryable(WheelError("DEADLINE_EXCEEDED: Deadline Exceeded"))
    assert not retryable(WheelError("INTERNAL: boom"))
    assert not retryable(InvalidArgument("spec.schedule.cron.expr", "UNAVAILABLE"))
    assert not retryable(ResourceExhausted("UNAVAILABLE: over quota"))
    assert not retryable(AlreadyExists("idempotency key 'k' was used with a different request"))


def test_progress_shows_the_share_of_the_file_settled_and_a_call_being_retried() -> None:
    text = progress_text(lines=5000, done=2000, failed=3, fraction=0.5, elapsed_s=2.0, bar=True)
    assert text.startswith("[" + "#" * 15 + "-" * 15 + "]  50%  5,000 lines read  2,000 in")
    assert "3 failed  1,000 jobs/s  eta 2s" in text
    early = progress_text(lines=10, done=0, failed=0, fraction=0.001, elapsed_s=1.0, bar=False)
    assert early.startswith("import: 0%") and early.endswith("eta -")
    retrying = progress_text(
        lines=10, done=0, failed=0, fraction=None, elapsed_s=1.0, bar=False,
        retrying="UNAVAILABLE: cannot connect",
    )  # fmt: skip
    assert retrying.endswith("retrying: UNAVAILABLE: cannot connect")


# -- against a node ---------------------------------------------------------------------


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ServerProc]:
    server = ServerProc(tmp_path / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _import_cmd(target: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "wheel", "import", "--target", target, "--json", *args]


def _import(target: str, *args: str, stdin: bytes | None = None) -> tuple[int, dict[str, Any], str]:
    """Run ``wheelctl import``: its exit status, summary and stderr."""
    done = subprocess.run(_import_cmd(target, *args), input=stdin, capture_output=True, timeout=120)
    stderr = done.stderr.decode()
    assert done.stdout, stderr
    return done.returncode, json.loads(done.stdout), stderr


def _jobs(target: str) -> list[Any]:
    with Client(target) as client:
        return list(client.jobs(page_size=1000))


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _good(i: int) -> str:
    if i % 3 == 0:
        return json.dumps({"name": f"job-{i}", "handler": "h", "cron": f"{i % 60} 2 * * *"})
    return json.dumps({"name": f"job-{i}", "handler": "h", "every": "1h", "payload": {"i": i}})


@pytest.mark.slow
def test_import_creates_the_good_lines_and_reports_each_bad_one_with_its_number(
    node: ServerProc, tmp_path: Path
) -> None:
    lines = [
        json.dumps({"name": "nightly", "handler": "report", "cron": "0 2 * * *",
                    "tz": "Europe/Paris", "catch_up": "skip", "max_attempts": 3,
                    "payload": {"report": "sales"}}),
        "",
        "{not json",
        json.dumps({"name": "poll", "handler": "h", "every": "30s", "fixed_delay": True}),
        json.dumps({"name": "bad-cron", "handler": "h", "cron": "every day"}),  # the node's no
        json.dumps({"name": "bad-zone", "handler": "h", "cron": "0 2 * * *", "tz": "Mars/Base"}),
        json.dumps({"name": "colour", "handler": "h", "every": "1h", "colour": "red"}),
        json.dumps({"name": "once", "handler": "h", "at": "2031-01-01T00:00:00Z",
                    "idempotency_key": "once-v1"}),
        json.dumps({"name": "soon", "handler": "h", "every": "soon"}),
        json.dumps(["not", "an", "object"]),
        json.dumps({"name": "last", "handler": "h", "every": "1h"}),
    ]  # fmt: skip
    path = _write(tmp_path / "jobs.jsonl", lines)
    errors = tmp_path / "errors.jsonl"
    code, summary, stderr = _import(node.target, str(path), "--errors", str(errors))
    assert code == 1
    assert summary["lines"] == 10 and summary["complete"] and summary["stopped"] is None
    assert (summary["created"], summary["existed"], summary["failed"]) == (4, 0, 6)
    reasons = {
        3: "not JSON: Expecting property name enclosed in double quotes at column 2",
        5: "spec.schedule.cron.expr: ",
        6: "spec.schedule.cron.time_zone: ",
        7: "colour: is not an option of wheelctl submit",
        9: "every: 'soon' is not a duration",
        10: "not a JSON object but an array",
    }
    reported = {
        int(line.split(":")[1]): line.split(": ", 1)[1]
        for line in stderr.splitlines()
        if line.startswith(f"{path}:")
    }
    assert reported.keys() == reasons.keys()
    for number, reason in reasons.items():
        assert reported[number].startswith(reason), reported[number]
    written = [json.loads(line) for line in errors.read_text().splitlines()]
    assert {e["line"]: e["error"] for e in written} == reported
    assert {e["line"]: e["text"] for e in written}[5] == lines[4]

    jobs = {job.name: job for job in _jobs(node.target)}
    assert sorted(jobs) == ["last", "nightly", "once", "poll"]
    nightly = jobs["nightly"]
    assert isinstance(nightly.schedule, Cron)
    assert (nightly.schedule.expr, nightly.schedule.tz) == ("0 2 * * *", "Europe/Paris")
    assert nightly.catch_up.mode is CatchUpMode.SKIP and nightly.retry.max_attempts == 3
    assert nightly.payload == b'{"report":"sales"}'


@pytest.mark.slow
def test_importing_the_same_lines_again_creates_nothing(node: ServerProc, tmp_path: Path) -> None:
    lines = [_good(i) for i in range(300)]
    lines[7] = json.dumps({"name": "job-7", "handler": "h", "every": "1h", "key": "seven"})
    path = _write(tmp_path / "jobs.jsonl", lines)
    code, first, _ = _import(node.target, str(path), "--batch", "100")
    assert code == 0
    assert (first["created"], first["existed"], first["failed"]) == (300, 0, 0)
    # Again, from stdin in other batches: the keys are the lines', not the run's.
    code, again, _ = _import(node.target, "-", "--batch", "64", stdin=path.read_bytes())
    assert code == 0, again
    assert (again["file"], again["lines"]) == ("<stdin>", 300)
    assert (again["created"], again["existed"], again["failed"]) == (0, 300, 0)
    names = [job.name for job in _jobs(node.target)]
    assert sorted(names) == sorted(f"job-{i}" for i in range(300))


def _big_file(path: Path, count: int) -> tuple[Path, set[str]]:
    """``count`` lines, every 500th bad (half of those by the node's checks),
    and the names of the good ones."""
    lines, good = [], set()
    for i in range(count):
        if i % 500 == 499:
            bad = {"name": f"job-{i}", "handler": "h", "cron": "not a cron"}
            lines.append(json.dumps(bad) if i % 1000 == 999 else "{oops")
        else:
            lines.append(_good(i))
            good.add(f"job-{i}")
    return _write(path, lines), good


def _held(target: str) -> int:
    with Client(target, timeout=10) as client:
        return client.status().jobs


def _assert_one_job_per_good_line(target: str, good: set[str]) -> None:
    names = [job.name for job in _jobs(target)]
    assert len(names) == len(set(names)), "a line became two jobs"
    assert set(names) == good


@pytest.mark.slow
def test_a_node_killed_mid_import_then_a_rerun_leaves_one_job_per_good_line(
    node: ServerProc, tmp_path: Path
) -> None:
    path, good = _big_file(tmp_path / "big.jsonl", 20_000)
    out = tmp_path / "first.out"
    with out.open("wb") as stdout, (tmp_path / "first.err").open("wb") as stderr:
        # Short deadlines: this import gives up soon after the node is gone;
        # small calls, one at a time: it is still going when the kill comes.
        args = ["--call-timeout", "2s", "--retry-for", "1s", "--batch", "500", "--parallel", "1"]
        first = subprocess.Popen(
            _import_cmd(node.target, str(path), *args),
            stdout=stdout,
            stderr=stderr,
        )
    try:

        def progressed() -> bool:
            assert first.poll() is None, "the import ended before the node was killed"
            return _held(node.target) >= 2_000

        wait_for(progressed, 60, "the import to make progress")
        node.stop(signal.SIGKILL)
        assert first.wait(60) == 1
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    summary = json.loads(out.read_text())
    assert summary["stopped"] and summary["stopped"].startswith("UNAVAILABLE")
    assert not summary["complete"]
    assert "Run the same import again" in (tmp_path / "first.err").read_text()
    held = summary["created"] + summary["existed"]
    assert held < len(good)

    node.start()  # the same data dir
    code, rerun, _ = _import(node.target, str(path))
    assert code == 1  # the bad lines
    assert rerun["complete"] and rerun["stopped"] is None and rerun["unsent"] == 0
    assert rerun["failed"] == 20_000 - len(good)
    assert rerun["created"] + rerun["existed"] == len(good)
    # What the node held before it was killed, and all the first run saw go in
    # (more if answers were lost with the node), was there already.
    assert rerun["existed"] >= max(held, 2_000)
    _assert_one_job_per_good_line(node.target, good)


@pytest.mark.slow
def test_an_import_waits_out_a_node_restart_and_creates_each_job_once(
    node: ServerProc, tmp_path: Path
) -> None:
    path, good = _big_file(tmp_path / "big.jsonl", 10_000)
    with (tmp_path / "import.err").open("wb") as stderr:
        running = subprocess.Popen(
            _import_cmd(node.target, str(path), "--call-timeout", "5s", "--retry-for", "60s"),
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    try:

        def progressed() -> bool:
            assert running.poll() is None, "the import ended before the node was killed"
            return _held(node.target) >= 1_000

        wait_for(progressed, 60, "the import to make progress")
        node.stop(signal.SIGKILL)
        node.start()
        stdout, _ = running.communicate(timeout=120)
    finally:
        if running.poll() is None:
            running.kill()
            running.wait()
    summary = json.loads(stdout)
    assert running.returncode == 1  # the bad lines
    assert summary["complete"] and summary["stopped"] is None and summary["unsent"] == 0
    assert summary["failed"] == 10_000 - len(good)
    assert summary["created"] + summary["existed"] == len(good)
    _assert_one_job_per_good_line(node.target, good)
