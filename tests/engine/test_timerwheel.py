"""TimerWheel against a reference model, plus the edges the model might miss."""

from __future__ import annotations

import bisect
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from wheel.engine import timerwheel
from wheel.engine.timerwheel import TimerWheel

ROOT = Path(__file__).resolve().parents[2]
YEAR_MS = 365 * 86_400_000
EPOCH_NOW = 1_700_000_000_000  # a realistic, unaligned epoch-ms start

# Ids: small ones collide (re-adds, cancels of pending timers); the 63-bit edge is in.
timer_ids = st.one_of(st.integers(0, 40), st.sampled_from([2**31, 2**62 + 7, 2**63 - 1]))
# Offsets from now, by kind: the past, the next few ms, slot edges, far, years ahead.
_EDGES = sorted({s * 64**k + e for k in range(1, 8) for s in (1, 2) for e in (-1, 0, 1)})
offsets = st.one_of(
    st.integers(-5_000, 0),
    st.integers(1, 200),
    st.sampled_from(_EDGES),
    st.integers(1, 2**26),
    st.integers(1, 2**44),
    st.integers(4 * YEAR_MS, 6 * YEAR_MS),
)
steps = st.one_of(
    st.integers(0, 70),
    st.integers(0, 5_000),
    st.integers(0, 2**30),
    st.integers(0, 2**43),
)


class Model:
    """A dict plus a sorted list of (deadline, id): obviously right, slow."""

    def __init__(self, now: int) -> None:
        self.now = now
        self.deadline: dict[int, int] = {}
        self.order: list[tuple[int, int]] = []

    def add(self, timer_id: int, deadline: int) -> None:
        self.cancel(timer_id)
        self.deadline[timer_id] = deadline
        bisect.insort(self.order, (deadline, timer_id))

    def cancel(self, timer_id: int) -> bool:
        d = self.deadline.pop(timer_id, None)
        if d is None:
            return False
        self.order.remove((d, timer_id))
        return True

    def advance(self, now: int) -> list[tuple[int, int]]:
        if now < self.now:
            return []
        self.now = now
        k = bisect.bisect_right(self.order, (now, 2**64))
        due, self.order = self.order[:k], self.order[k:]
        for _, i in due:
            del self.deadline[i]
        return due


