"""One node's lease stream: Hello, Welcome, batched writes, reconnects.

A ``Link`` owns one ``Connect`` stream at a time (and the channel under it),
writes everything due in one event-loop turn as one message of each kind, and
hands what the node says to the worker: assignments, revokes, results, moved
runs and membership. It keeps the runs that report to its node (``held``) and
the completions its node has not confirmed; the worker moves both between
links when a shard moves. It also carries its share of the worker's capacity
(``wheel.worker._credit``): the credit its node has now, sent as Hello's
capacity and then as Credit ahead of everything else in a batch.

Completions alone are coalesced while they keep coming: when nothing but
completions is due and the last Complete message went out less than
``COALESCE_S`` ago, the writer waits up to ``COALESCE_S`` for more (or until
``COALESCE_MAX`` are pending) so that its node reads one Complete message of
many rather than many of a few. A completion after a quiet spell goes at
once: nothing would have shared its message, and its node learns of the
end (a permit of its concurrency key free again, its job's next run due)
that much sooner. Anything else due (an ack, a heartbeat, credit, a drain)
ends the wait at once and goes out with them.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import grpc  # type: ignore[import-untyped, unused-ignore]
import grpc.aio  # type: ignore[import-untyped, unused-ignore]

from wheel.logs import ids
from wheel.rpc.v1 import worker_service_pb2 as pb
from wheel.rpc.v1 import worker_service_pb2_grpc as pb_grpc
from wheel.tls import make_channel
from wheel.worker._columns import complete_message
from wheel.worker._runs import Done, Run

if TYPE_CHECKING:
    from wheel._retry import Backoff
    from wheel.rpc.v1 import cluster_pb2
    from wheel.tls import ChannelSecurity
    from wheel.worker._api import WorkerStats

log = logging.getLogger("wheel.worker")

# Keeps every message far below gRPC's 4 MB default.
MAX_ITEMS_PER_MESSAGE = 1_000
# Longest an ack waits for the run's completion to make it unneeded (rule 1).
ACK_DELAY_S = 0.1
# Longest completions alone wait for more to share their message, and how many
# end the wait. A few ms against a lease of seconds; the node reads a message
# per batch, so fewer, fuller batches cost it less per run: at 2,000 HTTP runs/s,
# 54 a message at 10 ms against 9 with none (a no-op handler's come 60 at once).
COALESCE_S = 0.010
COALESCE_MAX = 256
DEFAULT_HEARTBEAT_S = 1.0
DEFAULT_LEASE_S = 60.0
# A node that does not answer Hello within this is treated as down.
WELCOME_TIMEOUT_S = 10.0
# Outcomes of a handler that returned (``Returned``): a retryable failure may
# be a timeout, which leaves a sync handler's thread running; a hand-back never
# started its handler, and an abandoned run's may still run.
RETURNED = (pb.OUTCOME_SUCCEEDED, pb.OUTCOME_FAILED)


class LinkHost(Protocol):
    """What a link needs of its worker: who it is and how it dials, and where
    it hands what its node says (``Worker`` is one)."""

    @property
    def worker_id(self) -> str: ...
    @property
    def pools(self) -> tuple[str, ...]: ...
    @property
    def handler_names(self) -> list[str]: ...
    @property
    def security(self) -> ChannelSecurity: ...
    @property
    def interceptors(self) -> tuple[Any, ...]: ...
    @property
    def call_metadata(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def reconnect(self) -> Backoff: ...
    @property
    def stats(self) -> WorkerStats: ...
    @property
    def closing(self) -> bool: ...

    def on_welcome(self, link: Link, welcome: pb.Welcome) -> bool:
        """``link``'s node said Welcome: False closes the link (another reaches that node)."""
        ...

    def on_link_up(self, link: Link) -> None: ...
    def on_link_down(self, link: Link) -> None: ...
    def refresh_membership(self) -> None: ...
    def on_assignments(self, link: Link, assignments: pb.Assignments) -> None: ...
    def supersede(self, link: Link, run_id: int, fence: int) -> None: ...
    def on_membership(self, msg: cluster_pb2.Membership) -> None: ...
    def on_moved(self, link: Link, moved: Sequence[pb.MovedRun]) -> None: ...


class LinkCredit(Protocol):
    """The worker's split of its capacity, as a link's stream reports to it
    (``wheel.worker._credit.Credits`` is one)."""

    def hello_capacity(self, link: Link) -> int: ...
    def closed(self, link: Link) -> None: ...
    def confirmed(self, link: Link, seq: int) -> None: ...


