"""A burst larger than ``burst_batch_claims``: its claims go to the store in
parts back to back, each handed out once stored, so the burst does not
wait tick after tick for room; every fire reaches a worker once."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

from tests.rpc.test_api import (
    InProcessServer,
    WorkerThread,
    connect,
    now_ms,
    once,
    spec,
    submit,
    wait_for,
)
from wheel.worker import RunContext

# A tick long enough that a part waiting for the next one shows whatever
# the machine's load.
TICK_MS = 1_000
FIRES = 48
PART = 8  # the first part's claims: parts of 8, 16 and 24, two on their way at a time


def test_a_burst_goes_in_parts_back_to_back_and_every_fire_arrives_once(tmp_path: Path) -> None:
    server = InProcessServer(
        tmp_path,
        tick_ms=TICK_MS,
        burst_batch_claims=PART,
        checkpoint_dir=str(tmp_path / "checkpoint"),
    ).start()
    arrived: Counter[int] = Counter()
    lags: list[int] = []
    lock = threading.Lock()

    def handler(ctx: RunContext) -> None:
        with lock:
            arrived[int(ctx.payload.decode())] += 1
            lags.append(now_ms() - ctx.scheduled_for_ms)

    try:
        worker = WorkerThread(server.target, "w", options={"capacity": FIRES}, h=handler)
        with connect(server) as api, worker:
            due = now_ms() + 1_500
            for i in range(FIRES):
                submit(
                    api,
                    spec(name=f"j{i}", handler="h", payload=str(i).encode(), schedule=once(due)),
                )
            wait_for(lambda: len(arrived) == FIRES, 15, "every run to arrive")
            assert server.node is not None
            stall_ms = round(server.node.loop_stall_max_s() * 1000)
    finally:
        server.stop()
    assert set(arrived.values()) == {1}
    # The part after the first two went as an answer made room, not a tick
    # later.
    assert all(0 <= lag < TICK_MS + stall_ms for lag in lags), (sorted(lags)[::8], stall_ms)
