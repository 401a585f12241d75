"""Jobs and their fires: schedules armed in the wheel, fires that come due
and what the overlap and catch-up policies make of them, and every fire not
run recorded missed with its reason."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from wheel.engine.jobtable import NEVER, NO_FIRE, PAUSED, PAYLOAD, ShardJobs
from wheel.engine.model import SCHEDULE_OVER, AlertKind, JobState, MissedReason, RunState
from wheel.engine.owner._claims import Claims, _Pending
from wheel.engine.owner._packed import _Shelf
from wheel.engine.owner._redos import Redos
from wheel.engine.owner._runtable import RunTable, _Run
from wheel.engine.owner._shardmap import ShardMap
from wheel.engine.owner._state import (
    Queues,
    _Job,
    _limit,
    _moves,
    _retry,
)
from wheel.engine.owner._values import (
    FIRE,
    Actions,
    Alert,
    OwnerConfig,
    OwnerStats,
    Phase,
    RevokeReason,
)
from wheel.engine.policy import CatchUpStream
from wheel.engine.profiles import split_spec
from wheel.engine.records import (
    FireClaim,
    JobRecord,
    MissedFire,
    ScheduleAdvance,
)
from wheel.engine.spec import Cron, DstGap, JobSpec, OverlapPolicy
from wheel.engine.timerwheel import TimerWheel

log = logging.getLogger("wheel.owner")

# A ``store_next`` no store row has: the next ``upsert`` re-arms from the row.
_REARM = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class FireHold:
    """A job's fires held while its spec changes in the store
    (``JobBook.hold_fires``): the fire it had armed, and the oldest fire of its
    schedule not claimed yet (queued, buffered or armed; None: none)."""

    armed: int | None
    oldest: int | None


class RunEnds(Protocol):
    """What the job book asks of the run endings (``Owner``): a cancel ends
    the job's runs and revokes those its workers hold."""

    def end_run(
        self,
        run: _Run,
        state: RunState,
        error: str | None,
        acts: Actions,
        now_ms: int,
        *,
        reply_to: str | None = None,
        started_at_ms: int | None = None,
    ) -> None: ...

    def revoke(self, run: _Run, reason: RevokeReason, acts: Actions) -> None: ...