class WheelMachine(RuleBasedStateMachine):
    """Random adds, re-adds, cancels and clock moves; the wheel must match the model."""

    # Module constants to override for the whole run (restored in teardown).
    tuning: ClassVar[dict[str, int]] = {}

    def __init__(self) -> None:
        super().__init__()
        self._saved = {name: getattr(timerwheel, name) for name in self.tuning}
        for name, value in self.tuning.items():
            setattr(timerwheel, name, value)
        self.wheel = TimerWheel()
        self.model = Model(0)

    def teardown(self) -> None:
        for name, value in self._saved.items():
            setattr(timerwheel, name, value)

    @initialize(start=st.sampled_from([0, 1, 63, 64, 4095, EPOCH_NOW, 2**42 - 3, 3 * 2**42 - 70]))
    def start_at(self, start: int) -> None:
        self.wheel = TimerWheel(start)
        self.model = Model(start)

    @rule(timer_id=timer_ids, offset=offsets)
    def add(self, timer_id: int, offset: int) -> None:
        deadline = self.model.now + offset
        self.wheel.add(timer_id, deadline)
        self.model.add(timer_id, deadline)

    @precondition(lambda self: self.model.deadline)
    @rule(pick=st.integers(0, 10**6), offset=offsets)
    def readd_pending(self, pick: int, offset: int) -> None:
        timer_id = sorted(self.model.deadline)[pick % len(self.model.deadline)]
        self.add(timer_id, offset)

    @precondition(lambda self: self.model.deadline)
    @rule(pick=st.integers(0, 10**6), same=st.booleans())
    def cancel_then_readd(self, pick: int, same: bool) -> None:
        timer_id = sorted(self.model.deadline)[pick % len(self.model.deadline)]
        deadline = self.model.deadline[timer_id]
        assert self.wheel.cancel(timer_id)
        self.model.cancel(timer_id)
        deadline = deadline if same else deadline + 1
        self.wheel.add(timer_id, deadline)
        self.model.add(timer_id, deadline)

    @rule(n=st.integers(1, 300), spread=st.sampled_from([64, 4096, 10**6]), seed=st.integers())
    def add_many(self, n: int, spread: int, seed: int) -> None:
        rng = random.Random(seed)
        ids = [rng.randrange(2_000) + 100 for _ in range(n)]
        deadlines = [self.model.now + rng.randrange(-10, spread) for _ in range(n)]
        self.wheel.add_many(ids, deadlines)
        for i, d in zip(ids, deadlines, strict=True):
            self.model.add(i, d)

    @rule(timer_id=timer_ids)
    def cancel(self, timer_id: int) -> None:
        assert self.wheel.cancel(timer_id) == self.model.cancel(timer_id)

    @rule(pick=st.integers(0, 10**6), fraction=st.sampled_from([0.5, 0.9, 1.0]))
    def cancel_most(self, pick: int, fraction: float) -> None:
        rng = random.Random(pick)
        for timer_id in sorted(self.model.deadline):
            if rng.random() < fraction:
                assert self.wheel.cancel(timer_id)
                self.model.cancel(timer_id)

    @rule(step=steps)
    def advance(self, step: int) -> None:
        self._advance_to(self.model.now + step)

    @rule(back=st.integers(1, 10_000))
    def advance_backwards(self, back: int) -> None:
        now = self.wheel.now
        assert self.wheel.advance(now - back) == []
        assert self.wheel.now == now

    @rule()
    def advance_to_next_deadline(self) -> None:
        nd = self.wheel.next_deadline()
        if nd is None:
            return
        fired = self._advance_to(nd)
        after = self.wheel.next_deadline()
        assert fired or after is None or after > nd, (nd, after)

    @precondition(lambda self: self.model.order)
    @rule(delta=st.sampled_from([-1, 0]))
    def advance_to_earliest(self, delta: int) -> None:
        self._advance_to(max(self.model.order[0][0] + delta, self.model.now))

    def _advance_to(self, t: int) -> list[int]:
        before = self.wheel.now
        fired = self.wheel.advance(t)
        expected = self.model.advance(t)
        if t < before:
            assert fired == []
            return fired
        assert self.wheel.now == t
        assert len(fired) == len(set(fired)), "a timer fired twice"
        assert sorted(fired) == sorted(i for _, i in expected)
        deadlines = [d for d, _ in sorted(expected)]
        by_id = {i: d for d, i in expected}
        fired_deadlines = [by_id[i] for i in fired]
        assert fired_deadlines == deadlines, "not in deadline order"
        assert all(d <= t for d in fired_deadlines), "fired early"
        return fired

    @invariant()
    def same_pending(self) -> None:
        model = self.model.deadline
        assert len(self.wheel) == len(model)
        assert dict(self.wheel.items()) == model
        for i in (0, 1, 7, 2**63 - 1):
            assert (i in self.wheel) == (i in model)
            assert self.wheel.deadline_of(i) == model.get(i)

    @invariant()
    def next_deadline_is_never_late(self) -> None:
        nd = self.wheel.next_deadline()
        if not self.model.order:
            assert nd is None
            return
        assert nd is not None
        assert self.wheel.now <= nd <= max(self.model.order[0][0], self.wheel.now)


class TinyThresholdsMachine(WheelMachine):
    """The same, with bulk cascades and compaction kicking in at a handful of timers."""

    tuning: ClassVar[dict[str, int]] = {"_BULK_MIN": 2, "_BULK_MAX": 50, "_COMPACT_FLOOR": 3}


_machine_settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestWheelMatchesModel = WheelMachine.TestCase
TestWheelMatchesModel.settings = _machine_settings
TestWheelMatchesModelTinyThresholds = TinyThresholdsMachine.TestCase
TestWheelMatchesModelTinyThresholds.settings = _machine_settings


# --- unit tests ---------------------------------------------------------------------


