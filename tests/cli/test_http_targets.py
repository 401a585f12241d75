"""wheelctl and the Python client with HTTP targets against a real node over
gRPC: submit with the target's flags (no handler), ``job`` and ``jobs`` show
the target, ``update`` changes the parts given and moves a job between a
target and a handler, ``updates`` records the target's change, an import
line's ``http`` object is the request submit's flags make, and every
refusal names its flag or field."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from testkit.procs import ServerProc
from tests.rpc.test_api import InProcessServer
from wheel import http_targets
from wheel.cli import build_parser, main
from wheel.cli._common import submit_args
from wheel.cli.import_ import LineParser
from wheel.client import Client, HttpTarget, Job, JobRequest
from wheel.engine.spec import JobSpec
from wheel.errors import InvalidArgument, WheelError
from wheel.outbox import row_of

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    s = InProcessServer(tmp_path_factory.mktemp("cli-http")).start()
    try:
        # The signing secrets the targets below name.
        with Client(s.target) as client:
            for name in ("hooks", "s", "s1"):
                client.set_secret(name, generate=True)
        yield s
    finally:
        s.stop()


def run(capsys: pytest.CaptureFixture[str], server: InProcessServer, *argv: str) -> Any:
    """``wheelctl ARGV --target ... --json``'s answer, parsed."""
    assert main([*argv, "--target", server.target, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def fails(capsys: pytest.CaptureFixture[str], server: InProcessServer, *argv: str) -> str:
    """``wheelctl ARGV``'s error: it exits 2 and says why on stderr."""
    assert main([*argv, "--target", server.target]) == 2
    return capsys.readouterr().err


def test_submit_with_the_target_flags_and_read_the_target_back(
    server: InProcessServer, capsys: pytest.CaptureFixture[str]
) -> None:
    made = run(capsys, server, "submit", "--name", "ping", "--cron", "*/5 * * * *",
               "--http-url", "https://api.example.com/ping", "--http-method", "put",
               "--http-header", "X-Team: ops", "--http-header", "Authorization: Bearer t",
               "--payload-json", '{"check": "db"}', "--signing-secret", "hooks",
               "--http-timeout", "10s", "--http-retry-4xx")  # fmt: skip
    job = run(capsys, server, "job", str(made["job_id"]))
    assert job["handler"] == "http" and job["payload"] == '{"check": "db"}'
    assert job["http"] == {
        "url": "https://api.example.com/ping",
        "method": "PUT",
        "headers": {"X-Team": "ops", "Authorization": "Bearer t"},
        "timeout_ms": 10_000,
        "signing_secret": "hooks",
        "retry_4xx": True,
        "follow_redirects": False,
    }
    [listed] = [j for j in run(capsys, server, "jobs") if j["job_id"] == made["job_id"]]
    assert listed["http"] == job["http"]
    # Without --json: the target in the job's lines.
    assert main(["job", str(made["job_id"]), "--target", server.target]) == 0
    text = capsys.readouterr().out
    assert "  http        PUT https://api.example.com/ping" in text
    assert "timeout 10.00s, signed with secret hooks, 4xx retried" in text
    assert "X-Team: ops" in text
    # A handler's job has none.
    plain = run(capsys, server, "submit", "--name", "h", "--handler", "h", "--every", "1h")
    assert run(capsys, server, "job", str(plain["job_id"]))["http"] is None


def test_submit_refuses_a_handler_beside_a_target_and_target_flags_without_a_url(
    server: InProcessServer, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["submit", "--name", "x", "--every", "1h"]
    err = fails(capsys, server, *base, "--handler", "h", "--http-url", "https://a.example.com/")
    assert "handler: give --handler or --http-url, not both" in err
    assert "handler: is required" in fails(capsys, server, *base)
    assert "http_url: is required with --http-method" in fails(
        capsys, server, *base, "--http-method", "GET"
    )
    assert "spec.http.url" in fails(capsys, server, *base, "--http-url", "ftp://a.example.com/")
    assert "spec.http.headers[0].name" in fails(
        capsys, server, *base, "--http-url", "https://a.example.com/", "--http-header", "Host: x"
    )
    assert "http_header" in fails(
        capsys, server, *base, "--http-url", "https://a.example.com/", "--http-header", "nocolon"
    )
    # --handler http beside a target is the same as none.
    made = run(capsys, server, *base, "--handler", "http", "--http-url", "https://a.example.com/")
    assert run(capsys, server, "job", str(made["job_id"]))["handler"] == "http"


def test_update_changes_the_target_parts_given_and_moves_between_target_and_handler(
    server: InProcessServer, capsys: pytest.CaptureFixture[str]
) -> None:
    made = run(capsys, server, "submit", "--name", "hook", "--every", "1h", "--payload", "b1",
               "--http-url", "https://a.example.com/x", "--http-header", "X-A: 1",
               "--signing-secret", "s1")  # fmt: skip
    job_id = str(made["job_id"])
    job = run(capsys, server, "update", job_id, "--http-timeout", "5s", "--http-follow-redirects")
    t = job["http"]
    assert (t["url"], t["timeout_ms"], t["follow_redirects"]) == (
        "https://a.example.com/x",
        5000,
        True,
    )
    assert (t["headers"], t["signing_secret"], job["payload"]) == ({"X-A": "1"}, "s1", "b1")
    job = run(capsys, server, "update", job_id, "--http-header", "X-B: 2", "--payload", "b2",
              "--http-no-follow-redirects")  # fmt: skip
    assert job["http"]["headers"] == {"X-B": "2"} and not job["http"]["follow_redirects"]
    assert job["payload"] == "b2" and job["http"]["timeout_ms"] == 5000
    # Off the target onto a handler, and back.
    off = run(capsys, server, "update", job_id, "--handler", "send")
    assert (off["handler"], off["http"], off["payload"]) == ("send", None, "b2")
    on = run(capsys, server, "update", job_id, "--http-url", "https://b.example.com/")
    assert on["handler"] == "http" and on["http"]["url"] == "https://b.example.com/"
    assert on["http"]["timeout_ms"] == 30_000 and on["payload"] == "b2"
    # A job with no target needs --http-url for the other target flags.
    plain = run(capsys, server, "submit", "--name", "p", "--handler", "h", "--every", "1h")
    assert "http_url: is required" in fails(
        capsys, server, "update", str(plain["job_id"]), "--http-timeout", "5s"
    )
    # The record of updates shows the target's changes.
    updates = run(capsys, server, "updates", job_id)
    changed = [u["changed"] for u in reversed(updates)]
    assert changed[0]["http"][0]["timeout_ms"] == 30_000
    assert changed[0]["http"][1]["timeout_ms"] == 5000
    assert changed[2]["handler"] == ["http", "send"] and changed[2]["http"][1] is None
    assert (
        changed[3]["http"][0] is None and changed[3]["http"][1]["url"] == "https://b.example.com/"
    )
    assert [u["payload_changed"] for u in reversed(updates)] == [False, True, False, False]


def test_an_import_line_with_an_http_object_is_the_request_of_submits_flags() -> None:
    http = {
        "url": "https://a.example.com/",
        "method": "GET",
        "headers": {"X-A": "1", "X-B": "2"},
        "timeout": "10s",
        "signing_secret": "s",
        "retry_4xx": True,
        "follow_redirects": True,
    }
    line = {"name": "n", "cron": "0 2 * * *", "payload": "p", "key": "k", "http": http}  # fmt: skip
    flags = ["submit", "--name", "n", "--cron", "0 2 * * *", "--payload", "p", "--key", "k",
             "--http-url", "https://a.example.com/", "--http-method", "GET",
             "--http-header", "X-A: 1", "--http-header", "X-B: 2", "--http-timeout", "10s",
             "--signing-secret", "s", "--http-retry-4xx", "--http-follow-redirects"]  # fmt: skip
    from_line = LineParser(now=NOW).request(1, json.dumps(line))
    from_flags = JobRequest(**submit_args(build_parser().parse_args(flags), now=NOW))
    assert from_line == from_flags
    assert from_line.http is not None and from_line.http.headers == {"X-A": "1", "X-B": "2"}
    # The target's flags as keys work too; a header list as well.
    flat = {"name": "n", "cron": "0 2 * * *", "payload": "p", "key": "k",
            "http_url": "https://a.example.com/", "http_method": "GET",
            "http_header": ["X-A: 1", "X-B: 2"], "http_timeout": "10s", "signing_secret": "s",
            "http_retry_4xx": True, "http_follow_redirects": True}  # fmt: skip
    assert LineParser(now=NOW).request(1, json.dumps(flat)) == from_flags


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ({"name": "n", "every": "1h", "http": "https://a/"}, "http: expected an object"),
        ({"name": "n", "every": "1h", "http": {"uri": "x"}}, "http.uri: is not one of"),
        ({"name": "n", "every": "1h", "http": {"url": "https://a/"}, "http_url": "https://b/"},
         "is the same option as"),
        ({"name": "n", "every": "1h", "http": {"url": "https://a/", "headers": 5}}, "http_header"),
        ({"name": "n", "every": "1h"}, "handler: is required"),
    ],
)  # fmt: skip
def test_a_bad_http_line_says_why(line: dict[str, Any], reason: str) -> None:
    with pytest.raises(WheelError, match=reason):
        LineParser(now=NOW).request(1, json.dumps(line))


def test_wheelctl_import_submits_a_line_with_a_target(
    server: InProcessServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "jobs.jsonl"
    good = {"name": "imported-hook", "every": "1h", "payload": {"id": 7},
            "http": {"url": "https://a.example.com/in", "headers": {"X-A": "1"}}}  # fmt: skip
    bad = {"name": "imported-bad", "every": "1h", "http": {"url": "https://a.example.com/",
           "headers": {"Wheel-Fence": "9"}}}  # fmt: skip
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    assert main(["import", str(path), "--target", server.target, "--json"]) == 1
    out = capsys.readouterr()
    summary = json.loads(out.out)
    assert (summary["created"], summary["failed"]) == (1, 1)
    assert "spec.http.headers[0].name" in out.err
    [job] = [j for j in run(capsys, server, "jobs", "--name", "imported-hook")]
    assert job["http"]["url"] == "https://a.example.com/in" and job["payload"] == '{"id":7}'


def test_the_client_submits_updates_and_reads_targets(server: InProcessServer) -> None:
    with Client(server.target) as client:
        target = HttpTarget("https://c.example.com/", headers={"X-A": "1"}, timeout=5)
        job = client.submit(name="client-hook", every=timedelta(hours=1), http=target, payload=b"b")
        assert job.handler == "http" and job.payload == b"b"
        assert job.http == HttpTarget("https://c.example.com/", headers={"X-A": "1"}, timeout=5)
        assert client.get(job.job_id).http == job.http
        many = client.submit_many(
            [
                {"name": "m1", "every": timedelta(hours=1), "http": target},
                {"name": "m2", "every": timedelta(hours=1), "http": HttpTarget("ftp://x/")},
            ]
        )
        assert not isinstance(many[0], WheelError) and many[0].http == job.http
        # The lean answer of a bulk submit shows the target as the node keeps it.
        [short] = client.submit_many([{"name": "m3", "every": 3600, "http": target, "timeout": 2}])
        assert isinstance(short, Job) and short.http is not None
        assert short.http.timeout == timedelta(seconds=2) == client.get(short.job_id).http.timeout  # type: ignore[union-attr]
        assert isinstance(many[1], InvalidArgument) and many[1].field == "spec.http.url"
        moved = client.update(job.job_id, http=HttpTarget("https://d.example.com/", method="get"))
        assert moved.http is not None and moved.http.url == "https://d.example.com/"
        assert moved.http.method == "GET" and moved.payload == b"b"
        body = client.update(job.job_id, payload=b"b2")
        assert body.http == moved.http and body.payload == b"b2"
        # Taking the target away needs a handler to move the job to.
        with pytest.raises(InvalidArgument, match=r"spec\.handler"):
            client.update(job.job_id, http=None)
        off = client.update(job.job_id, http=None, handler="send")
        assert off.http is None and off.handler == "send" and off.payload == b"b2"
        history = list(client.job_updates(job.job_id))
        assert history[-1].after.http == moved.http and history[-1].before.http == job.http
    # The client refuses what it can tell is wrong before sending.
    with pytest.raises(InvalidArgument, match=r"handler: give handler= or http="):
        JobRequest(name="n", handler="h", every=60, http=target)
    with pytest.raises(InvalidArgument, match="handler: 'http' is reserved"):
        JobRequest(name="n", handler="http", every=60)
    with pytest.raises(InvalidArgument, match="handler: is required"):
        JobRequest(name="n", every=60)
    with pytest.raises(InvalidArgument, match=r"http\.headers"):
        HttpTarget("https://a/", headers=[("X-A",)])  # type: ignore[list-item]


def test_an_outbox_row_keeps_the_target_checked_and_normalised() -> None:
    tenant, _key, text, digest = row_of(
        {
            "name": "o",
            "every": 3600,
            "http": HttpTarget("https://o.example.com/", method="post"),
            "payload": "body",
            "timeout": 2,
        },
        now_ms=1,
    )
    spec = JobSpec.from_json(text)
    target = http_targets.target_of(spec)
    assert spec.handler == "http" and http_targets.body_of(spec) == b"body"
    assert target is not None and (target.method, target.timeout_ms) == ("POST", 2_000)
    assert tenant == "default" and len(digest) == 64
    with pytest.raises(InvalidArgument, match=r"spec\.http\.url"):
        row_of({"name": "o", "every": 3600, "http": HttpTarget("gopher://x/")}, now_ms=1)


@pytest.mark.slow
def test_wheelctl_processes_submit_a_target_to_a_serving_node_and_show_it(tmp_path: Path) -> None:
    node = ServerProc(tmp_path / "data")
    node.start()
    try:

        def wheelctl(*argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "wheel", *argv, "--target", node.target],
                capture_output=True,
                text=True,
                timeout=60,
            )

        made = wheelctl("submit", "--name", "proc-hook", "--every", "1h", "--payload", "hi",
                        "--http-url", "https://p.example.com/", "--http-header", "X-A: 1",
                        "--json")  # fmt: skip
        assert made.returncode == 0, made.stderr
        job_id = json.loads(made.stdout)["job_id"]
        shown = wheelctl("job", str(job_id), "--json")
        assert shown.returncode == 0, shown.stderr
        job = json.loads(shown.stdout)
        assert (job["handler"], job["payload"]) == ("http", "hi")
        assert job["http"]["url"] == "https://p.example.com/"
        assert job["http"]["headers"] == {"X-A": "1"}
        bad = wheelctl("submit", "--name", "x", "--every", "1h", "--http-url", "https://u:p@h/")
        assert bad.returncode == 2 and "spec.http.url: holds credentials" in bad.stderr
    finally:
        node.stop()
