"""``wheelctl demo``: a node, two workers and sample jobs, with live output.

The handlers below are what the demo's workers run; they are also a small
example of the worker SDK.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

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


def run_demo(*, duration_s: float, port: int, data_dir: str | None) -> int:
    from wheel.client import Client, JobArgs, Retry

    tmp = None
    if data_dir is None:
        tmp = tempfile.mkdtemp(prefix="wheel-demo-")
        data_dir = tmp
    target = f"127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    print(f"== wheel demo: node on {target}, data in {data_dir}", flush=True)
    try:
        procs.append(
            subprocess.Popen(
                _wheelctl("serve", "--data-dir", data_dir, "--listen", target),
                stderr=open(Path(data_dir) / "server.log", "ab"),  # noqa: SIM115
            )
        )
        client = Client(target)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.status()
                break
            except Exception:
                if time.monotonic() > deadline or procs[0].poll() is not None:
                    print("the node did not start; see server.log", file=sys.stderr)
                    return 1
                time.sleep(0.2)
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
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
