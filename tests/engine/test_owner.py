"""The shard owner's rules, one test each (invariants 1-7 of its header, the
run lifecycle table, and the policies it applies).

A small ``Node`` stand-in drives the owner exactly like ``wheel.node`` does
(advance, store writes in order, answers fed back) against the reference
store of ``tests/engine/sim.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

from tests.engine.sim import HOUR, MIN, SEC, RefStore
from wheel.engine.driver import Driver
from wheel.engine.jobtable import PAUSED, ShardJobs, rows_of
from wheel.engine.model import AlertKind, JobState, MissedReason, RunState, shard_of
from wheel.engine.owner import (
    COUNTER_BITS,
    Actions,
    Assignment,
    Outcome,
    Owner,
    OwnerConfig,
    Phase,
    RevokeReason,
    ShardContents,
)
from wheel.engine.profiles import profile_of
from wheel.engine.records import Completion, CompletionOutcome, FireClaim, JobRecord, WriteBatch
from wheel.engine.schedule import compile_schedule
from wheel.engine.spec import (
    CatchUp,
    CatchUpMode,
    Cron,
    DstGap,
    Interval,
    IntervalMode,
    JobSpec,
    Once,
    Overlap,
    OverlapPolicy,
    Retry,
    SideEffect,
)
from wheel.recovery import (
    load_later,
    load_shard_contents,
    restore_owner,
    stage_from_store,
    staged_contents,
)

T = 1_800_000_000_000  # a round start time (ms)


def spec(**kw: object) -> JobSpec:
    base: dict[str, object] = {
        "name": "j",
        "handler": "h",
        "schedule": Interval(period_ms=MIN, start_at_ms=T + MIN),
        "retry": Retry(max_attempts=3, initial_backoff_ms=0, max_backoff_ms=0),
    }
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


class Node:
    """Drives the owner through the ``Driver`` that ``wheel.node.Node`` runs."""

    def __init__(self, config: OwnerConfig | None = None, *, now: int = T, epoch: int = 1) -> None:
        self.store = RefStore()
        self.now = now
        self.config = config or OwnerConfig()
        owner = Owner(epochs={s: epoch for s in range(256)}, now_ms=now, config=self.config)
        self.driver = Driver(owner)
        self.out = Actions()  # messages accumulated since the last take()
        self.silent: set[str] = set()  # workers that stopped heartbeating
        self.lags: list[int] = []  # dispatch lag samples of the runs handed out

    @property
    def owner(self) -> Owner:
        return self.driver.owner

    @property
    def acts(self) -> Actions:
        return self.driver.acts

    def submit(self, s: JobSpec, *, next_run_at: int | None = None) -> int:
        first = next_run_at
        if first is None:
            new = self.driver.new_job(s, None, self.now)
            s, first = new.spec, new.next_run_at  # as the node stores it
        record = self.store.submit_job(s, self.now, first)
        self.driver.submitted(record, self.now)
        return record.job_id

    def restart(self) -> None:
        """The node dies (its owner's memory is gone) and starts from the store."""
        epoch = max(self.store.epochs.values(), default=1) + 1
        self.store.epochs = dict.fromkeys(range(256), epoch)
        restored = restore_owner(
            self.store,
            None,
            epochs=dict(self.store.epochs),
            config=self.config,
            now_ms=self.now,
        )
        self.driver = Driver(restored.owner, restored.actions)

    def hello(self, worker: str = "w1", capacity: int = 10, handlers: tuple[str, ...] = ()) -> None:
        self.owner.worker_hello(
            worker, capacity, ["default"], self.now, self.acts, handlers=handlers
        )

    def step(self, to: int | None = None) -> Actions:
        """Advance the clock (if given) and run loop iterations until quiet."""
        if to is not None:
            assert to >= self.now
            # Healthy workers heartbeat every lease/3 on the way (not the silent ones).
            while self.now + self.config.heartbeat_interval_ms < to:
                self.now += self.config.heartbeat_interval_ms
                self._heartbeats()
                self._iterate()
            self.now = to
            self._heartbeats()
        self._iterate()
        return self.take()

    def _heartbeats(self) -> None:
        for wid, w in list(self.owner.workers.items()):
            if wid not in self.silent and w.held:
                refs = [(r, self.owner.runs[r].fence) for r in w.held if r in self.owner.runs]
                self.owner.worker_heartbeat(wid, refs, self.now, self.acts)

    def _iterate(self) -> None:
        # Until a pass does nothing: the node wakes again within max_idle, so
        # work queued by answers (a retry, a buffered fire) goes out then.
        self._pass()
        self._pass()

    def _pass(self) -> None:
        driver = self.driver
        for _ in range(100):
            driver.advance(self.now)
            batch = driver.take_batch()
            self.store.now_ms = self.now
            driver.apply(self.store.write_batch(batch), self.now)
            self._collect(batch)
            if not driver.has_store_work():
                break

    def _collect(self, work: WriteBatch) -> None:
        o, acts = self.out, self.driver.take_messages()
        o.claims += work.claims
        o.missed += work.missed
        o.completions += work.completions
        o.advances += work.advances
        for name in ("assignments", "revokes", "results", "rejected_renewals", "violations"):
            mine, theirs = getattr(o, name), getattr(acts, name)
            for k, v in theirs.items():
                mine.setdefault(k, []).extend(v)
        o.alerts += acts.alerts
        o.notes += acts.notes
        self.lags += acts.lags

    def take(self) -> Actions:
        out, self.out = self.out, Actions()
        return out

    def run_once(self, job_id: int, at: int, worker: str = "w1", *, ack: bool = True) -> Assignment:
        """Step to ``at``; the one assignment of the job (acked unless told not to)."""
        acts = self.step(at)
        [a] = [a for a in acts.assignments.get(worker, []) if a.job_id == job_id]
        if ack:
            self.owner.worker_ack(worker, [(a.run_id, a.fence)], self.now, self.acts)
            self.step()
        return a

    def complete(
        self, a: Assignment, outcome: Outcome = Outcome.SUCCEEDED, worker: str = "w1"
    ) -> Actions:
        self.owner.worker_complete(worker, [(a.run_id, a.fence, outcome, "")], self.now, self.acts)
        return self.step()

    def missed(self, job_id: int) -> dict[int, MissedReason]:
        return {f: m.reason for (j, f), m in self.store.missed.items() if j == job_id}

    def execs(self, job_id: int) -> list[tuple[int, int, RunState]]:
        return sorted(
            (e.scheduled_for, e.attempt, e.state)
            for e in self.store.execs.values()
            if e.job_id == job_id
        )


# -- invariants ----------------------------------------------------------------------


def test_1_a_fire_that_comes_due_during_a_run_is_recorded_missed_not_dropped() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec())
    a = n.run_once(j, T + MIN)
    n.step(T + 2 * MIN)  # the first run is still going; overlap policy skip
    assert n.missed(j) == {T + 2 * MIN: MissedReason.OVERLAP}
    n.complete(a)
    assert n.execs(j) == [(T + MIN, 0, RunState.SUCCEEDED)]
    assert n.store.jobs[j].next_run_at == T + 3 * MIN


def test_2_never_early_not_even_by_a_millisecond_and_jitter_delays_the_due_time() -> None:
    n = Node()
    n.hello()
    s = spec(jitter_ms=20 * SEC)
    j = n.submit(s)
    due = compile_schedule(s.schedule, jitter_ms=s.jitter_ms, job_id=j).jittered(T + MIN)
    assert due > T + MIN
    assert not n.step(due - 1).claims
    [claim] = n.step(due).claims
    assert claim.scheduled_for == T + MIN and claim.dispatched_at_ms == due
    # A jitter beyond overdue_after_ms is not lateness: no catch-up, no missed record.
    assert n.missed(j) == {}


def test_2_a_restart_from_the_store_never_runs_a_jittered_fire_early() -> None:
    # The store's row has the fire's nominal time; the restarted owner arms
    # it there without parsing the spec, and must apply the jitter when the
    # job wakes, whether its timer wakes it or something else does first.
    for woken_early in (False, True):
        n = Node()
        s = spec(jitter_ms=20 * SEC)
        j = n.submit(s)
        due = compile_schedule(s.schedule, jitter_ms=s.jitter_ms, job_id=j).jittered(T + MIN)
        assert due > T + MIN
        n.restart()
        n.hello()
        if woken_early:
            assert n.owner.next_fires(j, 1) == [T + MIN]
        assert not n.step(T + MIN).claims
        assert not n.step(due - 1).claims
        [claim] = n.step(due).claims
        assert claim.scheduled_for == T + MIN and claim.dispatched_at_ms == due


def test_a_job_whose_stored_spec_cannot_be_loaded_is_skipped_not_fatal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    n = Node()
    n.hello()
    good = n.submit(spec())
    bad = n.submit(spec())
    n.restart()
    n.hello()
    # As if the stored profile were one this version rejects.
    rejected = replace(spec(), name="", schedule=Cron(expr="not a cron"))
    number = n.owner.profiles.add(profile_of(rejected))
    table = n.owner.shard_map[shard_of(bad)].table
    table.prof[table.find(bad)] = number
    [claim] = n.step(T + MIN).claims
    assert claim.job_id == good
    assert f"job {bad} could not be loaded" in caplog.text
    assert not n.owner.has_job(bad)


def test_3_claims_carry_the_store_schedule_as_the_cas_expected_value() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec())
    [c1] = n.step(T + MIN).claims
    assert (c1.expected_next_run_at, c1.new_next_run_at) == (T + MIN, T + 2 * MIN)
    n.complete(_assignment(n, c1.fence))
    [c2] = n.step(T + 2 * MIN).claims
    assert (c2.expected_next_run_at, c2.new_next_run_at) == (T + 2 * MIN, T + 3 * MIN)
    assert n.store.jobs[j].next_run_at == T + 3 * MIN


def test_3_a_claimed_buffered_fire_moves_the_schedule_only_to_the_next_buffered_one() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(overlap=Overlap(policy=OverlapPolicy.BUFFER_ALL, max_buffered=5)))
    a = n.run_once(j, T + MIN)
    n.step(T + 2 * MIN)
    n.step(T + 3 * MIN)  # two fires buffered behind the run
    assert n.store.jobs[j].next_run_at == T + 2 * MIN
    acts = n.complete(a)
    [claim] = acts.claims
    assert claim.scheduled_for == T + 2 * MIN
    # Not past T+3min, still buffered: a restart now must find it in the store.
    assert claim.new_next_run_at == T + 3 * MIN
    assert n.store.jobs[j].next_run_at == T + 3 * MIN


def test_1_a_fire_skipped_behind_a_buffered_one_is_recorded_when_the_schedule_passes_it() -> None:
    # buffer_all with room for one: T+2min waits behind the run, T+3min is skipped.
    n = Node()
    n.hello()
    j = n.submit(
        spec(
            overlap=Overlap(policy=OverlapPolicy.BUFFER_ALL, max_buffered=1),
            catch_up=CatchUp(mode=CatchUpMode.RUN_ALL),
        )
    )
    a = n.run_once(j, T + MIN)
    n.step(T + 2 * MIN)
    n.step(T + 3 * MIN)
    # next_run_at still says T+2min (buffered, not claimed): a missed record
    # of T+3min now would be ahead of the schedule, and a restart from the
    # store would catch up through T+3min and run it after all.
    assert n.store.jobs[j].next_run_at == T + 2 * MIN
    assert n.missed(j) == {}
    acts = n.complete(a)
    assert [c.scheduled_for for c in acts.claims] == [T + 2 * MIN]
    assert n.store.jobs[j].next_run_at == T + 4 * MIN
    assert n.missed(j) == {T + 3 * MIN: MissedReason.OVERLAP}


def test_1_a_restart_never_runs_a_fire_already_recorded_missed() -> None:
    n = Node()
    n.hello()
    j = n.submit(
        spec(
            overlap=Overlap(policy=OverlapPolicy.BUFFER_ALL, max_buffered=1),
            catch_up=CatchUp(mode=CatchUpMode.RUN_ALL),
        )
    )
    a = n.run_once(j, T + MIN)
    n.step(T + 2 * MIN)
    n.step(T + 3 * MIN)  # T+2min buffered, T+3min skipped
    n.restart()
    n.hello()
    n.owner.worker_heartbeat("w1", [(a.run_id, a.fence)], n.now, n.acts)
    acts = n.complete(a)
    for k in range(1, 30):
        for b in acts.assignments.get("w1", []):
            n.complete(b)
        acts = n.step(T + 3 * MIN + k * SEC)
    ran = {f for f, _, _ in n.execs(j)}
    assert not ran & set(n.missed(j)), (n.execs(j), n.missed(j))
    assert {T + MIN, T + 2 * MIN, T + 3 * MIN} <= ran | set(n.missed(j))


def test_3_a_schedule_advance_never_overtakes_the_claim_it_follows() -> None:
    # The node writes a pass's advances before its claims. A claim made when a
    # worker says hello, then an overlap skip in the same pass, used to send an
    # advance whose expected value the claim had not written yet: it failed,
    # and the owner went on believing the store had moved.
    n = Node()
    j = n.submit(spec())
    n.step(T + MIN)  # no worker yet: T+1min waits
    n.now = T + 2 * MIN
    n.hello()  # claims T+1min (next_run_at T+1min -> T+2min)
    n.step()  # T+2min comes due while T+1min is in flight: skipped
    assert n.store.jobs[j].next_run_at == T + 3 * MIN
    assert n.missed(j) == {T + 2 * MIN: MissedReason.OVERLAP}
    assert [m.new for m in n.store.moves] == [T + 2 * MIN, T + 3 * MIN]


