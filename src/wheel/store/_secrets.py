"""The signing secrets of HTTP targets in both SQL stores (schema 16): a
small table written by admin calls and read every few seconds by each node's
cache. The statements are the same on both backends but for the parameter
marker; PostgreSQL also takes a lock per secret, since two writers of one
secret must not both pick the same next version (SQLite's one writer at a
time keeps them apart already)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from wheel.errors import NotFound
from wheel.store._shared import Executor
from wheel.store.base import Seal, SecretRecord

T = TypeVar("T")

SECRET_COLUMNS = "tenant, name, version, key_id, ciphertext, created_at_ms, retires_at_ms"


def secret_from_row(row: Sequence[Any]) -> SecretRecord:
    return SecretRecord(
        tenant=row[0],
        name=row[1],
        version=int(row[2]),
        key_id=row[3],
        ciphertext=bytes(row[4]),
        created_at_ms=int(row[5]),
        retires_at_ms=None if row[6] is None else int(row[6]),
    )


class SecretsSQL:
    """The secrets part of ``SQLStore`` (``_param``: the parameter marker;
    ``_secret_lock``: a statement taking a transaction lock on one secret,
    given its tenant and name, or None where writes are serialized anyway)."""

    _param: str
    _secret_lock: str | None = None

    def _read(self, fn: Callable[[Executor], T]) -> T:
        raise NotImplementedError

    def _write(self, fn: Callable[[Executor], T]) -> T:
        raise NotImplementedError

    def set_secret(self, tenant: str, name: str, seal: Seal, now_ms: int) -> SecretRecord:
        p = self._param

        def op(cur: Executor) -> SecretRecord:
            version = self._top_version(cur, tenant, name) + 1
            cur.execute(f"DELETE FROM secrets WHERE tenant = {p} AND name = {p}", (tenant, name))
            return self._insert(cur, tenant, name, version, seal, now_ms)

        return self._write(op)

    def rotate_secret(
        self, tenant: str, name: str, seal: Seal, now_ms: int, overlap_ms: int
    ) -> SecretRecord:
        p = self._param
        retire_at = now_ms + max(0, overlap_ms)

        def op(cur: Executor) -> SecretRecord:
            top = self._top_version(cur, tenant, name)
            if top == 0:
                raise NotFound(f"secret {name!r} of tenant {tenant!r} does not exist")
            cur.execute(
                f"UPDATE secrets SET retires_at_ms = {p} WHERE tenant = {p} AND name = {p}"
                f" AND (retires_at_ms IS NULL OR retires_at_ms > {p})",
                (retire_at, tenant, name, retire_at),
            )
            cur.execute(
                f"DELETE FROM secrets WHERE tenant = {p} AND name = {p}"
                f" AND retires_at_ms IS NOT NULL AND retires_at_ms <= {p}",
                (tenant, name, now_ms),
            )
            return self._insert(cur, tenant, name, top + 1, seal, now_ms)

        return self._write(op)

    def list_secrets(self, now_ms: int, tenant: str | None = None) -> list[SecretRecord]:
        p = self._param
        sql = f"SELECT {SECRET_COLUMNS} FROM secrets"
        params: tuple[Any, ...] = ()
        if tenant is not None:
            sql += f" WHERE tenant = {p}"
            params = (tenant,)
        sql += " ORDER BY tenant, name, version"
        rows = self._read(lambda cur: cur.execute(sql, params).fetchall())
        records = [secret_from_row(r) for r in rows]
        signing = [r for r in records if r.signing(now_ms)]
        if len(signing) < len(records):
            # Retired versions go when seen: nothing else would delete them.
            cleanup = (
                f"DELETE FROM secrets WHERE retires_at_ms IS NOT NULL AND retires_at_ms <= {p}"
            )
            self._write(lambda cur: cur.execute(cleanup, (now_ms,)).rowcount)
        return signing

    def delete_secret(self, tenant: str, name: str) -> int:
        sql = f"DELETE FROM secrets WHERE tenant = {self._param} AND name = {self._param}"
        return int(self._write(lambda cur: cur.execute(sql, (tenant, name)).rowcount))

    def _top_version(self, cur: Executor, tenant: str, name: str) -> int:
        p = self._param
        if self._secret_lock is not None:
            cur.execute(self._secret_lock, (f"{tenant}/{name}",))
        row = cur.execute(
            f"SELECT max(version) FROM secrets WHERE tenant = {p} AND name = {p}", (tenant, name)
        ).fetchone()
        return 0 if row is None or row[0] is None else int(row[0])

    def _insert(
        self, cur: Executor, tenant: str, name: str, version: int, seal: Seal, now_ms: int
    ) -> SecretRecord:
        p = self._param
        key_id, ciphertext = seal(version)
        row = cur.execute(
            f"INSERT INTO secrets ({SECRET_COLUMNS}) VALUES ({', '.join([p] * 7)})"
            f" RETURNING {SECRET_COLUMNS}",
            (tenant, name, version, key_id, ciphertext, now_ms, None),
        ).fetchone()
        return secret_from_row(row)
