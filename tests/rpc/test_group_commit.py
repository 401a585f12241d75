"""Group commit: under load the node holds a pass's store writes back so each
commit carries more fires; light traffic for a few milliseconds at most."""

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

HOLD_MS = 400


def arrivals_after_the_first(tmp_path: Path, *, min_writes: int, light_ms: int = 0) -> list[float]:
    """Three one-shots due 60 ms apart: when the second and the third reached a
    worker, in seconds after the first."""
    server = InProcessServer(
        tmp_path,
        group_commit_ms=HOLD_MS,
        group_commit_min_writes=min_writes,
        group_commit_light_ms=light_ms,
    ).start()
    arrived: dict[str, float] = {}
    lock = threading.Lock()

    def handler(ctx: RunContext) -> None:
        with lock:
            arrived[ctx.payload.decode()] = time.monotonic()

    try:
        with connect(server) as api, WorkerThread(server.target, "w", h=handler):
            first = now_ms() + 1_500
            for i in range(3):
                submit(
                    api,
                    spec(
                        name=f"j{i}",
                        handler="h",
                        payload=str(i).encode(),
                        schedule=once(first + 60 * i),
                    ),
                )
            wait_for(lambda: len(arrived) == 3, 15, "three runs to arrive")
    finally:
        server.stop()
    t = [arrived[str(i)] for i in range(3)]
    return [t[1] - t[0], t[2] - t[0]]


def test_after_a_batch_at_the_threshold_the_next_waits_the_hold(tmp_path: Path) -> None:
    # Every batch reaches a threshold of one write: the first fire's batch
    # starts the hold, and the two fires that come due during it wait for
    # its end, then go out together.
    later = arrivals_after_the_first(tmp_path, min_writes=1)
    assert all(t >= (HOLD_MS - 60) / 1000 for t in later), later


def test_below_the_threshold_only_the_light_hold_applies(tmp_path: Path) -> None:
    # Below the threshold (the default, 64 writes) the hold is the light one:
    # none here, so the fires arrive about as far apart as they came due.
    later = arrivals_after_the_first(tmp_path, min_writes=64)
    assert all(t < (HOLD_MS - 60) / 1000 for t in later), later


def test_a_trickle_of_small_batches_waits_the_light_hold(tmp_path: Path) -> None:
    later = arrivals_after_the_first(tmp_path, min_writes=64, light_ms=HOLD_MS)
    assert all(t >= (HOLD_MS - 60) / 1000 for t in later), later
