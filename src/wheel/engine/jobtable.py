"""Packed jobs: the jobs of one shard as columns of machine integers.

An owner of ten million jobs cannot keep an object per job: a small Python
object with a few attributes costs hundreds of bytes, a dict entry with its
key and value ints over a hundred. ``ShardJobs`` keeps each job as one row
across six typed arrays -- 37 bytes a job -- sorted by job id, so a job is
found by binary search and a shard's jobs are read, written, scanned and
snapshotted as whole columns (numpy views over the same memory, no copies).

A row holds what a job at rest is: its id, the nominal time of its next fire
as the store has it (``nxt``), when that fire is due once jittered (``due``:
the deadline of its FIRE timer), its schedule parameter and profile number
(``wheel.engine.profiles``), and flags. A job that has work going on (a fire
due, a run in flight) is *awake*: the owner keeps it as an object and the row
only marks it (``AWAKE``, ``due`` = ``NEVER``). A job that left is a tombstone
(``GONE``) until the next compaction.

Rows are sorted by id. New jobs get ever larger ids from the store, so an
insert is nearly always an append; one that is not shifts the columns (a
memmove of the shard, ~40,000 rows at ten million jobs).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = [
    "AWAKE",
    "GONE",
    "NEVER",
    "NO_FIRE",
    "PAUSED",
    "PAYLOAD",
    "Columns",
    "ShardJobs",
]

# ``nxt`` of a job with no next fire; ``due`` of a job with nothing to arm
# (paused, no next fire, awake, gone). Both lie outside any real deadline.
NO_FIRE = -(1 << 63)
NEVER = (1 << 63) - 1
# Tables this small are scanned by a Python loop: numpy's per-call cost is
# more than the loop's.
_SMALL = 64
# Rows renumbered at a time (``ShardJobs.renumber``).
_RENUMBER_SLICE = 65_536

PAUSED = 1
PAYLOAD = 2  # its payload is not empty: the claim that dispatches it reads it
AWAKE = 4
GONE = 8

Int64s = npt.NDArray[np.int64]


class Columns:
    """A shard's rows as numpy arrays, one per column, ids sorted (what a
    snapshot writes, a load reads, and a bulk insert takes)."""

    __slots__ = ("due", "flags", "ids", "nxt", "param", "prof")

    def __init__(
        self,
        ids: Int64s,
        nxt: Int64s,
        due: Int64s,
        param: Int64s,
        prof: npt.NDArray[np.int32],
        flags: npt.NDArray[np.uint8],
    ) -> None:
        self.ids = ids
        self.nxt = nxt
        self.due = due
        self.param = param
        self.prof = prof
        self.flags = flags

    def __len__(self) -> int:
        return len(self.ids)

    def __bool__(self) -> bool:
        # Said, not left to __len__: compiled code tests an Optional of a
        # compiled class without __bool__ for None only (mypyc 2.4).
        return len(self) > 0

    @staticmethod
    def empty() -> Columns:
        i8 = np.empty(0, dtype=np.int64)
        return Columns(i8, i8, i8, i8, np.empty(0, dtype=np.int32), np.empty(0, dtype=np.uint8))

    def take(self, index: npt.NDArray[np.intp] | npt.NDArray[np.bool_]) -> Columns:
        return Columns(
            self.ids[index],
            self.nxt[index],
            self.due[index],
            self.param[index],
            self.prof[index],
            self.flags[index],
        )

    def sorted(self) -> Columns:
        """The rows in id order; of rows with the same id, the last wins."""
        ids = self.ids
        if len(ids) < 2 or bool(np.all(ids[1:] > ids[:-1])):
            return self
        order = np.argsort(ids, kind="stable")
        s = ids[order]
        # Keep the last of each run of equal ids (the newest row).
        keep = np.ones(len(s), dtype=np.bool_)
        keep[:-1] = s[1:] != s[:-1]
        return self.take(order[keep])


def _col(code: str, values: npt.NDArray[np.generic] | None = None) -> array:  # type: ignore[type-arg]
    """A column as an array of ``code`` (``values``' dtype is that type).
    Copied once, straight from the numpy buffer: through ``tobytes`` it was
    copied twice, and a node taking on two million jobs' rows spent most of
    a third of a second on its loop copying them (freshly faulted pages)."""
    out = array(code)
    if values is not None and len(values):
        out.frombytes(np.ascontiguousarray(values).data.cast("B"))
    return out


class ShardJobs:
    """The jobs of one shard, packed (see the module docstring)."""

    __slots__ = ("due", "flags", "gone", "ids", "low", "nxt", "param", "prof")

    def __init__(self, columns: Columns | None = None) -> None:
        self._load(columns if columns is not None else Columns.empty())

    def _load(self, c: Columns) -> None:
        self.ids = _col("q", c.ids)
        self.nxt = _col("q", c.nxt)
        self.due = _col("q", c.due)
        self.param = _col("q", c.param)
        self.prof = _col("i", c.prof)
        self.flags = _col("B", c.flags)
        self.gone = int(np.count_nonzero(c.flags & GONE)) if len(c) else 0
        # No row comes due before this (a lower bound): ``arm`` skips the
        # shard's scan while its stretch ends before it.
        self.low = int(c.due.min()) if len(c) else NEVER

    def __len__(self) -> int:
        """Jobs held (awake or at rest), tombstones not counted."""
        return len(self.ids) - self.gone

    def __bool__(self) -> bool:
        # Said, not left to __len__: compiled code tests an Optional of a
        # compiled class without __bool__ for None only (mypyc 2.4).
        return len(self) > 0

    def renumber(self, numbers: npt.NDArray[np.int32], keep: int) -> None:
        """In place: every row's profile number ``p`` becomes ``numbers[p]``
        and its flags keep only ``keep``. A table built ahead of its shard's
        gain (``ShardContents.tables``) is made the owner's this way, with
        no copy of its columns: the copy, and the first touch of the memory
        it fills, were done where the table was built."""
        if not self.ids:
            return
        flags = np.frombuffer(self.flags, dtype=np.uint8)
        np.bitwise_and(flags, keep, out=flags)
        if bool(np.array_equal(numbers, np.arange(len(numbers), dtype=np.int32))):
            return  # the owner numbers the profiles as the table does
        prof = np.frombuffer(self.prof, dtype=np.int32)
        # In slices: a lookup of the whole column would need a column-sized
        # temporary, fresh memory to fault in.
        for at in range(0, len(prof), _RENUMBER_SLICE):
            part = prof[at : at + _RENUMBER_SLICE]
            part[:] = numbers[part]

    def nbytes(self) -> int:
        return sum(
            a.itemsize * a.buffer_info()[1]
            for a in (self.ids, self.nxt, self.due, self.param, self.prof, self.flags)
        )

    # -- one job --------------------------------------------------------------------

    def locate(self, job_id: int) -> int:
        """The row of ``job_id`` (a tombstone too), or -1."""
        ids = self.ids
        i = bisect_left(ids, job_id)
        if i < len(ids) and ids[i] == job_id:
            return i
        return -1

    def find(self, job_id: int) -> int:
        """The row of ``job_id`` if it is held, or -1."""
        i = self.locate(job_id)
        if i >= 0 and self.flags[i] & GONE:
            return -1
        return i

    def put(self, job_id: int, nxt: int, due: int, param: int, prof: int, flags: int) -> int:
        """Write a job's row (a new job, or one held already); returns its row."""
        if due < self.low:
            self.low = due
        ids = self.ids
        n = len(ids)
        if n == 0 or ids[n - 1] < job_id:
            i = n
        else:
            i = bisect_left(ids, job_id)
            if i < n and ids[i] == job_id:
                if self.flags[i] & GONE:
                    self.gone -= 1
                self.nxt[i] = nxt
                self.due[i] = due
                self.param[i] = param
                self.prof[i] = prof
                self.flags[i] = flags
                return i
        if i == n:
            ids.append(job_id)
            self.nxt.append(nxt)
            self.due.append(due)
            self.param.append(param)
            self.prof.append(prof)
            self.flags.append(flags)
        else:
            ids.insert(i, job_id)
            self.nxt.insert(i, nxt)
            self.due.insert(i, due)
            self.param.insert(i, param)
            self.prof.insert(i, prof)
            self.flags.insert(i, flags)
        return i

    def remove_at(self, i: int) -> None:
        """Make row ``i`` a tombstone (compacted away later)."""
        if not self.flags[i] & GONE:
            self.flags[i] = GONE
            self.due[i] = NEVER
            self.gone += 1
            if self.gone > 1024 and self.gone * 2 > len(self.ids):
                self.compact()

    def compact(self) -> None:
        """Drop the tombstones."""
        if self.gone:
            c = self.columns()
            self._load(c.take((c.flags & GONE) == 0))

    # -- whole columns ----------------------------------------------------------------

    def columns(self) -> Columns:
        """Copies of the columns (tombstones included)."""
        return Columns(
            np.array(self.ids, dtype=np.int64),
            np.array(self.nxt, dtype=np.int64),
            np.array(self.due, dtype=np.int64),
            np.array(self.param, dtype=np.int64),
            np.array(self.prof, dtype=np.int32),
            np.array(self.flags, dtype=np.uint8),
        )

    def extend(self, rows: Columns) -> None:
        """Write many rows at once (sorted by id, unique). Rows of jobs held
        already are replaced; new ones are appended when their ids are all
        past the last one held (the common case: ids grow), merged else."""
        if not len(rows):
            return
        ids = self.ids
        if not ids or ids[-1] < int(rows.ids[0]):
            self.ids.frombytes(rows.ids.tobytes())
            self.nxt.frombytes(rows.nxt.tobytes())
            self.due.frombytes(rows.due.tobytes())
            self.param.frombytes(rows.param.tobytes())
            self.prof.frombytes(rows.prof.astype(np.int32).tobytes())
            self.flags.frombytes(rows.flags.astype(np.uint8).tobytes())
            self.gone += int(np.count_nonzero(rows.flags & GONE))
            return
        self._load(merged(self.columns(), rows))

    def arm(self, lo: int, hi: int) -> tuple[list[int], list[int], int]:
        """(ids, deadlines) of the jobs at rest due in ``[lo, hi)``, and the
        earliest ``due`` at or after ``hi`` (``NEVER``: none)."""
        if self.low >= hi:
            return [], [], self.low
        n = len(self.ids)
        if n <= _SMALL:
            ids: list[int] = []
            deadlines: list[int] = []
            first = NEVER
            for i, d in enumerate(self.due):
                if d >= hi:
                    if d < first:
                        first = d
                elif d >= lo:
                    ids.append(self.ids[i])
                    deadlines.append(d)
        else:
            due = np.frombuffer(self.due, dtype=np.int64)
            index = np.flatnonzero((due >= lo) & (due < hi))
            first = int(np.min(due, initial=NEVER, where=due >= hi))
            if len(index):
                ids = _ints(np.frombuffer(self.ids, dtype=np.int64)[index])
                deadlines = _ints(due[index])
            else:
                ids, deadlines = [], []
        self.low = first
        return ids, deadlines, first

    def due_from(self, lo: int) -> int:
        """How many jobs at rest come due at or after ``lo``."""
        if self.low == NEVER or not self.ids:
            return 0
        due = np.frombuffer(self.due, dtype=np.int64)
        return int(np.count_nonzero((due >= lo) & (due != NEVER)))

    def ids_due_by(self, bound: int) -> list[int]:
        """Ids of the rows whose next fire as the store has it (``nxt``) is
        at or before ``bound``."""
        if not self.ids:
            return []
        nxt = np.frombuffer(self.nxt, dtype=np.int64)
        ids = np.frombuffer(self.ids, dtype=np.int64)
        return _ints(ids[nxt <= bound])

    def armed_before(self, hi: int) -> list[int]:
        """Ids of the jobs at rest due before ``hi`` (whose FIRE timers an
        owner keeps in its wheel)."""
        if not self.ids:
            return []
        due = np.frombuffer(self.due, dtype=np.int64)
        ids = np.frombuffer(self.ids, dtype=np.int64)
        return _ints(ids[due < hi])

    def live_ids(self) -> list[int]:
        ids = np.frombuffer(self.ids, dtype=np.int64) if self.ids else np.empty(0, np.int64)
        if not self.gone:
            return _ints(ids)
        flags = np.frombuffer(self.flags, dtype=np.uint8)
        return _ints(ids[(flags & GONE) == 0])

    def ids_of_profiles(self, profiles: Sequence[int]) -> list[int]:
        """The jobs (awake or at rest, not gone) of any of these profiles."""
        if not self.ids or not profiles:
            return []
        prof = np.frombuffer(self.prof, dtype=np.int32)
        flags = np.frombuffer(self.flags, dtype=np.uint8)
        ids = np.frombuffer(self.ids, dtype=np.int64)
        return _ints(
            ids[np.isin(prof, np.asarray(profiles, dtype=np.int32)) & ((flags & GONE) == 0)]
        )

    def awake_ids(self) -> list[int]:
        if not self.ids:
            return []
        flags = np.frombuffer(self.flags, dtype=np.uint8)
        ids = np.frombuffer(self.ids, dtype=np.int64)
        return _ints(ids[(flags & (AWAKE | GONE)) == AWAKE])


_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)


