"""The tests' webhook receiver judges signatures as the reference library
does: a request signed as the spec says verifies, one changed on the way or
signed with another secret does not, and a rotation's two signatures verify
with either secret. The HTTP targets' tests trust its verdicts, so they are
pinned here against requests made over a real socket."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from testkit.webhook_receiver import Receiver, Reply, fetch_tally, rfc3339_ms
from wheel import webhooks

ROOT = Path(__file__).resolve().parents[1]


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def signed(keys: list[bytes], msg_id: str, body: bytes) -> dict[str, str]:
    headers = dict(webhooks.signed_headers(keys, msg_id, int(time.time()), body))
    headers["Wheel-Scheduled-For"] = "2026-12-06T12:00:00.125Z"
    return headers


def test_a_signed_request_verifies_and_a_changed_or_foreign_one_does_not() -> None:
    secret, other = webhooks.new_secret(), webhooks.new_secret()
    key, other_key = webhooks.parse_secret(secret), webhooks.parse_secret(other)
    body = b'{"fire": 3}'
    with Receiver([secret]) as rx:
        assert post(rx.url("/a"), body, signed([key], "f1", body))[0] == 200
        assert post(rx.url("/a"), body + b" ", signed([key], "f2", body))[0] == 200
        assert post(rx.url("/a"), body, signed([other_key], "f3", body))[0] == 200
        stale = dict(webhooks.signed_headers([key], "f4", int(time.time()) - 600, body))
        assert post(rx.url("/a"), body, stale)[0] == 200
        got = rx.wait_requests("/a", 4, 10)
    assert [(r.webhook_id, r.verified) for r in got] == [
        ("f1", True), ("f2", False), ("f3", False), ("f4", False),
    ]  # fmt: skip
    assert got[1].verify_error == "No matching signature found"
    assert got[3].verify_error == "Message timestamp too old"
    assert got[0].scheduled_for_ms == rfc3339_ms("2026-12-06T12:00:00.125Z") == 1796558400125
    assert (rx.tally.verified, rx.tally.bad_signatures) == (1, 3)
    assert rx.tally.records == [(3, 1796558400125, got[0].received_ms)]


def test_a_rotations_two_signatures_verify_with_either_secret() -> None:
    old, new = webhooks.new_secret(), webhooks.new_secret()
    keys = [webhooks.parse_secret(old), webhooks.parse_secret(new)]
    body = b"rotating"
    for secret in (old, new):
        with Receiver([secret]) as rx:
            post(rx.url("/r"), body, signed(keys, "r1", body))
            (r,) = rx.wait_requests("/r", 1, 10)
        assert r.verified and len(r.headers["webhook-signature"].split(" ")) == 2


def test_a_path_answers_as_scripted_then_200_and_a_hold_waits_for_release() -> None:
    secret = webhooks.new_secret()
    key = webhooks.parse_secret(secret)
    body = b"x"
    with Receiver([secret]) as rx:
        rx.script("/s", Reply(status=429, headers=(("Retry-After", "2"),)), Reply(status=503))
        status, headers, _ = post(rx.url("/s"), body, signed([key], "s", body))
        assert (status, headers["Retry-After"]) == (429, "2")
        assert post(rx.url("/s"), body, signed([key], "s", body))[0] == 503
        assert post(rx.url("/s"), body, signed([key], "s", body))[0] == 200
        # A second request under one id is a duplicate in the tally.
        assert rx.tally.duplicates == 2
        rx.script("/held", Reply(hold=True))
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            urllib.request.urlopen(
                urllib.request.Request(rx.url("/held"), data=body, method="POST"), timeout=0.5
            )
        assert len(rx.wait_requests("/held", 1, 5)) == 1 and time.monotonic() - t0 >= 0.5
        rx.release()
        assert post(rx.url("/held"), body, {})[0] == 200


@pytest.mark.parametrize("server", ["lean", "aiohttp"])
def test_as_a_process_it_prints_its_port_and_keeps_a_tally(tmp_path: Path, server: str) -> None:
    secret = webhooks.new_secret()
    key = webhooks.parse_secret(secret)
    (tmp_path / "s").write_text(secret)
    cmd = [sys.executable, "-m", "testkit.webhook_receiver", "--secret-file", str(tmp_path / "s")]
    with subprocess.Popen(
        [*cmd, "--server", server],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            port = int(proc.stdout.readline().split()[1])
            for i in (1, 2, 2):
                body = json.dumps({"fire": i}).encode()
                post(f"http://127.0.0.1:{port}/hook", body, signed([key], f"id{i}", body))
            post(f"http://127.0.0.1:{port}/hook", b"{}", {})
            tally = fetch_tally(port, records=True)
        finally:
            proc.terminate()
        assert proc.wait(10) == 0
    assert {k: tally[k] for k in ("requests", "verified", "bad_signatures", "duplicates")} == {
        "requests": 4, "verified": 3, "bad_signatures": 1, "duplicates": 1,
    }  # fmt: skip
    assert [r[0] for r in tally["records"]] == [1, 2, 2]


def test_the_lean_server_answers_requests_in_order_on_one_connection_and_refuses_chunks() -> None:
    secret = webhooks.new_secret()
    key = webhooks.parse_secret(secret)
    rx = Receiver([secret])

    def request(i: int) -> bytes:
        body = json.dumps({"fire": i}).encode()
        head = "".join(f"{k}: {v}\r\n" for k, v in signed([key], f"p{i}", body).items())
        return f"POST /p HTTP/1.1\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode() + body

    async def exchange() -> tuple[bytes, bytes]:
        server = await rx.serve_lean()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", rx.port)
            # Three requests in one write, the last split across two.
            data = request(1) + request(2) + request(3)
            writer.write(data[:-5])
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(data[-5:])
            answers = b""
            while answers.count(b"HTTP/1.1 200 OK") < 3:
                answers += await asyncio.wait_for(reader.read(65536), 5)
            writer.write(
                b"POST /p HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n"
            )
            refused = await asyncio.wait_for(reader.read(), 5)  # to its close
            writer.close()
            return answers, refused
        finally:
            server.close()

    answers, refused = asyncio.run(exchange())
    assert answers.count(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") == 3
    assert refused.startswith(b"HTTP/1.1 400 Bad Request") and b"Connection: close" in refused
    assert [fire for fire, _, _ in rx.tally.records] == [1, 2, 3]
    assert (rx.tally.verified, rx.tally.bad_signatures) == (3, 0)
    assert len(rx.tally.peers) == 1
