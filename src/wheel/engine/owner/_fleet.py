"""The workers connected to an owner: what each serves, its credit, and the
runs it holds.

A part of the owner. It keeps one ``_Worker`` per open lease stream and
answers the dispatcher's questions about them (is any worker free, does one
with credit serve a route, which one may take a run a worker handed back,
is the fleet too busy for re-dispatches). What a worker's message means for
its runs is the owner's business (``_workers``).

Invariants (tests in tests/engine/test_fleet.py):

1. A worker's ``free`` credit is its capacity less the runs it holds and
   the claims reserved for it, and nothing while it drains or is silent.
2. A hello again (a reconnect) keeps the runs the worker holds and its
   reservations, under a new incarnation: refusals of an earlier one do not
   count.
"""

from __future__ import annotations

from collections.abc import Collection

from wheel.engine.model import HTTP_HANDLER
from wheel.engine.owner._values import Route


class _Worker:
    __slots__ = (
        "capacity",
        "draining",
        "handlers",
        "held",
        "incarnation",
        "pools",
        "reserved",
        "silent",
        "worker_id",
    )

    def __init__(
        self,
        worker_id: str,
        capacity: int,
        pools: frozenset[str],
        handlers: frozenset[str],
        incarnation: int,
    ) -> None:
        self.worker_id = worker_id
        self.capacity = capacity
        self.pools = pools
        # Handler names it runs; empty: any.
        self.handlers = handlers
        # Which hello this is: refusals of an earlier one do not count.
        self.incarnation = incarnation
        self.held: set[int] = set()
        self.reserved = 0
        self.draining = False
        # Let a lease it held expire (stopped, partitioned, not acking): no new
        # work until it sends something again.
        self.silent = False

    @property
    def free(self) -> int:
        if self.draining or self.silent:
            return 0
        return self.capacity - len(self.held) - self.reserved

    def serves(self, route: Route) -> bool:
        return route[0] in self.pools and _takes(self.handlers, route[1])


class Fleet:
    """The connected workers, by worker id (read like a mapping)."""

    __slots__ = ("_incarnations", "_workers")

    def __init__(self) -> None:
        self._workers: dict[str, _Worker] = {}
        self._incarnations = 0

    # -- reading --------------------------------------------------------------------

    def get(self, worker_id: str) -> _Worker | None:
        return self._workers.get(worker_id)

    def __getitem__(self, worker_id: str) -> _Worker:
        return self._workers[worker_id]

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self._workers

    def __len__(self) -> int:
        return len(self._workers)

    def __bool__(self) -> bool:
        return bool(self._workers)

    def values(self) -> Collection[_Worker]:
        """The workers (a live view: not to be kept across a hello or a
        disconnect)."""
        return self._workers.values()

    def items(self) -> list[tuple[str, _Worker]]:
        return list(self._workers.items())

    # -- in and out -----------------------------------------------------------------

    def hello(
        self,
        worker_id: str,
        capacity: int,
        pools: frozenset[str],
        handlers: frozenset[str],
    ) -> _Worker:
        """A worker's stream opened (invariant 2)."""
        old = self._workers.get(worker_id)
        self._incarnations += 1
        w = _Worker(worker_id, capacity, pools, handlers, self._incarnations)
        if old is not None:
            w.held = old.held
            w.reserved = old.reserved
        self._workers[worker_id] = w
        return w

    def gone(self, worker_id: str) -> _Worker | None:
        """A worker's stream closed: it leaves (None: it was not here)."""
        return self._workers.pop(worker_id, None)

    # -- questions of the dispatcher ------------------------------------------------

    def any_free(self) -> bool:
        return any(w.free > 0 for w in self._workers.values())

    def serves_with_credit(self, route: Route) -> bool:
        """Some worker with credit serves ``route``."""
        return any(w.free > 0 and w.serves(route) for w in self._workers.values())

    def serving(self, route: Route) -> list[_Worker]:
        """The workers with credit that serve ``route``, in hello order."""
        pool, handler = route
        return [
            w
            for w in self._workers.values()
            if pool in w.pools and _takes(w.handlers, handler) and w.free > 0
        ]

    def server_for(
        self, route: Route, refused: dict[int, int] | None, now_ms: int
    ) -> _Worker | None:
        """A worker with credit that serves ``route`` and did not hand the run
        back (``refused``: incarnation -> until when) or whose refusal ran out."""
        for w in self._workers.values():
            if (
                w.free > 0
                and w.serves(route)
                and (not refused or refused.get(w.incarnation, 0) <= now_ms)
            ):
                return w
        return None

    def busy(self, threshold: float) -> bool:
        """Above ``threshold`` of its capacity held (or no capacity at all)."""
        capacity = sum(w.capacity for w in self._workers.values())
        held = sum(len(w.held) for w in self._workers.values())
        return capacity == 0 or held / capacity > threshold


def _takes(handlers: frozenset[str], handler: str) -> bool:
    """Whether a worker of ``handlers`` (empty: any) takes ``handler``'s
    runs: an HTTP target's only where named, since a worker that takes any
    handler runs Python code and cannot call an endpoint."""
    if handlers:
        return handler in handlers
    return handler != HTTP_HANDLER
