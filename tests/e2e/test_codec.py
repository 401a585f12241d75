"""Encrypted payloads end to end (``wheel.codec``): ``wheelctl submit
--codec-key-file`` encrypts in the submitting process, a real node keeps
and hands out only ciphertext, and a ``wheelctl worker --codec-key-file``
process gives its handler the plaintext. Every place the node writes is
searched for the plaintext: the SQLite files, the checkpoint, the node's
log and the console's JSON. A worker without the payload's key fails the
run with an error naming the key, and keeps running others."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.procs import ServerProc, WorkerProc, runs_of, wait_for, wheelctl
from testkit.services import free_port
from wheel.codec import AesGcmCodec, describe

pytestmark = pytest.mark.slow

PLAINTEXT = "card-4111-1111-1111-1111-the-plaintext"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ServerProc]:
    console = free_port()
    server = ServerProc(tmp_path / "data", args=("--http-listen", f"127.0.0.1:{console}"))
    server.console = console  # type: ignore[attr-defined]
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _submit(target: str, name: str, payload: str, key_file: Path) -> int:
    out = wheelctl(
        "submit", "--target", target, "--name", name, "--handler", "record_payload",
        "--at", "+0s", "--payload", payload, "--max-attempts", "2",
        "--initial-backoff", "100ms", "--codec-key-file", str(key_file), "--json",
    ).stdout  # fmt: skip
    return int(json.loads(out)["job_id"])


def _payloads(out: Path) -> dict[int, str]:
    path = Path(str(out) + ".payloads")
    if not path.exists():
        return {}
    return {d["job"]: d["payload"] for d in map(json.loads, path.read_text().splitlines())}


def _ended(target: str, job_id: int) -> list[dict[str, Any]]:
    return [r for r in runs_of(target, job_id) if r["state"] not in ("dispatched", "running")]


def test_the_node_keeps_only_ciphertext_and_the_handler_gets_the_plaintext(
    node: ServerProc, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.json"
    assert wheelctl("codec", "new-key", str(keys)).returncode == 0
    other = tmp_path / "other-keys.json"
    wheelctl("codec", "new-key", str(other), "--id", "elsewhere")
    out = tmp_path / "runs.txt"
    worker = WorkerProc(
        node.target, out, "w-codec", "e2e_handlers:record_payload",
        flags=("--codec-key-file", str(keys)),
    )  # fmt: skip
    try:
        wait_for(worker.connected, 30, "the worker to connect")
        job = _submit(node.target, "secret", PLAINTEXT, keys)
        got = wait_for(lambda: _payloads(out).get(job), 30, "the handler to run")
        assert got == PLAINTEXT
        (run,) = wait_for(lambda: _ended(node.target, job), 30, "the run to be recorded")
        assert run["state"] == "succeeded"

        # A payload under a key this worker does not hold: the run fails
        # with the key's name, retried, then dead-lettered; the worker lives.
        stranger = _submit(node.target, "stranger", PLAINTEXT + "-2", other)
        runs = wait_for(
            lambda: [r for r in _ended(node.target, stranger) if r["state"] == "dead_lettered"],
            30,
            "the undecodable run to be dead-lettered",
        )
        assert "encrypted with key 'elsewhere'" in runs[0]["error"], runs[0]["error"]
        assert stranger not in _payloads(out)
        again = _submit(node.target, "after", PLAINTEXT + "-3", keys)
        assert wait_for(lambda: _payloads(out).get(again), 30, "a later run") == PLAINTEXT + "-3"
        # wheelctl import with the key file: the same.
        lines = tmp_path / "jobs.jsonl"
        line = {"name": "imported", "handler": "record_payload", "at": "+0s"}
        lines.write_text(json.dumps({**line, "payload": PLAINTEXT + "-4"}) + "\n")
        wheelctl("import", str(lines), "--target", node.target, "--codec-key-file", str(keys))
        assert wait_for(
            lambda: PLAINTEXT + "-4" in _payloads(out).values(), 30, "the imported job's run"
        )

        # What wheelctl and the console say of it without a key.
        shown = wheelctl("job", str(job), "--target", node.target).stdout
        assert "encrypted, key k1" in shown and PLAINTEXT not in shown
        url = f"http://127.0.0.1:{node.console}/api/jobs/{job}"  # type: ignore[attr-defined]
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = resp.read().decode()
        assert json.loads(body)["payload"]["encrypted"] == "k1"
        for path in (f"/api/jobs/{stranger}", "/api/jobs", f"/api/jobs/{job}/runs"):
            with urllib.request.urlopen(
                f"http://127.0.0.1:{node.console}{path}",  # type: ignore[attr-defined]
                timeout=10,
            ) as resp:
                assert PLAINTEXT.encode() not in resp.read()
        # The payload as the client with the key reads it back.
        with_key = wheelctl(
            "job", str(job), "--target", node.target, "--json"
        ).stdout  # no key: the JSON holds the envelope's bytes, never the text
        assert PLAINTEXT not in with_key
    finally:
        worker.stop()
    node.stop()
    # Every file the node wrote: the store (SQLite and its WAL), the
    # checkpoint (LMDB and its log), and the node's log.
    needle = PLAINTEXT.encode()
    written = [p for p in tmp_path.rglob("*") if p.is_file() and "runs.txt" not in p.name]
    written = [p for p in written if p.name not in ("keys.json", "other-keys.json", "jobs.jsonl")]
    names = {p.name for p in written}
    assert {"wheel.db", "server-1.log"} <= names, names  # the store and the log were searched
    holding = [str(p) for p in written if needle in p.read_bytes() and "w-codec" not in p.name]
    assert holding == []
    # The codec itself still opens what the node kept (nothing was lost).
    codec = AesGcmCodec.from_file(keys)
    assert describe(codec.encode(b"x")) == "encrypted, key k1"
