"""The epoch check of ``Store.write_batch``, written once for every store.

A store reads the epochs of the writer's shards in the write's own
transaction (each store its own way, locked against ``fence_shards``) and
hands the shards it found newer here, as ``stale``. What is left is the same
everywhere: which writes of a batch are about a refused shard, and what the
batch answers for them.

A shard is refused when its stored epoch is newer than the writer's, or when
the writer does not hold it at all (missing from ``WriteBatch.epochs``).
Nothing to work out in the common case: nothing stale, and a writer that
holds every shard (one node) cannot write about a shard it lacks. Otherwise
each write's shard is worked out: from its job id for claims, advances and
missed fires, through the store's ``job_ids`` for completions and starts,
which carry only a run id.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TypeVar

from wheel.engine.model import SHARD_COUNT, shard_of
from wheel.engine.records import (
    BatchOutcome,
    ClaimOutcome,
    Completion,
    CompletionOutcome,
    FireClaim,
    WriteBatch,
)

T = TypeVar("T")
R = TypeVar("R")

ALL_SHARDS = frozenset(range(SHARD_COUNT))


def holds_every_shard(epochs: Mapping[int, int]) -> bool:
    return epochs.keys() >= ALL_SHARDS


def stale_shards(epochs: Mapping[int, int], stored: Iterable[Sequence[int]]) -> set[int]:
    """The shards of ``epochs`` whose stored epoch (rows of shard, epoch) is
    newer than the writer's."""
    return {s for s, e in stored if s in epochs and e > epochs[s]}


def least_epoch(epochs: Mapping[int, int]) -> int:
    """Below any stored epoch that can be newer than one of ``epochs``: a
    store need only read the rows above it."""
    return min(epochs.values(), default=0)


def kept(shards: Sequence[int | None], epochs: Mapping[int, int], refused: set[int]) -> list[int]:
    """Indexes of the writes to make, given each one's shard (None: unknown,
    a run the store does not have, which writes nothing either way): those
    of a shard neither refused nor missing from ``epochs``. A missing shard
    joins ``refused``."""
    out = []
    for i, shard in enumerate(shards):
        if shard is None:
            out.append(i)
        elif shard in refused:
            continue
        elif shard not in epochs:
            refused.add(shard)
        else:
            out.append(i)
    return out


def job_shards(job_ids: Iterable[int]) -> list[int | None]:
    return [shard_of(j) for j in job_ids]


def run_shards(run_ids: Sequence[int], job_ids: Mapping[int, int]) -> list[int | None]:
    """Each run's shard through ``job_ids`` (run -> job; None: no such run)."""
    return [shard_of(job_ids[r]) if r in job_ids else None for r in run_ids]


def spread(
    items: Sequence[T], keep: Sequence[int], written: Sequence[R], refused: Callable[[T], R]
) -> list[R]:
    """Answers for all of ``items``: ``written`` for the ``keep`` indexes, in
    order, and ``refused(item)`` for the others."""
    out = [refused(item) for item in items]
    for i, answer in zip(keep, written, strict=True):
        out[i] = answer
    return out


def unwon(claim: FireClaim) -> ClaimOutcome:
    return ClaimOutcome(claim=claim, run_id=None, advanced=False)


def unapplied(completion: Completion) -> CompletionOutcome:
    return CompletionOutcome(run_id=completion.run_id, applied=False)


def write_checked(
    batch: WriteBatch,
    stale: Collection[int],
    job_ids: Callable[[Sequence[int]], Mapping[int, int]],
    write: Callable[[WriteBatch], BatchOutcome],
) -> BatchOutcome:
    """``write`` the part of ``batch`` whose shards are not refused, and
    answer for all of it: for a store that writes a batch in one transaction
    and found ``stale`` in it. ``job_ids`` maps runs to their jobs (runs it
    does not know left out)."""
    epochs = batch.epochs
    assert epochs is not None
    if not stale and holds_every_shard(epochs):
        return write(batch)
    refused = set(stale)
    claims = kept(job_shards(c.job_id for c in batch.claims), epochs, refused)
    advances = kept(job_shards(a.job_id for a in batch.advances), epochs, refused)
    missed = kept(job_shards(m.job_id for m in batch.missed), epochs, refused)
    run_ids = [c.run_id for c in batch.completions] + [s.run_id for s in batch.starts]
    runs = run_shards(run_ids, job_ids(run_ids) if run_ids else {})
    n = len(batch.completions)
    completions = kept(runs[:n], epochs, refused)
    starts = kept(runs[n:], epochs, refused)
    written = write(
        WriteBatch(
            completions=[batch.completions[i] for i in completions],
            missed=[batch.missed[i] for i in missed],
            advances=[batch.advances[i] for i in advances],
            claims=[batch.claims[i] for i in claims],
            starts=[batch.starts[i] for i in starts],
            epochs=epochs,
        )
    )
    return BatchOutcome(
        completions=spread(batch.completions, completions, written.completions, unapplied),
        claims=spread(batch.claims, claims, written.claims, unwon),
        fenced=frozenset(refused),
    )
