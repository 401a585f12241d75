"""A deterministic simulation of one node driving the shard owner.

Everything the owner talks to is simulated on one clock: an in-memory
reference store that keeps the ``Store`` contract of ``wheel.store.base``
(claims insert-or-nothing with a schedule CAS where the insert won, fenced
completions, ``advance_schedules`` CAS, deduplicated missed fires,
``load_shards``), workers with capacity that ack, heartbeat and complete after
random delays and sometimes crash, freeze past their lease (a GC pause) and
then complete with their old fence, or ack past the grace lease; node restarts
(a new owner built from the store with bumped epochs, as ``Node.start`` does),
some of them between a store write and its answer; takeovers (a new owner
rebuilt from the store at once while every worker keeps running and says
hello to it, as when a shard moves to another node of a cluster); and the job
API (submit, pause, resume, cancel, trigger, backfill) as ``wheel.node.Node``
implements it. After the end the run drains (``Sim.drain``): workers quick
and alive, paused jobs resumed, the clock advanced until nothing owed is left.

The owner is driven like the node drives it: ``advance(now)``, then the store
writes in the order completions, missed, advances, claims, starts, then
``on_completed`` and ``on_claimed`` with the store's answers, then messages.

``tests.engine.sim_check.check(sim)`` verifies the design's promises over the
whole recorded history and returns the violations it found: through
``testkit.promises.check`` (the nemesis's judge) from the fires the
simulation owed, the store's executions and missed records and the
handlers' effect log and fenced writes, then by the rules only a simulation
can see. A fire due before the end that is still pending after the drain is
one (a fire that would never have ended). One
``random.Random(seed)`` drives it all, so a seed replays a run exactly.
"""

from __future__ import annotations

import heapq
import random
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

