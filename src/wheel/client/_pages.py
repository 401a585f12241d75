"""A list call's pages, as the clients walk them (``Client.jobs``, ``runs``).

Apart from ``wheel.client._wire``, which builds them: that module is compiled
(``wheel._compiled``), and a generic frozen dataclass cannot be a compiled
class."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Pages(Generic[_T]):
    """A list call: the request for a page token, and the items of a response
    (whose ``next_page_token`` is empty on the last page)."""

    request: Callable[[str], Any]
    items: Callable[[Any], list[_T]]
