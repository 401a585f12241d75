"""Calendars in both SQL stores (schema 18): a small table written by admin
calls and read every few seconds by each node. The statements are the same
on both backends but for the parameter marker, and run in the backend's
own read and write transactions, which the part is given."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from wheel.store._shared import Transaction
from wheel.store.base import CalendarRecord

_COLUMNS = "tenant, name, body, version, updated_at"


def _record(row: Sequence[Any]) -> CalendarRecord:
    return CalendarRecord(
        tenant=row[0], name=row[1], body=row[2], version=int(row[3]), updated_at_ms=int(row[4])
    )


class CalendarsSQL:
    """The calendar calls of ``SQLStore``: ``read`` and ``write`` run a
    function in one transaction; ``param`` is the backend's parameter marker."""

    __slots__ = ("_p", "_read", "_write")

    def __init__(self, read: Transaction, write: Transaction, param: str) -> None:
        self._read = read
        self._write = write
        self._p = param

    def set(self, tenant: str, name: str, body: str, now_ms: int) -> CalendarRecord:
        p = self._p
        # One statement: two writers of one calendar get versions one apart.
        sql = (
            f"INSERT INTO calendars ({_COLUMNS}) VALUES ({p}, {p}, {p}, 1, {p})"
            f" ON CONFLICT (tenant, name) DO UPDATE SET body = excluded.body,"
            f" version = calendars.version + 1, updated_at = excluded.updated_at"
            f" RETURNING {_COLUMNS}"
        )
        row = self._write(lambda cur: cur.execute(sql, (tenant, name, body, now_ms)).fetchone())
        return _record(row)

    def get(self, tenant: str, name: str) -> CalendarRecord | None:
        p = self._p
        sql = f"SELECT {_COLUMNS} FROM calendars WHERE tenant = {p} AND name = {p}"
        row = self._read(lambda cur: cur.execute(sql, (tenant, name)).fetchone())
        return None if row is None else _record(row)

    def list(self, tenant: str | None) -> list[CalendarRecord]:
        sql = f"SELECT {_COLUMNS} FROM calendars"
        params: tuple[Any, ...] = ()
        if tenant is not None:
            sql += f" WHERE tenant = {self._p}"
            params = (tenant,)
        sql += " ORDER BY tenant, name"
        rows = self._read(lambda cur: cur.execute(sql, params).fetchall())
        return [_record(r) for r in rows]

    def delete(self, tenant: str, name: str) -> bool:
        p = self._p
        sql = f"DELETE FROM calendars WHERE tenant = {p} AND name = {p}"
        return int(self._write(lambda cur: cur.execute(sql, (tenant, name)).rowcount)) > 0
