"""The handler the limits benchmark runs (``_limits_handler:hold``, by a real
``wheelctl worker`` started in this folder): it holds the run for the
milliseconds its payload says and records its own start and end, by this
host's clock, as one JSON line appended to ``$WHEEL_BENCH_RECORDS``. The
benchmark judges the limit by these records alone, not by anything wheel
reports.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from wheel.worker import RunContext

_PATH = os.environ["WHEEL_BENCH_RECORDS"]


async def hold(ctx: RunContext) -> None:
    start = time.time()
    await asyncio.sleep(int(ctx.payload or b"0") / 1000)
    end = time.time()
    line = json.dumps(
        {"job": ctx.job_id, "run": ctx.run_id, "fire": ctx.scheduled_for_ms, "start": start,
         "end": end}
    )  # fmt: skip
    # One O_APPEND write a line: lines of concurrent runs and workers never mix.
    fd = os.open(_PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
