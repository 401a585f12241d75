"""``wheelctl submit`` argv and ``wheelctl import`` lines, generated valid and
malformed, through ``wheel.cli.main`` against a real node (in-process, real
gRPC): every run ends with exit 0, or with 1 or 2 and a message saying what
was wrong; never a traceback; and the node keeps serving."""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.rpc.test_api import Api, InProcessServer, connect
from tests.strategies import CRON_EXPRS, ZONES
from wheel.cli import main
from wheel.rpc.v1 import job_service_pb2

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

WHENS = [
    "+5s", "+0s", "+-5s", "+1h", "+5", "1700000000000", "0", "99999999999999999999",
    "2026-12-06T07:00:00", "2026-12-06T07:00:00+09:00", "2026-12-06T07:00:00Z", "2026-13-01",
    "9999-12-31T23:59:59", "garbage", "", " ", "+1e3s", "-5s", "+99999999999d",
]  # fmt: skip
DURATIONS = [
    "30s", "1ms", "0s", "0ms", "-5s", "5", "1.5m", "abc", "1000000d", "99999999999999d", "",
    "1h", "0.0001ms", "250ms", "1e3s", " 5s ",
]  # fmt: skip
COUNTS = ["0", "1", "-1", "5", "100", "101", "abc", "1.5", "99999999999999999999", ""]


# Each flag of ``wheelctl submit`` with values at and past its edges.
FLAGS: dict[str, list[str]] = {
    "--name": ["job", "", "n" * 200, "n" * 201, "ünï 🙂"],
    "--handler": ["h", "", "send_report"],
    "--at": WHENS,
    "--cron": CRON_EXPRS,
    "--tz": ZONES,
    "--every": DURATIONS,
    "--start": WHENS,
    "--jitter": DURATIONS,
    "--timeout": DURATIONS,
    "--max-attempts": COUNTS,
    "--catch-up": ["skip", "run_all", "run_latest_only", "bogus"],
    "--catch-up-window": DURATIONS,
    "--catch-up-max": COUNTS,
    "--overlap": ["skip", "allow", "buffer_one", "buffer_all", "x"],
    "--max-concurrent": COUNTS,
    "--payload": ["", "{not json", '{"a": 1}', "x" * 300],
    "--key": ["", "k1", "k" * 200, "k" * 201],
    "--tenant": ["default", "", "t1"],
    "--pool": ["default", "", "gpu"],
    "--dst-gap": ["skip", "fire_at_transition", "x"],
    "--dst-fold": ["first", "both", "x"],
}
SWITCHES = ["--fixed-delay", "--fixed-rate", "--at-most-once", "--idempotent"]


@st.composite
def submit_argv(draw: st.DrawFn) -> list[str]:
    """A valid submit, then a few flags at or past their edges (the last of
    a flag given twice wins), a switch and its opposite, a flag too many."""
    schedule = draw(
        st.sampled_from(
            [["--at", "+5s"], ["--cron", "*/5 * * * *", "--tz", "Asia/Tokyo"], ["--every", "30s"]]
        )
    )
    argv = ["submit", "--name", "job", "--handler", "h", *schedule]
    for flag in draw(st.lists(st.sampled_from(sorted(FLAGS)), max_size=3)):
        argv += [flag, draw(st.sampled_from(FLAGS[flag]))]
    argv += draw(st.lists(st.sampled_from(SWITCHES), max_size=2, unique=True))
    if draw(st.integers(0, 9)) == 0:
        argv.append(draw(st.sampled_from(["--bogus", "--every", "-x", "--name"])))
    return argv


JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, 1, -1, 5, 101, 2**63, -(2**63) - 1, 1.5, 1e300]),
    st.sampled_from(["", "x", "+5s", "30s", "* * * * *", "UTC", "skip", "-5s"]),
    st.sampled_from(WHENS + DURATIONS + CRON_EXPRS),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
KEYS = [
    "name", "handler", "at", "cron", "tz", "every", "start", "jitter", "timeout",
    "max_attempts", "max-attempts", "catch_up", "catch_up_window", "catch_up_max", "overlap",
    "max_concurrent", "payload", "key", "idempotency_key", "tenant", "pool", "fixed_delay",
    "fixed_rate", "at_most_once", "idempotent", "dst_gap", "dst_fold", "bogus",
]  # fmt: skip


@st.composite
def import_lines(draw: st.DrawFn) -> list[str]:
    lines = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["object", "object", "object", "not-json", "blank", "list"]))
        if kind == "not-json":
            lines.append(draw(st.sampled_from(["{", "nope", '{"name": }', "\x00"])))
        elif kind == "blank":
            lines.append("")
        elif kind == "list":
            lines.append(json.dumps([1, 2]))
        else:
            line: dict[str, Any] = {"name": "imp", "handler": "h", "every": "1m"}
            for key in draw(st.lists(st.sampled_from(KEYS), max_size=4)):
                line[key] = draw(JSON_VALUES)
            lines.append(json.dumps(line))
    return lines


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    server = InProcessServer(tmp_path_factory.mktemp("cli-property")).start()
    try:
        with connect(server) as api:
            yield api
    finally:
        server.stop()


