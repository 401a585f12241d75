"""Run results: what a run left, a JSON object kept with its row.

An HTTP target's run leaves ``http_status``, ``duration_ms``,
``response_headers`` and ``response_excerpt`` (or ``error`` alone when no
response came); a Python handler's leaves ``value``, its return value. The
node takes a worker's result as text and keeps it as it came when it is a
JSON object of at most ``MAX_RESULT_BYTES``; anything else becomes an
``{"error": ...}`` saying why, and the completion applies all the same.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_RESULT_BYTES",
    "MAX_RETRY_AFTER_MS",
    "checked_result",
    "clamp_retry_after",
    "parse_result",
    "summary",
]

MAX_RESULT_BYTES = 65536
# The longest wait a worker may ask for before a retry (Retry-After).
MAX_RETRY_AFTER_MS = 24 * 3600 * 1000


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# One decoder for every check: ``json.loads`` with ``parse_constant`` builds
# a new one per call, which cost as much as the decode itself.
_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def checked_result(text: str) -> str:
    """``text`` as the run's result if it is a JSON object of at most
    ``MAX_RESULT_BYTES`` (UTF-8), else a JSON object whose ``error`` says
    why it was refused."""
    # A character is 1 to 4 bytes of UTF-8: most results need no encoding
    # to know they fit.
    size = len(text)
    if size > MAX_RESULT_BYTES // 4:
        size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_RESULT_BYTES:
        why = f"result refused: {size} bytes, over the limit of {MAX_RESULT_BYTES}"
    else:
        try:
            value = _DECODER.decode(text)
        except (ValueError, RecursionError) as e:
            why = f"result refused: not JSON ({str(e)[:200]})"
        else:
            if isinstance(value, dict):
                return text
            why = f"result refused: a JSON {type(value).__name__}, not an object"
    return json.dumps({"error": why})


def clamp_retry_after(ms: int) -> int:
    """A worker's Retry-After in milliseconds, within [0, 24 h]."""
    return min(max(ms, 0), MAX_RETRY_AFTER_MS)


def parse_result(text: str | None) -> dict[str, Any] | None:
    """A stored or sent result as a dict (None: the run left none). Text
    that is not a JSON object, which the node never keeps, reads as an
    ``error``."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return {"error": "result is not JSON"}
    return value if isinstance(value, dict) else {"value": value}


def summary(result: Mapping[str, Any] | None, width: int = 40) -> str:
    """A run's result in a few words for a table: ``http 503 12ms`` for an
    HTTP target, the value (cut to ``width``) for a handler, ``error: ...``
    for a refused one; empty for none."""
    if not result:
        return ""
    if "http_status" in result:
        text = f"http {result['http_status']}"
        if "duration_ms" in result:
            text += f" {result['duration_ms']}ms"
    elif "value" in result:
        text = json.dumps(result["value"], separators=(",", ":"), ensure_ascii=False)
    elif "error" in result:
        text = f"error: {result['error']}"
    else:
        text = json.dumps(result, separators=(",", ":"), ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"