def shards_of(ids: Int64s) -> npt.NDArray[np.intp]:
    """``wheel.engine.model.shard_of`` of every id (the product's top byte:
    numpy's uint64 product wraps as Python's ``& (2**64 - 1)`` would)."""
    with np.errstate(over="ignore"):
        product = ids.astype(np.uint64) * _FIBONACCI
    return (product >> np.uint64(56)).astype(np.intp)


def group_by_shard(rows: Columns) -> dict[int, Columns]:
    """Rows of many shards (any order; of rows with the same id the last
    wins; tombstones dropped), as each shard's columns sorted by id."""
    if not len(rows):
        return {}
    shard = shards_of(rows.ids)
    order = np.lexsort((rows.ids, shard))  # stable: equal ids keep their order
    ids = rows.ids[order]
    last = np.ones(len(order), dtype=np.bool_)
    last[:-1] = ids[1:] != ids[:-1]
    keep = order[last & ((rows.flags[order] & GONE) == 0)]
    kept = rows.take(keep)
    ks = shard[keep]
    bounds = np.flatnonzero(np.diff(ks)) + 1
    out: dict[int, Columns] = {}
    start = 0
    for end in [*bounds.tolist(), len(keep)]:
        if end > start:
            out[int(ks[start])] = kept.take(np.arange(start, end))
        start = end
    return out


