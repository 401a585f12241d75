"""Dispatch: work queued by route (pool, handler), claims formed within the
workers' credit and the overdue budget, claimed runs handed out, and when the
loop must wake next."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from wheel.engine.fairness import TokenBucket, split_capacity
from wheel.engine.model import AlertKind, shard_of
from wheel.engine.owner._claims import Claims, Held, _Pending
from wheel.engine.owner._fleet import Fleet, _Worker
from wheel.engine.owner._keywaits import KeyWaits
from wheel.engine.owner._redos import Redos
from wheel.engine.owner._runtable import RunTable, _Run, set_phase
from wheel.engine.owner._shardmap import ShardMap
from wheel.engine.owner._state import (
    Ahead,
    _Job,
)
from wheel.engine.owner._tenants import Tenants
from wheel.engine.owner._values import (
    Actions,
    Alert,
    Assignment,
    OwnerConfig,
    OwnerStats,
    Phase,
    Route,
    Unserved,
)
from wheel.engine.priority import RankedQueue
from wheel.engine.records import (
    ClaimOutcome,
    FireClaim,
)
from wheel.engine.spec import DEFAULT_PRIORITY
from wheel.engine.timerwheel import TimerWheel

if TYPE_CHECKING:
    from wheel.engine.owner._jobs import JobBook

log = logging.getLogger("wheel.owner")


class Dispatcher:
    """The work queued for workers and its hand-out: jobs with a fresh fire
    and jobs with overdue work by route (fair across tenants), claimed runs
    waiting for a worker, the overdue budget, which worker the next run goes
    to, and the routes no connected worker serves.

    It reads the parts it shares with the owner (the run table, the fleet,
    the tenant limits, the claims on their way, the shard map, the redos)
    and reaches the jobs through ``book``: their awake objects, and what a
    claim changes in a job's schedule."""

    __slots__ = (
        "_given",
        "_next_worker",
        "_overdue_bucket",
        "_resent",
        "book",
        "claims",
        "config",
        "fresh",
        "held",
        "jobs",
        "keywaits",
        "overdue",
        "ready",
        "redos",
        "runs",
        "shard_map",
        "stats",
        "tenants",
        "unserved_alerted",
        "unserved_since",
        "wheel",
        "workers",
    )

    def __init__(
        self,
        book: JobBook,
        *,
        config: OwnerConfig,
        wheel: TimerWheel,
        runs: RunTable,
        workers: Fleet,
        tenants: Tenants,
        claims: Claims,
        shard_map: ShardMap,
        redos: Redos,
        stats: OwnerStats,
        now_ms: int,
        keywaits: KeyWaits | None = None,
    ) -> None:
        self.book = book
        self.jobs = book.jobs  # the book's awake jobs (the same dict)
        self.config = config
        self.wheel = wheel
        self.runs = runs
        self.workers = workers
        self.tenants = tenants
        self.claims = claims
        self.shard_map = shard_map
        self.redos = redos
        self.stats = stats
        # Claims waiting for a permit of their concurrency key (``_keywaits``).
        self.keywaits = (
            keywaits
            if keywaits is not None
            else KeyWaits(config.limit_poll_ms, config.priority_aging_ms)
        )
        # Queued work by route: jobs with a fresh fire, jobs with overdue
        # work (by priority with aging, fair across tenants within a level:
        # wheel.engine.priority), and claimed runs that wait for a worker
        # (theirs went away, or it handed them back; by priority).
        self.fresh: dict[Route, RankedQueue[int]] = {}
        self.overdue: dict[Route, RankedQueue[int]] = {}
        self.ready: dict[Route, deque[int]] = {}
        # Runs claimed ahead of their fire's due time, until then.
        self.held = Held()
        # Routes with work and no connected worker serving them: since when,
        # and whether the alert went out.
        self.unserved_since: dict[Route, int] = {}
        self.unserved_alerted: set[Route] = set()
        rate = config.dispatch_rate_per_s * config.overdue_fraction
        self._next_worker = 0
        self._given = 0  # runs in a row the worker at _next_worker got
        self._overdue_bucket = TokenBucket(rate, max(1.0, rate * config.overdue_burst_s), now_ms)
        # Claims that waited for a permit were sent again since the last
        # store batch took claims (``handing_off``).
        self._resent = False

    def next_wake(self) -> int | None:
        """When budgeted work (overdue fires, expired leases to re-dispatch)
        gets its next token, or waiting work is due an alert (None: never):
        waking just every ``max_idle`` would deliver a fraction of the
        configured rate (``Owner.next_deadline``)."""
        waits: list[int | None] = []
        waits.append(self.held.next_due())
        if self.unserved_since:
            limit = self.config.unserved_alert_ms
            waits.extend(
                since + limit
                for route, since in self.unserved_since.items()
                if route not in self.unserved_alerted
            )
        if self.redos.lost() or any(len(q) for q in self.overdue.values()):
            now = self.wheel.now
            if any(
                len(q) and self.workers.serves_with_credit(route)
                for route, q in self.overdue.items()
            ):
                waits.append(self._overdue_bucket.next_available_ms(now))
            if self.redos.lost() and self.workers.any_free() and not self._fleet_busy():
                waits.append(self.redos.next_token_ms(now))
        if self.tenants.any_blocked():
            waits.append(self.tenants.wake(self.wheel.now))
        if self.keywaits and self.workers.any_free():
            waits.append(self.keywaits.next_wake())
        return min((w for w in waits if w is not None), default=None)

    def has_dispatchable_work(self) -> bool:
        """Whether ``advance(now)`` would hand out or claim something right
        away: a waiting run or a queued fresh fire with a worker of its route
        that has credit, or overdue fires / expired leases with tokens too.
        The node asks after feeding the store's answers back, so a buffered
        fire released by a completion or a claim lost to a gone worker goes
        out at once instead of at the next wake. O(routes x workers)."""
        if not self.workers or not self.workers.any_free():
            return False
        now = self.wheel.now
        for route, q in self.ready.items():
            if q and any(self._placeable(run_id, route) for run_id in q):
                return True
        if len(self.claims) >= self.config.max_claim_batch:
            return False
        if self.keywaits.due(now):
            return True
        if any(
            q and self.workers.serves_with_credit(route) and self.tenants.has_unblocked(q)
            for route, q in self.fresh.items()
        ):
            return True
        if self._overdue_bucket.available(now) > 0 and any(
            len(q) and self.workers.serves_with_credit(route) and self.tenants.has_unblocked(q)
            for route, q in self.overdue.items()
        ):
            return True
        return bool(self.redos.lost() and not self._fleet_busy() and self.redos.tokens(now) > 0)

    def _fleet_busy(self) -> bool:
        """Above the reaper's busy threshold (or no capacity at all)."""
        return self.workers.busy(self.config.busy_threshold)

    def _placeable(self, run_id: int, route: Route) -> bool:
        """A waiting run could go out now: a worker of its route that did not
        hand it back has credit, and its job is below its limit."""
        run = self.runs.get(run_id)
        if run is None or run.phase is not Phase.READY:
            return True  # dropped from the queue on the next pass
        job = self.jobs.get(run.job_id) or self.book.job(run.job_id)
        if job is not None and job.running >= job.limit:
            return False
        if (
            job is not None
            and self.tenants.limits
            and self.tenants.over_in_flight(job.spec.tenant, self._claiming())
        ):
            return False  # a run of the tenant ending wakes it
        return self.workers.server_for(route, run.refused, self.wheel.now) is not None

    def enqueue(self, job: _Job, now_ms: int, *, overdue: bool, front: bool = False) -> None:
        if job.queued or not (job.due or job.ready):
            return
        job.queued = True
        route = job.route
        queues = self.overdue if overdue else self.fresh
        q = queues.get(route)
        if q is None:
            q = queues[route] = RankedQueue(self.config.priority_aging_ms)
        spec = job.spec
        if front and not overdue:
            q.push_front(spec.tenant, job.job_id, spec.priority, now_ms)
        else:
            q.push(spec.tenant, job.job_id, spec.priority, now_ms)

    def unqueue(self, job: _Job) -> None:
        """Take ``job`` out of its route's queues at once (cancelled, paused,
        or given another route), and its ended runs out of those waiting for
        a worker; the route leaves ``unserved`` when nothing of it waits. An
        entry left in a queue is dropped by the queue's next pop, which never
        comes on a route no worker serves: its count and its no_worker alert
        outlived their cause until a restart."""
        route = job.route
        if job.queued:
            job_id = job.job_id
            for queues in (self.fresh, self.overdue):
                q = queues.get(route)
                if q is not None and q.discard(lambda j: j == job_id, job.spec.tenant):
                    if not q:
                        del queues[route]
                    break
            job.queued = False
        job.ready = deque(a for a in job.ready if self._is_ready(a.run_id))
        waiting = self.ready.get(route)
        if waiting:
            live = deque(r for r in waiting if self._is_ready(r))
            if live:
                self.ready[route] = live
            else:
                del self.ready[route]
        if route in self.unserved_since and not self._waiting_on(route):
            del self.unserved_since[route]
            self.unserved_alerted.discard(route)

    def unqueue_shards(self, lost: set[int]) -> None:
        """Take the queued work of shards handed over out of the queues, and
        the routes left with nothing waiting out of ``unserved`` (the same
        stale count ``_unqueue`` spares a cancelled job)."""
        for queues in (self.fresh, self.overdue):
            for route, q in list(queues.items()):
                q.discard(lambda j: shard_of(j) in lost)
                if not q:
                    del queues[route]
        for route, waiting in list(self.ready.items()):
            live = deque(r for r in waiting if self._is_ready(r))
            if live:
                self.ready[route] = live
            else:
                del self.ready[route]
        for route in [r for r in self.unserved_since if not self._waiting_on(r)]:
            del self.unserved_since[route]
            self.unserved_alerted.discard(route)

    def _is_ready(self, run_id: int) -> bool:
        """A claimed run still waiting for a worker."""
        run = self.runs.get(run_id)
        return run is not None and run.phase is Phase.READY

    def dispatch(self, now_ms: int, acts: Actions, *, release_held: bool = False) -> None:
        held_due = self.held.next_due() if release_held else None
        if held_due is not None and held_due <= now_ms:
            self._release_held(now_ms, acts)
        starved: list[Route] = []  # routes with work and no worker with credit
        if self.ready:
            starved.extend(self._assign_ready(now_ms, acts))
        if self.keywaits and acts.completions:
            self._kick_ending(acts)
        if self.keywaits.due(now_ms):
            self._claim_again(now_ms, acts, handing=self.keywaits.handing_off())
        budget = self.config.max_claim_batch - len(self.claims)
        # Limited tenants' allowances (wheel.engine.owner._tenants), counted
        # down by the pops of every route.
        allow = self.tenants.allowance(now_ms, self._claiming()) if self.tenants.limits else None
        before = dict(allow) if allow is not None else None
        # In the order routes first had work (a set's order would change
        # with the hash seed, and a simulation must replay exactly).
        routes = list(self.fresh)
        routes.extend(r for r in self.overdue if r not in self.fresh)
        for route in routes:
            fresh = self.fresh.get(route)
            over = self.overdue.get(route)
            if not fresh and not over:
                self.fresh.pop(route, None)
                self.overdue.pop(route, None)
                continue
            workers = self.workers.serving(route)
            if not workers:
                starved.append(route)
                continue
            capacity = min(budget, sum(w.free for w in workers))
            if capacity <= 0:
                continue
            # Fresh fires first, by priority and fair across tenants within
            # a priority; overdue work gets what they leave (tenants held
            # back by a quota leave some), inside the overdue budget. Except
            # overdue work of a better priority than any fresh fire's (a
            # priority-0 job's retry or lost run among priority-9 fires):
            # it goes first, inside the budget all the same.
            picked: list[tuple[int, bool]] = []
            if over and fresh and over.best_level() < fresh.best_level():
                top = fresh.best_level()
                n = self._overdue_bucket.take(min(capacity, over.count_below(top)), now_ms)
                picked.extend((j, True) for j in over.pop(n, now_ms, allow, below=top))
            if fresh:
                room = capacity - len(picked)
                picked.extend((j, False) for j in fresh.pop(room, now_ms, allow))
            if over:
                split = split_capacity(
                    capacity=capacity,
                    fresh_waiting=len(picked),
                    overdue_waiting=len(over),
                    overdue_tokens=self._overdue_bucket.available(now_ms),
                )
                if split.overdue:
                    n = self._overdue_bucket.take(split.overdue, now_ms)
                    picked.extend((j, True) for j in over.pop(n, now_ms, allow))
            budget -= len(picked)
            self._claim(picked, workers, now_ms, acts)
        if allow is not None and before is not None:
            self.tenants.took(before, allow, now_ms)
        if starved or self.unserved_since:
            self._note_unserved(starved, now_ms, acts)

    def _note_unserved(self, starved: list[Route], now_ms: int, acts: Actions) -> None:
        """Of the routes whose work found no worker with credit, those no
        connected worker serves at all: their work waits (unclaimed, or
        claimed without a lease), reported by ``unserved`` and, once it has
        waited ``unserved_alert_ms``, by an alert."""
        workers = self.workers.values()
        was = self.unserved_since
        self.unserved_since = {
            route: was.get(route, now_ms)
            for route in starved
            if not any(w.serves(route) for w in workers)
        }
        self.unserved_alerted &= self.unserved_since.keys()
        limit = self.config.unserved_alert_ms
        for route, since in self.unserved_since.items():
            if now_ms - since >= limit and route not in self.unserved_alerted:
                self.unserved_alerted.add(route)
                pool, handler = route
                acts.alerts.append(
                    Alert(
                        kind=AlertKind.NO_WORKER,
                        message=f"no worker for handler {handler!r} in pool {pool!r}: "
                        f"{self._waiting_on(route)} runs wait for one",
                    )
                )

    def _waiting_on(self, route: Route) -> int:
        """Fires and claimed runs queued for ``route``."""
        n = 0
        for queues in (self.fresh, self.overdue, self.ready):
            q = queues.get(route)
            if q is not None:
                n += len(q)
        return n

    def unserved(self) -> list[Unserved]:
        """Work waiting because no connected worker serves its route."""
        return [
            Unserved(
                pool=pool,
                handler=handler,
                waiting=self._waiting_on((pool, handler)),
                since_ms=since,
            )
            for (pool, handler), since in sorted(self.unserved_since.items())
        ]

    def _claim(
        self, picked: list[tuple[int, bool]], workers: list[_Worker], now_ms: int, acts: Actions
    ) -> None:
        # Runs go out ``hand_out_chunk`` to a worker (``_take_server``).
        for job_id, overdue in picked:
            job = self.jobs.get(job_id) or self.book.job(job_id)
            if job is None:
                continue
            job.queued = False
            if job.ready:
                # Runs claimed ahead go first, one per turn, while the job is
                # below its limit of runs held by workers.
                if job.running >= job.limit:
                    continue  # re-enqueued when a run of the job finishes
                run_id, _ = job.ready.popleft()
                run = self.runs.get(run_id)
                if run is not None and run.phase is Phase.READY:
                    self.hand_out(run, self._take_server(workers), now_ms, acts)
                self.requeue_job(job, now_ms)
                continue
            if not job.due or job.paused or job.inflight >= job.limit:
                continue  # re-enqueued when a run of the job finishes
            fire, attempt, advance = job.due.popleft()
            job.inflight += 1
            worker = self._take_server(workers)
            worker.reserved += 1
            fence = self.shard_map.next_fence(job.shard)
            expected = new = None
            if advance:
                expected = job.store_next
                # The oldest fire not claimed yet: queued, then buffered behind
                # this run, then armed. Moving the store past a buffered fire
                # would lose it to a restart (the store is all a new owner has).
                due = job.due
                later = job.buffered[0] if job.buffered else job.next_fire
                if not due:  # the common cases, without a scan
                    new = later
                elif due[0][2]:
                    new = due[0][0]
                else:
                    new = next((f for f, _, moves in due if moves), later)
                if new is None and job.compiled.completion_driven:
                    # fixed_delay: provisional next fire, corrected on completion.
                    new = job.compiled.next_after_completion(fire)
                job.store_next = new
                job.moved_past = max(job.moved_past, fire)
                job.advancing += 1
                self.book.dirty.add(job_id)
                self.book.flush_skipped(job, new, now_ms, acts)
            acts.claims.append(
                FireClaim(
                    job_id=job_id,
                    scheduled_for=fire,
                    attempt=attempt,
                    fence=fence,
                    # Claimed ahead, it is dispatched at its time.
                    dispatched_at_ms=max(now_ms, fire),
                    advance=advance,
                    expected_next_run_at=expected,
                    new_next_run_at=new,
                    payload=job.has_payload,
                    concurrency_key=job.spec.concurrency_key,
                    tenant=job.spec.tenant if job.spec.concurrency_key else "",
                )
            )
            self.claims.sent(_Pending(job_id, fire, attempt, fence, worker.worker_id))
            if job.due and job.inflight < job.limit:
                self.enqueue(job, now_ms, overdue=overdue)

    def handing_off(self, claims: bool) -> bool:
        """A permit's hand-off is under way here: a run of a key with claims
        waiting here ended, or one came back elsewhere (they go out in the
        next round: ``KeyWaits.handing_off``), or claims sent again for such
        a hand-off wait for a store batch (``claims``: the actions hold
        claims for one). The node's loop then goes round and writes without
        waiting for its tick: a permit is idle from a run's end until a
        batch takes it again, and its limit binds (claims wait), so every
        millisecond of that is lost to the key's runs. Never true while no
        claim waits for a permit."""
        return (self._resent and claims) or self.keywaits.handing_off()

    def batch_taken(self) -> None:
        """The claims made so far went into one store batch: the next
        batch's runs start at the next worker. A batch's runs then go out in
        one message (while they fit a chunk), not a part to each worker, and
        over batches every worker gets its share."""
        self._resent = False
        if self._given:
            self._given = self.config.hand_out_chunk  # its first run moves on

    def _take_server(self, workers: list[_Worker]) -> _Worker:
        """The worker of ``workers`` the next run goes to: the one the last
        run went to until it has had ``hand_out_chunk`` runs in a row or has
        no credit left, then the next with credit (there is one: a batch is
        no larger than their credit)."""
        n = len(workers)
        wi = self._next_worker % n
        if self._given >= self.config.hand_out_chunk:
            wi = (wi + 1) % n
            self._given = 0
        while workers[wi].free <= 0:
            wi = (wi + 1) % n
            self._given = 0
        self._next_worker = wi
        self._given += 1
        return workers[wi]

    def on_claimed(self, outcomes: Sequence[ClaimOutcome], now_ms: int, acts: Actions) -> None:
        """The store's answer to a claim batch."""
        stats = self.stats
        # Counted won for the batch at once, less each one lost or not ours.
        stats.claims_won += len(outcomes)
        for out in outcomes:
            c = out.claim
            pend = self.claims.answered(c.job_id, c.scheduled_for, c.attempt)
            if pend is None:
                stats.claims_won -= 1
                continue
            worker = self.workers.get(pend.worker_id) if pend.worker_id else None
            if worker is not None:
                worker.reserved -= 1
            if out.waiting:
                # No permit of its key: still on its way for the job, kept
                # without a worker until it is sent again (``_keywaits``).
                stats.claims_won -= 1
                pend.worker_id = None
                since = None if pend.waited_since < 0 else pend.waited_since
                if since is None:
                    pend.waited_since = now_ms
                waiting = self.jobs.get(c.job_id) or self.book.job(c.job_id)
                rank = waiting.spec.priority if waiting is not None else 5
                self.keywaits.park(c, pend, now_ms, since, rank)
                continue
            if pend.waited_since >= 0 and out.run_id is not None:
                acts.limit_waits.append(now_ms - pend.waited_since)
            job = self.jobs.get(c.job_id) or self.book.job(c.job_id)
            if c.advance and job is not None:
                job.advancing -= 1
            if c.advance and not out.advanced:
                acts.resync.add(c.job_id)
                if job is not None:
                    # The store's next_run_at is not what this owner moved it
                    # to: the row read again is taken as it is.
                    job.moved_past = -1
            elif c.advance and job is not None and job.advancing == 0 and not job.paused:
                # Fires passed over while the claim was on its way.
                self.book.sync_schedule(job, now_ms, acts)
            if out.run_id is None:
                # Someone else holds this fire (another owner, or an earlier
                # life of this one): it is not ours to run.
                stats.claims_won -= 1
                stats.claims_lost += 1
                if job is not None:
                    self.book.run_finished(job, now_ms, acts)
                continue
            run = _Run(out.run_id, c.job_id, c.scheduled_for, c.attempt, c.fence, out.payload)
            run.timed = pend.timed and c.attempt == 0  # a retry's wait is its backoff
            self.runs.add(run)
            if pend.ahead and job is not None:
                # Its timeout starts when a worker gets it (``_hand_out``).
                set_phase(run, Phase.READY)
                job.ready.append(Ahead(run.run_id, pend.overdue))
                self.requeue_job(job, now_ms)
                continue
            if c.scheduled_for > now_ms and c.attempt == 0:
                # Claimed ahead of its time (``claim_ahead_ms``): it waits,
                # its worker's credit still reserved for it.
                set_phase(run, Phase.READY)
                if worker is not None:
                    worker.reserved += 1
                reserved = worker.worker_id if worker is not None else ""
                self.held.hold(c.scheduled_for, run.run_id, reserved)
                continue
            # Its slot is free again now that it is not reserved: it goes out
            # if that leaves the worker within its credit, which it may have
            # lowered while the claim was on its way.
            if worker is not None and worker.free > 0 and not worker.draining:
                self.hand_out(run, worker, now_ms, acts)
            else:
                # Its worker went away: it waits for another of its route,
                # with no lease and no timeout running until one gets it.
                set_phase(run, Phase.READY)
                self.wait_ready(run, job)

    def _kick_ending(self, acts: Actions) -> None:
        """Runs of keys with waiting claims end in the coming store batch:
        those claims go in it too, after the ends (``_keywaits``)."""
        for c in acts.completions:
            run = self.runs.get(c.run_id)
            job = None if run is None else self.jobs.get(run.job_id) or self.book.job(run.job_id)
            if job is not None and job.spec.concurrency_key:
                self.keywaits.kick(job.spec.tenant, job.spec.concurrency_key)

    def _claim_again(self, now_ms: int, acts: Actions, *, handing: bool = False) -> None:
        """Send the claims waiting for a permit again (``_keywaits``), each
        with a worker of its route that has credit, as a fresh claim would
        take one; one with no such worker now waits for the next poll. A
        claim whose job is gone, paused, or no longer has the key is given
        up as a claim lost: the job reads its row again (nothing of it was
        written) and arms what the store says. ``handing``: a permit is being
        handed off to them (``handing_off``)."""
        budget = self.config.max_claim_batch - len(self.claims)
        for parked in self.keywaits.take(now_ms):
            c, pend = parked.claim, parked.pend
            job = self.jobs.get(c.job_id) or self.book.job(c.job_id)
            if (
                job is None
                or job.paused
                or job.cancelled
                or job.spec.concurrency_key != c.concurrency_key
            ):
                self.claims.sent(pend)
                self.on_claimed([ClaimOutcome(claim=c, run_id=None, advanced=False)], now_ms, acts)
                continue
            if not pend.ahead:
                workers = [w for w in self.workers.serving(job.route) if w.free > 0]
                if budget <= 0 or not workers:
                    self.keywaits.park(c, pend, now_ms, pend.waited_since, parked.priority)
                    continue
                worker = self._take_server(workers)
                worker.reserved += 1
                pend.worker_id = worker.worker_id
            budget -= 1
            c.dispatched_at_ms = now_ms
            acts.claims.append(c)
            self.claims.sent(pend)
            self._resent = self._resent or handing

    def _claiming(self) -> dict[str, int]:
        """Claims on their way to the store by tenant (those a dispatch made:
        a trigger's or a backfill's count once handed out), for tenants with
        an in-flight limit."""
        claiming: dict[str, int] = {}
        if self.claims and self.tenants.counts_claims():
            for pend in self.claims.values():
                if pend.ahead:
                    continue
                job = self.jobs.get(pend.job_id)
                if job is not None:
                    tenant = job.spec.tenant
                    claiming[tenant] = claiming.get(tenant, 0) + 1
        return claiming

    def _release_held(self, now_ms: int, acts: Actions) -> None:
        """Runs claimed ahead whose time has come go out. Their
        reservations are given back first and the runs dealt as a claim
        batch's are (``_take_server``: a worker's turn of ``hand_out_chunk``
        runs). Each given to the worker its claim reserved, a round's runs
        (claimed in two store batches, on two workers' turns) went out in two
        messages, not one. A run no worker here can take now waits in line
        for any of its route; one that ended meanwhile (its job cancelled,
        its shard handed over) is passed over."""
        due: list[_Run] = []
        for run_id, worker_id in self.held.take_due(now_ms):
            worker = self.workers.get(worker_id) if worker_id else None
            if worker is not None:
                worker.reserved -= 1
            run = self.runs.get(run_id)
            if run is not None and run.phase is Phase.READY:
                due.append(run)
        serving: dict[Route, list[_Worker]] = {}  # by route, those with credit left
        for run in due:
            job = self.jobs.get(run.job_id) or self.book.job(run.job_id)
            route = job.route if job is not None else ("default", "")
            workers = serving.get(route)
            if workers is None:
                workers = serving[route] = self.workers.serving(route)
            refused = run.refused
            if refused:
                workers = [w for w in workers if refused.get(w.incarnation, 0) <= now_ms]
            if not workers or (job is not None and job.running >= job.limit):
                self.wait_ready(run, job)
                continue
            worker = self._take_server(workers)
            self.hand_out(run, worker, now_ms, acts)
            if worker.free <= 0:
                serving[route].remove(worker)

    def wait_ready(self, run: _Run, job: _Job | None) -> None:
        """Queue a claimed run for a worker of its route: behind the runs of
        its priority and better, ahead of worse ones (a run's priority is
        its job's; these runs were claimed already, so they have no aging:
        each came out of a ranked queue once). A first attempt whose fire is
        not due yet (claimed ahead, then handed back or over) waits for its
        time first."""
        if run.attempt == 0 and run.scheduled_for > self.wheel.now:
            self.held.hold(run.scheduled_for, run.run_id, "")
            return
        route = job.route if job is not None else ("default", "")
        q = self.ready.setdefault(route, deque())
        priority = job.spec.priority if job is not None else DEFAULT_PRIORITY
        at = len(q)
        while at and self._priority_of(q[at - 1]) > priority:
            at -= 1
        if at == len(q):
            q.append(run.run_id)  # the common case: no worse run waits
        else:
            q.insert(at, run.run_id)

    def _priority_of(self, run_id: int) -> int:
        run = self.runs.get(run_id)
        job = None if run is None else self.jobs.get(run.job_id) or self.book.job(run.job_id)
        return DEFAULT_PRIORITY if job is None else job.spec.priority

    def _assign_ready(self, now_ms: int, acts: Actions) -> list[Route]:
        """Hand out claimed runs that wait for a worker, in order per route,
        each to a worker of its route that did not hand it back, while its
        job is below its limit; the others keep their place. Returns the
        routes with runs left and no worker with credit."""
        starved: list[Route] = []
        claiming = self._claiming() if self.tenants.limits else {}
        for route, q in list(self.ready.items()):
            kept: list[int] = []
            while q:
                run = self.runs.get(q[0])
                if run is None or run.phase is not Phase.READY:
                    q.popleft()
                    continue
                if not self.workers.serves_with_credit(route):
                    starved.append(route)
                    break
                q.popleft()
                job = self.jobs.get(run.job_id) or self.book.job(run.job_id)
                worker = self.workers.server_for(route, run.refused, self.wheel.now)
                if (
                    worker is None
                    or (job is not None and job.running >= job.limit)
                    or (
                        job is not None
                        and self.tenants.limits
                        and self.tenants.over_in_flight(job.spec.tenant, claiming)
                    )
                ):
                    kept.append(run.run_id)
                    continue
                self.hand_out(run, worker, now_ms, acts)
            if kept:
                q.extendleft(reversed(kept))
            if not q:
                del self.ready[route]
        return starved

    def requeue_job(self, job: _Job, now_ms: int) -> None:
        """Queue the job for its next piece of work: a run claimed ahead (a
        trigger first in line, a backfill as overdue work), else a due fire."""
        if job.ready:
            overdue = job.ready[0].overdue
            self.enqueue(job, now_ms, overdue=overdue, front=not overdue)
        elif job.due and not job.paused:
            self.enqueue(job, now_ms, overdue=now_ms - job.due[0][0] > self.config.overdue_after_ms)

    def hand_out(self, run: _Run, worker: _Worker, now_ms: int, acts: Actions) -> None:
        job = self.jobs.get(run.job_id) or self.book.job(run.job_id)
        if job is None:  # pragma: no cover - a run keeps its job alive
            return
        set_phase(run, Phase.DISPATCHED)
        run.held_out = True
        job.running += 1
        if run.timeout_deadline == 0:
            run.timeout_deadline = now_ms + job.spec.timeout_ms
        run.worker_id = worker.worker_id
        worker.held.add(run.run_id)
        if self.tenants.limits:
            self.tenants.hold_if_limited(run.run_id, job.spec.tenant)
        self.runs.lease(run, now_ms, self.config.grace_lease_ms)
        spec = job.spec
        acts.assignments.setdefault(worker.worker_id, []).append(
            Assignment(
                run_id=run.run_id,
                job_id=run.job_id,
                handler=spec.handler,
                tenant=spec.tenant,
                scheduled_for=run.scheduled_for,
                attempt=run.attempt,
                fence=run.fence,
                payload=run.payload,
                lease_ms=self.config.grace_lease_ms,
                timeout_ms=max(0, run.timeout_deadline - now_ms),
            )
        )
        if run.timed:
            run.timed = False  # once: a run handed back goes out again later
            acts.lags.append(now_ms - run.scheduled_for)
        self.stats.dispatched += 1

    def backlog(self) -> tuple[int, int]:
        fresh = sum(len(q) for q in self.fresh.values())
        overdue = sum(len(q) for q in self.overdue.values())
        return fresh + sum(len(q) for q in self.ready.values()), overdue
