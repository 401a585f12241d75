"""The binary array encoders against a real PostgreSQL: what the server reads
back is exactly what was sent, NULLs and edge values included."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testkit.services import service_missing
from tests.conftest import PG_DSN
from wheel.store.postgres._arrays import Bools, Int4s, Int8s, Texts, register

INT8 = st.integers(-(2**63), 2**63 - 1)
INT4 = st.integers(-(2**31), 2**31 - 1)
# PostgreSQL text cannot hold NUL.
TEXT = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"))


@pytest.fixture(scope="module")
def cursor() -> Iterator[psycopg.Cursor[Any]]:
    try:
        conn = psycopg.connect(PG_DSN, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        service_missing(f"PostgreSQL at {PG_DSN} ({exc})")
        raise
    register(conn.adapters)
    with conn, conn.cursor(binary=True) as cur:
        yield cur


def echo(cur: psycopg.Cursor[Any], sql_type: str, value: object) -> Sequence[object]:
    cur.execute(f"SELECT %b::{sql_type}[]", (value,))
    row = cur.fetchone()
    assert row is not None
    result: Sequence[object] = row[0]
    return result


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(INT8, st.none()), max_size=40) | st.lists(INT8, max_size=300))
def test_int8_arrays_read_back_unchanged(cursor: psycopg.Cursor[Any], values: list[int]) -> None:
    assert echo(cursor, "int8", Int8s(values)) == values


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(INT4, st.none()), max_size=40) | st.lists(INT4, max_size=300))
def test_int4_arrays_read_back_unchanged(cursor: psycopg.Cursor[Any], values: list[int]) -> None:
    assert echo(cursor, "int4", Int4s(values)) == values


@settings(max_examples=30, deadline=None)
@given(st.lists(st.one_of(st.booleans(), st.none()), max_size=40))
def test_bool_arrays_read_back_unchanged(
    cursor: psycopg.Cursor[Any], values: list[bool | None]
) -> None:
    assert echo(cursor, "bool", Bools(values)) == values


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(TEXT, st.none()), max_size=40))
def test_text_arrays_read_back_unchanged(
    cursor: psycopg.Cursor[Any], values: list[str | None]
) -> None:
    assert echo(cursor, "text", Texts(values)) == values


def test_arrays_unnest_side_by_side(cursor: psycopg.Cursor[Any]) -> None:
    cursor.execute(
        "SELECT * FROM unnest(%b::int4[], %b::int8[], %b::bool[], %b::text[])",
        (Int4s([1, 2]), Int8s([2**40, None]), Bools([True, None]), Texts(["é", None])),
    )
    assert cursor.fetchall() == [(1, 2**40, True, "é"), (2, None, None, None)]
