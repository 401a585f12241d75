"""The run table on its own (``wheel.engine.owner._runtable``): the phase
transitions it allows, and how a run's lease waits in the grace FIFO or as
wheel timers. Invariant numbers are the module's."""

from __future__ import annotations

import pytest

from wheel.engine.model import RunState
from wheel.engine.owner import LEASE, TIMEOUT, Phase
from wheel.engine.owner._runtable import _RUN_TRANSITIONS, RunTable, _Run, set_phase
from wheel.engine.timerwheel import TimerWheel

T = 1_000_000
GRACE = 5_000


def _table() -> tuple[RunTable, TimerWheel]:
    wheel = TimerWheel(T)
    return RunTable(wheel), wheel


def _handed_out(table: RunTable, run_id: int, now: int, timeout_ms: int = 60_000) -> _Run:
    run = _Run(run_id, job_id=run_id * 10, scheduled_for=now, attempt=0, fence=1)
    table.add(run)
    set_phase(run, Phase.DISPATCHED)
    run.timeout_deadline = now + timeout_ms
    table.lease(run, now, GRACE)
    return run


@pytest.mark.parametrize("start", list(Phase))
@pytest.mark.parametrize("to", list(Phase))
def test_a_phase_changes_only_along_the_table_invariant_1(start: Phase, to: Phase) -> None:
    run = _Run(1, 1, T, 0, 1)
    run.phase = start
    if (start, to) in _RUN_TRANSITIONS:
        set_phase(run, to)
        assert run.phase is to
    else:
        with pytest.raises(AssertionError, match="illegal run transition"):
            set_phase(run, to)
        assert run.phase is start


def test_runs_handed_out_in_one_tick_share_one_grace_entry_and_no_timer() -> None:
    table, wheel = _table()
    a, b = _handed_out(table, 1, T), _handed_out(table, 2, T)
    assert table.graced == 2 and len(wheel) == 0
    assert not a.armed and not b.armed
    assert table.next_grace() == T + GRACE
    assert sorted(table) == [1, 2] and len(table) == 2 and table[1] is a


def test_a_run_whose_timeout_comes_first_gets_its_own_timers_at_once() -> None:
    table, wheel = _table()
    run = _handed_out(table, 1, T, timeout_ms=GRACE // 2)
    assert run.armed and table.graced == 0
    assert (1 << 2) | LEASE in wheel and (1 << 2) | TIMEOUT in wheel


def test_a_run_in_flight_at_its_grace_deadline_is_armed_invariant_2() -> None:
    table, wheel = _table()
    run = _handed_out(table, 1, T)
    set_phase(run, Phase.RUNNING)
    run.lease_deadline = T + 60_000  # renewed by an ack
    table.expire_grace(T + GRACE - 1)
    assert not run.armed and table.graced == 1
    table.expire_grace(T + GRACE)
    assert run.armed and table.graced == 0 and table.next_grace() is None
    assert wheel.deadline_of((1 << 2) | LEASE) == T + 60_000


def test_a_run_that_ended_in_its_grace_lease_never_touches_the_wheel_invariant_3() -> None:
    table, wheel = _table()
    run = _handed_out(table, 1, T)
    table.ending(run, RunState.SUCCEEDED, "w1")
    assert run.phase is Phase.ENDING and table.graced == 0
    table.expire_grace(T + GRACE)
    assert not run.armed and len(wheel) == 0
    assert (run.end_state, run.reply_to) == (RunState.SUCCEEDED, "w1")


def test_a_run_leaves_the_table_only_when_its_ending_is_answered_invariant_4() -> None:
    table, wheel = _table()
    run = _handed_out(table, 1, T, timeout_ms=10)  # armed
    assert table.ended(1) is None and 1 in table  # not ending: stays
    table.ending(run, RunState.FAILED, None)
    assert (1 << 2) | LEASE not in wheel and (1 << 2) | TIMEOUT not in wheel
    assert table.ended(1) is run and 1 not in table
    assert table.ended(1) is None


def test_a_run_dropped_with_its_shard_leaves_no_timer_and_no_grace_count() -> None:
    table, wheel = _table()
    graced, armed = _handed_out(table, 1, T), _handed_out(table, 2, T, timeout_ms=10)
    table.drop(graced)
    table.drop(armed)
    assert len(table) == 0 and table.graced == 0 and len(wheel) == 0


def test_an_adopted_run_has_its_lease_and_timeout_as_timers() -> None:
    table, wheel = _table()
    run = _Run(1, 10, T, 0, 1)
    run.phase = Phase.RUNNING
    run.lease_deadline = T + 60_000
    table.adopt(run)
    table.time_out_at(run, T + 90_000)
    table.add(run)
    assert run.armed and table.graced == 0
    assert wheel.deadline_of((1 << 2) | LEASE) == T + 60_000
    assert wheel.deadline_of((1 << 2) | TIMEOUT) == T + 90_000
    run.lease_deadline = T + 120_000
    table.renew_timer(run)
    assert wheel.deadline_of((1 << 2) | LEASE) == T + 120_000