class Link:
    """One node: its stream across reconnects and the runs that report to it."""

    _welcome: pb.Welcome
    # How long a run may go unacked: a run done sooner needs no ack at all.
    ack_delay: float

    def __init__(
        self, host: LinkHost, credits: LinkCredit, target: str, *, node_id: str = ""
    ) -> None:
        self.host = host
        self.credits = credits
        self.target = target
        # The node behind ``target``: its own word once it said Welcome
        # (``confirmed``), before that the membership's, or "" (a seed).
        self.node_id = node_id
        self.confirmed = False
        self.held: dict[int, Run] = {}
        self.acks: list[pb.RunRef] = []
        # Acks held back until their time (rule 1), in the order they are due.
        self.later_acks: collections.deque[tuple[float, Run]] = collections.deque()
        self._ack_timer: asyncio.TimerHandle | None = None
        # Built into messages in place when sent.
        self.completions: list[Done] = []
        # Sent but not yet answered in Results; re-sent after a reconnect.
        self.unconfirmed: dict[int, tuple[Done, float]] = {}
        # Runs whose handlers returned while their own node's stream was
        # down, for this link's node to give their permits back (``Returned``).
        self.returned: list[pb.RunRef] = []
        self.heartbeat_due = False
        # The writer is gathering completions (COALESCE_S): one more does not wake it.
        self.coalescing = False
        # time.monotonic() when the last Complete message was sent.
        self.completed_at = -math.inf
        self.drain_requested = False
        self.drain_sent = False
        self.connected = False
        self.welcomed = False
        self.welcome = pb.Welcome()
        self.wake = asyncio.Event()
        # The channel of the stream up now (for AdminService calls), else None.
        self.channel: Any = None
        # time.monotonic() when the stream was last lost after a Welcome.
        self.down_since: float | None = None
        # Closed for good: its node left the cluster, or another link reaches it.
        self.closed = False
        self.task: asyncio.Task[None] | None = None
        # Its share of the worker's capacity (``wheel.worker._credit``): a
        # stream is open (Hello sent); the credit its node has, with what is
        # still to be sent of it; lowerings not confirmed yet, by Credit.seq;
        # when its node last used up its credit.
        self.open = False
        self.grant = 0
        self.credit_add = 0
        self.credit_seq = 0
        self.reclaims: dict[int, int] = {}
        self.full_at = -math.inf

    def __repr__(self) -> str:
        return f"Link({self.target!r}, node {self.node_id or '?'})"

    @property
    def unsettled(self) -> bool:
        return bool(self.completions or self.unconfirmed)

    def committed(self) -> int:
        """The most runs its node may still hand out credit for: its credit,
        and the lowerings it has not confirmed."""
        return self.grant + sum(self.reclaims.values()) if self.reclaims else self.grant

    def node_load(self) -> int:
        """The runs its node counts as held here: completions on their way too."""
        return len(self.held) + len(self.completions) + len(self.unconfirmed)

    @property
    def lease_s(self) -> float:
        return self._welcome.lease_ms / 1000 or DEFAULT_LEASE_S

    @property
    def welcome(self) -> pb.Welcome:
        return self._welcome

    @welcome.setter
    def welcome(self, welcome: pb.Welcome) -> None:
        self._welcome = welcome
        grace = welcome.grace_lease_ms / 10_000
        # Read for every run received: worked out once per Welcome.
        self.ack_delay = min(ACK_DELAY_S, grace) if grace > 0 else ACK_DELAY_S

    # -- what goes to the node --------------------------------------------------------

    def defer_ack(self, run: Run, now: float) -> None:
        self.later_acks.append((now + self.ack_delay, run))
        if self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(self.ack_delay, self._acks_due)

    def _acks_due(self) -> None:
        self._ack_timer = None
        self.wake.set()

    def _due_acks(self) -> None:
        """Move the acks whose time came into ``acks``; drop the ones whose
        run completed, was aborted or moved to another link meanwhile."""
        later = self.later_acks
        now = time.monotonic()
        while later and later[0][0] <= now:
            _, run = later.popleft()
            if self.held.get(run.ctx.run_id) is run:
                self.acks.append(run.ref())
                run.acked = True
        if later and self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(
                max(0.0, later[0][0] - now), self._acks_due
            )

    def complete(self, done: Done) -> None:
        self.held.pop(done[0], None)
        completions = self.completions
        completions.append(done)
        if not self.coalescing or len(completions) >= COALESCE_MAX:
            self.wake.set()

    def adopt(self, run: Run) -> None:
        """Report ``run`` here from now on: acked at once if no link acked it
        yet, and named in a heartbeat sent now rather than an interval later."""
        run.link = self
        self.held[run.ctx.run_id] = run
        if not run.acked:
            run.acked = True
            self.acks.append(run.ref())
        self.heartbeat_due = True
        self.wake.set()

    def take_completion(self, run_id: int, fence: int) -> Done | None:
        """Remove and return the completion of (run_id, fence) not confirmed yet."""
        entry = self.unconfirmed.get(run_id)
        if entry is not None and entry[0][1] == fence:
            del self.unconfirmed[run_id]
            return entry[0]
        for i, done in enumerate(self.completions):
            if done[0] == run_id and done[1] == fence:
                return self.completions.pop(i)
        return None

    def release(self) -> tuple[list[Run], list[Done]]:
        """Remove and return every run held here and every completion not yet
        confirmed: the link's node is gone, they go elsewhere."""
        runs = list(self.held.values())
        self.held.clear()
        done = [*self.completions, *(d for d, _ in self.unconfirmed.values())]
        self.completions = []
        self.unconfirmed.clear()
        return runs, done

    def close(self) -> None:
        """Stop for good (its runs must have been released first)."""
        self.closed = True
        self.connected = False
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()

    # -- the stream -------------------------------------------------------------------

    async def run(self) -> None:
        w = self.host
        delays = w.reconnect.delays()
        while not w.closing and not self.closed:
            self.welcomed = False
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                log.info("stream to %s ended: %s %s", self.target, exc.code().name, exc.details())
            except TimeoutError:
                log.warning("%s did not answer Hello in %.0f s", self.target, WELCOME_TIMEOUT_S)
            except Exception:
                log.exception("stream to %s failed", self.target)
            welcomed = self.welcomed
            self.connected = False
            if w.closing or self.closed:
                return
            now = time.monotonic()
            if welcomed:
                self.down_since = now
                w.on_link_down(self)
            elif self.down_since is not None and now - self.down_since > self.lease_s:
                # Down past the lease: if its shards moved, a fresh view says where.
                w.refresh_membership()
            if welcomed:
                delays.reset()
            await asyncio.sleep(delays.wait())
            w.stats.reconnects += 1

    async def _session(self) -> None:
        """One stream, from Hello to its end (``welcomed`` says if it got that far)."""
        w = self.host
        channel = make_channel(self.target, w.security, aio=True, interceptors=w.interceptors)
        async with channel:
            call = pb_grpc.WorkerServiceStub(channel).Connect(metadata=w.call_metadata)
            try:
                await call.write(
                    pb.WorkerMessage(
                        hello=pb.Hello(
                            worker_id=w.worker_id,
                            capacity=self.credits.hello_capacity(self),
                            pools=list(w.pools),
                            handlers=w.handler_names,
                            columns=True,
                            traced_columns=True,
                        )
                    )
                )
                first = await asyncio.wait_for(call.read(), WELCOME_TIMEOUT_S)
                if first is grpc.aio.EOF:
                    return
                if first.WhichOneof("kind") != "welcome":
                    self._on_message(first)
                    log.warning("%s did not answer Hello with Welcome; reconnecting", self.target)
                    return
                if not w.on_welcome(self, first.welcome):
                    return  # a second stream to a node already linked: closed
                self.welcome = first.welcome
                self.welcomed = True
                self.connected = True
                self.channel = channel
                self.down_since = None
                log.info("connected to %s (node %s)", self.target, self.welcome.node_id)
                # Rule 4: what the last stream left unsettled goes out first.
                resend = [c for c, _ in self.unconfirmed.values()]
                self.unconfirmed.clear()
                self.completions[:0] = resend
                self.drain_sent = False
                self.heartbeat_due = True
                self.wake.set()
                w.on_link_up(self)
                if self.closed:
                    return  # its own membership says its node left
                interval = self.welcome.heartbeat_interval_ms / 1000 or (
                    self.welcome.lease_ms / 3000 or DEFAULT_HEARTBEAT_S
                )
                tasks = [
                    asyncio.create_task(self._reader(call)),
                    asyncio.create_task(self._writer(call)),
                    asyncio.create_task(self._heartbeats(interval)),
                ]
                try:
                    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for t in tasks:
                        t.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                for t in done:
                    t.result()  # re-raise the stream error, if any
            finally:
                self.connected = False
                self.channel = None
                self.credits.closed(self)
                call.cancel()

    async def _reader(self, call: Any) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                log.info("%s closed the stream", self.target)
                return
            self._on_message(msg)

    def _on_message(self, msg: pb.ServerMessage) -> None:
        kind = msg.WhichOneof("kind")
        w = self.host
        if kind == "assignments":
            w.on_assignments(self, msg.assignments)
            if msg.assignments.HasField("results"):
                self._on_results(msg.assignments.results)
        elif kind == "revokes":
            for r in msg.revokes.revokes:
                w.supersede(self, r.run_id, r.fence)
        elif kind == "results":
            self._on_results(msg.results)
        elif kind == "membership":
            w.on_membership(msg.membership)
        elif kind == "error":
            e = msg.error
            log.warning(
                "protocol error from %s: %s %s (run %d)", self.target, e.code, e.message, e.run_id
            )
        elif kind == "welcome":
            self.welcome = msg.welcome

    def _on_results(self, results: pb.Results) -> None:
        if results.credit_seq:
            self.credits.confirmed(self, results.credit_seq)
        for run_id in results.accepted:
            self.unconfirmed.pop(run_id, None)
        for c in results.completions:
            self.unconfirmed.pop(c.run_id, None)
            if not c.accepted:
                self.host.stats.rejected += 1
                log.info(
                    "%s rejected the completion of run %d: %s",
                    self.target,
                    c.run_id,
                    c.reason,
                    extra=ids(run_id=c.run_id, worker=self.host.worker_id),
                )
        for ref in results.rejected_renewals:
            self.host.supersede(self, ref.run_id, ref.fence)
        if results.moved:
            self.host.on_moved(self, results.moved)

    async def _writer(self, call: Any) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            # Let the rest of this loop turn land in the same batch (rule 1).
            await asyncio.sleep(0)
            if self._completions_only():
                # What woke the writer is known to be completions: from here
                # on only news (or COALESCE_MAX of them) ends the wait.
                self.wake.clear()
                self.coalescing = True
                try:
                    await asyncio.wait_for(self.wake.wait(), COALESCE_S)
                except TimeoutError:
                    pass
                finally:
                    self.coalescing = False
                self.wake.clear()
            for msg in self._take():
                await call.write(msg)

    def _completions_only(self) -> bool:
        """Only completions are due, fewer than ``COALESCE_MAX``, and others
        came just before them: worth a wait."""
        return (
            0 < len(self.completions) < COALESCE_MAX
            and time.monotonic() - self.completed_at < COALESCE_S
            and not (self.acks or self.heartbeat_due or self.credit_add or self.credit_seq)
            and not self.returned
            and not (self.drain_requested and not self.drain_sent)
        )

    def _take(self) -> list[pb.WorkerMessage]:
        out: list[pb.WorkerMessage] = []
        if self.credit_add or self.credit_seq:
            # First: a lowering must reach the node before the completions
            # that would let it refill those slots.
            credit = pb.Credit(add=self.credit_add, seq=self.credit_seq)
            self.credit_add = self.credit_seq = 0
            out.append(pb.WorkerMessage(credit=credit))
        self._due_acks()
        if self.acks:
            acks, self.acks = self.acks, []
            for i in range(0, len(acks), MAX_ITEMS_PER_MESSAGE):
                out.append(pb.WorkerMessage(ack=pb.Ack(runs=acks[i : i + MAX_ITEMS_PER_MESSAGE])))
        if self.completions:
            done, self.completions = self.completions, []
            now = self.completed_at = time.monotonic()
            for c in done:
                self.unconfirmed[c[0]] = (c, now)
            columns = self._welcome.columns
            for i in range(0, len(done), MAX_ITEMS_PER_MESSAGE):
                out.append(complete_message(done[i : i + MAX_ITEMS_PER_MESSAGE], columns))
        if self.returned:
            refs, self.returned = self.returned, []
            for i in range(0, len(refs), MAX_ITEMS_PER_MESSAGE):
                part = refs[i : i + MAX_ITEMS_PER_MESSAGE]
                out.append(pb.WorkerMessage(returned=pb.Returned(runs=part)))
        if self.heartbeat_due:
            self.heartbeat_due = False
            refs = [r.ref() for r in self.held.values()]
            out.append(pb.WorkerMessage(heartbeat=pb.Heartbeat(runs=refs)))
        if self.drain_requested and not self.drain_sent:
            self.drain_sent = True
            out.append(pb.WorkerMessage(drain=pb.Drain()))
        return out

    async def _heartbeats(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.heartbeat_due = True
            self.wake.set()
            # A server that never answers some completion must not grow this forever:
            # past two leases the run has been reaped anyway.
            horizon = time.monotonic() - 2 * max(self._welcome.lease_ms / 1000, interval)
            stale = [rid for rid, (_, sent) in self.unconfirmed.items() if sent < horizon]
            for rid in stale:
                del self.unconfirmed[rid]


def carry_returned(links: Sequence[Link], done: Sequence[Done]) -> bool:
    """Give the runs of ``done`` whose handlers returned to the first
    connected link of ``links``, whose node gives their permits back at once
    (``Returned``): their completions cannot reach their own node now, which
    may be dead, and their permits would wait for its shards' next owner.
    False: none to give, or no link to take them."""
    refs = [pb.RunRef(run_id=d[0], fence=d[1], job_id=d[4]) for d in done if d[2] in RETURNED]
    link = next((k for k in links if k.connected and not k.closed), None)
    if not refs or link is None:
        return False
    link.returned.extend(refs)
    link.wake.set()
    return True
