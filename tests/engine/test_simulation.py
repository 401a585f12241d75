"""The shard owner under a simulated fleet, checked against the design's promises.

Each seed runs thousands of jobs over simulated days with worker crashes,
GC-paused workers, slow acks, node restarts rebuilt from the store (some
between a store write and its answer), takeovers (a new owner rebuilt from
the store at once while the workers keep running) and users pausing,
resuming, cancelling, triggering and backfilling (see ``tests/engine/sim.py``).
The run then drains -- workers alive and quick, the clock advanced past every
lease, backoff and grace -- and ``check`` verifies every promise over the
whole history: each fire due before the end is terminal or recorded missed,
none still pending.

Replay one seed: ``WHEEL_SIM_SEED=123 pytest tests/engine/test_simulation.py``.
Stress: ``WHEEL_SIM_SEEDS=50 pytest tests/engine/test_simulation.py`` runs 50
more seeds at the same scale (1,000 on).
"""

from __future__ import annotations

import os

import pytest

from tests.engine.sim import Sim, SimScale, summary
from tests.engine.sim_check import check
from wheel.engine.owner import OwnerConfig

# One seed of the whole fleet in the suite (about 35 s); the restart seeds
# below add four shorter runs. ``WHEEL_SIM_SEEDS`` runs more.
DEFAULT_SEEDS = (1,)
# 1.6 days: past the US spring-forward (day 2, 07:00 UTC) with the quiet end after it.
SCALE = SimScale(jobs=1_000, days=1.6)


def _seeds() -> list[int]:
    if "WHEEL_SIM_SEED" in os.environ:
        return [int(os.environ["WHEEL_SIM_SEED"])]
    extra = int(os.environ.get("WHEEL_SIM_SEEDS", "0"))
    return [*DEFAULT_SEEDS, *range(1_000, 1_000 + extra)]


def sim_executions(s: dict[str, object]) -> int:
    executions = s["executions"]
    assert isinstance(executions, int)
    return executions


def _run(seed: int, scale: SimScale, config: OwnerConfig | None = None) -> Sim:
    sim = Sim(seed, scale, config).run()
    violations = check(sim)
    if violations:
        shown = "\n".join(str(v) for v in violations[:20])
        pytest.fail(
            f"{len(violations)} promise violations with seed {seed} ({summary(sim)}):\n{shown}\n"
            f"replay: WHEEL_SIM_SEED={seed} .venv/bin/pytest tests/engine/test_simulation.py",
            pytrace=False,
        )
    s = summary(sim)
    # The run exercised what it claims to: faults happened, work was done.
    assert sim_executions(s) > 10 * scale.jobs
    assert sim.history.freezes and sim.history.crashes
    return sim


@pytest.mark.parametrize("seed", _seeds())
def test_every_promise_holds_over_a_simulated_fleet(seed: int) -> None:
    _run(seed, SCALE)


# Takeovers are whole loads, due-first loads with the rest added later, and
# planned moves (a staging, the old owner's unsent runs marked).
# Seeds 8 and 10 failed the drain check before a completed one-shot adopted
# after a rebuild was no longer left paused: its lost run's re-dispatch (8) or
# its retry (10) waited forever for a resume. Seed 25: a fixed_delay job's
# first fire came due while a trigger's run was going and vanished.
@pytest.mark.parametrize("seed", [7, 8, 10, 25])
def test_every_promise_holds_across_frequent_node_restarts(seed: int) -> None:
    # A node fault every ~40 minutes: crashes rebuilt from the store, a
    # quarter of them between a store write and its answer, and takeovers,
    # with long outages that exercise every catch-up mode.
    sim = _run(seed, SimScale(jobs=250, days=1, node_restart_every=40 * 60_000))
    assert sim.history.takeovers and sim.history.mid_iteration_crashes
    assert sim.history.due_first
    # Seed 25 pins a trigger's regression; since a retry waits its backoff
    # plus up to a quarter (not a uniform share of it) its faults draw no
    # planned move. Seeds 7, 8 and 10 make them.
    assert sim.history.planned_moves or seed == 25


# The same promises with fires claimed ahead of their time (the node's
# default lead is far under the simulation's one-second tick, and only for
# bursts; this lead spans a tick or two, for every fire): runs still go out
# at their time, never before, through restarts, takeovers and planned moves
# of runs claimed ahead.
@pytest.mark.parametrize("seed", [7, 25])
def test_every_promise_holds_with_fires_claimed_ahead(seed: int) -> None:
    config = OwnerConfig(max_missed_listed=10_000, claim_ahead_ms=1_500, claim_ahead_min=1)
    sim = _run(seed, SimScale(jobs=250, days=1, node_restart_every=40 * 60_000), config)
    ahead = [c for t, _, c, run in sim.store.claims_log if run is not None and t < c.scheduled_for]
    assert len(ahead) > 1_000
