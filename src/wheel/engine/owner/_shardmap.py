"""The shards an owner holds: each one's epoch, fence counter and table of
jobs (``wheel.engine.jobtable``).

A part of the owner. It answers which shards are held and under which
epochs, whose table a job's row is in, and issues the fences of new runs;
what gaining or losing a shard means for jobs, runs and queues is the
owner's business (``_shards``).

Invariants (tests in tests/engine/test_shardmap.py):

1. Fences strictly increase per shard: ``(epoch << 32) | counter``, the
   counter one up per fence and never above ``COUNTER_MASK``.
2. A fence of the shard's epoch adopted from the store (a run restored)
   moves the counter up to it, never down: no fence is issued twice.
3. ``epochs()`` is the same mapping until the shards held change, and is
   never changed in place (a batch, a status and a hand-over share it).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from wheel.engine.jobtable import ShardJobs
from wheel.engine.model import shard_of
from wheel.engine.owner._values import COUNTER_BITS, COUNTER_MASK


class _Shard:
    """A shard this owner holds: its epoch and fence counter, and its jobs as
    packed rows (awake ones marked), so that the shard is taken on and handed
    over as a whole (``Owner.add_shards``, ``remove_shards``) without an
    object per job. Its runs are few (bounded by the fleet's capacity): a
    hand-over finds them by their job's shard."""

    __slots__ = ("counter", "epoch", "shard", "table")

    def __init__(self, shard: int, epoch: int, table: ShardJobs | None = None) -> None:
        self.shard = shard
        self.epoch = epoch
        self.counter = 0
        self.table = table if table is not None else ShardJobs()


class ShardMap:
    """The shards held, by shard number."""

    __slots__ = ("_epochs", "_shards")

    def __init__(self, epochs: Mapping[int, int] | None = None) -> None:
        self._shards: dict[int, _Shard] = {s: _Shard(s, e) for s, e in (epochs or {}).items()}
        # ``epochs()`` as last built; a change to the shards held drops it.
        self._epochs: dict[int, int] | None = None

    def __contains__(self, shard: object) -> bool:
        return shard in self._shards

    def __len__(self) -> int:
        return len(self._shards)

    def __bool__(self) -> bool:
        return bool(self._shards)

    def __getitem__(self, shard: int) -> _Shard:
        return self._shards[shard]

    def get(self, shard: int) -> _Shard | None:
        return self._shards.get(shard)

    def values(self) -> list[_Shard]:
        return list(self._shards.values())

    def owns(self, job_id: int) -> bool:
        return shard_of(job_id) in self._shards

    def table_of(self, job_id: int) -> ShardJobs | None:
        """The table the job's row is in (None: its shard is not held)."""
        held = self._shards.get(shard_of(job_id))
        return None if held is None else held.table

    def epochs(self) -> Mapping[int, int]:
        """Shard -> the epoch it is held under (invariant 3)."""
        epochs = self._epochs
        if epochs is None:
            epochs = self._epochs = {s: state.epoch for s, state in self._shards.items()}
        return epochs

    def next_fence(self, shard: int) -> int:
        """A new run's fence in ``shard`` (invariant 1)."""
        state = self._shards[shard]
        counter = state.counter + 1
        if counter > COUNTER_MASK:
            raise OverflowError(f"fence counter of shard {shard} exhausted; bump the epoch")
        state.counter = counter
        return (state.epoch << COUNTER_BITS) | counter

    def adopt_fence(self, shard: int, fence: int) -> None:
        """A fence the store has for a run of ``shard`` (invariant 2)."""
        state = self._shards[shard]
        if fence >> COUNTER_BITS == state.epoch:
            state.counter = max(state.counter, fence & COUNTER_MASK)

    def add(self, shard: int, epoch: int) -> _Shard:
        """A shard gained, with an empty table (it must not be held)."""
        gained = self._shards[shard] = _Shard(shard, epoch)
        self._epochs = None
        return gained

    def remove(self, shards: Collection[int]) -> list[_Shard]:
        """The shards of ``shards`` held, handed over: returned."""
        gone = [self._shards.pop(s) for s in shards if s in self._shards]
        self._epochs = None
        return gone
