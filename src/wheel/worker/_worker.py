"""The worker SDK: hold a lease stream to every node, run handlers, report outcomes.

Protocol (``worker_service.proto``): the worker says Hello (id, capacity,
pools, handler names), the node answers Welcome (lease and heartbeat timing,
and the cluster's membership) and then pushes Assignments while the worker has
credit there. The node keeps the count (its credit minus the runs the worker
holds there: a completion, a hand-back or a revoke frees the slot); the worker
sets the credit, sharing its capacity between its nodes (``_credit``).

Rules this module keeps:

1. Everything going out is batched per link: all the acks, completions and
   the due heartbeat gathered in one event-loop turn leave as one message
   each. One writer task per stream owns ``call.write``. An ack waits a
   short while (a tenth of the grace lease, at most ``ACK_DELAY_S``): a run
   that completes first is never acked, its completion says it ran. Short
   runs then cost the node one message and one store write fewer, and the
   grace lease still gets its ack long before it could lapse. Every ack,
   heartbeat entry and completion names the run's job, so any node can tell
   its shard.
2. A run the server revokes, or whose renewal it rejects, is superseded: its
   async handler is cancelled, a sync handler's result is discarded, and no
   completion is ever sent for it. Only that aborts a run: a shard that moved
   does not (rule 6).
3. At most ``capacity`` handlers execute at once, whatever the servers send;
   the excess waits locally. The credit given to the nodes keeps the runs
   held from all of them together within ``capacity`` too.
4. A lost stream does not stop handlers: their leases may still be valid.
   The link reconnects with backoff and jitter, says Hello again, reports the
   runs it still holds in a heartbeat and re-sends completions the server had
   not confirmed. The server decides what is still valid. Meanwhile another
   node gives back the permits of those runs whose handlers returned.
5. All run state is mutated on the event loop thread. Sync handlers run in a
   pool of at most ``capacity`` threads and hand their results back in
   batches (one loop wake-up per batch, not per run).
6. Each run reports (acks, heartbeats, its completion) to one link: the node
   that assigned it, until a node answers ``moved`` for it. Then the run, or
   its completion not yet confirmed, moves to the owner named (or, if none is
   named, the owner of its shard in the newest view), acked there if no node
   acked it yet, and named in a heartbeat sent at once. With no such owner
   connected it is a stray: retried after ``REHOME_RETRY_S``, doubling up to
   ``REHOME_RETRY_MAX_S``, each time asking a node for the membership. A run
   moved again within ``BOUNCE_WINDOW_S`` waits the same way first, so nodes
   that disagree during a handover cannot make the worker spin. A node that
   names itself is still loading the shard it just gained: the run (or its
   completion) goes back to it after the same wait, not elsewhere. Taking
   that for "owner unknown" kept a completion from the only node that could
   accept it until a newer view, while its lease lapsed there: the fire ran
   again although it had succeeded.
7. The links follow the newest membership view (by version): one link per
   member, by node id (a seed address becomes its node once welcomed; a link
   welcomed as a node another link already reaches closes). A member that
   left has its runs re-homed by the view's shard owners and its link closed.
   A link that is down has the runs whose shard the view gives to another
   node re-homed there; down past its lease, it asks for a fresh view. An
   unversioned view of a single node is nothing to follow: a worker of one
   node behaves as before clusters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from wheel._retry import Backoff, Jitter
from wheel.auth import call_metadata
from wheel.client._wire import DEFAULT_TARGET
from wheel.codec import PayloadCodec
from wheel.errors import InvalidArgument
from wheel.metrics import MetricsServer, parse_listen
from wheel.rpc.targets import targets_of
from wheel.rpc.v1 import cluster_pb2
from wheel.rpc.v1 import worker_service_pb2 as pb
from wheel.tls import ChannelSecurity
from wheel.worker import _tracing as spans
from wheel.worker._api import (
    Handler,
    Permanent,
    Retryable,
    RunContext,
    WorkerStats,
    install_log_filter,
    run_context,
)
from wheel.worker._cluster import (
    MEMBERSHIP_MIN_INTERVAL_S,
    REHOME_BACKOFF,
    Bounces,
    Stray,
    View,
    fetch_membership,
    view_of,
)
from wheel.worker._columns import handed_out, run_count
from wheel.worker._credit import Credits
from wheel.worker._http import HANDLER as HTTP_HANDLER
from wheel.worker._http import HttpExecutor
from wheel.worker._httpclient import DEFAULT_CONNECTIONS_PER_ORIGIN
from wheel.worker._link import DEFAULT_LEASE_S, Link, carry_returned
from wheel.worker._metrics import WorkerMetrics
from wheel.worker._runs import HTTP, SYNC, Done, Run, Runner, decoded, mode_of, sent_by_the_executor
from wheel.worker._signals import drain_on_signals

__all__ = [
    "Permanent",
    "Retryable",
    "RunContext",
    "Worker",
    "WorkerStats",
]

log = logging.getLogger("wheel.worker")

F = TypeVar("F", bound=Callable[..., Any])


class Worker:
    """Runs registered handlers for the runs wheel nodes assign to it.

    ``target`` is one node address or several (a list, or comma-separated):
    seeds. In a cluster the worker learns every member from them and holds a
    stream to each. None: ``$WHEEL_TARGET``, else ``127.0.0.1:50051``.

    Its links hand it what their nodes say through ``LinkHost`` (``on_*``,
    ``supersede``, ``refresh_membership``, ``closing``): calls for them, not
    for the code that runs a worker.
    """

    def __init__(
        self,
        target: str | Sequence[str] | None = None,
        *,
        worker_id: str | None = None,
        capacity: int = 16,
        pools: Sequence[str] = ("default",),
        reconnect_initial: float = 0.1,
        reconnect_max: float = 2.0,
        metrics_listen: str | None = None,
        security: ChannelSecurity | None = None,
        interceptors: Sequence[Any] = (),
        token: str | None = None,
        http: bool = False,
        allow_private_targets: bool = False,
        http_connections_per_origin: int = DEFAULT_CONNECTIONS_PER_ORIGIN,
        codec: PayloadCodec | None = None,
    ) -> None:
        """``http``: run the built-in handler ``http`` too, which sends the
        requests of jobs with an HTTP target (``wheel.worker._http``); with
        ``allow_private_targets`` it sends them to loopback, private and
        link-local addresses as well (refused otherwise); it keeps at most
        ``http_connections_per_origin`` connections open to one (scheme,
        host, port), the requests beyond waiting for one. ``metrics_listen``
        ("HOST:PORT", port 0 for any free one): serve the worker's Prometheus
        metrics at ``/metrics`` there while it runs
        (``metrics_port`` is the port bound). ``security``: TLS for the
        streams, as ``Client``'s (None: ``WHEEL_TLS_*`` from the environment);
        ``interceptors``: ``grpc.aio`` client interceptors on every channel.
        ``token`` (else $WHEEL_TOKEN): the bearer token of a node run with
        ``--auth``, a worker token bound to ``worker_id`` and ``pools``.
        ``codec`` (``wheel.codec``) decodes each payload for the handler (one
        it cannot decode fails the run as retryable, naming the key)."""
        self.call_metadata = call_metadata(token)
        self.codec = codec
        if capacity < 1:
            raise InvalidArgument("capacity", f"{capacity} is below 1")
        for field, wait in (
            ("reconnect_initial", reconnect_initial),
            ("reconnect_max", reconnect_max),
        ):
            if not wait > 0:  # NaN too
                raise InvalidArgument(field, f"{wait} s is not a positive wait")
        if http_connections_per_origin < 1:
            raise InvalidArgument(
                "http_connections_per_origin", f"{http_connections_per_origin} is below 1"
            )
        if target is None:
            target = os.environ.get("WHEEL_TARGET") or DEFAULT_TARGET
        seeds = targets_of(target)
        self.worker_id = worker_id or (
            f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        )
        self.capacity = capacity
        self.pools = tuple(pools)
        self.security = security if security is not None else ChannelSecurity.from_env()
        self.interceptors = tuple(interceptors)
        self.reconnect_initial = reconnect_initial
        self.reconnect_max = reconnect_max
        # Equal jitter: never a thundering herd of workers, never a zero wait.
        # At most 2 s between tries: a node restarted is back in a second or
        # three, and the waits, doubling while it was down, added up to their
        # cap again after it came back (at 10 s a worker returned 6.8 s after
        # its node, which meanwhile dispatched nothing). A try at a node that
        # is down costs it nothing; the jitter spreads a fleet's tries.
        self.reconnect = Backoff(initial=reconnect_initial, max=reconnect_max, jitter=Jitter.EQUAL)
        self.stats = WorkerStats()
        self._handlers: dict[str, tuple[Handler, int]] = {}
        self._http = (
            HttpExecutor(
                allow_private=allow_private_targets,
                connections_per_origin=http_connections_per_origin,
            )
            if http
            else None
        )
        if self._http is not None:
            # Its runs never call this: the runner hands them to the executor.
            self._handlers[HTTP_HANDLER] = (sent_by_the_executor, HTTP)
        self._runner = Runner(
            capacity, self.stats, self._report, worker_id=self.worker_id, http=self._http
        )
        self.metrics: WorkerMetrics | None = None
        self._metrics_listen = metrics_listen
        self._metrics_server: MetricsServer | None = None
        if metrics_listen is not None:
            parse_listen(metrics_listen)  # a bad address fails here, not in run()
            self.metrics = WorkerMetrics(self)
            self._runner.observe = self.metrics.observe
        self._links: list[Link] = []
        self.credits = Credits(capacity, self._links, self._strays_holding)
        self._links.extend(Link(self, self.credits, t) for t in seeds)
        self._link_tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._stopped: asyncio.Event | None = None
        self._closing = False
        self._draining = False
        self._started = False
        # Rules 6 and 7.
        self._view: View | None = None
        self._strays: dict[int, Stray] = {}
        self._stray_timer: asyncio.TimerHandle | None = None
        self._stray_at = math.inf
        self._bounces = Bounces()
        self._refresh: asyncio.Task[None] | None = None
        self._refreshed_at = -math.inf
        # Drains begun by a signal (``run``'s ``handle_signals``).
        self._signal_drains: list[asyncio.Task[None]] = []

    # -- registration -------------------------------------------------------------

    def handler(self, name: str | None = None) -> Callable[[F], F]:
        """Decorator registering an async or sync function taking a ``RunContext``."""

        def register(fn: F) -> F:
            self.register(name or fn.__name__, fn)
            return fn

        return register

    def register(self, name: str, fn: Callable[[RunContext], Any]) -> None:
        if not name:
            raise InvalidArgument("handler", "a handler name must not be empty")
        if name == HTTP_HANDLER:
            raise InvalidArgument(
                "handler",
                f"{name!r} is the built-in HTTP executor's name: give Worker(http=True)"
                " (wheelctl worker --http) instead",
            )
        if name in self._handlers:
            raise InvalidArgument("handler", f"{name!r} is already registered")
        self._handlers[name] = (fn, mode_of(fn))

    @property
    def closing(self) -> bool:
        """Whether it is stopping (its links reconnect no more)."""
        return self._closing

    @property
    def handler_names(self) -> list[str]:
        return sorted(self._handlers)

    @property
    def handlers(self) -> dict[str, Callable[[RunContext], Any]]:
        """The registered handlers by name (a copy; not the built-in ``http``)."""
        return {name: fn for name, (fn, mode) in self._handlers.items() if mode != HTTP}

    @property
    def connected(self) -> int:
        """How many node streams are up right now."""
        return sum(1 for link in self._links if link.connected)

    @property
    def executing(self) -> int:
        """Handlers executing now."""
        return self._runner.active

    @property
    def metrics_port(self) -> int:
        """The port ``/metrics`` is served on (0: not serving)."""
        return self._metrics_server.port if self._metrics_server is not None else 0

    @property
    def held(self) -> int:
        """Runs this worker holds (waiting or executing)."""
        strays = sum(1 for s in self._strays.values() if s.run is not None)
        return sum(len(link.held) for link in self._links) + strays

    # -- lifecycle ----------------------------------------------------------------

    async def run(self, *, handle_signals: bool = True, drain_timeout: float = 30.0) -> None:
        """Hold a stream to every node until ``stop`` or ``drain`` ends the worker.

        With ``handle_signals`` (the default), when it runs on the main
        thread's event loop, SIGTERM and SIGINT drain the worker (``drain``
        with ``drain_timeout``): no new runs, the running ones finish (those
        still going after ``drain_timeout`` seconds are abandoned) and are
        reported, then ``run`` returns. A second signal stops at once. The
        signals' earlier handlers are back when ``run`` returns. Pass
        ``handle_signals=False`` to handle them yourself.
        """
        if self._started:
            raise RuntimeError("a Worker runs once")
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._stopped = asyncio.Event()
        self._runner.start(self._loop)
        if self._closing:
            return
        install_log_filter()
        restore = (
            drain_on_signals(self, drain_timeout, self._signal_drains) if handle_signals else None
        )
        try:
            await self._serve()
        finally:
            if restore is not None:
                restore()
            await asyncio.gather(*self._signal_drains, return_exceptions=True)

    async def _serve(self) -> None:
        assert self._loop is not None and self._stopped is not None
        if self.metrics is not None and self._metrics_listen is not None:
            self._metrics_server = MetricsServer(self.metrics.registry)
            port = await self._metrics_server.start(self._metrics_listen)
            log.info("worker %s serves metrics on port %d", self.worker_id, port)
        for link in self._links:
            self._start_link(link)
        sharing = self._loop.create_task(self.credits.run())
        self._link_tasks.add(sharing)
        try:
            await self._stopped.wait()
        finally:
            self._closing = True
            if self._metrics_server is not None:
                await self._metrics_server.stop()
            if self._stray_timer is not None:
                self._stray_timer.cancel()
            tasks = [*self._link_tasks, *([self._refresh] if self._refresh else [])]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._abort_all()
            if self._http is not None:
                self._http.close()

    def stop(self) -> None:
        """Stop now: streams close, async handlers are cancelled, nothing more is sent.
        Safe to call from any thread."""
        loop = self._loop
        if loop is None or self._stopped is None:
            self._closing = True
        elif threading.get_ident() == self._loop_thread:
            self._closing = True
            self._stopped.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop has already closed
                loop.call_soon_threadsafe(self.stop)

    async def drain(self, timeout: float = 30.0) -> None:
        """Leave gracefully: ask every node for no more work, let in-flight runs
        finish, hand back what is still running at ``timeout``, then stop."""
        if self._loop is None or self._closing:
            self.stop()
            return
        self._draining = True
        for link in self._links:
            link.drain_requested = True
            link.wake.set()
        # Runs that never started go back at once: another worker can take them.
        self._runner.hand_back_waiting("worker is draining")
        give_up = time.monotonic() + timeout
        while self.held and time.monotonic() < give_up and not self._closing:
            await asyncio.sleep(0.01)
        for run in self._all_runs():
            self._runner.give_up(run)
        # Give the writers a moment to deliver the last outcomes and hear back.
        flush_until = time.monotonic() + 1.0
        while time.monotonic() < flush_until and not self._closing:
            if not any(link.connected and link.unsettled for link in self._links):
                break
            await asyncio.sleep(0.01)
        self.stop()

    def _all_runs(self) -> list[Run]:
        runs = [run for link in self._links for run in link.held.values()]
        runs += [s.run for s in self._strays.values() if s.run is not None]
        return runs

    async def _abort_all(self) -> None:
        runs = self._all_runs()
        for link in self._links:
            link.held.clear()
        self._strays.clear()
        await self._runner.stop(runs)

    def _start_link(self, link: Link) -> None:
        if self._loop is None:
            return  # run() starts every link it finds
        task = self._loop.create_task(link.run(), name=f"wheel-link-{link.target}")
        link.task = task
        self._link_tasks.add(task)
        task.add_done_callback(self._link_tasks.discard)

    # -- runs: assignment, outcome, supersession -------------------------------------------

    def on_assignments(self, link: Link, assignments: pb.Assignments) -> None:
        now = time.monotonic()
        runner = self._runner
        handlers = self._handlers
        held = link.held
        # Runs held elsewhere can only be found where there is an elsewhere.
        look_further = bool(self._strays) or len(self._links) > 1
        refusing = self._draining or self._closing
        taken: list[Run] = []
        self.stats.received += run_count(assignments)
        for handed in handed_out(assignments):
            run_id, job_id, name, tenant, payload, key, fence, attempt, at, timeout_ms, tp, a = (
                handed
            )
            old = held.get(run_id)
            if old is None and look_further:
                old = self._find(run_id, link)
            if old is not None:
                if old.ctx.fence == fence:
                    if old.link is link:
                        link.acks.append(old.ref())
                    else:  # the node assigning it again is where it reports now
                        self._forget(old)
                        old.acked = False
                        link.adopt(old)
                    continue
                self._forget(old)  # a newer fence supersedes what we hold
                runner.abort(old)
            entry = handlers.get(name)
            if self.codec is not None and entry is not None and name != HTTP_HANDLER:
                payload, entry = decoded(self.codec, payload, entry)
            deadline = now + timeout_ms / 1000 if timeout_ms > 0 else math.inf
            ctx = run_context(
                run_id, job_id, name, tenant, payload, key, fence, attempt, at, timeout_ms, deadline
            )
            if entry is None:
                run = Run(link, ctx, None, SYNC)
            elif entry[1] == HTTP:
                run = Run(link, ctx, None, HTTP, a)
            else:
                run = Run(link, ctx, entry[0], entry[1])
            held[run_id] = run
            spans.begin(run, tp, self.worker_id)
            taken.append(run)
            if refusing:
                runner.hand_back(run, "worker is draining")
            elif entry is None:
                # A server that routes by handler sends none of these; one that
                # raced a change of ours gets it back, no attempt used.
                runner.hand_back(run, f"no handler registered for {name!r}")
            else:
                runner.queue(run)
        link.wake.set()
        runner.admit()
        # The ack of each run still held once the ones that could ran: a
        # handler that returned at once has its completion on the way, which
        # needs no ack (one would be dropped when it came due).
        for run in taken:
            if held.get(run.ctx.run_id) is run:
                link.defer_ack(run, now)
        self.credits.assigned(link)

    def _report(
        self, run: Run, outcome: pb.Outcome, error: str, result: str, retry_after_ms: int
    ) -> None:
        """A run's outcome, to the node it reports to now (or kept as a stray)."""
        done = run.done(outcome, error, result, retry_after_ms)
        if run.link is not None:
            run.link.complete(done)
            if isinstance(run.link, Link) and not run.link.connected:
                self._stuck(run.link, [done])
            return
        stray = self._strays.get(run.ctx.run_id)
        if stray is None or stray.run is not run:
            return  # not held any more: nothing to tell
        stray.run = None
        stray.done = done
        if not self._place(run.ctx.run_id, stray, time.monotonic()):
            self._stuck(None, [done])
        self._arm_strays()

    def _stuck(self, link: Link | None, done: Sequence[Done]) -> None:
        """Completions that cannot reach their node now (``link``'s stream is
        down, or no home for a stray): another node gives back the permits
        of those whose handlers returned (``carry_returned``)."""
        carry_returned([k for k in self._links if k is not link], done)

    def _find(self, run_id: int, link: Link) -> Run | None:
        """The run held as ``run_id``: reported to ``link`` first, then a stray,
        then on any other link (a node may speak of a run that reports elsewhere)."""
        run = link.held.get(run_id)
        if run is not None:
            return run
        stray = self._strays.get(run_id)
        if stray is not None and stray.run is not None:
            return stray.run
        for other in self._links:
            if other is not link:
                run = other.held.get(run_id)
                if run is not None:
                    return run
        return None

    def _forget(self, run: Run) -> None:
        """Take ``run`` off the link (or the strays) it reports to."""
        run_id = run.ctx.run_id
        if run.link is not None:
            if run.link.held.get(run_id) is run:
                del run.link.held[run_id]
            run.link = None
            return
        stray = self._strays.get(run_id)
        if stray is not None and stray.run is run:
            del self._strays[run_id]

    def supersede(self, link: Link, run_id: int, fence: int) -> None:
        """A revoke or a rejected renewal (rule 2), from any node."""
        run = self._find(run_id, link)
        if run is not None and (fence == 0 or run.ctx.fence == fence):
            self._forget(run)
            self._runner.abort(run)

    # -- moved runs (rule 6) ------------------------------------------------------------

    def on_moved(self, link: Link, moved: Sequence[pb.MovedRun]) -> None:
        for m in moved:
            owner = m.owner_node_id
            loading = owner == link.node_id  # it gained the shard, not loaded yet
            if owner and not loading and m.owner_address:
                self._ensure_link(owner, m.owner_address)
            disowned = "" if loading else link.node_id
            run = link.held.get(m.run_id)
            if run is not None and run.ctx.fence == m.fence:
                del link.held[m.run_id]
                self._rehome_run(run, owner, disowned=disowned, wait=loading)
            done = link.take_completion(m.run_id, m.fence)
            if done is not None:
                self._rehome_done(done, owner, disowned=disowned, wait=loading)

    def _rehome_run(self, run: Run, owner: str, *, disowned: str = "", wait: bool = False) -> None:
        self.stats.moved += 1
        run.link = None
        self._rehome(run.ctx.run_id, run.ctx.job_id, owner, disowned, wait, run=run)

    def _rehome_done(
        self, done: Done, owner: str, *, disowned: str = "", wait: bool = False
    ) -> None:
        self.stats.moved += 1
        self._rehome(done[0], done[4], owner, disowned, wait, done=done)

    def _rehome(
        self,
        run_id: int,
        job_id: int,
        owner: str,
        disowned: str,
        wait: bool,
        *,
        run: Run | None = None,
        done: Done | None = None,
    ) -> None:
        """Make a run (or its completion) a stray and place it at once, unless
        it is bouncing between nodes or must ``wait`` for its owner to load
        the shard: then it waits its turn."""
        now = time.monotonic()
        stray = self._strays.get(run_id)
        if stray is None:
            stray = self._strays[run_id] = Stray(job_id, now)
        if run is not None:
            stray.run = run
        if done is not None:
            stray.done = done
        stray.hint = owner
        if disowned:
            stray.disowned = disowned
            stray.disowned_in = self._view.version if self._view else 0
        delay = self._bounces.delay(run_id, now, wait)
        stray.due = now + delay
        if delay == 0:
            self._place(run_id, stray, now)
        self._arm_strays()

    def _home_for(self, stray: Stray) -> Link | None:
        """The connected link of the node the stray should report to: the owner
        a node named, else its shard's owner in the newest view; never the node
        that disowned it, unless a newer view gives it the shard again."""
        view = self._view
        for node_id in (stray.hint, view.owner_of(stray.job_id) if view else ""):
            if not node_id or (
                node_id == stray.disowned and (view is None or view.version <= stray.disowned_in)
            ):
                continue
            link = self._link_of(node_id)
            if link is not None and link.connected:
                return link
        return None

    def _place(self, run_id: int, stray: Stray, now: float) -> bool:
        home = self._home_for(stray)
        if home is None:
            stray.tries += 1
            stray.due = now + REHOME_BACKOFF.delay(stray.tries - 1)
            return False
        del self._strays[run_id]
        if stray.run is not None:
            home.adopt(stray.run)
        if stray.done is not None:
            home.complete(stray.done)
        log.debug("run %d now reports to %s", run_id, home.node_id)
        return True

    def _place_strays(self, *, every: bool = False) -> None:
        """Try to place the strays that are due (``every``: all of them, since
        something new is known)."""
        now = time.monotonic()
        # Past two leases a completion nobody took is moot: the run was reaped.
        horizon = now - 2 * self._lease_s()
        for run_id, stray in list(self._strays.items()):
            if not (every or stray.due <= now) or self._place(run_id, stray, now):
                continue
            if stray.run is None and stray.since < horizon:
                del self._strays[run_id]
                log.warning("dropped the completion of run %d: no node took it", run_id)
        self._arm_strays()

    def _arm_strays(self) -> None:
        if not self._strays or self._loop is None or self._closing:
            return
        at = min(s.due for s in self._strays.values())
        if at >= self._stray_at:
            return
        if self._stray_timer is not None:
            self._stray_timer.cancel()
        self._stray_at = at
        self._stray_timer = self._loop.call_at(at, self._on_strays_due)

    def _on_strays_due(self) -> None:
        self._stray_timer = None
        self._stray_at = math.inf
        self._place_strays()
        if self._strays:
            self.refresh_membership()

    def _strays_holding(self) -> int:
        """Runs waiting for a home that hold a slot of the capacity."""
        return sum(1 for s in self._strays.values() if s.run is not None)

    def _lease_s(self) -> float:
        leases = [link.lease_s for link in self._links if link.welcomed]
        return max(leases) if leases else DEFAULT_LEASE_S

    # -- links and membership (rule 7) --------------------------------------------------

    def _link_of(self, node_id: str) -> Link | None:
        found = None
        for link in self._links:
            if link.node_id == node_id:
                if link.confirmed:
                    return link
                found = found or link
        return found

    def _ensure_link(self, node_id: str, address: str) -> None:
        """A link to member ``node_id`` at ``address``, unless one exists."""
        if self._link_of(node_id) is not None or not address or self._closing:
            return
        for link in self._links:
            if not link.confirmed and not link.node_id and link.target == address:
                link.node_id = node_id  # a seed not welcomed yet: the member's
                return
        link = Link(self, self.credits, address, node_id=node_id)
        link.drain_requested = self._draining
        self._links.append(link)
        log.info("following member %s at %s", node_id, address)
        self._start_link(link)

    def _retire(self, link: Link) -> None:
        """Close ``link`` for good; what reported to it is re-homed."""
        if link in self._links:
            self._links.remove(link)
        runs, done = link.release()
        link.close()
        for run in runs:
            self._rehome_run(run, "")
        for d in done:
            self._rehome_done(d, "")

    def on_welcome(self, link: Link, welcome: pb.Welcome) -> bool:
        """Name ``link`` by the node that welcomed it; False (and the link is
        closed) if another link already reaches that node."""
        node_id = welcome.node_id
        if node_id:
            for other in list(self._links):
                if other is link or other.node_id != node_id:
                    continue
                if other.confirmed:
                    log.info(
                        "%s is node %s, already linked at %s: closing it",
                        link.target,
                        node_id,
                        other.target,
                    )
                    self._retire(link)
                    return False
                self._retire(other)  # a guess from the membership; this one got there
            link.node_id = node_id
        link.confirmed = True
        return True

    def on_link_up(self, link: Link) -> None:
        if link.welcome.HasField("membership"):
            self.on_membership(link.welcome.membership)
        self._place_strays(every=True)

    def on_link_down(self, link: Link) -> None:
        if self._view is not None:
            self._leave(link, self._view)
        self._stuck(link, [*link.completions, *(d for d, _ in link.unconfirmed.values())])

    def _leave(self, link: Link, view: View, *, runs: bool = True) -> None:
        """Re-home what reports to ``link`` (its completions not confirmed,
        and with ``runs`` its runs) but belongs to a shard ``view`` gives to
        another node. A node that hands a shard over while a completion of it
        is on its way to the store drops it unanswered: only its new owner
        can take it now, and its lease lapses there if nobody brings it."""
        for run in list(link.held.values()) if runs else ():
            owner = view.owner_of(run.ctx.job_id)
            if owner and owner != link.node_id:
                del link.held[run.ctx.run_id]
                self._rehome_run(run, owner)
        pending = [*link.completions, *(d for d, _ in link.unconfirmed.values())]
        for run_id, fence, _, _, job_id, *_ in pending:
            owner = view.owner_of(job_id)
            if owner and owner != link.node_id:
                done = link.take_completion(run_id, fence)
                if done is not None:
                    self._rehome_done(done, owner)

    def on_membership(self, msg: cluster_pb2.Membership) -> None:
        view = view_of(msg)
        if view is None or self._closing or not view.supersedes(self._view):
            return
        self._view = view
        for node_id, address in view.members.items():
            self._ensure_link(node_id, address)
        for link in list(self._links):
            if link.node_id and link.node_id not in view.members:
                log.info("node %s left the cluster: closing its stream", link.node_id)
                self._retire(link)
        for link in self._links:
            if link.confirmed:
                # A run on a live link hears ``moved`` from its node instead.
                self._leave(link, view, runs=not link.connected)
        self._place_strays(every=True)

    def refresh_membership(self) -> None:
        """Ask a connected node for the membership (one ask at a time)."""
        if self._refresh is not None or self._closing or self._loop is None:
            return
        now = time.monotonic()
        if now - self._refreshed_at < MEMBERSHIP_MIN_INTERVAL_S:
            return
        link = next((k for k in self._links if k.connected and k.channel is not None), None)
        if link is None:
            return
        self._refreshed_at = now
        self._refresh = self._loop.create_task(self._fetch_membership(link))

    async def _fetch_membership(self, link: Link) -> None:
        try:
            msg = await fetch_membership(link.channel, link.target, self.call_metadata)
        finally:
            self._refresh = None
        if msg is not None:
            self.on_membership(msg)
