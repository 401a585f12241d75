"""The loop's tick: while fires keep coming due the node goes round at most
once a tick, each round firing everything due by then; a fire after a quiet
spell still goes at once."""

from __future__ import annotations

import threading
import time
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

TICK_MS = 300
FIRES = 12
GAP_MS = 25  # FIRES fires over 275 ms: within about one tick
# A lone fire after a quiet spell, then ``FIRES`` one-shots ``GAP_MS`` apart.
BURST = [0] + [1_000 + GAP_MS * i for i in range(FIRES)]


def arrivals(
    tmp_path: Path, tick_ms: int, offsets_ms: list[int] = BURST, max_idle_s: float = 0.5
) -> tuple[list[float], list[int]]:
    """One-shots due at ``offsets_ms`` from a moment 1.5 s ahead: when each
    reached a worker (s, monotonic) and how late (ms)."""
    server = InProcessServer(tmp_path, tick_ms=tick_ms, max_idle_s=max_idle_s).start()
    arrived: dict[int, tuple[float, int]] = {}
    lock = threading.Lock()

    def handler(ctx: RunContext) -> None:
        with lock:
            arrived[int(ctx.payload.decode())] = (time.monotonic(), now_ms())

    try:
        with connect(server) as api, WorkerThread(server.target, "w", h=handler):
            first = now_ms() + 1_500
            dues = [first + offset for offset in offsets_ms]
            for i, due in enumerate(dues):
                submit(
                    api,
                    spec(name=f"j{i}", handler="h", payload=str(i).encode(), schedule=once(due)),
                )
            wait_for(lambda: len(arrived) == len(dues), 15, "every run to arrive")
    finally:
        server.stop()
    return [arrived[i][0] for i in range(len(dues))], [
        arrived[i][1] - due for i, due in enumerate(dues)
    ]


def test_fires_due_within_a_tick_go_out_in_one_or_two_rounds(tmp_path: Path) -> None:
    at, lags = arrivals(tmp_path, TICK_MS)
    # The lone fire: nothing held it back.
    assert lags[0] < TICK_MS / 2, lags
    # The burst: the first goes at once (a quiet spell before it), the rest
    # wait for the next round(s): at most three distinct arrival moments.
    burst = at[1:]
    moments: list[float] = []
    for t in sorted(burst):
        if not moments or t - moments[-1] > 0.05:
            moments.append(t)
    assert len(moments) <= 3, [round(t - burst[0], 3) for t in burst]
    # None early, none later than a tick and a margin.
    assert all(0 <= lag < TICK_MS + 250 for lag in lags), lags


def test_rounds_with_nothing_to_write_do_not_hold_a_lone_fire_back(tmp_path: Path) -> None:
    """An idle node still goes round (every ``max_idle_s``, here 50 ms, and for
    submits and reads); those rounds write nothing and start no tick, so each
    of these fires, alone after a quiet spell, goes at its time. When they
    started one, each fire waited up to a tick behind the last idle round."""
    _, lags = arrivals(tmp_path, TICK_MS, [700 * i for i in range(4)], max_idle_s=0.05)
    assert all(0 <= lag < TICK_MS / 3 for lag in lags), lags


def test_without_a_tick_each_fire_goes_on_its_own(tmp_path: Path) -> None:
    at, lags = arrivals(tmp_path, 0)
    burst = sorted(at[1:])
    moments: list[float] = []
    for t in burst:
        if not moments or t - moments[-1] > 0.015:
            moments.append(t)
    assert len(moments) >= FIRES // 2, [round(t - burst[0], 3) for t in burst]
    assert all(0 <= lag < 200 for lag in lags), lags
