"""``--priority`` in wheelctl: submit, update, job (text and --json), an
import line's key, a bad value refused naming the flag, and ``serve
--priority-aging`` reaching the owner's configuration."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.rpc.test_api import InProcessServer
from wheel.cli import build_parser, main
from wheel.cli.import_ import LineParser
from wheel.cli.serve import serve_config
from wheel.errors import InvalidArgument


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    s = InProcessServer(tmp_path_factory.mktemp("cli-priority")).start()
    try:
        yield s
    finally:
        s.stop()


def run(capsys: pytest.CaptureFixture[str], server: InProcessServer, *argv: str) -> Any:
    assert main([*argv, "--target", server.target, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_submit_update_and_job_carry_the_priority(
    server: InProcessServer, capsys: pytest.CaptureFixture[str]
) -> None:
    made = run(capsys, server, "submit", "--name", "p", "--handler", "h", "--every", "1m",
               "--priority", "0")  # fmt: skip
    job_id = str(made["job_id"])
    assert run(capsys, server, "job", job_id)["priority"] == 0
    updated = run(capsys, server, "update", job_id, "--priority", "8")
    assert updated["priority"] == 8 and updated["name"] == "p"
    [change] = run(capsys, server, "updates", job_id)
    assert change["changed"] == {"priority": [0, 8]}
    assert main(["job", job_id, "--target", server.target]) == 0
    assert "  priority    8" in capsys.readouterr().out.splitlines()
    plain = run(capsys, server, "submit", "--name", "q", "--handler", "h", "--every", "1m")
    assert run(capsys, server, "job", str(plain["job_id"]))["priority"] == 5


@pytest.mark.parametrize("bad", ["10", "-1", "high"])
def test_a_bad_priority_is_refused_naming_the_flag(
    server: InProcessServer, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    argv = ["submit", "--name", "p", "--handler", "h", "--every", "1m", "--priority", bad]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--target", server.target])
    assert exit_.value.code == 2
    assert "--priority" in capsys.readouterr().err


def test_an_import_line_takes_a_priority_and_refuses_a_bad_one() -> None:
    parser = LineParser(now=datetime(2030, 1, 1, tzinfo=UTC))
    line = {"name": "i", "handler": "h", "every": "1m", "priority": 1}
    assert parser.request(1, json.dumps(line)).priority == 1
    with pytest.raises(InvalidArgument, match="priority"):
        parser.request(2, json.dumps({**line, "priority": 11}))


def test_serve_priority_aging_reaches_the_owner(tmp_path: Path) -> None:
    def config(*flags: str) -> Any:
        ns = build_parser().parse_args(["serve", "--data-dir", str(tmp_path), *flags])
        return serve_config(ns, tmp_path)

    assert config().owner.priority_aging_ms == 10_000
    assert config("--priority-aging", "2s").owner.priority_aging_ms == 2_000
    assert config("--priority-aging", "0").owner.priority_aging_ms == 0