from testkit.promises import ResourceWrite
from tests.store.reference import ExecRow as _ExecRow
from tests.store.reference import RefStore
from wheel.engine.driver import Driver
from wheel.engine.model import (
    SHARD_COUNT,
    JobState,
    RunState,
)
from wheel.engine.owner import (
    Actions,
    Alert,
    Assignment,
    CompletionResult,
    Outcome,
    Owner,
    OwnerConfig,
    ShardContents,
)
from wheel.engine.records import (
    JobRecord,
)
from wheel.engine.schedule import CompiledSchedule, compile_schedule
from wheel.engine.spec import (
    CatchUp,
    CatchUpMode,
    Cron,
    DstFold,
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
from wheel.node._cluster import DUE_FIRST_SLACK_MS
from wheel.recovery import (
    load_later,
    load_shard_contents,
    restore_owner,
    stage_from_store,
    staged_contents,
)

SEC = 1_000
MIN = 60 * SEC
HOUR = 60 * MIN
DAY = 24 * HOUR
# 2026-03-07 00:00 UTC: the first simulated days cross the US spring-forward.
T0 = 1_772_841_600_000
INFLIGHT = (RunState.DISPATCHED, RunState.RUNNING)
# Jobs' handlers, and what the workers register in turn (w0 runs any; "mail"
# has two workers of eight, so crashes leave it unserved now and then).
HANDLERS = ("sim", "report", "mail")
WORKER_HANDLERS: tuple[tuple[str, ...], ...] = (
    (),
    ("sim",),
    ("sim", "report"),
    ("report", "mail"),
    ("sim",),
    ("sim", "report"),
    ("report",),
    ("sim",),
)


# -- workers ------------------------------------------------------------------------------


@dataclass(slots=True)
class _WRun:
    run_id: int
    fence: int
    job_id: int
    scheduled_for: int
    attempt: int
    outcome: Outcome
    duration_ms: int


class SimWorker:
    """A worker process: one lease stream to the node, handlers as timers."""

    def __init__(
        self,
        sim: Sim,
        worker_id: str,
        capacity: int,
        pools: tuple[str, ...],
        handlers: tuple[str, ...] = (),
    ) -> None:
        self.sim = sim
        self.worker_id = worker_id
        self.capacity = capacity
        self.pools = pools
        # Handler names it registers (none: it runs any).
        self.handlers = handlers
        self.token: int | None = None  # the current stream
        self.gen = 0  # bumped by a crash: timers of the old process die
        self.runs: dict[int, _WRun] = {}
        self.unconfirmed: dict[int, tuple[int, int, Outcome, str]] = {}
        self.frozen_until = 0
        self.inbox: list[Callable[[], None]] = []
        self.down = False

    # -- the stream -------------------------------------------------------------------

    def connect(self) -> None:
        sim = self.sim
        if self.down or self.token is not None:
            return
        if not sim.node_up():
            sim.at(sim.now + sim.rng.randint(500, 2_000), self._gen_guard(self.connect))
            return
        self.token = sim.attach(self)
        # SDK rule 4: unconfirmed completions first, then the heartbeat.
        resend = list(self.unconfirmed.values())
        if resend:
            self.send("complete", resend)
        self.heartbeat_now()

    def stream_lost(self) -> None:
        self.token = None
        self.sim.at(self.sim.now + self.sim.rng.randint(200, 2_000), self._gen_guard(self.connect))

    def _gen_guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        gen = self.gen

        def run() -> None:
            if self.gen != gen or self.down:
                return
            if self.sim.now < self.frozen_until:
                self.sim.at(self.frozen_until, run)
                return
            fn()

        return run

    def send(self, kind: str, payload: object) -> None:
        if self.token is not None:
            self.sim.to_node(self, self.token, kind, payload)

    def deliver(self, token: int, fn: Callable[[], None]) -> None:
        if token != self.token or self.down:
            return
        if self.sim.now < self.frozen_until:
            self.inbox.append(fn)
            return
        fn()

    # -- server messages ----------------------------------------------------------------

    def on_assignments(self, items: list[Assignment]) -> None:
        sim, rng = self.sim, self.sim.rng
        for a in items:
            if a.run_id in self.runs:
                continue
            if self.handlers and a.handler not in self.handlers:
                sim.history.misrouted.append((sim.now, self.worker_id, a))
            job = sim.jobs[a.job_id]
            outcome = rng.choices(
                (
                    Outcome.SUCCEEDED,
                    Outcome.RETRYABLE,
                    Outcome.FAILED,
                    Outcome.HANDED_BACK,
                    Outcome.ABANDONED,
                ),
                (85, 9, 4, 2, 1),
            )[0]
            if outcome is Outcome.HANDED_BACK:
                # It never starts the run (a redeploy, a drain): it says so
                # at once, with no ack.
                run = _WRun(a.run_id, a.fence, a.job_id, a.scheduled_for, a.attempt, outcome, 0)
                self.runs[a.run_id] = run
                sim.at(sim.now + rng.randint(1, 300), self._gen_guard(partial(self._finish, run)))
                continue
            r = rng.random()
            if sim.draining or r < 0.85:
                duration = rng.randint(5, 3 * SEC)
            elif r < 0.96:
                duration = rng.randint(3 * SEC, 90 * SEC)
            else:
                duration = rng.randint(job.spec.timeout_ms // 2, 2 * job.spec.timeout_ms)
            run = _WRun(a.run_id, a.fence, a.job_id, a.scheduled_for, a.attempt, outcome, duration)
            self.runs[a.run_id] = run
            sim.history.effect(run, "start", t=sim.now / 1000)
            slow_ack = sim.chaos() and rng.random() < sim.scale.slow_ack_rate
            ack = rng.randint(5_500, 9_000) if slow_ack else rng.randint(1, 300)
            sim.at(sim.now + ack, self._gen_guard(partial(self._ack, run)))
            sim.at(sim.now + ack + duration, self._gen_guard(partial(self._finish, run)))

    def _ack(self, run: _WRun) -> None:
        if self.runs.get(run.run_id) is run:
            self.send("ack", [(run.run_id, run.fence)])

    def _finish(self, run: _WRun) -> None:
        if self.runs.pop(run.run_id, None) is not run:
            return  # revoked or superseded: no completion (SDK rule 2)
        error = "" if run.outcome is Outcome.SUCCEEDED else f"sim {run.outcome.name.lower()}"
        if run.outcome is not Outcome.HANDED_BACK:
            self.sim.handler_ends(run)
        c = (run.run_id, run.fence, run.outcome, error)
        self.unconfirmed[run.run_id] = c
        self.sim.history.worker_completions.append(
            (self.sim.now, self.worker_id, run.run_id, run.fence)
        )
        self.send("complete", [c])

    def supersede(self, run_id: int, fence: int) -> None:
        run = self.runs.get(run_id)
        if run is not None and run.fence == fence:
            del self.runs[run_id]

    def on_results(self, results: list[CompletionResult]) -> None:
        for r in results:
            self.unconfirmed.pop(r.run_id, None)

    def heartbeat_now(self) -> None:
        self.send("heartbeat", [(r.run_id, r.fence) for r in self.runs.values()])

    def heartbeat_loop(self) -> None:
        if self.token is not None:
            self.heartbeat_now()
        interval = self.sim.config.heartbeat_interval_ms
        self.sim.at(self.sim.now + interval, self._gen_guard(self.heartbeat_loop))

    # -- faults -----------------------------------------------------------------------

    def crash(self, down_for: int) -> None:
        """The process dies: its runs never complete; a fresh one starts later."""
        self.sim.history.crashes += 1
        if self.token is not None:
            self.sim.detach(self, self.token)
        self.token = None
        self.gen += 1
        self.runs.clear()
        self.unconfirmed.clear()
        self.inbox.clear()
        self.frozen_until = 0
        self.down = True

        def restart() -> None:
            self.down = False
            self.connect()
            self.heartbeat_loop()

        self.sim.at(self.sim.now + down_for, restart)

    def freeze(self, for_ms: int) -> None:
        """A GC pause: nothing runs, nothing is sent, the stream stays open."""
        self.sim.history.freezes += 1
        self.frozen_until = self.sim.now + for_ms
        gen = self.gen

        def wake() -> None:
            if self.gen != gen:
                return
            inbox, self.inbox = self.inbox, []
            for fn in inbox:
                fn()

        # Timers deferred to frozen_until (late completions with the old fence)
        # run first; the messages that arrived meanwhile are read after.
        self.sim.at(self.frozen_until + 1, wake)


# -- the simulation -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SimScale:
    jobs: int = 1_500
    days: float = 2.0
    workers: int = 8
    capacity: int = 60
    # Mean time between faults, per worker / for the node (ms).
    worker_crash_every: int = 10 * HOUR
    worker_freeze_every: int = 8 * HOUR
    node_restart_every: int = 10 * HOUR
    slow_ack_rate: float = 0.01
    api_ops_per_hour: float = 12.0
    # The last stretch runs without faults or API calls, so work settles.
    quiet_ms: int = 2 * HOUR
    # Granularity of the node's loop: events within one tick are handled by
    # one iteration (as a busy node batches them).
    tick_ms: int = 1_000


@dataclass(slots=True)
class SimJob:
    job_id: int
    spec: JobSpec
    compiled: CompiledSchedule
    submitted_at: int
    first_fire: int | None
    pauses: list[tuple[int, int | None]] = field(default_factory=list)  # (paused, resumed)
    cancelled_at: int | None = None
    extra_fires: set[int] = field(default_factory=set)  # triggers and backfills


@dataclass(slots=True)
class History:
    # (publish time, worker, assignment)
    dispatches: list[tuple[int, str, Assignment]] = field(default_factory=list)
    # (time the node read it, worker, run_id, fence, outcome)
    received_completions: list[tuple[int, str, int, int, Outcome]] = field(default_factory=list)
    # (time, worker, result)
    results: list[tuple[int, str, CompletionResult]] = field(default_factory=list)
    worker_completions: list[tuple[int, str, int, int]] = field(default_factory=list)
    # Runs a worker got for a handler it did not register: (time, worker, assignment).
    misrouted: list[tuple[int, str, Assignment]] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    # The handlers' effect log (``testkit.promises.check``'s "start" and
    # "end" lines, times in the simulated clock's seconds) and the writes
    # asked of the fenced per-job resource, in the order it took them.
    effects: list[dict[str, object]] = field(default_factory=list)
    writes: list[ResourceWrite] = field(default_factory=list)
    restarts: int = 0
    mid_iteration_crashes: int = 0
    takeovers: int = 0
    # Takeovers loaded due first (the rest added later), planned moves.
    due_first: int = 0
    planned_moves: int = 0
    # Simulated time the drain took after the end (see ``Sim.drain``).
    drain_ms: int = 0
    crashes: int = 0
    freezes: int = 0
    iterations: int = 0
    api_ops: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def effect(self, run: _WRun, kind: str, **extra: object) -> None:
        self.effects.append(
            {
                "kind": kind,
                "job": run.job_id,
                "scheduled_for": run.scheduled_for,
                "run": run.run_id,
                "attempt": run.attempt,
                "fence": run.fence,
                **extra,
            }
        )


class Sim:
    """One node, its store, its workers and its users on a simulated clock."""

    def __init__(
        self, seed: int, scale: SimScale | None = None, config: OwnerConfig | None = None
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.scale = scale or SimScale()
        self.config = config or OwnerConfig(max_missed_listed=10_000)
        self.now = T0
        self.end = T0 + int(self.scale.days * DAY)
        self.chaos_end = self.end - self.scale.quiet_ms
        # After the end: workers quick and alive, run until what is owed settles.
        self.draining = False
        self.store = RefStore()
        # The node's loop without its I/O (None: the node is down).
        self.driver: Driver | None = None
        self.jobs: dict[int, SimJob] = {}
        self.workers: list[SimWorker] = []
        self.sessions: dict[str, int] = {}
        self.history = History()
        self._heap: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = 0
        self._token = 0
        self._crash_mid_iteration = False
        self._lat_node: dict[str, int] = {}
        self._lat_worker: dict[str, int] = {}
        self._by_id: dict[str, SimWorker] = {}
        # The fenced per-job resource: the newest fence it accepted, by job.
        self._resource: dict[int, int] = {}

    # -- plumbing -----------------------------------------------------------------------

    def at(self, t: int, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn))

    def chaos(self) -> bool:
        return self.now < self.chaos_end

    def node_up(self) -> bool:
        return self.driver is not None

    @property
    def owner(self) -> Owner | None:
        return None if self.driver is None else self.driver.owner

    @property
    def acts(self) -> Actions:
        assert self.driver is not None
        return self.driver.acts

    def attach(self, w: SimWorker) -> int:
        assert self.owner is not None
        self._token += 1
        self.sessions[w.worker_id] = self._token
        self.owner.worker_hello(
            w.worker_id, w.capacity, w.pools, self.now, self.acts, handlers=w.handlers
        )
        return self._token

    def detach(self, w: SimWorker, token: int) -> None:
        if self.owner is not None and self.sessions.get(w.worker_id) == token:
            del self.sessions[w.worker_id]
            self.owner.worker_disconnect(w.worker_id)

    def to_node(self, w: SimWorker, token: int, kind: str, payload: object) -> None:
        """A worker message, delivered in stream order after a network delay."""
        t = max(self.now + self.rng.randint(0, 20), self._lat_node.get(w.worker_id, 0))
        self._lat_node[w.worker_id] = t

        def deliver() -> None:
            owner = self.owner
            if owner is None or self.sessions.get(w.worker_id) != token:
                return
            wid, now, acts = w.worker_id, self.now, self.acts
            if kind == "ack":
                owner.worker_ack(wid, payload, now, acts)  # type: ignore[arg-type]
            elif kind == "heartbeat":
                owner.worker_heartbeat(wid, payload, now, acts)  # type: ignore[arg-type]
            else:
                items: list[tuple[int, int, Outcome, str]] = payload  # type: ignore[assignment]
                for run_id, fence, outcome, _ in items:
                    self.history.received_completions.append((now, wid, run_id, fence, outcome))
                owner.worker_complete(wid, items, now, acts)

        self.at(t, deliver)

    def to_worker(self, w: SimWorker, token: int, fn: Callable[[], None]) -> None:
        t = max(self.now + self.rng.randint(0, 20), self._lat_worker.get(w.worker_id, 0))
        self._lat_worker[w.worker_id] = t
        self.at(t, lambda: w.deliver(token, fn))

    # -- the node -----------------------------------------------------------------------

    def start_node(self) -> None:
        """``Node.start``: epochs, load, a new owner, jobs and runs restored."""
        store, now = self.store, self.now
        store.now_ms = now
        epochs = store.acquire_epochs(range(SHARD_COUNT))
        restored = restore_owner(
            store,
            None,
            epochs=epochs,
            config=self.config,
            now_ms=now,
        )
        self.driver = Driver(restored.owner, restored.actions)
        self.sessions = {}

    def crash_node(self, down_for: int) -> None:
        self.history.restarts += 1
        self.driver = None
        self.sessions = {}
        for w in self.workers:
            if w.token is not None and not w.down:
                w.stream_lost()
        self.at(self.now + down_for, self.start_node)

    def take_over(self) -> None:
        """Another owner takes the shards at once, rebuilt from the store with
        new epochs, while every worker keeps running: in a cluster each
        worker already holds a stream to the new owner. Messages on their way
        to or from the old owner are lost; live workers say hello to the new
        one at once, re-send unconfirmed completions and heartbeat the runs
        they hold (a frozen one does so when it wakes)."""
        self.history.takeovers += 1
        self.start_node()
        self._reconnect()

    def _new_owner(self, epochs: dict[int, int], contents: ShardContents) -> Driver:
        owner = Owner(now_ms=self.now, config=self.config)
        acts = Actions()
        owner.add_shards(epochs, contents, self.now, acts)
        self.driver = Driver(owner, acts)
        self.sessions = {}
        self._reconnect()
        return self.driver

    def take_over_due_first(self) -> None:
        """A takeover loaded due first, as a node gaining shards after a
        crash does (``wheel.node._cluster``): the jobs due within the arming
        window and a slack with the runs in flight and the retries at once,
        the rest seconds later, added where the owner has no row of the job
        (what it holds then is newer)."""
        self.history.takeovers += 1
        self.history.due_first += 1
        store, now = self.store, self.now
        store.now_ms = now
        epochs = store.acquire_epochs(range(SHARD_COUNT))
        shards = sorted(epochs)
        bound = now + self.config.arm_ahead_ms + DUE_FIRST_SLACK_MS
        driver = self._new_owner(epochs, load_shard_contents(store, shards, due_by=bound)[0])

        def rest() -> None:
            if self.driver is driver:  # not crashed or taken over since
                store.now_ms = self.now
                driver.owner.add_rest(*load_later(store, shards, bound))

        self.at(now + self.rng.randint(1, 30) * SEC, rest)

    def planned_move(self) -> None:
        """A planned move of every shard to another owner: it stages them
        from the store while this one serves them; seconds later this one
        hands them over, marking its runs claimed and never sent, and the
        new one takes the staging and what the store changed since."""
        store, old = self.store, self.driver
        store.now_ms = self.now
        staged = stage_from_store(store, range(SHARD_COUNT))

        def switch() -> None:
            if old is None or self.driver is not old:
                return  # the node crashed meanwhile: the staging is dropped
            self.history.planned_moves += 1
            store.now_ms = self.now
            held = sorted(old.owner.shards())
            sent = old.sent_runs(held)
            old.hand_over(held)
            store.release_unsent(held, sent)
            epochs = store.acquire_epochs(range(SHARD_COUNT))
            self._new_owner(epochs, staged_contents(store, staged, sorted(epochs), self.now)[0])

        self.at(self.now + self.rng.randint(1, 20) * SEC, switch)

    def _reconnect(self) -> None:
        for w in self.workers:
            if w.down or w.token is None:
                continue
            w.token = None
            if self.now < w.frozen_until:
                w.stream_lost()
            else:
                w.connect()

    def iterate(self) -> None:
        """One pass of the node's dispatch loop (``wheel.node._dispatch``)
        through the same ``Driver`` (repeated while it leaves work that can
        go out at once)."""
        for _ in range(1_000):
            driver, store, now = self.driver, self.store, self.now
            if driver is None:
                return
            self.history.iterations += 1
            driver.advance(now)
            if driver.has_store_work():
                store.now_ms = now
                outcome = store.write_batch(driver.take_batch())
                if self._crash_mid_iteration:
                    # The store committed; the node dies before it hears back.
                    self._crash_mid_iteration = False
                    self.history.mid_iteration_crashes += 1
                    self.crash_node(self._down_time())
                    return
                driver.apply(outcome, now)
            self._publish(driver.take_messages())
            resync = driver.take_resync()
            if resync:
                driver.apply_changes([store.get_job(j) for j in sorted(resync)], now)
            if not driver.wants_another_pass():
                return
        raise AssertionError("the owner keeps producing work without time passing")

    def _publish(self, acts: Actions) -> None:
        self.history.alerts.extend(acts.alerts)
        if not (acts.assignments or acts.revokes or acts.results or acts.rejected_renewals):
            return
        by_id = self._by_id
        for wid, items in acts.assignments.items():
            for a in items:
                self.history.dispatches.append((self.now, wid, a))
            self._send(by_id, wid, partial(_assign, items))
        for wid, revokes in acts.revokes.items():
            self._send(by_id, wid, partial(_supersede_refs, [(r.run_id, r.fence) for r in revokes]))
        for wid, results in acts.results.items():
            for r in results:
                self.history.results.append((self.now, wid, r))
            self._send(by_id, wid, partial(_answer, results))
        for wid, refs in acts.rejected_renewals.items():
            self._send(by_id, wid, partial(_supersede_refs, refs))
        # Violations are dropped: the SDK only logs protocol errors.

    def _send(self, by_id: dict[str, SimWorker], wid: str, fn: Callable[[SimWorker], None]) -> None:
        w = by_id.get(wid)
        token = self.sessions.get(wid)
        if w is not None and token is not None:
            self.to_worker(w, token, lambda: fn(w))

    def handler_ends(self, run: _WRun) -> None:
        """A handler returns: one that succeeded first wrote its job's fenced
        resource, if its job runs one fire at a time (one with several runs
        at once has no single newest fence to keep)."""
        extra: dict[str, object] = {}
        if run.outcome is Outcome.SUCCEEDED and overlap_limit(self.jobs[run.job_id].spec) == 1:
            newest = self._resource.get(run.job_id, -1)
            accepted = run.fence >= newest
            if accepted:
                self._resource[run.job_id] = run.fence
            self.history.writes.append(
                ResourceWrite(
                    seq=len(self.history.writes) + 1,
                    job_id=run.job_id,
                    key=f"{run.job_id}:{run.scheduled_for}",
                    fence=run.fence,
                    run_id=run.run_id,
                    accepted=accepted,
                )
            )
            extra["accepted"] = accepted
        outcome = "permanent" if run.outcome is Outcome.FAILED else run.outcome.name.lower()
        self.history.effect(run, "end", outcome=outcome, t=self.now / 1000, **extra)

    # -- users --------------------------------------------------------------------------

    def random_spec(self, name: str) -> JobSpec:
        rng, now = self.rng, self.now
        kind = rng.choices(("cron", "rate", "delay", "once"), (40, 32, 15, 13))[0]
        schedule: Once | Cron | Interval
        if kind == "cron":
            expr = rng.choices(
                (
                    "0 * * * *",
                    "*/20 * * * *",
                    "30 2 * * *",  # in the spring-forward gap in New York and Berlin
                    "30 1 * * *",  # in the fall-back fold elsewhere
                    "0 */6 * * *",
                    "15 9 * * 1-5",
                    "0 0 */2 * * *",  # seconds field: every two hours
                    "30 */10 * * * *",  # seconds field: every ten minutes at :30
                    "*/5 * * * *",
                ),
                (40, 4, 10, 10, 15, 10, 10, 1, 1),
            )[0]
            schedule = Cron(
                expr=expr,
                time_zone=rng.choice(
                    (
                        "UTC",
                        "America/New_York",
                        "Europe/Berlin",
                        "Asia/Kolkata",
                        "Australia/Lord_Howe",
                    )
                ),
                # skip: gap wall times are recorded missed (dst_gap), not run.
                dst_gap=DstGap.SKIP if rng.random() < 0.3 else DstGap.FIRE_AT_TRANSITION,
                dst_fold=rng.choice(tuple(DstFold)),
            )
        elif kind in ("rate", "delay"):
            period = rng.choices(
                (2 * MIN, 10 * MIN, 30 * MIN, HOUR, 2 * HOUR, 6 * HOUR), (1, 4, 15, 35, 25, 20)
            )[0]
            schedule = Interval(
                period_ms=period,
                mode=IntervalMode.FIXED_RATE if kind == "rate" else IntervalMode.FIXED_DELAY,
                start_at_ms=now + rng.randint(0, period),
            )
        else:
            schedule = Once(at_ms=now + rng.randint(0, int((self.end - now) * 0.9)))
        policy = rng.choice(tuple(OverlapPolicy))
        return JobSpec(
            name=name,
            handler=rng.choices(HANDLERS, (6, 3, 1))[0],
            schedule=schedule,
            tenant=rng.choice(("acme", "globex", "initech", "umbrella", "hooli")),
            jitter_ms=0 if rng.random() < 0.7 else rng.randint(1, 30 * SEC),
            catch_up=CatchUp(
                mode=rng.choice(tuple(CatchUpMode)),
                window_ms=None if rng.random() < 0.5 else rng.randint(MIN, 2 * HOUR),
                max_count=rng.randint(1, 20),
            ),
            overlap=Overlap(
                policy=policy,
                max_concurrent=rng.randint(1, 3),
                max_buffered=rng.randint(1, 5),
            ),
            retry=Retry(
                max_attempts=rng.randint(1, 4),
                initial_backoff_ms=rng.randint(0, 5 * SEC),
                max_backoff_ms=30 * SEC,
                multiplier=2.0,
            ),
            timeout_ms=rng.randint(30 * SEC, 10 * MIN),
            side_effect=SideEffect.AT_MOST_ONCE if rng.random() < 0.2 else SideEffect.IDEMPOTENT,
            # One pool: the owner walks its pools as a set of str, whose order
            # changes with PYTHONHASHSEED, and a seed must replay exactly.
            pool="default",
        )

    def submit(self, spec: JobSpec) -> None:
        """``Node.submit_later``: the first fire, the store row, then the owner."""
        driver, now = self.driver, self.now
        assert driver is not None
        new = driver.new_job(spec, None, now)
        record = self.store.submit_job(spec, now, new.next_run_at)
        compiled = compile_schedule(spec.schedule, jitter_ms=spec.jitter_ms, job_id=record.job_id)
        self.jobs[record.job_id] = SimJob(record.job_id, spec, compiled, now, new.next_run_at)
        driver.submitted(record, now)
        self.history.api_ops["submit"] += 1

    def api_op(self) -> None:
        if not self.chaos() or self.owner is None:
            return
        rng, now = self.rng, self.now
        op = rng.choices(
            ("submit", "pause", "cancel", "trigger", "backfill"), (25, 30, 10, 20, 15)
        )[0]
        if op == "submit":
            self.submit(self.random_spec(f"late-{len(self.jobs)}"))
            return
        job = self.jobs[rng.randint(1, len(self.jobs))]
        row = self.store.jobs[job.job_id]
        if row.state is not JobState.ACTIVE:
            return
        self.history.api_ops[op] += 1
        if op == "pause":
            self.set_state(job, JobState.PAUSED)
            resume_in = rng.randint(10 * MIN, 6 * HOUR)
            self.at(now + resume_in, lambda: self._resume(job))
        elif op == "cancel":
            self.set_state(job, JobState.CANCELLED)
        elif op == "trigger":
            self._claim_now(job, lambda d, record: [d.trigger(record, now)])
        else:
            fires = job.compiled.fires_between(now - 6 * HOUR, now - HOUR, 5)
            todo = [f for f in fires if f not in self.store.fires_exist(job.job_id, fires)]

            def backfill(d: Driver, record: JobRecord) -> list[int]:
                d.backfill(record, todo, now)
                return todo

            self._claim_now(job, backfill)

    def _claim_now(self, job: SimJob, claim: Callable[[Driver, JobRecord], list[int]]) -> None:
        """``Node.trigger`` / ``Node.backfill``: the owner claims the fires,
        the next store pass writes them, and the API answers once they are
        in the store (acknowledged) -- sometimes the node dies right after
        that write, before it hears back."""
        driver = self.driver
        assert driver is not None
        fires = claim(driver, self.store.get_job(job.job_id))
        if self.rng.random() < 0.1:
            self._crash_mid_iteration = True
        self.iterate()
        job.extra_fires.update(fires)  # acknowledged

    def _resume(self, job: SimJob) -> None:
        if self.owner is None:
            self.at(self.now + 10 * SEC, lambda: self._resume(job))
            return
        if self.store.jobs[job.job_id].state is JobState.PAUSED:
            self.history.api_ops["resume"] += 1
            self.set_state(job, JobState.ACTIVE)

    def set_state(self, job: SimJob, state: JobState) -> None:
        """``Node.set_state``: through the same ``Driver`` calls."""
        driver, now = self.driver, self.now
        assert driver is not None
        record = self.store.get_job(job.job_id)
        change = driver.state_change(record, state, now)
        if change.noop:
            return
        updated = self.store.set_job_state(
            job.job_id, change.state, next_run_at=change.next_run_at, now_ms=now
        )
        if state is JobState.PAUSED:
            job.pauses.append((now, None))
        elif state is JobState.ACTIVE:
            job.pauses[-1] = (job.pauses[-1][0], now)
        else:
            job.cancelled_at = now
        driver.state_changed(record, updated, change.state, now)

    # -- faults -------------------------------------------------------------------------

    def _down_time(self) -> int:
        if self.rng.random() < 0.7:
            return self.rng.randint(500, 5 * SEC)
        return self.rng.randint(5 * MIN, 2 * HOUR)

    def _poisson(self, every: int, fn: Callable[[], None]) -> None:
        def tick() -> None:
            if not self.chaos():
                return
            fn()
            self.at(self.now + int(self.rng.expovariate(1 / every)) + 1, tick)

        self.at(self.now + int(self.rng.expovariate(1 / every)) + 1, tick)

    def _crash_worker(self, w: SimWorker) -> None:
        w.crash(self.rng.randint(10 * SEC, 10 * MIN))

    def _freeze_worker(self, w: SimWorker) -> None:
        w.freeze(self.config.lease_ms + self.rng.randint(1 * SEC, 90 * SEC))

    def _node_fault(self) -> None:
        """A crash (the node comes back after a while and rebuilds from the
        store), a crash between a store write and its answer, or a takeover
        (a new owner rebuilt from the store at once, workers still running)."""
        if self.owner is None:
            return
        r = self.rng.random()
        if r < 0.2:
            self._crash_mid_iteration = True
        elif r < 0.35:
            self.take_over()
        elif r < 0.5:
            self.take_over_due_first()
        elif r < 0.65:
            self.planned_move()
        else:
            self.crash_node(self._down_time())

    # -- running ------------------------------------------------------------------------

    def run(self) -> Sim:
        scale, rng = self.scale, self.rng
        self.start_node()
        for i in range(scale.jobs):
            self.submit(self.random_spec(f"job-{i}"))
        for i in range(scale.workers):
            pools = ("default",)
            handlers = WORKER_HANDLERS[i % len(WORKER_HANDLERS)]
            w = SimWorker(self, f"w{i}", scale.capacity, pools, handlers)
            self.workers.append(w)
            self._by_id[w.worker_id] = w
            w.connect()
            self.at(
                self.now + rng.randint(0, self.config.heartbeat_interval_ms),
                w._gen_guard(w.heartbeat_loop),
            )
            self._poisson(scale.worker_crash_every, partial(self._crash_worker, w))
            self._poisson(scale.worker_freeze_every, partial(self._freeze_worker, w))
        self._poisson(scale.node_restart_every, self._node_fault)
        self._poisson(int(HOUR / scale.api_ops_per_hour), self.api_op)
        self._run_until(self.end)
        self.now = self.end
        if self.owner is None:
            self.start_node()
            self.iterate()
        self.drain()
        return self

    def _run_until(self, end: int) -> None:
        heap, tick = self._heap, self.scale.tick_ms
        while True:
            t = heap[0][0] if heap else None
            owner = self.owner
            if owner is not None:
                nd = owner.next_deadline()
                if nd is not None and (t is None or nd < t):
                    t = nd
                # Dispatch._sleep_until wakes at least every max_idle (0.5 s): work
                # held back by a token bucket goes out then.
                if (
                    owner.dispatcher.ready
                    or owner.redos.lost()
                    or any(owner.dispatcher.fresh.values())
                    or any(len(q) for q in owner.dispatcher.overdue.values())
                ):
                    t = self.now + 500 if t is None else min(t, self.now + 500)
            if t is None or t > end:
                break
            # The node's loop wakes in ticks: events of one tick share an iteration.
            self.now = max(self.now, -(-t // tick) * tick)
            while heap and heap[0][0] <= self.now:
                heapq.heappop(heap)[2]()
            self.iterate()

    def drain(self, *, step_ms: int = 5 * MIN, limit_ms: int = 12 * HOUR) -> None:
        """Let everything owed by the end settle: workers alive and quick
        (they come back from crashes and pauses by themselves; no faults
        after the quiet stretch), paused jobs resumed, and the clock advanced
        past every lease, backoff and grace until no fire due before the end
        is still in flight or waiting. ``sim_check.check`` then requires each such fire
        to be terminal or recorded missed: one still pending is a drop that
        would never have ended. Stops after ``limit_ms`` whatever is left."""
        self.draining = True
        start = self.now
        for job in self.jobs.values():
            if self.store.jobs[job.job_id].state is JobState.PAUSED:
                self.history.api_ops["resume"] += 1
                self.set_state(job, JobState.ACTIVE)
        self.iterate()
        while self.now < start + limit_ms and self.unsettled(start):
            target = self.now + step_ms
            self._run_until(target)
            self.now = target
        self.history.drain_ms = self.now - start

    def unsettled(self, before: int) -> list[tuple[int, int]]:
        """Fires due before ``before`` that are not settled yet: a run in
        flight or waiting, or a latest attempt owed another one."""
        out: list[tuple[int, int]] = []
        latest: dict[tuple[int, int], _ExecRow] = {}
        for ex in self.store.execs.values():
            key = (ex.job_id, ex.scheduled_for)
            if ex.scheduled_for < before and (
                key not in latest or ex.attempt > latest[key].attempt
            ):
                latest[key] = ex
        for key, ex in latest.items():
            if ex.state in INFLIGHT or (
                ex.state in RETRIED_FROM
                and self.store.jobs[ex.job_id].state is not JobState.CANCELLED
            ):
                out.append(key)
        owner = self.owner
        if owner is not None:
            for job_id, job in owner.jobs.items():
                out.extend((job_id, d[0]) for d in job.due if d[0] < before)
                out.extend((job_id, f) for f in job.buffered if f < before)
        return out


def _assign(items: list[Assignment], w: SimWorker) -> None:
    w.on_assignments(items)


def _answer(results: list[CompletionResult], w: SimWorker) -> None:
    w.on_results(results)


def _supersede_refs(refs: Iterable[tuple[int, int]], w: SimWorker) -> None:
    _supersede_all(w, refs)


def _supersede_all(w: SimWorker, refs: Iterable[tuple[int, int]]) -> None:
    for run_id, fence in refs:
        w.supersede(run_id, fence)


# The states an attempt ends in that another attempt follows.
RETRIED_FROM = (RunState.FAILED, RunState.TIMED_OUT, RunState.LOST)


def overlap_limit(spec: JobSpec) -> int:
    """How many runs of the job may be going at once."""
    o = spec.overlap
    return o.max_concurrent if o.policy is OverlapPolicy.ALLOW else 1


def summary(sim: Sim) -> dict[str, object]:
    h = sim.history
    states: dict[str, int] = defaultdict(int)
    for ex in sim.store.execs.values():
        states[ex.state.value] += 1
    return {
        "seed": sim.seed,
        "jobs": len(sim.jobs),
        "executions": len(sim.store.execs),
        "missed": len(sim.store.missed),
        "states": dict(states),
        "restarts": h.restarts,
        "mid_iteration_crashes": h.mid_iteration_crashes,
        "takeovers": h.takeovers,
        "drain_min": h.drain_ms // MIN,
        "worker_crashes": h.crashes,
        "freezes": h.freezes,
        "iterations": h.iterations,
        "api_ops": dict(h.api_ops),
        "alerts": len(h.alerts),
    }


__all__ = [
    "RefStore",
    "Sim",
    "SimScale",
    "SimWorker",
    "summary",
]