def shell_loop(wheel: TimerWheel, limit: int) -> tuple[dict[int, int], int]:
    """Sleep until next_deadline, advance there, repeat: {id: time it fired}, rounds."""
    fired_at: dict[int, int] = {}
    rounds = 0
    while (nd := wheel.next_deadline()) is not None:
        rounds += 1
        assert rounds <= limit, "the shell loop does not make progress"
        for i in wheel.advance(nd):
            assert i not in fired_at
            fired_at[i] = nd
    return fired_at, rounds


def test_past_deadline_fires_on_next_advance() -> None:
    w = TimerWheel(1_000)
    w.add(1, 400)
    w.add(2, 1_000)
    w.add(3, -5)
    assert w.next_deadline() == 1_000
    assert w.advance(1_000) == [3, 1, 2]
    assert len(w) == 0
    assert w.next_deadline() is None


def test_past_deadline_fires_on_a_later_advance_too() -> None:
    w = TimerWheel(1_000)
    w.add(1, 999)
    w.add(2, 1_500)
    assert w.advance(2_000) == [1, 2]


def test_backward_clock_is_clamped() -> None:
    w = TimerWheel(1_000)
    w.add(1, 1_005)
    w.add(2, 900)  # overdue, yet not due at 950: nothing fires on a backward step
    assert w.advance(950) == []
    assert w.now == 1_000
    assert w.advance(1_004) == [2]
    assert w.advance(500) == []
    assert w.now == 1_004
    assert w.advance(1_005) == [1]


def test_five_years_ahead_fires_exactly_at_its_deadline() -> None:
    now = EPOCH_NOW
    deadline = now + 5 * YEAR_MS + 12_345
    w = TimerWheel(now)
    w.add(42, deadline)
    rng = random.Random(5)
    while now < deadline - 86_400_000:  # irregular hops of up to a day
        now += rng.randrange(1, 86_400_000)
        assert w.advance(now) == []
    for t in range(deadline - 3, deadline):
        assert w.advance(t) == []
    assert 42 in w
    assert w.advance(deadline) == [42]
    assert 42 not in w and len(w) == 0


def test_deadline_beyond_the_top_level_overflows_and_still_fires_on_time() -> None:
    w = TimerWheel(2**42 - 10)
    far = [2**42, 2**42 + 1, 2**43 + 5, 200 * YEAR_MS]
    for i, d in enumerate(far):
        w.add(i, d)
    fired, _ = shell_loop(w, limit=200)
    assert fired == {i: d for i, d in enumerate(far)}


@pytest.mark.parametrize("start", [0, 1, 63, 64, 4095, 4096, EPOCH_NOW, 2**42 - 64])
def test_cascade_boundaries_fire_exactly_on_time(start: int) -> None:
    rel = {63, 64, 65, 4095, 4096, 4097}
    rel |= {64**k + e for k in range(1, 7) for e in (-1, 0, 1)}
    # Also the next aligned block boundaries of every level, +-1.
    aligned = {
        ((start >> (6 * k)) + 1 << (6 * k)) + e - start for k in range(1, 8) for e in (-1, 0, 1)
    }
    deadlines = sorted(start + r for r in rel | aligned if r > 0)
    w = TimerWheel(start)
    for i, d in enumerate(deadlines):
        w.add(i, d)
    for i, d in enumerate(deadlines):
        assert w.deadline_of(i) == d
    fired, _ = shell_loop(w, limit=len(deadlines) * 9)
    assert fired == dict(enumerate(deadlines))  # each exactly at its deadline


@pytest.mark.parametrize("start", [0, 4095, EPOCH_NOW])
def test_cascade_boundaries_one_ms_before_is_too_early(start: int) -> None:
    for r in (63, 64, 4095, 4096, 64**3 - 1, 64**3, 64**3 + 1, 64**4):
        w = TimerWheel(start)
        w.add(1, start + r)
        assert w.advance(start + r - 1) == []
        assert w.advance(start + r) == [1]


def test_cancel_then_readd() -> None:
    w = TimerWheel(0)
    w.add(1, 100)
    assert w.cancel(1)
    assert not w.cancel(1)
    assert 1 not in w and len(w) == 0
    w.add(1, 100)  # the same slot again: two entries, one timer
    w.add(2, 50)
    assert w.cancel(2)
    w.add(2, 5_000)  # moved to another level
    assert w.advance(99) == []
    assert w.advance(100) == [1]
    assert w.advance(4_999) == []
    assert w.advance(6_000) == [2]
    assert w.advance(10**9) == []


