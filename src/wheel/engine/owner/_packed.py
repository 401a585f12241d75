"""Jobs at rest as packed rows, awake as objects.

Most of an owner's jobs have nothing going on: their next fire is hours or
days away. Each of those is one row of its shard's ``ShardJobs`` table (37
bytes: see ``wheel.engine.jobtable``), not an object. A job *wakes* -- becomes
a ``_Job`` in ``self.jobs``, its row marked ``AWAKE`` -- when its FIRE timer
goes off, when the owner is told something about it, or when it is read; it
goes back to rest (``settle``) once its work is over and its next fire is not
due within ``keep_awake_ms``. Submitted, restored and gained jobs all start at
rest; a job that fires every few seconds stays awake.

Timers of jobs at rest are armed ahead, not all at once: the wheel holds a
FIRE timer for each job at rest due before ``armed_until`` (the next
``arm_ahead_ms``), and ``arm_ahead`` scans the tables' ``due`` columns for the
next stretch as time moves on. So ten million jobs cost the wheel only the
timers of the next minute.

Invariants (tests in tests/engine/test_packed.py):

1. Every job the owner holds has exactly one row in its shard's table: at
   rest, or ``AWAKE`` with an object in ``self.jobs``; a job that left is a
   tombstone or no row.
2. A job at rest with ``due < armed_until`` has a FIRE timer in the wheel at
   ``due``; one with ``due >= armed_until`` has ``due >= next_unarmed``.
   An awake job's FIRE timer is its own business (``JobBook.arm``).
3. A job goes to rest only when nothing of it is in flight, queued, due,
   buffered, skipped or on its way to the store, and its schedule in the
   store is what the owner has armed (or it is paused): its row then says
   everything a wake needs, and waking it gives back the same job.
4. A job at rest due before its jittered time (a row made from a store row
   knows only the nominal time) is armed at the nominal time and re-armed
   at the jittered one when the timer wakes it: never early.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np

from wheel.engine.calendars import CalendarBook
from wheel.engine.jobtable import (
    AWAKE,
    GONE,
    NEVER,
    NO_FIRE,
    PAUSED,
    PAYLOAD,
    Columns,
    ShardJobs,
)
from wheel.engine.owner._shardmap import ShardMap, _Shard
from wheel.engine.owner._state import _Job
from wheel.engine.owner._values import FIRE, OwnerConfig, PackedJob
from wheel.engine.profiles import Profile, Profiles, schedule_of
from wheel.engine.schedule import CompiledSchedule, compile_schedule, with_calendars
from wheel.engine.spec import JobSpec, SideEffect
from wheel.engine.timerwheel import TimerWheel

# The flags a row taken on keeps: rows as a checkpoint or a load gives them
# are at rest, none awake.
AT_REST = PAUSED | PAYLOAD | GONE

log = logging.getLogger("wheel.owner")

# The instants whose fires are counted (``_Shelf._count``): 2^16 ms slots,
# 65.5 s, over the minute armed ahead.
_SLOTS = 1 << 16
_SLOT_MASK = _SLOTS - 1


class _Shelf:
    """The book's shelf: awake jobs by id, jobs at rest as rows of their
    shard's table (in ``shard_map``), and the stretch of FIRE timers armed
    ahead in the wheel. ``JobBook`` (``_jobs``) is the part built on it."""

    __slots__ = (
        "_counts",
        "_holds",
        "_instants",
        "armed_until",
        "calendars",
        "config",
        "dirty",
        "jobs",
        "next_unarmed",
        "profiles",
        "settling",
        "shard_map",
        "wheel",
    )

    def __init__(
        self, *, config: OwnerConfig, wheel: TimerWheel, shard_map: ShardMap, now_ms: int
    ) -> None:
        self.config = config
        self.wheel = wheel
        self.shard_map = shard_map
        # Awake jobs (work going on, or a fire due soon), by id; the others
        # rest as packed rows in their shard's table.
        self.jobs: dict[int, _Job] = {}
        self.profiles = Profiles()
        # The calendars jobs skip, by tenant and name (``Owner.set_calendar``).
        self.calendars = CalendarBook()
        # Jobs at rest due before ``armed_until`` have their FIRE timer in
        # the wheel; none of the others is due before ``next_unarmed``.
        self.armed_until = now_ms
        self.next_unarmed = NEVER
        # Jobs whose fires are held while their spec changes in the store
        # (``JobBook.hold_fires``): paused in memory only, never so in an image.
        self._holds: set[int] = set()
        # Awake jobs whose work may be over: put back to rest (``settle``).
        self.settling: set[int] = set()
        # Jobs whose packed image changed since ``take_dirty`` (the node logs them).
        self.dirty: set[int] = set()
        # Fires armed at each instant (``_count``): a slot an instant, by its
        # low bits, kept for the newest instant that used it; the span of
        # the slots is over ``arm_ahead_ms``, so the instants armed ahead
        # rarely share one. Counted only where a lead is for bursts alone.
        counting = config.claim_ahead_ms > 0 and config.claim_ahead_min > 1
        self._instants: list[int] = [-1] * (_SLOTS if counting else 0)
        self._counts: list[int] = [0] * (_SLOTS if counting else 0)

    # -- finding and waking jobs ------------------------------------------------------

    def job(self, job_id: int) -> _Job | None:
        """The job, woken if it is at rest. The dispatch path writes
        ``self.jobs.get(j) or self.job(j)``: a job it touches is nearly
        always awake, and the call costs more than the get."""
        job = self.jobs.get(job_id)
        if job is None:
            job = self._wake(job_id)
        return job

    def job_or_raise(self, job_id: int) -> _Job:
        job = self.job(job_id)
        if job is None:
            raise KeyError(job_id)
        return job

    def _wake(self, job_id: int) -> _Job | None:
        table = self.shard_map.table_of(job_id)
        if table is None:
            return None
        i = table.find(job_id)
        if i < 0 or table.flags[i] & AWAKE:
            return None
        nxt, due, param = table.nxt[i], table.due[i], table.param[i]
        prof, flags = table.prof[i], table.flags[i]
        profile = self.profiles[prof]
        try:
            compiled = self.compile_spec(job_id, profile.template, param)
        except Exception:
            # One bad row (an expression this version rejects) must not stop
            # the owner, nor every other job of the shard from running.
            log.exception("job %s could not be loaded; skipped", job_id)
            self.wheel.cancel((job_id << 2) | FIRE)
            table.remove_at(i)
            return None
        job = _Job(job_id, profile.template, compiled, prof, param, bool(flags & PAYLOAD))
        job.paused = bool(flags & PAUSED)
        job.store_next = None if nxt == NO_FIRE else nxt
        job.next_fire = None if job.paused else job.store_next
        table.flags[i] = flags | AWAKE
        table.due[i] = NEVER
        if job.next_fire is not None:
            # Its timer while at rest, if armed, is at ``due`` (less the
            # claim's lead: ``_led``): a row made from a store row
            # knows only the fire's nominal time, and the job's jitter (never
            # earlier) moves it now. An awake job's timer is always in the
            # wheel.
            at = self.fire_timer(compiled, job.next_fire)
            if at != self._led(due) or due >= self.armed_until:
                self.wheel.add((job_id << 2) | FIRE, at)
        self.jobs[job_id] = job
        self.settling.add(job_id)
        return job

    def wake_to_fire(self, job_id: int, now_ms: int) -> _Job | None:
        """A job at rest whose FIRE timer went off, if its fire is due: one
        armed at the nominal time of a jittered fire is due later (armed
        again for then: ``_wake`` did where it saw the need, and it is done
        here in any case, as a timer armed a lead ahead of an instant that
        is no burst's now would otherwise leave the job without one)."""
        job = self.job(job_id)
        if job is None or job.next_fire is None:
            return None
        at = self.fire_timer(job.compiled, job.next_fire)
        if at > now_ms:
            self.wheel.add((job_id << 2) | FIRE, at)
            return None
        return job

    def fire_timer(self, compiled: CompiledSchedule, fire: int) -> int:
        """When a fire's FIRE timer goes off: at its jittered time, or
        ``claim_ahead_ms`` before it where no jitter moves it and its
        instant is a burst's (``_ahead``; its claim may go ahead:
        ``fires_now``; its run waits for its time in the dispatcher's
        ``held``). Where the timer would be; ``arm_timer`` arms one."""
        at = compiled.jittered(fire)
        return self._led(at) if at == fire else at

    def arm_timer(self, compiled: CompiledSchedule, fire: int) -> int:
        """``fire_timer`` of a fire being armed, counted at its instant."""
        at = compiled.jittered(fire)
        if at != fire:
            return at
        self._count(at)
        return self._led(at)

    def _led(self, at: int) -> int:
        """A timer for instant ``at``: the claim's lead before it where it
        is a burst's (``_ahead``), else at it. A job at rest's is armed
        ahead at its row's ``due``: a row may hold a jittered time, and a
        job woken before its time is armed again where its jitter puts it
        (``_wake``)."""
        return at - self.config.claim_ahead_ms if self._ahead(at) else at

    def _count(self, at: int) -> None:
        """One more fire armed at instant ``at`` (where bursts are counted)."""
        instants = self._instants
        if instants:
            slot = at & _SLOT_MASK
            if instants[slot] == at:
                self._counts[slot] += 1
            else:
                instants[slot] = at
                self._counts[slot] = 1

    def _ahead(self, at: int) -> bool:
        """Whether fires at instant ``at`` are claimed ahead: with a lead, at
        every instant, or where ``claim_ahead_min`` is over one only at a
        burst's, one at which that many fires were armed (the first few
        armed are not: a burst's commit is long, a few fires' is short)."""
        config = self.config
        if config.claim_ahead_ms <= 0:
            return False
        instants = self._instants
        if not instants:
            return True
        slot = at & _SLOT_MASK
        return instants[slot] == at and self._counts[slot] >= config.claim_ahead_min

    def fires_now(self, job: _Job, now_ms: int) -> bool:
        """Whether a job whose FIRE timer went off fires now: at its due
        time, or ahead of it (``fire_timer``) while nothing of the job is
        going on -- its run is claimed now and handed out at its time. Not
        ahead: a job busy when its lead begins (judged then, its overlap
        policy would skip a fire whose running run ends inside the lead), a
        job with a concurrency key (its permit would be held for the lead),
        and an ``at_most_once`` job (a node lost inside the lead leaves its
        claimed run ``unknown``, never re-sent, though no worker had it).
        Not firing now, its timer is armed again for its due time."""
        fire = job.next_fire
        assert fire is not None
        due = job.compiled.jittered(fire)
        if due <= now_ms:
            return True
        if (
            due == fire
            and now_ms >= fire - self.config.claim_ahead_ms
            and job.inflight <= 0
            and not job.due
            and not job.buffered
            and not job.ready
            and job.ending <= 0
            and not job.spec.concurrency_key
            and job.spec.side_effect is not SideEffect.AT_MOST_ONCE
        ):
            return True
        self.wheel.add((job.job_id << 2) | FIRE, due)
        return False

    def _add_rest_timers(self, ids: list[int], deadlines: list[int]) -> None:
        """Arm jobs at rest; their instants counted first, so that every
        fire of a burst armed here goes ahead, not only its later ones."""
        lead = self.config.claim_ahead_ms
        if lead:
            for d in deadlines:
                self._count(d)
            deadlines = [self._led(d) for d in deadlines]
        self.wheel.add_many([(j << 2) | FIRE for j in ids], deadlines)

    def compile_spec(self, job_id: int, spec: JobSpec, param: int) -> CompiledSchedule:
        schedule = schedule_of(spec, param)
        compiled = compile_schedule(
            schedule,
            jitter_ms=spec.jitter_ms,
            job_id=job_id,
            active_from_ms=spec.active_from_ms,
            active_until_ms=spec.ends_at_ms(schedule),
        )
        if spec.skip_calendars:
            days = self.calendars.days_for(spec.tenant, spec.skip_calendars)
            compiled = with_calendars(compiled, schedule, days)
        return compiled

    # -- what the owner holds ---------------------------------------------------------

    def has_job(self, job_id: int) -> bool:
        if job_id in self.jobs:
            return True
        table = self.shard_map.table_of(job_id)
        return table is not None and table.find(job_id) >= 0

    def job_count(self) -> int:
        return sum(len(held.table) for held in self.shard_map.values())

    def awake_count(self) -> int:
        return len(self.jobs)

    def job_ids(self) -> list[int]:
        return [j for held in self.shard_map.values() for j in held.table.live_ids()]

    def unarmed_fires(self) -> int:
        """Jobs at rest with a fire due after the stretch armed in the wheel."""
        until = self.armed_until
        return sum(held.table.due_from(until) for held in self.shard_map.values())

    def packed_bytes(self) -> int:
        """What the tables of jobs at rest take (their arrays' memory)."""
        return sum(held.table.nbytes() for held in self.shard_map.values())

    def profile(self, profile_id: int) -> Profile | None:
        index = self.profiles.index_of(profile_id)
        return None if index is None else self.profiles[index]

    def image_of(self, job_id: int) -> PackedJob | None:
        """A job as it rests (None: the job is gone): what a checkpoint keeps."""
        job = self.jobs.get(job_id)
        if job is not None:
            return self._image(job)
        table = self.shard_map.table_of(job_id)
        if table is None:
            return None
        i = table.find(job_id)
        if i < 0:
            return None
        return PackedJob(
            job_id,
            table.nxt[i],
            table.due[i],
            table.param[i],
            self.profiles[table.prof[i]].profile_id,
            table.flags[i] & (PAUSED | PAYLOAD),
        )

    def _image(self, job: _Job) -> PackedJob:
        nxt = NO_FIRE if job.store_next is None else job.store_next
        # A job held for an update is paused in memory only: its image is
        # what the store has (a restart re-arms it from there).
        paused = job.paused and job.job_id not in self._holds
        due = NEVER
        if job.store_next is not None and not paused:
            due = job.compiled.jittered(job.store_next)
        return PackedJob(
            job.job_id,
            nxt,
            due,
            job.param,
            self.profiles[job.profile].profile_id,
            (PAUSED if paused else 0) | (PAYLOAD if job.has_payload else 0),
        )

    def take_dirty(self) -> set[int]:
        dirty, self.dirty = self.dirty, set()
        return dirty

    def snapshot_columns(self, shard: int) -> Columns | None:
        """A copy of the shard's rows as a checkpoint keeps them: awake jobs
        as they would rest, no tombstones; ``prof`` numbers ``profiles``
        (None: the shard is not held)."""
        held = self.shard_map.get(shard)
        if held is None:
            return None
        table = held.table
        c = table.columns()
        awake = np.flatnonzero((c.flags & (AWAKE | GONE)) == AWAKE)
        for i in awake.tolist():
            job = self.jobs.get(int(c.ids[i]))
            if job is None:  # pragma: no cover - an awake row has its object
                c.flags[i] = GONE
                continue
            image = self._image(job)
            c.nxt[i], c.due[i], c.param[i] = image.nxt, image.due, image.param
            c.prof[i], c.flags[i] = job.profile, image.flags
        if table.gone or len(awake):
            c = c.take((c.flags & GONE) == 0)
        return c

    # -- rest and wake ----------------------------------------------------------------

    def keep_job(self, job: _Job) -> None:
        """A new awake job: in the table of awake jobs and its shard's rows."""
        self.jobs[job.job_id] = job
        table = self.shard_map[job.shard].table
        flags = AWAKE | (PAYLOAD if job.has_payload else 0)
        table.put(job.job_id, NO_FIRE, NEVER, job.param, job.profile, flags)
        self.settling.add(job.job_id)

    def _forget_job(self, job: _Job) -> None:
        """A job leaves the owner: its schedule and runs are over."""
        del self.jobs[job.job_id]
        held = self.shard_map.get(job.shard)
        if held is not None:
            i = held.table.locate(job.job_id)
            if i >= 0:
                held.table.remove_at(i)
        self.dirty.add(job.job_id)

    def _park(
        self,
        table: ShardJobs,
        job_id: int,
        nxt: int,
        due: int,
        param: int,
        prof: int,
        flags: int,
        *,
        new: bool = False,
    ) -> None:
        """Put a job at rest (a ``new`` one, whose fire counts at its instant,
        or one going back to rest, counted when it was armed awake), armed if
        it comes due within the stretch armed already."""
        table.put(job_id, nxt, due, param, prof, flags)
        if due < self.armed_until:
            if new:
                self._count(due)
            self.wheel.add((job_id << 2) | FIRE, self._led(due))
        else:
            self.wheel.cancel((job_id << 2) | FIRE)
            if due < self.next_unarmed:
                self.next_unarmed = due

    def settle(self, now_ms: int) -> None:
        """Put the woken jobs whose work is over back to rest, unless they
        fire again soon (invariant 3)."""
        settling, self.settling = self.settling, set()
        keep_until = now_ms + self.config.keep_awake_ms
        jobs = self.jobs
        for job_id in settling:
            job = jobs.get(job_id)
            if job is None or not _at_rest(job) or job_id in self._holds:
                continue  # gone, busy or held: settled again when its work ends
            due = NEVER
            if not job.paused and job.next_fire is not None:
                due = job.compiled.jittered(job.next_fire)
                if due < keep_until:
                    continue  # fires soon: awake it stays
            held = self.shard_map.get(job.shard)
            if held is None:  # pragma: no cover - an awake job's shard is held
                continue
            del jobs[job_id]
            flags = (PAUSED if job.paused else 0) | (PAYLOAD if job.has_payload else 0)
            nxt = NO_FIRE if job.store_next is None else job.store_next
            self._park(held.table, job_id, nxt, due, job.param, job.profile, flags)

    def arm_ahead(self, now_ms: int) -> None:
        """Arm the FIRE timers of the jobs at rest that come due within the
        next ``arm_ahead_ms`` (invariant 2): a scan of the tables' ``due``
        columns, every ``arm_step_ms`` at most while jobs come due."""
        ahead = self.config.arm_ahead_ms
        if now_ms + ahead < self.next_unarmed:
            return
        lo = self.armed_until
        hi = max(lo, now_ms + ahead + self.config.arm_step_ms)
        first = NEVER
        # Every shard's first, then armed at once: a burst's fires lie in
        # many shards, and all of them count before any is armed.
        all_ids: list[int] = []
        all_deadlines: list[int] = []
        for held in self.shard_map.values():
            ids, deadlines, after = held.table.arm(lo, hi)
            if ids:
                all_ids.extend(ids)
                all_deadlines.extend(deadlines)
            if after < first:
                first = after
        if all_ids:
            self._add_rest_timers(all_ids, all_deadlines)
        self.armed_until = hi
        self.next_unarmed = first

    def next_arming(self) -> int | None:
        """When ``arm_ahead`` has timers to arm next (None: no job at rest
        comes due)."""
        if self.next_unarmed == NEVER:
            return None
        return max(self.wheel.now, self.next_unarmed - self.config.arm_ahead_ms)

    def add_rest(self, packed: Mapping[int, Columns], profiles: Sequence[Profile]) -> int:
        """The rest of shards gained due first: rows of jobs not due soon
        (``packed``, their ``prof`` numbering ``profiles``), added to the
        held shards' tables where no row of the job is there yet -- what the
        owner holds came later (the first part, the change feed since) --
        and armed as invariant 2 asks. Returns how many rows were added."""
        lookup = np.asarray([self.profiles.add(p) for p in profiles], dtype=np.int32)
        added = 0
        for shard, rows in packed.items():
            held = self.shard_map.get(shard)
            if held is None or not len(rows):
                continue
            table = held.table
            # A copy: a view of the table's ids would keep it from growing.
            have = np.array(table.ids, dtype=np.int64)
            new = rows.take(~np.isin(rows.ids, have))
            if not len(new):
                continue
            new.prof = lookup[new.prof]
            new.flags &= AT_REST
            table.extend(new)
            early = new.due < self.armed_until
            if early.any():
                ids = [int(j) for j in new.ids[early]]
                self._add_rest_timers(ids, [int(d) for d in new.due[early]])
            if not early.all():
                first = int(new.due[~early].min())
                table.low = min(table.low, first)
                self.next_unarmed = min(self.next_unarmed, first)
            added += len(new)
        return added

    def take_on_rows(self, held: _Shard, rows: Columns, profiles: list[int]) -> None:
        """Rows of a gained shard (``prof`` numbering ``profiles``' entries,
        owner numbers): the shard's table, its FIRE timers armed ahead."""
        if len(rows):
            rows.prof = np.asarray(profiles, dtype=np.int32)[rows.prof]
            rows.flags &= AT_REST
        self._arm_table(held, ShardJobs(rows))

    def take_on_table(self, held: _Shard, table: ShardJobs, profiles: list[int]) -> None:
        """``take_on_rows`` of rows built into a table already: the table
        itself becomes the shard's, renumbered in place."""
        table.renumber(np.asarray(profiles, dtype=np.int32), AT_REST)
        self._arm_table(held, table)

    def _arm_table(self, held: _Shard, table: ShardJobs) -> None:
        held.table = table
        ids, deadlines, after = table.arm(NO_FIRE + 1, self.armed_until)
        if ids:
            self._add_rest_timers(ids, deadlines)
        self.next_unarmed = min(self.next_unarmed, after)


def _at_rest(job: _Job) -> bool:
    """Nothing of the job is going on, and its row can say all of it
    (invariant 3)."""
    return (
        job.inflight <= 0
        and not job.due
        and not job.buffered
        and not job.skipped
        and not job.ready
        and job.running <= 0
        and job.ending <= 0
        and job.advancing <= 0
        and not job.queued
        and not job.cancelled
        and (job.paused or job.next_fire == job.store_next)
    )