def test_3_a_schedule_moved_by_the_store_drops_buffered_fires_of_the_old_one() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(overlap=Overlap(policy=OverlapPolicy.BUFFER_ALL, max_buffered=5)))
    a = n.run_once(j, T + MIN)
    n.step(T + 2 * MIN)  # buffered behind the run
    # Another writer moved the schedule past T+2min (the store wins).
    n.store.jobs[j].next_run_at = T + 3 * MIN
    n.owner.upsert_job(n.store.get_job(j), n.now, n.acts)
    n.complete(a)
    n.step(T + 3 * MIN)
    claimed = [c.scheduled_for for _, _, c, _ in n.store.claims_log]
    assert claimed == [T + MIN, T + 3 * MIN]  # T+2min is not ours any more
    assert all(m.new > m.old for m in n.store.moves if m.new and m.old), n.store.moves


# A node reads the store (its change feed; a re-read asked for by another
# member's word of a submit) in the same round as it sends a batch, on
# another thread: the read's snapshot may come before the batch commits,
# and its rows are applied after the owner made the batch's writes.


def _claim_with_a_stale_row(n: Node, j: int, fire: int, *, answered: bool) -> int:
    """Claim ``fire`` as the node does, applying the job's row as the store
    had it before the claim (next_run_at at ``fire``) while the claim is on
    its way (``answered`` False) or after its answer. Returns its fence."""
    stale = n.store.get_job(j)
    assert stale.next_run_at == fire
    n.now = fire
    driver = n.driver
    driver.advance(n.now)
    batch = driver.take_batch()
    [claim] = batch.claims
    assert claim.scheduled_for == fire
    if not answered:
        driver.apply_changes([stale], n.now)
    n.store.now_ms = n.now
    driver.apply(n.store.write_batch(batch), n.now)
    n._collect(batch)
    if answered:
        driver.apply_changes([stale], n.now)
    return claim.fence


def test_3_a_row_read_before_a_claim_committed_never_brings_the_claimed_fire_back() -> None:
    # Seen in a chaos run: a cron job's fire S was claimed and run, and its
    # row read before the claim committed (next_run_at still S) re-armed S,
    # which came due again while its own run was going and was recorded
    # missed (overlap): one fire both run and missed.
    for answered in (False, True):
        n = Node()
        n.hello()
        j = n.submit(spec())
        fence = _claim_with_a_stale_row(n, j, T + MIN, answered=answered)
        n.take()
        fx = n.step(T + MIN + 19)
        assert not fx.claims and not fx.missed, answered
        assert n.missed(j) == {}, answered
        assert n.store.jobs[j].next_run_at == T + 2 * MIN
        assert n.owner.next_fires(j, 1) == [T + 2 * MIN]
        # Nor does the stale row cost the next fire.
        n.complete(_assignment(n, fence))
        assert [c.scheduled_for for c in n.step(T + 2 * MIN).claims] == [T + 2 * MIN]
        assert n.missed(j) == {}
        assert [f for f, _, _ in n.execs(j)] == [T + MIN, T + 2 * MIN]


def test_1_a_row_read_before_a_schedule_advance_committed_never_runs_the_fire_it_passed() -> None:
    # The reverse: a fire skipped behind the running one is recorded missed
    # as the advance moves next_run_at past it; the row read before that
    # advance landed must not arm it again, or, once the run is over, it
    # runs: a fire both missed and run. (Every 2 s, as the chaos run's job:
    # it stays awake between its fires.)
    p = 2 * SEC
    n = Node()
    n.hello()
    j = n.submit(spec(schedule=Interval(period_ms=p, start_at_ms=T + p)))
    a = n.run_once(j, T + p)
    stale = n.store.get_job(j)
    assert stale.next_run_at == T + 2 * p
    n.step(T + 2 * p)
    assert n.missed(j) == {T + 2 * p: MissedReason.OVERLAP}
    assert n.store.jobs[j].next_run_at == T + 3 * p
    n.complete(a)
    n.driver.apply_changes([stale], n.now)
    assert not n.step(T + 2 * p + 19).claims
    assert n.owner.next_fires(j, 1) == [T + 3 * p]
    assert [c.scheduled_for for c in n.step(T + 3 * p).claims] == [T + 3 * p]
    assert [f for f, _, _ in n.execs(j)] == [T + p, T + 3 * p]
    assert n.missed(j) == {T + 2 * p: MissedReason.OVERLAP}


def test_3_a_stale_row_never_drops_a_buffered_fire() -> None:
    # buffer_one: T+2min waits behind the running T+1min; a row read before
    # T+1min's claim committed must leave it waiting, not drop it.
    n = Node()
    n.hello()
    j = n.submit(spec(overlap=Overlap(policy=OverlapPolicy.BUFFER_ONE)))
    fence = _claim_with_a_stale_row(n, j, T + MIN, answered=True)
    n.step(T + 2 * MIN)  # buffered behind the run
    n.driver.apply_changes([replace(n.store.get_job(j), next_run_at=T + MIN)], n.now)
    fx = n.complete(_assignment(n, fence))
    assert [c.scheduled_for for c in fx.claims] == [T + 2 * MIN]
    n.step(T + 2 * MIN + 19)
    assert [f for f, _, _ in n.execs(j)] == [T + MIN, T + 2 * MIN]
    assert n.missed(j) == {}
    assert n.store.jobs[j].next_run_at == T + 3 * MIN


def _assignment(n: Node, fence: int) -> Assignment:
    ex = next(e for e in n.store.execs.values() if e.fence == fence)
    run = n.owner.runs[ex.run_id]
    return Assignment(
        run_id=ex.run_id,
        job_id=ex.job_id,
        handler="h",
        tenant="default",
        scheduled_for=ex.scheduled_for,
        attempt=ex.attempt,
        fence=run.fence,
        payload=b"",
        lease_ms=0,
        timeout_ms=0,
    )


def test_4_ack_renewal_and_completion_only_from_the_holder_with_its_fence() -> None:
    n = Node()
    n.hello("w1")
    n.hello("w2")
    j = n.submit(spec())
    acts = n.step(T + MIN)
    [(holder, [a])] = list(acts.assignments.items())
    other = "w2" if holder == "w1" else "w1"
    n.owner.worker_ack(other, [(a.run_id, a.fence)], n.now, n.acts)
    n.owner.worker_ack(holder, [(a.run_id, a.fence + 1)], n.now, n.acts)
    n.owner.worker_heartbeat(other, [(a.run_id, a.fence)], n.now, n.acts)
    n.owner.worker_complete(other, [(a.run_id, a.fence, Outcome.SUCCEEDED, "")], n.now, n.acts)
    n.owner.worker_complete(holder, [(a.run_id, a.fence - 1, Outcome.SUCCEEDED, "")], n.now, n.acts)
    acts = n.step()
    assert len(acts.violations[other]) == 1 and len(acts.violations[holder]) == 1
    assert all(v.code == "FAILED_PRECONDITION" for vs in acts.violations.values() for v in vs)
    assert acts.rejected_renewals[other] == [(a.run_id, a.fence)]
    assert [r.accepted for rs in acts.results.values() for r in rs] == [False, False]
    # Nothing else changed: no store write, the run is still dispatched to its holder.
    assert not acts.completions and not acts.claims
    run = n.owner.runs[a.run_id]
    assert (run.phase, run.worker_id) == (Phase.DISPATCHED, holder)
    assert n.execs(j) == [(T + MIN, 0, RunState.DISPATCHED)]


def test_4_the_store_rejects_a_stale_fence_even_if_the_owner_would_not() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec())
    a = n.run_once(j, T + MIN)
    # A second claim of the same fire with a newer fence (another owner's retry).
    n.store.claim_fires(
        [
            _claim(j, T + MIN, attempt=1, fence=a.fence + 10),
        ]
    )
    acts = n.complete(a)
    assert acts.results["w1"][0].accepted is False
    assert n.execs(j)[0] == (T + MIN, 0, RunState.RUNNING)


def _claim(job_id: int, fire: int, *, attempt: int, fence: int):  # type: ignore[no-untyped-def]
    from wheel.engine.records import FireClaim

    return FireClaim(
        job_id=job_id,
        scheduled_for=fire,
        attempt=attempt,
        fence=fence,
        dispatched_at_ms=fire,
        advance=False,
    )


def test_5_fences_strictly_increase_and_carry_the_epoch() -> None:
    n = Node(epoch=7)
    n.hello(capacity=100)
    for _ in range(20):
        n.submit(spec())
    claims = n.step(T + MIN).claims
    assert len(claims) == 20
    assert all(c.fence >> COUNTER_BITS == 7 for c in claims)
    by_shard: dict[int, list[int]] = {}
    for c in claims:
        by_shard.setdefault(shard_of(c.job_id), []).append(c.fence)
    for fences in by_shard.values():
        assert fences == sorted(set(fences))  # strictly increasing within a shard


def test_6_a_retry_is_claimed_only_after_the_failed_attempt_is_terminal_in_the_store() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec())
    a = n.run_once(j, T + MIN)
    acts = n.complete(a, Outcome.RETRYABLE)
    [done] = acts.completions
    assert done.state is RunState.FAILED
    [retry] = acts.claims  # backoff 0: same iteration, after the completion was applied
    assert retry.attempt == 1 and retry.fence > a.fence and not retry.advance
    assert [s for _, _, s in n.execs(j)] == [RunState.FAILED, RunState.DISPATCHED]


def test_6_allow_runs_up_to_max_concurrent_and_skips_beyond() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(overlap=Overlap(policy=OverlapPolicy.ALLOW, max_concurrent=2)))
    n.step(T + MIN)
    n.step(T + 2 * MIN)
    n.step(T + 3 * MIN)
    assert len(n.execs(j)) == 2
    assert n.missed(j) == {T + 3 * MIN: MissedReason.OVERLAP}


def test_7_a_run_leaves_only_after_the_store_applied_its_terminal_state() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec())
    a = n.run_once(j, T + MIN)
    n.owner.worker_complete("w1", [(a.run_id, a.fence, Outcome.SUCCEEDED, "")], n.now, n.acts)
    assert n.owner.runs[a.run_id].phase is Phase.ENDING
    assert n.acts.completions[0].state is RunState.SUCCEEDED
    n.step()
    assert a.run_id not in n.owner.runs
    assert n.execs(j) == [(T + MIN, 0, RunState.SUCCEEDED)]


# -- the run lifecycle -------------------------------------------------------------------


def test_dispatch_grants_the_grace_lease_and_the_ack_the_full_lease() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(timeout_ms=HOUR))
    a = n.run_once(j, T + MIN, ack=False)
    assert a.lease_ms == n.config.grace_lease_ms
    run = n.owner.runs[a.run_id]
    assert (run.phase, run.lease_deadline) == (Phase.DISPATCHED, T + MIN + n.config.grace_lease_ms)
    n.now += 1_000
    n.owner.worker_ack("w1", [(a.run_id, a.fence)], n.now, n.acts)
    n.step()
    assert (run.phase, run.lease_deadline) == (Phase.RUNNING, n.now + n.config.lease_ms)
    assert n.execs(j) == [(T + MIN, 0, RunState.RUNNING)]


def test_an_unacked_run_loses_its_grace_lease_and_is_redispatched() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec())
    a = n.run_once(j, T + MIN, ack=False)
    n.silent.add("w1")
    n.hello("w2")
    acts = n.step(T + MIN + n.config.grace_lease_ms)
    assert acts.revokes["w1"][0].reason is RevokeReason.LEASE_EXPIRED
    assert [c.attempt for c in acts.claims] == [1]
    # The worker that let its lease lapse gets nothing until it speaks again.
    assert [b.attempt for b in acts.assignments["w2"]] == [1] and "w1" not in acts.assignments
    assert n.execs(j)[0] == (T + MIN, 0, RunState.LOST)
    # The slow worker's late ack is refused.
    n.owner.worker_ack("w1", [(a.run_id, a.fence)], n.now, n.acts)
    assert n.step().violations["w1"]


def test_runs_that_end_within_their_grace_lease_never_touch_the_wheel() -> None:
    n = Node()
    n.hello(capacity=100)
    jobs = [n.submit(spec(schedule=Once(at_ms=T + MIN), timeout_ms=HOUR)) for _ in range(50)]
    n.step(T)  # the jobs at rest get their FIRE timers, a minute ahead
    timers = len(n.owner.wheel)
    assert timers == 50
    acts = n.step(T + MIN)
    handed = acts.assignments["w1"]
    assert sorted(a.job_id for a in handed) == jobs
    # No LEASE or TIMEOUT timer each: one grace deadline for the tick.
    assert len(n.owner.wheel) == timers - 50
    assert n.owner.pending_timers() == len(n.owner.wheel) + 50
    assert n.owner.next_timer() == T + MIN + n.config.grace_lease_ms
    n.owner.worker_complete(
        "w1", [(a.run_id, a.fence, Outcome.SUCCEEDED, "") for a in handed], n.now, n.acts
    )
    n.step()
    assert n.owner.pending_timers() == len(n.owner.wheel) == timers - 50
    assert [s for j in jobs for _, _, s in n.execs(j)] == [RunState.SUCCEEDED] * 50
    # Their grace deadline passes with nothing left to expire.
    acts = n.step(T + MIN + n.config.grace_lease_ms)
    assert not acts.revokes and not acts.claims and n.owner.next_timer() is None


