"""A node's values: its clock, its configuration, a worker's stream as the
node sees it, and what the node reports of itself (status, health, alerts)."""

from __future__ import annotations

import asyncio
import ctypes
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from wheel.checkpoint import Durability
from wheel.coord.base import Member
from wheel.engine.owner import (
    Actions,
    Alert,
    CompletionResult,
    OwnerConfig,
    OwnerStats,
    Unserved,
    WorkerView,
)
from wheel.engine.spec import Interval, JobSpec
from wheel.errors import InvalidArgument

DAY_MS = 86_400_000


class Clock:
    """Milliseconds on the wall-clock scale that never step backwards: a wall
    time read once plus monotonic time elapsed since (leases must not jump
    when NTP steps the wall clock). That wall time is the host's until
    ``anchor`` gives the record of truth's: a cluster's nodes then fire by
    one clock, whatever their hosts' clocks say (seed 7: one clock, the
    database's).

    ``skew_file`` (default: none; ``wheelctl serve --clock-skew-file``) is a
    test hook that makes the host's wall clock wrong: its number of
    milliseconds is added to the host's wall time, and ``reload_skew`` reads
    it again (serve: on SIGUSR1), which steps that wall time by the
    difference (backwards too). It lets fault-injection runs give one node a
    skewed clock, or step it, without touching the machine's clock.
    Before an anchor the node's clock follows it; after, only ``wall_ms``
    does."""

    def __init__(self, skew_file: str | None = None) -> None:
        self._skew_file = skew_file
        self.skew_ms = 0
        self.anchored = False
        self.reload_skew()
        self._wall0 = time.time_ns() // 1_000_000
        self._mono0 = time.monotonic_ns()

    def wall_ms(self) -> int:
        """The host's wall clock now (skew included)."""
        return time.time_ns() // 1_000_000 + self.skew_ms

    def anchor(self, wall_ms: int, mono_ns: int) -> None:
        """From now on read ``wall_ms`` as the time at ``time.monotonic_ns()
        == mono_ns`` (the store's clock, read at that instant): the host's
        wall clock, skew and all, no longer counts."""
        self._wall0 = wall_ms
        self._mono0 = mono_ns
        self.anchored = True

    def anchor_read(self, before_ns: int, after_ns: int, store_ms: int) -> None:
        """Anchor on a read of the store's clock that went out at
        ``before_ns`` and came back at ``after_ns`` (monotonic). The store
        read its clock somewhere in between; placed at the end of the round
        trip, this clock can only be behind the store's (by the round trip at
        most, and the store's millisecond is truncated the same way), never
        ahead: fires may go out a few ms late, never early."""
        self.anchor(store_ms, after_ns)

    def reload_skew(self) -> None:
        """Read the skew file again (no file, or no number in it: no skew)."""
        if not self._skew_file:
            return
        try:
            with open(self._skew_file) as f:
                self.skew_ms = int(f.read().strip() or 0)
        except (OSError, ValueError):
            self.skew_ms = 0

    def now_ms(self) -> int:
        skew = 0 if self.anchored else self.skew_ms
        return self._wall0 + skew + (time.monotonic_ns() - self._mono0) // 1_000_000


# The store's clock is read up to this many times at start, until one read's
# round trip is at most this short (its moment is known to half of it).
ANCHOR_READS = 10
ANCHOR_ROUND_TRIP_NS = 20_000_000


class Wake:
    """What wakes the dispatch loop: ``asyncio.Event`` for its one waiter,
    with a timeout that costs a future and a timer handle. ``asyncio.wait_for``
    around ``Event.wait()`` made a task per sleep and, when the time ran out,
    cancelled it and waited for the cancellation: four or more passes of the
    event loop a sleep, twice a round."""

    __slots__ = ("_flag", "_waiter")

    def __init__(self) -> None:
        self._flag = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._flag = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._flag = False

    async def wait(self, timeout: float) -> bool:
        """Until set or ``timeout`` s have passed; whether it is set."""
        if self._flag:
            return True
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout, _time_up, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        return self._flag


