"""The run table: the runs an owner holds, their phases, and their leases.

A part of the owner: it keeps every run from its claim to the store's answer
to its terminal state, moves runs between phases only along the transition
table, and keeps their lease and timeout deadlines -- in the grace FIFO or
as timers of the owner's wheel. What a phase change means for the job, the
worker or the store is the owner's business; the table only keeps the
books.

Phases (``_RUN_TRANSITIONS`` is the table; ``set_phase`` enforces it):

    CLAIMING --claim won--> DISPATCHED (grace lease) --ack--> RUNNING (full lease)
    CLAIMING --worker gone, or claimed ahead--> READY --assigned--> DISPATCHED
    DISPATCHED/RUNNING --handed back, never started--> READY
    DISPATCHED/RUNNING/READY --complete / lease expired / timeout / cancel--> ENDING
    ENDING --store applied--> (gone: ``ended``)

Leases. A run's first grace lease is not a wheel timer of its own. Runs
handed out in one tick share a grace deadline, and those deadlines only
grow, so they wait in one FIFO (``_grace``), a list of run ids per deadline.
Most runs end within their grace lease and never touch the wheel: no LEASE
or TIMEOUT to add, none to cancel. A run still in flight at its grace
deadline is checked then (``expire_grace``) and gets its own LEASE and
TIMEOUT timers (``arm``). A run whose timeout falls within the grace lease
gets them at once, so no deadline is ever checked late.

Invariants (tests in tests/engine/test_runtable.py):

1. A run's phase changes only along ``_RUN_TRANSITIONS``.
2. A run is *armed* (its LEASE and TIMEOUT are wheel timers) or *graced*
   (one entry of the grace FIFO, counted in ``graced``) or neither (no lease
   running: CLAIMING, READY, ENDING) -- never both; ``disarm`` ends either.
3. The grace FIFO's deadlines increase; an entry of a run that ended or was
   armed meanwhile is skipped when due.
4. A run in ENDING waits in ``_ending`` until ``ended`` takes it out of the
   table: the store's answer is the only way out, but for ``drop`` (its
   shard handed over).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from wheel.engine.model import RunState
from wheel.engine.owner._values import LEASE, TIMEOUT, Phase
from wheel.engine.timerwheel import TimerWheel

_RUN_TRANSITIONS: frozenset[tuple[Phase, Phase]] = frozenset(
    {
        (Phase.CLAIMING, Phase.DISPATCHED),
        (Phase.CLAIMING, Phase.READY),
        (Phase.READY, Phase.DISPATCHED),
        (Phase.DISPATCHED, Phase.RUNNING),
        (Phase.DISPATCHED, Phase.ENDING),
        (Phase.RUNNING, Phase.ENDING),
        (Phase.READY, Phase.ENDING),
        # Handed back by a worker that never started it.
        (Phase.DISPATCHED, Phase.READY),
        (Phase.RUNNING, Phase.READY),
    }
)


class _Run:
    __slots__ = (
        "armed",
        "attempt",
        "end_state",
        "fence",
        "held_out",
        "job_id",
        "lease_deadline",
        "payload",
        "phase",
        "refused",
        "reply_to",
        "retry_after",
        "run_id",
        "scheduled_for",
        "timed",
        "timeout_deadline",
        "worker_id",
    )

    def __init__(
        self,
        run_id: int,
        job_id: int,
        scheduled_for: int,
        attempt: int,
        fence: int,
        payload: bytes = b"",
    ) -> None:
        self.run_id = run_id
        self.job_id = job_id
        self.scheduled_for = scheduled_for
        self.attempt = attempt
        self.fence = fence
        # Read from the store with its claim (its job keeps no payload).
        self.payload = payload
        self.phase = Phase.CLAIMING
        self.worker_id: str | None = None
        self.lease_deadline = 0
        self.timeout_deadline = 0
        # Handed to a worker (or restored): counted in its job's ``running``.
        self.held_out = False
        # Its LEASE and TIMEOUT deadlines are wheel timers (else its grace
        # lease waits in the table's grace FIFO, or it has no lease yet).
        self.armed = False
        # Workers (by incarnation) that handed it back, and until when it is
        # not offered to them again (``_take_back``).
        self.refused: dict[int, int] | None = None
        # Its first hand-out counts as dispatch lag (how late a fire that
        # was due went out): a scheduled fire's first attempt or a trigger,
        # set when it is claimed (``on_claimed``). Not a backfill's or a
        # redrive's fire, which was not due when it was asked for, nor a
        # retry (its wait is its backoff), nor a run handed back and out again.
        self.timed = False
        # Set when it goes ENDING (``RunTable.ending``), read only after: the
        # terminal state sent to the store, the worker to answer once the
        # store applied it (None: nobody asked), and the least wait before a
        # retry its worker asked for (an HTTP target's Retry-After; 0: none).
        self.end_state: RunState
        self.reply_to: str | None
        self.retry_after: int


def set_phase(run: _Run, to: Phase) -> None:
    """Move ``run`` to phase ``to`` (invariant 1)."""
    if (run.phase, to) not in _RUN_TRANSITIONS:
        raise AssertionError(f"illegal run transition {run.phase.name} -> {to.name}")
    run.phase = to


class RunTable:
    """The runs an owner holds, by run id (read like a mapping), and their
    leases."""

    __slots__ = ("_ending", "_grace", "_runs", "_wheel", "graced")

    def __init__(self, wheel: TimerWheel) -> None:
        # The owner's wheel: the table files its runs' LEASE and TIMEOUT
        # timers there, ``(run_id << 2) | kind``; the owner reads them back.
        self._wheel = wheel
        self._runs: dict[int, _Run] = {}
        # Runs whose terminal state is on its way to the store.
        self._ending: dict[int, _Run] = {}
        # Grace leases in hand-out order: (deadline, run ids), deadlines
        # increasing (invariant 3).
        self._grace: deque[tuple[int, list[int]]] = deque()
        self.graced = 0  # runs in there that have not ended nor been armed

    # -- reading --------------------------------------------------------------------

    def get(self, run_id: int) -> _Run | None:
        return self._runs.get(run_id)

    def __getitem__(self, run_id: int) -> _Run:
        return self._runs[run_id]

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._runs

    def __len__(self) -> int:
        return len(self._runs)

    def __bool__(self) -> bool:
        # Spelled out: compiled code tests a compiled class without one for
        # None only, whatever its length.
        return bool(self._runs)

    def __iter__(self) -> Iterator[int]:
        return iter(self._runs)

    def values(self) -> list[_Run]:
        """The runs (a list: the caller may change the table meanwhile)."""
        return list(self._runs.values())

    def items(self) -> list[tuple[int, _Run]]:
        return list(self._runs.items())

    # -- in and out -----------------------------------------------------------------

    def add(self, run: _Run) -> None:
        """A run claimed (CLAIMING, or READY to wait for a worker), or
        restored from the store (DISPATCHED or RUNNING, armed)."""
        self._runs[run.run_id] = run

    def ending(
        self, run: _Run, state: RunState, reply_to: str | None, retry_after: int = 0
    ) -> None:
        """The run's terminal state is on its way to the store: its lease
        and timeout end (invariant 4)."""
        set_phase(run, Phase.ENDING)
        self.disarm(run)
        run.end_state, run.reply_to, run.retry_after = state, reply_to, retry_after
        self._ending[run.run_id] = run

    def ended(self, run_id: int) -> _Run | None:
        """The store answered the run's terminal state: it leaves the table
        (None: not ending here, e.g. its shard was handed over)."""
        run = self._ending.pop(run_id, None)
        if run is not None:
            del self._runs[run_id]
        return run

    def drop(self, run: _Run) -> None:
        """The run's shard is handed over: it leaves the table at once."""
        del self._runs[run.run_id]
        self._ending.pop(run.run_id, None)
        if run.phase in (Phase.DISPATCHED, Phase.RUNNING) or run.armed:
            self.disarm(run)

    # -- leases ---------------------------------------------------------------------

    def lease(self, run: _Run, now_ms: int, grace_ms: int) -> None:
        """A run handed out: a grace lease from now. Kept in the grace FIFO,
        or as its own timers when it has them already, when its timeout
        comes first, or when an earlier now than the last hand-out would
        unsort the FIFO."""
        deadline = run.lease_deadline = now_ms + grace_ms
        grace = self._grace
        last = grace[-1][0] if grace else None
        if run.armed or run.timeout_deadline <= deadline or (last is not None and last > deadline):
            self.arm(run)
        else:
            if last == deadline:
                grace[-1][1].append(run.run_id)
            else:
                grace.append((deadline, [run.run_id]))
            self.graced += 1

    def arm(self, run: _Run) -> None:
        """Give the run its own wheel timers: TIMEOUT, and LEASE once handed out."""
        run.armed = True
        if run.lease_deadline:
            self._wheel.add((run.run_id << 2) | LEASE, run.lease_deadline)
        self._wheel.add((run.run_id << 2) | TIMEOUT, run.timeout_deadline)

    def disarm(self, run: _Run) -> None:
        """The run's lease and timeout end: its timers are cancelled, or its
        grace entry is skipped when due (invariant 2)."""
        if run.armed:
            self._wheel.cancel((run.run_id << 2) | LEASE)
            self._wheel.cancel((run.run_id << 2) | TIMEOUT)
        elif run.lease_deadline:
            self.graced -= 1

    def adopt(self, run: _Run) -> None:
        """A run restored from the store in flight: its lease is a wheel
        timer from the start (its TIMEOUT follows with ``time_out_at``)."""
        run.armed = True
        self._wheel.add((run.run_id << 2) | LEASE, run.lease_deadline)

    def time_out_at(self, run: _Run, at_ms: int) -> None:
        """An adopted run's TIMEOUT timer."""
        self._wheel.add((run.run_id << 2) | TIMEOUT, at_ms)

    def renew_timer(self, run: _Run) -> None:
        """Its LEASE timer went off after a renewal moved the deadline: set
        again for the new deadline (renewals only move the deadline)."""
        self._wheel.add((run.run_id << 2) | LEASE, run.lease_deadline)

    def next_grace(self) -> int | None:
        """The earliest grace deadline (None: none waits)."""
        return self._grace[0][0] if self._grace else None

    def expire_grace(self, now_ms: int) -> None:
        """Grace leases due by ``now_ms``: runs that ended are gone; the rest
        get their own timers, which fire at once if due."""
        grace = self._grace
        runs = self._runs
        while grace and grace[0][0] <= now_ms:
            for run_id in grace.popleft()[1]:
                run = runs.get(run_id)
                if run is None or run.armed or run.phase not in (Phase.DISPATCHED, Phase.RUNNING):
                    continue
                self.graced -= 1
                self.arm(run)
