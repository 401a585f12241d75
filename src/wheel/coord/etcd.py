"""Shard ownership for a cluster, kept in etcd under one lease per node.

Keys (``C`` is the cluster name)::

    /C/members/{node_id}  = address   attached to the node's lease
    /C/shards/{shard}     = node_id   attached to the owner's lease
    /C/epochs/{shard}     = "N"       no lease: never deleted, only incremented
    /C/leaving/{node_id}  = lease id  attached to the leaving node's lease
    /C/ready/{leaver}/{node_id} = ""  attached to the leaver's lease

How it works:

- Each node holds one lease of ``ttl_s`` seconds, kept alive every ttl/3 by a
  keepalive thread. Its membership key lives on that lease.
- Shards are assigned by rendezvous (highest random weight) hashing over the
  live members: every node computes the same assignment from the same member
  set, and a member joining or leaving moves only the shards it gains or had.
- A control thread reconciles whenever the watch on ``/C/`` fires (and every
  ttl/3 in any case): it releases shards no longer assigned to it and tries to
  acquire the assigned ones that are free. A shard held by a dead node becomes
  free when that node's lease expires and etcd deletes its keys.
- Acquisition is one transaction: ``create_revision(shard) == 0`` and
  ``mod_revision(epoch) == seen`` -> put the shard key with our lease and put
  epoch = seen + 1. Release deletes the shard key only if its mod_revision is
  still that of our acquisition.

Planned moves are prepared (the gaining node loads a shard while its owner
still serves it; the switch then costs a fence and the changes since):

- A node **joining** grants its lease, computes the shards the assignment
  will give it once it is a member, has them loaded (``set_preparer``), and
  only then puts its membership key: the holders release those shards when
  they see it, and it acquires them as they come free.
- A node **leaving** (``hand_off``, before ``stop``) puts its leaving key and
  keeps serving. Every other member, seeing it, computes the assignment
  without the leavers, loads the shards it will gain, and puts a ready key
  on the leaver's lease. The leaver stops once every other member is ready
  (or ``handoff_timeout_s`` has passed): its lease revoked, its keys go and
  the others acquire its shards at once. A leaver still counts in the
  assignment until then, so nothing moves early.
- Either way the ownership switch is the usual one (keys, epochs, the store's
  fence); preparing only moves the load before it. A shard gained with no
  preparation (a crash, a lapsed lease) is loaded after its fence.

Invariants:

1. At most one holder per shard key at any etcd revision (``create_revision ==
   0`` guard), and a key outlives its holder's lease by zero seconds.
2. Epochs are strictly increasing per shard across owners: every acquisition
   increments ``/C/epochs/{shard}`` in the same transaction, guarded by its
   mod_revision, and that key is never deleted. Epochs are small dense
   integers. The fence keeps them in 32 bits: 4 billion acquisitions of one
   shard. A shard at the limit is logged and left unowned (the others carry
   on); the way out is a new cluster name (fresh epochs) together with a store
   whose fences restart.
3. ``may_dispatch(s)`` is True only while ``s`` is owned and
   ``monotonic() < sent + ttl - safety_margin`` where ``sent`` is when the last
   successful keepalive (or the grant) was *sent*. etcd restarts the TTL when
   it receives the request, later than ``sent``, so the server-side expiry is
   never before our local deadline: a paused or partitioned node stops
   dispatching before any other node can acquire its shards (up to clock-rate
   drift, which the safety margin covers).
4. A lease whose local deadline passed is never trusted again, even if etcd
   still knows it (etcd extends every lease when it restarts): the node
   publishes all its shards as lost, revokes the old lease, grants a new one and
   rejoins, so everything it owns afterwards carries a new epoch.
5. A release drops the shard locally (``may_dispatch`` False, change published)
   before deleting its key.
6. Every etcd failure is a CoordinationError inside this module and is retried
   with backoff; nothing here lets etcd being down crash the node.
7. Preparing moves no ownership: a joining node prepares before it is a
   member (no shard can be assigned to it), a member prepares for a leaver
   while the leaver still counts in the assignment, and a leaver serves
   until it releases. So at most one node dispatches a shard, as without
   preparing, and a shard is without a dispatching owner only from its
   release to its new holder's take-on: a fence, the store's changes since
   the staging and the shard's runs, at any job count.
8. A staging is a read, never trusted alone: the gain fences first and then
   reads every change the store made after the staging's watermark (the
   old owner's schedule moves included), so the new owner starts from the
   store's state at its fence, as if it had loaded the shard whole then.

``may_dispatch`` is a gate, not the safety: a dispatch that passed the gate
just before a release carries the old epoch, and the store's fence check
rejects it once the new owner has written with a higher one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import etcd3
from etcd3 import etcdrpc
from etcd3.etcdrpc import kv_pb2
from etcd3.utils import prefix_range_end

from wheel._retry import Backoff
from wheel.coord._moves import PlannedMoves, assign_shards, rendezvous_owner
from wheel.coord.base import (
    MAX_EPOCH,
    Member,
    OwnershipChange,
    ShardHook,
    Subscribers,
)
from wheel.errors import CoordinationError
from wheel.tls import ChannelSecurity, LiveChannelSecurity, live_channel

__all__ = ["EtcdCoordinator", "assign_shards", "rendezvous_owner"]

_log = logging.getLogger(__name__)

# gRPC reconnects with exponential backoff up to 2 minutes by default; a node
# must notice etcd coming back within a second or so.
_GRPC_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# Shards acquired in one etcd transaction (two puts and two compares each;
# etcd allows 128 operations a transaction by default).
ACQUIRE_BATCH = 32
# How long a planned release waits for the node to hand its shards over.
RELEASE_WAIT_S = 2.0


def _parse_endpoint(endpoint: str) -> tuple[str, int]:
    rest = endpoint.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        raise CoordinationError(f"etcd endpoint must be host:port, got {endpoint!r}")
    return host.strip("[]"), int(port)


def _is_not_found(exc: BaseException) -> bool:
    """Whether etcd answered NOT_FOUND (a lease that no longer exists)."""
    cause = exc.__cause__ if isinstance(exc, CoordinationError) else exc
    code = getattr(cause, "code", None)
    return callable(code) and getattr(code(), "name", "") == "NOT_FOUND"


class EtcdCoordinator(PlannedMoves):
    """A cluster member that owns the shards rendezvous hashing gives it."""

    def __init__(
        self,
        node_id: str,
        address: str,
        endpoints: Sequence[str],
        *,
        cluster: str = "wheel",
        ttl_s: int = 10,
        safety_margin_s: float = 1.0,
        start_timeout_s: float | None = None,
        handoff_timeout_s: float = 30.0,
        security: ChannelSecurity | LiveChannelSecurity | None = None,
    ) -> None:
        """``security``: TLS to etcd (its CA, and this node's certificate
        when etcd runs with ``--client-cert-auth``); None: plaintext. A live
        one that a reload replaces is taken up by a new etcd client (see
        ``_etcd``). ``handoff_timeout_s``: how long a leaving node waits for
        the others to load its shards."""
        if not endpoints:
            raise CoordinationError("no etcd endpoints")
        if ttl_s < 2:
            raise CoordinationError("ttl_s must be at least 2 (etcd's minimum lease is 1.5 s)")
        if not 0 <= safety_margin_s < ttl_s * 2 / 3:
            raise CoordinationError("safety_margin_s must be below two thirds of ttl_s")
        if "/" in node_id or not node_id:
            raise CoordinationError(f"node_id must be non-empty without '/': {node_id!r}")
        self.node_id = node_id
        self.address = address
        self._endpoints = [_parse_endpoint(e) for e in endpoints]
        self._security = live_channel(security)
        self._ttl = ttl_s
        self._margin = safety_margin_s
        self._start_timeout = start_timeout_s if start_timeout_s is not None else 3.0 * ttl_s
        self._keepalive_interval = ttl_s / 3
        self._rpc_timeout = max(0.5, min(ttl_s / 3, 5.0))
        self._prefix = f"/{cluster}/"
        self._members_prefix = f"/{cluster}/members/"
        self._shards_prefix = f"/{cluster}/shards/"
        self._epochs_prefix = f"/{cluster}/epochs/"
        self._leaving_prefix = f"/{cluster}/leaving/"
        self._ready_prefix = f"/{cluster}/ready/"
        self._handoff_timeout = handoff_timeout_s
        self._preparer: ShardHook | None = None
        self._releaser: ShardHook | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Set while the control thread waits for a join's preparation.
        self._preparing = False
        # Leaver -> its lease, for which this node prepared (or is preparing).
        self._prepared_for: dict[str, int] = {}

        self._subscribers = Subscribers()
        self._client: Any = None
        # The version of ``_security`` the client was made with.
        self._client_version = 0
        self._lock = threading.Lock()
        # Written by the worker threads; read without the lock by may_dispatch
        # (each is replaced whole, never mutated in place).
        self._owned: dict[int, int] = {}
        self._valid_until = 0.0
        # Control-thread state.
        self._lease_id: int | None = None
        self._lease_gone = False
        self._acquired_rev: dict[int, int] = {}
        self._members: dict[str, str] = {}
        # Shard -> holder's node id as last read (replaced whole, never mutated),
        # and the etcd revision that read saw.
        self._holders: dict[int, str] = {}
        self._view_revision = 0
        self._published_first = False

        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._wake_keepalive = threading.Event()
        self._started = threading.Event()
        self._frozen = False
        self._threads: list[threading.Thread] = []
        self._watch_call: Any = None

    # -- the Coordinator protocol -------------------------------------------

    async def start(self) -> None:
        """Join the cluster and reconcile once; raise CoordinationError if etcd
        could not be reached within ``start_timeout_s`` (default 3 x ttl)."""
        if self._threads:
            raise CoordinationError("coordinator already started")
        self._loop = asyncio.get_running_loop()
        self._subscribers.bind(self._loop)
        self._client_version = self._security.version
        self._client = self._make_client()
        self._stopping.clear()
        self._started.clear()
        self._published_first = False
        self._lease_gone = False
        self._frozen = False
        for name, target in (
            ("control", self._run_control),
            ("keepalive", self._run_keepalive),
            ("watch", self._run_watch),
        ):
            thread = threading.Thread(
                target=target, name=f"wheel-coord-{name}-{self.node_id}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        # A join's preparation (loading the shards to come) may take longer
        # than reaching etcd: the timeout is about etcd.
        # The timeout is counted again from the end of a preparation.
        deadline = time.monotonic() + self._start_timeout
        joined = False
        while not joined and (self._preparing or time.monotonic() < deadline):
            joined = await asyncio.to_thread(self._started.wait, 0.25)
            if self._preparing:
                deadline = time.monotonic() + self._start_timeout
        if not joined:
            await self._shutdown_threads()
            self._client.close()
            raise CoordinationError(
                f"could not join the cluster through etcd within {self._start_timeout} s"
            )
        # The first change was posted before _started was set; let it run.
        await asyncio.sleep(0)

    async def stop(self) -> None:
        """Stop the threads, publish every shard as lost and revoke the lease,
        which deletes the membership and shard keys at once."""
        if not self._threads:
            return
        await self._shutdown_threads()
        with self._lock:
            lost = frozenset(self._owned)
            self._owned = {}
            self._valid_until = 0.0
            lease_id, self._lease_id = self._lease_id, None
        if lost:
            self._subscribers.post(OwnershipChange(lost=lost))
        if lease_id is not None:
            try:
                await asyncio.to_thread(self._call, self._etcd().revoke_lease, lease_id)
            except CoordinationError as exc:
                _log.warning("lease not revoked at stop (it will expire): %s", exc)
        self._client.close()
        await asyncio.sleep(0)

    def subscribe(self, callback: Callable[[OwnershipChange], None]) -> None:
        self._subscribers.add(callback)

    def owned(self) -> Mapping[int, int]:
        return dict(self._owned)

    def may_dispatch(self, shard: int) -> bool:
        return shard in self._owned and time.monotonic() < self._valid_until

    def valid_until(self) -> float:
        return self._valid_until

    def members(self) -> list[Member]:
        return [Member(node_id=n, address=a) for n, a in sorted(self._members.items())]

    def view_version(self) -> int:
        return self._view_revision

    def shard_owners(self) -> Mapping[int, str]:
        holders = dict(self._holders)
        holders.update(dict.fromkeys(self._owned, self.node_id))
        return holders

    # -- test hooks -----------------------------------------------------------

    def _freeze(self, frozen: bool = True) -> None:
        """Stop (or resume) all talk to etcd, as a partition or a long pause
        would, without releasing anything. For failure tests."""
        self._frozen = frozen
        self._wake.set()
        self._wake_keepalive.set()

    # -- etcd plumbing --------------------------------------------------------

    def _make_client(self) -> Any:
        security = self._security.current
        secure = security.secure
        creds = security.credentials() if secure else None
        endpoints = [
            etcd3.Endpoint(
                host,
                port,
                secure=secure,
                creds=creds,
                time_retry=0.2,
                opts=_GRPC_OPTIONS,
            )
            for host, port in self._endpoints
        ]
        return etcd3.MultiEndpointEtcd3Client(
            endpoints=endpoints, timeout=self._rpc_timeout, failover=True
        )

    def _etcd(self) -> Any:
        """The etcd client. Once a reload replaced the TLS certificates, a
        new client made with them: the calls after go through it, the watch
        opens again on it when the old one closes (a reconcile follows, as
        after any break), and the old one closes once the calls on it have
        had their time. Connections made before stay up until then: TLS
        checks certificates at the handshake only."""
        version = self._security.version
        if version == self._client_version:
            return self._client
        with self._lock:
            if version != self._client_version:
                old, self._client = self._client, self._make_client()
                self._client_version = version
                closing = threading.Timer(self._rpc_timeout * 2, old.close)
                closing.daemon = True
                closing.start()
                _log.info("etcd: a new client with the reloaded TLS certificates")
            return self._client

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one etcd call; every failure comes out as CoordinationError."""
        try:
            return fn(*args, **kwargs)
        except CoordinationError:
            raise
        except Exception as exc:  # etcd3 raises grpc, Etcd3Exception and ValueError
            raise CoordinationError(f"etcd: {exc!r}") from exc

    async def _shutdown_threads(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._wake_keepalive.set()
        call = self._watch_call
        if call is not None:
            call.cancel()
        threads, self._threads = self._threads, []

        def join() -> None:
            for thread in threads:
                thread.join(timeout=self._rpc_timeout * 4 + 1)

        await asyncio.to_thread(join)

    # -- keepalive thread -----------------------------------------------------

    def _run_keepalive(self) -> None:
        """Refresh the lease every ttl/3 and push the local deadline forward."""
        while not self._stopping.is_set():
            lease_id = self._lease_id
            if self._frozen or lease_id is None or self._lease_gone:
                self._wait(self._wake_keepalive, 0.05)
                continue
            sent = time.monotonic()
            try:
                responses = self._call(self._refresh, lease_id)
            except CoordinationError as exc:
                _log.warning("lease keepalive failed, retrying: %s", exc)
                self._wait(self._wake_keepalive, min(0.2, self._keepalive_interval / 4))
                continue
            ttl = min((r.TTL for r in responses), default=0)
            with self._lock:
                if self._lease_id != lease_id:
                    continue  # the control thread has moved on to a new lease
                if ttl <= 0:
                    _log.warning("etcd reports lease %x gone", lease_id)
                    self._lease_gone = True
                    self._valid_until = 0.0
                elif sent >= self._valid_until:
                    # Lapsed by our clock before this refresh went out: a lapse
                    # is final (invariant 4), so the control thread rejoins.
                    self._lease_gone = True
                else:
                    self._valid_until = max(
                        self._valid_until, sent + min(ttl, self._ttl) - self._margin
                    )
            if self._lease_gone:
                self._wake.set()
            self._wait(self._wake_keepalive, self._keepalive_interval)

    def _refresh(self, lease_id: int) -> list[Any]:
        return list(self._etcd().refresh_lease(lease_id))

    # -- watch thread -----------------------------------------------------------

    def _run_watch(self) -> None:
        """Wake the control thread on any change under the cluster prefix.

        A raw gRPC watch stream: etcd3's own watcher thread crashes when its
        stream breaks. After any break the control thread reconciles, since
        events may have been missed.
        """
        backoff = Backoff(initial=0.1, max=1.0).delays()
        prefix = self._prefix.encode()
        request = etcdrpc.WatchRequest(
            create_request=etcdrpc.WatchCreateRequest(
                key=prefix, range_end=prefix_range_end(prefix)
            )
        )
        while not self._stopping.is_set():
            done = threading.Event()

            def requests(done: threading.Event = done) -> Iterator[Any]:
                yield request
                done.wait()  # keep the stream open until this call is over

            try:
                if not self._frozen:
                    stub = etcdrpc.WatchStub(self._etcd().channel)
                    self._watch_call = stub.Watch(requests())
                    if self._stopping.is_set():
                        self._watch_call.cancel()
                    for response in self._watch_call:
                        if response.canceled:
                            break  # e.g. compacted: open a new watch
                        if response.created:
                            # (Re)connected: events may have been missed.
                            backoff.reset()
                            self._wake.set()
                        else:
                            self._note_holders(response)
                            if any(self._worth_a_look(e) for e in response.events):
                                self._wake.set()
            except Exception as exc:  # a broken stream, or etcd not reachable yet
                if not self._stopping.is_set():
                    _log.debug("etcd watch broke: %r", exc)
            finally:
                done.set()
                self._watch_call = None
            self._stopping.wait(backoff.wait())

    def _note_holders(self, response: Any) -> None:
        """Keep the view of who holds which shard current from the watch:
        another node's acquisition does not call for a reconcile here, but
        calls about its shards must be routed to it at once."""
        prefix = self._shards_prefix.encode()
        changes = [e for e in response.events if e.kv.key.startswith(prefix)]
        if not changes:
            return
        holders = dict(self._holders)
        for event in changes:
            shard = int(event.kv.key[len(prefix) :])
            if event.type == kv_pb2.Event.DELETE:
                holders.pop(shard, None)
            else:
                holders[shard] = event.kv.value.decode()
        self._holders = holders
        self._view_revision = max(self._view_revision, int(response.header.revision))

    def _worth_a_look(self, event: Any) -> bool:
        """Membership changes, a member leaving and freed shards call for a
        reconcile; shard acquisitions and epoch bumps (our own included) do
        not."""
        key: bytes = event.kv.key
        if key.startswith(self._members_prefix.encode()):
            return True
        if key.startswith(self._leaving_prefix.encode()):
            return bool(event.type != kv_pb2.Event.DELETE)
        return event.type == kv_pb2.Event.DELETE and key.startswith(self._shards_prefix.encode())

    # -- control thread ---------------------------------------------------------

    def _wait(self, event: threading.Event, timeout: float) -> bool:
        woke = event.wait(max(0.0, timeout))
        event.clear()
        return woke

    def _run_control(self) -> None:
        backoff = Backoff(initial=0.05, max=max(0.2, self._ttl / 6)).delays()
        reconcile_interval = self._ttl / 3
        next_reconcile = 0.0
        while not self._stopping.is_set():
            if self._frozen:
                self._wait(self._wake, 0.05)
                continue
            timeout = reconcile_interval
            try:
                now = time.monotonic()
                if self._lease_id is None or self._lease_gone or now >= self._valid_until:
                    self._drop_all()
                    self._join()
                    next_reconcile = 0.0
                now = time.monotonic()
                if now >= next_reconcile:
                    next_reconcile = now + reconcile_interval
                    self._reconcile()
                    if not self._started.is_set():
                        self._started.set()
                backoff.reset()
                # Wake at the local deadline to publish the loss promptly.
                timeout = min(next_reconcile, self._valid_until) - time.monotonic()
            except CoordinationError as exc:
                _log.warning("coordination step failed, retrying: %s", exc)
                next_reconcile = 0.0
                timeout = backoff.wait()
            except Exception:
                _log.exception("coordination step crashed, retrying")
                next_reconcile = 0.0
                timeout = backoff.wait()
            if self._wait(self._wake, timeout):
                next_reconcile = 0.0

    def _publish(self, change: OwnershipChange) -> None:
        if change.gained or change.lost or not self._published_first:
            self._published_first = True
            self._subscribers.post(change)

    def _drop_all(self) -> None:
        """Forget every shard held under the current lease (invariant 4)."""
        with self._lock:
            lost = frozenset(self._owned)
            self._owned = {}
            self._valid_until = 0.0
        self._acquired_rev = {}
        if lost:
            _log.warning("lease lapsed: dropping %d shards", len(lost))
            self._publish(OwnershipChange(lost=lost))

    def _join(self) -> None:
        """Revoke the old lease (best effort), grant a new one, register."""
        client = self._etcd()
        old = self._lease_id
        if old is not None:
            try:
                self._call(client.revoke_lease, old)
            except CoordinationError as exc:
                if not _is_not_found(exc):
                    raise
            with self._lock:
                self._lease_id = None
                self._lease_gone = False
        sent = time.monotonic()
        lease = self._call(client.lease, self._ttl)
        with self._lock:
            self._lease_id = lease.id
            self._lease_gone = False
            self._valid_until = sent + min(lease.ttl, self._ttl) - self._margin
        self._wake_keepalive.set()
        self._prepare_join(client)
        self._call(client.put, self._members_prefix + self.node_id, self.address, lease=lease.id)
        _log.info("%s joined with lease %x", self.node_id, lease.id)

    def _lease_valid(self) -> bool:
        return (
            not self._stopping.is_set()
            and not self._frozen
            and not self._lease_gone
            and time.monotonic() < self._valid_until
        )

    def _reconcile(self) -> None:
        reconciling = time.monotonic()
        client = self._etcd()
        lease_id = self._lease_id
        assert lease_id is not None
        members: dict[str, str] = {}
        for value, meta in self._call(client.get_prefix, self._members_prefix):
            members[meta.key.decode()[len(self._members_prefix) :]] = value.decode()
        if self.node_id not in members:
            # Our key is on our lease; if it vanished, put it back.
            self._call(
                client.put, self._members_prefix + self.node_id, self.address, lease=lease_id
            )
            members[self.node_id] = self.address
        self._members = members
        holders: dict[int, tuple[str, int]] = {}
        response = self._call(client.get_prefix_response, self._shards_prefix)
        for kv in response.kvs:
            shard = int(kv.key.decode()[len(self._shards_prefix) :])
            holders[shard] = (kv.value.decode(), kv.mod_revision)
        self._holders = {s: node for s, (node, _) in holders.items()}
        self._view_revision = max(self._view_revision, int(response.header.revision))
        self._prepare_for_leavers(members, self._leavers(client))

        assignment = assign_shards(members)
        mine = {s for s, owner in assignment.items() if owner == self.node_id}
        owned = self._owned
        # A shard we think we hold whose key says otherwise is lost already.
        vanished = {s for s in owned if holders.get(s) != (self.node_id, self._acquired_rev.get(s))}
        release = {s for s in owned if s not in mine} - vanished
        if vanished or release:
            with self._lock:
                self._owned = {s: e for s, e in owned.items() if s not in vanished | release}
            if vanished:
                self._publish(OwnershipChange(lost=frozenset(vanished)))
            for shard in vanished:
                self._acquired_rev.pop(shard, None)
        if release:
            # A planned release: the node hands the shards over (and its
            # unsent runs with them) before their keys go.
            started = time.monotonic()
            self._run_hook(self._releaser, release, RELEASE_WAIT_S)
            handed = time.monotonic()
            self._publish(OwnershipChange(lost=frozenset(release)))
            self._delete_keys(sorted(release))
            _log.info(
                "released %d shards: handed over in %.3fs, keys deleted in %.3fs",
                len(release),
                handed - started,
                time.monotonic() - handed,
            )
        # Keys of shards released before whose delete failed: tried again.
        left = [s for s in self._acquired_rev if s not in self._owned and s not in release]
        if left:
            self._delete_keys(
                [s for s in left if holders.get(s) == (self.node_id, self._acquired_rev[s])]
            )
            for shard in left:
                if holders.get(shard) != (self.node_id, self._acquired_rev.get(shard)):
                    self._acquired_rev.pop(shard, None)

        free = sorted(s for s in mine if s not in self._owned and s not in holders)
        gained: dict[int, int] = {}
        acquiring = time.monotonic()
        try:
            if free:
                epochs: dict[int, tuple[int, int]] = {}
                for value, meta in self._call(client.get_prefix, self._epochs_prefix):
                    shard = int(meta.key.decode()[len(self._epochs_prefix) :])
                    epochs[shard] = (int(value), meta.mod_revision)
                for at in range(0, len(free), ACQUIRE_BATCH):
                    if not self._lease_valid():
                        break
                    gained.update(
                        self._acquire_batch(free[at : at + ACQUIRE_BATCH], lease_id, epochs)
                    )
        finally:
            # All at once: the node fences and loads them in one go.
            self._publish(OwnershipChange(gained=gained))
        if gained:
            _log.info(
                "acquired %d shards in %.3fs (reconciled in %.3fs before)",
                len(gained),
                time.monotonic() - acquiring,
                acquiring - reconciling,
            )

    def _delete_keys(self, shards: Sequence[int]) -> None:
        """Delete our keys of ``shards`` (released), ``ACQUIRE_BATCH`` to a
        transaction; a key changed meanwhile is not ours any more and stays.
        A shard's revision is forgotten only once its delete ran, so that a
        failed call leaves it for the next release to try again."""
        client = self._etcd()
        tx = client.transactions
        revs = {s: self._acquired_rev[s] for s in shards if s in self._acquired_rev}
        keys = {s: f"{self._shards_prefix}{s}" for s in revs}
        order = sorted(revs)
        for at in range(0, len(order), ACQUIRE_BATCH):
            part = order[at : at + ACQUIRE_BATCH]
            ok, _ = self._call(
                client.transaction,
                compare=[tx.mod(keys[s]) == revs[s] for s in part],
                success=[tx.delete(keys[s]) for s in part],
                failure=[],
            )
            if not ok:
                for shard in part:
                    self._call(
                        client.transaction,
                        compare=[tx.mod(keys[shard]) == revs[shard]],
                        success=[tx.delete(keys[shard])],
                        failure=[],
                    )
            for shard in part:
                if self._acquired_rev.get(shard) == revs[shard]:
                    del self._acquired_rev[shard]

    def _acquire_batch(
        self, shards: Sequence[int], lease_id: int, epochs: Mapping[int, tuple[int, int]]
    ) -> dict[int, int]:
        """Acquire ``shards`` in one transaction; when any of them was taken
        meanwhile, one at a time. Shard -> new epoch, for those acquired."""
        seen = {s: epochs.get(s, (0, 0)) for s in shards if epochs.get(s, (0, 0))[0] < MAX_EPOCH}
        out: dict[int, int] = {}
        if len(seen) > 1:
            client = self._etcd()
            tx = client.transactions
            compare, success = [], []
            for shard, (epoch, epoch_rev) in seen.items():
                shard_key = f"{self._shards_prefix}{shard}"
                epoch_key = f"{self._epochs_prefix}{shard}"
                compare += [tx.create(shard_key) == 0, tx.mod(epoch_key) == epoch_rev]
                success += [
                    tx.put(shard_key, self.node_id, lease=lease_id),
                    tx.put(epoch_key, str(epoch + 1)),
                ]
            ok, responses = self._call(
                client.transaction, compare=compare, success=success, failure=[]
            )
            if ok:
                rev = int(responses[0].response_put.header.revision)
                got = {shard: epoch + 1 for shard, (epoch, _) in seen.items()}
                self._acquired_rev.update(dict.fromkeys(got, rev))
                with self._lock:
                    self._owned = {**self._owned, **got}
                out.update(got)
                shards = [s for s in shards if s not in got]  # exhausted: logged below
        for shard in shards:
            if not self._lease_valid():
                break
            result = self._acquire(shard, lease_id, *epochs.get(shard, (0, 0)))
            if result is not None:
                out[shard] = result
        return out

    def _acquire(self, shard: int, lease_id: int, epoch: int, epoch_rev: int) -> int | None:
        """One acquisition transaction; the new epoch, or None if we lost a race."""
        if epoch + 1 > MAX_EPOCH:
            # Not retryable and not worth stopping the other shards for.
            _log.error("shard %d has exhausted its 32-bit epochs; not acquiring it", shard)
            return None
        client = self._etcd()
        tx = client.transactions
        shard_key = f"{self._shards_prefix}{shard}"
        epoch_key = f"{self._epochs_prefix}{shard}"
        ok, responses = self._call(
            client.transaction,
            compare=[tx.create(shard_key) == 0, tx.mod(epoch_key) == epoch_rev],
            success=[
                tx.put(shard_key, self.node_id, lease=lease_id),
                tx.put(epoch_key, str(epoch + 1)),
            ],
            failure=[],
        )
        if not ok:
            return None
        rev = int(responses[0].response_put.header.revision)
        self._acquired_rev[shard] = rev
        with self._lock:
            self._owned = {**self._owned, shard: epoch + 1}
        return epoch + 1