def test_a_run_handed_out_with_an_earlier_now_still_loses_its_grace_lease_on_time() -> None:
    n = Node()
    n.hello(capacity=10)
    a, b = (n.submit(spec(schedule=Once(at_ms=T + MIN), timeout_ms=HOUR)) for _ in range(2))
    n.owner.advance(T + MIN, n.acts)
    claimed = n.store.claim_fires(n.acts.take_store_work().claims)
    # The store's answers come back out of clock order: the second is fed
    # with an earlier now than the first, so its grace deadline is earlier.
    n.owner.on_claimed(claimed[:1], T + MIN + 10, n.acts)
    n.owner.on_claimed(claimed[1:], T + MIN, n.acts)
    assert {x.job_id for x in n.acts.assignments["w1"]} == {a, b}
    n.acts.assignments.clear()
    n.now = T + MIN + 10
    n.silent.add("w1")
    assert n.owner.next_timer() == T + MIN + n.config.grace_lease_ms
    first = n.step(T + MIN + n.config.grace_lease_ms)
    assert [r.reason for r in first.revokes["w1"]] == [RevokeReason.LEASE_EXPIRED]
    second = n.step(T + MIN + 10 + n.config.grace_lease_ms)
    assert [r.reason for r in second.revokes["w1"]] == [RevokeReason.LEASE_EXPIRED]
    assert first.revokes["w1"][0].run_id != second.revokes["w1"][0].run_id


def test_a_timeout_shorter_than_the_grace_lease_fires_on_time() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(timeout_ms=2 * SEC, schedule=Once(at_ms=T + MIN)))
    a = n.run_once(j, T + MIN)
    assert not n.step(T + MIN + 2 * SEC - 1).revokes
    acts = n.step(T + MIN + 2 * SEC)
    assert acts.revokes["w1"][0].reason is RevokeReason.TIMED_OUT
    assert n.execs(j)[0] == (T + MIN, 0, RunState.TIMED_OUT)
    assert acts.assignments["w1"][0].attempt == a.attempt + 1


def test_heartbeats_renew_the_lease_and_silence_loses_it() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(timeout_ms=HOUR, schedule=Once(at_ms=T + MIN)))
    a = n.run_once(j, T + MIN)
    n.owner.worker_ack("w1", [(a.run_id, a.fence)], n.now, n.acts)
    for k in range(1, 10):  # 9 heartbeats, each within a lease of the last
        n.step(T + MIN + k * n.config.heartbeat_interval_ms)
        n.owner.worker_heartbeat("w1", [(a.run_id, a.fence)], n.now, n.acts)
    assert n.step().claims == [] and n.execs(j) == [(T + MIN, 0, RunState.RUNNING)]
    n.silent.add("w1")
    n.hello("w2")
    acts = n.step(n.now + n.config.lease_ms)
    assert acts.revokes["w1"][0].reason is RevokeReason.LEASE_EXPIRED
    assert n.execs(j)[0][2] is RunState.LOST and acts.claims[0].attempt == 1


def test_a_claimed_run_whose_worker_left_waits_ready_for_another() -> None:
    n = Node()
    n.hello("w1")
    j = n.submit(spec())
    n.owner.advance(T + MIN, n.acts)  # the claim is on its way to the store
    n.now = T + MIN
    n.owner.worker_disconnect("w1")
    acts = n.step()
    assert not acts.assignments
    [run] = n.owner.runs.values()
    assert run.phase is Phase.READY
    n.hello("w2")
    acts = n.step()
    assert [a.job_id for a in acts.assignments["w2"]] == [j]
    assert n.owner.runs[run.run_id].phase is Phase.DISPATCHED  # the same run, handed out now


def test_timeout_revokes_and_retries_then_dead_letters_on_the_last_attempt() -> None:
    n = Node()
    n.hello()
    j = n.submit(
        spec(
            timeout_ms=10 * SEC, retry=Retry(max_attempts=2, initial_backoff_ms=0, max_backoff_ms=0)
        )
    )
    a = n.run_once(j, T + MIN)
    n.owner.worker_ack("w1", [(a.run_id, a.fence)], n.now, n.acts)
    acts = n.step(T + MIN + 10 * SEC)
    assert acts.revokes["w1"][0].reason is RevokeReason.TIMED_OUT
    [retry] = acts.assignments["w1"]
    assert retry.attempt == 1 and retry.idempotency_key == a.idempotency_key
    n.owner.worker_ack("w1", [(retry.run_id, retry.fence)], n.now, n.acts)
    acts = n.step(n.now + 10 * SEC)
    assert [s for _, _, s in n.execs(j)] == [RunState.TIMED_OUT, RunState.DEAD_LETTERED]
    [alert] = [x for x in acts.alerts if x.kind is AlertKind.DEAD_LETTERED]
    assert "dead-lettered" in alert.message
    assert (alert.job_id, alert.run_id, alert.fence) == (j, retry.run_id, retry.fence)


def test_an_at_most_once_run_is_never_redispatched_once_handed_out() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(side_effect=SideEffect.AT_MOST_ONCE, timeout_ms=10 * SEC))
    a = n.run_once(j, T + MIN, ack=False)
    n.silent.add("w1")
    n.hello("w2")
    acts = n.step(T + MIN + n.config.grace_lease_ms)  # lease lost: outcome unknown
    assert n.execs(j) == [(T + MIN, 0, RunState.UNKNOWN)] and not acts.claims
    [alert] = acts.alerts
    assert alert.kind is AlertKind.OUTCOME_UNKNOWN and "at_most_once" in alert.message
    assert (alert.job_id, alert.run_id, alert.worker) == (j, a.run_id, "w1")
    n.silent.clear()
    b = n.run_once(j, T + 2 * MIN, "w2", ack=False)
    n.owner.worker_ack("w2", [(b.run_id, b.fence)], n.now, n.acts)
    acts = n.step(T + 2 * MIN + 10 * SEC)  # timed out: may have run, not retried
    assert n.execs(j)[1] == (T + 2 * MIN, 0, RunState.DEAD_LETTERED) and not acts.claims
    del a


def test_cancel_during_a_run_revokes_it_and_records_it_cancelled() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec())
    a = n.run_once(j, T + MIN)
    updated = n.store.set_job_state(j, JobState.CANCELLED, next_run_at=None, now_ms=n.now)
    n.owner.cancel_job(j, n.acts)
    n.owner.upsert_job(updated, n.now, n.acts)
    acts = n.step()
    assert acts.revokes["w1"][0].reason is RevokeReason.CANCELLED
    assert n.execs(j) == [(T + MIN, 0, RunState.CANCELLED)]
    assert not n.step(T + HOUR).claims and j not in n.owner.jobs
    acts = n.complete(a)  # the worker finishes anyway: refused
    assert acts.results["w1"][0].accepted is False


def test_cancel_records_fires_that_were_queued_or_buffered_as_cancelled() -> None:
    n = Node()
    n.hello(capacity=1)
    j = n.submit(spec(overlap=Overlap(policy=OverlapPolicy.BUFFER_ONE)))
    n.run_once(j, T + MIN)
    n.step(T + 2 * MIN)  # buffered behind the run
    k = n.submit(spec(schedule=Interval(period_ms=MIN, start_at_ms=T + 3 * MIN)))
    n.step(T + 3 * MIN)  # k's fire waits for the busy worker; j's is skipped
    assert n.owner.backlog() == (1, 0)
    for job_id in (j, k):
        n.store.set_job_state(job_id, JobState.CANCELLED, next_run_at=None, now_ms=n.now)
        n.owner.cancel_job(job_id, n.acts, n.now)
    n.step()
    assert n.missed(j) == {T + 2 * MIN: MissedReason.CANCELLED, T + 3 * MIN: MissedReason.OVERLAP}
    assert n.missed(k) == {T + 3 * MIN: MissedReason.CANCELLED}
    assert n.execs(k) == []


def test_pause_records_fires_as_paused_and_resume_starts_from_now_without_a_burst() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec())
    n.complete(n.run_once(j, T + MIN))
    n.now = T + MIN + 30 * SEC
    paused = n.store.set_job_state(j, JobState.PAUSED, next_run_at=None, now_ms=n.now)
    n.owner.upsert_job(paused, n.now, n.acts)
    assert not n.step(T + 10 * MIN).claims
    resume_at = T + 10 * MIN + 30 * SEC
    n.now = resume_at
    record = n.store.get_job(j)
    nxt = compile_schedule(record.spec.schedule, jitter_ms=0, job_id=j).next_fire(resume_at)
    updated = n.store.set_job_state(j, JobState.ACTIVE, next_run_at=nxt, now_ms=resume_at)
    n.owner.upsert_job(updated, resume_at, n.acts)
    n.owner.record_paused_fires(j, record.updated_at_ms, resume_at, n.acts)
    acts = n.step()
    assert not acts.claims  # no burst of the nine fires missed while paused
    assert n.missed(j) == {T + k * MIN: MissedReason.PAUSED for k in range(2, 11)}
    assert [c.scheduled_for for c in n.step(T + 11 * MIN).claims] == [T + 11 * MIN]


def test_pausing_after_the_nominal_time_of_a_jittered_fire_records_it() -> None:
    n = Node()
    n.hello()
    s = spec(jitter_ms=30 * SEC)
    j = n.submit(s)
    due = compile_schedule(s.schedule, jitter_ms=s.jitter_ms, job_id=j).jittered(T + MIN)
    n.step(T + MIN)
    n.now = (T + MIN + due) // 2 if due > T + MIN + 1 else T + MIN
    paused = n.store.set_job_state(j, JobState.PAUSED, next_run_at=None, now_ms=n.now)
    n.owner.upsert_job(paused, n.now, n.acts)
    n.step()
    assert n.missed(j) == {T + MIN: MissedReason.PAUSED}


def test_trigger_runs_now_with_its_own_fire_time_and_leaves_the_schedule_alone() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec())
    n.now = T + 10 * SEC
    at = n.owner.trigger(j, n.now, n.acts)
    [c] = n.step().claims
    assert (c.scheduled_for, c.advance) == (at, False)
    assert n.store.jobs[j].next_run_at == T + MIN


def test_backfill_runs_past_fires_as_overdue_work_without_moving_the_schedule() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(overlap=Overlap(policy=OverlapPolicy.ALLOW, max_concurrent=5)))
    n.owner.backfill(j, [T - 3 * MIN, T - 2 * MIN], n.now, n.acts)
    acts = n.step()
    assert sorted(c.scheduled_for for c in acts.claims) == [T - 3 * MIN, T - 2 * MIN]
    assert all(not c.advance for c in acts.claims)
    assert n.store.jobs[j].next_run_at == T + MIN


def test_a_trigger_is_claimed_at_once_without_credit_and_survives_a_restart() -> None:
    n = Node()
    j = n.submit(spec())
    n.now = T + 10 * SEC
    acts = Actions()
    n.owner.claim_now(j, [n.now], n.now, acts)  # no worker at all yet
    [claim] = acts.claims
    assert (claim.scheduled_for, claim.attempt, claim.advance) == (n.now, 0, False)
    n.owner.on_claimed(n.store.claim_fires(acts.claims), n.now, n.acts)
    assert n.execs(j) == [(T + 10 * SEC, 0, RunState.DISPATCHED)]  # acknowledged = stored
    n.restart()  # before any worker took it
    n.hello()
    done = []
    for _ in range(20):
        for a in n.step(n.now + SEC).assignments.get("w1", []):
            if a.job_id == j and a.scheduled_for == T + 10 * SEC:
                n.complete(a)
                done.append(a.attempt)
    assert done and n.execs(j)[-1][2] is RunState.SUCCEEDED


def test_runs_claimed_ahead_are_handed_out_one_at_a_time_per_job() -> None:
    n = Node()
    n.hello(capacity=10)
    j = n.submit(spec(schedule=Interval(period_ms=HOUR, start_at_ms=T + HOUR)))
    fires = [T - 3 * HOUR, T - 2 * HOUR, T - HOUR]
    n.owner.backfill(j, fires, n.now, n.acts)
    acts = n.step()
    assert sorted(c.scheduled_for for c in acts.claims) == fires  # all stored at once
    handed: list[int] = []
    for _ in range(3):
        [a] = acts.assignments["w1"]  # overlap limit 1: one at a time, in fire order
        handed.append(a.scheduled_for)
        acts = n.complete(a)
    assert handed == fires and not acts.assignments


def test_a_backfill_without_actions_at_hand_is_claimed_with_the_next_advance() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(schedule=Interval(period_ms=HOUR, start_at_ms=T + HOUR)))
    n.owner.backfill(j, [T - HOUR], n.now)
    assert [c.scheduled_for for c in n.step().claims] == [T - HOUR]


def test_a_backfill_is_handed_out_after_fresh_work() -> None:
    n = Node()
    n.hello(capacity=1)
    j = n.submit(spec(schedule=Interval(period_ms=HOUR, start_at_ms=T + HOUR)))
    k = n.submit(spec(schedule=Once(at_ms=T + MIN)))
    n.now = T + MIN
    n.owner.backfill(j, [T - HOUR], n.now, n.acts)
    acts = n.step()
    assert [a.job_id for a in acts.assignments["w1"]] == [k]
    acts = n.complete(acts.assignments["w1"][0])
    assert [a.scheduled_for for a in acts.assignments["w1"]] == [T - HOUR]


