"""The handler the limits benchmark runs (``_limits_handler:hold``, by a real
``wheelctl worker`` started in this folder): it holds the run for the
milliseconds its payload says and records its own start and its end, by
this host's clock, each as one JSON line appended to
``$WHEEL_BENCH_RECORDS``, with its process id (a worker SIGKILLed mid-run
leaves a start without an end: its runs ended with it). The benchmark
judges the limit by these records alone, not by anything wheel reports.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from wheel.worker import RunContext

_PATH = os.environ["WHEEL_BENCH_RECORDS"]


def _note(ctx: RunContext, kind: str, t: float) -> None:
    line: dict[str, Any] = {
        "kind": kind, "job": ctx.job_id, "run": ctx.run_id, "fire": ctx.scheduled_for_ms,
        "pid": os.getpid(), "t": t,
    }  # fmt: skip
    # One O_APPEND write a line: lines of concurrent runs and workers never mix.
    fd = os.open(_PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


async def hold(ctx: RunContext) -> None:
    _note(ctx, "start", time.time())
    await asyncio.sleep(int(ctx.payload or b"0") / 1000)
    _note(ctx, "end", time.time())
