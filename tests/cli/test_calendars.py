"""``wheelctl calendar`` and ``--skip-calendar`` against a real node over
gRPC: set, list, show and delete a calendar; submit, update, import and
preview with the calendars a job skips; ``job`` shows them; every refusal
names its field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.rpc.test_api import InProcessServer
from wheel.cli import main
from wheel.cli.import_ import LineParser


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    s = InProcessServer(tmp_path_factory.mktemp("cli-calendars")).start()
    try:
        yield s
    finally:
        s.stop()


def run(capsys: pytest.CaptureFixture[str], server: InProcessServer, *argv: str) -> Any:
    """``wheelctl ARGV --target ... --json``'s answer, parsed."""
    assert main([*argv, "--target", server.target, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def text(capsys: pytest.CaptureFixture[str], server: InProcessServer, *argv: str) -> str:
    assert main([*argv, "--target", server.target]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def fails(capsys: pytest.CaptureFixture[str], server: InProcessServer, *argv: str) -> str:
    assert main([*argv, "--target", server.target]) == 2
    return capsys.readouterr().err


def test_set_show_list_and_delete_a_calendar(
    server: InProcessServer, capsys: pytest.CaptureFixture[str]
) -> None:
    out = text(capsys, server, "calendar", "set", "holidays", "--tenant", "cli-a",
               "--date", "2030-12-25", "--date", "2030-12-24",
               "--range", "2030-12-30..2031-01-02", "--weekday", "sat,sun")  # fmt: skip
    assert out.startswith("set cli-a") and "v1" in out and "every sat,sun" in out
    shown = run(capsys, server, "calendar", "show", "holidays", "--tenant", "cli-a")
    assert shown["dates"] == ["2030-12-24", "2030-12-25"]
    assert shown["ranges"] == [{"from": "2030-12-30", "to": "2031-01-02"}]
    assert (shown["weekdays"], shown["version"]) == (["sat", "sun"], 1)
    lines = text(capsys, server, "calendar", "show", "holidays", "--tenant", "cli-a")
    assert "  ranges    2030-12-30..2031-01-02" in lines
    listed = run(capsys, server, "calendar", "list", "--tenant", "cli-a")
    assert [c["name"] for c in listed] == ["holidays"]
    assert "deleted holidays" in text(
        capsys, server, "calendar", "delete", "holidays", "--tenant", "cli-a"
    )
    assert main(["calendar", "delete", "holidays", "--tenant", "cli-a",
                 "--target", server.target]) == 1  # fmt: skip
    assert "no calendar 'holidays'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--date", "2030-02-30"], "calendar.dates[0]"),
        (["--range", "2030-01-02"], "range[0]"),
        (["--range", "2030-01-02..2030-01-01"], "calendar.ranges[0].to"),
        (["--weekday", "sat,someday"], "calendar.weekdays[1]"),
        ([], "calendar"),
    ],
)
def test_a_bad_calendar_is_refused_naming_its_field(
    server: InProcessServer, capsys: pytest.CaptureFixture[str], flags: list[str], field: str
) -> None:
    err = fails(capsys, server, "calendar", "set", "bad", *flags)
    assert field in err


def test_submit_update_and_show_the_calendars_a_job_skips(
    server: InProcessServer, capsys: pytest.CaptureFixture[str]
) -> None:
    text(capsys, server, "calendar", "set", "weekend", "--tenant", "cli-b", "--weekday", "sat,sun")
    text(capsys, server, "calendar", "set", "xmas", "--tenant", "cli-b", "--date", "2030-12-25")
    err = fails(capsys, server, "submit", "--name", "r", "--handler", "h", "--every", "1h",
                "--tenant", "cli-b", "--skip-calendar", "nope")  # fmt: skip
    assert "spec.skip_calendars[0]" in err and "nope" in err
    made = run(capsys, server, "submit", "--name", "r", "--handler", "h", "--every", "1h",
               "--tenant", "cli-b", "--skip-calendar", "weekend")  # fmt: skip
    job = run(capsys, server, "job", str(made["job_id"]))
    assert job["skip_calendars"] == ["weekend"]
    assert "  skips       weekend (calendars)" in text(capsys, server, "job", str(made["job_id"]))
    changed = run(capsys, server, "update", str(made["job_id"]),
                  "--skip-calendar", "weekend", "--skip-calendar", "xmas")  # fmt: skip
    assert changed["skip_calendars"] == ["weekend", "xmas"]
    cleared = run(capsys, server, "update", str(made["job_id"]), "--skip-calendar", "")
    assert cleared["skip_calendars"] == []


def test_an_import_line_names_its_calendars() -> None:
    parser = LineParser(datetime(2030, 1, 1, tzinfo=UTC))
    one = parser.request(1, '{"name": "a", "handler": "h", "every": "1h", "skip_calendars": "x"}')
    two = parser.request(
        2, '{"name": "b", "handler": "h", "every": "1h", "skip_calendar": ["x", "y"]}'
    )
    assert (list(one.skip_calendars), list(two.skip_calendars)) == (["x"], ["x", "y"])


def test_preview_skips_a_calendar_s_days(
    server: InProcessServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text(capsys, server, "calendar", "set", "xmas", "--date", "2030-12-25")
    fires = run(capsys, server, "preview", "--cron", "0 9 * * *", "--from", "2030-12-24T00:00Z",
                "--count", "3", "--skip-calendar", "xmas")  # fmt: skip
    days = [f["utc"][:10] for f in fires]
    assert days == ["2030-12-24", "2030-12-26", "2030-12-27"]