def test_fixed_delay_next_fire_counts_from_the_completion() -> None:
    n = Node()
    n.hello()
    j = n.submit(
        spec(schedule=Interval(period_ms=MIN, start_at_ms=T + MIN, mode=IntervalMode.FIXED_DELAY))
    )
    a = n.run_once(j, T + MIN)
    assert not n.step(T + 2 * MIN).claims  # not a fixed rate: the run is still going
    n.now = T + 2 * MIN + 17 * SEC
    n.complete(a)
    assert n.owner.next_fires(j, 1) == [T + 3 * MIN + 17 * SEC]
    assert n.store.jobs[j].next_run_at == T + 3 * MIN + 17 * SEC
    assert [c.scheduled_for for c in n.step(T + 3 * MIN + 17 * SEC).claims] == [
        T + 3 * MIN + 17 * SEC
    ]


def test_a_one_shot_runs_once_claimed_and_completes_when_its_run_succeeds() -> None:
    """Changed: the claim made the job ``completed`` at once, while its run
    still went on; now it is ``running`` until its fire ends."""
    n = Node()
    n.hello()
    j = n.submit(spec(schedule=Once(at_ms=T + MIN)))
    [c] = n.step(T + MIN).claims
    assert c.new_next_run_at is None
    assert n.store.jobs[j].state is JobState.RUNNING
    acts = n.complete(_assignment(n, c.fence))
    assert [x.job_state for x in acts.completions] == [JobState.COMPLETED]
    assert n.store.jobs[j].state is JobState.COMPLETED
    assert j not in n.owner.jobs and not n.step(T + DAY_MS).claims


def test_a_one_shot_whose_fire_is_dead_lettered_ends_failed() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(schedule=Once(at_ms=T + MIN), retry=Retry(max_attempts=1)))
    a = n.run_once(j, T + MIN)
    assert n.store.jobs[j].state is JobState.RUNNING
    n.complete(a, Outcome.RETRYABLE)
    assert n.execs(j) == [(T + MIN, 0, RunState.DEAD_LETTERED)]
    assert n.store.jobs[j].state is JobState.FAILED


def test_a_one_shot_stays_running_through_its_retries_until_one_succeeds() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(schedule=Once(at_ms=T + MIN)))  # 3 attempts, no backoff
    a = n.run_once(j, T + MIN)
    acts = n.complete(a, Outcome.RETRYABLE)
    assert [x.job_state for x in acts.completions] == [None]  # a retry follows
    assert n.store.jobs[j].state is JobState.RUNNING
    sent = acts.assignments.get("w1", []) + n.step(n.now + SEC).assignments.get("w1", [])
    [retry] = [x for x in sent if x.job_id == j]  # no backoff: at once
    n.owner.worker_ack("w1", [(retry.run_id, retry.fence)], n.now, n.acts)
    n.complete(retry)
    assert n.execs(j) == [(T + MIN, 0, RunState.FAILED), (T + MIN, 1, RunState.SUCCEEDED)]
    assert n.store.jobs[j].state is JobState.COMPLETED


def test_a_failed_one_shot_redriven_completes_when_the_redrive_succeeds() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(schedule=Once(at_ms=T + MIN), retry=Retry(max_attempts=1)))
    n.complete(n.run_once(j, T + MIN), Outcome.FAILED)
    assert n.store.jobs[j].state is JobState.FAILED
    n.driver.redrive(n.store.get_job(j), [(T + MIN, 1)], n.now)
    [again] = [x for x in n.step(n.now + SEC).assignments["w1"] if x.job_id == j]
    assert n.store.jobs[j].state is JobState.FAILED  # until the redriven run ends
    n.owner.worker_ack("w1", [(again.run_id, again.fence)], n.now, n.acts)
    n.complete(again)
    assert n.store.jobs[j].state is JobState.COMPLETED


def test_a_recurring_jobs_completions_never_touch_its_state() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(retry=Retry(max_attempts=1)))
    acts = n.complete(n.run_once(j, T + MIN), Outcome.FAILED)
    assert [x.job_state for x in acts.completions] == [None]
    assert n.store.jobs[j].state is JobState.ACTIVE


DAY_MS = 24 * HOUR


# -- DST gaps under the skip policy -------------------------------------------------------------

MAR_7_NY = 1_772_859_600_000  # 2026-03-07 00:00 EST
NY_SPRING_FORWARD = 1_772_953_200_000  # 2026-03-08 03:00 EDT: 02:00-03:00 never happens


def _ny_skip(expr: str) -> JobSpec:
    return spec(schedule=Cron(expr=expr, time_zone="America/New_York", dst_gap=DstGap.SKIP))


def _run_until(n: Node, end: int, every: int = 10 * MIN) -> None:
    """Step to ``end``, completing every run handed out on the way."""
    while n.now < end:
        acts = n.step(min(end, n.now + every))
        for a in acts.assignments.get("w1", []):
            n.complete(a)


def test_a_skipped_dst_gap_wall_time_is_recorded_missed_once_the_schedule_passes_it() -> None:
    n = Node(now=MAR_7_NY)
    n.hello()
    j = n.submit(_ny_skip("30 2 * * *"))
    march_7 = MAR_7_NY + 150 * MIN
    _run_until(n, march_7 - 1)
    assert n.missed(j) == {}
    # Its next fire is March 9: 02:30 on March 8 does not exist. Passed over
    # by the schedule now, it is recorded once, at the transition instant.
    _run_until(n, march_7 + MIN)
    assert n.missed(j) == {NY_SPRING_FORWARD: MissedReason.DST_GAP}
    _run_until(n, NY_SPRING_FORWARD + 2 * DAY_MS, every=HOUR)
    assert n.missed(j) == {NY_SPRING_FORWARD: MissedReason.DST_GAP}
    assert [f for f, _, _ in n.execs(j)] == [march_7, 1_773_037_800_000, 1_773_124_200_000]


def test_gap_wall_times_sharing_their_instant_with_a_real_fire_are_not_recorded() -> None:
    # */20: 02:00, 02:20 and 02:40 are skipped; their instant is 03:00, which fires.
    n = Node(now=NY_SPRING_FORWARD - HOUR)
    n.hello()
    j = n.submit(_ny_skip("*/20 * * * *"))
    _run_until(n, NY_SPRING_FORWARD + HOUR, every=MIN)
    assert n.missed(j) == {}
    fires = [f for f, _, _ in n.execs(j)]
    # 01:00, 01:20, 01:40 EST, 03:00, 03:20, 03:40, 04:00 EDT
    assert NY_SPRING_FORWARD in fires and len(fires) == 7


def test_a_gap_passed_during_downtime_is_recorded_by_the_catch_up() -> None:
    # Two-hourly with a seconds field: 02:00 is skipped and 03:00 does not fire.
    n = Node(now=NY_SPRING_FORWARD + 3 * HOUR)
    n.hello()
    j = n.submit(
        _ny_skip("0 0 */2 * * *"), next_run_at=NY_SPRING_FORWARD - 2 * HOUR
    )  # 00:00 EST, the owner was down since
    n.step()
    missed = n.missed(j)
    assert missed[NY_SPRING_FORWARD] is MissedReason.DST_GAP
    assert missed[NY_SPRING_FORWARD - 2 * HOUR] is MissedReason.COLLAPSED


def test_a_gap_before_the_first_fire_is_recorded_at_submission() -> None:
    n = Node(now=NY_SPRING_FORWARD - 2 * HOUR)  # 00:00 EST on March 8
    n.hello()
    j = n.submit(_ny_skip("30 2 * * *"))  # first fire: March 9 02:30 EDT
    n.step()
    assert n.missed(j) == {NY_SPRING_FORWARD: MissedReason.DST_GAP}


# -- catch-up after downtime ----------------------------------------------------------------


def _restarted_with_backlog(mode: CatchUpMode, **kw: object) -> tuple[Node, int]:
    """A job every minute whose next_run_at is 10 minutes in the past."""
    n = Node(now=T + 10 * MIN + 30 * SEC)
    n.hello()
    j = n.submit(
        spec(
            catch_up=CatchUp(mode=mode, **kw),  # type: ignore[arg-type]
            overlap=Overlap(policy=OverlapPolicy.ALLOW, max_concurrent=20),
        ),
        next_run_at=T + MIN,
    )
    return n, j


def test_catch_up_run_latest_only_runs_the_newest_and_records_the_rest_collapsed() -> None:
    n, j = _restarted_with_backlog(CatchUpMode.RUN_LATEST_ONLY)
    acts = n.step()
    assert [c.scheduled_for for c in acts.claims] == [T + 10 * MIN]
    assert n.missed(j) == {T + k * MIN: MissedReason.COLLAPSED for k in range(1, 10)}
    assert n.store.jobs[j].next_run_at == T + 11 * MIN


def test_catch_up_run_all_runs_every_fire_inside_the_cap() -> None:
    n, j = _restarted_with_backlog(CatchUpMode.RUN_ALL, max_count=100)
    claimed: list[int] = []
    for k in range(20):
        claimed += [c.scheduled_for for c in n.step(n.now + k).claims]
    assert claimed == [T + k * MIN for k in range(1, 11)] and n.missed(j) == {}


def test_catch_up_run_all_past_the_cap_collapses_with_an_alert() -> None:
    n, j = _restarted_with_backlog(CatchUpMode.RUN_ALL, max_count=3)
    acts = n.step()
    assert [c.scheduled_for for c in acts.claims] == [T + 10 * MIN]
    assert set(n.missed(j).values()) == {MissedReason.OVER_CAP}
    [alert] = acts.alerts
    assert alert.kind is AlertKind.CATCH_UP_CAPPED and alert.job_id == j
    assert "max_count" in alert.message


def test_catch_up_skip_runs_nothing_and_records_every_fire_skipped() -> None:
    n, j = _restarted_with_backlog(CatchUpMode.SKIP)
    assert not n.step().claims
    assert n.missed(j) == {T + k * MIN: MissedReason.SKIPPED for k in range(1, 11)}
    assert n.store.jobs[j].next_run_at == T + 11 * MIN


def test_catch_up_window_records_older_fires_outside_it() -> None:
    n, j = _restarted_with_backlog(CatchUpMode.RUN_ALL, window_ms=3 * MIN)
    n.step()
    missed = n.missed(j)
    assert {f for f, r in missed.items() if r is MissedReason.OUTSIDE_WINDOW} == {
        T + k * MIN for k in range(1, 8)
    }


def test_catch_up_of_a_fixed_delay_job_that_skips_keeps_the_schedule_alive() -> None:
    n = Node(now=T + HOUR)
    n.hello()
    j = n.submit(
        spec(
            schedule=Interval(period_ms=MIN, start_at_ms=T + MIN, mode=IntervalMode.FIXED_DELAY),
            catch_up=CatchUp(mode=CatchUpMode.SKIP),
        ),
        next_run_at=T + MIN,
    )
    n.step()
    assert n.missed(j) == {T + MIN: MissedReason.SKIPPED}
    assert [c.scheduled_for for c in n.step(T + HOUR + MIN).claims] == [T + HOUR + MIN]


# -- overdue budget and fairness --------------------------------------------------------------


def _tenant_spec(tenant: str, start: int) -> JobSpec:
    return spec(
        tenant=tenant,
        schedule=Once(at_ms=start),
        catch_up=CatchUp(mode=CatchUpMode.RUN_ALL),
    )


def test_fresh_fires_go_before_overdue_ones_and_overdue_work_is_budgeted_fairly() -> None:
    # 1,000 overdue/s budget (20% of 5,000/s), burst 100 (0.1 s).
    n = Node(OwnerConfig(dispatch_rate_per_s=5_000, overdue_burst_s=0.1))
    n.hello(capacity=100_000)
    a_jobs = [n.submit(_tenant_spec("A", T - HOUR), next_run_at=T - HOUR) for _ in range(10_000)]
    b_over = [n.submit(_tenant_spec("B", T - HOUR), next_run_at=T - HOUR) for _ in range(50)]
    b_fresh = n.submit(_tenant_spec("B", T + SEC))
    acts = n.step()
    first = {c.job_id for c in acts.claims}
    assert len(first) <= 100  # the overdue bucket's burst
    # B's overdue fires are not starved behind A's 10,000: they share the budget.
    assert len(first & set(b_over)) >= 40
    acts = n.step(T + SEC)
    ids = [c.job_id for c in acts.claims]
    assert ids[0] == b_fresh  # fresh before overdue, whatever the backlog
    assert len(ids) <= 1 + 100 + 1  # the burst caps what piles up
    # A node waking every 100 ms gets the budget's rate: ~1,000 overdue/s.
    total = 0
    for k in range(1, 101):
        total += len(n.step(T + SEC + k * 100).claims)
    assert total == pytest.approx(10 * 1_000, rel=0.02)
    assert len(set(a_jobs)) == 10_000


def _overdue_backlog(config: OwnerConfig, jobs: int = 10_000) -> Node:
    n = Node(config)
    n.hello(capacity=100_000)
    for _ in range(jobs):
        n.submit(_tenant_spec("A", T - HOUR), next_run_at=T - HOUR)
    return n


def test_a_node_waking_every_half_second_delivers_the_overdue_budget() -> None:
    n = _overdue_backlog(OwnerConfig(dispatch_rate_per_s=5_000))  # 1,000 overdue/s
    first = len(n.step().claims)
    assert first == 1_000  # one second of budget
    total = 0
    for k in range(1, 11):  # Node.max_idle_s: 0.5 s
        total += len(n.step(T + k * 500).claims)
    assert total == pytest.approx(5 * 1_000, rel=0.01)