def run(argv: list[str]) -> tuple[int, str, str]:
    """``wheelctl ARGV`` in this process: its exit code, stdout and stderr. An
    exception other than argparse's exit escapes: a traceback fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: usage errors exit 2
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def assert_serving(api: Api) -> None:
    api.jobs.ListJobs(job_service_pb2.ListJobsRequest(page_size=1), timeout=10)


@PROPERTY
@given(argv=submit_argv())
def test_submit_exits_cleanly_whatever_the_flags(node: Api, argv: list[str]) -> None:
    code, out, err = run([*argv, "--target", f"127.0.0.1:{node.server.port}", "--json"])
    event(f"exit {code}")
    assert "Traceback" not in err + out
    if code == 0:
        job_id = json.loads(out)["job_id"]
        got = node.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=job_id), timeout=10)
        assert got.job_id == job_id
    else:
        assert code == 2, (code, err)
        assert err.strip(), "a refusal says why"
        assert err.startswith(("usage:", "wheelctl: ")) or "error:" in err, err
        assert "INTERNAL" not in err and "UNKNOWN" not in err, err
    assert_serving(node)


@PROPERTY
@given(lines=import_lines())
def test_import_exits_cleanly_whatever_the_lines(node: Api, lines: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "jobs.jsonl"
        path.write_text("\n".join(lines) + "\n")
        code, out, err = run(
            ["import", str(path), "--target", f"127.0.0.1:{node.server.port}", "--json"]
        )
    event(f"exit {code}")
    assert "Traceback" not in err + out
    assert code in (0, 1), (code, err)
    summary = json.loads(out.strip().splitlines()[-1])
    if code == 1:
        assert err.strip(), "a failed line is reported"
        assert "INTERNAL" not in err and "UNKNOWN" not in err, err
    assert summary
    assert_serving(node)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--jitter", "99999999999999d"], "wheelctl: jitter: '99999999999999d' is too long"),
        (["--at", "99999999999999999999"], "wheelctl: at: '99999999999999999999' epoch ms is"),
        (["--catch-up-max", "99999999999999999999"], "wheelctl: catch_up.max_count: 9999"),
        (["--max-concurrent", "2147483648"], "wheelctl: overlap.max_concurrent: 2147483648 is"),
    ],
)
def test_a_value_too_big_for_a_date_or_the_wire_is_refused_naming_its_flag(
    node: Api, flags: list[str], message: str
) -> None:
    """Found by the property above: an OverflowError (a duration past
    timedelta's range, epoch milliseconds past the year 9999) and a
    ValueError (a count past the wire's int32) ended ``wheelctl submit``
    with a traceback."""
    target = f"127.0.0.1:{node.server.port}"
    argv = ["submit", "--name", "big", "--handler", "h", "--every", "1m", *flags]
    code, out, err = run([*argv, "--target", target])
    assert (code, out) == (2, "")
    assert err.startswith(message), err
    assert "Traceback" not in err


IDS = ["1", "0", "-1", "9223372036854775807", "9223372036854775808", "99999999999999999999", "x"]


@st.composite
def job_argv(draw: st.DrawFn) -> list[str]:
    """A command about one job, its id at and past the wire's edges."""
    job = draw(st.sampled_from(IDS))
    return draw(
        st.sampled_from(
            [
                ["runs", job], ["cancel", job], ["pause", job], ["resume", job],
                ["trigger", job], ["updates", job], ["update", job, "--every", "1m"],
                ["backfill", job, "--from", "0", "--to", "1000"],
                ["preview", "--job", job],
                ["preview", "--cron", "* * * * *", "--count", job],
                ["alerts", "--limit", job], ["inflight", "--limit", job],
            ]
        )
    )  # fmt: skip


@PROPERTY
@given(argv=job_argv())
def test_job_commands_exit_cleanly_whatever_the_id(node: Api, argv: list[str]) -> None:
    code, out, err = run([*argv, "--target", f"127.0.0.1:{node.server.port}"])
    event(f"exit {code}")
    assert "Traceback" not in err + out
    assert code in (0, 2), (code, err)
    if code == 2:
        assert err.startswith(("usage:", "wheelctl: ")) or "error:" in err, err
    assert_serving(node)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cancel", "99999999999999999999"], "wheelctl: job_id: 99999999999999999999 is outside"),
        (["runs", "9223372036854775808"], "wheelctl: job_id: 9223372036854775808 is outside"),
        (["alerts", "--limit", "2147483648"], "wheelctl: limit: 2147483648 is outside"),
        (["inflight", "--limit", "2147483648"], "wheelctl: limit: 2147483648 is outside"),
    ],
)
def test_an_id_or_limit_past_the_wire_is_refused_naming_it(
    node: Api, argv: list[str], message: str
) -> None:
    """Found by the property above: protobuf's ValueError ("Value out of
    range") ended these commands with a traceback."""
    code, out, err = run([*argv, "--target", f"127.0.0.1:{node.server.port}"])
    assert (code, out) == (2, "")
    assert err.startswith(message), err
