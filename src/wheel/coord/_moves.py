"""Planned moves of ``wheel.coord.etcd.EtcdCoordinator`` (see that module's
docstring for the protocol and its invariants): the shard assignment every
member computes alike, a leaving node's hand-off, a joining node's
preparation, and the hooks that load or hand over shards on the node's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from wheel.coord.base import SHARD_COUNT, ShardHook
from wheel.errors import CoordinationError

_log = logging.getLogger("wheel.coord.etcd")


def _weight(node_id: str, shard: int) -> int:
    digest = hashlib.blake2b(f"{shard}/{node_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_owner(shard: int, members: Iterable[str]) -> str | None:
    """The member with the highest weight for ``shard`` (ties by node id)."""
    return max(members, key=lambda m: (_weight(m, shard), m), default=None)


def assign_shards(members: Iterable[str]) -> dict[int, str]:
    """Shard -> assigned member for all shards; empty without members."""
    ids = sorted(set(members))
    if not ids:
        return {}
    return {s: rendezvous_owner(s, ids) or "" for s in range(SHARD_COUNT)}


class PlannedMoves:
    """The planned-move half of ``EtcdCoordinator``."""

    node_id: str
    _lease_id: int | None
    _threads: list[threading.Thread]
    _owned: dict[int, int]
    _stopping: threading.Event
    _handoff_timeout: float
    _members_prefix: str
    _leaving_prefix: str
    _ready_prefix: str
    _preparer: ShardHook | None
    _releaser: ShardHook | None
    _preparing: bool
    _prepared_for: dict[str, int]
    _loop: asyncio.AbstractEventLoop | None

    if TYPE_CHECKING:

        def _etcd(self) -> Any: ...

        def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...

    async def hand_off(self) -> None:
        """Say this node is leaving and wait until every other member has
        loaded the shards it will take (its ready key), at most
        ``handoff_timeout_s``; this node serves its shards meanwhile."""
        lease_id = self._lease_id
        if not self._threads or lease_id is None or not self._owned:
            return
        started = time.monotonic()
        key = self._leaving_prefix + self.node_id
        try:
            await asyncio.to_thread(
                self._call, self._etcd().put, key, str(lease_id), lease=lease_id
            )
        except CoordinationError as exc:
            _log.warning("could not announce leaving (shards move unprepared): %s", exc)
            return
        waiting: set[str] | None = None
        while time.monotonic() - started < self._handoff_timeout and not self._stopping.is_set():
            try:
                waiting = await asyncio.to_thread(self._not_ready)
            except CoordinationError as exc:
                _log.debug("hand-off: %s", exc)
            if waiting == set():
                _log.info("hand-off prepared in %.2fs", time.monotonic() - started)
                return
            await asyncio.sleep(0.05)
        _log.warning(
            "hand-off: %s did not load their shards within %.0fs; leaving anyway",
            sorted(waiting or ()),
            self._handoff_timeout,
        )

    def _not_ready(self) -> set[str]:
        """The members still loading this leaving node's shards."""
        client = self._etcd()
        others = {
            meta.key.decode()[len(self._members_prefix) :]
            for _, meta in self._call(client.get_prefix, self._members_prefix)
        }
        others -= set(self._leavers(client))
        others.discard(self.node_id)
        ready_prefix = f"{self._ready_prefix}{self.node_id}/"
        ready = {
            meta.key.decode()[len(ready_prefix) :]
            for _, meta in self._call(client.get_prefix, ready_prefix)
        }
        return others - ready

    def _leavers(self, client: Any) -> dict[str, int]:
        """Members leaving -> their leases."""
        out: dict[str, int] = {}
        for value, meta in self._call(client.get_prefix, self._leaving_prefix):
            try:
                out[meta.key.decode()[len(self._leaving_prefix) :]] = int(value)
            except ValueError:
                continue
        return out

    def set_preparer(self, prepare: ShardHook) -> None:
        self._preparer = prepare

    def set_releaser(self, release: ShardHook) -> None:
        self._releaser = release

    def _prepare_join(self, client: Any) -> None:
        """Before this node becomes a member: have the shards the assignment
        will then give it loaded, while their holders still serve them."""
        if self._preparer is None:
            return
        members = {
            meta.key.decode()[len(self._members_prefix) :]
            for _, meta in self._call(client.get_prefix, self._members_prefix)
        }
        members.discard(self.node_id)
        if not members:
            return  # nobody holds anything to move
        members -= set(self._leavers(client))
        members.add(self.node_id)
        mine = {s for s, o in assign_shards(members).items() if o == self.node_id}
        self._preparing = True
        try:
            self._prepare(mine)
        finally:
            self._preparing = False

    def _prepare(self, shards: set[int]) -> None:
        """Run the preparer on the loop and wait for it (the control thread
        holds nothing meanwhile); its failure only makes the move slower."""
        self._run_hook(self._preparer, shards, None)

    def _run_hook(self, hook: ShardHook | None, shards: set[int], wait_s: float | None) -> None:
        """Run ``hook(shards)`` on the loop and wait for it, at most
        ``wait_s`` (None: until the node stops). Its failure or lateness
        only makes a move slower: it is logged and the move goes on."""
        loop = self._loop
        if hook is None or loop is None or not shards:
            return
        future = asyncio.run_coroutine_threadsafe(hook(frozenset(shards)), loop)
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while not self._stopping.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                _log.warning("a hand-over step on %d shards took over %.1fs", len(shards), wait_s)
                break
            try:
                future.result(timeout=0.05)
                return
            except concurrent.futures.TimeoutError:
                continue
            except Exception:
                _log.exception("a hand-over step on %d shards failed", len(shards))
                return
        future.cancel()

    def _prepare_for_leavers(self, members: Mapping[str, str], leavers: Mapping[str, int]) -> None:
        """Load the shards leaving members will hand this node, then say so
        on each leaver's lease (its ready key), off the control thread."""
        loop = self._loop
        leaving = {n: lease for n, lease in leavers.items() if n in members}
        self._prepared_for = {n: v for n, v in self._prepared_for.items() if n in leaving}
        if loop is None or self.node_id in leaving:
            return
        fresh = {n: lease for n, lease in leaving.items() if self._prepared_for.get(n) != lease}
        if not fresh:
            return
        self._prepared_for.update(fresh)
        future = assign_shards(set(members) - set(leaving))
        shards = frozenset(
            s for s, o in future.items() if o == self.node_id and s not in self._owned
        )
        asyncio.run_coroutine_threadsafe(self._ready_for(fresh, shards), loop)

    async def _ready_for(self, leavers: Mapping[str, int], shards: frozenset[int]) -> None:
        if self._preparer is not None and shards:
            try:
                await self._preparer(shards)
            except Exception:
                _log.exception("preparing %d shards failed; they load when gained", len(shards))
        for leaver, lease in leavers.items():
            key = f"{self._ready_prefix}{leaver}/{self.node_id}"
            try:
                await asyncio.to_thread(self._call, self._etcd().put, key, "", lease=lease)
            except CoordinationError as exc:
                # Said at the next reconcile, if the leaver is still there.
                self._prepared_for.pop(leaver, None)
                _log.info("ready for %s not said (it may be gone): %s", leaver, exc)
