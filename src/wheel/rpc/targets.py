"""Node addresses as users write them, for every SDK and ``wheelctl``."""

from __future__ import annotations

from collections.abc import Sequence

from wheel.errors import InvalidArgument

__all__ = ["targets_of"]


def targets_of(target: str | Sequence[str], field: str = "target") -> list[str]:
    """The addresses in ``"host:port"``, ``"host:port,host:port"`` or a list of
    either, in order, each once; at least one."""
    items = [target] if isinstance(target, str) else list(target)
    out: list[str] = []
    for item in items:
        for address in item.split(","):
            address = address.strip()
            if address and address not in out:
                out.append(address)
    if not out:
        raise InvalidArgument(field, "at least one node address is required")
    return out