def test_readd_moves_a_pending_timer() -> None:
    w = TimerWheel(0)
    w.add(1, 10_000)
    w.add(1, 20)
    w.add(1, 30)
    assert w.deadline_of(1) == 30 and len(w) == 1
    assert w.advance(29) == []
    assert w.advance(10_000) == [1]


def test_fired_timers_come_out_in_deadline_order() -> None:
    rng = random.Random(7)
    w = TimerWheel(EPOCH_NOW)
    deadlines = {i: EPOCH_NOW + rng.randrange(-100, 10**7) for i in range(20_000)}
    for i, d in deadlines.items():
        w.add(i, d)
    fired = w.advance(EPOCH_NOW + 10**7)
    assert sorted(fired) == sorted(deadlines)
    assert [deadlines[i] for i in fired] == sorted(deadlines.values())


def test_next_deadline_shell_loop_fires_everything_on_time_in_bounded_rounds() -> None:
    rng = random.Random(11)
    now = EPOCH_NOW
    w = TimerWheel(now)
    deadlines = {}
    for i in range(3_000):
        kind = rng.random()
        if kind < 0.5:
            d = now + rng.randrange(1, 5_000)
        elif kind < 0.9:
            d = now + rng.randrange(1, 10**9)
        else:
            d = now + rng.randrange(1, 6 * YEAR_MS)
        deadlines[i] = d
        w.add(i, d)
    for i in range(0, 3_000, 3):  # and a third cancelled
        assert w.cancel(i)
        del deadlines[i]
    fired, _ = shell_loop(w, limit=len(deadlines) * 9)
    assert fired == deadlines
    assert len(w) == 0


def test_next_deadline_is_exact_at_level_zero_and_for_small_slots() -> None:
    w = TimerWheel(100_000)
    assert w.next_deadline() is None
    w.add(1, 100_500)
    assert w.next_deadline() == 100_500
    w.add(2, 100_010)
    assert w.next_deadline() == 100_010


def test_items_len_contains_deadline_of() -> None:
    w = TimerWheel(10)
    w.add_many([1, 2, 3, 2**63 - 1], [5, 100, 10**12, 10**15])
    w.cancel(3)
    assert sorted(w.items()) == [(1, 5), (2, 100), (2**63 - 1, 10**15)]
    assert len(w) == 3
    assert 2 in w and 3 not in w and "x" not in w and [1] not in w
    assert w.deadline_of(2**63 - 1) == 10**15 and w.deadline_of(3) is None


def test_add_many_rejects_unequal_lengths() -> None:
    w = TimerWheel()
    with pytest.raises(ValueError):
        w.add_many([1, 2], [3])
    assert len(w) == 0


def test_negative_start_is_rejected() -> None:
    with pytest.raises(ValueError):
        TimerWheel(-1)


def test_stale_entries_are_compacted_and_never_fire() -> None:
    w = TimerWheel(0)
    n = 200_000
    w.add_many(list(range(n)), [10**9 + i for i in range(n)])  # far ahead
    for i in range(n - 10):
        w.cancel(i)
    assert w.advance(1) == []  # compaction runs here
    slots = w._slots  # white-box: the stale ids are gone, not just skipped later
    assert sum(len(s) for s in slots) + len(w._due) == 10
    assert w.advance(10**9 + n) == list(range(n - 10, n))


def test_benchmark_smoke(tmp_path: Path) -> None:
    out = tmp_path / "engine.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "engine.py"),
            "--timers",
            "2000",
            "--spread-ms",
            "60000",
            "--mixed-span-ms",
            "60000",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    data = json.loads(out.read_text())
    assert json.loads(proc.stdout) == data
    keys = {"insert_per_s", "cancel_per_s", "expire_per_s", "mixed_ops_per_s", "bytes_per_timer"}
    for name in ("wheel", "heapq", "ratios"):
        assert keys <= set(data[name]), name
        assert all(v > 0 for v in data[name].values())
    assert data["timers"] == 2000
    assert [r["timers"] for r in data["runs"]] == [2000]
