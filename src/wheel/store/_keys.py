"""Idempotency keys of a batch of submits, written once for both SQL stores.

A submit with a key creates its job once: the same (tenant, key) and the
same body again answers the job the first one created (``created=False``),
another body answers ``AlreadyExists`` in that submit's place. Within one
batch the first submit of a key is the one that may create; the later ones
answer as repeats of it.

The stores differ only in how a key is taken. SQLite, whose writer holds the
file's write lock, reads the keys held already and creates a job for every
key that is not (``to_create``). PostgreSQL takes the keys with one
``INSERT ... ON CONFLICT DO NOTHING`` (a concurrent submit of the same key
waits for it) and reads the rest afterwards. Both then hand what they found
here (``hold``) and get the answers from ``answers``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from wheel.errors import StoreError, WheelError
from wheel.store._shared import (
    Executor,
    Queries,
    batch_keys,
    created_record,
    job_from_row,
    key_conflict,
)
from wheel.store.base import JobRecord, NewJob, Submitted

__all__ = ["KeyedSubmits"]

Key = tuple[str, str]  # (tenant, idempotency key)


class KeyedSubmits:
    """A batch of submits as its idempotency keys see it."""

    __slots__ = ("digests", "first", "held", "news")

    def __init__(self, news: Sequence[NewJob]) -> None:
        self.news = news
        # Each submit's body digest ("" without a key), and each key's first
        # submit in the batch.
        self.digests, self.first = batch_keys(news)
        # Keys the store holds already: key -> (body digest, job id).
        self.held: dict[Key, tuple[str, int]] = {}

    def keys(self) -> list[Key]:
        """The batch's keys, each once, in the order of their first use."""
        return list(self.first)

    def keyless(self) -> list[int]:
        """Indexes of the submits without a key."""
        return [i for i, n in enumerate(self.news) if n.idempotency_key is None]

    def hold(self, rows: Iterable[Sequence[Any]]) -> None:
        """Record keys the store holds, as rows of (tenant, key, digest, job id)."""
        for tenant, key, digest, job_id in rows:
            self.held[(tenant, key)] = (digest, int(job_id))

    def to_create(self) -> list[int]:
        """Indexes of the submits that create a job once ``held`` has every
        key the store holds: those without a key, and each key's first use
        when the key is not held."""
        first = self.first
        return [
            i
            for i, n in enumerate(self.news)
            if n.idempotency_key is None
            or ((key := (n.spec.tenant, n.idempotency_key)) not in self.held and first[key] == i)
        ]

    def not_created(self, ids: Mapping[int, int]) -> set[Key]:
        """The keys of the submits that created nothing (``ids``: index ->
        new job id): held by an earlier request, or used earlier in the batch."""
        return {
            (n.spec.tenant, n.idempotency_key)
            for i, n in enumerate(self.news)
            if n.idempotency_key is not None and i not in ids
        }

    def answers(
        self, cur: Executor, q: Queries, ids: Mapping[int, int], change: int
    ) -> list[Submitted | WheelError]:
        """Each submit's answer, in order, given the jobs created (``ids``,
        stamped with ``change``): a created job, the job its key's first use
        created (the held ones read in ``cur``), or a key conflict."""
        existing: dict[int, JobRecord] = {}
        if self.held:
            job_ids = [job_id for _, job_id in self.held.values()]
            for row in cur.execute(q.jobs_by_id, (q.dialect.ints(job_ids),)).fetchall():
                record = job_from_row(row)
                existing[record.job_id] = record
        out: list[Submitted | WheelError] = []
        created: dict[int, JobRecord] = {}
        same: JobRecord | None
        for i, n in enumerate(self.news):
            if i in ids:
                created[i] = record = created_record(ids[i], n, change)
                out.append(Submitted(record, True))
                continue
            assert n.idempotency_key is not None
            key = (n.spec.tenant, n.idempotency_key)
            if key in self.held:
                digest, job_id = self.held[key]
                same = existing.get(job_id)
            elif (first := self.first[key]) in created:  # used earlier in this batch
                digest, same = self.digests[first], created[first]
            else:  # pragma: no cover - a key row is written with its job
                raise StoreError(f"idempotency key {n.idempotency_key!r} vanished during submit")
            if digest != self.digests[i]:
                out.append(key_conflict(n))
            elif same is None:  # pragma: no cover - a key row keeps its job
                raise StoreError(f"job of idempotency key {n.idempotency_key!r} is gone")
            else:
                out.append(Submitted(same, False))
        return out