class JobBook(_Shelf):
    """The owner's jobs: at rest as packed rows or awake as ``_Job`` objects
    (``_Shelf``, ``_packed``), their schedules armed in the wheel, the fire
    path (a FIRE timer's ``on_fire``: catch-up, the overlap policy, the
    schedule moved on in the store) and upserts, spec changes and cancels.
    It queues the fires it admits with the ``dispatcher`` and asks ``ends``
    to end a cancelled job's runs."""

    __slots__ = ("claims", "dispatcher", "ends", "later", "redos", "runs", "stats")

    dispatcher: Queues
    ends: RunEnds

    def __init__(
        self,
        *,
        config: OwnerConfig,
        wheel: TimerWheel,
        shard_map: ShardMap,
        runs: RunTable,
        claims: Claims,
        redos: Redos,
        stats: OwnerStats,
        now_ms: int,
    ) -> None:
        super().__init__(config=config, wheel=wheel, shard_map=shard_map, now_ms=now_ms)
        self.runs = runs
        self.claims = claims
        self.redos = redos
        self.stats = stats
        # Claims made without an Actions at hand, sent with the next advance.
        self.later = Actions()

    def upsert_job(self, record: JobRecord, now_ms: int, acts: Actions) -> None:
        """A job as the store has it now (submitted, changed, or reloaded). Store wins."""
        template, param = split_spec(record.spec)
        self.upsert(
            record.job_id,
            record.state,
            record.next_run_at,
            self.profiles.intern(template),
            param,
            bool(record.spec.payload),
            now_ms,
            acts,
        )

    def upsert(
        self,
        job_id: int,
        state: JobState,
        next_run_at: int | None,
        prof: int,
        param: int,
        has_payload: bool,
        now_ms: int,
        acts: Actions,
    ) -> None:
        """``upsert_job`` of a job named by its packed fields: its profile
        (a number of ``self.profiles``), schedule parameter and whether it
        has a payload. A new job, or one at rest whose row the store agrees
        with, stays at rest: no object is made."""
        over = state is JobState.CANCELLED or state in SCHEDULE_OVER
        job = self.jobs.get(job_id)
        if job is None:
            table = self.shard_map.table_of(job_id)
            if table is None:
                return  # of a shard this owner does not hold (any more)
            i = table.find(job_id)
            if i >= 0:
                if not over and _rests_as(table, i, state, next_run_at, prof, param, has_payload):
                    return  # at rest just as the store has it
                job = self._wake(job_id)
            elif over:
                return
            elif _may_rest(self.profiles[prof].template, state, next_run_at):
                paused = state is JobState.PAUSED
                nxt = NO_FIRE if next_run_at is None else next_run_at
                flags = (PAUSED if paused else 0) | (PAYLOAD if has_payload else 0)
                due = NEVER if paused else nxt
                self._park(table, job_id, nxt, due, param, prof, flags, new=True)
                self.dirty.add(job_id)
                return
        if (
            job is not None
            and state is JobState.ACTIVE
            and next_run_at is not None
            and next_run_at <= job.moved_past
        ):
            # Read before this owner's own claim or schedule advance that
            # moved next_run_at past that fire landed (a change feed page or
            # a re-read on its way while the write was): the store has moved
            # on already. Applied, the fire came due again: recorded missed
            # (overlap) behind its own run, or run after it was missed.
            return
        if over:
            if job is not None:
                self._drop_job(job, cancelled=state is JobState.CANCELLED, now_ms=now_ms, acts=acts)
            return
        template = self.profiles[prof].template
        rerouted = False
        if job is None:
            job = _Job(
                job_id,
                template,
                self.compile_spec(job_id, template, param),
                prof,
                param,
                has_payload,
            )
            self.keep_job(job)
        elif job.profile != prof or job.param != param:
            moved = (template.pool, template.handler) != job.route
            if moved or template.priority != job.spec.priority:
                # Queued under its old route or priority: queued again under
                # the new ones once the row is applied (below), waiting anew.
                self.dispatcher.unqueue(job)
                rerouted = True
            job.spec = template
            job.profile = prof
            job.param = param
            job.limit = _limit(template)
            job.route = (template.pool, template.handler)
            job.compiled = self.compile_spec(job_id, template, param)
        job.has_payload = has_payload
        self.settling.add(job_id)
        self._apply_store_row(job, state, next_run_at, now_ms, acts)
        if rerouted:
            self.dispatcher.requeue_job(job, now_ms)

    def _apply_store_row(
        self, job: _Job, state: JobState, next_run_at: int | None, now_ms: int, acts: Actions
    ) -> None:
        """An awake job's state and schedule as the store has them."""
        self.dirty.add(job.job_id)
        if state is JobState.PAUSED:
            if not job.paused:
                job.paused = True
                self._clear_pending_fires(job, MissedReason.PAUSED, now_ms, acts)
                # Its fires wait for the resume, not for a worker: out of the
                # queue, unless runs claimed ahead (a trigger's) still go out.
                self.dispatcher.unqueue(job)
                self.dispatcher.requeue_job(job, now_ms)
            job.store_next = next_run_at
            return
        job.paused = False
        if next_run_at != job.store_next or (
            job.next_fire is None and not job.due and next_run_at is not None
        ):
            # The store moved the schedule (a resume, another node, a reload):
            # forget fires derived from the old value and re-arm from the store.
            # Buffered ones too: those before the store's value are not ours
            # any more, the others come due again from it. Kept, a buffered
            # fire behind the new value was claimed with the new value as its
            # CAS and moved the schedule nowhere, or backwards.
            job.due = deque(d for d in job.due if not _moves(d))
            job.buffered.clear()
            # Skipped fires the store moved past are recorded; the others come
            # due again from the store's value and are decided again.
            self.flush_skipped(job, next_run_at, now_ms, acts)
            job.skipped.clear()
            job.store_next = next_run_at
            # A first fire or a resume from now: gap wall times between now
            # and that fire are passed over already.
            self._record_gap_skips(job, now_ms, next_run_at, now_ms, acts)
            self._arm(job, next_run_at)
        if (
            job.compiled.completion_driven
            and next_run_at is None
            and job.next_fire is None
            and job.inflight <= 0
            and not job.due
        ):
            # fixed_delay with nothing running and nothing armed (resumed past
            # its start, where ``next_fire`` has no answer): count the delay
            # from now, or the job would never fire again.
            self._arm(job, job.compiled.next_after_completion(now_ms))
        if job.due:
            self.dispatcher.enqueue(job, now_ms, overdue=False)

    def _arm(self, job: _Job, fire: int | None) -> None:
        job.next_fire = fire
        tid = (job.job_id << 2) | FIRE
        if fire is None:
            self.wheel.cancel(tid)
        else:
            self.wheel.add(tid, self.arm_timer(job.compiled, fire))

    # -- spec updates (``Driver.update``) --------------------------------------------
    #
    # An update changes the store's row and the owner's timers at one point:
    # from the moment the node asks the store for the change, the job fires
    # nothing more of its old schedule (``hold_fires``); once the store has
    # the change, the job is re-armed from the new row (``respecify``), or,
    # if the store refused it, from where it was (``release_fires``). Runs
    # claimed before the hold run under the spec they were claimed with.

    def hold_fires(self, job_id: int) -> FireHold | None:
        """Stop a job's fires coming due and being claimed while its spec
        changes in the store: its FIRE timer is dropped and its queued fires
        wait (as a pause makes them, without a missed record: the new
        schedule decides). None when nothing of it fires (paused, not held
        here)."""
        job = self.job(job_id)
        if job is None or job.paused:
            return None
        armed = job.next_fire
        self.wheel.cancel((job_id << 2) | FIRE)
        job.next_fire = None
        job.paused = True
        self._holds.add(job_id)
        waiting = [f for f, _, moves in job.due if moves] + list(job.buffered)
        if armed is not None:
            waiting.append(armed)
        return FireHold(armed=armed, oldest=min(waiting, default=None))

    def release_fires(self, job_id: int, hold: FireHold, now_ms: int) -> None:
        """The store refused the change: the job fires on as it was (unless
        a read of the store re-armed it meanwhile)."""
        if job_id not in self._holds:
            return
        self._holds.discard(job_id)
        job = self.job(job_id)
        if job is None or not job.paused or job.next_fire is not None or job.cancelled:
            return
        job.paused = False
        self._arm(job, hold.armed)
        if job.due:
            self.dispatcher.enqueue(job, now_ms, overdue=False)
        self.settling.add(job_id)

    def respecify(self, record: JobRecord, now_ms: int, acts: Actions) -> None:
        """The store changed the job's spec and next fire (``record``): its
        profile interned again, its schedule compiled again, and its fires
        re-armed from the store's next fire; queued fires of the old
        schedule not claimed are dropped (the new next fire was computed
        from the oldest of them), retries of fires that ran keep their
        place."""
        held = record.job_id in self._holds
        self._holds.discard(record.job_id)
        job = self.job(record.job_id)
        if job is not None and record.state is JobState.ACTIVE:
            if held:
                job.paused = False
            job.store_next = _REARM
            job.moved_past = -1  # the store's answer to this owner's own change
        self.upsert_job(record, now_ms, acts)

    def rearm_for_calendar(self, job: _Job, now_ms: int, acts: Actions) -> bool:
        """A calendar the job skips changed: its schedule compiled again, and
        armed earlier where a day it skipped is one it fires on now (a day
        it skips now is found skipped when its fire comes due). Whether the
        armed fire moved."""
        job.compiled = compiled = self.compile_spec(job.job_id, job.spec, job.param)
        armed = job.next_fire
        self.settling.add(job.job_id)
        if job.paused or armed is None or armed <= now_ms or compiled.completion_driven:
            return False
        nxt = compiled.next_fire(now_ms)
        if nxt is None or nxt >= armed:
            return False
        job.moved_past = -1  # the store's next_run_at moves back, by this owner
        self._arm(job, nxt)
        self.sync_schedule(job, now_ms, acts)
        return True

    def cancel_job(self, job_id: int, acts: Actions, now_ms: int | None = None) -> None:
        job = self.job(job_id)
        if job is not None:
            now = self.wheel.now if now_ms is None else now_ms
            self._drop_job(job, cancelled=True, now_ms=now, acts=acts)

    def _drop_job(self, job: _Job, *, cancelled: bool, now_ms: int, acts: Actions) -> None:
        if cancelled:
            # Fires queued, buffered or already past due that no run will
            # serve: recorded, never dropped silently (invariant 1).
            self._clear_pending_fires(job, MissedReason.CANCELLED, now_ms, acts)
        self.wheel.cancel((job.job_id << 2) | FIRE)
        job.next_fire = None
        self.flush_skipped(job, None, now_ms, acts)
        job.buffered.clear()
        if cancelled:
            # Retries of fires that ran end with the job: their last attempt
            # is in the store.
            job.due.clear()
            job.paused = job.cancelled = True
        else:
            # Completed (a one-shot is, once its fire is claimed): the schedule
            # is over, but that fire's retries and re-dispatches must still run.
            job.due = deque(d for d in job.due if not _moves(d))
        if cancelled:
            for run in self.runs.values():
                if run.job_id == job.job_id and run.phase in (
                    Phase.READY,
                    Phase.DISPATCHED,
                    Phase.RUNNING,
                ):
                    self.ends.end_run(run, RunState.CANCELLED, "job cancelled", acts, now_ms)
                    if run.worker_id is not None:
                        self.ends.revoke(run, RevokeReason.CANCELLED, acts)
        if cancelled:
            self._drop_redos(job)
        if cancelled or not (job.due or job.ready):
            # Nothing of it waits for a worker any more (``unserved``).
            self.dispatcher.unqueue(job)
        if job.inflight <= 0 and not job.due:
            self._forget_job(job)

    def _drop_redos(self, job: _Job) -> None:
        """A cancelled job's retries waiting for their backoff and lost runs
        waiting for the reaper end with it. Kept, the reaper's breaker went
        on saying that they waited (``reaper_paused``, firing until the
        fleet had room again), and each, requeued on a job that never
        claims again, kept the job awake for good."""
        job_id = job.job_id
        redos = self.redos
        had_lost = redos.lost()
        job.inflight -= redos.drop(lambda j: j == job_id)
        if had_lost and not redos.lost():
            redos.paused = False

    def _clear_pending_fires(
        self, job: _Job, reason: MissedReason, now_ms: int, acts: Actions
    ) -> None:
        """Drop armed/due/buffered fires, each recorded as missed with ``reason``."""
        self.wheel.cancel((job.job_id << 2) | FIRE)
        fires = [f for f, attempt, _ in job.due if attempt == 0] + list(job.buffered)
        # The armed fire may already be past its nominal time (its jitter, or
        # the loop not having woken yet): ``record_paused_fires`` on resume only
        # covers fires after the pause, so it is recorded here.
        armed = first_armed = job.next_fire
        while armed is not None and armed <= now_ms and len(fires) < self.config.max_missed_listed:
            fires.append(armed)
            armed = job.compiled.next_fire(armed)
        if first_armed is not None and first_armed <= now_ms:
            self._record_gap_skips(job, first_armed, now_ms + 1, now_ms, acts)
        # Retries of fires already run keep their place; new fires are dropped.
        job.due = deque(d for d in job.due if _retry(d))
        job.buffered.clear()
        job.next_fire = None
        skips, calendar = job.compiled.skips, MissedReason.CALENDAR  # a skipped day's armed fire
        self._miss(job, [(f, calendar if skips(f) else reason) for f in fires], now_ms, acts)
        self.flush_skipped(job, None, now_ms, acts)

    def record_paused_fires(
        self, job_id: int, paused_from_ms: int, resumed_at_ms: int, acts: Actions
    ) -> None:
        """Fires that came due while a job was paused become missed records."""
        job = self.job(job_id)
        if job is None:
            return
        fires = job.compiled.fires_between(
            paused_from_ms, resumed_at_ms, self.config.max_missed_listed
        )
        skips, calendar, paused = job.compiled.skips, MissedReason.CALENDAR, MissedReason.PAUSED
        self._miss(job, [(f, calendar if skips(f) else paused) for f in fires], resumed_at_ms, acts)
        self._record_gap_skips(job, paused_from_ms, resumed_at_ms + 1, resumed_at_ms, acts)

    def _miss(
        self, job: _Job, missed: Iterable[tuple[int, MissedReason]], now_ms: int, acts: Actions
    ) -> None:
        """Record fires not run, each with its reason: never dropped silently."""
        n = len(acts.missed)
        acts.missed.extend(
            MissedFire(job_id=job.job_id, scheduled_for=f, reason=reason, recorded_at_ms=now_ms)
            for f, reason in missed
        )
        stats = self.stats
        stats.missed += len(acts.missed) - n
        by_reason = stats.missed_by_reason
        for m in acts.missed[n:]:
            by_reason[m.reason] = by_reason.get(m.reason, 0) + 1

    def claim_now(
        self,
        job_id: int,
        fires: Sequence[int],
        now_ms: int,
        acts: Actions,
        *,
        overdue: bool = False,
        attempts: Sequence[int] | None = None,
    ) -> None:
        """Claim out-of-band fires (a trigger, a backfill, a redrive as
        ``attempts``, one a fire; default the first attempt) at once, whatever the
        workers' credit, so that they are in the store before the API answers:
        acknowledged, they survive a crash (a restart restores the runs). Won
        runs wait on their job (READY) and are handed out like its fires:
        first in line, or with ``overdue`` as catch-up work inside the overdue
        budget, fair across tenants; never more at once than the job's
        overlap limit allows. The schedule is left alone (advance=False).
        Only a trigger's run counts as dispatch lag (from the trigger): a
        backfill's or a redrive's fire was not due when it was asked for."""
        job = self.job_or_raise(job_id)
        timed = not overdue and attempts is None
        for i, fire in enumerate(fires):
            attempt = 0 if attempts is None else attempts[i]
            job.inflight += 1
            fence = self.shard_map.next_fence(job.shard)
            acts.claims.append(
                FireClaim(
                    job_id=job_id,
                    scheduled_for=fire,
                    attempt=attempt,
                    fence=fence,
                    dispatched_at_ms=now_ms,
                    advance=False,
                    payload=job.has_payload,
                    concurrency_key=job.spec.concurrency_key,
                    tenant=job.spec.tenant if job.spec.concurrency_key else "",
                )
            )
            self.claims.sent(
                _Pending(
                    job_id, fire, attempt, fence, None, ahead=True, overdue=overdue, timed=timed
                )
            )

    def trigger(self, job_id: int, now_ms: int, acts: Actions) -> int:
        """An out-of-band fire at ``now_ms``, claimed at once (``claim_now``);
        returns its scheduled_for."""
        self.claim_now(job_id, (now_ms,), now_ms, acts)
        return now_ms

    def backfill(
        self, job_id: int, fires: Sequence[int], now_ms: int, acts: Actions | None = None
    ) -> None:
        """Past fires to run as catch-up work, claimed at once (``claim_now``)
        and handed out inside the overdue budget, fair across tenants.
        Without ``acts`` the claims go out with the next ``advance`` (not yet
        durable when this returns)."""
        if acts is None:
            acts = self.later
        self.claim_now(job_id, fires, now_ms, acts, overdue=True)

    def redrive(
        self, job_id: int, fires: Sequence[tuple[int, int]], now_ms: int, acts: Actions
    ) -> None:
        """Dead-lettered fires, each as the attempt given (after its last),
        claimed at once (``claim_now``) with new fences: the store's
        ``UNIQUE (job, fire, attempt)`` makes a fire redriven twice at once
        one run."""
        self.claim_now(job_id, [f for f, _ in fires], now_ms, acts, attempts=[a for _, a in fires])

    def on_fire(self, job: _Job, now_ms: int, acts: Actions) -> None:
        """A job's FIRE timer expired (``advance`` counts it in
        ``stats.fires``; a catch-up adds the other fires it covers)."""
        fire = job.next_fire
        assert fire is not None
        compiled = job.compiled
        if compiled.completion_driven and job.inflight > 0:
            # fixed_delay: a run is still going (a trigger's, a retry), and
            # the next fire counts from its completion. This one is replaced
            # by that fire: recorded missed (overlap) once the schedule moves
            # past it, never dropped silently.
            job.skipped.append(fire)
            job.next_fire = None
            return
        if compiled.skips(fire):
            # A day of a calendar it skips: recorded, not run (``with_calendars``).
            self._miss(job, [(fire, MissedReason.CALENDAR)], now_ms, acts)
            self._arm(job, compiled.after_skip(fire))
            self.sync_schedule(job, now_ms, acts)
            self.settling.add(job.job_id)
            return
        nxt = None if compiled.completion_driven else compiled.next_fire(fire)
        # Late relative to when the fire was due: its jittered time, not its
        # nominal one (a jitter is a delay the job asked for, not lateness).
        overdue = now_ms - compiled.jittered(fire) > self.config.overdue_after_ms
        if overdue:
            # The owner was down or behind: one or more fires are late. The
            # job's catch-up policy decides which run; the rest become missed.
            # However long the backlog, it is planned as ONE catch-up (in
            # chunks of fires listed at a time): run_latest_only runs one fire,
            # not one per chunk. The last fire is held back until it is known
            # to be late: one whose nominal time passed but whose jittered
            # time has not stays armed, or it would run early.
            stream = CatchUpStream(job.spec.catch_up, now_ms)
            chunk = self.config.max_missed_listed
            held, count = fire, 1
            if nxt is not None and nxt <= now_ms:
                while True:
                    more = compiled.fires_between(held, now_ms, chunk)
                    if not more:
                        break
                    self._feed(job, stream, [held, *more[:-1]], now_ms, acts)
                    held, count = more[-1], count + len(more)
                    if len(more) < chunk:
                        break
                if count > 1 and compiled.jittered(held) > now_ms:
                    nxt = held
                    count -= 1  # not due yet: it fires later
                else:
                    self._feed(job, stream, [held], now_ms, acts)
                    nxt = compiled.next_fire(held)
            else:
                self._feed(job, stream, [held], now_ms, acts)
            plan = stream.finish()
            self.stats.fires += count - 1  # each fire of the catch-up, run or missed
            if plan.alert:
                acts.alerts.append(
                    Alert(
                        kind=AlertKind.CATCH_UP_CAPPED,
                        message=f"job {job.job_id}: {plan.alert}",
                        job_id=job.job_id,
                    )
                )
            if compiled.completion_driven and not plan.run:
                # fixed_delay whose fire was not run: no completion will arm
                # the next one, so count from now or the schedule stops.
                nxt = compiled.next_after_completion(now_ms)
            self._record_gap_skips(job, fire, nxt, now_ms, acts)
            self._arm(job, nxt)
            # Planned catch-up runs one after another: the overlap gate
            # applies to the batch as a whole, not between its fires.
            if plan.run:
                self._admit(job, plan.run[0], now_ms, overdue=True, acts=acts)
                if job.buffered and job.buffered[-1] == plan.run[0]:
                    # The batch waits behind the running run as a whole, in
                    # fire order: queued ahead of its first fire, the rest
                    # would be claimed first and the first one's claim would
                    # move the schedule backwards (invariant 3).
                    job.buffered.extend(plan.run[1:])
                else:
                    job.due.extend((f, 0, True) for f in plan.run[1:])
        else:
            self._record_gap_skips(job, fire, nxt, now_ms, acts)
            self._arm(job, nxt)
            self._admit(job, fire, now_ms, overdue=False, acts=acts)
        self.sync_schedule(job, now_ms, acts)
        self.settling.add(job.job_id)

    def _feed(
        self, job: _Job, stream: CatchUpStream, fires: list[int], now_ms: int, acts: Actions
    ) -> None:
        """Overdue fires to the catch-up plan, but those on a skipped
        calendar day: missed (calendar), whatever the plan would make of them."""
        if job.spec.skip_calendars:
            skips = job.compiled.skips
            self._miss(job, [(f, MissedReason.CALENDAR) for f in fires if skips(f)], now_ms, acts)
            fires = [f for f in fires if not skips(f)]
        self._miss(job, stream.feed(fires).missed, now_ms, acts)

    def _record_gap_skips(
        self,
        job: _Job,
        after: int,
        until: int | None,
        now_ms: int,
        acts: Actions,
    ) -> None:
        """Record the wall times a ``DstGap.SKIP`` cron policy passed over in
        ``(after, until)`` as missed (dst_gap), once the schedule moves past
        them. Several skipped wall times of one gap share its transition
        instant: one record per instant, and none where a real fire is due at
        that instant too (a fire is never both run and missed). Recorded
        again after a restart from an older next_run_at, it is deduplicated
        by the store like every missed record."""
        if until is None or until <= after + 1:
            return
        skips = job.compiled.skipped_between(after, until - 1, self.config.max_missed_listed)
        if skips:
            compiled = job.compiled
            instants = sorted(
                {s.at_ms for s in skips if compiled.next_fire(s.at_ms - 1) != s.at_ms}
            )
            self._miss(job, [(at, MissedReason.DST_GAP) for at in instants], now_ms, acts)

    def _admit(self, job: _Job, fire: int, now_ms: int, *, overdue: bool, acts: Actions) -> None:
        """Apply the overlap policy to a fire that came due."""
        overlap = job.spec.overlap
        if job.inflight + len(job.due) < job.limit:
            job.due.append((fire, 0, True))
            self.dispatcher.enqueue(job, now_ms, overdue=overdue)
            return
        room = {OverlapPolicy.BUFFER_ONE: 1, OverlapPolicy.BUFFER_ALL: overlap.max_buffered}
        if len(job.buffered) < room.get(overlap.policy, 0):
            job.buffered.append(fire)
            return
        if (
            job.ending
            and overlap.policy not in room
            and job.inflight - job.ending + len(job.due) + len(job.buffered) < job.limit
        ):
            # Only runs that have ended are in the way, their terminal state
            # not yet applied by the store: the fire waits for its answer
            # (``RunEndings.on_completed``), it is not skipped for an overlap.
            job.buffered.append(fire)
            return
        # Recorded missed once next_run_at moves past it (``sync_schedule``
        # right after, or the claim of the fire that holds it back).
        job.skipped.append(fire)

    def sync_schedule(self, job: _Job, now_ms: int, acts: Actions) -> None:
        """Move the store's next_run_at past fires that will never be claimed
        (missed, skipped by overlap) when no claim of ours will move it."""
        due = job.due
        if job.buffered:
            return
        if due:
            _, _, moves = due[0]
            if moves or any(moves for _, _, moves in due):
                return
            return
        if job.advancing:
            # The node writes a pass's advances before its claims: an advance
            # chained after a claim still on its way would find the store's
            # next_run_at not moved yet, fail, and leave the owner believing
            # it had moved. It is sent once the claim is answered.
            return
        target = job.next_fire
        if target is None and job.compiled.completion_driven and job.inflight > 0:
            return  # fixed_delay: the run's completion sets the next fire
        if job.store_next != target and job.store_next is not None:
            if target is None and not job.compiled.completion_driven and not job.spec.recurring:
                # A one-shot whose only fire was skipped: a claim-less advance
                # must not complete the job; leave it for the catch-up record.
                # (A bounded schedule's last fire skipped ends it: the store
                # completes the job once no run of it is in flight.)
                return
            acts.advances.append(
                ScheduleAdvance(
                    job_id=job.job_id,
                    expected_next_run_at=job.store_next,
                    new_next_run_at=target,
                    ends=target is None and job.spec.bounded,
                )
            )
            if target is not None:
                job.moved_past = max(job.moved_past, target - 1)
            job.store_next = target
            self.dirty.add(job.job_id)
        self.flush_skipped(job, job.store_next, now_ms, acts)

    def flush_skipped(self, job: _Job, upto: int | None, now_ms: int, acts: Actions) -> None:
        """Record overlap-skipped fires before ``upto`` (all of them if None) as
        missed, in the same store pass as the write that moves next_run_at to
        ``upto`` (missed records are written first).

        Recorded while an older buffered or queued fire still held next_run_at
        back, a restart from the store would arm that older fire, catch up
        through the skipped one and run it: a fire both run and missed.
        """
        if not job.skipped:
            return
        if upto is None:
            gone, job.skipped = job.skipped, []
        else:
            gone = [f for f in job.skipped if f < upto]
            if not gone:
                return
            job.skipped = [f for f in job.skipped if f >= upto]
        self._miss(job, [(f, MissedReason.OVERLAP) for f in gone], now_ms, acts)

    def run_finished(self, job: _Job, now_ms: int, acts: Actions) -> None:
        job.inflight -= 1
        ended = False
        if job.compiled.completion_driven and not job.paused and job.next_fire is None:
            nxt = job.compiled.next_after_completion(now_ms)
            if job.inflight == 0 and nxt is not None:
                self._arm(job, nxt)
                self.sync_schedule(job, now_ms, acts)
            elif job.inflight == 0 and job.spec.bounded:
                # Its next fire would be past its bound: the schedule is over
                # (the advance that says so completes the job in the store).
                ended = True
                self.sync_schedule(job, now_ms, acts)
        if job.buffered and not job.paused and job.inflight + len(job.due) < job.limit:
            job.due.append((job.buffered.popleft(), 0, True))
        self.dispatcher.requeue_job(job, now_ms)
        if (
            job.inflight <= 0
            and job.next_fire is None
            and not job.due
            and (job.cancelled or ended or not (job.paused or job.compiled.completion_driven))
        ):
            # Its schedule is over (a one-shot's fire ran): it leaves.
            self.wheel.cancel((job.job_id << 2) | FIRE)
            self._forget_job(job)
        else:
            self.settling.add(job.job_id)

    def next_fires(self, job_id: int, count: int) -> list[int]:
        job = self.job(job_id)
        return [] if job is None else job.compiled.upcoming(job.next_fire, count)


def _rests_as(
    table: ShardJobs,
    i: int,
    state: JobState,
    next_run_at: int | None,
    prof: int,
    param: int,
    has_payload: bool,
) -> bool:
    """Row ``i`` says what the store says of the job."""
    flags = table.flags[i]
    return (
        bool(flags & PAUSED) == (state is JobState.PAUSED)
        and table.nxt[i] == (NO_FIRE if next_run_at is None else next_run_at)
        and table.prof[i] == prof
        and table.param[i] == param
        and bool(flags & PAYLOAD) == has_payload
    )


def _may_rest(template: JobSpec, state: JobState, next_run_at: int | None) -> bool:
    """A new job of this profile and state can start at rest: arming it is
    its next fire's timer and nothing else (a cron that skips DST gaps
    records the skipped wall times before its first fire, and a fixed-delay
    job with no fire counts its delay from now: those are made awake)."""
    if state is JobState.PAUSED:
        return True
    if next_run_at is None:
        return False
    s = template.schedule
    return not (isinstance(s, Cron) and s.dst_gap is DstGap.SKIP)
