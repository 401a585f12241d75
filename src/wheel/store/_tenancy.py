"""Tokens and tenant quotas in both SQL stores (schema 6): small tables read
rarely (a node caches what it reads), written by admin calls. The statements
are the same on both backends but for the parameter marker."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from wheel.errors import AlreadyExists, NotFound
from wheel.store._shared import Executor
from wheel.store.base import TenantQuota, TokenRecord

T = TypeVar("T")

TOKEN_COLUMNS = (
    "token_id, secret_hash, tenant, scopes, worker_id, pools, label,"
    " created_at_ms, expires_at_ms, revoked_at_ms"
)
QUOTA_COLUMNS = "tenant, max_jobs, submits_per_s, fires_per_s, max_in_flight, updated_at_ms"


def _strings(text: str) -> tuple[str, ...]:
    return tuple(str(v) for v in json.loads(text))


def token_from_row(row: Sequence[Any]) -> TokenRecord:
    return TokenRecord(
        token_id=row[0],
        secret_hash=row[1],
        tenant=row[2],
        scopes=_strings(row[3]),
        worker_id=row[4],
        pools=_strings(row[5]),
        label=row[6],
        created_at_ms=int(row[7]),
        expires_at_ms=None if row[8] is None else int(row[8]),
        revoked_at_ms=None if row[9] is None else int(row[9]),
    )


def quota_from_row(row: Sequence[Any]) -> TenantQuota:
    return TenantQuota(
        tenant=row[0],
        max_jobs=None if row[1] is None else int(row[1]),
        submits_per_s=None if row[2] is None else float(row[2]),
        fires_per_s=None if row[3] is None else float(row[3]),
        max_in_flight=None if row[4] is None else int(row[4]),
        updated_at_ms=int(row[5]),
    )


class TenancySQL:
    """The tokens and quotas part of ``SQLStore`` (``p``: the parameter marker)."""

    _param: str

    def _read(self, fn: Callable[[Executor], T]) -> T:
        raise NotImplementedError

    def _write(self, fn: Callable[[Executor], T]) -> T:
        raise NotImplementedError

    def count_jobs(self, tenant: str) -> int:
        p = self._param
        sql = f"SELECT count(*) FROM jobs WHERE tenant = {p} AND state IN ('active', 'paused')"
        row = self._read(lambda cur: cur.execute(sql, (tenant,)).fetchone())
        return int(row[0])

    def create_token(self, token: TokenRecord) -> None:
        p = self._param
        sql = (
            f"INSERT INTO auth_tokens ({TOKEN_COLUMNS}) VALUES ({', '.join([p] * 10)})"
            " ON CONFLICT (token_id) DO NOTHING"
        )
        params = (
            token.token_id,
            token.secret_hash,
            token.tenant,
            json.dumps(list(token.scopes)),
            token.worker_id,
            json.dumps(list(token.pools)),
            token.label,
            token.created_at_ms,
            token.expires_at_ms,
            token.revoked_at_ms,
        )
        # Written again after an unknown commit, the same row reads as a
        # conflict with itself: compare before calling it one.
        inserted = self._write(lambda cur: cur.execute(sql, params).rowcount)
        if inserted != 1 and self.get_token(token.token_id) != token:
            raise AlreadyExists(f"token {token.token_id} already exists")

    def get_token(self, token_id: str) -> TokenRecord:
        sql = f"SELECT {TOKEN_COLUMNS} FROM auth_tokens WHERE token_id = {self._param}"
        row = self._read(lambda cur: cur.execute(sql, (token_id,)).fetchone())
        if row is None:
            raise NotFound(f"token {token_id} does not exist")
        return token_from_row(row)

    def list_tokens(self) -> list[TokenRecord]:
        sql = f"SELECT {TOKEN_COLUMNS} FROM auth_tokens ORDER BY created_at_ms, token_id"
        rows = self._read(lambda cur: cur.execute(sql).fetchall())
        return [token_from_row(r) for r in rows]

    def revoke_token(self, token_id: str, now_ms: int) -> TokenRecord:
        p = self._param
        sql = (
            f"UPDATE auth_tokens SET revoked_at_ms = coalesce(revoked_at_ms, {p})"
            f" WHERE token_id = {p} RETURNING {TOKEN_COLUMNS}"
        )
        row = self._write(lambda cur: cur.execute(sql, (now_ms, token_id)).fetchone())
        if row is None:
            raise NotFound(f"token {token_id} does not exist")
        return token_from_row(row)

    def set_tenant_quota(self, quota: TenantQuota) -> TenantQuota:
        p = self._param
        sql = (
            f"INSERT INTO tenant_quotas ({QUOTA_COLUMNS}) VALUES ({', '.join([p] * 6)})"
            " ON CONFLICT (tenant) DO UPDATE SET max_jobs = excluded.max_jobs,"
            " submits_per_s = excluded.submits_per_s, fires_per_s = excluded.fires_per_s,"
            " max_in_flight = excluded.max_in_flight, updated_at_ms = excluded.updated_at_ms"
            f" RETURNING {QUOTA_COLUMNS}"
        )
        params = (
            quota.tenant,
            quota.max_jobs,
            quota.submits_per_s,
            quota.fires_per_s,
            quota.max_in_flight,
            quota.updated_at_ms,
        )
        row = self._write(lambda cur: cur.execute(sql, params).fetchone())
        return quota_from_row(row)

    def list_tenant_quotas(self) -> list[TenantQuota]:
        sql = f"SELECT {QUOTA_COLUMNS} FROM tenant_quotas ORDER BY tenant"
        rows = self._read(lambda cur: cur.execute(sql).fetchall())
        return [quota_from_row(r) for r in rows]