def test_next_deadline_wakes_the_node_for_the_next_overdue_token() -> None:
    n = _overdue_backlog(OwnerConfig(dispatch_rate_per_s=500))  # 100 overdue/s
    n.step()  # the burst is spent; 9,900 wait for tokens
    assert n.owner.next_deadline() == T + 10  # one token every 10 ms
    # A node sleeping until next_deadline (at most max_idle) gets the rate.
    claimed = 0
    while n.now < T + 2 * SEC:
        deadline = n.owner.next_deadline()
        assert deadline is not None
        claimed += len(n.step(min(deadline, n.now + 500)).claims)
    assert claimed == 200
    # Nobody with credit: overdue work waits for a worker, not for the clock.
    n.owner.worker_credit("w1", -100_000, n.now, n.acts)
    assert n.owner.next_deadline() == n.owner.next_timer()  # leases only


def test_next_deadline_wakes_the_node_for_the_reaper() -> None:
    n = Node(OwnerConfig(reaper_rate_per_s=10, reaper_burst=5, busy_threshold=1.0))
    n.hello("w1", capacity=100)
    for _ in range(50):
        n.submit(spec(schedule=Once(at_ms=T + MIN), timeout_ms=HOUR))
    n.step(T + MIN)
    n.silent.add("w1")
    n.hello("w2", capacity=100)
    n.step(T + MIN + n.config.grace_lease_ms)  # 50 leases lost, 5 re-dispatched
    assert n.owner.next_deadline() == n.now + 100  # 10 tokens/s


def test_has_dispatchable_work_when_a_completion_releases_a_buffered_fire() -> None:
    n = Node()
    n.hello(capacity=1)
    j = n.submit(spec(overlap=Overlap(policy=OverlapPolicy.BUFFER_ONE)))
    a = n.run_once(j, T + MIN)
    n.step(T + 2 * MIN)  # buffered behind the run
    assert not n.owner.has_dispatchable_work()
    n.owner.worker_complete("w1", [(a.run_id, a.fence, Outcome.SUCCEEDED, "")], n.now, n.acts)
    work = n.acts.take_store_work()
    n.owner.on_completed(n.store.complete_runs(work.completions), n.now, n.acts)
    # The buffered fire is queued and the worker has its credit back.
    assert n.owner.has_dispatchable_work()
    n.owner.advance(n.now, n.acts)
    assert [c.scheduled_for for c in n.acts.claims] == [T + 2 * MIN]
    assert not n.owner.has_dispatchable_work()


def test_has_dispatchable_work_needs_credit_and_overdue_tokens() -> None:
    n = _overdue_backlog(OwnerConfig(dispatch_rate_per_s=500), jobs=200)
    n.step()
    assert not n.owner.has_dispatchable_work()  # 100 wait for tokens
    n.owner.advance(T + 10, n.acts)  # one token, taken by that advance
    assert not n.owner.has_dispatchable_work()
    n.now = T + 30
    n.owner.wheel.advance(n.now)  # the clock moved: two tokens wait
    assert n.owner.has_dispatchable_work()
    n.owner.worker_credit("w1", -100_000, n.now, n.acts)
    assert not n.owner.has_dispatchable_work()  # but no worker has credit


# -- the reaper ---------------------------------------------------------------------------------


def test_reaper_redispatches_expired_leases_while_the_fleet_has_room() -> None:
    n = Node(OwnerConfig(busy_threshold=0.85))
    n.hello("w1", capacity=10)
    n.hello("w2", capacity=10)
    for _ in range(20):
        n.submit(spec(schedule=Once(at_ms=T + MIN), timeout_ms=HOUR))
    acts = n.step(T + MIN)
    for a in acts.assignments["w1"]:
        n.owner.worker_ack("w1", [(a.run_id, a.fence)], n.now, n.acts)
    n.silent.add("w2")  # w2 never acks: its 10 grace leases expire
    n.hello("w3", capacity=10)
    acts = n.step(T + MIN + n.config.grace_lease_ms)
    assert len([r for r in acts.revokes["w2"] if r.reason is RevokeReason.LEASE_EXPIRED]) == 10
    # 10 busy of 30 slots (<= 85%): all ten re-dispatched, to the healthy worker.
    assert len(acts.assignments["w3"]) == 10 and all(a.attempt == 1 for a in acts.assignments["w3"])
    assert not n.owner.reaper_paused


def test_reaper_pauses_and_alerts_above_the_busy_threshold_and_resumes_below() -> None:
    n = Node(OwnerConfig(busy_threshold=0.5))
    n.hello("w1", capacity=10)
    n.hello("w2", capacity=4)
    for _ in range(14):
        n.submit(spec(schedule=Once(at_ms=T + MIN), timeout_ms=HOUR))
    acts = n.step(T + MIN)
    w1 = acts.assignments["w1"]
    for a in w1:
        n.owner.worker_ack("w1", [(a.run_id, a.fence)], n.now, n.acts)
    n.silent.add("w2")
    n.hello("w3", capacity=4)
    acts = n.step(T + MIN + n.config.grace_lease_ms)  # w2's 4 runs lose their lease
    assert n.owner.reaper_paused  # 10 of 18 slots busy > 50%
    assert not [c for c in acts.claims if c.attempt == 1]
    assert [a.kind for a in acts.alerts] == [AlertKind.REAPER_PAUSED]
    assert "reaper paused" in acts.alerts[0].message
    redispatched = []
    for a in w1[:6]:
        redispatched += [c for c in n.complete(a).claims if c.attempt == 1]
    redispatched += [c for c in n.step(n.now + 1).claims if c.attempt == 1]
    assert not n.owner.reaper_paused
    assert len(redispatched) == 4


def test_with_no_worker_connected_the_reaper_says_so_not_that_the_fleet_is_busy() -> None:
    n = Node()
    n.hello("w1")
    j = n.submit(spec(schedule=Once(at_ms=T + MIN), timeout_ms=HOUR))
    n.run_once(j, T + MIN)
    n.owner.worker_disconnect("w1")
    acts = n.step(T + MIN + n.config.lease_ms + SEC)
    assert n.owner.reaper_paused
    [alert] = [a for a in acts.alerts if a.kind is AlertKind.REAPER_PAUSED]
    assert alert.message == "reaper paused: no worker connected; 1 expired leases wait for one"
    n.hello("w2")
    [b] = n.step(n.now + SEC).assignments["w2"]
    assert (b.job_id, b.attempt) == (j, 1) and not n.owner.reaper_paused


def test_a_cancel_ends_the_reapers_wait_for_its_lost_runs_and_its_pending_retries() -> None:
    n = Node()
    n.hello("w1")
    lost = n.submit(spec(schedule=Once(at_ms=T + MIN), timeout_ms=HOUR))
    failed = n.submit(
        spec(
            schedule=Once(at_ms=T + MIN),
            retry=Retry(max_attempts=3, initial_backoff_ms=HOUR, max_backoff_ms=HOUR),
        )
    )
    acts = n.step(T + MIN)
    by_job = {a.job_id: a for a in acts.assignments["w1"]}
    n.complete(by_job[failed], Outcome.RETRYABLE)  # its retry waits an hour
    n.owner.worker_disconnect("w1")
    n.step(T + MIN + n.config.lease_ms + SEC)
    assert n.owner.reaper_paused  # no worker: the lost run waits
    n.owner.cancel_job(lost, n.acts, n.now)
    n.owner.cancel_job(failed, n.acts, n.now)
    n.step(n.now + SEC)
    assert not n.owner.reaper_paused  # nothing waits for a re-dispatch any more
    assert not n.owner.has_job(lost) and not n.owner.has_job(failed)
    n.hello("w2")
    acts = n.step(T + 3 * HOUR)
    assert not acts.assignments and not acts.claims


def test_reaper_rate_limits_redispatch() -> None:
    n = Node(OwnerConfig(reaper_rate_per_s=10, reaper_burst=5, busy_threshold=1.0))
    n.hello("w1", capacity=100)
    for _ in range(50):
        n.submit(spec(schedule=Once(at_ms=T + MIN), timeout_ms=HOUR))
    n.step(T + MIN)
    n.silent.add("w1")
    n.hello("w2", capacity=100)
    acts = n.step(T + MIN + n.config.grace_lease_ms)
    assert len([c for c in acts.claims if c.attempt == 1]) == 5  # the burst
    start = n.now
    again = 0
    for k in range(1, 11):  # the node wakes at least every 0.5 s; here every 100 ms
        again += len([c for c in n.step(start + k * 100).claims if c.attempt == 1])
    assert again == 10  # then 10/s


# -- restarts ---------------------------------------------------------------------------------


def test_a_restored_run_completed_before_its_first_heartbeat_is_accepted() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(schedule=Once(at_ms=T + MIN), timeout_ms=HOUR))
    a = n.run_once(j, T + MIN)
    n.owner.worker_ack("w1", [(a.run_id, a.fence)], n.now, n.acts)
    n.step()
    # The node restarts; the worker reconnects and re-sends its completion first.
    n.restart()
    n.hello()
    acts = n.complete(a)
    assert acts.results["w1"][0].accepted
    assert n.execs(j) == [(T + MIN, 0, RunState.SUCCEEDED)]


def test_a_one_shot_in_flight_at_a_rebuild_from_the_store_runs_again() -> None:
    """Its claim ended the job's schedule in the store (the job is running);
    the worker dies with the node. The rebuilt owner must re-dispatch the
    lost run: a one-shot claimed is over for its schedule, not for its
    fire's runs, and its success completes it."""
    n = Node()
    n.hello()
    j = n.submit(spec(schedule=Once(at_ms=T + MIN)))
    n.run_once(j, T + MIN)
    assert n.store.jobs[j].state is JobState.RUNNING
    n.restart()
    n.hello("w2")
    acts = n.step(n.now + n.config.lease_ms + SEC)  # nobody renews the restored run
    [again] = acts.assignments["w2"]
    assert (again.scheduled_for, again.attempt) == (T + MIN, 1)
    n.complete(again, worker="w2")
    assert n.execs(j) == [(T + MIN, 0, RunState.LOST), (T + MIN, 1, RunState.SUCCEEDED)]
    assert n.store.jobs[j].state is JobState.COMPLETED
    assert j not in n.owner.jobs  # nothing left behind


def test_a_retry_of_a_one_shot_owed_at_a_rebuild_from_the_store_runs() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(schedule=Once(at_ms=T + MIN)))
    a = n.run_once(j, T + MIN)
    n.owner.worker_complete("w1", [(a.run_id, a.fence, Outcome.RETRYABLE, "busy")], n.now, n.acts)
    n.owner.advance(n.now, n.acts)  # the failure is sent; the node dies before the retry
    n._pass()
    n.restart()
    n.hello()
    acts = n.step(n.now + SEC)
    [again] = acts.assignments["w1"]
    assert again.attempt == 1
    n.complete(again)
    assert n.execs(j) == [(T + MIN, 0, RunState.FAILED), (T + MIN, 1, RunState.SUCCEEDED)]


def test_a_run_of_a_cancelled_job_restored_from_the_store_is_cancelled() -> None:
    """The cancel reached the store but the node died before it ended the
    run: the rebuilt owner ends it as the cancel would have, and the worker
    that still holds it hears that its lease is gone."""
    n = Node()
    n.hello()
    j = n.submit(spec())
    a = n.run_once(j, T + MIN)
    n.store.set_job_state(j, JobState.CANCELLED, next_run_at=None, now_ms=n.now)
    n.restart()
    n.hello()
    n.step()
    assert n.execs(j) == [(T + MIN, 0, RunState.CANCELLED)]
    n.owner.worker_heartbeat("w1", [(a.run_id, a.fence)], n.now, n.acts)
    assert n.acts.rejected_renewals["w1"] == [(a.run_id, a.fence)]
    assert j not in n.owner.jobs


def test_upsert_of_a_store_row_is_idempotent() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec())
    record: JobRecord = n.store.get_job(j)
    for _ in range(3):
        n.owner.upsert_job(record, n.now, n.acts)
    assert [c.scheduled_for for c in n.step(T + MIN).claims] == [T + MIN]


def _fires_per_tick(n: Node, ticks: int, per_tick: int) -> list[list[str]]:
    """Submit ``per_tick`` jobs due at each of the next ``ticks`` ms and step
    to each: the workers each tick's runs went to, in hand-out order."""
    handed: list[list[str]] = []
    for k in range(ticks):
        due = n.now + 1
        for i in range(per_tick):
            n.submit(spec(name=f"j{k}.{i}", schedule=Interval(period_ms=HOUR, start_at_ms=due)))
        acts = n.step(due)
        handed.append([w for w, runs in sorted(acts.assignments.items()) for _ in runs])
    return handed


def test_fires_spread_over_workers_even_one_per_tick() -> None:
    n = Node()
    n.hello("w1", capacity=1000)
    n.hello("w2", capacity=1000)
    handed = [w for tick in _fires_per_tick(n, 6, 1) for w in tick]
    assert handed == ["w1", "w2"] * 3


