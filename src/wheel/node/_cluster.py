"""A node's shards in a cluster: the coordinator's gains and losses turned into
the owner's.

Order matters, and is the point of this module:

- **Losing** a shard (a rebalance, the lease lost, its local deadline passed)
  hands it over at once, on the event loop, before any later batch is formed:
  its timers are dropped and its runs forgotten, none marked lost. A batch
  already on its way to the store may still carry the shard's writes; the
  store refuses them once the new owner has fenced the shard.
- **Gaining** a shard fences it in the store first (its epoch raised to the
  coordinator's: from that commit on, the store refuses the previous owner's
  claims, completions and schedule moves), then loads it, then adds it to the
  owner. The load comes after the fence, so it holds everything the previous
  owner wrote; the node's change feed is rewound to the load's watermark so
  the API changes made through other nodes since then are read too.
- A gain is re-checked against the coordinator after every await: a shard
  lost (or re-acquired with a newer epoch) meanwhile is not added with a
  stale epoch. Each change's gain goes its own way, beside the others (of
  other shards; a gain of a shard lost and gained again meanwhile finds it
  is not ours under its epoch any more), and so does the rest of one loaded
  due first (below): a planned move's switch never waits for another load.
- **Prepared** (a planned move: this node joining, another leaving): the
  coordinator asks for the shards before they move, and they are loaded
  while their owner still serves them (``prepare``). Their gain then fences
  them and reads only what the store changed since that load, their runs in
  flight and their pending retries: a switch that costs the same at any job
  count. A staging the gain does not come for within ``STAGED_TTL_S`` is
  dropped; a shard gained without one is loaded whole, as above.
- **Due first** (a shard gained with neither a staging nor a checkpoint: a
  crash, a lapsed lease): after the fence, the jobs due within
  ``arm_ahead_ms + DUE_FIRST_SLACK_MS`` are loaded, with the runs in flight
  and the retries, and the shard is added and dispatches; the rest (paused,
  or due later) is loaded behind and added where the owner has no row of
  the job yet (what it has is newer: that load and the change feed since).
  Until then a snapshot leaves the shard out, so a restart in between loads
  it from the store rather than half of it from the checkpoint. The first
  dispatch after a crash then comes a lease TTL and one small load after it,
  whatever the job count.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from wheel._retry import Backoff
from wheel.checkpoint.owner_state import OwnerState
from wheel.coord.base import Coordinator, OwnershipChange
from wheel.engine.jobtable import Columns
from wheel.engine.owner import ShardContents
from wheel.engine.profiles import Profile
from wheel.errors import StoreError
from wheel.node._values import Clock, NodeConfig, trim_heap
from wheel.recovery import (
    Staged,
    checkpoint_contents,
    load_later,
    load_shard_contents,
    stage_from_checkpoint,
    stage_from_store,
    staged_contents,
)
from wheel.store.base import Store

log = logging.getLogger("wheel.node")

# Store trouble while gaining shards: retried with this backoff while they are
# still ours.
GAIN_RETRY_S = (0.05, 2.0)
GAIN_BACKOFF = Backoff(initial=GAIN_RETRY_S[0], max=GAIN_RETRY_S[1])
# Shards of a gain's rest added to the owner between two turns of the loop.
REST_SHARDS_AT_ONCE = 8
# A staging older than this is not used: its changes since would be a load
# of their own.
STAGED_TTL_S = 120.0
# A gain due first loads first the jobs due before the arming window ends,
# and this much after: the rest's load has that long before its earliest
# job could need arming.
DUE_FIRST_SLACK_MS = 60_000


T = TypeVar("T")


class ShardHost(Protocol):
    """What shard ownership needs of the node it runs in (``wheel.node.Node``)."""

    @property
    def store(self) -> Store: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def config(self) -> NodeConfig: ...
    @property
    def stopping(self) -> bool: ...

    def in_thread(self, fn: Callable[..., T], /, *args: object) -> Awaitable[T]: ...
    def held_shards(self) -> Collection[int]: ...
    def checkpointed(self, shards: Collection[int]) -> dict[int, int]: ...
    def recovered(self) -> OwnerState | None: ...
    def release_recovered(self) -> None: ...
    def hand_over(self, shards: Collection[int]) -> None: ...
    async def hand_over_planned(self, shards: Collection[int]) -> None: ...
    def take_on(
        self,
        epochs: Mapping[int, int],
        contents: ShardContents,
        watermark: int,
        *,
        from_checkpoint: bool = False,
        how: str = "",
    ) -> None: ...
    def loading_rest(self, shards: Collection[int]) -> None: ...
    def add_rest(
        self, shards: Collection[int], packed: Mapping[int, Columns], profiles: Sequence[Profile]
    ) -> int: ...
    def rest_loaded(self, shards: Collection[int]) -> None: ...


class ShardOwnership:
    """Applies a coordinator's ownership changes to a node's owner."""

    def __init__(self, node: ShardHost, coordinator: Coordinator) -> None:
        self.node = node
        self.coordinator = coordinator
        # Gained and not yet added: shard -> epoch, newest wins.
        self._gaining: dict[int, int] = {}
        # Gains on their way, each of the shards of one ownership change.
        self._gains: set[asyncio.Task[None]] = set()
        # The rests of gains loaded due first, each loading on its own.
        self._rest_loads: set[asyncio.Task[None]] = set()
        self._on_gained: list[Callable[[Mapping[int, int]], None]] = []
        # Shard -> its staging, loaded for a planned move.
        self._staged: dict[int, Staged] = {}
        coordinator.subscribe(self._changed)
        coordinator.set_preparer(self.prepare)
        coordinator.set_releaser(self.release)

    def on_gained(self, callback: Callable[[Mapping[int, int]], None]) -> None:
        """Call ``callback(epochs)`` once shards are added to the owner."""
        self._on_gained.append(callback)

    def gaining(self) -> Mapping[int, int]:
        return dict(self._gaining)

    async def prepare(self, shards: frozenset[int]) -> None:
        """Load ``shards``, which a planned move is about to give this node,
        while their owner still serves them: those this node's checkpoint
        holds from there, the others from the store. Their gain then reads
        only what changed since."""
        node = self.node
        self._drop_old_stagings()
        held = node.held_shards()
        wanted = sorted(s for s in shards if s not in held and s not in self._staged)
        if not wanted or node.stopping:
            return
        started = time.perf_counter()
        as_of = node.checkpointed(wanted)
        state = node.recovered()
        stagings: list[Staged] = []
        if as_of and state is not None:
            stagings.append(
                await node.in_thread(
                    functools.partial(
                        stage_from_checkpoint, state, sorted(as_of), min(as_of.values())
                    )
                )
            )
        rest = [s for s in wanted if s not in as_of]
        if rest:
            stagings.append(
                await node.in_thread(functools.partial(stage_from_store, node.store, rest))
            )
        # A shard gained while it loaded has its own load already.
        held = node.held_shards()
        for staged in stagings:
            self._staged.update((s, staged) for s in staged.shards if s not in held)
        log.info(
            "prepared %d shards for a planned move in %.2fs (%d from the checkpoint)",
            len(wanted),
            time.perf_counter() - started,
            len(as_of),
        )

    def _drop_old_stagings(self) -> None:
        """Stagings older than ``STAGED_TTL_S``: their gain did not come."""
        now = time.monotonic()
        for shard, staged in list(self._staged.items()):
            if now - staged.at > STAGED_TTL_S:
                del self._staged[shard]

    async def release(self, shards: frozenset[int]) -> None:
        """A planned move of ``shards`` to another member: hand them over
        with their unsent runs before the coordinator releases them."""
        for shard in shards:
            self._gaining.pop(shard, None)
            self._staged.pop(shard, None)
        await self.node.hand_over_planned(shards)

    def _changed(self, change: OwnershipChange) -> None:
        """On the event loop, in the order the coordinator decided them."""
        if change.lost:
            for shard in change.lost:
                self._gaining.pop(shard, None)
            self.node.hand_over(change.lost)
        if change.gained:
            self._gain_again(change.gained)

    def _gain_again(self, epochs: Mapping[int, int]) -> None:
        """Gain ``epochs`` in a task of their own: beside the gains on their
        way (of other shards: one of the same shards under an older epoch
        finds it is not ours any more), so that a gain never waits for
        another's load."""
        self._gaining.update(epochs)
        task = asyncio.create_task(self._gain_part(dict(epochs)), name="wheel-gain-shards")
        self._gains.add(task)
        task.add_done_callback(self._gain_done)

    def _gain_done(self, task: asyncio.Task[None]) -> None:
        self._gains.discard(task)
        if not self._gains:
            # The first gains are done: shards given later load from the store.
            self.node.release_recovered()

    def _rest_done(self, epochs: Mapping[int, int], task: asyncio.Task[None]) -> None:
        """A rest's load ended: one that failed past its retries (a fault
        of this node, not the store's) leaves its shards gained again whole,
        as a failed gain is (the fence again is a no-op; the load replaces
        what the owner holds of them)."""
        self._rest_loads.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        log.error("adding the rest of %d shards failed", len(epochs), exc_info=task.exception())
        again = self._still_ours(epochs)
        if again and not self.node.stopping:
            self._gain_again(again)

    def _still_ours(self, epochs: Mapping[int, int]) -> dict[int, int]:
        owned = self.coordinator.owned()
        return {s: e for s, e in epochs.items() if owned.get(s) == e}

    async def _gain_part(self, epochs: Mapping[int, int]) -> None:
        """Gain the shards of ``epochs`` still ours under them, retried
        until they are in or are ours no more."""
        delays = GAIN_BACKOFF.delays()
        try:
            while not self.node.stopping:
                mine = {
                    s: e for s, e in self._still_ours(epochs).items() if self._gaining.get(s) == e
                }
                if not mine:
                    return  # lost or moved on meanwhile
                try:
                    await self._gain(mine)
                    return
                except StoreError as exc:
                    backoff = delays.wait()
                    log.warning(
                        "gaining %d shards failed (%s); retrying in %.2fs", len(mine), exc, backoff
                    )
                    await asyncio.sleep(backoff)
                except Exception:
                    log.exception("gaining %d shards failed; retrying", len(mine))
                    await asyncio.sleep(GAIN_RETRY_S[1])
        finally:
            for shard, epoch in epochs.items():
                if self._gaining.get(shard) == epoch:
                    del self._gaining[shard]

    async def _gain(self, epochs: Mapping[int, int]) -> None:
        node = self.node
        store = node.store
        started = time.perf_counter()
        fenced = await node.in_thread(
            functools.partial(store.fence_shards, epochs, node.config.node_id)
        )
        fenced_s = time.perf_counter() - started
        ahead = {s for s, e in epochs.items() if fenced.get(s, e) > e}
        if ahead:
            # A newer owner fenced them first: this hold is already stale.
            log.warning("shards %s were fenced by a newer owner; not served", sorted(ahead))
        epochs = {s: e for s, e in self._still_ours(epochs).items() if s not in ahead}
        if not epochs:
            return
        for part in self._loads(epochs):
            loading = time.perf_counter()
            contents, watermark = await node.in_thread(part.load)
            mine = {s: e for s, e in self._still_ours(epochs).items() if s in part.shards}
            if not mine:
                continue
            node.take_on(mine, contents, watermark, from_checkpoint=part.covered, how=part.how)
            log.info(
                "gained %d shards in %.3fs: fenced in %.3fs, loaded in %.3fs",
                len(mine),
                time.perf_counter() - started,
                fenced_s,
                time.perf_counter() - loading,
            )
            for callback in list(self._on_gained):
                callback(mine)
            if part.rest_after is not None:
                # Behind, in a task of its own: a gain that comes meanwhile
                # (a planned move's switch, above all) does not wait for it.
                rest = asyncio.create_task(
                    self._load_rest(mine, part.rest_after), name="wheel-load-rest"
                )
                self._rest_loads.add(rest)
                rest.add_done_callback(functools.partial(self._rest_done, mine))

    async def _load_rest(self, epochs: Mapping[int, int], after: int) -> None:
        """The rest of shards taken on due first: the jobs due after
        ``after`` (or paused), added to those still held under the same
        epoch (a shard lost and gained again meanwhile has a load of its
        own, newer than this one). A failed read is tried again, alone: the
        shards go on dispatching what they hold, and stay out of snapshots
        until their rest is in (a snapshot of a part would lose the rest)."""
        node = self.node
        shards = sorted(epochs)
        node.loading_rest(shards)
        started = time.perf_counter()
        delays = GAIN_BACKOFF.delays()
        load = functools.partial(load_later, node.store, shards, after)
        while True:
            if not self._still_ours(epochs) or node.stopping:
                return  # handed over meanwhile, which ends their partial state
            try:
                packed, profiles = await node.in_thread(load)
                break
            except Exception as exc:
                backoff = delays.wait()
                log.warning(
                    "loading the rest of %d shards failed (%s); retrying in %.2fs",
                    len(shards),
                    exc,
                    backoff,
                )
                await asyncio.sleep(backoff)
        # A few shards at a time, so that the loop dispatches in between; a
        # shard lost meanwhile (or lost and gained again under a new epoch,
        # with a load of its own) gets nothing more of this one.
        added = 0
        order = sorted(packed)
        for at in range(0, len(order), REST_SHARDS_AT_ONCE):
            part = {s: packed[s] for s in order[at : at + REST_SHARDS_AT_ONCE]}
            added += node.add_rest(self._still_ours(epochs), part, profiles)
            await asyncio.sleep(0)
        mine = self._still_ours(epochs)
        node.rest_loaded(mine)
        packed.clear()  # the owner's tables hold copies: give the heap back
        await asyncio.to_thread(trim_heap)
        log.info(
            "loaded the rest of %d shards: %d jobs in %.2fs",
            len(mine),
            added,
            time.perf_counter() - started,
        )

    def _loads(self, epochs: Mapping[int, int]) -> list[_Part]:
        """How to load each part of a gain: shards staged for a planned move
        from their staging and the changes since; those this node held
        before its restart from its checkpoint and the changes since; the
        others from the store."""
        node, store = self.node, self.node.store
        now = node.clock.now_ms()
        self._drop_old_stagings()
        parts: list[_Part] = []
        stagings: dict[int, tuple[Staged, list[int]]] = {}
        for shard in sorted(epochs):
            staged = self._staged.pop(shard, None)
            if staged is not None:
                stagings.setdefault(id(staged), (staged, []))[1].append(shard)
        for staged, shards in stagings.values():
            load = functools.partial(staged_contents, store, staged, shards, now)
            how = ("its checkpoint" if staged.from_checkpoint else "the store") + ", staged ahead"
            parts.append(_Part(shards, load, staged.from_checkpoint, how))
        done = {s for part in parts for s in part.shards}
        left = [s for s in sorted(epochs) if s not in done]
        as_of = node.checkpointed(left)
        state = node.recovered()
        if as_of and state is not None:
            shards = sorted(as_of)
            watermark = min(as_of.values())
            load = functools.partial(checkpoint_contents, store, state, shards, watermark, now)
            parts.append(_Part(shards, load, True, "its checkpoint"))
        rest = [s for s in left if s not in as_of or state is None]
        if rest:
            bound = node.clock.now_ms() + node.config.owner.arm_ahead_ms + DUE_FIRST_SLACK_MS
            load = functools.partial(load_shard_contents, store, rest, bound)
            parts.append(_Part(rest, load, False, "the store, due first", rest_after=bound))
        return parts


@dataclass(frozen=True, slots=True)
class _Part:
    """A part of a gain: its shards, how they load (their contents and the
    change-feed watermark those reflect), whether the checkpoint's log covers
    them then, and where they come from (for the log)."""

    shards: list[int]
    load: Callable[[], tuple[ShardContents, int]]
    covered: bool
    how: str
    # Due first: the jobs due after this are loaded behind (``_load_rest``).
    rest_after: int | None = None
