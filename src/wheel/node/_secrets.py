"""Signing secrets on a node: written and read through here by AdminService,
and kept decrypted in memory to sign the requests of HTTP targets as their
runs are handed out (``wheel.rpc._workers``). Signing happens here, on the
node, so that workers never hold a secret: a worker sends the headers it is
given, and a worker's host that is broken into gives away no key.

Every node reads the signing versions from the store at start, every
``REFRESH_S`` after, at once after a change made through it, and soon after
a hand-out that names a secret it does not know (at most one such read every
``MISS_REFRESH_S``): a secret set through another member signs here within
about a second of its first use.

Invariants:

1. A key leaves this module only as a signature; no log line, error or
   listing carries it (errors name the secret, its tenant and key ids).
2. A version signs until its ``retires_at_ms`` by the node's clock, whether
   or not a refresh has dropped it yet.
3. A version that does not open with this node's key (sealed under another
   key id, or altered) signs nothing: the secret's hand-outs carry a sign
   error until a refresh finds it sealed under this key, and the key id is
   logged once as an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Sequence

from wheel import webhooks
from wheel.errors import StoreError
from wheel.node._changes import InThread
from wheel.node._secrets_key import SecretsKey, SecretsKeyError
from wheel.node._values import Clock
from wheel.store.base import Seal, SecretRecord, SecretStore

log = logging.getLogger("wheel.node")

REFRESH_S = 5.0
MISS_REFRESH_S = 1.0
# How long the versions before a rotation keep signing when the call names
# no overlap.
DEFAULT_OVERLAP_MS = 24 * 3_600_000

# (retires_at_ms or None, key) of each version still signing, oldest first.
Versions = tuple[tuple[int | None, bytes], ...]


class SignError(Exception):
    """A run this node cannot sign; the message names the secret, never a key."""


class Secrets:
    """The signing secrets of a node: the store's, and a cache of their keys."""

    def __init__(
        self, store: SecretStore, clock: Clock, key: SecretsKey, *, in_thread: InThread
    ) -> None:
        self._store = store
        self._clock = clock
        self._key = key
        self._in_thread = in_thread
        self._keys: dict[tuple[str, str], Versions] = {}
        # Secrets whose versions do not open here -> why.
        self._broken: dict[tuple[str, str], str] = {}
        self._foreign_logged: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._refreshing: asyncio.Task[None] | None = None
        self._last_miss_refresh = float("-inf")

    @property
    def key_id(self) -> str:
        return self._key.key_id

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="wheel-secrets")

    async def stop(self) -> None:
        for task in (self._task, self._refreshing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _watch(self) -> None:
        while True:
            await self._refresh_logged()
            await asyncio.sleep(REFRESH_S)

    async def _refresh_logged(self) -> None:
        try:
            await self.refresh()
        except StoreError as exc:
            log.warning("reading signing secrets failed: %s", exc)
        except Exception:  # a bug here must not stop the refresh for good
            log.exception("reading signing secrets failed")

    async def refresh(self) -> None:
        """Read every signing version from the store and cache their keys."""
        now = self._clock.now_ms()
        self.apply(await self._in_thread(self._store.list_secrets, now))

    def apply(self, records: Sequence[SecretRecord]) -> None:
        keys: dict[tuple[str, str], list[tuple[int | None, bytes]]] = {}
        broken: dict[tuple[str, str], str] = {}
        for r in records:
            at = (r.tenant, r.name)
            if at in broken:
                continue
            try:
                plain = self._key.open(r.ciphertext, r.tenant, r.name, r.version)
            except SecretsKeyError as exc:
                broken[at] = self._cannot_open(r, exc)
                keys.pop(at, None)
                continue
            keys.setdefault(at, []).append((r.retires_at_ms, plain))
        self._keys = {at: tuple(v) for at, v in keys.items()}
        self._broken = broken

    def _cannot_open(self, r: SecretRecord, exc: SecretsKeyError) -> str:
        if r.key_id == self._key.key_id:
            return f"signing secret {r.name!r}: {exc} (altered in the store?)"
        message = (
            f"signing secret {r.name!r} of tenant {r.tenant!r} is sealed under secrets key"
            f" {r.key_id}, and this node has key {self._key.key_id}: give every node the same"
            " --secrets-key-file"
        )
        if r.key_id not in self._foreign_logged:
            self._foreign_logged.add(r.key_id)
            log.error("%s (logged once per key id)", message)
        return message

    # -- signing (on the event loop, per hand-out) -------------------------------------

    def signed_headers(
        self, tenant: str, name: str, msg_id: str, body: bytes
    ) -> list[tuple[str, str]]:
        """The Standard Webhooks headers of one attempt, signed now by every
        version of the secret still signing; ``SignError`` when this node
        cannot sign with it (the cache is then read again soon)."""
        versions = self._keys.get((tenant, name))
        now = self._clock.now_ms()
        keys = (
            [] if versions is None else [k for until, k in versions if until is None or until > now]
        )
        if not keys:
            self._refresh_soon()
            why = self._broken.get((tenant, name))
            if why is None:
                why = f"signing secret {name!r} of tenant {tenant!r} is unknown on this node"
            raise SignError(why)
        return webhooks.signed_headers(keys, msg_id, now // 1000, body)

    def knows(self, tenant: str, name: str) -> bool:
        """The secret is in the store as last read (signing or not here)."""
        return (tenant, name) in self._keys or (tenant, name) in self._broken

    async def learn(self, wanted: Iterable[tuple[str, str]]) -> None:
        """Read the store again when one of ``wanted`` is not known (once,
        sharing a read already under way)."""
        if all(self.knows(t, n) for t, n in wanted):
            return
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(
                self._refresh_logged(), name="wheel-secrets-learn"
            )
        await asyncio.shield(self._refreshing)

    def _refresh_soon(self) -> None:
        if self._refreshing is not None and not self._refreshing.done():
            return
        mono = time.monotonic()
        if mono - self._last_miss_refresh < MISS_REFRESH_S:
            return
        self._last_miss_refresh = mono
        self._refreshing = asyncio.get_running_loop().create_task(
            self._refresh_logged(), name="wheel-secrets-miss"
        )

    # -- AdminService's calls ------------------------------------------------------------

    def _seal(self, tenant: str, name: str, key: bytes) -> Seal:
        sealer = self._key

        def seal(version: int) -> tuple[str, bytes]:
            return sealer.key_id, sealer.seal(key, tenant, name, version)

        return seal

    async def set(self, tenant: str, name: str, key: bytes) -> SecretRecord:
        """Create the secret, or replace every version of it with ``key``."""
        seal = self._seal(tenant, name, key)
        record = await self._in_thread(
            self._store.set_secret, tenant, name, seal, self._clock.now_ms()
        )
        await self._refresh_logged()
        return record

    async def rotate(self, tenant: str, name: str, key: bytes, overlap_ms: int) -> SecretRecord:
        """A new version signing with ``key``; the ones before keep signing
        for ``overlap_ms`` (0: ``DEFAULT_OVERLAP_MS``). ``NotFound``."""
        seal = self._seal(tenant, name, key)
        overlap = overlap_ms or DEFAULT_OVERLAP_MS
        record = await self._in_thread(
            self._store.rotate_secret, tenant, name, seal, self._clock.now_ms(), overlap
        )
        await self._refresh_logged()
        return record

    async def list(self, tenant: str | None) -> list[SecretRecord]:
        """Every version still signing, of ``tenant`` (None: of all)."""
        return await self._in_thread(self._store.list_secrets, self._clock.now_ms(), tenant)

    async def delete(self, tenant: str, name: str) -> int:
        deleted = await self._in_thread(self._store.delete_secret, tenant, name)
        await self._refresh_logged()
        return deleted
