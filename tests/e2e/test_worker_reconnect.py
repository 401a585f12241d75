"""`wheelctl worker --reconnect-max`: the longest wait between a worker's tries
at a node it has no stream to, run as a user runs it (the console script)
against a port where no node listens yet, then a node started there."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from testkit.procs import ServerProc, wait_for

pytestmark = pytest.mark.slow

WHEELCTL = str(Path(sys.executable).parent / "wheelctl")
HANDLERS = "def noop(ctx):\n    pass\n"
TRIES = 10
# The waits double from 0.1 s (each drawn from the upper half of its ceiling):
# ten tries at the default cap of 2 s take at least this long.
DEFAULT_TEN_TRIES_S = 0.05 + 0.1 + 0.2 + 0.4 + 0.8 + 4 * 1.0
_TRY = re.compile(r"^(\S+ \S+) (?:[A-Z]+ )?wheel\.worker: stream to \S+ ended: UNAVAILABLE", re.M)


def _tries(log: Path) -> list[datetime]:
    text = log.read_text(errors="replace")
    return [datetime.strptime(t, "%Y-%m-%d %H:%M:%S,%f") for t in _TRY.findall(text)]


def test_a_worker_tries_a_down_node_no_further_apart_than_its_reconnect_max(
    tmp_path: Path,
) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "tasks.py").write_text(HANDLERS)
    node = ServerProc(tmp_path / "data")  # not started yet: its port is free
    port = node.port
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        flags = ["--target", f"127.0.0.1:{port}", "--reconnect-max", "200ms", "--worker-id", "w1"]
        worker = subprocess.Popen(
            [WHEELCTL, "worker", *flags, "tasks:noop"],
            cwd=tmp_path / "app",
            stdout=out,
            stderr=out,
        )
    try:
        wait_for(lambda: len(_tries(log)) >= TRIES, 30, f"{TRIES} tries at the down node", 0.1)
        tries = _tries(log)[:TRIES]
        spent = (tries[-1] - tries[0]).total_seconds()
        # 0.1 s, then 0.2 s at most between tries (and what a try costs).
        assert spent < DEFAULT_TEN_TRIES_S, f"{TRIES} tries took {spent:.2f} s: {tries}"

        # The node comes up: the worker's next try, a wait of at most 0.2 s
        # away, connects.
        node.start()
        wait_for(
            lambda: f"connected to 127.0.0.1:{port}" in log.read_text(errors="replace"),
            30,
            "the worker to connect",
            0.1,
        )
        assert worker.poll() is None
    finally:
        worker.terminate()
        worker.wait(30)
        node.stop()


@pytest.mark.parametrize("value", ["0s", "-1s", "soon"])
def test_a_reconnect_max_that_is_not_a_positive_duration_is_refused(value: str) -> None:
    done = subprocess.run(
        [WHEELCTL, "worker", "--target", "127.0.0.1:1", "--reconnect-max", value, "m:f"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "--reconnect-max" in done.stderr and "Traceback" not in done.stderr, done.stderr
