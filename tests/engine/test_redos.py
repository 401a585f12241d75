"""Redos on their own (``wheel.engine.owner._redos``): retries waiting for
their RETRY timer and lost runs' fires waiting for the reaper. Invariant
numbers are the module's."""

from __future__ import annotations

from wheel.engine.owner import RETRY
from wheel.engine.owner._redos import Redo, Redos
from wheel.engine.timerwheel import TimerWheel

T = 1_000_000


def _redos(rate: float = 2.0, burst: float = 2.0) -> tuple[Redos, TimerWheel]:
    wheel = TimerWheel(T)
    return Redos(wheel, rate, burst, T), wheel


def test_a_retry_is_due_once_when_its_timer_goes_off_invariant_1() -> None:
    redos, wheel = _redos()
    redo = Redo(7, T - 60_000, 1)
    redos.retry_at(redo, T + 500)
    [tid] = wheel.advance(T + 500)
    assert tid & 3 == RETRY
    assert redos.retry_due(tid >> 2) == redo
    assert redos.retry_due(tid >> 2) is None


def test_the_reaper_hands_out_in_order_within_its_tokens_invariant_2() -> None:
    redos, _ = _redos(rate=2.0, burst=2.0)
    lost = [Redo(j, T, 1) for j in range(5)]
    for redo in lost:
        redos.reap_later(redo)
    assert redos.reap(T) == lost[:2]
    assert redos.reap(T) == [] and redos.lost() == 3
    wake = redos.next_token_ms(T)
    assert wake is not None and wake > T
    assert redos.reap(T + 1_000) == lost[2:4]


def test_what_is_dropped_is_counted_and_never_due_invariant_3() -> None:
    redos, wheel = _redos()
    redos.retry_at(Redo(1, T, 1), T + 10)
    redos.retry_at(Redo(2, T, 1), T + 10)
    redos.reap_later(Redo(1, T - 5, 2))
    redos.reap_later(Redo(3, T - 5, 2))
    assert redos.drop(lambda job_id: job_id == 1) == 2
    assert sorted(r.job_id for r in redos.waiting()) == [2, 3]
    due = [redos.retry_due(tid >> 2) for tid in wheel.advance(T + 10)]
    assert [r.job_id for r in due if r is not None] == [2]
