"""A real node with the web console on, and plain HTTP calls to it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.procs import ServerProc
from testkit.services import free_port


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    status: int
    body: Any
    headers: dict[str, str]


def call(
    url: str,
    *,
    token: str | None = None,
    method: str = "GET",
    body: Any = None,
    content_type: str = "application/json",
) -> Answer:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None or method == "POST":
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            raw, status, headers = resp.read(), resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        raw, status, headers = exc.read(), exc.code, dict(exc.headers)
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = raw.decode(errors="replace")
    return Answer(status=status, body=parsed, headers=headers)


class ConsoleNode(ServerProc):
    """``wheelctl serve --http-listen`` on loopback; ``url`` is the console's."""

    def __init__(self, data_dir: Path, *, args: tuple[str, ...] = ()) -> None:
        self.http_port = free_port()
        super().__init__(data_dir, args=("--http-listen", f"127.0.0.1:{self.http_port}", *args))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"