def merged(base: Columns, rows: Columns) -> Columns:
    """``base`` with ``rows`` written over it (both of one shard; of rows with
    the same id the last wins), tombstones dropped."""
    both = Columns(
        np.concatenate([base.ids, rows.ids]),
        np.concatenate([base.nxt, rows.nxt]),
        np.concatenate([base.due, rows.due]),
        np.concatenate([base.param, rows.param]),
        np.concatenate([base.prof, rows.prof.astype(np.int32)]),
        np.concatenate([base.flags, rows.flags.astype(np.uint8)]),
    ).sorted()
    return both.take((both.flags & GONE) == 0)


def _ints(values: Int64s) -> list[int]:
    out: list[int] = values.tolist()
    return out


def rows_of(
    ids: Sequence[int],
    nxt: Sequence[int],
    due: Sequence[int],
    param: Sequence[int],
    prof: Sequence[int],
    flags: Sequence[int],
) -> Columns:
    """Columns of rows given as sequences (sorted and made unique by id)."""
    return Columns(
        np.asarray(ids, dtype=np.int64),
        np.asarray(nxt, dtype=np.int64),
        np.asarray(due, dtype=np.int64),
        np.asarray(param, dtype=np.int64),
        np.asarray(prof, dtype=np.int32),
        np.asarray(flags, dtype=np.uint8),
    ).sorted()