def _time_up(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def read_store_clock(read: Callable[[], int]) -> tuple[int, int, int]:
    """(monotonic ns before, after, the store's ms) of the quickest of a few
    reads of the store's clock: one slowed by a reconnect (a store
    restarting), placed at the middle of its round trip, would set the node's
    clock ahead by half of it, and fires would go out early."""
    best: tuple[int, int, int] | None = None
    for _ in range(ANCHOR_READS):
        before = time.monotonic_ns()
        store_ms = read()
        after = time.monotonic_ns()
        if best is None or after - before < best[1] - best[0]:
            best = (before, after, store_ms)
        if after - before <= ANCHOR_ROUND_TRIP_NS:
            break
    assert best is not None
    return best


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    node_id: str = "node-1"
    owner: OwnerConfig = field(default_factory=OwnerConfig)
    # How often to read jobs changed by others (other nodes, direct writes),
    # and at most how many a read takes. A read that comes back at least half
    # full is followed by the next one at once, not a whole interval later:
    # jobs submitted faster than a page a second must not leave the node ever
    # further behind on pauses and cancels made elsewhere.
    changes_interval_s: float = 1.0
    changes_page: int = 10_000
    # The shortest period an interval job may have (submit and update; 0:
    # none). One second is the finest schedule a cron with a seconds field
    # gives, and below it a job is a busy loop, not a schedule: every fire
    # is a store write, and one that overlaps its last run is a missed-fire
    # row (an interval of 1 ms wrote 4,375 of them in 4 s). Jobs stored
    # before a lower minimum keep running.
    min_interval_ms: int = 1_000
    # Longest sleep of the dispatch loop without an event.
    max_idle_s: float = 0.5
    # Local LMDB checkpoint for fast restarts (None: rebuild from the store).
    checkpoint_dir: str | None = None
    checkpoint_durability: Durability = Durability.SYNC
    # A checkpoint written for another cluster is never used.
    cluster_id: str = "wheel"
    # Take a snapshot (and truncate the log) once this many job records
    # were logged since the last one began.
    snapshot_every_records: int = 500_000
    # Group commit under load: after a store batch of at least
    # ``group_commit_min_writes`` writes, the next batch is formed no sooner
    # than ``group_commit_ms`` later. Each commit then carries more fires, so
    # fewer fsyncs and fewer store pages written per fire (measured: about a
    # fifth of the node's CPU per dispatch at 10k/s). Light traffic waits
    # ``group_commit_light_ms`` at most.
    group_commit_ms: int = 20
    group_commit_min_writes: int = 64
    # After a smaller batch the next one waits this much: a steady trickle
    # of fires would otherwise commit (and fsync the checkpoint) once per
    # millisecond. At 2,000 dispatches/s on SQLite: 0.75 CPU s per 1,000
    # dispatches and p99 13 ms at 0; 0.46 s and p99 10 ms at 5 ms. A lone
    # event after a quiet spell still commits at once.
    group_commit_light_ms: int = 5
    # The loop's tick: while fires keep coming due, the loop goes round at
    # most once every ``tick_ms``, and each round fires everything due by
    # then, claims it in one store batch and hands it out in one message a
    # worker. A round costs the same for one fire as for a hundred (a store
    # commit, a checkpoint append, a stream write each way), so at 2,000
    # fires/s a loop woken for every timer spent most of its CPU on rounds.
    # A fire after a quiet spell still goes at once; a store batch's answer
    # is applied (and its runs handed out) as soon as it comes. 0: a round
    # at every timer. At 2,000 fires/s on SQLite (two workers), CPU s per
    # 1,000 fires and p99 lag: 0.105-0.110 and 24 ms at 20, 0.086-0.095 and
    # 35 ms at 30, 0.086 and 41 ms at 35: 30 keeps the p99 well inside 50 ms.
    tick_ms: int = 30
    # A burst's first part of claims (0, the default: a burst in one
    # batch): with more waiting, a batch takes this many claims (and the
    # other writes: completions never wait behind a backlog of claims),
    # goes without the group commit's wait, and the next part, twice as
    # large, follows as soon as the store thread has room, so the store
    # commits one part while the loop hands out the runs of the one before.
    # Measured with 2,000 one-shots due at once on two shared cores
    # (benchmarks/README.md, "Bursts"): at 500 the p50 came down on a
    # loaded machine, but on a quieter one the p99 did not (SQLite 108 ms
    # against 71 in one batch, PostgreSQL 124 against 124): the store's
    # time per claim, which the last part waits for, is the bound, and a
    # part's commit and the loop's work beside it cost what the overlap
    # saves. So it is off until that time per claim comes down.
    burst_batch_claims: int = 0
    # Health: how often it is worked out, and how long the store may go
    # without a committed batch before a probe (SELECT 1) asks it; a probe
    # that has not answered within its timeout counts as failed.
    health_interval_s: float = 0.5
    probe_after_s: float = 1.0
    probe_timeout_s: float = 2.0
    # The dispatch lag objective (the seed's: p99 <= 1 s), checked over the
    # samples of the last ``lag_slo_window_s``; with fewer than
    # ``lag_slo_min_samples`` there, nothing is concluded.
    lag_slo_ms: int = 1_000
    lag_slo_quantile: float = 0.99
    lag_slo_window_s: float = 60.0
    lag_slo_min_samples: int = 100
    # Alerts kept for AdminService.ListAlerts (the oldest go first).
    alerts_kept: int = 1_000
    # Retention: finished runs and missed-fire records older than this are
    # deleted (None: kept for ever), in passes every ``retention_interval_s``
    # (the first after ``retention_first_s``, or the interval if shorter),
    # ``retention_batch`` rows' key range per transaction, each pass taking
    # at most ``retention_share`` of the store's time (it sleeps between
    # transactions).
    retain_ms: int | None = 30 * DAY_MS
    retention_interval_s: float = 600.0
    retention_first_s: float = 60.0
    retention_batch: int = 1_000
    retention_share: float = 0.1
    # Every this often, the store's statistics of its busiest tables are
    # brought up to date where they lag far behind (``Store.refresh_statistics``;
    # 0: never), by one member of a cluster.
    statistics_interval_s: float = 60.0
    # A stall of the event loop longer than this is logged with where the
    # loop stood and how its thread spent the time (``wheel.node._stalls``;
    # 0: not traced).
    trace_stalls_s: float = 0.0


class WorkerSession:
    """One worker stream: the node writes server messages into ``outbox``.
    ``held``: answers to its completions, all accepted, that wait to ride
    with its next assignments (``wheel.rpc._workers.send_actions``);
    ``held_timer`` sends them alone if none come first. ``columns``: the
    worker reads its runs as columns (``Hello.columns``), ``traced_columns``
    their ``traceparent`` too (``Hello.traced_columns``)."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.columns = False
        self.traced_columns = False
        self.outbox: asyncio.Queue[object] = asyncio.Queue()
        self.closed = False
        self.held: list[CompletionResult] = []
        self.held_timer: asyncio.TimerHandle | None = None


# Translates an owner Actions into per-worker wire messages; set by the rpc layer.
MessageSink = Callable[[WorkerSession, Actions], None]


@dataclass(frozen=True, slots=True)
class MovedRun:
    """A run a worker holds whose shard this node handed over (or does not
    hold): it reports to ``owner`` from now on (an empty member: to its
    shard's owner in the worker's newest view)."""

    run_id: int
    fence: int
    job_id: int
    owner: Member


@dataclass(frozen=True, slots=True, kw_only=True)
class Membership:
    """The members and each shard's owner (256 node ids, "" between owners),
    at ``version`` (cluster-wide, growing; 0 for a single node)."""

    members: tuple[Member, ...]
    shard_owners: tuple[str, ...]
    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Health:
    """Whether the node can do its work: the store answers (its last batch,
    or its last probe, succeeded), and it holds a shard it may dispatch (a
    cluster member between holds, or past its lease deadline, holds none)."""

    store: bool
    dispatching: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class RaisedAlert:
    """An alert as the node keeps it: when it was raised (wall ms), and by
    which node."""

    at_ms: int
    node_id: str
    alert: Alert


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeStatus:
    """What ``Node.status`` reports (``AdminService.GetClusterStatus``)."""

    node_id: str
    lag_p50_ms: float
    lag_p99_ms: float
    # Shard -> epoch held; empty while the node starts.
    shards: Mapping[int, int] = field(default_factory=dict)
    # Every job held, awake or at rest, and of them the awake ones.
    jobs: int = 0
    jobs_awake: int = 0
    pending_timers: int = 0
    in_flight: int = 0
    backlog: int = 0
    overdue_backlog: int = 0
    workers: Sequence[WorkerView] = ()
    worker_capacity: int = 0
    stats: OwnerStats = field(default_factory=OwnerStats)
    reaper_paused: bool = False
    unserved: Sequence[Unserved] = ()
    # Alert kinds whose condition holds now.
    alerts_firing: Sequence[str] = ()
    # Shard -> when this node began dispatching it; and the shards it
    # stopped dispatching lately, (shard, epoch, at ms), oldest first: both
    # on the cluster's clock.
    dispatching_since: Mapping[int, int] = field(default_factory=dict)
    released: Sequence[tuple[int, int, int]] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class InFlightRun:
    """A run the node's owner holds (``Node.in_flight``)."""

    run_id: int
    job_id: int
    scheduled_for: int
    attempt: int
    fence: int
    # "" until handed to a worker.
    worker_id: str
    # The owner's phase of it: claiming, ready, dispatched, running, ending.
    phase: str


def trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc only; a no-op
    elsewhere). A load of a million jobs frees as much memory again in
    column copies, most of it too small for the allocator to have mapped on
    its own, which it would otherwise keep for the life of the process."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def check_interval(spec: JobSpec, min_interval_ms: int) -> None:
    """Refuse an interval schedule shorter than the node's minimum
    (``NodeConfig.min_interval_ms``), naming the field and the minimum."""
    schedule = spec.schedule
    if isinstance(schedule, Interval) and schedule.period_ms < min_interval_ms:
        raise InvalidArgument(
            "spec.schedule.interval.period_ms",
            f"{schedule.period_ms} ms is shorter than this node's minimum interval of"
            f" {min_interval_ms} ms (wheelctl serve --min-interval)",
        )
