"""Restart of a shard owner: from the local checkpoint when it is usable, from
the store otherwise, and reconciled with the store either way (it wins).

1. Checkpoint: the snapshot's rows with the log's written over them give
   every job as a packed row (``wheel.engine.jobtable``) and the store
   watermark they reflect; the owner takes them on column by column, with no
   object and no spec parsed per job. Then every job the store changed since
   that watermark is applied on top (jobs submitted, cancelled or advanced by
   others, or by this node after its last logged batch).
2. Store: ``load_shards(packed=True)`` -- every active and paused job; those
   the row alone arms (paused, or with a next fire) come as columns and are
   taken on the same way; only the rest are parsed and compiled.
3. Either way, in-flight executions come from the store (with their fences),
   and so do retries that were pending: the latest failed/lost attempt of a
   fire with no newer one.

A checkpoint that is corrupt, of another cluster or shard set, or of an
unknown format is discarded with an error in the log, never served; so is
one ahead of the store, whose change mark is below the one the checkpoint
logged (``OwnerState.check_mark``): the store lost commits the checkpoint's
rows reflect, and a restore from them would skip fires the store still owes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from wheel.checkpoint.owner_state import OwnerState, recover_state, restored_rows
from wheel.checkpoint.wal import Checkpoint
from wheel.engine.jobtable import NEVER, PAUSED, PAYLOAD, Columns, ShardJobs, group_by_shard
from wheel.engine.model import JobState, shard_of
from wheel.engine.owner import Actions, Owner, OwnerConfig, ShardContents
from wheel.engine.profiles import Profile, template_of_body
from wheel.engine.records import ExecutionRecord, JobRecord, RowChanges, ShardLoad
from wheel.errors import CheckpointError, NotFound, StoreError
from wheel.store.base import Store

log = logging.getLogger("wheel.recovery")

CHANGES_PAGE = 10_000
# A staged row due by now and this much later is read again at its gain: an
# owner may have moved it (clocks of nodes differ by a little).
MOVED_MARGIN_MS = 10_000


@dataclass(slots=True)
class Restored:
    owner: Owner
    watermark: int
    source: str  # "checkpoint" or "store"
    # Job records replayed from the checkpoint's log (0: rebuilt from the store).
    log_records: int
    seconds: float
    # Actions produced while reconciling (missed fires of paused jobs, ...).
    actions: Actions


def restore_owner(
    store: Store,
    checkpoint: Checkpoint | None,
    *,
    epochs: dict[int, int],
    config: OwnerConfig,
    now_ms: int,
) -> Restored:
    """A new owner of the shards in ``epochs``, from the checkpoint when it is
    usable, else from the store; reconciled with the store either way."""
    started = time.perf_counter()
    shards = sorted(epochs)
    owner = Owner(now_ms=now_ms, config=config)
    acts = Actions()
    state = None
    if checkpoint is not None:
        try:
            recovery = checkpoint.recover()
            for warning in recovery.warnings:
                log.warning("checkpoint: %s", warning)
            if recovery.snapshot is not None or recovery.records:
                state = recover_state(recovery, store.change_mark())
        except CheckpointError as exc:
            log.error("checkpoint unusable, rebuilding from the store: %s", exc)
            checkpoint.reset()
    if state is not None:
        contents, watermark = checkpoint_contents(store, state, shards, state.watermark, now_ms)
        source = "checkpoint"
        log_records = state.log_records
    else:
        contents, watermark = load_shard_contents(store, shards)
        source = "store"
        log_records = 0
    owner.add_shards(epochs, contents, now_ms, acts)
    return Restored(
        owner=owner,
        watermark=watermark,
        source=source,
        log_records=log_records,
        seconds=time.perf_counter() - started,
        actions=acts,
    )


@dataclass(slots=True)
class Staged:
    """Shards' jobs loaded ahead of their gain, as of ``watermark``: a node
    about to be given shards by a planned move loads them while their owner
    still serves them, into the tables its owner will keep; at the switch it
    reads only what changed since (``staged_contents``), and the owner takes
    the tables as they are. Staged at ten million jobs, the copy into the
    owner's tables (and the first touch of the memory it filled) was most of
    the time the switch held the node's loop."""

    shards: frozenset[int]
    # Shard -> its rows, built into a table (``prof`` numbering ``profiles``);
    # each is given to an owner once (``staged_contents`` takes it out).
    tables: dict[int, ShardJobs]
    profiles: list[Profile]
    # Jobs the rows alone do not arm, whole.
    jobs: list[JobRecord]
    watermark: int
    # Loaded from this node's checkpoint (whose log then covers the shards).
    from_checkpoint: bool
    # ``time.monotonic()`` of the load.
    at: float = 0.0
    # The shards whose contents were given out (each once: an owner keeps
    # and changes the tables it is given).
    given: set[int] = field(default_factory=set)


