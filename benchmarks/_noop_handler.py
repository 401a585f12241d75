"""The Python no-op handler that ``http_targets.py`` measures the HTTP
executor against, run by a real ``wheelctl worker`` (started in this folder):
``_noop_handler:noop``.

It does nothing but note when it got each run (the record ``bench_worker.py``
writes, to ``$WHEEL_BENCH_RECORDS``), so that the run can be counted and its
lag measured. An async function with no ``await``: the worker runs it inline,
the cheapest way it runs a handler, so the ratio against it is the HTTP
path's whole cost.
"""

from __future__ import annotations

import asyncio
import atexit
import os
from pathlib import Path

from _harness import RecordWriter, now_ms

from wheel.worker import RunContext

_out = RecordWriter(Path(os.environ["WHEEL_BENCH_RECORDS"]))
atexit.register(_out.close)
_flushing = False


def _flush_soon() -> None:
    """Write what came every 0.2 s on the worker's loop, so the last runs of a
    phase reach the file while the worker still runs."""
    _out.flush()
    asyncio.get_running_loop().call_later(0.2, _flush_soon)


async def noop(ctx: RunContext) -> None:
    global _flushing
    t = now_ms()
    _out.add(ctx.job_id, ctx.scheduled_for_ms, t, t)
    if not _flushing:
        _flushing = True
        asyncio.get_running_loop().call_later(0.2, _flush_soon)
