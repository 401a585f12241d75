"""``wheelctl serve --log-format json`` and ``wheelctl worker --log-format
json``: every line either process writes, on stdout (where it serves) and
stderr (its log) alike, is one JSON object, and the records about a run
carry its job_id, run_id, shard, fence and worker. In text, the lines
scripts wait for stay plain."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

from testkit.procs import wait_for, wheelctl
from testkit.services import free_port
from wheel.client import Client
from wheel.engine.model import shard_of
from wheel.errors import WheelError

HERE = Path(__file__).resolve().parent


def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of ``path`` as JSON (a line that is not fails the test)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_node_and_worker_log_json_lines_with_the_ids_of_the_run(tmp_path: Path) -> None:
    target = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, PYTHONPATH=f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    serve = ["serve", "--data-dir", str(tmp_path / "data"), "--listen", target]
    serve += ["--metrics-listen", "127.0.0.1:0"]
    work = ["worker", "--target", target, "--worker-id", "w-json", "fail=ops_handlers:fail"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for args, name in ((serve, "node"), (work, "worker")):
            with (
                open(tmp_path / f"{name}.out", "wb") as out,
                open(tmp_path / f"{name}.err", "wb") as err,
            ):
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "wheel", *args, "--log-format", "json"],
                        env=env,
                        stdout=out,
                        stderr=err,
                    )
                )
        node_log = tmp_path / "node.err"
        with Client(target, timeout=2.0) as client:
            wait_for(lambda: _workers(client) == 1, 20, "the worker to connect")
            job = client.submit(name="j", handler="fail", at=timedelta(milliseconds=50), retry=1)
            wait_for(
                lambda: any(r.get("alert") == "dead_lettered" for r in json_lines(node_log)),
                15,
                "the dead-letter alert in the node's log",
            )
        # Where it serves, as JSON on stdout: the fields a script needs.
        serving, metrics = (
            _said(tmp_path / "node.out", "serving"),
            _said(tmp_path / "node.out", "metrics"),
        )
        assert serving["address"] == target and serving["port"] == int(target.split(":")[1])
        assert serving["level"] == "INFO" and serving["logger"] == "wheel" and "time" in serving
        with urllib.request.urlopen(metrics["url"], timeout=5) as scrape:
            assert b"wheel_dispatch_lag" in scrape.read()
        assert metrics["url"] == f"http://127.0.0.1:{metrics['port']}/metrics"
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    # Every line of both streams of both processes, to their last.
    outputs = {
        f"{name}.{stream}": json_lines(tmp_path / f"{name}.{stream}")
        for name in ("node", "worker")
        for stream in ("out", "err")
    }
    node, worker = outputs["node.err"], outputs["worker.err"]
    assert [r["message"] for r in outputs["node.out"]] == [
        f"wheel metrics on {metrics['url']}",
        f"wheel serving on {target}",
    ]
    assert len(node) >= 3 and len(worker) >= 2  # start-up lines and the run's
    ids = {"job_id": job.job_id, "shard": shard_of(job.job_id), "worker": "w-json"}
    [alert] = [r for r in node if r.get("alert") == "dead_lettered"]
    [failed] = [r for r in worker if "failed" in r["message"] and "job_id" in r]
    for record in (alert, failed):
        assert {k: record[k] for k in ids} == ids
        assert isinstance(record["run_id"], int) and isinstance(record["fence"], int)
    assert (alert["run_id"], alert["fence"]) == (failed["run_id"], failed["fence"])


def test_a_refused_start_says_why_in_json_too(tmp_path: Path) -> None:
    out = wheelctl(
        "serve", "--data-dir", str(tmp_path / "data"), "--listen", "0.0.0.0:0",
        "--log-format", "json", check=False,
    )  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    [refusal] = [json.loads(line) for line in out.stderr.splitlines()]
    assert refusal["level"] == "ERROR" and refusal["message"].startswith("wheelctl: --listen")


def test_in_text_the_lines_scripts_wait_for_stay_plain(tmp_path: Path) -> None:
    target = f"127.0.0.1:{free_port()}"
    args = ["serve", "--data-dir", str(tmp_path / "data"), "--listen", target]
    with open(tmp_path / "node.out", "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "wheel", *args, "--metrics-listen", "127.0.0.1:0"],
            stdout=out,
            stderr=subprocess.DEVNULL,
        )
    try:
        lines = wait_for(
            lambda: _lines_once_serving(tmp_path / "node.out", proc), 30, "the node to serve"
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
    [metrics, serving] = lines
    assert re.fullmatch(r"wheel metrics on http://127\.0\.0\.1:\d+/metrics", metrics)
    assert serving == f"wheel serving on {target}"


def _lines_once_serving(path: Path, proc: subprocess.Popen[bytes]) -> list[str] | None:
    assert proc.poll() is None, "the node exited"
    lines = path.read_text().splitlines()
    return lines if any(line.startswith("wheel serving on") for line in lines) else None


def _said(path: Path, what: str) -> dict[str, Any]:
    """The one JSON line of ``path`` that says where the node serves ``what``."""
    [line] = [r for r in json_lines(path) if r["message"].startswith(f"wheel {what} on")]
    return line


def _workers(client: Client) -> int:
    try:
        return client.status().workers
    except WheelError:  # the node is not up yet
        return 0