def test_a_batchs_runs_go_out_to_one_worker_and_the_next_batchs_to_the_next() -> None:
    # One message a tick, not a part of it to each worker.
    n = Node(OwnerConfig(hand_out_chunk=12))
    n.hello("w1", capacity=1000)
    n.hello("w2", capacity=1000)
    n.hello("w3", capacity=1000)
    assert _fires_per_tick(n, 4, 5) == [["w1"] * 5, ["w2"] * 5, ["w3"] * 5, ["w1"] * 5]
    # A batch larger than the chunk is dealt a chunk at a time, from the next.
    assert _fires_per_tick(n, 1, 30)[0] == ["w1"] * 6 + ["w2"] * 12 + ["w3"] * 12


def test_one_run_a_worker_in_turn_with_a_chunk_of_one() -> None:
    n = Node(OwnerConfig(hand_out_chunk=1))
    n.hello("w1", capacity=1000)
    n.hello("w2", capacity=1000)
    assert [w for tick in _fires_per_tick(n, 4, 1) for w in tick] == ["w1", "w2", "w1", "w2"]
    assert sorted(_fires_per_tick(n, 1, 4)[0]) == ["w1", "w1", "w2", "w2"]


def test_a_worker_out_of_credit_passes_the_rest_of_its_chunk_on() -> None:
    n = Node(OwnerConfig(hand_out_chunk=64))
    n.hello("w1", capacity=3)
    n.hello("w2", capacity=1000)
    assert sorted(_fires_per_tick(n, 1, 10)[0]) == ["w1"] * 3 + ["w2"] * 7


def test_dispatch_lag_counts_first_attempts_only() -> None:
    n = Node()
    n.hello()
    j = n.submit(
        spec(retry=Retry(max_attempts=3, initial_backoff_ms=10_000, max_backoff_ms=10_000))
    )
    a = n.run_once(j, T + MIN)
    n.lags.clear()
    n.complete(a, Outcome.RETRYABLE)
    acts = n.step(T + MIN + 20_000)
    assert [x.attempt for x in acts.assignments["w1"]] == [1]
    assert n.lags == []  # the retry waited its backoff; that is not lag


def test_dispatch_lag_leaves_out_backfills_and_redrives_and_counts_a_trigger_from_itself() -> None:
    # A backfill's fires were hours old when it was asked for: counted as
    # lag, one backfill put the p99 at hours. Not due then, not lag.
    n = Node(now=T + 10 * HOUR)
    n.hello()
    j = n.submit(spec(schedule=Interval(period_ms=HOUR, start_at_ms=T)))
    n.driver.backfill(n.store.get_job(j), [T + HOUR, T + 2 * HOUR], n.now)
    [b] = n.step(n.now + SEC).assignments["w1"]  # one at a time: the job's overlap limit
    [c] = n.complete(b).assignments["w1"]
    assert (b.scheduled_for, c.scheduled_for) == (T + HOUR, T + 2 * HOUR)
    n.complete(c)
    assert n.lags == []
    # A redrive's fire (a dead letter's) is as old.
    k = n.submit(spec(schedule=Once(at_ms=n.now + SEC), retry=Retry(max_attempts=1)))
    a = n.run_once(k, n.now + SEC)
    n.complete(a, Outcome.RETRYABLE)
    n.step(n.now + HOUR)
    n.lags.clear()  # the hourly job's fire meanwhile
    n.driver.redrive(n.store.get_job(k), [(a.scheduled_for, 1)], n.now)
    [again] = n.step(n.now + SEC).assignments["w1"]
    assert (again.job_id, again.attempt) == (k, 1)
    assert n.lags == []
    # A trigger is due when it is asked for: its lag counts from then.
    t = n.submit(spec(schedule=Interval(period_ms=HOUR, start_at_ms=n.now + MIN)))
    at = n.now
    fire = n.driver.trigger(n.store.get_job(t), at)
    n.step(at + 5)
    assert fire == at and n.lags == [5]


def test_a_run_handed_back_counts_its_dispatch_lag_once() -> None:
    n = Node()
    n.hello("w1")
    j = n.submit(spec(schedule=Once(at_ms=T + MIN)))
    a = n.run_once(j, T + MIN, ack=False)
    assert n.lags == [0]
    n.complete(a, Outcome.HANDED_BACK)
    n.now += MIN  # waited a minute for another worker
    n.hello("w2")
    [b] = n.step().assignments["w2"]
    assert b.run_id == a.run_id
    assert n.lags == [0]  # not a minute more


def test_a_backlog_longer_than_one_listing_is_one_catch_up() -> None:
    # 500 overdue fires listed 50 at a time: still one run_latest_only run.
    n = Node(OwnerConfig(max_missed_listed=50), now=T + 500 * SEC + 10)
    j = n.submit(spec(schedule=Interval(period_ms=SEC, start_at_ms=T + SEC)), next_run_at=T + SEC)
    n.hello()
    acts = n.step()
    runs = [a for a in acts.assignments.get("w1", []) if a.job_id == j]
    assert [a.scheduled_for for a in runs] == [T + 500 * SEC]
    missed = n.missed(j)
    assert len(missed) == 499
    assert set(missed.values()) == {MissedReason.COLLAPSED}


# -- routing by handler -----------------------------------------------------------------------


def test_a_run_goes_only_to_a_worker_that_registered_its_handler() -> None:
    n = Node()
    n.hello("mailer", handlers=("mail",))
    n.hello("reporter", handlers=("report",))
    mail = n.submit(spec(handler="mail"))
    report = n.submit(spec(handler="report"))
    for k in range(1, 6):
        acts = n.step(T + k * MIN)
        assert {a.job_id for a in acts.assignments.get("mailer", [])} == {mail}
        assert {a.job_id for a in acts.assignments.get("reporter", [])} == {report}
        for wid, items in acts.assignments.items():
            for a in items:
                n.complete(a, worker=wid)


def test_work_with_no_worker_for_its_handler_waits_unclaimed_and_is_reported() -> None:
    n = Node(OwnerConfig(unserved_alert_ms=10 * SEC))
    n.hello("mailer", handlers=("mail",))
    j = n.submit(spec(handler="report", schedule=Once(at_ms=T + MIN)))
    acts = n.step(T + MIN)
    assert not acts.assignments and not acts.claims  # no claim: no grace, no attempt
    [waiting] = n.owner.unserved()
    assert (waiting.pool, waiting.handler, waiting.waiting) == ("default", "report", 1)
    assert not acts.alerts
    acts = n.step(T + MIN + 10 * SEC)
    [alert] = acts.alerts
    assert alert.kind is AlertKind.NO_WORKER
    assert "no worker for handler 'report'" in alert.message
    acts = n.step(T + MIN + HOUR)  # waits as long as it takes; one alert
    assert not acts.alerts and not acts.claims
    n.hello("reporter", handlers=("report",))
    acts = n.step()
    [a] = acts.assignments["reporter"]
    assert (a.job_id, a.attempt) == (j, 0)
    assert a.timeout_ms == n.store.jobs[j].spec.timeout_ms  # its timeout starts now
    assert n.owner.unserved() == []


def _waiting_for_a_worker(n: Node) -> dict[str, int]:
    return {u.handler: u.waiting for u in n.owner.unserved()}


def _unserved_one_shot(n: Node, at: int = T + MIN) -> int:
    """A one-shot whose handler no worker serves, come due and waiting."""
    j = n.submit(spec(handler="does_not_exist", schedule=Once(at_ms=at)))
    n.step(at)
    assert _waiting_for_a_worker(n) == {"does_not_exist": 1}
    return j


def test_a_cancel_takes_its_work_out_of_the_waiting_count_at_once() -> None:
    # Its queue entry was left for the queue's next pop, which never comes on
    # a route no worker serves: the count (and its alert) outlived the job.
    n = Node(OwnerConfig(unserved_alert_ms=10 * SEC))
    n.hello("mailer", handlers=("mail",))
    j = _unserved_one_shot(n)
    [alert] = n.step(T + MIN + 10 * SEC).alerts
    assert alert.kind is AlertKind.NO_WORKER
    n.owner.cancel_job(j, n.acts, n.now)
    assert n.owner.unserved() == []
    acts = n.step(T + MIN + HOUR)
    assert not acts.alerts and not acts.claims and n.owner.unserved() == []
    assert n.missed(j) == {T + MIN: MissedReason.CANCELLED}
    # The route raises its alert again when new work waits on it.
    _unserved_one_shot(n, T + 2 * HOUR)
    [alert] = n.step(T + 2 * HOUR + 10 * SEC).alerts
    assert alert.kind is AlertKind.NO_WORKER


def test_a_pause_takes_its_fires_out_of_the_waiting_count_and_a_resume_puts_them_back() -> None:
    n = Node()
    j = n.submit(spec(handler="does_not_exist"))  # every minute from T + MIN
    n.step(T + MIN)
    assert _waiting_for_a_worker(n) == {"does_not_exist": 1}
    paused = n.store.set_job_state(j, JobState.PAUSED, next_run_at=None, now_ms=n.now)
    n.owner.upsert_job(paused, n.now, n.acts)
    assert n.owner.unserved() == []
    assert not n.step(T + 10 * MIN).claims and n.owner.unserved() == []
    resume_at = T + 10 * MIN + SEC
    n.now = resume_at
    resumed = n.store.set_job_state(j, JobState.ACTIVE, next_run_at=T + 11 * MIN, now_ms=n.now)
    n.owner.upsert_job(resumed, n.now, n.acts)
    n.step(T + 11 * MIN)
    assert _waiting_for_a_worker(n) == {"does_not_exist": 1}
    n.hello("any")
    [a] = n.step().assignments["any"]
    assert (a.job_id, a.scheduled_for) == (j, T + 11 * MIN)


def test_an_update_to_a_served_handler_moves_its_work_to_that_handler() -> None:
    n = Node()
    n.hello("mailer", handlers=("mail",))
    j = _unserved_one_shot(n)
    record = n.store.get_job(j)
    update, _ = n.driver.update(record, replace(record.spec, handler="mail"), n.now)
    n.driver.updated(n.store.update_job(update).job, n.now)
    assert n.owner.unserved() == []
    [a] = n.step().assignments["mailer"]
    assert (a.job_id, a.handler, a.scheduled_for) == (j, "mail", T + MIN)
    assert n.owner.unserved() == []


def test_an_update_to_another_unserved_handler_counts_its_work_there() -> None:
    n = Node()
    n.hello("mailer", handlers=("mail",))
    j = _unserved_one_shot(n)
    record = n.store.get_job(j)
    update, _ = n.driver.update(record, replace(record.spec, handler="still_missing"), n.now)
    n.driver.updated(n.store.update_job(update).job, n.now)
    n.step()
    assert _waiting_for_a_worker(n) == {"still_missing": 1}


def test_a_shard_handed_over_takes_its_waiting_work_with_it() -> None:
    n = Node()
    j = _unserved_one_shot(n)
    n.driver.hand_over([shard_of(j)])
    assert n.owner.unserved() == []
    assert not n.step(T + HOUR).alerts and n.owner.unserved() == []


def test_a_worker_with_no_handler_names_runs_any_handler() -> None:
    n = Node()
    n.hello("any")
    j = n.submit(spec(handler="whatever"))
    assert [a.job_id for a in n.step(T + MIN).assignments["any"]] == [j]


def test_a_run_handed_back_goes_to_another_worker_with_the_same_attempt_and_fence() -> None:
    n = Node()
    n.hello("w1")
    j = n.submit(spec(schedule=Once(at_ms=T + MIN), retry=Retry(max_attempts=1)))
    a = n.run_once(j, T + MIN)  # acked: the store has it running on w1
    acts = n.complete(a, Outcome.HANDED_BACK)
    assert acts.results["w1"][0].accepted
    assert not acts.assignments  # never back to the worker that gave it back
    assert n.execs(j) == [(T + MIN, 0, RunState.RUNNING)]  # nothing written
    n.hello("w2")
    [b] = n.step().assignments["w2"]
    assert (b.run_id, b.attempt, b.fence) == (a.run_id, a.attempt, a.fence)
    n.owner.worker_ack("w2", [(b.run_id, b.fence)], n.now, n.acts)
    n.complete(b, worker="w2")  # its one attempt was not used by the hand-back
    assert n.execs(j) == [(T + MIN, 0, RunState.SUCCEEDED)]
    assert n.store.execs[b.run_id].worker_id == "w2"


def test_a_handed_back_run_waits_without_a_lease_or_timeout() -> None:
    n = Node()
    n.hello("w1")
    j = n.submit(spec(schedule=Once(at_ms=T + MIN), timeout_ms=MIN))
    a = n.run_once(j, T + MIN, ack=False)
    n.complete(a, Outcome.HANDED_BACK)
    acts = n.step(n.now + n.config.grace_lease_ms - 1)  # not back to w1 for a grace lease
    assert not acts.completions and not acts.assignments
    assert n.owner.unserved() == []  # w1 serves the route; it just gave this one back
    n.hello("w1")  # a new hello (a redeployed worker): it may have the handler now
    [b] = n.step().assignments["w1"]
    assert (b.run_id, b.attempt) == (a.run_id, 0)
    n.owner.worker_disconnect("w1")  # no worker at all: it waits, and nothing ends it
    n.complete(b, Outcome.HANDED_BACK)
    acts = n.step(n.now + 3 * HOUR)  # far past its grace lease, lease and timeout
    assert not acts.completions and not acts.assignments
    n.hello("w2")
    [c] = n.step().assignments["w2"]
    assert (c.run_id, c.attempt, c.timeout_ms) == (a.run_id, 0, MIN)  # a fresh timeout


