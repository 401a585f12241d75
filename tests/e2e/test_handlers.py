"""Handlers as a user writes them, run by a real `wheelctl worker` (the console
script, started in the handlers' own folder) against a real node: how they
are loaded, what a failing one leaves in the log and in the run's history,
what their log lines carry, and the start of a run shorter than an ack."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from testkit.procs import ServerProc, runs_of, wait_for, wheelctl
from wheel.client import Client

pytestmark = pytest.mark.slow

WHEELCTL = str(Path(sys.executable).parent / "wheelctl")

HANDLERS = textwrap.dedent(
    """\
    import logging

    from wheel.worker import RunContext, Worker

    worker = Worker()
    log = logging.getLogger("myhandlers")


    def helper(n):
        return {"n": n}["missing"]


    @worker.handler()
    def buggy(ctx: RunContext) -> None:
        log.info("about to fail")
        helper(ctx.attempt)


    @worker.handler()
    async def greet(ctx: RunContext) -> None:
        ctx.log.info("hello %s", ctx.json()["who"])


    @worker.handler()
    def quick(ctx: RunContext) -> None:
        pass


    def plain(ctx: RunContext) -> None:
        logging.getLogger("plain").info("plain ran at %s", ctx.scheduled_for.isoformat())


    NOT_CALLABLE = 3
    """
)
# The line of ``return {"n": n}["missing"]``: where the KeyError is raised.
RAISING_LINE = HANDLERS.splitlines().index('    return {"n": n}["missing"]') + 1


@pytest.fixture
def handlers_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "myhandlers.py").write_text(HANDLERS)
    return folder


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProc]:
    node = ServerProc(tmp_path / "data")
    node.start()
    try:
        yield node
    finally:
        node.stop()


class ConsoleWorker:
    """`wheelctl worker SPEC...` as a user starts it: the console script, in
    ``cwd``, with no PYTHONPATH."""

    def __init__(self, cwd: Path, target: str, *specs: str) -> None:
        self.log_path = cwd.parent / "worker.log"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [WHEELCTL, "worker", "--target", target, "--worker-id", "w1", *specs],
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=log,
            )

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(30)


def _submit(target: str, handler: str, *args: str) -> int:
    out = wheelctl(
        "submit", "--target", target, "--name", handler, "--handler", handler, "--at", "+0s",
        "--json", *args,
    ).stdout  # fmt: skip
    return int(json.loads(out)["job_id"])


def _ended(target: str, job_id: int) -> list[dict[str, Any]]:
    runs = runs_of(target, job_id)
    return [r for r in runs if r["state"] in ("succeeded", "failed", "dead_lettered")]


def test_a_handlers_bug_is_logged_with_its_traceback_and_kept_in_the_runs_error(
    handlers_dir: Path, server: ServerProc
) -> None:
    worker = ConsoleWorker(handlers_dir, server.target, "myhandlers:worker")
    try:
        job = _submit(server.target, "buggy", "--max-attempts", "1")
        (run,) = wait_for(lambda: _ended(server.target, job), 30, "the buggy run to end")
        where = f"{handlers_dir / 'myhandlers.py'}:{RAISING_LINE}, in helper"
        first, _, frames = run["error"].partition("\n")
        assert (run["state"], first) == ("dead_lettered", f"KeyError: 'missing' (at {where})")
        # The last frames: the handler calling its helper, and the raise.
        assert frames.startswith("Traceback (most recent call last):\n")
        assert "in buggy\n    helper(ctx.attempt)\n" in frames
        assert f'line {RAISING_LINE}, in helper\n    return {{"n": n}}["missing"]' in frames
        with Client(server.target) as client:
            (stored,) = [r for r in client.runs(job) if r.run_id == run["run_id"]]
        assert stored.error == run["error"]
        # The table shows the error's first line: what and where.
        table = wheelctl("runs", str(job), "--target", server.target).stdout
        assert first in table and "Traceback" not in table, table
        # The worker's log: a WARNING with the whole traceback; the handler's
        # own line carries the run's ids.
        log = wait_for(lambda: "Traceback" in worker.log and worker.log, 10, "the traceback")
        assert re.search(r"WARNING wheel\.worker: run \d+ of job \d+ .* failed: KeyError", log)
        assert 'return {"n": n}["missing"]' in log and "KeyError: 'missing'" in log
        ids = f"job_id={job} run_id={run['run_id']} attempt={run['attempt']}"
        assert f"INFO myhandlers: about to fail {ids}" in log, log
    finally:
        assert worker.stop() == 0


def test_handlers_load_from_a_worker_object_a_whole_module_or_a_function_in_the_cwd(
    handlers_dir: Path, server: ServerProc
) -> None:
    worker = ConsoleWorker(handlers_dir, server.target, "myhandlers", "myhandlers:plain")
    try:
        greet = _submit(server.target, "greet", "--payload", '{"who": "ann"}')
        plain = _submit(server.target, "plain")
        quick = _submit(server.target, "quick")
        for job in (greet, plain, quick):
            (run,) = wait_for(partial(_ended, server.target, job), 30, f"job {job} to run")
            assert run["state"] == "succeeded", run
        log = worker.log
        (greet_run,) = runs_of(server.target, greet)
        assert (
            f"INFO wheel.handler.greet: hello ann job_id={greet}"
            f" run_id={greet_run['run_id']} attempt={greet_run['attempt']}"
        ) in log, log
        assert re.search(r"plain ran at \S+\+00:00", log), log
    finally:
        assert worker.stop() == 0


@pytest.mark.parametrize(
    ("specs", "says"),
    [
        (["nosuchmodule:f"], "cannot import 'nosuchmodule': no module named 'nosuchmodule'"),
        (["myhandlers:nothere"], "'myhandlers' has no attribute 'nothere'"),
        (["myhandlers:NOT_CALLABLE"], "is a int, not a function or a wheel.worker.Worker"),
        (["json"], "module 'json' declares no handlers"),
        (["myhandlers:worker", "quick=myhandlers:plain"], "two handlers are named 'quick'"),
    ],
)
def test_a_handler_that_cannot_be_loaded_says_why(
    handlers_dir: Path, specs: list[str], says: str
) -> None:
    done = subprocess.run(
        [WHEELCTL, "worker", "--target", "127.0.0.1:1", *specs],
        cwd=handlers_dir,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr


SDK_WORKER = textwrap.dedent(
    """\
    import asyncio
    import sys
    import time
    from pathlib import Path

    from wheel.worker import RunContext, Worker

    worker = Worker(sys.argv[1], worker_id="sdk")


    @worker.handler()
    def slow(ctx: RunContext) -> None:
        Path(sys.argv[2]).write_text(str(ctx.run_id))
        time.sleep(2)


    asyncio.run(worker.run())
    """
)


def test_the_sdk_worker_drains_on_sigterm_and_its_run_succeeds(
    tmp_path: Path, server: ServerProc
) -> None:
    script = tmp_path / "sdkworker.py"
    script.write_text(SDK_WORKER)
    started = tmp_path / "started"
    with open(tmp_path / "sdkworker.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(script), server.target, str(started)], stdout=log, stderr=log
        )
    try:
        job = _submit(server.target, "slow")
        wait_for(started.exists, 30, "the run to start")
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # Finished and reported, well before its 60 s lease could lapse.
        (run,) = wait_for(lambda: _ended(server.target, job), 15, "the run to end")
        assert (run["state"], run["worker_id"]) == ("succeeded", "sdk")
        assert proc.wait(15) == 0
        assert time.monotonic() - signalled < 15
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_run_shorter_than_an_ack_has_its_start_and_finish(
    handlers_dir: Path, server: ServerProc
) -> None:
    # ``quick`` returns at once: its completion leaves before an ack is due,
    # so the node never hears it start apart from the completion.
    worker = ConsoleWorker(handlers_dir, server.target, "myhandlers:quick")
    try:
        jobs = [_submit(server.target, "quick") for _ in range(3)]
        for job in jobs:
            wait_for(partial(_ended, server.target, job), 30, f"job {job} to run")
        with Client(server.target) as client:
            runs = [r for job in jobs for r in client.runs(job)]
        assert [r.state.value for r in runs] == ["succeeded"] * 3
        for r in runs:
            assert r.started_at is not None and r.finished_at is not None, r
            assert r.started_at <= r.finished_at, r
            assert r.finished_at - r.started_at < timedelta(seconds=1), r
    finally:
        assert worker.stop() == 0


def test_the_docs_worker_module_runs_under_wheelctl_worker(
    tmp_path: Path, server: ServerProc
) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "workers.md").read_text()
    module = re.search(r"```python\n(# myhandlers\.py\n.*?)```", page, re.S)
    assert module is not None, "the worker module of docs/workers.md"
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "myhandlers.py").write_text(module.group(1))
    worker = ConsoleWorker(folder, server.target, "myhandlers:worker")
    try:
        good = _submit(server.target, "send_report", "--payload", '{"id": 7}')
        bad = _submit(server.target, "send_report", "--payload", '{"id": -1}')
        (ok,) = wait_for(partial(_ended, server.target, good), 30, "the report to run")
        (dead,) = wait_for(partial(_ended, server.target, bad), 30, "the bad report to end")
        assert (ok["state"], dead["state"], dead["error"]) == (
            "succeeded",
            "dead_lettered",
            "no such report",
        )
        assert re.search(rf"report 7 for the fire due at \S+ \S+\+00:00 job_id={good}", worker.log)
    finally:
        assert worker.stop() == 0
