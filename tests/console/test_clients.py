"""The console keeps one API client a token, a bounded number of them, and
never lends the node process's own token to a browser."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from wheel.console import Console
from wheel.console._app import CLIENTS_KEPT, ConsoleError


def request(token: str | None) -> web.Request:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return make_mocked_request("GET", "/api/jobs", headers=headers)


def test_one_client_a_token_and_the_oldest_put_aside_past_the_bound() -> None:
    async def main() -> None:
        console = Console("127.0.0.1:1", auth=True, actions=False)
        first = console.client(request("t0"))
        assert console.client(request("t0")) is first
        for i in range(1, CLIENTS_KEPT + 1):
            console.client(request(f"t{i}"))
        assert len(console._clients) == CLIENTS_KEPT
        assert console._retired == {first}
        assert console.client(request("t0")) is not first
        await console._close(None)  # type: ignore[arg-type]
        assert not console._clients and not console._retired and not console._closing

    asyncio.run(main())


def test_without_a_token_a_node_with_auth_refuses_and_one_without_sends_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WHEEL_TOKEN", "the-node-process-own")

    async def main() -> None:
        guarded = Console("127.0.0.1:1", auth=True, actions=False)
        with pytest.raises(ConsoleError) as refused:
            guarded.client(request(None))
        assert refused.value.status == 401
        open_node = Console("127.0.0.1:1", auth=False, actions=False)
        client = open_node.client(request(None))
        assert client._metadata == ()  # not $WHEEL_TOKEN
        await guarded._close(None)  # type: ignore[arg-type]
        await open_node._close(None)  # type: ignore[arg-type]

    asyncio.run(main())
