"""Serving the console: an aiohttp site on the running event loop, over
HTTPS with the node's certificate when it has one (as ``/metrics`` is)."""

from __future__ import annotations

from ssl import SSLContext

from aiohttp import web

from wheel.console._app import Console
from wheel.errors import InvalidArgument
from wheel.metrics import parse_listen


def parse_http_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` of ``--http-listen`` -> (host, port)."""
    try:
        return parse_listen(listen)
    except InvalidArgument:
        raise InvalidArgument("http_listen", f"{listen!r} is not HOST:PORT") from None


class ConsoleServer:
    """``console``'s app on ``HOST:PORT`` of the loop that calls ``start``."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, listen: str, *, ssl: SSLContext | None = None) -> int:
        """Listen (port 0: any free one), over HTTPS with ``ssl``; the port."""
        host, port = parse_http_listen(listen)
        # No access log: a page load is a dozen calls; the API logs its own.
        runner = web.AppRunner(
            self.console.app(), access_log=None, handle_signals=False, shutdown_timeout=2.0
        )
        await runner.setup()
        site = web.TCPSite(runner, host, port, ssl_context=ssl)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