def test_a_run_abandoned_while_running_is_a_new_attempt_or_unknown() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(schedule=Once(at_ms=T + MIN)))
    a = n.run_once(j, T + MIN)
    acts = n.complete(a, Outcome.ABANDONED)
    assert acts.results["w1"][0].accepted
    [b] = acts.assignments["w1"]  # re-dispatched at once, as after a lost lease
    assert (b.attempt, b.fence > a.fence) == (1, True)  # a new fence shuts out the old holder
    amo = n.submit(spec(schedule=Once(at_ms=n.now + MIN), side_effect=SideEffect.AT_MOST_ONCE))
    c = n.run_once(amo, n.now + MIN)
    n.complete(c, Outcome.ABANDONED)
    n.step(n.now + HOUR)
    assert n.execs(amo)[-1][1:] == (0, RunState.UNKNOWN)


# -- shards that come and go ------------------------------------------------------------------


def _contents(n: Node, shards: list[int]) -> ShardContents:
    """What the store holds for ``shards``, as a gaining owner loads it."""
    return load_shard_contents(n.store, shards)[0]


def _two_shards(n: Node) -> tuple[int, int]:
    """Two interval jobs of different shards."""
    a = n.submit(spec())
    b = n.submit(spec())
    while shard_of(b) == shard_of(a):
        b = n.submit(spec())
    return a, b


def test_removing_a_shard_hands_its_runs_over_and_another_owner_adds_it() -> None:
    n = Node()
    n.hello()
    a, b = _two_shards(n)
    acts = n.step(T + MIN)
    held = {x.job_id: x for x in acts.assignments["w1"] if x.job_id in (a, b)}
    for x in held.values():
        n.owner.worker_ack("w1", [(x.run_id, x.fence)], n.now, n.acts)
    n.step()
    sa = shard_of(a)
    handed = n.owner.remove_shards([sa])
    assert handed == [(held[a].run_id, held[a].fence)]
    assert sa not in n.owner.shards() and shard_of(b) in n.owner.shards()
    acts = n.step(T + 2 * MIN)  # no completion written: nothing marked lost
    assert not [c for c in acts.completions if c.run_id == held[a].run_id]
    assert n.store.execs[held[a].run_id].state is RunState.RUNNING
    assert held[a].run_id not in n.owner.workers["w1"].held
    assert {x.job_id for x in acts.assignments.get("w1", [])} & {a, b} == set()  # b overlaps
    n.complete(held[b])
    assert {x.job_id for x in n.step(T + 3 * MIN).assignments["w1"]} == {b}  # a's shard is gone

    # Another owner takes the shard over at a newer epoch, from the store.
    other = Owner(now_ms=n.now, config=n.config)
    fx2 = Actions()
    other.add_shards({sa: 7}, _contents(n, [sa]), n.now, fx2)
    assert set(other.shards()) == {sa}
    other.worker_hello("w1", 10, ["default"], n.now, fx2)
    other.worker_heartbeat("w1", [(held[a].run_id, held[a].fence)], n.now, fx2)
    assert not fx2.rejected_renewals  # adopted: its worker goes on
    other.worker_complete(
        "w1", [(held[a].run_id, held[a].fence, Outcome.SUCCEEDED, "")], n.now, fx2
    )
    [done] = fx2.completions
    assert (done.run_id, done.state) == (held[a].run_id, RunState.SUCCEEDED)
    other.on_completed([CompletionOutcome(run_id=done.run_id, applied=True)], n.now, fx2)
    other.advance(T + 4 * MIN, fx2)
    [claim] = [c for c in fx2.claims if c.job_id == a]
    assert claim.fence >> COUNTER_BITS == 7  # the new owner's fences carry its epoch


def test_a_planned_hand_over_gives_the_next_owner_its_unsent_runs_to_send_at_once() -> None:
    """A run claimed whose hand-out was not sent to its worker yet is
    marked by the planned hand-over and sent by the next owner as soon as a
    worker is there, same attempt and fence; a run whose hand-out went out
    is left to its worker (adopted under a grace lease)."""
    n = Node()
    n.hello()
    a, b = _two_shards(n)
    sa, sb = shard_of(a), shard_of(b)
    n.store.epochs.update(dict.fromkeys(range(256), 1))
    n.now = T + MIN
    n.driver.advance(n.now)
    batch = n.driver.take_batch()
    n.driver.apply(n.store.write_batch(batch), n.now, batch.epochs)
    sent, unsent = n.acts.assignments["w1"]
    n.acts.assignments["w1"] = [unsent]  # the node sent the first; the second waits
    held = n.driver.sent_runs([sa, sb])
    assert held == {sent.run_id}
    n.driver.hand_over([sa, sb])
    assert n.store.release_unsent([sa, sb], held) == 1

    n.store.fence_shards({sa: 2, sb: 2}, "node-new")
    other = Owner(now_ms=n.now, config=n.config)
    fx2 = Actions()
    other.add_shards({sa: 2, sb: 2}, _contents(n, [sa, sb]), n.now, fx2)
    other.worker_hello("w2", 10, ["default"], n.now, fx2)
    other.advance(n.now, fx2)
    [again] = fx2.assignments["w2"]
    assert (again.run_id, again.fence) == (unsent.run_id, unsent.fence)
    assert sent.run_id in other.runs  # adopted, left to its worker

    # That owner goes before its worker acked the run: the next one cannot
    # know it was sent (the mark was taken), so it waits for the worker.
    n.store.fence_shards({sa: 3, sb: 3}, "node-third")
    third = Owner(now_ms=n.now, config=n.config)
    fx3 = Actions()
    third.add_shards({sa: 3, sb: 3}, _contents(n, [sa, sb]), n.now, fx3)
    third.worker_hello("w3", 10, ["default"], n.now, fx3)
    third.advance(n.now, fx3)
    assert unsent.run_id in third.runs and not fx3.assignments.get("w3")


def test_shards_gained_due_first_fire_as_shards_loaded_whole() -> None:
    """A gain due first: the jobs due before the bound come with the shards,
    the rest (due later, or paused) is added behind, after time moved on;
    rows of jobs the owner holds already are not added again. Every fire
    then comes due as with one whole load."""
    n = Node()
    made = [
        n.submit(spec(schedule=Interval(period_ms=6 * HOUR, start_at_ms=T + k * 7 * MIN)))
        for k in range(1, 40)
    ]
    n.store.set_job_state(made[0], JobState.PAUSED, next_run_at=None, now_ms=T)
    shards = sorted({shard_of(j) for j in made})
    epochs = dict.fromkeys(shards, 2)
    bound = T + 20 * MIN

    def sweep(owner: Owner, acts: Actions, start: int) -> set[tuple[int, int]]:
        fires = set()
        for t in range(start, T + 5 * HOUR, MIN):
            owner.advance(t, acts)
            fires |= {(c.job_id, c.scheduled_for) for c in acts.claims}
            acts.claims.clear()
        return fires

    whole, fx_whole = Owner(now_ms=T, config=n.config), Actions()
    whole.add_shards(epochs, load_shard_contents(n.store, shards)[0], T, fx_whole)
    whole.worker_hello("w1", 1_000, ["default"], T, fx_whole)

    split, fx_split = Owner(now_ms=T, config=n.config), Actions()
    split.add_shards(epochs, load_shard_contents(n.store, shards, due_by=bound)[0], T, fx_split)
    split.worker_hello("w1", 1_000, ["default"], T, fx_split)
    assert split.job_count() < whole.job_count()
    early = sweep(split, fx_split, T)  # nothing of the rest is due yet...
    assert early and all(fire <= bound for _, fire in early)
    packed, profiles = load_later(n.store, shards, bound)
    missing = whole.job_count() - split.job_count()
    assert split.add_rest(packed, profiles) == missing
    assert split.job_count() == whole.job_count()
    assert split.add_rest(packed, profiles) == 0  # held already
    late = sweep(split, Actions(), T)
    assert early | late == sweep(whole, fx_whole, T)


def test_a_job_due_later_with_a_run_in_flight_keeps_its_schedule_in_a_gain_due_first() -> None:
    """A gain due first leaves a job due after the bound to the rest; when
    the job has a run in flight, the load takes it on whole with the run, as
    a job still scheduled (not one whose schedule is over), and it fires on
    after the rest is added. A paused one with a run stays paused."""
    n = Node()
    # Allowed to overlap: its next fires do not wait for the run in flight.
    every = spec(
        schedule=Interval(period_ms=HOUR, start_at_ms=T + MIN),
        overlap=Overlap(policy=OverlapPolicy.ALLOW, max_concurrent=10),
    )
    hourly, paused = n.submit(every), n.submit(every)
    claims = [
        FireClaim(
            job_id=job_id,
            scheduled_for=T + MIN,
            attempt=0,
            fence=(1 << COUNTER_BITS) | (k + 1),
            dispatched_at_ms=T + MIN,
            advance=True,
            expected_next_run_at=T + MIN,
            new_next_run_at=T + MIN + HOUR,
        )
        for k, job_id in enumerate((hourly, paused))
    ]
    assert all(o.run_id is not None for o in n.store.claim_fires(claims))
    n.store.set_job_state(paused, JobState.PAUSED, next_run_at=None, now_ms=T + MIN)
    shards = sorted({shard_of(hourly), shard_of(paused)})
    epochs = dict.fromkeys(shards, 2)
    now, bound = T + 2 * MIN, T + 20 * MIN
    owner, acts = Owner(now_ms=now, config=n.config), Actions()
    owner.add_shards(epochs, load_shard_contents(n.store, shards, due_by=bound)[0], now, acts)
    owner.worker_hello("w1", 1_000, ["default"], now, acts)
    owner.add_rest(*load_later(n.store, shards, bound))
    fires = set()
    for t in range(now, T + 3 * HOUR, MIN):
        owner.advance(t, acts)
        fires |= {(c.job_id, c.scheduled_for) for c in acts.claims}
        acts.claims.clear()
    assert {(hourly, T + MIN + HOUR), (hourly, T + MIN + 2 * HOUR)} <= fires
    assert not {f for j, f in fires if j == paused and f > T + MIN}


def test_a_staged_shard_takes_on_what_its_owner_and_the_api_changed_since() -> None:
    """A planned move stages a shard's jobs while its owner serves them. At
    the switch, what the old owner did since (a fire claimed and the
    schedule moved on, a one-shot ended) and what the API did (a pause, a new
    job) are all there, without a scan for the owner's moves: those touch
    only jobs that came due or had runs, and those are read again."""
    n = Node()
    due = n.submit(spec(schedule=Interval(period_ms=HOUR, start_at_ms=T + MIN)))
    shard = shard_of(due)
    mates = [n.submit(spec(schedule=Interval(period_ms=HOUR, start_at_ms=T + HOUR)))]
    while shard_of(mates[-1]) != shard or len(mates) < 2:
        mates.append(n.submit(spec(schedule=Interval(period_ms=HOUR, start_at_ms=T + HOUR))))
    paused = next(j for j in mates if shard_of(j) == shard)
    staged = stage_from_store(n.store, [shard])

    # The old owner claims the due fire (its schedule moves to T + 61 min);
    # the API pauses a job and adds one.
    [out] = n.store.claim_fires(
        [
            FireClaim(
                job_id=due,
                scheduled_for=T + MIN,
                attempt=0,
                fence=(1 << COUNTER_BITS) | 1,
                dispatched_at_ms=T + MIN,
                advance=True,
                expected_next_run_at=T + MIN,
                new_next_run_at=T + MIN + HOUR,
            )
        ]
    )
    assert out.run_id is not None
    done = Completion(
        run_id=out.run_id,
        fence=(1 << COUNTER_BITS) | 1,
        state=RunState.SUCCEEDED,
        finished_at_ms=T + MIN + SEC,
        worker_id="w0",
    )
    n.store.complete_runs([done])
    n.store.set_job_state(paused, JobState.PAUSED, next_run_at=None, now_ms=T + MIN)
    born = n.submit(spec(schedule=Interval(period_ms=HOUR, start_at_ms=T + 2 * HOUR)))
    while shard_of(born) != shard:
        born = n.submit(spec(schedule=Interval(period_ms=HOUR, start_at_ms=T + 2 * HOUR)))

    contents, _ = staged_contents(n.store, staged, [shard], T + 2 * MIN)
    owner, acts = Owner(now_ms=T + 2 * MIN, config=n.config), Actions()
    owner.add_shards({shard: 2}, contents, T + 2 * MIN, acts)
    assert owner.has_job(born) and not contents.inflight
    owner.worker_hello("w1", 100, ["default"], T + 2 * MIN, acts)
    fires: set[tuple[int, int]] = set()
    for t in range(T + 2 * MIN, T + 3 * HOUR, MIN):
        owner.advance(t, acts)
        fires |= {(c.job_id, c.scheduled_for) for c in acts.claims}
        acts.claims.clear()
    assert (due, T + MIN) not in fires  # claimed by the old owner already
    assert (due, T + MIN + HOUR) in fires  # where the claim moved it
    assert not any(job == paused for job, _ in fires)
    assert (born, T + 2 * HOUR) in fires


def test_a_staged_shard_is_given_out_once() -> None:
    """Its table becomes the owner's, which changes it: a second gain of the
    same staging is refused, never handed a table already in use."""
    n = Node()
    shard = shard_of(n.submit(spec()))
    staged = stage_from_store(n.store, [shard])
    contents, _ = staged_contents(n.store, staged, [shard], T)
    assert sum(len(t) for t in contents.tables.values()) == 1
    with pytest.raises(ValueError, match="given out already"):
        staged_contents(n.store, staged, [shard], T)