def stage_from_store(store: Store, shards: Sequence[int]) -> Staged:
    """Shards' jobs from the store, in one bulk read per batch of shards."""
    load = store.load_shards(shards, packed=True)
    packed, profiles = packed_of_load(load)
    return Staged(
        frozenset(shards),
        tables_of(packed),
        profiles,
        list(load.jobs),
        load.watermark,
        False,
        time.monotonic(),
    )


def stage_from_checkpoint(state: OwnerState, shards: Sequence[int], watermark: int) -> Staged:
    """Shards' jobs from a checkpoint's rows, current up to ``watermark``
    (``OwnerState.as_of``)."""
    rows = restored_rows(state, shards)
    return Staged(
        frozenset(shards),
        tables_of(rows.packed),
        rows.profiles,
        [],
        watermark,
        True,
        time.monotonic(),
    )


def tables_of(packed: Mapping[int, Columns]) -> dict[int, ShardJobs]:
    """Each shard's rows copied into the table an owner keeps
    (``ShardContents.tables``)."""
    return {shard: ShardJobs(rows) for shard, rows in packed.items()}


def staged_contents(
    store: Store, staged: Staged, shards: Sequence[int], now_ms: int
) -> tuple[ShardContents, int]:
    """What an owner takes on with ``shards`` (a part of ``staged.shards``)
    at ``now_ms``: the staged rows with every change the store made after
    the staging's watermark written over them (the store wins), their runs
    in flight and pending retries read now, and the change-feed watermark
    the result reflects.

    The changes come in two reads, neither a scan of the jobs table: those
    made through the API, from the change feed's index; and those an owner
    made (claims moving a schedule, a one-shot ending, a completion-driven
    next fire), which only ever touch a job whose fire came due or that had
    a run: every staged row due by now (and ``MOVED_MARGIN_MS``), every job
    the rows cannot say, and every job with a run in flight or a retry owed
    is read again, as it is now."""
    wanted = set(shards)
    again = sorted(wanted & staged.given)
    if again:
        raise ValueError(f"staged shards given out already: {again[:10]}")
    staged.given |= wanted
    changes: list[RowChanges] = []
    watermark = staged.watermark
    while True:
        page = store.changed_rows(watermark, shards, CHANGES_PAGE, owner_moves=False)
        changes.append(page)
        done = len(page.rows) + len(page.jobs) < CHANGES_PAGE or page.watermark == watermark
        watermark = page.watermark
        if done:
            break
    tables = {s: t for s in shards if (t := staged.tables.pop(s, None)) is not None}
    inflight = store.inflight_runs(shards)
    retries = store.retry_candidates(shards)
    bound = now_ms + MOVED_MARGIN_MS
    moved: set[int] = {r.job_id for r in staged.jobs if shard_of(r.job_id) in wanted}
    for table in tables.values():
        moved.update(table.ids_due_by(bound))
    moved.update(e.job_id for e in (*inflight, *retries))
    ordered = sorted(moved)
    for at in range(0, len(ordered), CHANGES_PAGE):
        changes.append(store.job_rows(ordered[at : at + CHANGES_PAGE]))
    changed = {r.job_id for page in changes for r in page.rows}
    changed.update(r.job_id for page in changes for r in page.jobs)
    contents = shard_contents(
        store,
        shards,
        tables=tables,
        profiles=staged.profiles,
        # A job the changes carry is taken from them, not from the staging.
        jobs=[r for r in staged.jobs if shard_of(r.job_id) in wanted and r.job_id not in changed],
        rows=changes,
        inflight=inflight,
        retries=retries,
    )
    return contents, watermark


def checkpoint_contents(
    store: Store, state: OwnerState, shards: Sequence[int], watermark: int, now_ms: int
) -> tuple[ShardContents, int]:
    """Shards' contents from a checkpoint's rows, with every change the store
    made after ``watermark`` written over them (the store wins), and the
    change-feed watermark they reflect then: a restart, or a node in a cluster
    gaining shards it held before (``OwnerState.as_of``)."""
    staged = stage_from_checkpoint(state, shards, watermark)
    return staged_contents(store, staged, shards, now_ms)


def load_shard_contents(
    store: Store, shards: Sequence[int], due_by: int | None = None
) -> tuple[ShardContents, int]:
    """Shards' contents from the store alone (a rebuild, or a node gaining
    shards in a cluster), and the change-feed watermark they reflect.
    ``due_by``: only the jobs due by then, the runs in flight and the
    retries: the first part of a gain due first (``load_later`` the rest)."""
    load = store.load_shards(shards, packed=True, due_by=due_by)
    packed, profiles = packed_of_load(load)
    contents = shard_contents(
        store,
        shards,
        tables=tables_of(packed),
        profiles=profiles,
        jobs=load.jobs,
        inflight=load.inflight,
    )
    return contents, load.watermark


