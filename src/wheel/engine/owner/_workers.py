"""The workers' side of the lease streams: hello, credit, drain, acks,
heartbeats and completions, each checked against the run it names."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from wheel.engine.model import RunState
from wheel.engine.owner._claims import Claims
from wheel.engine.owner._fleet import Fleet
from wheel.engine.owner._runtable import RunTable, _Run, set_phase
from wheel.engine.owner._state import (
    _fence_mismatch,
)
from wheel.engine.owner._values import (
    Actions,
    CompletionResult,
    Outcome,
    OwnerConfig,
    OwnerStats,
    Phase,
    ProtocolViolation,
    WorkerView,
)
from wheel.engine.policy import should_retry
from wheel.engine.records import (
    RunStart,
)

if TYPE_CHECKING:
    from wheel.engine.owner._dispatch import Dispatcher
    from wheel.engine.owner._jobs import JobBook
    from wheel.engine.owner._runs import RunEndings

log = logging.getLogger("wheel.owner")


class WorkerStreams:
    """The workers' messages on their lease streams: hello, credit, acks,
    heartbeats, completions and goodbyes, checked against the run table
    (one holder per run, its fence) and passed on to the fleet, the run
    endings and the dispatcher."""

    __slots__ = (
        "book",
        "claims",
        "config",
        "dispatcher",
        "ends",
        "runs",
        "stats",
        "workers",
    )

    def __init__(
        self,
        *,
        book: JobBook,
        claims: Claims,
        config: OwnerConfig,
        dispatcher: Dispatcher,
        ends: RunEndings,
        runs: RunTable,
        stats: OwnerStats,
        workers: Fleet,
    ) -> None:
        self.book = book
        self.claims = claims
        self.config = config
        self.dispatcher = dispatcher
        self.ends = ends
        self.runs = runs
        self.stats = stats
        self.workers = workers

    def worker_hello(
        self,
        worker_id: str,
        capacity: int,
        pools: Sequence[str],
        now_ms: int,
        acts: Actions,
        *,
        handlers: Sequence[str] = (),
    ) -> None:
        """A worker's stream opened: it serves ``pools`` and runs ``handlers``
        (none named: any). A hello again (a reconnect) keeps the runs it holds
        and forgets the runs it handed back."""
        self.workers.hello(
            worker_id, capacity, frozenset(pools or ("default",)), frozenset(handlers)
        )
        self.dispatcher.dispatch(now_ms, acts)

    def worker_capacity(self, worker_id: str) -> int | None:
        w = self.workers.get(worker_id)
        return None if w is None else w.capacity

    def worker_drain(self, worker_id: str) -> None:
        w = self.workers.get(worker_id)
        if w is not None:
            w.draining = True

    def _heard_from(self, worker_id: str) -> None:
        w = self.workers.get(worker_id)
        if w is not None:
            w.silent = False

    def worker_credit(
        self, worker_id: str, add: int, now_ms: int, acts: Actions, *, seq: int = 0
    ) -> None:
        """More (or less) credit from a worker. A ``seq`` is answered in the
        same actions as the assignments made before it: any run handed out
        from now on respects the new credit (a claim on its way included)."""
        w = self.workers.get(worker_id)
        if w is not None:
            w.silent = False
            w.capacity = max(0, w.capacity + add)
            self.dispatcher.dispatch(now_ms, acts)
        if seq:
            acts.credited[worker_id] = max(seq, acts.credited.get(worker_id, 0))

    def worker_disconnect(self, worker_id: str) -> None:
        """The stream is gone. Its runs keep their leases: the worker may come
        back and renew them; otherwise they expire and are re-dispatched."""
        if self.workers.gone(worker_id) is None:
            return
        self.claims.orphan(worker_id)
        self.dispatcher.held.orphan(worker_id)

    def worker_views(self) -> list[WorkerView]:
        return [
            WorkerView(
                worker_id=w.worker_id,
                capacity=w.capacity,
                held=len(w.held),
                pools=tuple(sorted(w.pools)),
                handlers=tuple(sorted(w.handlers)),
                draining=w.draining,
                silent=w.silent,
            )
            for w in sorted(self.workers.values(), key=lambda w: w.worker_id)
        ]

    def _held_run(
        self, worker_id: str, run_id: int, fence: int, acts: Actions, what: str
    ) -> _Run | None:
        run = self.runs.get(run_id)
        if run is not None and run.worker_id is None and run.fence == fence:
            # Restored after a restart and not adopted yet: the worker that
            # still holds it takes it back, as with a heartbeat.
            run.worker_id = worker_id
            worker = self.workers.get(worker_id)
            if worker is not None:
                worker.held.add(run_id)
        if run is None or run.phase is Phase.ENDING:
            reason = "run not held by this node (unknown or finished)"
        elif run.fence != fence:
            reason = _fence_mismatch(fence, run.fence)
        elif run.worker_id != worker_id:
            reason = "run is held by another worker"
        else:
            return run
        acts.violations.setdefault(worker_id, []).append(
            ProtocolViolation(
                code="FAILED_PRECONDITION", message=f"{what}: {reason}", run_id=run_id
            )
        )
        return None

    def worker_ack(
        self, worker_id: str, refs: Sequence[tuple[int, int]], now_ms: int, acts: Actions
    ) -> None:
        self._heard_from(worker_id)
        for run_id, fence in refs:
            run = self._held_run(worker_id, run_id, fence, acts, "ack")
            if run is None:
                continue
            if run.phase is Phase.DISPATCHED:
                set_phase(run, Phase.RUNNING)
                acts.starts.append(
                    RunStart(run_id=run_id, fence=fence, worker_id=worker_id, started_at_ms=now_ms)
                )
            run.lease_deadline = now_ms + self.config.lease_ms

    def worker_heartbeat(
        self, worker_id: str, refs: Sequence[tuple[int, int]], now_ms: int, acts: Actions
    ) -> None:
        """One stream-level heartbeat renews every run the worker holds."""
        self._heard_from(worker_id)
        worker = self.workers.get(worker_id)
        rejected: list[tuple[int, int]] = []
        deadline = now_ms + self.config.lease_ms
        for run_id, fence in refs:
            run = self.runs.get(run_id)
            ok = run is not None and run.fence == fence and run.phase is not Phase.ENDING
            if ok and run is not None and run.worker_id != worker_id:
                # A run restored from the store after a restart has no holder
                # yet: the worker that still runs it adopts it with its fence.
                ok = run.worker_id is None and run.phase in (Phase.DISPATCHED, Phase.RUNNING)
                if ok and worker is not None:
                    run.worker_id = worker_id
                    worker.held.add(run_id)
            if ok and run is not None and worker is not None and run_id not in worker.held:
                worker.held.add(run_id)  # a reconnect: the stream is new, the lease is not
            if ok and run is not None:
                run.lease_deadline = deadline
            else:
                rejected.append((run_id, fence))
        if rejected:
            acts.rejected_renewals.setdefault(worker_id, []).extend(rejected)

    def worker_complete(
        self,
        worker_id: str,
        completions: Sequence[tuple[int, int, Outcome, str]],
        now_ms: int,
        acts: Actions,
        *,
        ran_ms: Mapping[int, int] | None = None,
        results: Mapping[int, str] | None = None,
        retry_after_ms: Mapping[int, int] | None = None,
    ) -> None:
        """``ran_ms``: how long each run's handler ran, by run id, as its
        worker measured it. A run never acked (it ended before its ack was
        due) has no start recorded: it gets ``now_ms`` less that.
        ``results``: what runs left (a JSON object each), kept with the runs
        that end here; ``retry_after_ms``: the least wait before the retry of
        a retryable failure (its backoff applies if longer). Both by run id,
        holding only the runs that have one."""
        self._heard_from(worker_id)
        for run_id, fence, outcome, error in completions:
            run = self.runs.get(run_id)
            if run is None or run.phase is Phase.ENDING:
                # Not ours in memory (finished, superseded, or from before a
                # restart). The store is the authority: it applies the
                # completion only if the fence is still the newest.
                acts.results.setdefault(worker_id, []).append(
                    CompletionResult(run_id=run_id, accepted=False, reason="run not held")
                )
                self.stats.superseded_completions += 1
                continue
            if run.fence == fence and run.worker_id is None:
                # A run restored after a restart, completed by the worker that
                # still ran it before its first heartbeat on the new stream
                # (the SDK re-sends completions first): adopt it, as a
                # heartbeat would. Rejecting it let the lease expire and re-ran
                # a fire that had succeeded.
                run.worker_id = worker_id
            if run.fence != fence or run.worker_id != worker_id:
                acts.results.setdefault(worker_id, []).append(
                    CompletionResult(
                        run_id=run_id,
                        accepted=False,
                        reason=_fence_mismatch(fence, run.fence)
                        if run.fence != fence
                        else "run is held by another worker",
                    )
                )
                self.stats.superseded_completions += 1
                continue
            # The start of a run that ran, if none was recorded (the store
            # keeps one it has).
            started = now_ms - min(max(ran_ms.get(run_id, 0) if ran_ms else 0, 0), now_ms)
            result = results.get(run_id) if results else None
            if outcome is Outcome.SUCCEEDED:
                self.ends.end_run(
                    run,
                    RunState.SUCCEEDED,
                    None,
                    acts,
                    now_ms,
                    reply_to=worker_id,
                    started_at_ms=started,
                    result=result,
                )
            elif outcome is Outcome.HANDED_BACK:
                self.ends.take_back(run, now_ms)
                acts.results.setdefault(worker_id, []).append(
                    CompletionResult(run_id=run_id, accepted=True)
                )
            elif outcome is Outcome.ABANDONED:
                self.ends.lose(
                    run, "abandoned by its worker while running", now_ms, acts, reply_to=worker_id
                )
            elif (
                outcome is Outcome.RETRYABLE
                and (job := self.book.job(run.job_id)) is not None
                and should_retry(job.spec.retry, failed_attempt=run.attempt)
            ):
                self.ends.end_run(
                    run,
                    RunState.FAILED,
                    error or "failed",
                    acts,
                    now_ms,
                    reply_to=worker_id,
                    started_at_ms=started,
                    result=result,
                    retry_after_ms=retry_after_ms.get(run_id, 0) if retry_after_ms else 0,
                )
            else:
                self.ends.end_run(
                    run,
                    RunState.DEAD_LETTERED,
                    error or "failed",
                    acts,
                    now_ms,
                    reply_to=worker_id,
                    started_at_ms=started,
                    result=result,
                )
