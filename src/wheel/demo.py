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
    if ctx.attempt == 0:
        print(
            f"  [{os.environ.get('WHEEL_DEMO_WORKER', 'worker')}] flaky job {ctx.job_id} "
            "fails attempt 0 (will be retried)",
            flush=True,
        )
        raise Retryable("first attempts always fail in this demo")
    hello(ctx)


def _wheelctl(*args: str) -> list[str]:
    return [sys.executable, "-m", "wheel", *args]


def run_demo(*, duration_s: float, port: int, data_dir: str | None) -> int:
    from wheel.client import Client
    from wheel.engine.spec import Cron, Interval, JobSpec, Once, Retry
    from wheel.rpc.v1 import jobs_pb2

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
        now = int(time.time() * 1000)
        specs = [
            JobSpec(
                name="one-shot-in-2s",
                handler="hello",
                schedule=Once(at_ms=now + 2000),
                payload=b"once",
            ),
            JobSpec(
                name="cron-every-5s",
                handler="hello",
                schedule=Cron(expr="*/5 * * * * *", time_zone="Europe/London"),
                payload=b"cron",
            ),
            JobSpec(
                name="interval-3s",
                handler="hello",
                schedule=Interval(period_ms=3000, start_at_ms=now + 1000),
                payload=b"every",
            ),
            JobSpec(
                name="flaky-every-7s",
                handler="flaky",
                schedule=Interval(period_ms=7000, start_at_ms=now + 1500),
                retry=Retry(max_attempts=3, initial_backoff_ms=500, max_backoff_ms=2000),
            ),
        ]
        jobs = {}
        for spec in specs:
            job, _ = client.submit(spec, idempotency_key=f"demo-{spec.name}-{now}")
            jobs[job.job_id] = spec.name
            print(f"submitted {spec.name:<16} job {job.job_id}", flush=True)
        seen: dict[tuple[int, int], int] = {}
        end = time.monotonic() + duration_s if duration_s > 0 else float("inf")
        while time.monotonic() < end:
            time.sleep(1.0)
            for job_id, name in jobs.items():
                for run in client.runs(job_id):
                    key = (run.run_id or -run.scheduled_for_ms, run.attempt)
                    if seen.get(key) == run.state:
                        continue
                    seen[key] = run.state
                    state = jobs_pb2.RunState.Name(run.state).removeprefix("RUN_STATE_").lower()
                    when = time.strftime("%H:%M:%S", time.gmtime(run.scheduled_for_ms / 1000))
                    print(
                        f"{name:<16} fire {when}.{run.scheduled_for_ms % 1000:03d} "
                        f"attempt {run.attempt} -> {state:<10} "
                        f"{run.worker_id or ''} {run.missed_reason or run.error}",
                        flush=True,
                    )
        status = client.status()
        print(
            f"== done: {status.dispatched_total} dispatched, {status.completed_total} succeeded, "
            f"dispatch lag p99 {status.dispatch_lag_p99_ms:.0f} ms",
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
