"""``wheelctl serve --log-format json`` and ``wheelctl worker --log-format
json``: every line either process logs is one JSON object, and the records
about a run carry its job_id, run_id, shard, fence and worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.conftest import free_port
from tests.e2e.procs import wait_for
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
    node_log, worker_log = tmp_path / "node.err", tmp_path / "worker.err"
    serve = ["serve", "--data-dir", str(tmp_path / "data"), "--listen", target]
    work = ["worker", "--target", target, "--worker-id", "w-json", "fail=ops_handlers:fail"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for args, err in ((serve, node_log), (work, worker_log)):
            with open(err, "wb") as f:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "wheel", *args, "--log-format", "json"],
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=f,
                    )
                )
        with Client(target, timeout=2.0) as client:
            wait_for(lambda: _workers(client) == 1, 20, "the worker to connect")
            job = client.submit(name="j", handler="fail", at=timedelta(milliseconds=50), retry=1)
            wait_for(
                lambda: any(r.get("alert") == "dead_lettered" for r in json_lines(node_log)),
                15,
                "the dead-letter alert in the node's log",
            )
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    node, worker = json_lines(node_log), json_lines(worker_log)
    assert len(node) >= 3 and len(worker) >= 2  # start-up lines and the run's
    ids = {"job_id": job.job_id, "shard": shard_of(job.job_id), "worker": "w-json"}
    [alert] = [r for r in node if r.get("alert") == "dead_lettered"]
    [failed] = [r for r in worker if "failed" in r["message"] and "job_id" in r]
    for record in (alert, failed):
        assert {k: record[k] for k in ids} == ids
        assert isinstance(record["run_id"], int) and isinstance(record["fence"], int)
    assert (alert["run_id"], alert["fence"]) == (failed["run_id"], failed["fence"])


def _workers(client: Client) -> int:
    try:
        return client.status().workers
    except WheelError:  # the node is not up yet
        return 0