def load_later(
    store: Store, shards: Sequence[int], later_than: int
) -> tuple[dict[int, Columns], list[Profile]]:
    """The rest of a gain due first: the rows of the shards' jobs paused or
    due after ``later_than``, with their profiles."""
    return packed_of_load(store.load_shards(shards, packed=True, later_than=later_than))


def packed_of_load(load: ShardLoad) -> tuple[dict[int, Columns], list[Profile]]:
    """A load's packed rows as each shard's columns, and the profiles their
    ``prof`` numbers."""
    rows = load.packed
    if rows is None or not len(rows):
        return {}, []
    pids, numbers = np.unique(rows.profile_id, return_inverse=True)
    profiles = []
    for pid in pids.tolist():
        body = load.profiles.get(pid)
        if body is None:
            raise StoreError(f"jobs name profile {pid}, which the store does not have")
        profiles.append(Profile(profile_id=pid, body=body, template=template_of_body(body)))
    flags = np.where(rows.paused, PAUSED, 0) | np.where(rows.has_payload, PAYLOAD, 0)
    # Armed at the nominal time: a jitter (never earlier) applies when the
    # timer wakes the job.
    due = np.where(rows.paused, NEVER, rows.next_run_at)
    columns = Columns(
        rows.job_id,
        rows.next_run_at,
        due.astype(np.int64),
        rows.param,
        numbers.astype(np.int32),
        flags.astype(np.uint8),
    )
    return group_by_shard(columns), profiles


def shard_contents(
    store: Store,
    shards: Sequence[int],
    *,
    tables: Mapping[int, ShardJobs],
    profiles: Sequence[Profile],
    jobs: Sequence[JobRecord] = (),
    rows: Sequence[RowChanges] = (),
    inflight: Sequence[ExecutionRecord],
    retries: Sequence[ExecutionRecord] | None = None,
) -> ShardContents:
    """What an owner takes on with ``shards``: the jobs it arms (as tables,
    built off the owner's loop by the load, ``tables_of``; and as rows or
    records over them), their runs in flight
    and pending retries from the store (``retries``: read already), and the
    jobs those runs and retries belong to that the rest leaves out (whole:
    finished ones to end their runs, scheduled ones to arm)."""
    if retries is None:
        retries = store.retry_candidates(shards)
    inflight = _take_unsent(store, inflight)
    latest = {r.job_id: r for r in jobs}
    for page in rows:
        latest.update((r.job_id, r) for r in page.jobs)
    # Jobs over (completed, cancelled) by the rows: their runs still need
    # them whole, from the store.
    ended = {r.job_id for page in rows for r in page.rows if r.state not in _SCHEDULED}
    over = {i: r for i, r in latest.items() if r.state not in _SCHEDULED}
    finished: list[JobRecord] = []
    # Jobs of those runs that the load left out (a gain due first loads a
    # job due later behind) and that are still scheduled: taken on whole,
    # as live jobs, or their schedules would be taken for over.
    live: list[JobRecord] = []
    for job_id in sorted({e.job_id for e in (*inflight, *retries)}):
        if job_id in over:
            finished.append(over[job_id])
            continue
        if job_id not in ended and (job_id in latest or _holds(tables, job_id)):
            continue
        try:
            record = store.get_job(job_id)
        except NotFound:
            log.warning("run of unknown job %s ignored", job_id)
            continue
        (live if record.state in _SCHEDULED else finished).append(record)
    return ShardContents(
        tables=tables,
        profiles=profiles,
        rows=rows,
        jobs=[*jobs, *live],
        finished=finished,
        inflight=inflight,
        retries=retries,
    )


def _take_unsent(store: Store, inflight: Sequence[ExecutionRecord]) -> list[ExecutionRecord]:
    """The runs in flight, those marked unsent taken (``Store.take_unsent``):
    a mark another owner took first is dropped here, so the run is adopted
    under a grace lease rather than sent a second time."""
    marked = [e.run_id for e in inflight if e.worker_id == ""]
    if not marked:
        return list(inflight)
    taken = store.take_unsent(marked)
    return [
        replace(e, worker_id=None) if e.worker_id == "" and e.run_id not in taken else e
        for e in inflight
    ]


def _holds(tables: Mapping[int, ShardJobs], job_id: int) -> bool:
    table = tables.get(shard_of(job_id))
    return table is not None and table.locate(job_id) >= 0


_SCHEDULED = (JobState.ACTIVE, JobState.PAUSED)
