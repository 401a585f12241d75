"""A hierarchical timer wheel: integer ids, integer millisecond deadlines, no I/O.

The shard owner keeps every pending fire, lease expiry, retry backoff and grace
deadline here. Time is only ever an argument: `advance(now)` returns the ids that
are due, `next_deadline()` says how long the shell may sleep.

Levels, in the manner of tokio's time driver and Kafka's TimingWheel
--------------------------------------------------------------------
Seven levels of 64 slots. A slot of level k spans 64**k ms, so a level spans
64**(k+1) ms:

    level 0   64 slots x 1 ms            =  64 ms
    level 1   64 slots x 64 ms           =  4.096 s
    level 2   64 slots x 4.096 s         =  4 min 22 s
    level 3   64 slots x 4 min 22 s      =  4 h 40 min
    level 4   64 slots x 4 h 40 min      =  12.4 days
    level 5   64 slots x 12.4 days       =  2.2 years
    level 6   64 slots x 2.2 years       =  139 years
    overflow  one list for deadlines in a later 2**42 ms block

The levels are aligned to absolute time, not to the moment a timer was added.
A timer goes to the level of the highest 6-bit group in which its deadline and
now differ, in the slot that group of the deadline's bits names. Take
now = 100,000, in 6-bit groups 011000 011010 100000: its level-0 digit is 32,
its level-1 digit 26, its level-2 digit 24, and 0 above.

    deadline 100,010       differs from now in bits 0-5 only -> level 0, slot 42
                           (level-0 slot s of this block is the instant 99,968 + s)
    deadline 100,500       highest differing bit 11 -> level 1, slot 34, which
                           covers [100,480, 100,544)
    deadline 160,000       bit 17 -> level 2, slot 39: [159,744, 163,840)
    deadline now + 1 h     bit 21 -> level 3, slot 14: [3,670,016, 3,932,160)
    deadline now + 5 y     bit 37 -> level 6, slot 2: [2**37, 2**37 + 2**36)

So every occupied slot of a level lies after now's own slot of that level and
inside now's block of that level, and all of level 0 comes before all of level 1,
which comes before all of level 2, and so on: the earliest slot is the lowest set
bit of the lowest non-empty level's occupancy bitmap (`bits & -bits`), found
without looking at a single empty slot and without ticking through empty time.

`advance(t)` fires the level-0 slots up to t, whole slots at a time. When time
reaches the start of a slot at a coarser level (say level 2, slot 39 above, at
159,744), every finer level is empty by then; the slot is emptied and its timers
are filed again relative to now = 159,744, which puts them one or more levels
lower (160,000 differs from 159,744 in bit 8: level 1, slot 4, [160,000, 160,064)).
That is the cascade. A timer is filed at most once per level on its way down, so
add and fire are O(1) amortized and a deadline years ahead costs seven moves. A
big slot (128 to 65,536 timers) is cascaded in bulk instead: sorted by deadline,
the part already due fires straight away, the rest is sliced into the finer slots.

Memory: per timer, one dict entry (id -> deadline) and one reference in a slot
list, about 50 bytes at a million timers (42 at ten million); no per-timer
objects. The id and deadline int objects are the caller's; where the wheel holds
the only reference to them they add 64 bytes. Cancel is a dict pop, O(1); the
slot keeps the id, which turns stale and is dropped when its slot is reached. If
stale entries pile up (far-off timers cancelled en masse) the next advance
compacts the slots, O(entries), once they pass 2 x pending + 65,536.
Re-arming works the same way. Deadlines are absolute, never slot numbers, so
nothing drifts and a snapshot is just `items()`.

Invariants
----------
1. `_deadlines` holds exactly the pending timers, id -> absolute deadline; len(),
   `in`, deadline_of() and items() read it alone.
2. now never decreases: advance(t) with t < now does nothing and fires nothing.
3. Each pending timer has an entry (its id) in `_due` if its deadline is <= now,
   else in the slot described above, relative to the current now. Every entry
   in `_due` was filed at the current now.
4. Any other entry is stale: its id is no longer pending, or its deadline lies
   outside that slot's range (or is > now, for `_due`). `_stale` counts stale
   entries exactly; a stale entry never fires. Two entries of one id in one slot
   (re-armed into the same slot) fire once: firing deletes the id from
   `_deadlines` and the second entry finds it gone.
5. Bit s of `_occ[level]` is set iff slot s of that level is non-empty.
6. `_horizon` is <= the start of every occupied slot, and equals now while
   `_due` is non-empty; advance(t) with t < `_horizon` has nothing to do.
7. advance(t) fires every pending timer with deadline <= t and no other, each
   exactly once, in non-decreasing deadline order.
8. next_deadline() is None iff nothing is pending; otherwise it is >= now, <= the
   earliest pending deadline (or == now when a timer added with a deadline in
   the past is waiting: nothing fires before now), and advance(next_deadline())
   either fires something or makes next_deadline() strictly later.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence

LEVEL_BITS = 6
SLOTS = 1 << LEVEL_BITS  # 64 slots a level
LEVELS = 7  # level k has 64 slots of 64**k ms; the seven span 2**42 ms (~139 years)
TOP_BITS = LEVEL_BITS * LEVELS  # 42: a deadline that differs from now above bit 41 overflows
_OVERFLOW = LEVELS  # the overflow list is "level 7", one slot, at slot index 448

# Indexed by bit_length(deadline ^ now), 1..42: the level, and 6 * level.
_LEVEL_OF_BL = tuple((b - 1) // LEVEL_BITS if b else 0 for b in range(TOP_BITS + 1))
_SHIFT_OF_BL = tuple(LEVEL_BITS * lvl for lvl in _LEVEL_OF_BL)
_BASE_OF_BL = tuple(SLOTS * lvl for lvl in _LEVEL_OF_BL)  # the level's first slot index

# Slots with this many timers cascade in bulk (sort, then slice). Below it, timer by
# timer is cheaper; above it the sort's cache misses cost more than it saves.
_BULK_MIN = 128
_BULK_MAX = 1 << 16
# The horizon when nothing is pending: later than any deadline.
_NEVER = 1 << 256
# Compaction runs (at the next advance) once stale entries exceed
# 2 * pending + _COMPACT_FLOOR.
_COMPACT_FLOOR = 1 << 16


class TimerWheel:
    """Pending timers keyed by integer id, fired in deadline order by `advance`."""

    __slots__ = (
        "_check_at",
        "_deadlines",
        "_due",
        "_horizon",
        "_now",
        "_occ",
        "_slots",
        "_stale",
    )

    def __init__(self, now_ms: int = 0) -> None:
        if now_ms < 0:
            raise ValueError(f"now_ms must be >= 0, got {now_ms}")
        self._now = now_ms
        # id -> absolute deadline of every pending timer: the single source of truth.
        self._deadlines: dict[int, int] = {}
        # level * 64 + slot -> ids (index 448: the overflow list). May hold stale ids.
        self._slots: list[list[int]] = [[] for _ in range(LEVELS * SLOTS + 1)]
        # Per level (and the overflow at index 7): bit s set <=> that slot is non-empty.
        self._occ: list[int] = [0] * (LEVELS + 1)
        # Ids added with a deadline <= now: they fire on the next advance.
        self._due: list[int] = []
        # Entries in _slots and _due that stand for no pending timer (cancelled/moved).
        self._stale = 0
        # A lower bound of every occupied slot's start (now, while _due is non-empty):
        # advance(t) with t below it has nothing to do.
        self._horizon = _NEVER
        self._check_at = _COMPACT_FLOOR

    @property
    def now(self) -> int:
        """The wheel's time: the latest `advance` argument (or the start time)."""
        return self._now

    def __len__(self) -> int:
        return len(self._deadlines)

    def __bool__(self) -> bool:
        # Said, not left to __len__: compiled code tests an Optional of a
        # compiled class without __bool__ for None only (mypyc 2.4).
        return len(self) > 0

    def __contains__(self, timer_id: object) -> bool:
        try:
            return timer_id in self._deadlines
        except TypeError:
            return False

    def deadline_of(self, timer_id: int) -> int | None:
        """The pending timer's absolute deadline, or None if it is not pending."""
        return self._deadlines.get(timer_id)

    def items(self) -> Iterator[tuple[int, int]]:
        """(id, deadline) of every pending timer, in no particular order (snapshots).

        A live view: do not add, cancel or advance while iterating.
        """
        return iter(self._deadlines.items())

    def add(self, timer_id: int, deadline_ms: int) -> None:
        """Arm timer_id to fire at deadline_ms (absolute). O(1).

        Re-adding a pending id re-arms it: only the new deadline counts. A deadline
        <= now fires on the next advance.
        """
        dl = self._deadlines
        old = dl.get(timer_id)
        if old is not None:
            if old == deadline_ms:
                return
            # Re-arming: the old entry turns stale. File the new one like any other.
            self._stale += 1
        dl[timer_id] = deadline_ms
        now = self._now
        if deadline_ms <= now:
            self._due.append(timer_id)
            self._horizon = now
            return
        x = deadline_ms ^ now
        if x < 64:
            k = deadline_ms & 63
            lst = self._slots[k]
            if not lst:
                self._occ[0] |= 1 << k
                if deadline_ms < self._horizon:
                    self._horizon = deadline_ms
        else:
            b = x.bit_length()
            if b > TOP_BITS:
                lst = self._slots[_OVERFLOW << 6]
                if not lst:
                    self._occ[_OVERFLOW] = 1
                    start = ((now >> TOP_BITS) + 1) << TOP_BITS
                    if start < self._horizon:
                        self._horizon = start
            else:
                sh = _SHIFT_OF_BL[b]
                k = (deadline_ms >> sh) & 63
                lst = self._slots[_BASE_OF_BL[b] | k]
                if not lst:
                    self._occ[_LEVEL_OF_BL[b]] |= 1 << k
                    start = deadline_ms >> sh << sh
                    if start < self._horizon:
                        self._horizon = start
        lst.append(timer_id)

    def add_many(self, ids: Sequence[int], deadlines: Sequence[int]) -> None:
        """`add` each (id, deadline) pair, in order; faster than calling `add` in a loop."""
        if len(ids) != len(deadlines):
            raise ValueError("ids and deadlines differ in length")
        dl = self._deadlines
        get = dl.get
        slots = self._slots
        occ = self._occ
        due = self._due
        now = self._now
        level_of = _LEVEL_OF_BL
        shift_of = _SHIFT_OF_BL
        stale = 0
        for timer_id, d in zip(ids, deadlines, strict=True):
            old = get(timer_id)
            if old is not None:
                if old == d:
                    continue
                stale += 1
            dl[timer_id] = d
            if d <= now:
                due.append(timer_id)
                continue
            x = d ^ now
            if x < 64:
                k = d & 63
                lst = slots[k]
                if not lst:
                    occ[0] |= 1 << k
            else:
                b = x.bit_length()
                if b > TOP_BITS:
                    lst = slots[_OVERFLOW << 6]
                    occ[_OVERFLOW] = 1
                else:
                    lvl = level_of[b]
                    k = (d >> shift_of[b]) & 63
                    lst = slots[(lvl << 6) | k]
                    if not lst:
                        occ[lvl] |= 1 << k
            lst.append(timer_id)
        self._stale += stale
        self._horizon = self._earliest_start()
        if self._stale > self._check_at:
            self._maybe_compact()

    def cancel(self, timer_id: int) -> bool:
        """Disarm timer_id; True if it was pending. O(1): its slot entry turns stale."""
        if self._deadlines.pop(timer_id, None) is None:
            return False
        self._stale += 1
        return True

    def next_deadline(self) -> int | None:
        """When to call advance next: None if nothing is pending, else a time
        >= now and <= the earliest pending deadline (now if one is overdue).

        Exact when the earliest timer sits at level 0 or in a small slot; otherwise
        the start of its slot, and advancing there cascades the slot, so the next
        answer is strictly later or the timer fires.
        """
        if not self._deadlines:
            return None
        start = self._earliest_start()
        if start == self._now:
            return start  # something is due now (added with a deadline <= now)
        lvl = 0
        while not self._occ[lvl]:
            lvl += 1
        if lvl == 0 or lvl == _OVERFLOW:
            return start  # level 0: the slot's time is the deadline itself
        # Above level 0 the slot's start is a lower bound; when the slot is small,
        # the earliest live deadline in it is cheap to find, and exact.
        bits = self._occ[lvl]
        lst = self._slots[(lvl << 6) | ((bits & -bits).bit_length() - 1)]
        if len(lst) <= 64:
            end = start + (1 << (LEVEL_BITS * lvl))
            get = self._deadlines.get
            best = end
            for i in lst:
                d = get(i, end)
                if start <= d < best:
                    best = d
            if best < end:
                return best
        return start

    def _earliest_start(self) -> int:
        """The start of the earliest occupied slot; now if anything is due; else _NEVER."""
        if self._due:
            return self._now
        now = self._now
        occ = self._occ
        for lvl in range(LEVELS):
            bits = occ[lvl]
            if bits:
                sh = LEVEL_BITS * lvl
                k = (bits & -bits).bit_length() - 1
                return ((now >> sh >> LEVEL_BITS) << LEVEL_BITS | k) << sh
        if occ[_OVERFLOW]:
            return ((now >> TOP_BITS) + 1) << TOP_BITS
        return _NEVER

    def advance(self, now_ms: int) -> list[int]:
        """Move time to now_ms and return the ids now due, in deadline order.

        A timer fires once, never before its deadline. now_ms < now is a clock that
        stepped back: nothing fires and time stays where it was.
        """
        if self._stale > self._check_at:
            self._maybe_compact()
        if now_ms < self._horizon:
            # Nothing can be due. This also clamps a clock that stepped back.
            if now_ms > self._now:
                self._now = now_ms
            return []
        now = self._now
        dl = self._deadlines
        get = dl.get
        fired = self._take_due() if self._due else []
        occ = self._occ
        slots = self._slots
        stale = self._stale
        horizon = _NEVER
        while True:
            # Level 0: fire the occupied 1 ms slots of the current 64 ms window up to now_ms.
            bits = occ[0]
            if bits:
                window = now & -64
                rest = 0
                if now_ms - window < 64:
                    rest = bits & (-2 << (now_ms & 63))
                    bits ^= rest
                occ[0] = rest
                while bits:
                    low = bits & -bits
                    bits ^= low
                    k = low.bit_length() - 1
                    lst = slots[k]
                    slots[k] = []
                    if stale:
                        t = window | k
                        for i in lst:
                            if get(i) == t:
                                del dl[i]
                                fired.append(i)
                            else:
                                stale -= 1
                    else:
                        fired += lst
                        for i in lst:
                            del dl[i]
                if rest:
                    horizon = window | ((rest & -rest).bit_length() - 1)
                    break
            # Level 0 is empty now: the earliest occupied slot above it is next.
            lvl = 1
            while not occ[lvl]:
                lvl += 1
                if lvl > _OVERFLOW:
                    break
            else:
                bits = occ[lvl]
                low = bits & -bits
                k = low.bit_length() - 1
                if lvl == _OVERFLOW:
                    start = ((now >> TOP_BITS) + 1) << TOP_BITS
                else:
                    sh = LEVEL_BITS * lvl
                    start = ((now >> sh >> LEVEL_BITS) << LEVEL_BITS | k) << sh
                if start > now_ms:
                    horizon = start
                    break
                # Cascade: time reaches the slot's start; its timers move to finer
                # levels (all empty now), relative to now = start.
                occ[lvl] = bits ^ low
                idx = (lvl << 6) | k
                lst = slots[idx]
                slots[idx] = []
                now = start
                if lvl == 1 and len(lst) < _BULK_MIN:
                    # The common small case, inline: every timer lands in level 0.
                    bits = 0
                    if stale:
                        end = start + 64
                        for i in lst:
                            d = get(i, -1)
                            if start <= d < end:
                                k = d - start
                                dst = slots[k]
                                if not dst:
                                    bits |= 1 << k
                                dst.append(i)
                            else:
                                stale -= 1
                    else:
                        for i in lst:
                            k = dl[i] - start
                            dst = slots[k]
                            if not dst:
                                bits |= 1 << k
                            dst.append(i)
                    occ[0] = bits
                else:
                    stale = self._cascade(lst, lvl, start, now_ms, stale, fired)
                continue
            break
        self._horizon = horizon
        self._stale = stale
        self._now = now_ms
        return fired

    def _take_due(self) -> list[int]:
        """Fire the timers added with a deadline <= now, in deadline order."""
        dl = self._deadlines
        due = self._due
        self._due = []
        now = self._now
        # Every entry was filed at this same now, so a live one has deadline <= now;
        # a timer re-armed since has a later deadline (its entry here is stale).
        live = [i for i in dict.fromkeys(due) if dl.get(i, now + 1) <= now]
        self._stale -= len(due) - len(live)
        live.sort(key=dl.__getitem__)
        for i in live:
            del dl[i]
        return live

    def _cascade(
        self, lst: list[int], lvl: int, start: int, now_ms: int, stale: int, fired: list[int]
    ) -> int:
        """Refile one slot's timers into the finer levels, which are all empty; now == start.

        Returns the new stale count. A big slot is sorted by deadline and sliced: the
        timers due by now_ms fire at once (in order), the rest land slot by slot.
        """
        dl = self._deadlines
        if stale:
            get = dl.get
            n = len(lst)
            if lvl == _OVERFLOW:
                lst = [i for i in lst if get(i, -1) >= start]
            else:
                end = start + (1 << (LEVEL_BITS * lvl))
                lst = [i for i in lst if start <= get(i, -1) < end]
            stale -= n - len(lst)
        slots = self._slots
        occ = self._occ
        if lvl == _OVERFLOW:
            self._file_relative(lst, start)
            return stale
        if not _BULK_MIN <= len(lst) <= _BULK_MAX:
            # Timer by timer. 63 in 64 land one level down; the rest go lower still.
            j = lvl - 1
            sh = LEVEL_BITS * j
            floor = 1 << sh
            base = j << 6
            bits = 0
            lower = []
            for i in lst:
                x = dl[i] - start
                if x >= floor:
                    k = x >> sh
                    dst = slots[base | k]
                    if not dst:
                        bits |= 1 << k
                    dst.append(i)
                else:
                    lower.append(i)
            occ[j] = bits
            if lower:
                self._file_relative(lower, start)
            return stale
        key = dl.__getitem__
        lst.sort(key=key)
        hi = len(lst)
        lo = bisect_right(lst, now_ms, 0, hi, key=key)
        if lo:
            due = lst[:lo]
            if stale:
                # Duplicates (a timer re-armed into this same slot) sort side by side.
                before = len(due)
                due = list(dict.fromkeys(due))
                stale -= before - len(due)
            fired += due
            for i in due:
                del dl[i]
        # Slice [lo, hi) level by level: at level j, the timers past start + 64**j go to
        # slots 1..63 of level j; the rest, still sorted, go on down to level j - 1.
        for j in range(lvl - 1, -1, -1):
            if lo >= hi:
                break
            sh = LEVEL_BITS * j
            cut = bisect_left(lst, start + (1 << sh), lo, hi, key=key)
            pos = cut
            bits = 0
            base = j << 6
            while pos < hi:
                k = (key(lst[pos]) - start) >> sh
                e = bisect_left(lst, start + ((k + 1) << sh), pos, hi, key=key)
                slots[base | k] = lst[pos:e]
                bits |= 1 << k
                pos = e
            occ[j] = bits
            hi = cut
        # Anything left in [lo, hi) has deadline == start <= now_ms: fired above.
        return stale

    def _file_relative(self, ids: list[int], start: int) -> None:
        """File pending ids whose deadlines are >= start relative to now == start."""
        dl = self._deadlines
        slots = self._slots
        occ = self._occ
        level_of = _LEVEL_OF_BL
        shift_of = _SHIFT_OF_BL
        for i in ids:
            x = dl[i] - start
            if x < 64:
                j = 0
                k = x
            else:
                b = x.bit_length()
                if b > TOP_BITS:
                    slots[_OVERFLOW << 6].append(i)
                    occ[_OVERFLOW] = 1
                    continue
                j = level_of[b]
                k = x >> shift_of[b]
            dst = slots[(j << 6) | k]
            if not dst:
                occ[j] |= 1 << k
            dst.append(i)

    def _refile(self, ids: list[int], now: int) -> None:
        """File pending ids (no duplicates) relative to `now` without touching _deadlines."""
        dl = self._deadlines
        slots = self._slots
        occ = self._occ
        due = self._due
        level_of = _LEVEL_OF_BL
        shift_of = _SHIFT_OF_BL
        for i in ids:
            d = dl[i]
            if d <= now:
                due.append(i)
                continue
            x = d ^ now
            b = x.bit_length()
            if b > TOP_BITS:
                slots[_OVERFLOW << 6].append(i)
                occ[_OVERFLOW] = 1
                continue
            lvl = level_of[b]
            k = (d >> shift_of[b]) & 63
            dst = slots[(lvl << 6) | k]
            if not dst:
                occ[lvl] |= 1 << k
            dst.append(i)

    def _maybe_compact(self) -> None:
        live = len(self._deadlines)
        if not live:
            self._slots = [[] for _ in range(LEVELS * SLOTS + 1)]
            self._occ = [0] * (LEVELS + 1)
            self._due = []
            self._stale = 0
            self._horizon = _NEVER
        elif self._stale > 2 * live + _COMPACT_FLOOR:
            self._compact()
        self._check_at = 2 * live + _COMPACT_FLOOR

    def _compact(self) -> None:
        """Drop stale entries: O(entries). Duplicates of moved timers go with a refile."""
        dl = self._deadlines
        has = dl.__contains__
        slots = self._slots
        occ = self._occ
        total = 0
        for lvl in range(LEVELS + 1):
            bits = occ[lvl]
            while bits:
                low = bits & -bits
                bits ^= low
                idx = (lvl << 6) | (low.bit_length() - 1)
                kept = list(filter(has, slots[idx]))
                slots[idx] = kept
                if not kept:
                    occ[lvl] ^= low
                total += len(kept)
        self._due = list(filter(has, self._due))
        total += len(self._due)
        self._stale = total - len(dl)
        if self._stale > len(dl) // 2:
            # Many entries of re-armed timers remain: refile everything from scratch.
            self._slots = [[] for _ in range(LEVELS * SLOTS + 1)]
            self._occ = [0] * (LEVELS + 1)
            self._due = []
            self._stale = 0
            self._refile(list(dl), self._now)
        self._horizon = self._earliest_start()
