"""``wheelctl demo``: a node, two workers and sample jobs, with live output.

The node runs in the demo's own process (``wheel.app.running``, as
``wheelctl serve`` runs it), its log in ``server.log``; the workers are
``wheelctl worker`` processes. The handlers below are what the demo's
workers run; they are also a small example of the worker SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from wheel.worker import Retryable, RunContext


def hello(ctx: RunContext) -> None:
    """Say hello: the simplest handler."""
    print(
        f"  [{os.environ.get('WHEEL_DEMO_WORKER', 'worker')}] hello from job {ctx.job_id} "
        f"fire {ctx.idempotency_key} attempt {ctx.attempt} payload={ctx.payload.decode()!r}",
        flush=True,
    )


def flaky(ctx: RunContext) -> None:
    """Fails its first attempt of every fire: shows retries with backoff."""
    if ctx.attempt == 1:
        print(
            f"  [{os.environ.get('WHEEL_DEMO_WORKER', 'worker')}] flaky job {ctx.job_id} "
            "fails attempt 1 (will be retried)",
            flush=True,
        )
        raise Retryable("first attempts always fail in this demo")
    hello(ctx)


def _wheelctl(*args: str) -> list[str]:
    return [sys.executable, "-m", "wheel", *args]


class DemoNode:
    """The demo's node: ``wheel.app.running`` on an event loop in a thread,
    SQLite and the checkpoint in ``data_dir``, its log lines (not its
    announcements) in ``data_dir/server.log``."""

    def __init__(self, data_dir: Path, listen: str) -> None:
        from wheel.app import AppConfig
        from wheel.node import NodeConfig

        self.config = AppConfig(
            store_url=f"sqlite:///{data_dir / 'wheel.db'}",
            node=NodeConfig(checkpoint_dir=str(data_dir / "checkpoint")),
            listen=listen,
            data_dir=data_dir,
        )
        self.log = logging.FileHandler(data_dir / "server.log")
        self.log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.error: BaseException | None = None
        self._level = logging.NOTSET
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="demo-node", daemon=True)

    def start(self) -> bool:
        """Serving (True), or failed to start (False; ``error`` says why)."""
        logger = logging.getLogger("wheel")
        self._level = logger.level
        logger.addHandler(self.log)
        logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))
        logger.propagate = False
        self._thread.start()
        self._started.wait()
        return self.error is None

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            # Its loop is closed already when the node did not start.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        logger = logging.getLogger("wheel")
        logger.removeHandler(self.log)
        logger.setLevel(self._level)
        logger.propagate = True
        self.log.close()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:
            self.error = exc
        finally:
            self._started.set()

    async def _serve(self) -> None:
        from wheel.app import running

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()

        def say(message: str, /, **fields: Any) -> None:
            print(message, flush=True)

        async with running(self.config, announce=say) as app:
            print(f"wheel serving on {self.config.listen.rsplit(':', 1)[0]}:{app.port}", flush=True)
            self._started.set()
            await self._stop.wait()


def run_demo(*, duration_s: float, port: int, data_dir: str | None) -> int:
    from wheel.client import Client, JobArgs, Retry

    tmp = None
    if data_dir is None:
        tmp = tempfile.mkdtemp(prefix="wheel-demo-")
        data_dir = tmp
    target = f"127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    print(f"== wheel demo: node on {target}, data in {data_dir}", flush=True)
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    node = DemoNode(Path(data_dir).resolve(), target)
    try:
        if not node.start():
            print(f"the node did not start: {node.error}; see server.log", file=sys.stderr)
            return 1
        client = Client(target)
        for name in ("worker-a", "worker-b"):
            env = dict(os.environ, WHEEL_DEMO_WORKER=name)
            procs.append(
                subprocess.Popen(
                    _wheelctl(
                        "worker",
                        "--target",
                        target,
                        "--worker-id",
                        name,
                        "--capacity",
                        "4",
                        "wheel.demo:hello",
                        "wheel.demo:flaky",
                    ),
                    env=env,
                    stderr=open(Path(data_dir) / f"{name}.log", "ab"),  # noqa: SIM115
                )
            )
        now = datetime.now(UTC)
        jobs: list[JobArgs] = [
            {
                "name": "one-shot-in-2s",
                "handler": "hello",
                "at": now + timedelta(seconds=2),
                "payload": "once",
            },
            {
                "name": "cron-every-5s",
                "handler": "hello",
                "cron": "*/5 * * * * *",
                "tz": "Europe/London",
                "payload": "cron",
            },
            {
                "name": "interval-3s",
                "handler": "hello",
                "every": 3,
                "start": now + timedelta(seconds=1),
                "payload": "every",
            },
            {
                "name": "flaky-every-7s",
                "handler": "flaky",
                "every": 7,
                "start": now + timedelta(seconds=1.5),
                "retry": Retry(max_attempts=3, initial_backoff=0.5, max_backoff=2),
            },
        ]
        names = {}
        for args in jobs:
            args["idempotency_key"] = f"demo-{args['name']}-{now.timestamp()}"
            job = client.submit(**args)
            names[job.job_id] = job.name
            print(f"submitted {job.name:<16} job {job.job_id}", flush=True)
        seen: dict[tuple[str, int, int], str] = {}
        end = time.monotonic() + duration_s if duration_s > 0 else float("inf")
        while time.monotonic() < end:
            time.sleep(1.0)
            for job_id, name in names.items():
                for run in client.runs(job_id):
                    seen_key = (run.idempotency_key, run.run_id, run.attempt)
                    if seen.get(seen_key) == run.state:
                        continue
                    seen[seen_key] = run.state
                    when = run.scheduled_for.strftime("%H:%M:%S.%f")[:-3] + "Z"
                    print(
                        f"{name:<16} fire {when} attempt {run.attempt} -> {run.state:<10} "
                        f"{run.worker_id or ''} {run.missed_reason or run.error or ''}",
                        flush=True,
                    )
        status = client.status()
        p99_ms = status.dispatch_lag_p99 / timedelta(milliseconds=1)
        print(
            f"== done: {status.dispatched_total} dispatched, {status.completed_total} succeeded, "
            f"dispatch lag p99 {p99_ms:.0f} ms",
            flush=True,
        )
        client.close()
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        node.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
