"""Claims waiting for a permit of their concurrency key: a part of the owner.

The store answers a keyed claim it could not grant a permit ``waiting``
(``wheel.store._limits``) and writes nothing for it. For the owner such a
claim is still on its way: its job keeps counting it in flight and moving
nothing in the store's schedule (``_Job.advancing``), exactly as while a
claim is in a store batch, so a fire that waits is never claimed twice,
never lost, and never recorded missed for waiting. It is kept here with the
worker credit it had reserved given back, and sent again:

- when a run of the key ends on this owner (``hand_off``, as the owner
  learns of the end): in the store batch that writes its end (on SQLite in
  the same transaction, after it, so the permit it gives back is there to
  take), and again once the store has answered that end (``kick``). The
  hand-off does not wait for the loop's tick (``handing_off``): the permit
  is idle from the run's end until the batch that takes it again, and
- when the store says a permit of the key came back elsewhere (``freed``:
  on PostgreSQL a release at the limit notifies every node at its commit,
  ``wheel.node._permits``), at once too, and
- every ``limit_poll_ms`` while anything waits: runs of the key on other
  nodes end without telling this one (or their notice was lost). All the
  keys' claims go out in the same store batch: one store round per poll for
  every waiting key.

Invariants (tests in tests/engine/test_keywaits.py):

1. A claim parked here is in no other part's keeping (not in ``Claims``):
   it is sent again at most once per poll or kick, and taken out once.
2. Per key, claims go out again in the order of their jobs' effective
   priority, then of their fires (the oldest first), so the best-ranked
   waiting fire gets the next permit this owner asks for. A claim's
   effective priority is its job's, one level better for every
   ``aging_ms`` it has waited (``wheel.engine.priority``'s rule, the same
   as a route's queue): a priority-9 fire ranks with priority 0 after nine
   periods, so none waits past them for its rank. All of one priority: by
   fire alone, as before priorities.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

from wheel.engine.owner._claims import _Pending
from wheel.engine.records import FireClaim

Key = tuple[str, str]  # (tenant, concurrency key)


@dataclass(slots=True, order=True)
class Parked:
    """A claim waiting for a permit, ordered by its fire (``take`` ranks by
    priority first)."""

    scheduled_for: int
    since_ms: int
    claim: FireClaim = field(compare=False)
    pend: _Pending = field(compare=False)
    priority: int = field(default=5, compare=False)


class KeyWaits:
    """The waiting claims by key, and when they go out again."""

    __slots__ = ("_by_key", "_handing", "_kicked", "_next_poll", "aging_ms", "poll_ms")

    def __init__(self, poll_ms: int, aging_ms: int = 10_000) -> None:
        self.poll_ms = max(1, poll_ms)
        # A waiting claim ranks one priority level better per this long (0: never).
        self.aging_ms = aging_ms
        self._by_key: dict[Key, list[Parked]] = {}
        self._kicked: set[Key] = set()
        # Of those, the keys whose permit is being handed off (``handing_off``).
        self._handing: set[Key] = set()
        self._next_poll = 0

    def __len__(self) -> int:
        return sum(len(q) for q in self._by_key.values())

    def __bool__(self) -> bool:
        return bool(self._by_key)

    def park(
        self,
        claim: FireClaim,
        pend: _Pending,
        now_ms: int,
        since_ms: int | None,
        priority: int = 5,
    ) -> None:
        """The store answered ``claim`` waiting (invariant 1); ``since_ms``:
        when it first waited (None: now); ``priority``: its job's."""
        key = (claim.tenant, claim.concurrency_key)
        if key not in self._by_key and not self._by_key:
            self._next_poll = now_ms + self.poll_ms
        bisect.insort(
            self._by_key.setdefault(key, []),
            Parked(
                claim.scheduled_for,
                now_ms if since_ms is None else since_ms,
                claim,
                pend,
                priority,
            ),
        )

    def kick(self, tenant: str, key: str) -> None:
        """A run of the key ended here: its waiting claims go out at once,
        and those parked before the next ``take`` too (a claim of the key
        may be answered waiting in the very batch that ended the run)."""
        self._kicked.add((tenant, key))

    def hand_off(self, tenant: str, key: str) -> None:
        """A run of the key is ending here (its end is on its way to the
        store): a ``kick`` that should not wait for the loop's tick."""
        self._kicked.add((tenant, key))
        self._handing.add((tenant, key))

    def freed(self, tenant: str, key: str) -> bool:
        """A permit of the key came back in the store (another node's run
        ended): its claims waiting here go out at once, like a ``kick``;
        whether any wait (a key nobody waits for here is not kicked)."""
        k = (tenant, key)
        if k not in self._by_key:
            return False
        self._kicked.add(k)
        self._handing.add(k)
        return True

    def handing_off(self) -> bool:
        """A permit of a key with claims waiting here is on its way back (a
        run ending here: ``hand_off``) or back (elsewhere: ``freed``): those
        claims should go out at once. A ``kick`` once the store answered an
        end here is no hand-off: the permit went to the claims that rode
        with the end, and those still waiting go at the next round."""
        return bool(self._handing) and any(k in self._by_key for k in self._handing)

    def due(self, now_ms: int) -> bool:
        if not self._by_key:
            return False
        return now_ms >= self._next_poll or any(k in self._by_key for k in self._kicked)

    def next_wake(self) -> int | None:
        """When the waiting claims go out again (None: nothing waits)."""
        if not self._by_key:
            return None
        return 0 if any(k in self._by_key for k in self._kicked) else self._next_poll

    def take(self, now_ms: int) -> list[Parked]:
        """The claims to send again now (the kicked keys', or every key's at
        a poll), each key's oldest fire first (invariant 2); the next poll is
        ``poll_ms`` on. Those that cannot go out now are ``park``ed again."""
        if now_ms >= self._next_poll:
            keys = list(self._by_key)
            self._next_poll = now_ms + self.poll_ms
        else:
            keys = [k for k in self._kicked if k in self._by_key]
        self._kicked.clear()
        self._handing.clear()
        out: list[Parked] = []
        for k in keys:
            q = self._by_key.pop(k)
            first = q[0].priority
            if any(p.priority != first for p in q):
                q.sort(key=lambda p: (self._rank(p, now_ms), p.scheduled_for))
            out.extend(q)
        return out

    def _rank(self, p: Parked, now_ms: int) -> int:
        """``p``'s effective priority now (invariant 2)."""
        if self.aging_ms <= 0:
            return p.priority
        return max(0, p.priority - (now_ms - p.since_ms) // self.aging_ms)

    def drop(self, gone: Callable[[int], bool]) -> list[Parked]:
        """Take out the claims of the jobs ``gone`` names (a hand-over)."""
        dropped: list[Parked] = []
        for k, q in list(self._by_key.items()):
            keep = [p for p in q if not gone(p.claim.job_id)]
            dropped.extend(p for p in q if gone(p.claim.job_id))
            if keep:
                self._by_key[k] = keep
            else:
                del self._by_key[k]
                self._kicked.discard(k)
                self._handing.discard(k)
        return dropped

    def waiting(self) -> dict[Key, int]:
        """Claims waiting now, by key."""
        return {k: len(q) for k, q in self._by_key.items()}

    def oldest(self) -> dict[Key, int]:
        """When each key's longest-waiting claim first waited."""
        return {k: min(p.since_ms for p in q) for k, q in self._by_key.items()}
