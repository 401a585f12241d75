"""Run endings: terminal states sent to the store and what follows their
answer (retries with backoff, re-dispatch of lost leases through the rate
limited reaper), hand-backs, leases and timeouts."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from wheel.engine.model import AlertKind, JobState, RunState, one_shot_end
from wheel.engine.owner._fleet import Fleet
from wheel.engine.owner._redos import Redo, Redos
from wheel.engine.owner._runtable import RunTable, _Run, set_phase
from wheel.engine.owner._state import (
    _Job,
)
from wheel.engine.owner._tenants import Tenants
from wheel.engine.owner._values import (
    Actions,
    Alert,
    CompletionResult,
    OwnerConfig,
    OwnerStats,
    Phase,
    Revoke,
    RevokeReason,
    RunNote,
)
from wheel.engine.policy import retry_delay_ms, should_retry
from wheel.engine.records import (
    Completion,
    CompletionOutcome,
)
from wheel.engine.spec import OverlapPolicy, SideEffect

if TYPE_CHECKING:
    from wheel.engine.owner._dispatch import Dispatcher
    from wheel.engine.owner._jobs import JobBook

log = logging.getLogger("wheel.owner")
# Overlap policies that buffer nothing of their own: a fire they would skip
# is held only while the run in its way is ending (``_Job.ending``).
_HOLDING = (OverlapPolicy.SKIP, OverlapPolicy.ALLOW)


def schedule_over(job: _Job) -> bool:
    """A bounded recurring job whose schedule the store has over (its last
    fire claimed: no next fire), of which the run ending is the last one in
    flight (an earlier fire's run may outlast the last fire's): that run's
    end, for good, completes it."""
    return (
        job.spec.bounded
        and job.store_next is None
        and not job.paused
        and job.inflight - job.ending <= 1
        and not job.due
        and not job.buffered
    )


def _note(what: str, run: _Run) -> RunNote:
    return RunNote(
        what=what, job_id=run.job_id, run_id=run.run_id, fence=run.fence, worker=run.worker_id
    )


class RunEndings:
    """Run endings: terminal states sent to the store (``end_run``) and what
    follows the store's answer (``on_completed``: retries, re-dispatch of
    lost runs through the reaper), hand-backs, lease and timeout timers.
    It keeps no state of its own: it moves runs through the run table and
    tells the job book and the dispatcher what a run's end frees."""

    __slots__ = (
        "book",
        "config",
        "dispatcher",
        "redos",
        "runs",
        "stats",
        "tenants",
        "workers",
    )

    def __init__(
        self,
        *,
        book: JobBook,
        config: OwnerConfig,
        dispatcher: Dispatcher,
        redos: Redos,
        runs: RunTable,
        stats: OwnerStats,
        tenants: Tenants,
        workers: Fleet,
    ) -> None:
        self.book = book
        self.config = config
        self.dispatcher = dispatcher
        self.redos = redos
        self.runs = runs
        self.stats = stats
        self.tenants = tenants
        self.workers = workers

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
        result: str | None = None,
        retry_after_ms: int = 0,
    ) -> None:
        """Send a terminal state to the store; follow-ups wait for its answer.
        ``started_at_ms``: the run's start, for the store to keep if it has
        none (a run completed before it was acked); ``result``: what the run
        left (a JSON object), kept with it; ``retry_after_ms``: the least
        wait before its retry, if it gets one."""
        self.runs.ending(run, state, reply_to, retry_after_ms)
        if run.worker_id is not None:
            w = self.workers.get(run.worker_id)
            if w is not None:
                w.held.discard(run.run_id)
        job = self.book.jobs.get(run.job_id)
        job_state = None
        if job is not None and (not job.spec.recurring or schedule_over(job)):
            job_state = one_shot_end(state)
            if job_state is not None and job.spec.recurring:
                # A bounded schedule's last fire ended for good: the job is
                # completed, whatever its runs' outcomes (each keeps its own).
                job_state = JobState.COMPLETED
        acts.completions.append(
            Completion(
                run_id=run.run_id,
                fence=run.fence,
                state=state,
                finished_at_ms=now_ms,
                error=error,
                worker_id=run.worker_id,
                # A one-shot's state tells how its fire ended (the store
                # moves only a job whose schedule is over).
                job_state=job_state,
                started_at_ms=started_at_ms,
                result=result,
            )
        )
        if job is not None:
            job.ending += 1
            if job.spec.concurrency_key:
                # Its permit comes back with this end: this owner's claims
                # waiting for the key go in the same store batch, and that
                # batch does not wait for the loop's tick (``_keywaits``).
                self.dispatcher.keywaits.hand_off(job.spec.tenant, job.spec.concurrency_key)

    def take_back(self, run: _Run, now_ms: int) -> None:
        """A worker gives back a run it never started: it goes to another
        worker of its route with the same attempt and fence (nothing ran that
        a newer fence must shut out), and waits with no lease and no timeout
        running until one takes it. The worker that gave it back is not
        offered it again for a grace lease (another may take it meanwhile),
        or until it says hello again: a worker draining goes away, and one
        redeployed says hello with its new handlers."""
        worker = self.workers.get(run.worker_id) if run.worker_id is not None else None
        if worker is not None:
            worker.held.discard(run.run_id)
            if run.refused is None:
                run.refused = {}
            run.refused[worker.incarnation] = now_ms + self.config.grace_lease_ms
        self.runs.disarm(run)
        run.armed = False
        run.worker_id = None
        run.lease_deadline = run.timeout_deadline = 0
        set_phase(run, Phase.READY)
        job = self.book.jobs.get(run.job_id) or self.book.job(run.job_id)
        if job is not None and run.held_out:
            job.running -= 1
        run.held_out = False
        if self.tenants.holds_runs():
            self.tenants.unhold(run.run_id)
        self.dispatcher.wait_ready(run, job)

    def on_completed(
        self, outcomes: Sequence[CompletionOutcome], now_ms: int, acts: Actions
    ) -> None:
        """The store's answer to a completion batch: follow-ups for applied ones."""
        for out in outcomes:
            run = self.runs.ended(out.run_id)
            if run is None:
                continue
            state, reply_to = run.end_state, run.reply_to
            if self.tenants.holds_runs():
                self.tenants.unhold(run.run_id)
            if reply_to is not None:
                acts.results.setdefault(reply_to, []).append(
                    CompletionResult(
                        run_id=run.run_id,
                        accepted=out.applied,
                        reason="" if out.applied else "superseded: a newer attempt exists",
                    )
                )
            job = self.book.jobs.get(run.job_id) or self.book.job(run.job_id)
            if job is None:
                continue
            if job.spec.concurrency_key:
                # Its permit is back in the store: this owner's waiting
                # claims of the key ask for it now, not at the next poll.
                self.dispatcher.keywaits.kick(job.spec.tenant, job.spec.concurrency_key)
            job.ending = max(0, job.ending - 1)
            if run.held_out:
                job.running -= 1
                if job.ready:
                    self.dispatcher.requeue_job(job, now_ms)  # a run claimed ahead may go now
            if not out.applied:
                self.stats.superseded_completions += 1
                self.book.run_finished(job, now_ms, acts)
                continue
            if state is RunState.SUCCEEDED:
                self.stats.completed += 1
            else:
                ended = self.stats.ended
                ended[state] = ended.get(state, 0) + 1
                if state is RunState.DEAD_LETTERED:
                    self.stats.dead_lettered += 1
                    acts.alerts.append(
                        Alert(
                            kind=AlertKind.DEAD_LETTERED,
                            message=f"job {job.job_id} fire {run.scheduled_for}: dead-lettered",
                            job_id=job.job_id,
                            run_id=run.run_id,
                            fence=run.fence,
                            worker=run.worker_id,
                        )
                    )
            if state in (RunState.FAILED, RunState.TIMED_OUT) and should_retry(
                job.spec.retry, failed_attempt=run.attempt
            ):
                self._schedule_retry(job, run, now_ms)
                self._release_held(job, now_ms, acts)
                continue
            if state is RunState.LOST:
                self.redos.reap_later(Redo(job.job_id, run.scheduled_for, run.attempt + 1))
                self._release_held(job, now_ms, acts)
                continue
            self.book.run_finished(job, now_ms, acts)

    def _release_held(self, job: _Job, now_ms: int, acts: Actions) -> None:
        """The run a fire was held behind goes on (a retry, a re-dispatch):
        under ``skip`` or ``allow`` the held fire is skipped after all, as it
        would have been when it came due; fires of a catch-up batch held
        behind it are queued, as they would have been then."""
        if not job.buffered or job.spec.overlap.policy not in _HOLDING or job.ending:
            return
        job.skipped.append(job.buffered.popleft())
        job.due.extend((f, 0, True) for f in job.buffered)
        job.buffered.clear()
        if job.due:
            self.dispatcher.enqueue(job, now_ms, overdue=True)
        self.book.sync_schedule(job, now_ms, acts)

    def _schedule_retry(self, job: _Job, run: _Run, now_ms: int) -> None:
        """The next attempt, after the job's backoff or the wait the failed
        attempt asked for (a Retry-After), whichever is longer."""
        delay = max(
            retry_delay_ms(
                job.spec.retry,
                failed_attempt=run.attempt,
                job_id=job.job_id,
                scheduled_for=run.scheduled_for,
            ),
            run.retry_after,
        )
        self.redos.retry_at(Redo(job.job_id, run.scheduled_for, run.attempt + 1), now_ms + delay)

    def on_retry(self, seq: int, now_ms: int) -> None:
        redo = self.redos.retry_due(seq)
        if redo is not None:
            self.stats.retried += 1
            self._requeue(redo, now_ms)

    def _requeue(self, redo: Redo, now_ms: int) -> None:
        """A retry or a re-dispatch of a fire that already ran: first in line."""
        job = self.book.job(redo.job_id)
        if job is None:
            return
        job.inflight -= 1
        job.due.appendleft((redo.fire, redo.attempt, False))
        self.dispatcher.enqueue(job, now_ms, overdue=False)

    def on_lease_timer(self, run_id: int, now_ms: int, acts: Actions) -> None:
        run = self.runs.get(run_id)
        if run is None or run.phase not in (Phase.DISPATCHED, Phase.RUNNING):
            return
        if run.lease_deadline > now_ms:
            # Renewed since the timer was set: renewals only move the deadline.
            self.runs.renew_timer(run)
            return
        self.stats.lost_leases += 1
        acts.notes.append(_note("lease expired", run))
        if run.worker_id is not None:
            holder = self.workers.get(run.worker_id)
            if holder is not None:
                # Its stream is up but it did not renew: do not hand the
                # re-dispatch (or anything else) straight back to it.
                holder.silent = True
            self.revoke(run, RevokeReason.LEASE_EXPIRED, acts)
        self.lose(run, "lease expired", now_ms, acts)

    def lose(
        self, run: _Run, why: str, now_ms: int, acts: Actions, *, reply_to: str | None = None
    ) -> None:
        """A run that may have had its effect ended without an outcome (its
        lease lapsed, its worker gave up on it): an at_most_once run becomes
        unknown; another is re-dispatched as a new attempt while attempts
        remain, else dead-lettered."""
        job = self.book.job(run.job_id)
        if job is not None and job.spec.side_effect is SideEffect.AT_MOST_ONCE:
            acts.alerts.append(
                Alert(
                    kind=AlertKind.OUTCOME_UNKNOWN,
                    message=f"job {run.job_id} fire {run.scheduled_for}: at_most_once run {why};"
                    " outcome unknown, not re-dispatched",
                    job_id=run.job_id,
                    run_id=run.run_id,
                    fence=run.fence,
                    worker=run.worker_id,
                )
            )
            self.end_run(run, RunState.UNKNOWN, why, acts, now_ms, reply_to=reply_to)
        elif job is not None and should_retry(job.spec.retry, failed_attempt=run.attempt):
            self.end_run(run, RunState.LOST, why, acts, now_ms, reply_to=reply_to)
        else:
            self.end_run(
                run,
                RunState.DEAD_LETTERED,
                f"{why} on the last attempt",
                acts,
                now_ms,
                reply_to=reply_to,
            )

    def on_timeout(self, run_id: int, now_ms: int, acts: Actions) -> None:
        run = self.runs.get(run_id)
        if run is None or run.phase not in (Phase.DISPATCHED, Phase.RUNNING, Phase.READY):
            return
        self.stats.timed_out += 1
        acts.notes.append(_note("timed out", run))
        if run.worker_id is not None:
            self.revoke(run, RevokeReason.TIMED_OUT, acts)
        job = self.book.job(run.job_id)
        # An at_most_once run that was handed out may have had its effect: a
        # timeout is no proof it did not, so it is never re-dispatched.
        last = (
            job is None
            or job.spec.side_effect is SideEffect.AT_MOST_ONCE
            or not should_retry(job.spec.retry, failed_attempt=run.attempt)
        )
        self.end_run(
            run,
            RunState.DEAD_LETTERED if last else RunState.TIMED_OUT,
            "timed out",
            acts,
            now_ms,
        )

    def revoke(self, run: _Run, reason: RevokeReason, acts: Actions) -> None:
        if run.worker_id is not None and run.worker_id in self.workers:
            acts.revokes.setdefault(run.worker_id, []).append(
                Revoke(run_id=run.run_id, fence=run.fence, reason=reason)
            )

    def run_reaper(self, now_ms: int, acts: Actions) -> None:
        """Re-dispatch fires whose lease expired, rate limited, and not at all
        while the fleet is nearly saturated (seed R6: a spiral is worse)."""
        redos = self.redos
        if not redos.lost():
            redos.paused = False  # nothing waits for it (a cancel, a hand-over)
            return
        if self.workers.busy(self.config.busy_threshold):
            if not redos.paused:
                redos.paused = True
                acts.alerts.append(
                    Alert(kind=AlertKind.REAPER_PAUSED, message=self._reaper_paused_why())
                )
            return
        redos.paused = False
        due = redos.reap(now_ms)
        self.stats.redispatched += len(due)
        for redo in due:
            self._requeue(redo, now_ms)

    def _reaper_paused_why(self) -> str:
        """Why re-dispatch waits, in the true words: an empty fleet is not
        a busy one."""
        waiting = f"{self.redos.lost()} expired leases wait"
        workers = self.workers.values()
        capacity = sum(w.capacity for w in workers)
        if not workers:
            return f"reaper paused: no worker connected; {waiting} for one"
        if capacity == 0:
            return (
                f"reaper paused: the {len(workers)} connected workers have no capacity;"
                f" {waiting} for some"
            )
        busy = sum(len(w.held) for w in workers)
        return f"reaper paused: fleet {busy}/{capacity} busy; {waiting} for capacity"

    @property
    def reaper_paused(self) -> bool:
        return self.redos.paused
