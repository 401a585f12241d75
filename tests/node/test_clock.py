"""The node's clock and its skew test hook."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from wheel.node import Clock, Node, NodeConfig
from wheel.store.sqlite import SQLiteStore


def test_clock_reads_the_wall_time_at_start_without_a_skew_file(tmp_path: Path) -> None:
    before = time.time_ns() // 1_000_000
    clock = Clock(skew_file=str(tmp_path / "absent"))
    assert clock.skew_ms == 0
    assert before <= clock.now_ms() <= time.time_ns() // 1_000_000


def test_skew_file_shifts_the_clock_and_a_reload_steps_it(tmp_path: Path) -> None:
    skew = tmp_path / "skew"
    skew.write_text("5000\n")
    clock = Clock(skew_file=str(skew))
    ahead = clock.now_ms() - time.time_ns() // 1_000_000
    assert 4_900 <= ahead <= 5_000
    skew.write_text("-3000")
    clock.reload_skew()  # what SIGUSR1 does in wheelctl serve
    behind = clock.now_ms() - time.time_ns() // 1_000_000
    assert -3_100 <= behind <= -3_000


def test_an_unreadable_skew_means_no_skew(tmp_path: Path) -> None:
    skew = tmp_path / "skew"
    skew.write_text("soon")
    assert Clock(skew_file=str(skew)).skew_ms == 0


def test_an_anchored_clock_runs_on_the_anchor_and_ignores_the_hosts_skew(
    tmp_path: Path,
) -> None:
    skew = tmp_path / "skew"
    skew.write_text("5000")
    clock = Clock(skew_file=str(skew))
    true_ms = time.time_ns() // 1_000_000
    clock.anchor(true_ms, time.monotonic_ns())  # what the store's clock said
    assert abs(clock.now_ms() - time.time_ns() // 1_000_000) <= 5
    assert clock.wall_ms() - time.time_ns() // 1_000_000 >= 4_990  # the host is still off
    skew.write_text("-20000")
    clock.reload_skew()  # the host's clock steps: the node's does not
    assert abs(clock.now_ms() - time.time_ns() // 1_000_000) <= 5


class SlowFirstClockRead(SQLiteStore):
    """A real store whose first clock read comes back late, its time read at
    the end of the wait: as when the first call meets a store restarting and
    reconnects."""

    slow_s = 0.0

    def clock_ms(self) -> int:
        if self.slow_s:
            time.sleep(self.slow_s)
            self.slow_s = 0.0
        return super().clock_ms()


def test_a_slow_first_read_of_the_stores_clock_does_not_set_the_node_ahead(
    tmp_path: Path,
) -> None:
    # Placed at the middle of a 1 s round trip, that read set the node's clock
    # 0.5 s ahead of the store's, and fires went out early by as much.
    store = SlowFirstClockRead(str(tmp_path / "wheel.db"))
    store.slow_s = 1.0
    node = Node(store, NodeConfig(checkpoint_dir=None))

    async def started() -> int:
        await node.start()
        try:
            return node.clock.now_ms() - time.time_ns() // 1_000_000
        finally:
            await node.stop()

    ahead = asyncio.run(started())
    store.close()
    assert abs(ahead) <= 30