def test_a_shard_taken_on_as_a_table_built_ahead_keeps_each_job_with_its_own_profile() -> None:
    """A table built before its gain numbers profiles its own way; the owner,
    which numbered another profile first, renumbers it in place."""
    n = Node()
    a = n.submit(spec(handler="a"))
    b = n.submit(spec(handler="b"))
    while shard_of(b) == shard_of(a):
        b = n.submit(spec(handler="b"))
    images = [n.owner.image_of(j) for j in (a, b)]
    assert images[0] is not None and images[1] is not None
    profiles = [n.owner.profile(i.profile_id) for i in images if i is not None]
    assert profiles[0] is not None and profiles[1] is not None
    tables = {
        shard_of(j): ShardJobs(rows_of([j], [i.nxt], [i.due], [i.param], [0], [i.flags]))
        for j, i in zip((a, b), images, strict=True)
        if i is not None
    }
    owner, acts = Owner(now_ms=n.now, config=n.config), Actions()
    for j, profile in zip((a, b), profiles, strict=True):
        assert profile is not None
        owner.add_shards(
            {shard_of(j): 1},
            ShardContents(tables={shard_of(j): tables[shard_of(j)]}, profiles=[profile]),
            n.now,
            acts,
        )
    assert [tables[shard_of(j)].prof[0] for j in (a, b)] == [0, 1]  # b's renumbered
    assert [owner.image_of(j).profile_id for j in (a, b)] == [i.profile_id for i in images]  # type: ignore[union-attr]
    owner.worker_hello("w1", 10, ["default"], n.now, acts)
    owner.advance(T + MIN, acts)
    assert {c.job_id for c in acts.claims} == {a, b}


def test_an_owner_adds_only_the_shards_it_is_given_and_can_take_more_later() -> None:
    n = Node()
    a, b = _two_shards(n)
    sa, sb = shard_of(a), shard_of(b)
    owner = Owner(now_ms=n.now, config=n.config)
    acts = Actions()
    everything = _contents(n, list(range(256)))
    owner.add_shards({sa: 2}, everything, n.now, acts)
    assert owner.has_job(a) and not owner.has_job(b)
    owner.add_shards({sb: 3}, _contents(n, [sb]), n.now, acts)
    assert owner.has_job(b) and owner.shards() == {sa: 2, sb: 3}
    with pytest.raises(ValueError, match="already held"):
        owner.add_shards({sa: 4}, ShardContents(), n.now, acts)
    owner.remove_shards([sa])
    assert not owner.has_job(a) and owner.has_job(b)
    owner.add_shards({sa: 4}, _contents(n, [sa]), n.now, acts)
    assert owner.has_job(a) and owner.shards()[sa] == 4


def test_a_shard_added_from_checkpoint_rows_wakes_its_jobs_when_touched() -> None:
    n = Node()
    j = n.submit(spec())
    image = n.owner.image_of(j)
    profile = n.owner.profile(image.profile_id) if image is not None else None
    assert image is not None and profile is not None
    owner = Owner(now_ms=n.now, config=n.config)
    acts = Actions()
    rows = rows_of([j], [image.nxt], [image.due], [image.param], [0], [image.flags])
    contents = ShardContents(packed={shard_of(j): rows}, profiles=[profile])
    owner.add_shards({shard_of(j): 3}, contents, n.now, acts)
    assert owner.has_job(j) and j not in owner.jobs  # at rest, no object
    owner.worker_hello("w1", 10, ["default"], n.now, acts)
    owner.advance(T + MIN, acts)
    [claim] = acts.claims
    assert (claim.job_id, claim.scheduled_for, claim.fence >> COUNTER_BITS) == (j, T + MIN, 3)


def test_a_fixed_delay_fire_due_while_a_trigger_runs_is_recorded_missed_not_dropped() -> None:
    """fixed_delay counts its next fire from a run's completion. A scheduled
    fire that comes due while a triggered run is still going is replaced by
    that next fire: it is recorded missed (overlap), never silently gone."""
    n = Node()
    n.hello()
    every = Interval(period_ms=HOUR, mode=IntervalMode.FIXED_DELAY, start_at_ms=T + MIN)
    j = n.submit(spec(schedule=every))
    [a] = [x for x in _trigger_now(n, j).assignments["w1"]]
    n.owner.worker_ack("w1", [(a.run_id, a.fence)], n.now, n.acts)
    n.step(T + 2 * MIN)  # the first scheduled fire comes due during the trigger's run
    n.complete(a)
    assert n.missed(j) == {T + MIN: MissedReason.OVERLAP}
    assert n.store.jobs[j].next_run_at == n.now + HOUR  # counted from the completion


def _trigger_now(n: Node, job_id: int) -> Actions:
    n.driver.trigger(n.store.get_job(job_id), n.now)
    return n.step()


def test_a_refused_shard_is_handed_over_unless_gained_again_since_the_batch() -> None:
    """The store refuses a batch written under epoch 1 for two shards a newer
    owner fenced: the shard this owner still holds under epoch 1 is handed
    over at once. The other one it lost and gained again under epoch 3 while
    the batch was on its way (a lapse and a rejoin): that hold is newer than
    the refusal and stays."""
    n = Node()
    n.hello()
    a, b = _two_shards(n)
    sa, sb = shard_of(a), shard_of(b)
    n.now = T + MIN
    n.driver.advance(n.now)
    old = n.driver.take_batch()
    assert {shard_of(c.job_id) for c in old.claims} == {sa, sb}
    n.store.fence_shards({sa: 2, sb: 2}, "node-new")
    n.driver.hand_over([sa])
    n.store.fence_shards({sa: 3}, "node-old")
    n.owner.add_shards({sa: 3}, _contents(n, [sa]), n.now, n.acts)
    out = n.store.write_batch(old)
    assert out.fenced == {sa, sb}
    assert [c.run_id for c in out.claims] == [None, None]
    assert n.driver.apply(out, n.now, old.epochs) == {sb}
    assert n.owner.shards()[sa] == 3 and sb not in n.owner.shards()
    # The new hold claims a's fire again, under epoch 3.
    n.driver.advance(n.now)
    [again] = n.driver.take_batch().claims
    assert (again.job_id, again.fence >> COUNTER_BITS) == (a, 3)


# -- counters the node's metrics read ----------------------------------------------------


def test_stats_count_fires_claims_dispatches_and_run_endings_by_state() -> None:
    n = Node()
    n.hello()
    ok = n.submit(spec(schedule=Once(at_ms=T + MIN)))
    bad = n.submit(spec(schedule=Once(at_ms=T + MIN), retry=Retry(max_attempts=1)))
    acts = n.step(T + MIN)
    by_job = {a.job_id: a for a in acts.assignments["w1"]}
    n.complete(by_job[ok])
    n.complete(by_job[bad], Outcome.FAILED)
    stats = n.owner.stats
    assert (stats.fires, stats.claims_won, stats.claims_lost, stats.dispatched) == (2, 2, 0, 2)
    assert stats.ended_by_state() == {RunState.SUCCEEDED: 1, RunState.DEAD_LETTERED: 1}
    assert (stats.completed, stats.dead_lettered) == (1, 1)
    copy = stats.copy()
    n.submit(spec(schedule=Once(at_ms=T + 2 * MIN)))
    n.complete(n.run_once(n.owner.job_ids()[-1], T + 2 * MIN))
    assert copy.ended_by_state() == {RunState.SUCCEEDED: 1, RunState.DEAD_LETTERED: 1}  # a snapshot
    assert stats.ended_by_state()[RunState.SUCCEEDED] == 2


def test_a_claim_the_store_refuses_counts_as_lost() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(schedule=Once(at_ms=T + MIN)))
    acts = n.acts
    n.driver.advance(T + MIN)
    batch = n.driver.take_batch()
    [c] = batch.claims
    # Another owner took this fire attempt first.
    n.store.claim_fires([dataclasses.replace(c, fence=c.fence + 1, advance=False)])
    n.driver.apply(n.store.write_batch(batch), T + MIN)
    assert (n.owner.stats.claims_won, n.owner.stats.claims_lost) == (0, 1)
    assert not acts.assignments and j in n.store.jobs


def test_missed_fires_are_counted_by_reason_and_a_catch_up_counts_every_fire() -> None:
    n, j = _restarted_with_backlog(CatchUpMode.RUN_LATEST_ONLY)
    n.step()
    stats = n.owner.stats
    assert stats.fires == 10  # the nine collapsed and the one run
    assert stats.missed_by_reason == {MissedReason.COLLAPSED: 9}
    assert stats.missed == len(n.missed(j)) == 9


def test_a_lapsed_lease_is_counted_noted_with_its_ids_and_redispatched() -> None:
    n = Node()
    n.hello("w1")
    j = n.submit(spec(schedule=Once(at_ms=T + MIN)))
    a = n.run_once(j, T + MIN, ack=False)
    n.silent.add("w1")
    n.hello("w2")
    acts = n.step(T + MIN + n.config.grace_lease_ms)
    stats = n.owner.stats
    assert stats.lost_leases == 1
    assert [(x.what, x.job_id, x.run_id, x.fence, x.worker) for x in acts.notes] == [
        ("lease expired", j, a.run_id, a.fence, "w1")
    ]
    assert stats.ended_by_state() == {RunState.LOST: 1}
    assert stats.redispatched == 1
    [again] = acts.assignments["w2"]
    assert (again.job_id, again.attempt) == (j, 1)


def test_a_failed_attempt_retried_after_its_backoff_is_counted() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(schedule=Once(at_ms=T + MIN)))
    a = n.run_once(j, T + MIN)
    n.complete(a, Outcome.RETRYABLE)
    n.step(n.now + 1)
    assert n.owner.stats.retried == 1
    assert n.owner.stats.ended_by_state() == {RunState.FAILED: 1}


# -- spec updates (Driver.update) ---------------------------------------------------------


def test_an_update_re_arms_from_the_new_schedule_and_fires_nothing_of_the_old_one() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec())  # every minute from T + MIN
    n.complete(n.run_once(j, T + MIN))
    n.now = T + MIN + 10 * SEC
    record = n.store.get_job(j)
    new = replace(record.spec, schedule=Interval(period_ms=7 * SEC, start_at_ms=T))
    update, hold = n.driver.update(record, new, n.now)
    assert hold is not None and update.next_run_at == T + 77 * SEC  # the first after now
    # Held in memory only: a checkpoint keeps the job as the store has it,
    # so a crash in the middle restarts it firing, not paused.
    image = n.owner.image_of(j)
    assert image is not None and not image.flags & PAUSED and image.nxt == T + 2 * MIN
    # While the store writes it, the old schedule's next fire does not come due.
    assert not n.step(T + 2 * MIN + SEC).claims
    result = n.store.update_job(update)
    n.driver.updated(result.job, n.now)
    # The store was slow: the new schedule's fires since are late, and its
    # catch-up policy (run the latest) decides; the others are recorded.
    fires = [c.scheduled_for for c in n.step().claims]
    assert fires == [T + 119 * SEC]
    assert set(n.missed(j)) == {T + k * SEC for k in range(77, 119, 7)}
    assert n.store.jobs[j].next_run_at == T + 126 * SEC
    assert n.owner.next_fires(j, 2) == [T + 126 * SEC, T + 133 * SEC]
    assert {sf for sf, _, _ in n.execs(j)} == {T + MIN, T + 119 * SEC}  # not T + 2 MIN


def test_an_update_the_store_refused_leaves_the_job_firing_as_before() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec())
    n.now = T + 10 * SEC
    record = n.store.get_job(j)
    new = replace(record.spec, schedule=Interval(period_ms=7 * SEC, start_at_ms=T))
    _, hold = n.driver.update(record, new, n.now)
    n.driver.update_failed(j, hold, n.now)
    [c] = n.step(T + MIN).claims
    assert c.scheduled_for == T + MIN and n.store.jobs[j].next_run_at == T + 2 * MIN


def test_fires_due_at_an_updates_instant_run_under_the_old_spec() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(overlap=Overlap(policy=OverlapPolicy.ALLOW, max_concurrent=5)))
    n.now = T + MIN  # the old schedule's fire is due, its timer not yet run
    record = n.store.get_job(j)
    new = replace(record.spec, schedule=Interval(period_ms=7 * SEC, start_at_ms=T + 5 * SEC))
    update, _ = n.driver.update(record, new, n.now)
    claims = n.driver.acts.claims
    assert [c.scheduled_for for c in claims] == [T + MIN]  # claimed by the update itself
    assert update.next_run_at == T + 61 * SEC
    result = n.store.update_job(update)
    n.driver.updated(result.job, n.now)
    n.step()
    n.step(T + 62 * SEC)
    n.step(T + 70 * SEC)
    assert {sf for sf, _, _ in n.execs(j)} == {T + MIN, T + 61 * SEC, T + 68 * SEC}


def test_a_paused_job_updated_stays_paused_with_its_new_spec() -> None:
    n = Node()
    j = n.submit(spec())
    paused = n.store.set_job_state(j, JobState.PAUSED, next_run_at=None, now_ms=n.now)
    n.owner.upsert_job(paused, n.now, n.acts)
    new = replace(paused.spec, handler="other")
    update, hold = n.driver.update(paused, new, n.now)
    assert hold is None and update.next_run_at is None
    n.driver.updated(n.store.update_job(update).job, n.now)
    assert not n.step(T + 5 * MIN).claims
    assert n.store.get_job(j).spec.handler == "other"
