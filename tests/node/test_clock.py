"""The node's clock and its skew test hook."""

from __future__ import annotations

import time
from pathlib import Path

from wheel.node import Clock
from wheel.node._values import read_store_clock
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


def test_a_slow_first_read_of_the_stores_clock_does_not_set_the_node_ahead(
    tmp_path: Path,
) -> None:
    # The first read comes back late, the time read at the end of the wait:
    # as when it meets a store restarting and reconnects. Placed at the middle
    # of its 1 s round trip it set the node's clock 0.5 s ahead of the
    # store's, and fires went out early by as much.
    store = SQLiteStore(str(tmp_path / "wheel.db"))
    slow = [1.0]

    def read() -> int:
        if slow:
            time.sleep(slow.pop())
        return store.clock_ms()

    before, after, store_ms = read_store_clock(read)
    store.close()
    clock = Clock(skew_file=str(tmp_path / "absent"))
    clock.anchor_read(before, after, store_ms)  # what the node does with it
    assert abs(clock.now_ms() - time.time_ns() // 1_000_000) <= 30


def test_a_clock_anchored_on_a_read_is_never_ahead_of_the_stores(tmp_path: Path) -> None:
    """A read quick enough to be taken (under 20 ms) whose store read its
    clock at the very end of the round trip: placed at the middle, the node
    ran ahead by half the round trip, and a nemesis run saw fires go out a
    millisecond early. Anchored at the end, the node is behind or on time."""

    def read() -> int:
        time.sleep(0.008)  # the request is slow, the answer quick
        return time.time_ns() // 1_000_000

    for _ in range(5):
        before, after, store_ms = read_store_clock(read)
        clock = Clock(skew_file=str(tmp_path / "absent"))
        clock.anchor_read(before, after, store_ms)
        for _ in range(100):
            assert clock.now_ms() <= time.time_ns() // 1_000_000
        mid = Clock(skew_file=str(tmp_path / "absent"))
        mid.anchor(store_ms, (before + after) // 2)
        assert mid.now_ms() > time.time_ns() // 1_000_000  # the old placement: ahead
