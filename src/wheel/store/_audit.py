"""The audit trail in both SQL stores (schema 21): one row per
administrative change, appended by the API's calls and read newest first.
The statements are the same on both backends but for the parameter marker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from wheel.store._shared import Executor, Transaction
from wheel.store.base import AuditEntry

AUDIT_COLUMNS = "entry_id, at_ms, actor, tenant, address, action, target, job_id, details"


def audit_from_row(row: Sequence[Any]) -> AuditEntry:
    return AuditEntry(
        entry_id=int(row[0]),
        at_ms=int(row[1]),
        actor=row[2],
        tenant=row[3],
        address=row[4],
        action=row[5],
        target=row[6],
        job_id=None if row[7] is None else int(row[7]),
        details=row[8],
    )


class AuditSQL:
    """The audit calls of ``SQLStore``: ``read`` and ``write`` run a
    function in one transaction; ``param`` is the backend's parameter marker."""

    __slots__ = ("_param", "_read", "_write")

    def __init__(self, read: Transaction, write: Transaction, param: str) -> None:
        self._read = read
        self._write = write
        self._param = param

    def record_audit(self, entries: Sequence[AuditEntry]) -> None:
        if not entries:
            return
        p = self._param
        rows = [
            (e.at_ms, e.actor, e.tenant, e.address, e.action, e.target, e.job_id, e.details)
            for e in entries
        ]

        insert = (
            "INSERT INTO audit_log (at_ms, actor, tenant, address, action, target, job_id, details)"
            f" VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})"
        )

        def op(cur: Executor) -> None:
            for row in rows:  # a handful a call: admin changes are few
                cur.execute(insert, row)

        self._write(op)

    def list_audit(
        self,
        *,
        since_ms: int | None = None,
        job_id: int | None = None,
        tenant: str | None = None,
        before_id: int | None = None,
        limit: int = 100,
    ) -> list[AuditEntry]:
        p = self._param
        where, args = [], []
        for clause, value in (
            (f"at_ms >= {p}", since_ms),
            (f"job_id = {p}", job_id),
            (f"tenant = {p}", tenant),
            (f"entry_id < {p}", before_id),
        ):
            if value is not None:
                where.append(clause)
                args.append(value)
        sql = f"SELECT {AUDIT_COLUMNS} FROM audit_log"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY entry_id DESC LIMIT {p}"

        def op(cur: Executor) -> list[AuditEntry]:
            rows = cur.execute(sql, (*args, max(1, limit))).fetchall()
            return [audit_from_row(r) for r in rows]

        entries: list[AuditEntry] = self._read(op)
        return entries

    def purge_audit(self, before_ms: int) -> int:
        p = self._param

        def op(cur: Executor) -> int:
            deleted = cur.execute(f"DELETE FROM audit_log WHERE at_ms < {p}", (before_ms,))
            return max(0, int(deleted.rowcount))

        gone: int = self._write(op)
        return gone
